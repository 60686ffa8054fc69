//! [`RedisStore`]: the follow graph in one Redis 7, shared by every node of
//! a cluster, behind the same [`Store`] contract as SQLite and checked by
//! the same conformance suite.
//!
//! # Keys
//! Every key is under the store's prefix `P`, so several clusters (or
//! tests) can share one Redis, each under its own prefix:
//! - `P users`: the known users (clause 1), a sorted set;
//! - `P followers:X` and `P following:X`: who follows user X and whom X
//!   follows, sorted sets; empty ones do not exist;
//! - `P edges`: how many edges there are, kept by the scripts;
//! - `P bulk:lock`, `P bulk:journal`, `P bulk:N`: a bulk change in flight
//!   (`bulk.rs`);
//! - `P changes:last`: the number of the last change (clause 6), and the
//!   channel `P changes` every write script announces its change on, in
//!   the script (`listen.rs` hears them). A bulk change is announced once,
//!   by the step that applies its last part, as a reread.
//!
//! In every sorted set the member is the user id in decimal and the score
//! is the id itself: ids stay below 2^53, which a double holds exactly, so
//! `ZRANGE key (after +inf BYSCORE LIMIT 0 limit` reads a page in ascending
//! id order in O(log n + limit) (clause 4). Members of equal score 0 read
//! with `BYLEX` would need fixed-width ids to sort, bytes that the compact
//! encoding of small sets (a listpack, which stores an integer-looking
//! member as an integer) does not spend here.
//!
//! # Batches (clause 2)
//! A batch of at most [`CHUNK`] users and edges is one Lua script
//! (`scripts`). Redis runs nothing else while a script runs, and the
//! script decides clause 3's following limit, which depends on what the
//! store holds, before its first write, so a refused batch writes nothing.
//! The self-follow refusal depends on the batch alone and is decided before
//! anything is sent (`refuse_self_follows`, the same rule SQLite uses).
//! The node's batches are bounded by its admin API's body limit, so one
//! script is a few milliseconds of Redis's time.
//!
//! A larger batch, and any `load` past [`CHUNK`] (the 1 M-user graph has
//! 15 M edges: one script for it would hold Redis for most of a minute,
//! answering nobody), is a **bulk change**: still all or nothing, as the
//! contract asks of `load` too, through a journal in Redis that a crashed
//! client's successor finishes or discards. `bulk.rs` has the protocol.
//!
//! # Durability (clause 5)
//! An acknowledged batch survives `kill -9` only if Redis keeps it: run
//! Redis with `appendonly yes` and `appendfsync always`, which writes and
//! syncs every script's effects to the append-only file before answering
//! (Redis writes a script's effects as one `MULTI`/`EXEC` block and drops
//! a torn block when it loads the file, so a batch is never half there).
//! With `appendfsync everysec` an acknowledged batch survives a `kill -9`
//! of Redis in the common case (the write reached the kernel before the
//! answer) but the last second or two can be lost to a power loss, an OS
//! crash, or, while a slow disk makes Redis postpone its writes, a
//! `kill -9`. Without the append-only file a restart loses everything
//! since the last snapshot. Redis's own setting decides this; the store
//! cannot see it. The same Redis must keep `maxmemory-policy noeviction`
//! (its default): any other policy may drop graph keys, or the bulk lock,
//! without a word. Out of memory, Redis refuses a script before it runs
//! (`Backend`), so a batch is still whole or absent.
//! [`StoreOptions::cache_bytes`] does not apply: Redis holds the whole
//! graph in its own memory.
//!
//! # One Redis, not several instances
//! The store keeps the whole graph on one Redis, and [`RedisStore::open`]
//! refuses more than one URL. Spreading users over several Redis by a hash
//! of their id would put a follow edge's two lists on two instances, and a
//! batch on many: a script is atomic on its own Redis only, so clause 2
//! would need a two-phase commit across instances with the recovery of a
//! coordinator's death, and clause 3 a lock held across them. The graph
//! does not need the capacity: seed 004's 1 M users and 15 M edges take
//! 888 MiB of Redis's RSS (docs/benchmarks.md), and a node reads
//! the graph only when a user connects or changes a follow; sends never
//! touch it. Subjects, which do need the capacity, are spread over
//! instances by the engine.
//!
//! # Failures
//! Every Redis failure is a [`StoreError`], never a panic or a hang:
//! connecting past [`RedisTimeouts::connect`] or refused is `Unreachable`
//! (nothing sent); no answer within [`RedisTimeouts::response`], or a
//! connection broken while waiting, is `NoAnswer` (a batch it carried is
//! wholly applied or wholly not: sending it again is safe); an error reply
//! is `Backend`. After a failure on the connection it is dropped (a late
//! answer would otherwise be read as the next call's) and opened again on
//! the next call; a read that fails on a connection closed while idle (a
//! Redis restart) is sent again once on a new one.

