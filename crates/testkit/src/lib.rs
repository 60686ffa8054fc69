//! Test support shared by myriad's crates: it owns real `redis-server`
//! processes started on ephemeral loopback ports, so that the engine, the
//! graph store and the cluster tests all talk to the real thing the same
//! way (and no crate grows its own copy of this), and a lifecycle-hook
//! receiver ([`hook_receiver`]).
//!
//! Besides lone servers, [`SentinelSetup`] starts the Sentinel shape: a
//! master, a replica of it and three Sentinels (`redis-server --sentinel`,
//! the program Debian's `redis-sentinel` package runs), for the engine's
//! and graph store's Sentinel tests and their failovers. [`ClusterSetup`]
//! starts a Redis Cluster: three masters and a replica of each, joined
//! with `redis-cli --cluster create` (Debian's redis-tools, which
//! redis-server depends on).
//!
//! Needs `redis-server` on `PATH` (scripts/install-test-deps.sh installs
//! Debian's). Every server is killed when its [`RedisServer`] is dropped.

pub mod hook_receiver;
pub mod proxy_backend;

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting server may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// One `redis-server` on 127.0.0.1, with its own data directory.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    persistent: bool,
    dir: tempfile::TempDir,
    /// The TLS port beside the plain one (which the helpers here keep
    /// using), and its files.
    tls: Option<(u16, TlsFiles)>,
    /// What the process is besides a plain server.
    role: Role,
}

/// A server's part in a Sentinel setup.
#[derive(Clone, Debug)]
enum Role {
    Alone,
    /// A replica of the master on this port.
    ReplicaOf(u16),
    /// A Sentinel watching the master `name` on `port` (quorum 2, down after
    /// one second without an answer).
    Sentinel {
        name: String,
        master: u16,
    },
    /// A node of a Redis Cluster, its cluster bus on `bus` (ephemeral
    /// ports run past 55535, so the default bus port, port + 10000,
    /// may not exist).
    ClusterNode {
        bus: u16,
    },
}

/// A TLS port's PEM files: the server's certificate and key, and the
/// authorities a client's certificate must come from.
#[derive(Clone, Debug)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

impl RedisServer {
    /// A server that keeps nothing on disk: a restart loses every key.
    pub fn start() -> RedisServer {
        RedisServer::launch(false)
    }

    /// A Redis Cluster of this one node, serving all 16384 slots: it
    /// answers every command itself (no `-MOVED`), yet checks what a
    /// cluster checks, such as a script touching keys of one slot only.
    pub fn start_single_node_cluster() -> RedisServer {
        let server = RedisServer::launch_as(false, None, Role::ClusterNode { bus: free_port() });
        server
            .command(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
            .expect("CLUSTER ADDSLOTSRANGE");
        wait_for("the one-node cluster to serve its slots", || {
            server
                .command(&["CLUSTER", "INFO"])
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        });
        server
    }

    /// A server with an append-only file fsynced on every write, so a
    /// restart (even after `kill -9`) keeps what it acknowledged.
    pub fn start_persistent() -> RedisServer {
        RedisServer::launch(true)
    }

    /// A server that also speaks TLS on a port of its own, with `cert` and
    /// `key`, to clients showing a certificate `client_ca` vouches for
    /// (`tls-auth-clients yes`). [`RedisServer::tls_url`] is its
    /// `rediss://` URL.
    pub fn start_tls(cert: &Path, key: &Path, client_ca: &Path) -> RedisServer {
        let tls = TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: client_ca.to_owned(),
        };
        RedisServer::launch_with(false, Some(tls))
    }

    fn launch(persistent: bool) -> RedisServer {
        RedisServer::launch_with(persistent, None)
    }

    fn launch_with(persistent: bool, tls: Option<TlsFiles>) -> RedisServer {
        RedisServer::launch_as(persistent, tls, Role::Alone)
    }

