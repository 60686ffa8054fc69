//! The `myriad bench` command line: workloads and their options.
//!
//! Only parsing and defaults live here; each workload module turns its
//! arguments into worker tasks. Every argument struct is `Serialize` so the
//! JSON report carries the full configuration of the run (the API key
//! excepted).

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::schema::{CloseMode, PublishTransport, SubscribeTransport};
use crate::util::addr::{AddrError, PortMode, Sources, Target};
use crate::util::graph::SenderChoice;
use crate::util::pattern::{AssignMode, Assignment, Pattern, PublishOrder};
use crate::util::payload::Pad;

/// Load-test a WebSocket pub/sub server: myriad by default, or another via
/// a protocol profile. Subscribers receive over WebSocket, or over myriad's
/// receive-only HTTP transports (--subscribe-transport); publishers publish
/// over WebSocket or the HTTP API (--publish-transport).
#[derive(Debug, Clone, Args, Serialize)]
pub struct BenchCommand {
    /// What to run.
    #[command(subcommand)]
    pub workload: Workload,
    /// Options every workload shares.
    #[command(flatten)]
    pub global: Global,
}

/// The workloads, one per seed's load tool, plus the hidden worker.
#[derive(Debug, Clone, Subcommand, Serialize)]
#[serde(rename_all = "kebab-case", tag = "workload")]
pub enum Workload {
    /// Connection rate (seed 000): devices arrive on a ramp-up / sustain /
    /// ramp-down schedule, handshake, optionally subscribe, hold ~1 s, close.
    ConnectRate(ConnectRateArgs),
    /// Benchsub (seed 001): N subscribed connections; latency of every
    /// message received.
    Subscribers(SubscribersArgs),
    /// Benchpub (seed 001): R messages/s of S bytes, open-loop, over
    /// WebSocket or the HTTP API (--publish-transport).
    Publishers(PublishersArgs),
    /// One subject, N subscribers, K publishes (seed 002): time until the
    /// last subscriber has each message.
    Broadcast(BroadcastArgs),
    /// Subscribers and publishers at once: the headline figures in one line.
    Run(RunArgs),
    /// Subscribers that keep reconnecting and resubscribing with `since`
    /// (`Last-Event-ID` over Server-Sent Events) while publishers publish:
    /// each must get every message of its subjects exactly once, in order,
    /// across its reconnects.
    Churn(ChurnArgs),
    /// Users of a follow graph (an edge-list file the node has loaded)
    /// connect as themselves and send as themselves at a rate, while
    /// follows and unfollows go on: every connection must get every send
    /// of the users it follows, and its own, exactly once.
    Social(SocialArgs),
    /// Internal: a worker process; reads its task from stdin.
    #[command(name = "__worker", hide = true)]
    Worker,
}

