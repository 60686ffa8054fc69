//! Connection tokens against the real binary: grants, every signing
//! algorithm and key source, refusals with their reasons, expiry and
//! refresh, the connect command, namespace policy, the HTTP transports,
//! and the Origin check. Keys are made at test time with `openssl`.

mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{recv, recv_close, send, Node, Ws};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tungstenite::client::IntoClientRequest;

const SECRET: &str = "a-test-secret-of-at-least-32-bytes!";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hs256(claims: &Value) -> String {
    sign_with(
        Header::default(),
        &EncodingKey::from_secret(SECRET.as_bytes()),
        claims,
    )
}

fn sign_with(header: Header, key: &EncodingKey, claims: &Value) -> String {
    encode(&header, claims, key).unwrap()
}

/// Claims for user `sub`, valid for a minute.
fn claims(sub: u64, subscribe: &[&str], publish: &[&str]) -> Value {
    json!({"sub": sub.to_string(), "exp": now() + 60, "subscribe": subscribe, "publish": publish})
}

fn token_node(extra: &[&str]) -> Node {
    let mut args = vec!["--workers", "1", "--token-hmac-secret", SECRET];
    args.extend_from_slice(extra);
    Node::start(&args)
}

/// Opens `/ws` with `headers`; the WebSocket, or the refusal's status and body.
fn open(node: &Node, target: &str, headers: &[(&str, &str)]) -> Result<Ws, (u16, String)> {
    let mut request = node.url(target).into_client_request().unwrap();
    for (name, value) in headers {
        let name = tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    match tungstenite::connect(request) {
        Ok((ws, _)) => {
            common::set_timeout(&ws, Duration::from_secs(10));
            Ok(ws)
        }
        Err(tungstenite::Error::Http(response)) => {
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err((response.status().as_u16(), body))
        }
        Err(e) => panic!("connect: {e}"),
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Sends `command` with id 9 and returns the reply to it.
fn ask(ws: &mut Ws, mut command: Value) -> Value {
    command["id"] = json!(9);
    send(ws, command);
    loop {
        let reply = recv(ws);
        if reply["id"] == 9 {
            return reply;
        }
    }
}

fn error_code(reply: &Value) -> &str {
    assert_eq!(reply["op"], "error", "{reply}");
    reply["code"].as_str().unwrap()
}

#[test]
fn grants_decide_what_a_connection_may_subscribe_to_and_publish() {
    let node = token_node(&[]);
    let token = hs256(&claims(7, &["chat.*", "user.{sub}.*"], &["chat.room1"]));
    let mut ws = open(&node, "/ws", &[("Authorization", &bearer(&token))]).unwrap();

    for subject in ["chat.room1", "user.7.inbox"] {
        let ok = ask(&mut ws, json!({"op": "subscribe", "subject": subject}));
        assert_eq!(ok["op"], "subscribed", "{ok}");
    }
    let other_user = ask(
        &mut ws,
        json!({"op": "subscribe", "subject": "user.8.inbox"}),
    );
    assert_eq!(error_code(&other_user), "forbidden");
    // A refused subscribe takes none of its subjects.
    let mixed = ask(
        &mut ws,
        json!({"op": "subscribe", "subjects": ["chat.b", "news"]}),
    );
    assert_eq!(error_code(&mixed), "forbidden");
    assert!(
        mixed["message"].as_str().unwrap().contains("news"),
        "{mixed}"
    );

    let published = ask(
        &mut ws,
        json!({"op": "publish", "subject": "chat.room1", "data": 1}),
    );
    assert_eq!(published["op"], "ok", "{published}");
    let refused = ask(
        &mut ws,
        json!({"op": "publish", "subject": "chat.room2", "data": 2}),
    );
    assert_eq!(error_code(&refused), "forbidden");

    // Without a token, nothing outside an anonymous namespace.
    let mut anonymous = node.connect();
    let r = ask(
        &mut anonymous,
        json!({"op": "subscribe", "subject": "chat.room1"}),
    );
    assert_eq!(error_code(&r), "forbidden");
    assert!(
        r["message"].as_str().unwrap().contains("needs a token"),
        "{r}"
    );
    let r = ask(
        &mut anonymous,
        json!({"op": "publish", "subject": "chat.room1", "data": 3}),
    );
    assert_eq!(error_code(&r), "forbidden");

    let stats = node.wait_for_stats("forbidden counted", |s| s["errors"]["forbidden"] == 5);
    // The two granted, and the user's own feed.
    assert_eq!(stats["subscriptions"], 3, "{stats}");
}

/// Key files made with `openssl`: (private PEM, public PEM, public DER).
struct KeyFiles {
    private: Vec<u8>,
    public: PathBuf,
    der: Vec<u8>,
}

fn openssl(args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl (scripts/install-test-deps.sh installs it)");
    assert!(status.success(), "openssl {args:?}");
}

fn make_key(dir: &Path, name: &str, genpkey: &[&str]) -> KeyFiles {
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let der = dir.join(format!("{name}.der"));
    let mut args = vec!["genpkey", "-out", private.to_str().unwrap()];
    args.extend_from_slice(genpkey);
    openssl(&args);
    let private_s = private.to_str().unwrap();
    openssl(&[
        "pkey",
        "-in",
        private_s,
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    openssl(&[
        "pkey",
        "-in",
        private_s,
        "-pubout",
        "-outform",
        "DER",
        "-out",
        der.to_str().unwrap(),
    ]);
    KeyFiles {
        private: std::fs::read(&private).unwrap(),
        public,
        der: std::fs::read(&der).unwrap(),
    }
}

#[test]
fn every_algorithm_and_key_source_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = make_key(
        dir.path(),
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let ec = make_key(
        dir.path(),
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let ed = make_key(dir.path(), "ed", &["-algorithm", "ED25519"]);
    let jwks_ec = make_key(
        dir.path(),
        "jwks-ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let jwks_ed = make_key(dir.path(), "jwks-ed", &["-algorithm", "ED25519"]);
    let stranger = make_key(
        dir.path(),
        "stranger",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );

    // A JWKS of three keys told apart by kid: the public point of an EC
    // key (the last 64 bytes of its DER), an Ed25519 key (the last 32) and
    // an HMAC secret.
    let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
    let point = &jwks_ec.der[jwks_ec.der.len() - 64..];
    let jwks = json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec-1", "alg": "ES256",
         "x": b64(&point[..32]), "y": b64(&point[32..])},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed-1", "x": b64(&jwks_ed.der[jwks_ed.der.len() - 32..])},
        {"kty": "oct", "kid": "hs-1", "k": b64(b"another-secret-only-in-the-jwks-file")},
    ]});
    let jwks_path = dir.path().join("keys.jwks");
    std::fs::write(&jwks_path, jwks.to_string()).unwrap();

    let node = Node::start(&[
        "--workers",
        "1",
        "--token-hmac-secret",
        SECRET,
        "--token-public-key",
        rsa.public.to_str().unwrap(),
        "--token-public-key",
        ec.public.to_str().unwrap(),
        "--token-public-key",
        ed.public.to_str().unwrap(),
        "--token-jwks",
        jwks_path.to_str().unwrap(),
    ]);
    let with_kid = |alg, kid: &str| Header {
        kid: Some(kid.to_owned()),
        ..Header::new(alg)
    };
    let c = claims(1, &["room"], &[]);
    let tokens = [
        ("HS256", hs256(&c)),
        (
            "RS256",
            sign_with(
                Header::new(Algorithm::RS256),
                &EncodingKey::from_rsa_pem(&rsa.private).unwrap(),
                &c,
            ),
        ),
        (
            "ES256",
            sign_with(
                Header::new(Algorithm::ES256),
                &EncodingKey::from_ec_pem(&ec.private).unwrap(),
                &c,
            ),
        ),
        (
            "EdDSA",
            sign_with(
                Header::new(Algorithm::EdDSA),
                &EncodingKey::from_ed_pem(&ed.private).unwrap(),
                &c,
            ),
        ),
        (
            "JWKS ES256",
            sign_with(
                with_kid(Algorithm::ES256, "ec-1"),
                &EncodingKey::from_ec_pem(&jwks_ec.private).unwrap(),
                &c,
            ),
        ),
        (
            "JWKS EdDSA",
            sign_with(
                with_kid(Algorithm::EdDSA, "ed-1"),
                &EncodingKey::from_ed_pem(&jwks_ed.private).unwrap(),
                &c,
            ),
        ),
        (
            "JWKS HS256",
            sign_with(
                with_kid(Algorithm::HS256, "hs-1"),
                &EncodingKey::from_secret(b"another-secret-only-in-the-jwks-file"),
                &c,
            ),
        ),
    ];
    for (what, token) in &tokens {
        let mut ws = open(&node, &format!("/ws?token={token}"), &[])
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let reply = ask(&mut ws, json!({"op": "subscribe", "subject": "room"}));
        assert_eq!(reply["op"], "subscribed", "{what}: {reply}");
    }
    // The right kind of key, but not one the node has.
    let unknown = sign_with(
        Header::new(Algorithm::ES256),
        &EncodingKey::from_ec_pem(&stranger.private).unwrap(),
        &c,
    );
    let (status, body) = open(&node, &format!("/ws?token={unknown}"), &[]).unwrap_err();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("invalid_token"), "{body}");
    let stats = node.stats();
    assert_eq!(stats["errors"]["token_signature"], 1, "{stats:#}");
}

#[test]
fn sighup_reloads_the_token_key_files_and_a_bad_one_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = make_key(dir.path(), "a", &["-algorithm", "ED25519"]);
    let b = make_key(dir.path(), "b", &["-algorithm", "ED25519"]);
    let in_force = dir.path().join("token.pub");
    std::fs::copy(&a.public, &in_force).unwrap();
    let node = Node::start(&[
        "--workers",
        "2",
        "--token-public-key",
        in_force.to_str().unwrap(),
    ]);
    let eddsa = |key: &KeyFiles| {
        sign_with(
            Header::new(Algorithm::EdDSA),
            &EncodingKey::from_ed_pem(&key.private).unwrap(),
            &claims(5, &["r"], &[]),
        )
    };
    let opens = |token: &str| open(&node, "/ws", &[("Authorization", &bearer(token))]);
    let (token_a, token_b) = (eddsa(&a), eddsa(&b));
    let mut before = opens(&token_a).unwrap();
    assert_eq!(opens(&token_b).unwrap_err().0, 401, "B is not a key yet");

    // Replaced the way operations.md says: a new file renamed over the old.
    let staged = dir.path().join("token.pub.new");
    std::fs::copy(&b.public, &staged).unwrap();
    std::fs::rename(&staged, &in_force).unwrap();
    node.hang_up();
    node.wait_for_stats("the reload", |s| s["token_key_reloads"] == 1);
    let mut after = opens(&token_b).unwrap();
    assert_eq!(opens(&token_a).unwrap_err().0, 401, "A is gone");
    // A connection opened with A keeps what its token granted.
    let ok = ask(&mut before, json!({"op": "subscribe", "subject": "r"}));
    assert_eq!(ok["op"], "subscribed", "{ok}");

    std::fs::write(&in_force, "not a key").unwrap();
    node.hang_up();
    let stats = node.wait_for_stats("the failed reload", |s| {
        s["errors"]["token_keys_reload_failed"] == 1
    });
    assert_eq!(stats["token_key_reloads"], 1, "{stats:#}");
    assert!(opens(&token_b).is_ok(), "B stays in force");
    assert_eq!(opens(&token_a).unwrap_err().0, 401);
    let ok = ask(&mut after, json!({"op": "subscribe", "subject": "r"}));
    assert_eq!(ok["op"], "subscribed", "{ok}");
    assert_eq!(
        node.metric("myriad_token_key_reloads_total"),
        1,
        "the metric counts what /stats does"
    );
}

#[test]
fn bad_tokens_are_refused_with_their_reason() {
    let node = token_node(&["--token-audience", "myriad"]);
    let good = json!({"sub": "3", "exp": now() + 60, "aud": "myriad"});
    assert!(open(&node, &format!("/ws?token={}", hs256(&good)), &[]).is_ok());

    let other_secret = sign_with(
        Header::default(),
        &EncodingKey::from_secret(b"not-the-secret-the-node-knows-at-all"),
        &good,
    );
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(good.to_string())
    );
    let mut other_audience = good.clone();
    other_audience["aud"] = json!("billing");
    let mut expired = good.clone();
    expired["exp"] = json!(now() - 5);
    let mut named = good.clone();
    named["sub"] = json!("alice");
    let cases = [
        (other_secret, "token_signature"),
        (none, "token_algorithm"),
        (hs256(&other_audience), "token_audience"),
        (hs256(&expired), "token_expired"),
        (hs256(&named), "token_subject"),
        ("not-a-jwt".to_owned(), "token_malformed"),
    ];
    for (token, label) in &cases {
        let (status, body) = open(&node, "/ws", &[("Authorization", &bearer(token))]).unwrap_err();
        assert_eq!(status, 401, "{label}: {body}");
        let code = serde_json::from_str::<Value>(&body).unwrap()["error"]["code"].clone();
        assert_eq!(code, "invalid_token", "{label}");
    }
    // The same refusals through `connect`.
    let mut ws = node.connect();
    let reply = ask(&mut ws, json!({"op": "connect", "token": cases[1].0}));
    assert_eq!(error_code(&reply), "invalid_token");
    assert!(
        reply["message"].as_str().unwrap().contains("\"none\""),
        "{reply}"
    );

    let stats = node.stats();
    for (_, label) in &cases {
        let expected = if *label == "token_algorithm" { 2 } else { 1 };
        assert_eq!(stats["errors"][label], expected, "{label}: {stats:#}");
    }
    // `?user=` cannot stand in for a token.
    let (status, _) = open(&node, "/ws?user=3", &[]).unwrap_err();
    assert_eq!(status, 400);
}

