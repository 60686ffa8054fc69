//! [`Sentinels`]: finding the master of a Redis Sentinel deployment by
//! asking its Sentinels (`SENTINEL get-master-addr-by-name`), for the
//! node's engine (which asks again whenever its connection to the master
//! fails, so it follows a failover by itself) and anyone else who reaches
//! Redis through Sentinel.
//!
//! It owns the asking and what the answers mean, nothing else: it does not
//! connect to the master, and it never keeps an answer, since a cached
//! master is exactly what a failover makes wrong.
//!
//! The master is given as a name, or in URL form for its credentials, TLS
//! and database: `redis[s]://[user:password@]NAME[/db]` (the host part is
//! the name the Sentinels know it by). Each Sentinel is a URL of its own,
//! `redis[s]://[user:password@]host:port`, with the Sentinel's credentials
//! and TLS; Sentinels are asked in the order given, starting from the one
//! that answered last (so a dead first Sentinel costs one timeout, not one
//! per connect), and the first that knows the master answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{
    Connection, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    RedisResult, TlsCertificates,
};
use thiserror::Error;

use super::client_for;

/// Why no master was found. The messages name the setting at fault, since
/// they end up in a failed start.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum SentinelError {
    #[error("redis_sentinel: none given")]
    NoSentinels,
    #[error("redis_sentinel {url:?}: {why} (expected redis[s]://[user:password@]host:port)")]
    BadSentinel { url: String, why: String },
    #[error(
        "redis_sentinel_master {given:?}: {why} (expected NAME or redis[s]://[user:password@]NAME[/db])"
    )]
    BadMaster { given: String, why: String },
    /// Every Sentinel failed: unreachable, wrong credentials, not a
    /// Sentinel. One reason per Sentinel, in the order asked.
    #[error("redis_sentinel: no Sentinel answered ({})", .0.join("; "))]
    NoAnswer(Vec<String>),
    /// A Sentinel answered and none knew the name.
    #[error("redis_sentinel_master: no Sentinel knows a master named {0:?}")]
    UnknownMaster(String),
}

/// The Sentinels of one master, and how to reach that master once found.
#[derive(Debug, Clone)]
pub struct Sentinels {
    sentinels: Vec<(String, ConnectionInfo)>,
    name: String,
    /// `redis://` or `rediss://`, the master's credentials (with their
    /// `@`), and its `/db`: the master's URL is these around its address.
    scheme: String,
    userinfo: String,
    db: String,
    tls: Option<TlsCertificates>,
    timeout: Duration,
    /// The Sentinel that answered last, asked first next time; shared by
    /// the clones.
    first: Arc<AtomicUsize>,
}