/// Options shared by every workload.
#[derive(Debug, Clone, Args, Serialize)]
pub struct Global {
    /// WebSocket URL of the server (ws://, or wss:// over TLS). Repeat it,
    /// or separate URLs with commas, for several listeners or the nodes of
    /// a cluster: connections are spread over them round robin, a churning
    /// subscriber reconnects to the next one each time, and a subscriber
    /// whose connection is lost (its node died) fails over to the next.
    #[arg(long = "url", global = true, value_delimiter = ',', value_parser = parse_ws, default_value = "ws://127.0.0.1:8080/ws")]
    pub urls: Vec<Target>,
    /// PEM file of the certificate(s) to trust for wss:// URLs (e.g. the
    /// node's own self-signed certificate).
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// The server's admin URL (myriad: http://127.0.0.1:PORT); enables the
    /// server's own figures from /stats (summed over every node given; repeat
    /// it, or separate URLs with commas, for several nodes) and HTTP
    /// publishing (to the first).
    #[arg(long = "admin-url", global = true, value_delimiter = ',', value_parser = parse_http)]
    pub admin_urls: Vec<Target>,
    /// Key for HTTP publishing (myriad's publish key); when unset,
    /// --admin-key is sent instead.
    #[arg(long, global = true, env = "MYRIAD_PUBLISH_KEY")]
    #[serde(skip)]
    pub publish_key: Option<String>,
    /// Key for the node's /stats and follow-graph API at --admin-url
    /// (myriad's admin key, which opens publishing too).
    #[arg(long, global = true, env = "MYRIAD_ADMIN_KEY")]
    #[serde(skip)]
    pub admin_key: Option<String>,
    /// Protocol profile: `myriad`, `generic`, or a TOML/JSON file.
    #[arg(long, global = true, default_value = "myriad")]
    pub profile: String,
    /// Source addresses to connect from, e.g. 127.0.0.1-127.0.0.20.
    #[arg(long, global = true)]
    pub local_addrs: Option<Sources>,
    /// Who picks source ports: the kernel, or the bench (1024-65535 split
    /// over worker processes) when the ephemeral range is too small.
    #[arg(long, global = true, value_enum, default_value_t = PortMode::Auto)]
    pub source_ports: PortMode,
    /// Worker processes (default: as few as the open-file cap allows).
    #[arg(long, global = true)]
    pub processes: Option<u64>,
    /// Bound on connect + WebSocket handshake.
    #[arg(long, global = true, default_value = "5s")]
    pub connect_timeout: Secs,
    /// Handshakes in flight per worker process while connections are set up.
    #[arg(long, global = true, default_value_t = 1000)]
    pub in_flight: u32,
    /// Write every figure and the configuration to this JSON file.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report with charts to this file.
    #[arg(long, global = true)]
    pub html: Option<PathBuf>,
    /// Seed of every random choice, so runs repeat.
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
    /// Progress display: a live bar on a terminal, plain lines otherwise.
    #[arg(long, global = true, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    /// Seconds between plain progress lines.
    #[arg(long, global = true, default_value = "5s")]
    pub progress_every: Secs,
}

impl Global {
    /// The key HTTP publishing sends: the publish key, else the admin key.
    pub fn publishing_key(&self) -> Option<&str> {
        self.publish_key.as_deref().or(self.admin_key.as_deref())
    }

    /// The header lines (each ending in CRLF; empty without a key) of a
    /// request to the node's admin API.
    pub fn admin_headers(&self) -> String {
        match &self.admin_key {
            Some(key) => format!("X-Api-Key: {key}\r\n"),
            None => String::new(),
        }
    }
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgressMode {
    /// A live display on a terminal, plain lines otherwise.
    Auto,
    /// Plain lines.
    Plain,
    /// Nothing until the summary.
    Off,
}

/// `connect-rate` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ConnectRateArgs {
    /// Peak arrival rate, connections/s.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Ramp from 0 to the peak rate over this long.
    #[arg(long, default_value = "5s")]
    pub ramp_up: Secs,
    /// Hold the peak rate this long.
    #[arg(long, default_value = "10s")]
    pub sustain: Secs,
    /// Ramp from the peak back to 0 over this long.
    #[arg(long, default_value = "5s")]
    pub ramp_down: Secs,
    /// How long each device keeps its connection.
    #[arg(long, default_value = "1s")]
    pub hold: Secs,
    /// Relative jitter of the hold time (0.05 = ± 5 %).
    #[arg(long, default_value_t = 0.05)]
    pub hold_jitter: f64,
    /// Subscribe each device to a subject of this pattern (device i takes
    /// subject i mod M).
    #[arg(long)]
    pub subscribe: Option<Pattern>,
    /// How devices close: a WebSocket close handshake, or a TCP reset.
    #[arg(long, value_enum, default_value_t = CloseMode::Graceful)]
    pub close: CloseMode,
}