/// Sends every command in one go (ids 1, 2, …) and returns the replies to
/// them, in order.
fn replies_to(ws: &mut Ws, commands: &[Value]) -> Vec<Value> {
    for (i, command) in commands.iter().enumerate() {
        let mut command = command.clone();
        command["id"] = json!(i + 1);
        ws.write(tungstenite::Message::text(command.to_string()))
            .unwrap();
    }
    ws.flush().unwrap();
    let mut replies = Vec::new();
    while replies.len() < commands.len() {
        let reply = recv(ws);
        if reply["id"].is_u64() {
            replies.push(reply);
        }
    }
    replies
}

fn count_code(replies: &[Value], code: &str) -> usize {
    replies.iter().filter(|r| r["code"] == code).count()
}

#[test]
fn connect_and_refresh_past_the_token_rate_are_refused_unchecked_and_counted() {
    // The defaults: client_token_rate 1, client_token_burst 5.
    let node = token_node(&[]);
    let bad = sign_with(
        Header::default(),
        &EncodingKey::from_secret(b"not-the-secret-the-node-knows-at-all"),
        &claims(4, &["r"], &[]),
    );
    let mut ws = node.connect();
    let connects = vec![json!({"op": "connect", "token": bad}); 100];
    let replies = replies_to(&mut ws, &connects);
    let (checked, limited) = (
        count_code(&replies, "invalid_token"),
        count_code(&replies, "rate_limited"),
    );
    assert_eq!(checked + limited, 100, "{replies:?}");
    assert!(checked >= 5, "the burst is checked: {checked}");
    assert!(limited >= 50, "refills are one a second: {checked} checked");
    let stats = node.stats();
    assert_eq!(stats["errors"]["token_signature"], checked as u64);
    assert_eq!(
        stats["errors"]["token_rate_limited"], limited as u64,
        "{stats:#}"
    );

    // An honest client: one connect, then refreshes minutes apart, is
    // nowhere near the limit; nor is one that opened with its token.
    let token = hs256(&claims(4, &["r"], &[]));
    let mut honest = node.connect();
    for op in ["connect", "refresh"] {
        assert_eq!(
            ask(&mut honest, json!({"op": op, "token": token}))["op"],
            "ok"
        );
    }
    let mut opened = open(&node, "/ws", &[("Authorization", &bearer(&token))]).unwrap();
    let refreshed = ask(&mut opened, json!({"op": "refresh", "token": token}));
    assert_eq!(refreshed["op"], "ok", "{refreshed}");
}

