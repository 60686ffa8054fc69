//! Test support shared by myriad's crates: it owns real `redis-server`
//! processes started on ephemeral loopback ports, so that the engine, the
//! graph store and the cluster tests all talk to the real thing the same
//! way (and no crate grows its own copy of this), and a lifecycle-hook
//! receiver ([`hook_receiver`]).
//!
//! Needs `redis-server` on `PATH` (scripts/install-test-deps.sh installs
//! Debian's). Every server is killed when its [`RedisServer`] is dropped.

pub mod hook_receiver;

use std::io::{BufRead, BufReader, Read, Write};
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
        // A bulk reply: read its body as the answer.
        if let Some(len) = line.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            return Ok(String::from_utf8_lossy(&body).into_owned());
        }
        Ok(line)
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
