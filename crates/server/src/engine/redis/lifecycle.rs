//! The lifecycle hooks' tally kept in Redis (the contract is
//! `hooks::tally`): per user and per subject a hash of the nodes holding
//! it and the pending let-go's marker, both under the key's own hash tag;
//! per node the set of keys it holds; and one sorted set of node leases.
//! lifecycle.lua makes each key's transition in one atomic step.
//!
//! Runs on the lifecycle stage's thread alone, never a worker's: it waits
//! on its round trips (a plain blocking connection, with the engine's
//! `redis_timeout`), and reconnects at the next call after a failure. The
//! tally lives on the first configured instance: every node must find it
//! in the same place, and the keys' hash tags keep it valid on a Redis
//! Cluster later.

use std::time::Duration;

use redis::Script;

use crate::hooks::tally::{key_name, key_of, Renewed, Tally, TallyError, Up};
use crate::hooks::Key;

/// See the module header.
pub struct RedisTally {
    client: redis::Client,
    conn: Option<redis::Connection>,
    script: Script,
    prefix: String,
    node: String,
    lease: Duration,
    timeout: Duration,
    /// How long a pending marker outlives its let-go (`hook_delay` and four
    /// leases): past the confirm it is owed, so that a confirm that comes
    /// late (made again after failures) still finds it, and then gone, so
    /// that a let-go nobody confirms holds no key for ever. A confirmed
    /// one's `done:` mark lives as long, one small key per user or subject
    /// gone in the last minute or so (by default).
    marker_ttl: Duration,
    /// Numbers this node's generations; with the node id, unique in the
    /// cluster.
    next: u64,
}

fn failed(e: impl std::fmt::Display) -> TallyError {
    TallyError(e.to_string())
}

impl RedisTally {
    /// A tally on the Redis at `url`, its keys under `prefix`, for node
    /// `node` keeping `lease`, its pending let-gos confirmed `delay` after.
    pub fn new(
        url: &str,
        prefix: &str,
        node: &str,
        lease: Duration,
        delay: Duration,
        timeout: Duration,
    ) -> Result<RedisTally, TallyError> {
        Ok(RedisTally {
            client: redis::Client::open(url).map_err(failed)?,
            conn: None,
            script: Script::new(include_str!("lifecycle.lua")),
            prefix: prefix.to_owned(),
            node: node.to_owned(),
            lease,
            timeout,
            marker_ttl: delay + lease * 4,
            next: 0,
        })
    }

    /// A key's two Redis keys: the nodes holding it and its pending marker,
    /// one hash tag (`{u:ann}`) for both.
    fn keys_of(&self, key: &Key) -> [String; 2] {
        let name = key_name(key);
        ["here", "down"].map(|part| format!("{}lc:{{{name}}}:{part}", self.prefix))
    }

    /// The set of the keys node `node` holds.
    fn node_set(&self, node: &str) -> String {
        format!("{}lc:node:{{{node}}}", self.prefix)
    }

    /// Takes `key` out of this node's set: it no longer holds it (a
    /// confirm does the same in its own round trip).
    fn forget(&mut self, key: &Key) -> Result<(), TallyError> {
        let (set, name) = (self.node_set(&self.node), key_name(key));
        self.with_conn(|conn, _| redis::cmd("SREM").arg(&set).arg(&name).query(conn))
    }

    fn leases(&self) -> String {
        format!("{}lc:leases", self.prefix)
    }

    /// A generation for a key this node takes from a dead one: apart
    /// from its own calls' (`<node>-<call>`).
    fn sweep_generation(&mut self) -> String {
        self.next += 1;
        format!("{}-s{}", self.node, self.next)
    }

    /// Runs `call` on the connection, made first if there is none; a
    /// failure drops it, so the next call connects again.
    fn with_conn<T>(
        &mut self,
        call: impl FnOnce(&mut redis::Connection, &Script) -> redis::RedisResult<T>,
    ) -> Result<T, TallyError> {
        if self.conn.is_none() {
            let conn = self
                .client
                .get_connection_with_timeout(self.timeout)
                .map_err(failed)?;
            conn.set_read_timeout(Some(self.timeout)).map_err(failed)?;
            conn.set_write_timeout(Some(self.timeout)).map_err(failed)?;
            let mut conn = conn;
            // Loaded on every connect: a pipeline runs it by its hash only.
            self.script
                .prepare_invoke()
                .load(&mut conn)
                .map_err(failed)?;
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("just made");
        call(conn, &self.script).map_err(|e| {
            self.conn = None;
            failed(e)
        })
    }

    /// A let-go of `key` by `mode` (`down`, or `drop` for a dead `node`)
    /// under `generation`: the generation when nobody holds the key now.
    fn let_go(
        &mut self,
        mode: &str,
        key: &Key,
        node: &str,
        generation: String,
    ) -> Result<Option<String>, TallyError> {
        let [here, down] = self.keys_of(key);
        let ttl = self.marker_ttl.as_millis() as u64;
        let gone: String = self.with_conn(|conn, script| {
            script
                .key(&here)
                .key(&down)
                .arg(mode)
                .arg(node)
                .arg(&generation)
                .arg(ttl)
                .invoke(conn)
        })?;
        Ok((gone == generation).then_some(generation))
    }
}

impl Tally for RedisTally {
    fn up(&mut self, key: &Key, call: u64) -> Result<Up, TallyError> {
        let [here, down] = self.keys_of(key);
        let set = self.node_set(&self.node);
        let (name, node) = (key_name(key), self.node.clone());
        // In the node's set first: a node dying between the two leaves a
        // key its sweep finds it does not hold, which is no change.
        let (answer,): (u8,) = self.with_conn(|conn, script| {
            redis::pipe()
                .cmd("SADD")
                .arg(&set)
                .arg(&name)
                .ignore()
                .invoke_script(script.key(&here).key(&down).arg("up").arg(&node).arg(call))
                .query(conn)
        })?;
        Ok(match answer {
            1 => Up::First,
            2 => Up::Returned,
            _ => Up::Held,
        })
    }

