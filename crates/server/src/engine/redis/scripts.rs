//! The Lua scripts the engine runs in Redis, each with the shared library
//! (lib.lua) in front, so that offset, history and publish happen in one
//! atomic step on the server.

use redis::Script;

use super::keys;

/// The publish script as the engine runs it (lib.lua in front of
/// publish.lua); `publish_call` builds a call of it.
pub const PUBLISH_SCRIPT: &str = concat!(include_str!("lib.lua"), include_str!("publish.lua"));

/// One call of the publish script, run by `script`'s hash: over the
/// partition whose keys start `base` ([`keys::base`]), within a history budget of `max_bytes`, a stream it
/// creates (or renews after a failover) starting epoch `epoch`, on a
/// master of replication id `replid` (`""`: not compared; lib.lua,
/// "failover"); each publication is its subject, data,
/// history size and age limit in milliseconds (publish.lua's header).
pub fn publish_call<'a>(
    script: &Script,
    base: &str,
    max_bytes: usize,
    epoch: &str,
    replid: &str,
    publications: impl IntoIterator<Item = (&'a str, &'a str, usize, u64)>,
) -> redis::Cmd {
    let mut call = evalsha(script, base);
    call.arg(max_bytes).arg(epoch).arg(replid);
    for (subject, data, size, ttl_ms) in publications {
        call.arg(subject).arg(data).arg(size).arg(ttl_ms);
    }
    call
}

/// An `EVALSHA` of `script` (loaded on every connect) over the partition
/// whose keys start `base`: its shared keys as `KEYS[]`, `base` as
/// `ARGV[1]` (lib.lua); the caller adds the other arguments.
pub fn evalsha(script: &Script, base: &str) -> redis::Cmd {
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.get_hash()).arg(keys::SHARED.len());
    call.arg(&keys::shared(base)).arg(base);
    call
}

pub struct Scripts {
    pub publish: Script,
    pub read: Script,
    pub forget: Script,
    pub sweep: Script,
    pub presence: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            publish: Script::new(PUBLISH_SCRIPT),
            read: Script::new(concat!(include_str!("lib.lua"), include_str!("read.lua"))),
            forget: Script::new(concat!(include_str!("lib.lua"), include_str!("forget.lua"))),
            sweep: Script::new(concat!(include_str!("lib.lua"), include_str!("sweep.lua"))),
            presence: Script::new(concat!(
                include_str!("lib.lua"),
                include_str!("presence.lua")
            )),
        }
    }

    pub fn all(&self) -> [&Script; 5] {
        [
            &self.publish,
            &self.read,
            &self.forget,
            &self.sweep,
            &self.presence,
        ]
    }
}