/// Subscriber population options (subscribers, run).
#[derive(Debug, Clone, Args, Serialize)]
pub struct SubscribeOpts {
    /// Subscribed connections.
    #[arg(long, visible_alias = "subscribers", default_value_t = 1000)]
    pub connections: u64,
    /// Subject pattern, or a count M for /p/s{1..M} (default: one subject
    /// per connection).
    #[arg(long, value_parser = Pattern::parse_set)]
    pub subjects: Option<Pattern>,
    /// Subjects per connection.
    #[arg(long, default_value_t = 1)]
    pub subjects_per_conn: u32,
    /// How connections take subjects from the pattern.
    #[arg(long, value_enum, default_value_t = AssignMode::OneToOne)]
    pub assign: AssignMode,
    /// Cap on new connections per second while setting up (0: only the
    /// in-flight bound applies).
    #[arg(long, default_value_t = 0.0)]
    pub connect_rate: f64,
    /// How they receive.
    #[command(flatten)]
    pub receive: ReceiveOpts,
}

impl SubscribeOpts {
    /// The subject pattern, defaulting to one subject per connection.
    pub fn pattern(&self) -> Pattern {
        self.subjects
            .clone()
            .unwrap_or_else(|| Pattern::numbered(self.connections))
    }

    /// Who subscribes to what, with random draws seeded by `seed`.
    pub fn assignment(&self, seed: u64) -> Assignment {
        Assignment {
            pattern: self.pattern(),
            per_conn: self.subjects_per_conn,
            mode: self.assign,
            seed,
        }
    }
}

/// Publisher options (publishers, broadcast, run).
#[derive(Debug, Clone, Args, Serialize)]
pub struct PublishOpts {
    /// Messages per second, all publishers together (default 1000; broadcast: 10).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Size of each message's data, bytes (timestamp inside, padding).
    #[arg(long, default_value_t = 512)]
    pub size: usize,
    /// What pads the data to its size: random characters, or words (text
    /// that compresses like real messages, for permessage-deflate).
    #[arg(long, value_enum, default_value_t = Pad::Random)]
    pub pad: Pad,
    /// Publish over WebSocket or over the HTTP API (needs --admin-url).
    #[arg(id = "publish_transport", long = "publish-transport", value_name = "TRANSPORT", value_enum, default_value_t = PublishTransport::Ws)]
    pub transport: PublishTransport,
    /// Publishing connections (WebSocket or HTTP keep-alive).
    #[arg(long, default_value_t = 1)]
    pub publisher_conns: u32,
    /// How each message's subject is drawn from the pattern.
    #[arg(long, value_enum, default_value_t = PublishOrder::Random)]
    pub order: PublishOrder,
    /// Stop after this many messages (default: when the duration ends).
    #[arg(long)]
    pub count: Option<u64>,
    /// After the last publish fired, wait at most this long for the
    /// server to take what is queued, and for the deliveries.
    #[arg(long, default_value = "5s")]
    pub drain: Secs,
}

/// How subscribers receive.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ReceiveOpts {
    /// How subscribers receive: over WebSocket, or over one of myriad's
    /// receive-only HTTP transports on the --url's host and port (needs
    /// --profile myriad). Publishing is unaffected.
    #[arg(id = "subscribe_transport", long = "subscribe-transport", value_name = "TRANSPORT", value_enum, default_value_t = SubscribeTransport::Ws)]
    pub transport: SubscribeTransport,
    /// Path of the HTTP transport's endpoint, when the server's is not the
    /// default (/sse, /stream or /poll).
    #[arg(long)]
    pub subscribe_path: Option<String>,
    /// The server's poll timeout (its --poll-timeout): how long it holds a
    /// poll while nothing is new. A poll subscriber is set up by its first
    /// answer, which takes this long before anything is published.
    #[arg(long, default_value = "25s")]
    pub poll_timeout: Secs,
}