    fn down(&mut self, key: &Key, call: u64) -> Result<Option<String>, TallyError> {
        let node = self.node.clone();
        let generation = format!("{node}-{call}");
        let gone = self.let_go("down", key, &node, generation)?;
        // Kept in the node's set while its let-go is pending, so that a
        // sweeper takes the let-go over if this node dies before its
        // confirm; dropped by the confirm.
        if gone.is_none() {
            self.forget(key)?;
        }
        Ok(gone)
    }

    fn confirm(&mut self, key: &Key, generation: &str) -> Result<bool, TallyError> {
        let [here, down] = self.keys_of(key);
        let (set, name) = (self.node_set(&self.node), key_name(key));
        let ttl = self.marker_ttl.as_millis() as u64;
        let (done,): (u8,) = self.with_conn(|conn, script| {
            redis::pipe()
                .invoke_script(
                    script
                        .key(&here)
                        .key(&down)
                        .arg("confirm")
                        .arg(generation)
                        .arg(ttl),
                )
                .cmd("SREM")
                .arg(&set)
                .arg(&name)
                .ignore()
                .query(conn)
        })?;
        Ok(done == 1)
    }

    fn renew(&mut self) -> Result<Renewed, TallyError> {
        let (leases, node) = (self.leases(), self.node.clone());
        let lease = self.lease.as_millis() as u64;
        let mut reply: Vec<String> = self.with_conn(|conn, script| {
            script
                .key(&leases)
                .arg("renew")
                .arg(&node)
                .arg(lease)
                .invoke(conn)
        })?;
        let lost = !reply.is_empty() && reply.remove(0) == "1";
        let mut emptied = Vec::new();
        for gone in reply {
            let set = self.node_set(&gone);
            let names: Vec<String> =
                self.with_conn(|conn, _| redis::cmd("SMEMBERS").arg(&set).query(conn))?;
            for key in names.iter().filter_map(|name| key_of(name)) {
                let generation = self.sweep_generation();
                if let Some(generation) = self.let_go("drop", &key, &gone, generation)? {
                    emptied.push((key, generation));
                }
            }
            // Only once every key is let go: a sweeper that failed half
            // way leaves the rest to the next.
            self.with_conn(|conn, _| {
                redis::cmd("DEL").arg(&set).query::<()>(conn)?;
                redis::cmd("ZREM").arg(&leases).arg(&gone).query::<()>(conn)
            })?;
        }
        Ok(Renewed { emptied, lost })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::tally::suite::Rig;
    use myriad_testkit::RedisServer;

    const LEASE: Duration = Duration::from_millis(600);

    /// A world in a real `redis-server`, each rig under its own prefix.
    struct InRedis {
        redis: RedisServer,
        prefix: String,
    }

    impl InRedis {
        fn new(prefix: &str) -> InRedis {
            InRedis {
                redis: RedisServer::start(),
                prefix: prefix.to_owned(),
            }
        }
    }

    impl Rig for InRedis {
        fn node(&self, node: &str) -> Box<dyn Tally> {
            let timeout = Duration::from_secs(2);
            let url = self.redis.url();
            let tally = RedisTally::new(&url, &self.prefix, node, LEASE, LEASE, timeout);
            Box::new(tally.unwrap())
        }

        fn lease(&self) -> Duration {
            LEASE
        }

        fn pass(&self, span: Duration) {
            std::thread::sleep(span);
        }
    }

    mod suite_in_redis {
        use super::InRedis;
        use std::sync::atomic::{AtomicU64, Ordering};

        /// Each test's world under a prefix of its own.
        fn rig() -> InRedis {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            InRedis::new(&format!("t{}:", NEXT.fetch_add(1, Ordering::Relaxed)))
        }

        crate::hooks::tally::suite::tally_suite!(rig());
    }

    /// What one node's transitions cost: `users` users each coming,
    /// going and confirmed, one after another on one tally, as the stage
    /// makes them. Prints the rate; checks every answer. Run with
    /// `cargo test -p myriad-server --release --lib lifecycle_rate -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement"]
    fn lifecycle_rate() {
        let rig = InRedis::new("rate:");
        let mut tally = rig.node("n1");
        let users = 5_000;
        let started = std::time::Instant::now();
        for i in 0..users {
            let key = Key::User(format!("u{i}"));
            assert_eq!(tally.up(&key, 2 * u64::from(i)).unwrap(), Up::First);
            let generation = tally
                .down(&key, 2 * u64::from(i) + 1)
                .unwrap()
                .expect("let go");
            assert!(tally.confirm(&key, &generation).unwrap());
        }
        let took = started.elapsed();
        let per_user = took / users;
        println!(
            "{users} users up, down and confirmed in {took:?}: {per_user:?} per user, {:.0} users/s",
            f64::from(users) / took.as_secs_f64()
        );
    }

    #[test]
    fn every_key_a_script_touches_shares_its_keys_hash_tag() {
        let rig = InRedis::new("p:");
        let tally = RedisTally::new(&rig.redis.url(), "p:", "n1", LEASE, LEASE, LEASE).unwrap();
        let [here, down] = tally.keys_of(&Key::User("ann".into()));
        assert_eq!(here, "p:lc:{u:ann}:here");
        assert_eq!(down, "p:lc:{u:ann}:down");
    }
}
