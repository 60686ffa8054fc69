//! Shared test harness: starts the real `myriad` binary on ephemeral
//! loopback ports and talks to it with tungstenite and plain HTTP.

#![allow(dead_code)] // each test file uses a different part of the harness

pub mod browser;
pub mod graph;
pub mod tls;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use socket2::{Domain, Socket, Type};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

pub type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// A running node; killed when dropped.
pub struct Node {
    pub child: Child,
    pub ws: SocketAddr,
    pub admin: SocketAddr,
    /// The client listener speaks TLS (see `tls::Pki::start`).
    pub tls: bool,
    /// The `--admin-key` the node was started with: the harness's own
    /// requests (`stats`, `publish`) carry it.
    pub admin_key: Option<String>,
    /// The node's own data directory, removed with it, unless the test
    /// gave one (`--data-dir`) to outlive the node.
    _data_dir: Option<tempfile::TempDir>,
}

impl Node {
    /// Starts `myriad serve` with `extra` flags (plus ephemeral ports, and a
    /// fresh data directory unless `extra` names one).
    pub fn start(extra: &[&str]) -> Node {
        Node::launch(serve_command(), extra)
    }

    /// [`Node::start`], with the node's open-file limit (soft and hard) at
    /// `open_files`, as `ulimit -n` would set it.
    pub fn start_with_open_files(extra: &[&str], open_files: u64) -> Node {
        use std::os::unix::process::CommandExt;
        let mut command = serve_command();
        // SAFETY: setrlimit is async-signal-safe, and the closure touches
        // nothing else between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: open_files,
                    rlim_max: open_files,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Node::launch(command, extra)
    }