impl Sentinels {
    /// Checks the settings; asks nobody yet. `tls` serves every `rediss://`
    /// Sentinel and a `rediss://` master; `timeout` bounds connecting to
    /// each Sentinel and its answer.
    pub fn new(
        sentinels: &[String],
        master: &str,
        tls: Option<TlsCertificates>,
        timeout: Duration,
    ) -> Result<Sentinels, SentinelError> {
        if sentinels.is_empty() {
            return Err(SentinelError::NoSentinels);
        }
        let sentinels = sentinels
            .iter()
            .map(|url| {
                let bad = |why: String| SentinelError::BadSentinel {
                    url: without_password(url),
                    why,
                };
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(|e| bad(e.to_string()))?;
                if !matches!(
                    info.addr(),
                    ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }
                ) {
                    return Err(bad("a Sentinel is reached over TCP".into()));
                }
                Ok((without_password(url), info))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (scheme, userinfo, name, db) =
            split_master(master).map_err(|why| SentinelError::BadMaster {
                given: without_password(master),
                why,
            })?;
        Ok(Sentinels {
            sentinels,
            name,
            scheme,
            userinfo,
            db,
            tls,
            timeout,
            first: Arc::default(),
        })
    }

    /// The Sentinels' indexes in the order to ask them.
    fn order(&self) -> impl Iterator<Item = usize> {
        let n = self.sentinels.len();
        let first = self.first.load(Ordering::Relaxed) % n;
        (0..n).map(move |i| (first + i) % n)
    }

    /// A blocking connection to the master as the Sentinels name it now,
    /// within `timeout` to connect and for each answer.
    pub fn master_connection(&self, timeout: Duration) -> RedisResult<Connection> {
        let url = self
            .master_url_blocking()
            .map_err(|e| RedisError::from((ErrorKind::Io, "no Redis master", e.to_string())))?;
        let client = client_for(url.as_str().into_connection_info()?, self.tls.clone())?;
        let con = client.get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        Ok(con)
    }

    /// Each Sentinel's connection details, in the order asked, and the
    /// certificates for a `rediss://` one: for listening to their
    /// announcements.
    pub fn each(
        &self,
    ) -> (
        impl Iterator<Item = &ConnectionInfo>,
        Option<TlsCertificates>,
    ) {
        (
            self.sentinels.iter().map(|(_, info)| info),
            self.tls.clone(),
        )
    }

    /// The master's new `host:port` when `message`, a `+switch-master`
    /// announcement (`<name> <old ip> <old port> <new ip> <new port>`), is
    /// about this master.
    pub fn switched_to(&self, message: &str) -> Option<String> {
        match message.split(' ').collect::<Vec<_>>()[..] {
            [name, _, _, host, port] if name == self.name => Some(format!("{host}:{port}")),
            _ => None,
        }
    }

    /// The master's name, as the Sentinels know it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Asks the Sentinels, in order, where the master is now, and answers
    /// its URL (credentials, TLS and database as configured). Never blocks
    /// the thread: the engine's instance tasks share one.
    pub async fn master_url(&self) -> Result<String, SentinelError> {
        let mut failures = Vec::new();
        let mut unknown = false;
        for at in self.order() {
            let (shown, info) = &self.sentinels[at];
            match self.ask_async(info).await {
                Ok(Some((host, port))) => return Ok(self.answered(at, &host, port)),
                Ok(None) => unknown = true,
                Err(e) => failures.push(format!("{shown}: {e}")),
            }
        }
        Err(self.none_found(unknown, failures))
    }

    /// [`Sentinels::master_url`] for a caller on a thread of its own.
    pub fn master_url_blocking(&self) -> Result<String, SentinelError> {
        let mut failures = Vec::new();
        let mut unknown = false;
        for at in self.order() {
            let (shown, info) = &self.sentinels[at];
            match self.ask(info) {
                Ok(Some((host, port))) => return Ok(self.answered(at, &host, port)),
                Ok(None) => unknown = true,
                Err(e) => failures.push(format!("{shown}: {e}")),
            }
        }
        Err(self.none_found(unknown, failures))
    }

    /// Sentinel `at` named the master at `host:port`: its URL, and `at`
    /// is asked first next time.
    fn answered(&self, at: usize, host: &str, port: u16) -> String {
        self.first.store(at, Ordering::Relaxed);
        self.url_at(host, port)
    }

    fn none_found(&self, unknown: bool, failures: Vec<String>) -> SentinelError {
        if unknown {
            SentinelError::UnknownMaster(self.name.clone())
        } else {
            SentinelError::NoAnswer(failures)
        }
    }

    fn question(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&self.name);
        cmd
    }

    async fn ask_async(&self, info: &ConnectionInfo) -> Result<Option<(String, u16)>, RedisError> {
        let client = client_for(info.clone(), self.tls.clone())?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        self.question().query_async(&mut conn).await
    }

    fn ask(&self, info: &ConnectionInfo) -> Result<Option<(String, u16)>, RedisError> {
        let client = client_for(info.clone(), self.tls.clone())?;
        let mut conn = client.get_connection_with_timeout(self.timeout)?;
        conn.set_read_timeout(Some(self.timeout))?;
        conn.set_write_timeout(Some(self.timeout))?;
        self.question().query(&mut conn)
    }

    /// The master's URL once at `host:port`.
    fn url_at(&self, host: &str, port: u16) -> String {
        let host = if host.contains(':') {
            format!("[{host}]") // an IPv6 address
        } else {
            host.to_owned()
        };
        format!(
            "{}://{}{host}:{port}{}",
            self.scheme, self.userinfo, self.db
        )
    }
}

/// `NAME` or `redis[s]://[userinfo@]NAME[/db]` as scheme, userinfo (with
/// its `@`), name and `/db` (or nothing).
fn split_master(master: &str) -> Result<(String, String, String, String), String> {
    let (scheme, rest) = match master.split_once("://") {
        Some((scheme @ ("redis" | "rediss"), rest)) => (scheme, rest),
        Some((other, _)) => return Err(format!("unknown scheme {other:?}")),
        None => ("redis", master),
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (format!("{userinfo}@"), rest),
        None => (String::new(), rest),
    };
    let (name, db) = match rest.split_once('/') {
        Some((name, "")) => (name, String::new()),
        Some((name, db)) if db.parse::<u32>().is_ok() => (name, format!("/{db}")),
        Some((_, db)) => return Err(format!("database {db:?} is not a number")),
        None => (rest, String::new()),
    };
    if name.is_empty() || name.contains([':', ' ', '?', '#']) {
        return Err("a master name without ':', '?', '#' or spaces is needed".into());
    }
    Ok((scheme.into(), userinfo, name.into(), db))
}

