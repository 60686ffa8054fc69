//! Test support shared by myriad's crates: it owns real `redis-server`
//! processes started on ephemeral loopback ports, so that the engine, the
//! graph store and the cluster tests all talk to the real thing the same
//! way (and no crate grows its own copy of this).
//!
//! Besides lone servers, [`SentinelSetup`] starts the Sentinel shape: a
//! master, a replica of it and three Sentinels (`redis-server --sentinel`,
//! the program Debian's `redis-sentinel` package runs), for the engine's
//! and graph store's Sentinel tests and their failovers.
//!
//! Needs `redis-server` on `PATH` (scripts/install-test-deps.sh installs
//! Debian's). Every server is killed when its [`RedisServer`] is dropped.

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

/// Polls `done` every 50 ms, up to [`SentinelSetup::SETTLE_WITHIN`].
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