impl ReceiveOpts {
    /// The HTTP transport's endpoint path, if subscribers use one.
    pub fn http_path(&self) -> Option<String> {
        let default = match self.transport {
            SubscribeTransport::Ws | SubscribeTransport::WsDeflate => return None,
            SubscribeTransport::Sse => "/sse",
            SubscribeTransport::Stream => "/stream",
            SubscribeTransport::Poll => "/poll",
        };
        Some(
            self.subscribe_path
                .clone()
                .unwrap_or_else(|| default.to_owned()),
        )
    }

    /// How long set-up may take beyond connect and handshake: a poll's
    /// first answer comes only when the server's poll timeout passes, and
    /// myriad's sweep answers within the second after it (never before).
    pub fn first_answer_secs(&self) -> f64 {
        match self.transport {
            SubscribeTransport::Poll => self.poll_timeout.0 + 1.0,
            _ => 0.0,
        }
    }
}

/// `subscribers` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct SubscribersArgs {
    /// Who subscribes to what.
    #[command(flatten)]
    pub subs: SubscribeOpts,
    /// How long to hold the connections once all are subscribed.
    #[arg(long, default_value = "10s")]
    pub duration: Secs,
}

/// `publishers` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct PublishersArgs {
    /// Subjects to publish to: a pattern, or a count M for /p/s{1..M}.
    #[arg(long, default_value = "/p/s{1..1000}", value_parser = Pattern::parse_set)]
    pub subjects: Pattern,
    /// Publishing options.
    #[command(flatten)]
    pub publish: PublishOpts,
    /// How long to publish.
    #[arg(long, default_value = "10s")]
    pub duration: Secs,
}

/// `broadcast` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct BroadcastArgs {
    /// Subscribers of the one subject.
    #[arg(long, default_value_t = 1000)]
    pub subscribers: u64,
    /// The subject.
    #[arg(long, default_value = "bcast")]
    pub subject: Pattern,
    /// How the subscribers receive.
    #[command(flatten)]
    pub receive: ReceiveOpts,
    /// Publishing options (--count is K, default 100).
    #[command(flatten)]
    pub publish: PublishOpts,
}

/// `run` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct RunArgs {
    /// Who subscribes to what; publishers draw from the same subjects.
    #[command(flatten)]
    pub subs: SubscribeOpts,
    /// Publishing options.
    #[command(flatten)]
    pub publish: PublishOpts,
    /// How long to publish.
    #[arg(long, default_value = "10s")]
    pub duration: Secs,
}

/// `churn` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ChurnArgs {
    /// Who subscribes to what; publishers draw from the same subjects.
    #[command(flatten)]
    pub subs: SubscribeOpts,
    /// Publishing options.
    #[command(flatten)]
    pub publish: PublishOpts,
    /// Reconnects per second, all subscribers together, spread evenly:
    /// each subscriber reconnects once every N / R seconds.
    #[arg(long, default_value_t = 100.0)]
    pub reconnect_rate: f64,
    /// How long a subscriber stays away between closing its connection and
    /// opening the next (what it misses meanwhile is the replay).
    #[arg(long, default_value = "0s")]
    pub offline: Secs,
    /// How a subscriber leaves: a close handshake, or a TCP reset.
    #[arg(long, value_enum, default_value_t = CloseMode::Graceful)]
    pub close: CloseMode,
    /// How long to publish and reconnect.
    #[arg(long, default_value = "10s")]
    pub duration: Secs,
}