    fn launch_as(persistent: bool, tls: Option<TlsFiles>, role: Role) -> RedisServer {
        let mut dir = tempfile::tempdir().expect("a data directory");
        // The port is picked by binding port 0 and released before the
        // server binds it; another process could take it in between, so
        // a server that fails to start is tried again on a new port.
        for _attempt in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                child: None,
                port,
                persistent,
                dir,
                tls: tls.clone().map(|files| (free_port(), files)),
                role: role.clone(),
            };
            if server.spawn() {
                return server;
            }
            dir = server.take_dir();
        }
        panic!("redis-server did not start on any of 5 ports");
    }

    /// Moves the data directory out of a server that failed to start.
    fn take_dir(mut self) -> tempfile::TempDir {
        self.kill();
        let placeholder = tempfile::tempdir().expect("a data directory");
        std::mem::replace(&mut self.dir, placeholder)
    }

    /// Starts the process on `self.port`; false when it did not come up.
    fn spawn(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        if let Role::Sentinel { name, master } = &self.role {
            // A Sentinel rewrites its configuration file as it learns, so
            // it needs one of its own, in its directory.
            let conf = self.dir.path().join("sentinel.conf");
            let text = format!(
                "sentinel monitor {name} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n"
            );
            std::fs::write(&conf, text).expect("a Sentinel's configuration file");
            command.arg(&conf).arg("--sentinel");
        }
        if let Role::ClusterNode { bus } = &self.role {
            // The node writes what it learns of the cluster to this file,
            // in its own directory.
            command
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-port", &bus.to_string()])
                .args(["--cluster-node-timeout", "2000"]);
        }
        if let Role::ReplicaOf(master) = &self.role {
            command.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        command
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--protected-mode", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.persistent {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        if let Some((port, files)) = &self.tls {
            command
                .args(["--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(&files.cert)
                .arg("--tls-key-file")
                .arg(&files.key)
                .arg("--tls-ca-cert-file")
                .arg(&files.client_ca)
                .args(["--tls-auth-clients", "yes"]);
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                panic!("cannot run redis-server ({e}); scripts/install-test-deps.sh installs it")
            }
        };
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    self.child = None;
                    return false; // exited: most likely the port was taken
                }
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<tls port>`, for a server started with
    /// [`RedisServer::start_tls`].
    pub fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("a server started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the server answers `PING` now.
    pub fn ping(&self) -> bool {
        matches!(self.command(&["PING"]), Ok(reply) if reply == "+PONG")
    }

    /// Sends one command (inline, arguments without spaces) and returns the
    /// first line of its reply.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut request = Vec::new();
        write!(request, "*{}\r\n", args.len())?;
        for arg in args {
            write!(request, "${}\r\n{arg}\r\n", arg.len())?;
        }
        stream.write_all(&request)?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end().to_owned();
        // An array of bulk strings: its items, one a line.
        if let Some(n) = line.strip_prefix('*').and_then(|n| n.parse::<usize>().ok()) {
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                let mut head = String::new();
                reader.read_line(&mut head)?;
                items.push(read_bulk(&mut reader, head.trim_end())?.unwrap_or(head));
            }
            return Ok(items.join("\n"));
        }
        Ok(read_bulk(&mut reader, &line)?.unwrap_or(line))
    }

    /// Kills the process (`SIGKILL`) and waits for it; the port stays
    /// this server's for [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data directory (a
    /// persistent server comes back with what it had acknowledged).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_WITHIN;
        // The old socket may linger in the kernel for a moment.
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the process answering without killing it (`SIGSTOP`): a
    /// stalled Redis. [`RedisServer::resume`] lets it go on.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Sends `signal` (as `kill(1)` names it) to the process.
    fn signal(&self, signal: &str) {
        if let Some(child) = self.child.as_ref() {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success(), "kill {signal} failed");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// The body of a bulk reply whose first line is `head`; `None` for any
/// other reply.
fn read_bulk(reader: &mut impl BufRead, head: &str) -> std::io::Result<Option<String>> {
    let Some(len) = head.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) else {
        return Ok(None);
    };
    let mut body = vec![0; len + 2];
    reader.read_exact(&mut body)?;
    body.truncate(len);
    Ok(Some(String::from_utf8_lossy(&body).into_owned()))
}

/// The Sentinel shape on loopback: a master, one replica of it, and three
/// Sentinels watching it under one name, quorum 2, a master down after one
/// second without answering. [`SentinelSetup::start`] returns once the
/// replica has synced and every Sentinel knows the replica and the other
/// two, so a failover can happen from then on.
pub struct SentinelSetup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
    name: String,
}

impl SentinelSetup {
    /// How long the setup may take to settle, and a failover to finish.
    const SETTLE_WITHIN: Duration = Duration::from_secs(60);

    pub fn start(name: &str) -> SentinelSetup {
        let master = RedisServer::start();
        let replica = RedisServer::launch_as(false, None, Role::ReplicaOf(master.port()));
        wait_for("the replica to sync", || {
            replica
                .command(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        let role = Role::Sentinel {
            name: name.to_owned(),
            master: master.port(),
        };
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::launch_as(false, None, role.clone()))
            .collect();
        // `SENTINEL master` answers field, value, field, value, ...
        let field = |s: &RedisServer, wanted: &str| -> Option<String> {
            let reply = s.command(&["SENTINEL", "master", name]).ok()?;
            let lines: Vec<&str> = reply.lines().collect();
            let at = lines.iter().position(|l| *l == wanted)?;
            lines.get(at + 1).map(|v| (*v).to_owned())
        };
        wait_for("the Sentinels to know each other and the replica", || {
            sentinels.iter().all(|s| {
                field(s, "num-other-sentinels").as_deref() == Some("2")
                    && field(s, "num-slaves").as_deref() == Some("1")
            })
        });
        SentinelSetup {
            master,
            replica,
            sentinels,
            name: name.to_owned(),
        }
    }

    /// One setup shared by every caller that holds it at the time, for
    /// suites of many small tests that need no failover of their own;
    /// stopped when the last holder lets go (a static would outlive the
    /// test process), started again by the next caller. Its master is
    /// named "shared".
    pub fn shared() -> std::sync::Arc<SentinelSetup> {
        use std::sync::{Arc, Mutex, Weak};
        static SHARED: Mutex<Weak<SentinelSetup>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(setup) = shared.upgrade() {
            return setup;
        }
        let setup = Arc::new(SentinelSetup::start("shared"));
        *shared = Arc::downgrade(&setup);
        setup
    }

    /// The name the Sentinels know the master by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `redis://127.0.0.1:<port>` of each Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port of the master as the first Sentinel answers it now.
    pub fn master_port(&self) -> Option<u16> {
        let reply = self.sentinels[0]
            .command(&["SENTINEL", "get-master-addr-by-name", &self.name])
            .ok()?;
        reply.lines().nth(1)?.parse().ok()
    }

    /// Waits until every Sentinel names a master other than the one on
    /// `port`, and answers the new master's port.
    pub fn wait_for_failover_from(&self, port: u16) -> u16 {
        wait_for("the Sentinels to fail over", || {
            self.sentinels.iter().all(|s| {
                s.command(&["SENTINEL", "get-master-addr-by-name", &self.name])
                    .is_ok_and(|reply| reply.lines().nth(1) != Some(&port.to_string()))
            })
        });
        self.master_port().expect("a new master")
    }
}