    fn launch(mut command: Command, extra: &[&str]) -> Node {
        let data_dir = (!extra.contains(&"--data-dir"))
            .then(|| tempfile::tempdir().expect("a data directory"));
        let mut own_dir = Vec::new();
        if let Some(dir) = &data_dir {
            own_dir = vec!["--data-dir".to_owned(), dir.path().display().to_string()];
        }
        let admin_key = extra
            .iter()
            .position(|arg| *arg == "--admin-key")
            .map(|at| extra[at + 1].to_owned());
        let mut child = command
            .args(extra)
            .args(&own_dir)
            .env("MYRIAD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start myriad");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read the ready line");
        let ready: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("ready line {line:?}: {e}"));
        assert_eq!(ready["event"], "listening");
        Node {
            ws: ready["ws"].as_str().unwrap().parse().unwrap(),
            admin: ready["admin"].as_str().unwrap().parse().unwrap(),
            tls: false,
            admin_key,
            child,
            _data_dir: data_dir,
        }
    }

    /// The WebSocket URL of `path`; `wss://localhost:…` on a TLS node, the
    /// name its certificate is for.
    pub fn url(&self, path: &str) -> String {
        match self.tls {
            true => format!("wss://localhost:{}{path}", self.ws.port()),
            false => format!("ws://{}{path}", self.ws),
        }
    }

    /// Opens a WebSocket to `/ws`.
    pub fn connect(&self) -> Ws {
        self.connect_path("/ws")
    }

    pub fn connect_path(&self, path: &str) -> Ws {
        let (ws, response) = tungstenite::connect(self.url(path)).expect("websocket connect");
        assert_eq!(response.status(), 101);
        set_timeout(&ws, Duration::from_secs(10));
        ws
    }

    /// A plain HTTP request to the admin listener: (status, body).
    pub fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        http(self.admin, method, path, headers, body)
    }

    /// The node's admin key as request headers (none without one).
    pub fn key_headers(&self) -> Vec<(&str, &str)> {
        let key = self.admin_key.as_deref();
        key.map(|key| ("X-Api-Key", key)).into_iter().collect()
    }

    pub fn stats(&self) -> Value {
        let (status, body) = self.http("GET", "/stats", &self.key_headers(), "");
        assert_eq!(status, 200);
        serde_json::from_str(&body).unwrap()
    }

    /// Sends a GET for `target` to the client listener on a fresh socket
    /// (with `recv_buffer` as its `SO_RCVBUF`, if given) and returns it,
    /// positioned after the response head, which must be a 200. Reads time
    /// out after 10 s.
    pub fn open_raw(&self, target: &str, recv_buffer: Option<usize>) -> BufReader<TcpStream> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        if let Some(size) = recv_buffer {
            socket.set_recv_buffer_size(size).unwrap();
        }
        socket.connect(&self.ws.into()).unwrap();
        let mut stream: TcpStream = socket.into();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(stream, "GET {target} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                return reader;
            }
        }
    }

    /// A WebSocket subscribed to `subject` whose receive buffer is tiny
    /// (4 KiB), so that it stalls quickly once it stops reading.
    pub fn stalled_subscriber(&self, subject: &str) -> Ws {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket.connect(&self.ws.into()).unwrap();
        let stream: TcpStream = socket.into();
        let (mut ws, _) =
            tungstenite::client(self.url("/ws"), MaybeTlsStream::Plain(stream)).expect("handshake");
        set_timeout(&ws, Duration::from_secs(10));
        subscribe(&mut ws, &[subject]);
        ws
    }

    /// The value of a metric series without labels from `GET /metrics`.
    pub fn metric(&self, name: &str) -> u64 {
        let (status, text) = self.http("GET", "/metrics", &[], "");
        assert_eq!(status, 200);
        let line = text
            .lines()
            .find(|line| {
                line.split_once(' ')
                    .is_some_and(|(series, _)| series == name)
            })
            .unwrap_or_else(|| panic!("{name} missing from /metrics"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// The series of a labelled metric family `name` (per worker, say)
    /// from `GET /metrics`, summed.
    pub fn metric_sum(&self, name: &str) -> u64 {
        let (status, text) = self.http("GET", "/metrics", &[], "");
        assert_eq!(status, 200);
        text.lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// Publishes through the HTTP API; returns the response JSON.
    pub fn publish(&self, subject: &str, data: &Value) -> Value {
        let body = serde_json::json!({"subject": subject, "data": data}).to_string();
        let (status, reply) = self.http("POST", "/api/publish", &self.key_headers(), &body);
        assert_eq!(status, 200, "{reply}");
        serde_json::from_str(&reply).unwrap()
    }

    /// Waits until the metric series `name` (as [`Node::metric`] reads it)
    /// reaches `at_least`, or fails after 10 s.
    pub fn wait_for_metric(&self, name: &str, at_least: u64) {
        wait_until(&format!("{name} to reach {at_least}"), || {
            self.metric(name) >= at_least
        });
    }

    /// Waits until `f(stats)` holds, or fails after 10 s.
    pub fn wait_for_stats(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = self.stats();
            if f(&stats) {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {stats:#}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Node {
    /// A node of the cluster over `redis` (`--engine redis`), its keys
    /// under `prefix`: nodes started with the same two are one cluster.
    pub fn in_cluster(redis: &myriad_testkit::RedisServer, prefix: &str) -> Node {
        let defaults = ["--workers", "2", "--redis-timeout", "2s"];
        Node::in_cluster_of(&[redis], prefix, &defaults)
    }

    /// A node of the cluster over the Redis instances `redis`, in this order,
    /// with `extra` flags.
    pub fn in_cluster_of(
        redis: &[&myriad_testkit::RedisServer],
        prefix: &str,
        extra: &[&str],
    ) -> Node {
        let urls: Vec<String> = redis.iter().map(|r| r.url()).collect();
        let mut args = vec!["--engine", "redis", "--redis-prefix", prefix];
        for url in &urls {
            args.extend(["--redis-url", url.as_str()]);
        }
        args.extend(extra);
        Node::start(&args)
    }

    /// Kills the node with SIGKILL (`kill -9`) and waits for it to be gone:
    /// no goodbye to its clients, the kernel closes its sockets.
    pub fn kill_9(&mut self) {
        self.child.kill().expect("kill -9 the node");
        self.child.wait().expect("reap the node");
    }

    /// Sends SIGTERM: graceful shutdown starts.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends SIGHUP: the TLS certificate is read again.
    pub fn hang_up(&self) {
        self.signal("HUP");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (up to 15 s) for the node to exit, and checks it exited cleanly.
    pub fn wait_for_exit(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit status {status}");
                return;
            }
            assert!(Instant::now() < deadline, "node did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Publishes 800 messages of 8 KiB to `subject` while `next` reads them
    /// on its own thread (each call returns one delivery's offset); returns
    /// the offsets read. See [`Node::publish_paced`] for the pacing.
    pub fn firehose(
        &self,
        subject: &str,
        mut next: impl FnMut() -> u64 + Send + 'static,
    ) -> Vec<u64> {
        let received = std::sync::Arc::new(AtomicU64::new(0));
        let counted = std::sync::Arc::clone(&received);
        let reader = std::thread::spawn(move || {
            let mut offsets = Vec::new();
            while offsets.len() < 800 {
                offsets.push(next());
                counted.fetch_add(1, Ordering::Release);
            }
            offsets
        });
        self.publish_paced(subject, &received);
        reader.join().unwrap()
    }

    /// Publishes 800 messages of 8 KiB to `subject` (data `"batch-i-xxx…"`,
    /// 6.4 MB in all) in 80 requests of 10. Before each request it waits
    /// until the reader counting in `received` is at most one request
    /// behind, so only a reader that stops reading can fall further behind,
    /// however busy the machine is.
    pub fn publish_paced(&self, subject: &str, received: &AtomicU64) {
        let chunk = "x".repeat(8 * 1024);
        for batch in 0..80u64 {
            let deadline = Instant::now() + Duration::from_secs(30);
            while received.load(Ordering::Acquire) + 10 < batch * 10 {
                assert!(
                    Instant::now() < deadline,
                    "the reader stopped at batch {batch}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            self.publish_batch(subject, batch, 10, &chunk);
        }
    }

    /// Publishes `count` messages to `subject` in one API request, their
    /// data `"{batch}-{i}-{filler}"` for `i` in `0..count`.
    pub fn publish_batch(&self, subject: &str, batch: u64, count: u64, filler: &str) {
        let messages: Vec<_> = (0..count)
            .map(|i| serde_json::json!({"subject": subject, "data": format!("{batch}-{i}-{filler}")}))
            .collect();
        let body = serde_json::json!({ "messages": messages }).to_string();
        let (status, reply) = self.http("POST", "/api/publish", &self.key_headers(), &body);
        assert_eq!(status, 200, "{reply}");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (up to 10 s) for `done`, failing with `what` it waited for.
pub fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `myriad serve` with `args` (and `env`) on loopback ports unless
/// `args` says otherwise; returns its exit code and stderr. A node that
/// starts anyway is killed after 10 s and counts as a failure.
pub fn refused_start(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return (status.code().unwrap_or(-1), stderr);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the node started: {args:?} {env:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `myriad serve` on ephemeral loopback ports; the caller adds the rest.
pub fn serve_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_myriad"));
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    command
}

pub fn set_timeout(ws: &Ws, timeout: Duration) {
    if let MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(timeout)).unwrap();
    }
}

pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// One IPv4 TCP socket as the kernel lists it in `/proc/net/tcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSocket {
    pub local_port: u16,
    pub remote_port: u16,
    /// `TCP_ESTABLISHED` is 1, `FIN_WAIT1` 4, `CLOSE_WAIT` 8, `LISTEN` 10 (include/net/tcp_states.h).
    pub state: u8,
    /// Bytes not yet acknowledged by the peer (`SIOCOUTQ`).
    pub tx_queue: u64,
    /// 0 once no process holds the socket: the kernel keeps it alone.
    pub inode: u64,
}

pub const CLOSE_WAIT: u8 = 8;

/// Every IPv4 TCP socket of this network namespace (the node's among them),
/// read without `ss`.
pub fn kernel_sockets() -> Vec<KernelSocket> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let port = |address: &str| {
        let (_, port) = address.split_once(':').expect("address:port");
        u16::from_str_radix(port, 16).expect("hex port")
    };
    table
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (tx, _) = fields[4].split_once(':').expect("tx:rx");
            KernelSocket {
                local_port: port(fields[1]),
                remote_port: port(fields[2]),
                state: u8::from_str_radix(fields[3], 16).expect("hex state"),
                tx_queue: u64::from_str_radix(tx, 16).expect("hex queue"),
                inode: fields[9].parse().expect("inode"),
            }
        })
        .collect()
}

/// The kernel's socket on the node's side of the connection from `client`
/// (a socket connected to the node's client port), if it still has one.
pub fn node_side(node: &Node, client: &TcpStream) -> Option<KernelSocket> {
    let client_port = client.local_addr().unwrap().port();
    kernel_sockets()
        .into_iter()
        .find(|s| s.local_port == node.ws.port() && s.remote_port == client_port)
}

/// The head of an HTTP/1.1 `GET path` with `headers`.
pub fn get_head(path: &str, headers: &[(&str, &str)]) -> String {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head + "\r\n"
}

/// An HTTP/1.1 connection to `addr` kept open across requests.
pub struct KeepAlive {
    reader: BufReader<TcpStream>,
}

impl KeepAlive {
    /// Connects; reads time out after 10 s.
    pub fn open(addr: SocketAddr) -> KeepAlive {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        KeepAlive {
            reader: BufReader::new(stream),
        }
    }

    /// Sends `GET path` with `headers` and reads the answer whole (it must
    /// have a Content-Length): (status, body).
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let request = get_head(path, headers);
        self.reader.get_mut().write_all(request.as_bytes()).unwrap();
        let mut status = String::new();
        self.reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 "), "{status:?}");
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).unwrap();
        (
            status[9..12].parse().unwrap(),
            String::from_utf8(body).unwrap(),
        )
    }

    /// The socket, for tests that go on by hand.
    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }
}

/// Sends a raw request on a fresh socket and returns the HTTP status line's code.
pub fn raw_status(addr: SocketAddr, request: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 "), "{text:?}");
    text[9..12].parse().unwrap()
}

pub fn send(ws: &mut Ws, value: Value) {
    ws.send(Message::text(value.to_string())).unwrap();
}

/// The next text message as JSON, skipping pings and pongs.
pub fn recv(ws: &mut Ws) -> Value {
    loop {
        match ws.read().expect("read from websocket") {
            Message::Text(text) => return serde_json::from_str(text.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected text, got {other:?}"),
        }
    }
}

/// Reads until the server's close frame; returns its code.
pub fn recv_close(ws: &mut Ws) -> u16 {
    loop {
        match ws.read() {
            Ok(Message::Close(Some(frame))) => return u16::from(frame.code),
            Ok(Message::Close(None)) => return 1005,
            Ok(_) => continue,
            Err(tungstenite::Error::Protocol(e)) => panic!("protocol error before close: {e}"),
            Err(e) => panic!("connection ended without a close frame: {e}"),
        }
    }
}

/// Subscribes and waits for every subject's `subscribed` reply; returns
/// each subject's position (`{"epoch":…,"offset":…}`) in `subjects` order.
pub fn subscribe(ws: &mut Ws, subjects: &[&str]) -> Vec<Value> {
    send(
        ws,
        serde_json::json!({"op": "subscribe", "subjects": subjects, "id": 1}),
    );
    let mut positions = std::collections::HashMap::new();
    while positions.len() < subjects.len() {
        let reply = recv(ws);
        assert_eq!(reply["op"], "subscribed", "{reply}");
        assert_eq!(reply["id"], 1, "{reply}");
        let subject = reply["subject"].as_str().unwrap().to_owned();
        positions.insert(
            subject,
            serde_json::json!({"epoch": reply["epoch"], "offset": reply["offset"]}),
        );
    }
    subjects.iter().map(|s| positions[*s].clone()).collect()
}

/// The next Server-Sent Event, skipping none; fails after 10 s.
pub async fn next_event<S, E>(events: &mut S) -> eventsource_stream::Event
where
    S: futures_util::Stream<Item = Result<eventsource_stream::Event, E>> + Unpin,
    E: std::fmt::Debug,
{
    use futures_util::StreamExt;
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within the wait")
        .expect("the stream goes on")
        .expect("a well-formed event")
}

pub fn close_code(code: u16) -> CloseCode {
    CloseCode::from(code)
}

/// A `myriad sub` process whose stdout and stderr lines arrive on channels,
/// so a test waits for each with a bound instead of hanging on a read.
/// Killed when dropped.
pub struct SubProcess {
    pub child: Child,
    out: std::sync::mpsc::Receiver<String>,
    err: std::sync::mpsc::Receiver<String>,
}

/// How long a test waits for one line of `myriad sub`.
const SUB_LINE_WAIT: Duration = Duration::from_secs(30);

impl SubProcess {
    /// Runs `myriad sub` with `args`.
    pub fn spawn(args: &[&str]) -> SubProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_myriad"))
            .arg("sub")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start myriad sub");
        let lines = |from: Box<dyn Read + Send>| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(from).lines() {
                    let Ok(line) = line else { return };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
            rx
        };
        let out = lines(Box::new(child.stdout.take().unwrap()));
        let err = lines(Box::new(child.stderr.take().unwrap()));
        SubProcess { child, out, err }
    }

    /// The next delivery it printed, as JSON.
    pub fn next_delivery(&self) -> Value {
        let line = self
            .out
            .recv_timeout(SUB_LINE_WAIT)
            .expect("myriad sub printed a delivery");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// The next line it wrote on stderr.
    pub fn next_note(&self) -> String {
        self.err
            .recv_timeout(SUB_LINE_WAIT)
            .expect("myriad sub wrote a note")
    }

    /// Stops it (SIGSTOP): it reads nothing until [`SubProcess::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a paused one go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) with our own child's pid; it touches no memory.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "signal {signal} to myriad sub");
    }

    /// Waits for it to exit, and returns its status and whatever it still
    /// wrote on stderr.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + SUB_LINE_WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "myriad sub did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        // Its stderr ends with it: collect to the end of the stream.
        let notes: Vec<String> = self.err.iter().collect();
        (status, notes.join("\n"))
    }
}

impl Drop for SubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