/// Opens `/ws?token=…` from source address `from`; the WebSocket, or the
/// refusal's status.
fn open_from(node: &Node, from: &str, token: &str) -> Result<Ws, u16> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let source: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    socket.bind(&source.into()).unwrap();
    socket.connect(&node.ws.into()).unwrap();
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let url = node.url(&format!("/ws?token={token}"));
    match tungstenite::client(url, tungstenite::stream::MaybeTlsStream::Plain(stream)) {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("connect: {e}"),
    }
}

#[test]
fn failed_token_checks_are_bounded_per_address_across_connections() {
    let node = token_node(&["--token-failures-per-ip", "10"]);
    let bad = sign_with(
        Header::default(),
        &EncodingKey::from_secret(b"not-the-secret-the-node-knows-at-all"),
        &claims(4, &["r"], &[]),
    );
    // A new connection for every bad token: each is refused, and so each
    // costs a check until the address has spent its failures.
    let statuses: Vec<u16> = (0..40)
        .map(|_| open_from(&node, "127.0.0.1", &bad).unwrap_err())
        .collect();
    let checked = statuses.iter().filter(|s| **s == 401).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(checked + limited, 40, "{statuses:?}");
    assert!(checked >= 10, "a minute's failures are checked: {checked}");
    assert!(limited >= 20, "one more every 6 s: {checked} checked");
    // The address's good tokens wait too, and so does `connect`, on any
    // connection from it.
    let good = hs256(&claims(4, &["r"], &[]));
    assert_eq!(open_from(&node, "127.0.0.1", &good).err(), Some(429));
    let mut ws = node.connect();
    let reply = ask(&mut ws, json!({"op": "connect", "token": good}));
    assert_eq!(error_code(&reply), "rate_limited", "{reply}");
    // Another address is checked as usual.
    let mut other = open_from(&node, "127.0.0.2", &good).expect("another address");
    let ok = ask(&mut other, json!({"op": "subscribe", "subject": "r"}));
    assert_eq!(ok["op"], "subscribed", "{ok}");

    let stats = node.stats();
    assert_eq!(stats["errors"]["token_signature"], checked as u64);
    assert_eq!(
        stats["errors"]["token_address_limited"],
        limited as u64 + 2,
        "{stats:#}"
    );
}

