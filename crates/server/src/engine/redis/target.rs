//! [`Target`]: where one of the engine's Redis instances is: a fixed URL
//! (`redis_url`), or the master the Sentinels name (`redis_sentinel`),
//! asked again at every connect so that a reconnect after a failover finds
//! the new master. Also what a connect must check of a Sentinel's master
//! ([`Master`]): that it is a master, and its replication id, which the
//! scripts compare with the one each stream was written under (lib.lua,
//! "failover").
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
    /// Its `master_replid` behind a Sentinel, `""` for a fixed URL (whose
    /// streams are never compared: see lib.lua).
    pub replid: String,
}

impl Target {
    /// A client for where the instance is now, and that place as shown.
    pub async fn client(&self) -> Result<(redis::Client, String), ConnectError> {
        match self {
            Target::Fixed { client, shown } => Ok((client.clone(), shown.clone())),
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
                Ok((client, shown))
            }
        }
    }

    /// Checks what `conn` reached: behind Sentinels it must be the master
    /// (a Sentinel may still name the old one for a moment).
    pub async fn check(
        &self,
        conn: &mut MultiplexedConnection,
        at: String,
    ) -> Result<Master, ConnectError> {
        let Target::Sentinel { sentinels, .. } = self else {
            return Ok(Master {
                at,
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