/// `social` options.
#[derive(Debug, Clone, Args, Serialize)]
pub struct SocialArgs {
    /// The follow graph: an edge-list file, one `follower followee` pair a
    /// line (`myriad graph generate` writes one). The node must hold the
    /// same graph (`myriad graph load`, or --load-graph).
    #[arg(long)]
    pub graph: PathBuf,
    /// Connected users, drawn from the file's users with --seed (default:
    /// every user in the file).
    #[arg(long)]
    pub users: Option<u64>,
    /// Connections each connected user holds; a send reaches all of them.
    #[arg(long, default_value_t = 1)]
    pub connections_per_user: u32,
    /// Sends per second, all users together, each through the sending
    /// user's own WebSocket connection.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// How each send's sender is drawn among the connected users.
    #[arg(long, value_enum, default_value_t = SenderChoice::Uniform)]
    pub sender: SenderChoice,
    /// Size of each send's data, bytes (timestamp inside, random padding).
    #[arg(long, default_value_t = 512)]
    pub size: usize,
    /// Follow and unfollow operations per second through the admin API
    /// while sending (needs --admin-url): follows of pairs of connected
    /// users that are not edges, and unfollows of edges, in turn.
    #[arg(long, default_value_t = 0.0)]
    pub follow_rate: f64,
    /// Load the graph file into the node through the admin API before
    /// connecting (needs --admin-url); for small graphs, where
    /// `myriad graph load` is not at hand.
    #[arg(long)]
    pub load_graph: bool,
    /// Cap on new connections per second while setting up (0: only the
    /// in-flight bound applies).
    #[arg(long, default_value_t = 0.0)]
    pub connect_rate: f64,
    /// How long to send.
    #[arg(long, default_value = "10s")]
    pub duration: Secs,
    /// After the last send is due, wait at most this long for every
    /// answer and delivery.
    #[arg(long, default_value = "5s")]
    pub drain: Secs,
}

/// A duration in seconds, written `2s`, `500ms`, `1.5m`, `1h` or `3` (seconds).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secs(pub f64);

impl FromStr for Secs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let value: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: expected a duration like 2s or 500ms"))?;
        let scale = match unit {
            "" | "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
        };
        if !(value * scale).is_finite() || value < 0.0 {
            return Err(format!("{s:?}: a duration must be finite and not negative"));
        }
        Ok(Secs(value * scale))
    }
}

fn parse_ws(s: &str) -> Result<Target, AddrError> {
    Target::parse(s, "ws")
}