#[test]
fn connect_authenticates_an_open_connection_as_its_user() {
    let node = token_node(&[]);
    let mut ws = node.connect();
    let refused = ask(&mut ws, json!({"op": "subscribe", "subject": "room"}));
    assert_eq!(error_code(&refused), "forbidden");
    let no_user = ask(&mut ws, json!({"op": "send", "data": 1}));
    assert_eq!(error_code(&no_user), "no_user");

    let token = hs256(&claims(11, &["room"], &[]));
    assert_eq!(
        ask(&mut ws, json!({"op": "connect", "token": token}))["op"],
        "ok"
    );
    let again = ask(&mut ws, json!({"op": "connect", "token": token}));
    assert_eq!(error_code(&again), "already_connected");
    let sub = ask(&mut ws, json!({"op": "subscribe", "subject": "room"}));
    assert_eq!(sub["op"], "subscribed", "{sub}");
    // The token's user is the connection's: `send` reaches its own feed.
    send(&mut ws, json!({"op": "send", "id": 1, "data": "hello"}));
    let mut got = [recv(&mut ws), recv(&mut ws)];
    got.sort_by_key(|m| m["op"].as_str().unwrap().to_owned());
    assert_eq!(
        (&got[0]["op"], &got[0]["subject"]),
        (&json!("msg"), &json!("@11"))
    );
    assert_eq!(got[0]["data"], "hello");
    assert_eq!(
        (&got[1]["op"], &got[1]["reached"]),
        (&json!("ok"), &json!(1))
    );
}