/// `url` as it may be shown: a password in it replaced by `***`.
pub fn without_password(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split_once(':').map_or("", |(user, _)| user);
                format!("{scheme}://{user}:***@{host}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinels(master: &str) -> Result<Sentinels, SentinelError> {
        let urls = ["redis://127.0.0.1:26379".to_owned()];
        Sentinels::new(&urls, master, None, Duration::from_secs(1))
    }

    #[test]
    fn the_master_url_keeps_credentials_tls_and_database_around_the_address() {
        let plain = sentinels("mymaster").unwrap();
        assert_eq!(plain.name(), "mymaster");
        assert_eq!(plain.url_at("10.0.0.2", 6380), "redis://10.0.0.2:6380");
        let switch = "mymaster 10.0.0.1 6379 10.0.0.2 6380";
        assert_eq!(plain.switched_to(switch).as_deref(), Some("10.0.0.2:6380"));
        assert_eq!(plain.switched_to("other 10.0.0.1 6379 10.0.0.2 6380"), None);
        assert_eq!(plain.switched_to("mymaster"), None);
        let full = sentinels("rediss://app:secret@mymaster/3").unwrap();
        assert_eq!(full.name(), "mymaster");
        assert_eq!(full.url_at("::1", 6380), "rediss://app:secret@[::1]:6380/3");
    }

    #[test]
    fn bad_settings_are_refused_by_name_without_their_password() {
        let err = sentinels("redis://u:secret@my:master").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("redis_sentinel_master"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(sentinels("http://mymaster").is_err());
        assert!(sentinels("mymaster/x").is_err());
        let bad = Sentinels::new(
            &["redis://u:secret@/tmp/sock".to_owned()],
            "m",
            None,
            Duration::from_secs(1),
        );
        let text = bad.unwrap_err().to_string();
        assert!(text.starts_with("redis_sentinel "), "{text}");
        assert!(!text.contains("secret"), "{text}");
        let none = Sentinels::new(&[], "m", None, Duration::from_secs(1));
        assert_eq!(none.unwrap_err(), SentinelError::NoSentinels);
    }

    #[test]
    fn the_sentinels_name_the_master_and_refuse_a_name_they_do_not_know() {
        let setup = myriad_testkit::SentinelSetup::start("graph");
        // The first Sentinel is down: the next one answers.
        let mut urls = vec![format!("redis://127.0.0.1:{}", myriad_testkit::free_port())];
        urls.extend(setup.sentinel_urls());
        let timeout = Duration::from_secs(2);
        let s = Sentinels::new(&urls, "graph", None, timeout).unwrap();
        let master = format!("redis://127.0.0.1:{}", setup.master.port());
        assert_eq!(s.master_url_blocking().unwrap(), master);
        // The one that answered is asked first from now on.
        assert_eq!(s.order().collect::<Vec<_>>(), [1, 2, 3, 0]);
        let runtime = tokio_runtime();
        assert_eq!(runtime.block_on(s.master_url()).unwrap(), master);
        let unknown = Sentinels::new(&urls, "nobody", None, timeout).unwrap();
        assert_eq!(
            unknown.master_url_blocking().unwrap_err(),
            SentinelError::UnknownMaster("nobody".into())
        );
        // A Sentinel without a password refuses one given to it.
        let wrong = vec![format!(
            "redis://u:pw@127.0.0.1:{}",
            setup.sentinels[0].port()
        )];
        let refused = Sentinels::new(&wrong, "graph", None, timeout).unwrap();
        let text = refused.master_url_blocking().unwrap_err().to_string();
        assert!(
            text.starts_with("redis_sentinel: no Sentinel answered"),
            "{text}"
        );
        assert!(!text.contains("pw@"), "{text}");
    }

    fn tokio_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn unreachable_sentinels_are_each_named() {
        let port = myriad_testkit::free_port();
        let urls = [format!("redis://127.0.0.1:{port}")];
        let s = Sentinels::new(&urls, "m", None, Duration::from_secs(1)).unwrap();
        match s.master_url_blocking() {
            Err(SentinelError::NoAnswer(why)) => {
                assert_eq!(why.len(), 1);
                assert!(why[0].contains(&port.to_string()), "{why:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}