mod bulk;
mod listen;
mod scripts;
pub mod sentinel;

pub use listen::{ChangeStream, Heard};

use std::thread;
use std::time::{Duration, Instant};

use redis::{
    Connection, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    RedisResult, Script, ScriptInvocation, TlsCertificates, Value,
};

use self::scripts::{count, Reply};
use crate::announce::Snapshot;
use crate::store::{refuse_self_follows, Counts, Store, StoreError, StoreOptions, Totals};
use crate::user::{Edge, UserId};

/// Users or edges per script: a batch up to this size is one script, a
/// larger one a bulk change in parts of this size. The 1 M-user load is
/// about 6,200 steps, each a few milliseconds of Redis's time (the whole
/// load's figures are in docs/benchmarks.md); other clients are answered
/// between them.
pub const CHUNK: usize = 10_000;

/// How long the store waits for Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTimeouts {
    /// Opening a connection.
    pub connect: Duration,
    /// One answer; also how long a write waits for another client's bulk
    /// change to end before it gives up with [`StoreError::Busy`].
    pub response: Duration,
    /// How long a bulk change may go without a step before another client
    /// may take it over (finish it if committed, discard it if not).
    pub lease: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        RedisTimeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(5),
            lease: Duration::from_secs(30),
        }
    }
}

/// The follow graph in Redis; see the module docs.
pub struct RedisStore {
    link: Link,
    /// Every key starts with it.
    prefix: String,
    options: StoreOptions,
    timeouts: RedisTimeouts,
    /// [`CHUNK`], smaller in tests so that small batches take the bulk path.
    chunk: usize,
    /// The change number of this client's last write (clause 6).
    written: Option<u64>,
}

/// What a batch changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Changed {
    /// Edges added (or removed, for unfollows).
    edges: u64,
    users: u64,
    /// The change's number, which its announcement carries.
    change: u64,
}

/// Where the store's Redis is: one URL, or the master a deployment's
/// Sentinels name, asked again for every new connection (so a store
/// follows a failover once its connection fails).
#[derive(Clone)]
pub enum Reach {
    Client(redis::Client),
    Sentinels(sentinel::Sentinels),
}

impl Reach {
    /// A connection with `timeouts`' connect and response bounds.
    fn connect(&self, timeouts: RedisTimeouts) -> RedisResult<Connection> {
        let con = match self {
            Reach::Client(client) => client.get_connection_with_timeout(timeouts.connect)?,
            Reach::Sentinels(sentinels) => sentinels.master_connection(timeouts.connect)?,
        };
        con.set_read_timeout(Some(timeouts.response))?;
        con.set_write_timeout(Some(timeouts.response))?;
        Ok(con)
    }
}

/// The one connection to Redis, opened when needed.
struct Link {
    reach: Reach,
    con: Option<Connection>,
    connect: Duration,
    response: Duration,
}

impl Link {
    fn connection(&mut self) -> Result<&mut Connection, StoreError> {
        let con = match self.con.take() {
            Some(con) => con,
            None => {
                let unreachable = |e: RedisError| StoreError::Unreachable(e.to_string());
                let timeouts = RedisTimeouts {
                    connect: self.connect,
                    response: self.response,
                    ..RedisTimeouts::default()
                };
                self.reach.connect(timeouts).map_err(unreachable)?
            }
        };
        Ok(self.con.insert(con))
    }