#[test]
fn an_expired_token_closes_its_connection_and_refresh_keeps_one_open() {
    let node = token_node(&[]);
    let expires_at = now() + 4;
    let short = |sub: u64| {
        hs256(&json!({"sub": sub.to_string(), "exp": expires_at, "subscribe": ["room"]}))
    };
    let mut lapsing = open(&node, &format!("/ws?token={}", short(5)), &[]).unwrap();
    let mut kept = open(&node, &format!("/ws?token={}", short(5)), &[]).unwrap();
    for ws in [&mut lapsing, &mut kept] {
        assert_eq!(
            ask(ws, json!({"op": "subscribe", "subject": "room"}))["op"],
            "subscribed"
        );
    }

    // A refresh for another user, or one that no longer grants a held
    // subject, is refused and changes nothing.
    let other = ask(&mut kept, json!({"op": "refresh", "token": short(6)}));
    assert_eq!(error_code(&other), "invalid_token");
    assert!(
        other["message"].as_str().unwrap().contains("user 6"),
        "{other}"
    );
    let narrower = hs256(&claims(5, &["elsewhere"], &[]));
    let lost = ask(&mut kept, json!({"op": "refresh", "token": narrower}));
    assert_eq!(error_code(&lost), "forbidden");
    let longer = hs256(&claims(5, &["room"], &[]));
    assert_eq!(
        ask(&mut kept, json!({"op": "refresh", "token": longer}))["op"],
        "ok"
    );

    assert_eq!(recv_close(&mut lapsing), 4501);
    let closed = now();
    assert!(closed >= expires_at, "closed before its exp");
    // The sweep runs once a second; ten leave room for a loaded machine.
    assert!(
        closed <= expires_at + 10,
        "closed {}s after exp",
        closed - expires_at
    );
    // The refreshed one is still served.
    node.publish("room", &json!("after"));
    let m = recv(&mut kept);
    assert_eq!(m["data"], "after", "{m}");
    let stats = node.wait_for_stats("the close counted", |s| s["closes"]["token_expired"] == 1);
    assert_eq!(stats["errors"]["token_user_changed"], 1);
}

