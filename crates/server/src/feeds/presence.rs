//! [`Presence`]: which users are connected to this node, and on which
//! connections.
//!
//! Workers add a connection when it opens as a user and remove it when it
//! goes; the keeper reads it to find the connections a follow or unfollow
//! concerns. Sharded by user id so that workers registering connections do
//! not contend with each other or with the keeper on one lock. A user may
//! hold several connections, on several workers.

use std::collections::HashMap;
use std::sync::MutexGuard;

use foldhash::fast::RandomState;
use myriad_graph::UserId;
use smallvec::SmallVec;

use crate::messages::engine::ConnRequest;
use crate::sharded::Sharded;

type Connections = SmallVec<[ConnRequest; 1]>;

/// Users present on this node; see the module docs.
#[derive(Default)]
pub struct Presence {
    shards: Sharded<HashMap<UserId, Connections, RandomState>>,
}

/// The same connection: worker, slot and life (request ids don't matter).
fn same(a: &ConnRequest, b: &ConnRequest) -> bool {
    (a.worker, a.conn, a.life) == (b.worker, b.conn, b.life)
}

impl Presence {
    fn shard(&self, user: UserId) -> MutexGuard<'_, HashMap<UserId, Connections, RandomState>> {
        // Nothing runs under this lock but the map.
        self.shards.lock(&user)
    }

    pub fn add(&self, user: UserId, conn: ConnRequest) {
        self.shard(user).entry(user).or_default().push(conn);
    }

    pub fn remove(&self, user: UserId, conn: &ConnRequest) {
        let mut shard = self.shard(user);
        if let Some(conns) = shard.get_mut(&user) {
            conns.retain(|c| !same(c, conn));
            if conns.is_empty() {
                shard.remove(&user);
            }
        }
    }

    /// `user`'s connections on this node.
    pub fn connections(&self, user: UserId) -> Connections {
        self.shard(user).get(&user).cloned().unwrap_or_default()
    }

    /// Every user with at least one connection here, in no order.
    pub fn users_present(&self) -> Vec<UserId> {
        let mut users = Vec::new();
        self.shards.for_each(|shard| users.extend(shard.keys()));
        users
    }

    /// Users with at least one connection here.
    pub fn users(&self) -> usize {
        self.shards.sum(HashMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(worker: usize, conn: u32, life: u32) -> ConnRequest {
        ConnRequest {
            worker,
            conn,
            life,
            request: None,
        }
    }

    #[test]
    fn a_user_holds_several_connections_until_each_goes() {
        let presence = Presence::default();
        let u = UserId::new(7).unwrap();
        presence.add(u, conn(0, 1, 1));
        presence.add(u, conn(1, 1, 1));
        presence.add(UserId::new(71).unwrap(), conn(0, 2, 1));
        assert_eq!(presence.connections(u).len(), 2);
        assert_eq!(presence.users(), 2);
        // A later life of the same slot is another connection.
        presence.remove(u, &conn(0, 1, 2));
        assert_eq!(presence.connections(u).len(), 2);
        presence.remove(u, &conn(0, 1, 1));
        presence.remove(u, &conn(1, 1, 1));
        assert!(presence.connections(u).is_empty());
        assert_eq!(presence.users(), 1);
    }
}
