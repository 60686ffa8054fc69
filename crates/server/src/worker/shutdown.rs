//! Graceful shutdown of one worker: its listener closed, its open
//! connections told 1001 once the engine has answered what they asked, and
//! the worker's exit once they are gone or the deadline passes.

use myriad_protocol::close::CloseReason;

use super::sweep::passed;
use super::Worker;
use crate::conn::Phase;
use crate::registry::ConnId;

/// How far this worker's graceful shutdown has gone.
#[derive(Clone, Copy)]
pub(super) struct Draining {
    /// When it began, on this worker's clock.
    since: u32,
    /// Every open connection has been sent its 1001.
    told: bool,
}

impl Worker {
    /// Graceful shutdown: stop accepting; send every client 1001 once the
    /// engine has answered every request with an id this worker handed it
    /// (the engine refuses new ones by now, at once), or once half of the
    /// shutdown timeout has passed waiting for them; exit once all clients
    /// are gone or the shutdown timeout passes. Returns true when the
    /// worker may exit.
    pub(super) fn drain_for_shutdown(&mut self, now: u32) -> bool {
        let (draining, begun) = match self.draining {
            Some(draining) => (draining, false),
            None => {
                let now = self.clock.tick();
                if let Some(mut listener) = self.listener.take() {
                    // Dropping the listener closes it; deregistering first keeps
                    // epoll tidy, and failure to do so changes nothing.
                    let _ = self.poll.registry().deregister(&mut listener);
                }
                let draining = Draining {
                    since: now,
                    told: false,
                };
                (draining, true)
            }
        };
        let timeout = self.shared.config.shutdown_timeout;
        let timed_out = passed(now, draining.since, timeout);
        let waited_out = passed(now, draining.since, timeout / 2);
        let told = draining.told || self.sessions.answers_owed() == 0 || waited_out;
        if told && !draining.told {
            self.say_goodbye(true);
        } else if begun {
            // Handshakes end now; open connections wait for their answers.
            self.say_goodbye(false);
        }
        self.draining = Some(Draining { told, ..draining });
        if self.conns.is_empty() {
            return true;
        }
        if timed_out {
            let ids: Vec<ConnId> = self.conns.iter().map(|(id, _)| id as ConnId).collect();
            for id in ids {
                self.drop_at_deadline(id);
            }
            return true;
        }
        false
    }

    /// Drops the connections in their request (a handshake, or a kept-alive
    /// connection's next request: nothing new is served any more) and, with
    /// `open_too`, sends 1001 to the open ones.
    fn say_goodbye(&mut self, open_too: bool) {
        let ids: Vec<ConnId> = self.conns.iter().map(|(id, _)| id as ConnId).collect();
        for id in ids {
            match self.conns[id as usize].phase {
                Phase::Request => {
                    self.decide_close(id, CloseReason::GoingAway);
                    self.drop_conn(id);
                }
                Phase::PubSub | Phase::Echo if open_too => self.close(id, CloseReason::GoingAway),
                _ => {}
            }
        }
        self.flush_dirty();
    }
}