#[test]
fn namespace_policy_opens_and_closes_what_grants_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("myriad.toml");
    std::fs::write(
        &path,
        r#"
[[namespace]]
prefix = "public."
anonymous = true

[[namespace]]
prefix = "feed."
publish = false
history = false
"#,
    )
    .unwrap();
    let node = token_node(&["--config", path.to_str().unwrap()]);
    let mut anonymous = node.connect();
    let r = ask(
        &mut anonymous,
        json!({"op": "subscribe", "subject": "public.news"}),
    );
    assert_eq!(r["op"], "subscribed", "{r}");
    let r = ask(
        &mut anonymous,
        json!({"op": "publish", "subject": "public.news", "data": 1}),
    );
    assert_eq!(r["op"], "ok", "{r}");

    let token = hs256(&claims(2, &["*"], &["*"]));
    let mut ws = open(&node, &format!("/ws?token={token}"), &[]).unwrap();
    let r = ask(&mut ws, json!({"op": "subscribe", "subject": "feed.x"}));
    assert_eq!(r["op"], "subscribed", "{r}");
    let r = ask(
        &mut ws,
        json!({"op": "publish", "subject": "feed.x", "data": 1}),
    );
    assert_eq!(error_code(&r), "forbidden");
    let r = ask(&mut ws, json!({"op": "history", "subject": "feed.x"}));
    assert_eq!(error_code(&r), "forbidden");
    let r = ask(&mut ws, json!({"op": "history", "subject": "other"}));
    assert_eq!(r["op"], "history", "{r}");
}

/// A GET to the client listener; the status and, for a 200, the first
/// `lines` lines of the body (each read within 10 s).
fn http_get(
    node: &Node,
    target: &str,
    headers: &[(&str, &str)],
    lines: usize,
) -> (u16, Vec<String>) {
    let mut stream = TcpStream::connect(node.ws).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("GET {target} HTTP/1.1\r\nHost: test\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let code: u16 = status[9..12].parse().unwrap();
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
        line.clear();
    }
    let mut body = Vec::new();
    if code != 200 {
        let mut rest = String::new();
        let _ = reader.read_to_string(&mut rest);
        body.push(rest);
        return (code, body);
    }
    while body.len() < lines {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if !line.trim().is_empty() {
            body.push(line.trim_end().to_owned());
        }
    }
    (code, body)
}

#[test]
fn the_http_transports_obey_the_same_rules() {
    let node = token_node(&[]);
    let token = hs256(&claims(4, &["room"], &[]));
    let (status, _) = http_get(&node, &format!("/sse?subject=room&token={token}"), &[], 0);
    assert_eq!(status, 200);
    let (status, body) = http_get(&node, &format!("/sse?subject=other&token={token}"), &[], 0);
    assert_eq!(status, 403);
    assert!(body[0].contains("\"forbidden\""), "{body:?}");
    let (status, _) = http_get(&node, "/poll?subject=room", &[], 0);
    assert_eq!(status, 403, "no token, no anonymous namespace");
    let (status, body) = http_get(&node, "/stream?subject=room&token=x.y.z", &[], 0);
    assert_eq!(status, 401, "{body:?}");
    let (status, _) = http_get(
        &node,
        "/stream?subject=room",
        &[("Authorization", &bearer(&token))],
        0,
    );
    assert_eq!(status, 200);

    // A stream whose token expires ends with a close line naming why.
    let short = hs256(&json!({"sub": "4", "exp": now() + 3, "subscribe": ["room"]}));
    let (status, lines) = http_get(
        &node,
        &format!("/stream?subject=room&token={short}"),
        &[],
        usize::MAX,
    );
    assert_eq!(status, 200);
    let text = lines.join("\n");
    assert!(text.contains("token_expired"), "{text}");
    let stats = node.stats();
    assert_eq!(stats["errors"]["request_forbidden"], 2, "{stats:#}");
}

