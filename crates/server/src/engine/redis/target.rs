//! [`Target`]: where one of the engine's Redis instances is: a fixed URL
//! (`redis_url`), or the master the Sentinels name (`redis_sentinel`),
//! asked again at every connect so that a reconnect after a failover finds
//! the new master. Also what a connect must check of a Sentinel's master
//! ([`Master`]): that it is a master, and its replication id, which the
//! scripts compare with the one each stream was written under (lib.lua,
//! "failover").
//!
//! Behind Sentinels it also listens to their `+switch-master`
//! announcements ([`watch`]): a master cut off without its connection
//! closing (a partition, a stopped process) would otherwise hold the
//! instance until `redis_timeout`, or for ever on a connection with
//! nothing to send.
//!
//! A leaf below the instance task: it names no engine type but the
//! settings it is built from.

use myriad_graph::redis_store::sentinel::{without_password, SentinelError, Sentinels};
use redis::aio::MultiplexedConnection;
use redis::TlsCertificates;
use thiserror::Error;

/// Why an instance could not be connected to.
#[derive(Debug, Error)]
pub enum ConnectError {
    #[error(transparent)]
    Sentinel(#[from] SentinelError),
    /// `at` is the URL without its password.
    #[error("cannot reach Redis at {at}: {source}")]
    Redis {
        at: String,
        source: redis::RedisError,
    },
    #[error(
        "redis_sentinel_master: the Sentinels named {at} as the master of {name:?}, \
         and it is not one (a failover in progress?)"
    )]
    NotMaster { name: String, at: String },
}

/// Where an instance is.
pub enum Target {
    Fixed {
        client: redis::Client,
        /// The URL as it may be shown.
        shown: String,
    },
    Sentinel {
        sentinels: Sentinels,
        tls: Option<TlsCertificates>,
    },
}

/// What a connect found of the Redis it reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// The URL, without its password.
    pub at: String,
    /// `host:port`, as a `+switch-master` announcement names it.
    pub addr: String,
    /// Its `master_replid` behind a Sentinel, `""` for a fixed URL (whose
    /// streams are never compared: see lib.lua).
    pub replid: String,
}

impl Target {
    /// A client for where the instance is now, that place as shown, and
    /// its `host:port`.
    pub async fn client(&self) -> Result<(redis::Client, String, String), ConnectError> {
        match self {
            Target::Fixed { client, shown } => {
                let addr = address(client.get_connection_info().addr());
                Ok((client.clone(), shown.clone(), addr))
            }
            Target::Sentinel { sentinels, tls } => {
                let url = sentinels.master_url().await?;
                let shown = format!(
                    "{} (the master redis_sentinel_master names, {:?})",
                    without_password(&url),
                    sentinels.name()
                );
                let client = client(&url, tls.clone()).map_err(|source| ConnectError::Redis {
                    at: shown.clone(),
                    source,
                })?;
                let addr = address(client.get_connection_info().addr());
                Ok((client, shown, addr))
            }
        }
    }

    /// Behind Sentinels: starts [`watch`] on the current `LocalSet`, and
    /// answers where it sends the new masters' `host:port`.
    pub fn watch_switches(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        let Target::Sentinel { sentinels, .. } = self else {
            return None;
        };
        let (switched, switches) = tokio::sync::mpsc::unbounded_channel();
        tokio::task::spawn_local(watch(sentinels.clone(), switched));
        Some(switches)
    }

    /// Checks what `conn` reached: behind Sentinels it must be the master
    /// (a Sentinel may still name the old one for a moment).
    pub async fn check(
        &self,
        conn: &mut MultiplexedConnection,
        at: String,
        addr: String,
    ) -> Result<Master, ConnectError> {
        let Target::Sentinel { sentinels, .. } = self else {
            return Ok(Master {
                at,
                addr,
                replid: String::new(),
            });
        };
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(conn)
            .await
            .map_err(|source| ConnectError::Redis {
                at: at.clone(),
                source,
            })?;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        match (field("role"), field("master_replid")) {
            (Some("master"), Some(replid)) => Ok(Master {
                at,
                addr,
                replid: replid.to_owned(),
            }),
            _ => Err(ConnectError::NotMaster {
                name: sentinels.name().to_owned(),
                at,
            }),
        }
    }
}

/// A client for `url`, speaking RESP3 (channel messages and replies on one
/// connection), over TLS for a `rediss://` URL.
pub fn client(url: &str, tls: Option<TlsCertificates>) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info()?;
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    myriad_graph::redis_store::client_for(info.set_redis_settings(redis), tls)
}

/// `host:port` of a TCP address (empty for another kind).
fn address(addr: &redis::ConnectionAddr) -> String {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        _ => String::new(),
    }
}

/// How long the watch waits before asking the Sentinels again once none
/// would take its subscription.
const WATCH_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Listens, for as long as it runs, to the first Sentinel that takes the
/// subscription (the next on failure) for `+switch-master` announcements
/// of `sentinels`' master, and sends each new master's `host:port` to
/// `switched`. Ends when `switched` is closed.
pub async fn watch(sentinels: Sentinels, switched: tokio::sync::mpsc::UnboundedSender<String>) {
    loop {
        let (each, tls) = sentinels.each();
        for info in each.cloned().collect::<Vec<_>>() {
            let (pushes, mut heard) = tokio::sync::mpsc::unbounded_channel();
            let config = redis::AsyncConnectionConfig::new().set_push_sender(pushes);
            let resp3 = info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3);
            let info = info.set_redis_settings(resp3);
            let Ok(client) = myriad_graph::redis_store::client_for(info, tls.clone()) else {
                continue;
            };
            let Ok(mut conn) = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            else {
                continue;
            };
            if conn.subscribe("+switch-master").await.is_err() {
                continue;
            }
            while let Some(push) = heard.recv().await {
                match (push.kind, &push.data[..]) {
                    (redis::PushKind::Message, [_, redis::Value::BulkString(payload)]) => {
                        let message = String::from_utf8_lossy(payload);
                        if let Some(addr) = sentinels.switched_to(&message) {
                            if switched.send(addr).is_err() {
                                return;
                            }
                        }
                    }
                    (redis::PushKind::Disconnection, _) => break,
                    _ => {}
                }
            }
        }
        if switched.is_closed() {
            return;
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}