fn parse_http(s: &str) -> Result<Target, AddrError> {
    Target::parse(s, "http")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(Subcommand)]
    enum Sub {
        Bench(BenchCommand),
    }

    fn parse(args: &[&str]) -> BenchCommand {
        let mut all = vec!["myriad", "bench"];
        all.extend_from_slice(args);
        match Top::try_parse_from(all).unwrap().cmd {
            Sub::Bench(b) => b,
        }
    }

    #[test]
    fn durations() {
        assert_eq!("2s".parse::<Secs>(), Ok(Secs(2.0)));
        assert_eq!("500ms".parse::<Secs>(), Ok(Secs(0.5)));
        assert_eq!("1.5m".parse::<Secs>(), Ok(Secs(90.0)));
        assert_eq!("3".parse::<Secs>(), Ok(Secs(3.0)));
        assert!("3x".parse::<Secs>().is_err());
        assert!("-1s".parse::<Secs>().is_err());
    }

    #[test]
    fn global_options_go_before_or_after_the_workload() {
        let b = parse(&[
            "--url",
            "ws://127.0.0.1:1/ws",
            "subscribers",
            "--connections",
            "5",
            "--duration",
            "2s",
        ]);
        assert_eq!(b.global.urls[0].addr.port(), 1);
        let Workload::Subscribers(s) = &b.workload else {
            panic!()
        };
        assert_eq!(s.subs.connections, 5);
        assert_eq!(s.subs.pattern().to_string(), "/p/s{1..5}");
        let b = parse(&[
            "connect-rate",
            "--rate",
            "50",
            "--url",
            "ws://127.0.0.1:2/ws",
            "--url",
            "ws://127.0.0.1:3/ws",
        ]);
        assert_eq!(b.global.urls.len(), 2);
        let b = parse(&[
            "--url",
            "ws://127.0.0.1:4/ws,ws://127.0.0.1:5/ws",
            "--admin-url",
            "http://127.0.0.1:6,http://127.0.0.1:7",
            "churn",
        ]);
        let ports = |t: &[Target]| t.iter().map(|t| t.addr.port()).collect::<Vec<_>>();
        assert_eq!(ports(&b.global.urls), [4, 5], "a list, comma-separated");
        assert_eq!(ports(&b.global.admin_urls), [6, 7]);
    }

    #[test]
    fn run_and_broadcast_parse() {
        let b = parse(&[
            "run",
            "--connections",
            "10",
            "--rate",
            "100",
            "--duration",
            "1s",
            "--json",
            "/tmp/x.json",
        ]);
        let Workload::Run(r) = &b.workload else {
            panic!()
        };
        assert_eq!(r.publish.rate, Some(100.0));
        assert!(b.global.json.is_some());
        let b = parse(&[
            "broadcast",
            "--subscribers",
            "3",
            "--count",
            "4",
            "--local-addrs",
            "127.0.0.1-127.0.0.3",
        ]);
        assert_eq!(b.global.local_addrs.unwrap().0.len(), 3);
    }

    #[test]
    fn subscribing_and_publishing_transports_are_named_apart() {
        let b = parse(&[
            "broadcast",
            "--subscribe-transport",
            "sse",
            "--publish-transport",
            "http",
        ]);
        let Workload::Broadcast(a) = &b.workload else {
            panic!()
        };
        assert_eq!(a.receive.transport, SubscribeTransport::Sse);
        assert_eq!(a.receive.http_path().as_deref(), Some("/sse"));
        assert_eq!(a.publish.transport, PublishTransport::Http);
        let b = parse(&[
            "churn",
            "--subscribe-transport",
            "poll",
            "--subscribe-path",
            "/lp",
            "--poll-timeout",
            "2s",
        ]);
        let Workload::Churn(c) = &b.workload else {
            panic!()
        };
        assert_eq!(c.subs.receive.http_path().as_deref(), Some("/lp"));
        assert_eq!(c.subs.receive.first_answer_secs(), 3.0);
        let b = parse(&["run"]);
        let Workload::Run(r) = &b.workload else {
            panic!()
        };
        assert_eq!(r.subs.receive.http_path(), None, "WebSocket by default");
        assert_eq!(r.subs.receive.first_answer_secs(), 0.0);
    }

    #[test]
    fn social_parses_with_its_graph() {
        let b = parse(&[
            "social",
            "--graph",
            "/tmp/g.txt",
            "--users",
            "300",
            "--rate",
            "500",
            "--sender",
            "degree",
            "--follow-rate",
            "50",
            "--load-graph",
        ]);
        let Workload::Social(s) = &b.workload else {
            panic!()
        };
        assert_eq!(s.graph, PathBuf::from("/tmp/g.txt"));
        assert_eq!((s.users, s.connections_per_user), (Some(300), 1));
        assert_eq!((s.rate, s.sender), (500.0, SenderChoice::Degree));
        assert_eq!((s.follow_rate, s.load_graph), (50.0, true));
        assert_eq!((s.duration, s.drain), (Secs(10.0), Secs(5.0)));
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["workload"]["workload"], "social");
    }

    #[test]
    fn churn_parses_with_counts_for_subjects() {
        let b = parse(&[
            "churn",
            "--subscribers",
            "10000",
            "--subjects",
            "1000",
            "--reconnect-rate",
            "2000",
            "--rate",
            "5000",
            "--duration",
            "60s",
            "--offline",
            "250ms",
        ]);
        let Workload::Churn(c) = &b.workload else {
            panic!()
        };
        assert_eq!(c.subs.connections, 10_000);
        assert_eq!(c.subs.pattern().to_string(), "/p/s{1..1000}");
        assert_eq!((c.reconnect_rate, c.offline), (2000.0, Secs(0.25)));
        assert_eq!(c.publish.rate, Some(5000.0));
        assert_eq!(c.close, CloseMode::Graceful);
    }
}