/// A Redis Cluster on loopback: three masters, each with one replica,
/// every slot covered. [`ClusterSetup::start`] returns once every node
/// says `cluster_state:ok` and knows all six, and each replica has synced.
/// Every process is killed when the setup is dropped.
pub struct ClusterSetup {
    pub nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`, the parts the tests read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    /// The id of the master it replicates; `None` for a master.
    pub master: Option<String>,
    /// The slot ranges it serves, inclusive (a master's; empty for a
    /// replica).
    pub slots: Vec<(u16, u16)>,
}

impl ClusterSetup {
    /// Masters, and a replica for each.
    const MASTERS: usize = 3;

    pub fn start() -> ClusterSetup {
        let nodes: Vec<RedisServer> = (0..2 * ClusterSetup::MASTERS)
            .map(|_| RedisServer::launch_as(false, None, Role::ClusterNode { bus: free_port() }))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-cli ({e}); scripts/install-test-deps.sh installs it")
            });
        let setup = ClusterSetup { nodes };
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        wait_for("the cluster to agree and the replicas to sync", || {
            setup.nodes.iter().all(|n| {
                n.command(&["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6")
                }) && n.command(&["INFO", "replication"]).is_ok_and(|info| {
                    info.contains("role:master") || info.contains("master_link_status:up")
                })
            })
        });
        setup
    }

    /// `redis://127.0.0.1:<port>` of every node, masters and replicas.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The cluster as the node on `port` sees it now.
    pub fn topology(&self, port: u16) -> Vec<ClusterNode> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port() == port)
            .expect("a node of this setup");
        let text = node.command(&["CLUSTER", "NODES"]).expect("CLUSTER NODES");
        text.lines().filter_map(parse_cluster_node).collect()
    }

    /// The node of this setup on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .expect("a node of this setup")
    }
}

/// A `CLUSTER NODES` line: `id ip:port@bus flags master-id ping pong epoch
/// link slot...`, where a slot is `N`, `N-M`, or a migration in brackets
/// (not served yet, so skipped).
fn parse_cluster_node(line: &str) -> Option<ClusterNode> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (id, address, master) = (fields.first()?, fields.get(1)?, fields.get(3)?);
    let port = address
        .split('@')
        .next()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    let slots = fields
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((from, to)) => Some((from.parse().ok()?, to.parse().ok()?)),
            None => s.parse().ok().map(|n| (n, n)),
        })
        .collect();
    Some(ClusterNode {
        id: (*id).to_owned(),
        port,
        master: (*master != "-").then(|| (*master).to_owned()),
        slots,
    })
}

