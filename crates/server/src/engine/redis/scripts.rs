//! The Lua scripts the engine runs in Redis, each with the shared library
//! (lib.lua) in front, so that offset, history and publish happen in one
//! atomic step on the server.

use redis::Script;

pub struct Scripts {
    pub publish: Script,
    pub read: Script,
    pub forget: Script,
    pub sweep: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            publish: Script::new(concat!(
                include_str!("lib.lua"),
                include_str!("publish.lua")
            )),
            read: Script::new(concat!(include_str!("lib.lua"), include_str!("read.lua"))),
            forget: Script::new(concat!(include_str!("lib.lua"), include_str!("forget.lua"))),
            sweep: Script::new(concat!(include_str!("lib.lua"), include_str!("sweep.lua"))),
        }
    }

    pub fn all(&self) -> [&Script; 4] {
        [&self.publish, &self.read, &self.forget, &self.sweep]
    }
}