#[test]
fn pages_from_other_origins_are_refused() {
    // The flag follows its setting's name; the old singular one is kept
    // as an alias and adds to the same list.
    let node = token_node(&[
        "--allowed-origins",
        "https://app.example",
        "--allowed-origin",
        "https://old.example",
        "--anonymous",
        "true",
    ]);
    let ok = open(&node, "/ws", &[("Origin", "https://app.example")]);
    assert!(ok.is_ok());
    let old = open(&node, "/ws", &[("Origin", "https://old.example")]);
    assert!(old.is_ok(), "the alias's origin passes too");
    assert!(
        open(&node, "/ws", &[]).is_ok(),
        "no Origin: not a browser page"
    );
    let (status, body) = open(&node, "/ws", &[("Origin", "https://evil.example")]).unwrap_err();
    assert_eq!(status, 403);
    assert!(body.contains("origin_not_allowed"), "{body}");
    let (status, _) = http_get(
        &node,
        "/sse?subject=a",
        &[("Origin", "https://evil.example")],
        0,
    );
    assert_eq!(status, 403);
    let (status, _) = http_get(
        &node,
        "/sse?subject=a",
        &[("Origin", "https://app.example")],
        0,
    );
    assert_eq!(status, 200);
    let stats = node.stats();
    assert_eq!(
        stats["errors"]["request_origin_not_allowed"], 2,
        "{stats:#}"
    );
}

#[test]
fn a_token_from_myriad_token_opens_a_connection() {
    let node = token_node(&["--token-audience", "chat"]);
    let output = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args([
            "token",
            "--sub",
            "9",
            "--subscribe",
            "user.{sub}.*",
            "--ttl",
            "1m",
        ])
        .args(["--aud", "chat", "--hmac-secret", SECRET])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let token = String::from_utf8(output.stdout).unwrap();
    let mut ws = open(&node, &format!("/ws?token={}", token.trim()), &[]).unwrap();
    let reply = ask(&mut ws, json!({"op": "subscribe", "subject": "user.9.x"}));
    assert_eq!(reply["op"], "subscribed", "{reply}");
    let refused = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args(["token", "--sub", "9"])
        .env_remove("MYRIAD_TOKEN_HMAC_SECRET")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--hmac-secret"));
}

#[test]
fn feeds_a_client_chose_are_held_to_its_grants_and_send_to_its_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("myriad.toml");
    std::fs::write(&path, "[[namespace]]\nprefix = \"@5\"\npublish = false\n").unwrap();
    let node = token_node(&["--config", path.to_str().unwrap()]);
    let token = hs256(&claims(4, &["@9"], &[]));
    let mut ws = open(&node, &format!("/ws?token={token}"), &[]).unwrap();
    let sub = ask(&mut ws, json!({"op": "subscribe", "subject": "@9"}));
    assert_eq!(sub["op"], "subscribed", "{sub}");
    // A refresh that no longer grants the feed the client chose is refused;
    // the user's own feed, which the graph made, needs no grant.
    let narrower = hs256(&claims(4, &[], &[]));
    let r = ask(&mut ws, json!({"op": "refresh", "token": narrower}));
    assert_eq!(error_code(&r), "forbidden");
    assert!(r["message"].as_str().unwrap().contains("@9"), "{r}");
    assert_eq!(
        ask(&mut ws, json!({"op": "unsubscribe", "subject": "@9"}))["op"],
        "ok"
    );
    assert_eq!(
        ask(&mut ws, json!({"op": "refresh", "token": narrower}))["op"],
        "ok"
    );

    // `send` needs no grant, but a namespace closed to client publishes
    // holds for it too.
    assert_eq!(ask(&mut ws, json!({"op": "send", "data": 1}))["op"], "ok");
    let five = hs256(&claims(5, &[], &[]));
    let mut closed = open(&node, &format!("/ws?token={five}"), &[]).unwrap();
    let r = ask(&mut closed, json!({"op": "send", "data": 1}));
    assert_eq!(error_code(&r), "forbidden");
}