/// Polls `done` every 50 ms, up to [`SentinelSetup::SETTLE_WITHIN`]
/// (which bounds a cluster's settling too).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + SentinelSetup::SETTLE_WITHIN;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_setup_fails_over_to_its_replica_when_the_master_dies() {
        let mut setup = SentinelSetup::start("kit");
        let old = setup.master.port();
        assert_eq!(setup.master_port(), Some(old));
        assert_eq!(setup.master.command(&["SET", "k", "v"]).unwrap(), "+OK");
        assert_eq!(setup.master.command(&["WAIT", "1", "5000"]).unwrap(), ":1");
        setup.master.kill();
        let new = setup.wait_for_failover_from(old);
        assert_eq!(new, setup.replica.port());
        assert_eq!(setup.replica.command(&["GET", "k"]).unwrap(), "v");
    }

    #[test]
    fn a_cluster_setup_serves_every_slot_from_three_replicated_masters_and_leaves_nothing_running()
    {
        let setup = ClusterSetup::start();
        let first = setup.nodes[0].port();
        let nodes = setup.topology(first);
        assert_eq!(nodes.len(), 6);
        let masters: Vec<&ClusterNode> = nodes.iter().filter(|n| n.master.is_none()).collect();
        assert_eq!(masters.len(), 3);
        for master in &masters {
            let replicas = nodes
                .iter()
                .filter(|n| n.master.as_deref() == Some(master.id.as_str()))
                .count();
            assert_eq!(replicas, 1, "one replica of {}", master.port);
        }
        // Every slot served once: the ranges, in order, run 0..=16383
        // without a gap or an overlap.
        let mut ranges: Vec<(u16, u16)> = masters.iter().flat_map(|m| m.slots.clone()).collect();
        ranges.sort();
        let mut next = 0;
        for (from, to) in ranges {
            assert_eq!(from, next, "slots from {next} on");
            next = to + 1;
        }
        assert_eq!(next, 16384);

        // A hash tag puts a subject's keys and its channel in one slot.
        let slot = |key: &str| {
            setup.nodes[0]
                .command(&["CLUSTER", "KEYSLOT", key])
                .unwrap()
        };
        assert_eq!(slot("p:s:{news}"), slot("p:c:{news}"));
        let number: u16 = slot("p:s:{news}")[1..].parse().unwrap();
        let owner = masters
            .iter()
            .find(|m| m.slots.iter().any(|&(a, b)| (a..=b).contains(&number)))
            .expect("an owner");
        let other = masters.iter().find(|m| m.id != owner.id).unwrap();
        assert_eq!(
            setup
                .node(owner.port)
                .command(&["SET", "p:s:{news}", "v"])
                .unwrap(),
            "+OK"
        );
        assert_eq!(
            setup
                .node(other.port)
                .command(&["SET", "p:s:{news}", "v"])
                .unwrap(),
            format!("-MOVED {number} 127.0.0.1:{}", owner.port)
        );
        // Sharded pub/sub: published where the slot lives, refused elsewhere.
        assert_eq!(
            setup
                .node(owner.port)
                .command(&["SPUBLISH", "p:c:{news}", "x"])
                .unwrap(),
            ":0"
        );
        assert!(setup
            .node(other.port)
            .command(&["SPUBLISH", "p:c:{news}", "x"])
            .unwrap()
            .starts_with("-MOVED "));

        let ports: Vec<u16> = setup.nodes.iter().map(RedisServer::port).collect();
        drop(setup);
        for port in ports {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            assert!(
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
                "a node still answers on {port}"
            );
        }
    }

    #[test]
    fn cluster_nodes_lines_are_read_with_their_slots_and_masters() {
        let master =
            "07c3 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-e7d1]";
        assert_eq!(
            parse_cluster_node(master),
            Some(ClusterNode {
                id: "07c3".into(),
                port: 30001,
                master: None,
                slots: vec![(0, 5460), (7000, 7000)],
            })
        );
        let replica = "e7d1 127.0.0.1:30004@40004 slave 07c3 0 1426238317239 4 connected";
        assert_eq!(
            parse_cluster_node(replica),
            Some(ClusterNode {
                id: "e7d1".into(),
                port: 30004,
                master: Some("07c3".into()),
                slots: vec![],
            })
        );
        assert_eq!(parse_cluster_node(""), None);
    }

    #[test]
    fn a_server_starts_answers_and_loses_its_keys_on_restart_unless_persistent() {
        let mut plain = RedisServer::start();
        assert_eq!(plain.command(&["SET", "k", "v"]).unwrap(), "+OK");
        assert_eq!(plain.command(&["GET", "k"]).unwrap(), "v");
        plain.restart();
        assert_eq!(plain.command(&["GET", "k"]).unwrap(), "$-1");

        let mut kept = RedisServer::start_persistent();
        assert_eq!(kept.command(&["SET", "k", "v"]).unwrap(), "+OK");
        kept.restart();
        assert_eq!(kept.command(&["GET", "k"]).unwrap(), "v");
        assert_ne!(plain.port(), kept.port());
    }
}