    /// Runs `call` once.
    fn run<T>(
        &mut self,
        call: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, StoreError> {
        let answer = call(self.connection()?);
        answer.map_err(|e| self.failed(e))
    }

    /// Runs a read, again once on a new connection when the one it was
    /// sent on had been closed while idle.
    fn read<T>(
        &mut self,
        call: impl Fn(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, StoreError> {
        let reused = self.con.is_some();
        match call(self.connection()?) {
            Ok(answer) => Ok(answer),
            Err(e) if reused && e.is_connection_dropped() => {
                self.con = None;
                self.run(call)
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    fn failed(&mut self, e: RedisError) -> StoreError {
        if e.is_io_error() || e.kind() == ErrorKind::Parse {
            // The connection may be out of step with its answers.
            self.con = None;
            return StoreError::NoAnswer(e.to_string());
        }
        if e.is_unrecoverable_error() {
            self.con = None;
        }
        StoreError::Backend(e.to_string())
    }
}

impl RedisStore {
    /// Opens the graph kept under `prefix` in the Redis at `urls`, which
    /// must be exactly one URL (the module docs say why), with the default
    /// [`RedisTimeouts`].
    pub fn open(
        urls: &[String],
        prefix: &str,
        options: StoreOptions,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::open_with(urls, prefix, options, RedisTimeouts::default(), None)
    }

    /// [`RedisStore::open`] with the given timeouts, and for a `rediss://`
    /// URL the certificates to check Redis with and show it (without them,
    /// the system's trusted roots and no client certificate). It connects
    /// at once, so an unreachable Redis fails here, and finishes or
    /// discards what a dead client's bulk change left, so the store opens
    /// whole.
    pub fn open_with(
        urls: &[String],
        prefix: &str,
        options: StoreOptions,
        timeouts: RedisTimeouts,
        tls: Option<TlsCertificates>,
    ) -> Result<RedisStore, StoreError> {
        let reach = Reach::Client(client(urls, prefix, timeouts, tls)?);
        RedisStore::open_at(reach, prefix, options, timeouts)
    }

    /// [`RedisStore::open_with`] for a Redis reached as `reach` (behind
    /// Sentinels: [`Reach::Sentinels`]).
    pub fn open_at(
        reach: Reach,
        prefix: &str,
        options: StoreOptions,
        timeouts: RedisTimeouts,
    ) -> Result<RedisStore, StoreError> {
        check(prefix, timeouts)?;
        let RedisTimeouts {
            connect, response, ..
        } = timeouts;
        let mut store = RedisStore {
            link: Link {
                reach,
                con: None,
                connect,
                response,
            },
            prefix: prefix.to_owned(),
            options,
            timeouts,
            chunk: CHUNK,
            written: None,
        };
        store.recover()?;
        Ok(store)
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn list(&self, list: &str, user: UserId) -> String {
        format!("{}{list}:{user}", self.prefix)
    }

    /// Runs a script with the prefix as its first argument, then `args`.
    fn invoke(
        &mut self,
        script: &Script,
        args: impl Fn(&mut ScriptInvocation<'_>),
    ) -> Result<Reply, StoreError> {
        let prefix = &self.prefix;
        let answer = self.link.run(|con| {
            let mut invocation = script.prepare_invoke();
            invocation.arg(prefix);
            args(&mut invocation);
            invocation.invoke::<Vec<i64>>(con)
        })?;
        Reply::decode(answer)
    }

    /// Runs a write that is not part of a bulk change: while another
    /// client's holds the store it waits, at most `response`, and what a
    /// dead client's left it finishes or discards first.
    fn write(
        &mut self,
        script: &Script,
        args: impl Fn(&mut ScriptInvocation<'_>),
    ) -> Result<Reply, StoreError> {
        let mut deadline = Instant::now() + self.timeouts.response;
        let mut pause = Duration::from_millis(5);
        loop {
            match self.invoke(script, &args)? {
                Reply::Busy | Reply::Recover if Instant::now() >= deadline => {
                    return Err(StoreError::Busy)
                }
                Reply::Busy => {
                    thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Reply::Recover => {
                    self.recover()?;
                    deadline = Instant::now() + self.timeouts.response;
                }
                reply => return Ok(reply),
            }
        }
    }

    /// Adds `users` and `edges` (already free of self-follows) as one batch.
    fn add(&mut self, users: Vec<UserId>, edges: Vec<Edge>) -> Result<Changed, StoreError> {
        if users.len() + edges.len() > self.chunk {
            return self.bulk(bulk::Change::Add, users, edges);
        }
        let users: Vec<u64> = users.iter().map(|u| u.get()).collect();
        let pairs = pairs(&edges);
        let max = self.options.max_following;
        match self.write(&scripts::FOLLOW, |invocation| {
            invocation.arg(max).arg(users.len()).arg(&users).arg(&pairs);
        })? {
            Reply::Ok(values) => Ok(Changed {
                edges: count(&values, 0)?,
                users: count(&values, 1)?,
                change: count(&values, 2)?,
            }),
            Reply::Limit(user) => Err(StoreError::FollowingLimit { user, limit: max }),
            other => Err(out_of_turn(&other)),
        }
    }

    /// Records `changed` as this client's last write.
    fn wrote(&mut self, changed: Changed) -> Changed {
        self.written = Some(changed.change);
        changed
    }

    /// Reads one page of the sorted set at `key`.
    fn page(
        &mut self,
        key: &str,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError> {
        // "(" excludes `after` itself.
        let min = after.map_or_else(|| "-inf".to_owned(), |after| format!("({after}"));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let ids: Vec<u64> = self.link.read(|con| page_of(key, &min, limit).query(con))?;
        ids.into_iter().map(stored).collect()
    }

    /// Tests: bulk changes in parts of `chunk`, so that small batches take
    /// that path.
    #[cfg(test)]
    fn with_chunk(mut self, chunk: usize) -> RedisStore {
        self.chunk = chunk;
        self
    }
}

/// A client for the one Redis at `urls`, once the store's settings are
/// checked; it connects when first used. A `rediss://` URL speaks TLS,
/// checked with `tls` when given (else against the system's roots).
fn client(
    urls: &[String],
    prefix: &str,
    timeouts: RedisTimeouts,
    tls: Option<TlsCertificates>,
) -> Result<redis::Client, StoreError> {
    let url = match urls {
        [url] => url,
        [] => return Err(StoreError::Config("no Redis URL given".into())),
        more => {
            return Err(StoreError::Config(format!(
                "{} Redis URLs given: the graph is kept whole on one Redis, give one",
                more.len()
            )))
        }
    };
    check(prefix, timeouts)?;
    // The URL itself is not repeated: it may hold a password.
    let bad = |e: RedisError| StoreError::Config(format!("the Redis URL: {e}"));
    let info = url.as_str().into_connection_info().map_err(bad)?;
    client_for(info, tls).map_err(bad)
}

/// Refuses an empty prefix and a zero timeout.
fn check(prefix: &str, timeouts: RedisTimeouts) -> Result<(), StoreError> {
    if prefix.is_empty() {
        return Err(StoreError::Config(
            "the key prefix is empty: give one, such as \"myriad:graph:\"".into(),
        ));
    }
    let RedisTimeouts {
        connect,
        response,
        lease,
    } = timeouts;
    if [connect, response, lease].iter().any(Duration::is_zero) {
        return Err(StoreError::Config("a Redis timeout of zero".into()));
    }
    Ok(())
}

/// A client for `info`: over TLS for a `rediss://` URL, with `tls`'s
/// certificates when given (else the system's trusted roots and no client
/// certificate). The node's engine makes its clients here too, so both
/// reach a Redis the same way.
pub fn client_for(
    info: ConnectionInfo,
    tls: Option<TlsCertificates>,
) -> RedisResult<redis::Client> {
    match tls {
        // Certificates are for TLS: a redis:// client is refused them.
        Some(tls) if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) => {
            redis::Client::build_with_tls(info, tls)
        }
        _ => redis::Client::open(info),
    }
}

/// The prefix of a cluster's graph among its other keys: the node's
/// `redis_prefix` with `:g:` after it.
pub fn cluster_prefix(redis_prefix: &str) -> String {
    format!("{redis_prefix}:g:")
}

/// The key of the last change's number (`lua/keys.lua`, `announce`).
const LAST_CHANGE: &str = "changes:last";

/// The channel changes are announced on, under the prefix.
const CHANGES: &str = "changes";

/// Reads ids of the sorted set at `key` from score `min` up, at most
/// `limit` of them.
fn page_of(key: &str, min: &str, limit: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("ZRANGE");
    cmd.arg(key)
        .arg(min)
        .arg("+inf")
        .arg("BYSCORE")
        .arg("LIMIT")
        .arg(0)
        .arg(limit);
    cmd
}

/// Edges as the flat follower, followee list the scripts take.
fn pairs(edges: &[Edge]) -> Vec<u64> {
    edges
        .iter()
        .flat_map(|e| [e.follower.get(), e.followee.get()])
        .collect()
}

/// An id read back from Redis: checked again, as anything could have
/// written there.
fn stored(id: u64) -> Result<UserId, StoreError> {
    UserId::new(id).map_err(|e| StoreError::Backend(format!("a stored id: {e}")))
}

/// A script answered with a code its caller never expects from it.
fn out_of_turn(reply: &Reply) -> StoreError {
    StoreError::Backend(format!("a graph script answered {reply:?} out of turn"))
}

impl Store for RedisStore {
    fn add_users(&mut self, users: &[UserId]) -> Result<u64, StoreError> {
        let changed = self.add(users.to_vec(), Vec::new())?;
        Ok(self.wrote(changed).users)
    }

    fn follow(&mut self, edges: &[Edge]) -> Result<u64, StoreError> {
        refuse_self_follows(edges)?;
        let changed = self.add(Vec::new(), edges.to_vec())?;
        Ok(self.wrote(changed).edges)
    }

    fn unfollow(&mut self, edges: &[Edge]) -> Result<u64, StoreError> {
        let changed = if edges.len() > self.chunk {
            self.bulk(bulk::Change::Remove, Vec::new(), edges.to_vec())?
        } else {
            let pairs = pairs(edges);
            match self.write(&scripts::UNFOLLOW, |invocation| {
                invocation.arg(&pairs);
            })? {
                Reply::Ok(values) => Changed {
                    edges: count(&values, 0)?,
                    users: 0,
                    change: count(&values, 1)?,
                },
                other => return Err(out_of_turn(&other)),
            }
        };
        Ok(self.wrote(changed).edges)
    }

    fn load(&mut self, users: Vec<UserId>, edges: Vec<Edge>) -> Result<u64, StoreError> {
        refuse_self_follows(&edges)?;
        let changed = self.add(users, edges)?;
        Ok(self.wrote(changed).edges)
    }

    fn followers(
        &mut self,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError> {
        self.page(&self.list("followers", user), after, limit)
    }

    fn following(
        &mut self,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError> {
        self.page(&self.list("following", user), after, limit)
    }

    fn users(&mut self, after: Option<UserId>, limit: usize) -> Result<Vec<UserId>, StoreError> {
        self.page(&self.key("users"), after, limit)
    }

    fn contains(&mut self, user: UserId) -> Result<bool, StoreError> {
        let users = self.key("users");
        let score: Option<String> = self
            .link
            .read(|con| redis::cmd("ZSCORE").arg(&users).arg(user.get()).query(con))?;
        Ok(score.is_some())
    }

    fn counts(&mut self, user: UserId) -> Result<Counts, StoreError> {
        let (followers, following) = (self.list("followers", user), self.list("following", user));
        let (followers, following) = self.link.read(|con| {
            redis::pipe()
                .cmd("ZCARD")
                .arg(&followers)
                .cmd("ZCARD")
                .arg(&following)
                .query(con)
        })?;
        Ok(Counts {
            followers,
            following,
        })
    }

    fn totals(&mut self) -> Result<Totals, StoreError> {
        let (users, edges) = (self.key("users"), self.key("edges"));
        let (users, edges): (u64, Option<u64>) = self.link.read(|con| {
            redis::pipe()
                .cmd("ZCARD")
                .arg(&users)
                .cmd("GET")
                .arg(&edges)
                .query(con)
        })?;
        Ok(Totals {
            users,
            edges: edges.unwrap_or(0),
        })
    }

    fn written(&self) -> Option<u64> {
        self.written
    }

    fn last_change(&mut self) -> Result<u64, StoreError> {
        let last = self.key(LAST_CHANGE);
        let change: Option<u64> = self
            .link
            .read(|con| redis::cmd("GET").arg(&last).query(con))?;
        Ok(change.unwrap_or(0))
    }

    fn following_all(&mut self, user: UserId, limit: u64) -> Result<Snapshot, StoreError> {
        let mut read = self.following_each(&[user], limit)?;
        Ok(read.pop().expect("one snapshot per user"))
    }

    fn following_each(
        &mut self,
        users: &[UserId],
        limit: u64,
    ) -> Result<Vec<Snapshot>, StoreError> {
        let last = self.key(LAST_CHANGE);
        let lists: Vec<String> = users.iter().map(|&u| self.list("following", u)).collect();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // One MULTI: nothing runs between the reads, so every list is
        // exactly the store's after change `change`.
        let mut answers: Vec<Value> = self.link.read(|con| {
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("GET").arg(&last);
            for list in &lists {
                pipe.add_command(page_of(list, "-inf", limit));
            }
            pipe.query(con)
        })?;
        if answers.len() != users.len() + 1 {
            return Err(StoreError::Backend(format!(
                "a read of {} following lists answered {} replies",
                users.len(),
                answers.len()
            )));
        }
        let garbled =
            |e: redis::ParsingError| StoreError::Backend(format!("a following list read: {e}"));
        let ids = answers.split_off(1);
        let change: Option<u64> = redis::from_redis_value_ref(&answers[0]).map_err(garbled)?;
        let change = change.unwrap_or(0);
        ids.into_iter()
            .map(|list| {
                let ids: Vec<u64> = redis::from_redis_value(list).map_err(garbled)?;
                Ok(Snapshot {
                    change,
                    users: ids.into_iter().map(stored).collect::<Result<_, _>>()?,
                })
            })
            .collect()
    }
}

/// One Redis per test thread, and a fresh prefix per store.
///
/// Each test runs on a thread of its own, so a thread-local server lives
/// exactly as long as its test and is killed when the thread ends: a
/// failing test leaves nothing behind, and no test sees another's keys.
/// Within a test, every store gets a prefix of its own on that server, so
/// the property test's 64 stores share one server (not 64 starts) and
/// check, in passing, that prefixes keep stores apart: a key written
/// outside its prefix would show in the next store's totals.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::atomic::{AtomicU64, Ordering};

    use myriad_testkit::RedisServer;

    use super::*;

    thread_local! {
        static SERVER: RedisServer = RedisServer::start();
    }

    /// The URL of this test's own server.
    pub(crate) fn url() -> Vec<String> {
        SERVER.with(|server| vec![server.url()])
    }

    pub(crate) fn fresh_prefix() -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!("test{}:", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// An empty store on this test's server, bulk changes in parts of `chunk`.
    pub(crate) fn store(chunk: usize) -> RedisStore {
        RedisStore::open(&url(), &fresh_prefix(), crate::conformance::OPTIONS)
            .unwrap()
            .with_chunk(chunk)
    }

    thread_local! {
        /// The Sentinel setup this test thread holds while it runs.
        static SENTINELS: std::sync::Arc<myriad_testkit::SentinelSetup> =
            myriad_testkit::SentinelSetup::shared();
    }

    /// An empty store on the master of the shared Sentinel setup, found
    /// through its Sentinels, bulk changes in parts of `chunk`.
    pub(crate) fn store_behind_sentinels(chunk: usize) -> RedisStore {
        let sentinels = SENTINELS.with(|setup| {
            sentinel::Sentinels::new(
                &setup.sentinel_urls(),
                setup.name(),
                None,
                Duration::from_secs(5),
            )
            .unwrap()
        });
        let reach = Reach::Sentinels(sentinels);
        let options = crate::conformance::OPTIONS;
        RedisStore::open_at(reach, &fresh_prefix(), options, RedisTimeouts::default())
            .unwrap()
            .with_chunk(chunk)
    }

    /// The keys under `prefix` on the server at `url`.
    pub(crate) fn keys(url: &str, prefix: &str) -> Vec<String> {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut con)
            .unwrap();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use myriad_testkit::RedisServer;

    use super::testing::{fresh_prefix, keys, store, store_behind_sentinels, url};
    use super::*;
    use crate::conformance::OPTIONS;

    // Every batch of the suite is one script.
    crate::conformance_suite!(one_script_a_batch, store(CHUNK));
    // Every batch of more than 3 users and edges is a bulk change in parts
    // of 3: the journal keeps the same contract.
    crate::conformance_suite!(bulk_changes, store(3));
    // The same, on a master found through three Sentinels.
    crate::conformance_suite!(behind_sentinels, store_behind_sentinels(CHUNK));
    crate::conformance_suite!(bulk_changes_behind_sentinels, store_behind_sentinels(3));

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    #[test]
    fn certificates_go_to_tls_urls_only() {
        let with_certificates = |url: &str, tls: Option<TlsCertificates>| {
            let client = client_for(url.into_connection_info().unwrap(), tls).unwrap();
            matches!(
                client.get_connection_info().addr(),
                ConnectionAddr::TcpTls {
                    tls_params: Some(_),
                    ..
                }
            )
        };
        let some = || {
            Some(TlsCertificates {
                client_tls: None,
                root_cert: None,
            })
        };
        assert!(with_certificates("rediss://127.0.0.1:1", some()));
        // build_with_tls would refuse a redis:// URL: it gets none.
        assert!(!with_certificates("redis://127.0.0.1:1", some()));
        assert!(!with_certificates("rediss://127.0.0.1:1", None));
    }

    fn edge(follower: u64, followee: u64) -> Edge {
        Edge::new(user(follower), user(followee))
    }

    fn ids(users: Vec<UserId>) -> Vec<u64> {
        users.into_iter().map(UserId::get).collect()
    }

    /// Short timeouts, so the failure tests end soon.
    const QUICK: RedisTimeouts = RedisTimeouts {
        connect: Duration::from_millis(500),
        response: Duration::from_millis(500),
        lease: Duration::from_millis(500),
    };

    #[test]
    fn prefixes_keep_stores_apart_on_one_redis() {
        let (mut a, mut b) = (store(CHUNK), store(CHUNK));
        a.follow(&[edge(1, 2)]).unwrap();
        b.follow(&[edge(2, 1), edge(3, 1)]).unwrap();
        assert_eq!(ids(a.followers(user(2), None, 10).unwrap()), vec![1]);
        assert!(b.followers(user(2), None, 10).unwrap().is_empty());
        assert_eq!(a.totals().unwrap(), Totals { users: 2, edges: 1 });
        assert_eq!(b.totals().unwrap(), Totals { users: 3, edges: 2 });
    }

    #[test]
    fn ids_up_to_the_largest_page_exactly() {
        // Near 2^53 a double's neighbours are 1 apart: scores still order
        // and exclude exactly.
        let top = UserId::MAX;
        let mut store = store(CHUNK);
        let edges: Vec<Edge> = (1..=5).map(|i| edge(top - i, top)).collect();
        store.follow(&edges).unwrap();
        let first = store.followers(user(top), None, 2).unwrap();
        assert_eq!(ids(first.clone()), vec![top - 5, top - 4]);
        let rest = store.followers(user(top), Some(first[1]), 10).unwrap();
        assert_eq!(ids(rest), vec![top - 3, top - 2, top - 1]);
        let last = store.users(Some(user(top - 1)), 10).unwrap();
        assert_eq!(ids(last), vec![top]);
    }

    #[test]
    fn bad_configurations_are_refused_by_name() {
        let options = StoreOptions::default();
        let refused = |urls: &[String], prefix: &str| match RedisStore::open(urls, prefix, options)
        {
            Err(StoreError::Config(why)) => why,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(refused(&[], "p:").contains("no Redis URL"));
        let two = [url()[0].clone(), url()[0].clone()];
        assert!(refused(&two, "p:").contains("2 Redis URLs"));
        assert!(refused(&url(), "").contains("prefix"));
        let why = refused(&["http://:secret@host".to_owned()], "p:");
        assert!(!why.contains("secret"), "{why}");
        let zero = RedisTimeouts {
            response: Duration::ZERO,
            ..RedisTimeouts::default()
        };
        assert!(matches!(
            RedisStore::open_with(&url(), "p:", options, zero, None),
            Err(StoreError::Config(_))
        ));
    }

    #[test]
    fn an_unreachable_redis_fails_the_open() {
        let mut server = RedisServer::start();
        let urls = vec![server.url()];
        server.kill();
        let opened = RedisStore::open_with(&urls, "p:", OPTIONS, QUICK, None);
        assert!(
            matches!(opened, Err(StoreError::Unreachable(_))),
            "{:?}",
            opened.map(|_| ())
        );
    }

    /// Fails unless `answer` is the error of a Redis that went away.
    fn refused_as_gone<T: std::fmt::Debug>(answer: Result<T, StoreError>) {
        assert!(
            matches!(
                answer,
                Err(StoreError::NoAnswer(_) | StoreError::Unreachable(_))
            ),
            "{answer:?}"
        );
    }

    #[test]
    fn a_store_behind_sentinels_follows_a_failover_by_itself() {
        let mut setup = myriad_testkit::SentinelSetup::start("graphs");
        let sentinels =
            sentinel::Sentinels::new(&setup.sentinel_urls(), "graphs", None, QUICK.connect)
                .unwrap();
        let reach = Reach::Sentinels(sentinels);
        let mut store = RedisStore::open_at(reach, "p:", OPTIONS, QUICK).unwrap();
        store.follow(&[edge(1, 2)]).unwrap();
        assert_eq!(setup.master.command(&["WAIT", "1", "5000"]).unwrap(), ":1");
        let old = setup.master.port();
        setup.master.kill();
        refused_as_gone(store.follow(&[edge(3, 2)]));
        assert_eq!(setup.wait_for_failover_from(old), setup.replica.port());
        // Each call asks the Sentinels again until one names a master that
        // takes the write.
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.follow(&[edge(3, 2)]).is_err() {
            assert!(
                Instant::now() < deadline,
                "the store never followed the failover"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(ids(store.followers(user(2), None, 10).unwrap()), [1, 3]);
    }

    #[test]
    fn a_killed_redis_gives_typed_errors_and_a_restarted_one_serves_again() {
        let mut server = RedisServer::start();
        let mut store = RedisStore::open_with(&[server.url()], "p:", OPTIONS, QUICK, None).unwrap();
        store.follow(&[edge(1, 2)]).unwrap();
        server.kill();
        let started = Instant::now();
        refused_as_gone(store.follow(&[edge(3, 2)]));
        // Now the connection is gone: the next call cannot connect.
        let read = store.totals();
        assert!(matches!(read, Err(StoreError::Unreachable(_))), "{read:?}");
        assert!(started.elapsed() < Duration::from_secs(30), "no hang");
        server.restart();
        // Not persistent: the restarted Redis is empty, and it answers.
        assert_eq!(store.totals().unwrap(), Totals::default());
        assert_eq!(store.follow(&[edge(3, 2)]).unwrap(), 1);
    }

    #[test]
    fn a_stalled_redis_gives_no_answer_within_the_response_timeout() {
        let server = RedisServer::start();
        let mut store = RedisStore::open_with(&[server.url()], "p:", OPTIONS, QUICK, None).unwrap();
        store.follow(&[edge(1, 2)]).unwrap();
        server.pause();
        let started = Instant::now();
        let write = store.follow(&[edge(3, 2)]);
        let read = store.followers(user(2), None, 10);
        let waited = started.elapsed();
        server.resume();
        assert!(matches!(write, Err(StoreError::NoAnswer(_))), "{write:?}");
        // The failed write dropped its connection; a new one is accepted
        // by the kernel, but its handshake is never answered, so the read
        // was never sent.
        assert!(matches!(read, Err(StoreError::Unreachable(_))), "{read:?}");
        assert!(waited >= QUICK.response, "{waited:?}");
        assert!(waited < Duration::from_secs(30), "{waited:?}");
        // The write reached Redis before it stopped, and ran once resumed.
        let followers = store.followers(user(2), None, 10).unwrap();
        assert_eq!(ids(followers), vec![1, 3]);
    }

    #[test]
    fn every_write_is_announced_with_its_number_in_store_order() {
        use std::sync::atomic::AtomicBool;
        use std::sync::{mpsc, Arc};

        use crate::announce::{Announced, Announcement};

        let (urls, prefix) = (url(), fresh_prefix());
        let changes = ChangeStream::new(&urls, &prefix, RedisTimeouts::default(), None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (heard, hearing) = mpsc::channel();
        let listening = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                changes.listen(&stop, |h| {
                    let _ = heard.send(h);
                })
            })
        };
        let next = || hearing.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(matches!(next(), Heard::Subscribed));
        let mut store = RedisStore::open(&urls, &prefix, OPTIONS)
            .unwrap()
            .with_chunk(3);
        assert_eq!(store.written(), None);
        assert_eq!(store.last_change().unwrap(), 0);
        store.follow(&[edge(1, 2), edge(1, 3)]).unwrap();
        store.add_users(&[user(9)]).unwrap();
        // An edge that is not there is announced too: the batch as asked.
        store.unfollow(&[edge(1, 2), edge(5, 6)]).unwrap();
        assert_eq!(store.written(), Some(3));
        // A bulk change: one announcement, a reread.
        store
            .follow(&[edge(4, 1), edge(4, 2), edge(7, 1), edge(7, 2)])
            .unwrap();
        assert_eq!(store.written(), Some(4));
        // A refused batch changes nothing and announces nothing.
        let too_many: Vec<Edge> = (100..100 + OPTIONS.max_following + 1)
            .map(|f| edge(1, f))
            .collect();
        assert!(store.follow(&too_many[..2]).is_ok());
        assert!(store.follow(&too_many).is_err());
        assert_eq!(store.written(), Some(5));
        assert_eq!(store.last_change().unwrap(), 5);
        let snapshot = store.following_all(user(1), 100).unwrap();
        assert_eq!(
            (snapshot.change, ids(snapshot.users)),
            (5, vec![3, 100, 101])
        );
        let expected = [
            "1 f 0 1 2 1 3",
            "2 f 1 9",
            "3 u 1 2 5 6",
            "4 r",
            "5 f 0 1 100 1 101",
        ];
        for text in expected {
            match next() {
                Heard::Change(heard) => {
                    assert_eq!(heard, Announcement::parse(text).unwrap(), "{text}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            Announcement::parse("4 r").unwrap().what,
            Announced::Reread
        ));
        stop.store(true, std::sync::atomic::Ordering::Release);
        listening.join().unwrap().unwrap();
        assert!(hearing.try_recv().is_err(), "nothing more was announced");
    }

    #[test]
    fn a_change_stream_ends_with_an_error_when_its_redis_goes() {
        use std::sync::atomic::AtomicBool;

        let mut server = RedisServer::start();
        let changes = ChangeStream::new(&[server.url()], "p:", QUICK, None).unwrap();
        let stop = AtomicBool::new(false);
        let mut subscribed = 0;
        let ended = thread::scope(|scope| {
            let listening = scope.spawn(|| {
                changes.listen(&stop, |h| {
                    if matches!(h, Heard::Subscribed) {
                        subscribed += 1;
                    }
                })
            });
            thread::sleep(Duration::from_millis(200));
            server.kill();
            listening.join().unwrap()
        });
        assert_eq!(subscribed, 1);
        assert!(matches!(ended, Err(StoreError::NoAnswer(_))), "{ended:?}");
        // And cannot listen again while it is gone.
        let again = changes.listen(&stop, |_| {});
        assert!(
            matches!(again, Err(StoreError::Unreachable(_))),
            "{again:?}"
        );
    }

    #[test]
    fn an_acknowledged_batch_survives_kill_9_of_redis() {
        // appendonly yes, appendfsync always: what the module docs ask of
        // the operator.
        let mut server = RedisServer::start_persistent();
        let urls = vec![server.url()];
        let prefix = fresh_prefix();
        let mut store = RedisStore::open(&urls, &prefix, OPTIONS)
            .unwrap()
            .with_chunk(3);
        assert_eq!(store.follow(&[edge(1, 2), edge(3, 2)]).unwrap(), 2);
        // A bulk change, acknowledged too.
        let bulk: Vec<Edge> = (10..20).map(|f| edge(f, 2)).collect();
        assert_eq!(store.follow(&bulk).unwrap(), 10);
        server.kill();
        server.restart();
        let mut store = RedisStore::open(&urls, &prefix, OPTIONS).unwrap();
        let mut expected = vec![1, 3];
        expected.extend(10..20);
        assert_eq!(ids(store.followers(user(2), None, 100).unwrap()), expected);
        assert_eq!(
            store.totals().unwrap(),
            Totals {
                users: 13,
                edges: 12
            }
        );
        // Nothing of the journal is left.
        assert!(keys(&urls[0], &format!("{prefix}bulk")).is_empty());
    }
}
