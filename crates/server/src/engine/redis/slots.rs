//! Which Redis Cluster master serves a partition: the slot of a name (the
//! cluster specification's CRC16 of its hash tag, modulo 16384), the
//! cluster's slot map as `CLUSTER SLOTS` reports it, and the redirections
//! (`-MOVED`, `-ASK`) a master answers for a slot it does not serve.
//!
//! Pure: it reads replies and names; connecting, and acting on a map or a
//! redirection, is the Cluster shape's (issue 31 item 2, not wired yet:
//! the engine runs no Cluster shape until its routing is tested whole).

use std::fmt;

use redis::Value;

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The slot of `name`: of its hash tag (the first `{…}` with something
/// between the braces) when it has one, else of the whole name.
pub fn slot_of(name: &[u8]) -> u16 {
    let hashed = name
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &name[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(name);
    crc16(hashed) % SLOTS
}

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the cluster's key hash.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (0..8).fold(crc ^ (u16::from(b) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

/// Why a `CLUSTER SLOTS` reply makes no map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotMapError {
    /// The reply is not what Redis sends.
    Malformed(String),
    /// Some slots have no master: the cluster cannot serve every subject.
    Uncovered(Vec<(u16, u16)>),
}

impl fmt::Display for SlotMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotMapError::Malformed(why) => write!(f, "unexpected CLUSTER SLOTS reply: {why}"),
            SlotMapError::Uncovered(ranges) => {
                write!(f, "the Redis Cluster serves no slots ")?;
                let shown: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
                write!(f, "{}", shown.join(", "))
            }
        }
    }
}

/// Every slot's master, `host:port`, as one node of the cluster sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Ranges `(first, last, master)`, sorted, covering every slot once.
    ranges: Vec<(u16, u16, String)>,
}

impl SlotMap {
    /// The map `CLUSTER SLOTS` answered: each entry `[first, last, [host,
    /// port, id, …], replicas…]`. A map leaving a slot uncovered (a master
    /// down with no replica to take over, slots never assigned) is refused,
    /// naming the ranges.
    pub fn from_cluster_slots(reply: &Value) -> Result<SlotMap, SlotMapError> {
        let malformed = |what: &str| SlotMapError::Malformed(what.to_owned());
        let Value::Array(entries) = reply else {
            return Err(malformed("not an array"));
        };
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(fields) = entry else {
                return Err(malformed("an entry is not an array"));
            };
            let (Some(first), Some(last), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(malformed("an entry without its range and master"));
            };
            let slot = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok().filter(|&n| n < SLOTS),
                _ => None,
            };
            let (Some(first), Some(last)) = (slot(first), slot(last)) else {
                return Err(malformed("a range out of 0..16384"));
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return Err(malformed("a master without its host")),
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return Err(malformed("a master without its port"));
            };
            ranges.push((first, last, format!("{host}:{port}")));
        }
        ranges.sort();
        let mut uncovered = Vec::new();
        let mut next: u32 = 0;
        for &(first, last, _) in &ranges {
            if u32::from(first) > next {
                uncovered.push((next as u16, first - 1));
            } else if u32::from(first) < next {
                return Err(malformed("overlapping ranges"));
            }
            next = u32::from(last) + 1;
        }
        if next < u32::from(SLOTS) {
            uncovered.push((next as u16, SLOTS - 1));
        }
        if !uncovered.is_empty() {
            return Err(SlotMapError::Uncovered(uncovered));
        }
        Ok(SlotMap { ranges })
    }

    /// The master serving `slot`.
    pub fn master_of(&self, slot: u16) -> &str {
        let at = self.ranges.partition_point(|&(_, last, _)| last < slot);
        &self.ranges[at].2
    }

    /// Every master, once each, in slot order of their first range.
    pub fn masters(&self) -> Vec<&str> {
        let mut seen: Vec<&str> = Vec::new();
        for (_, _, master) in &self.ranges {
            if !seen.contains(&master.as_str()) {
                seen.push(master);
            }
        }
        seen
    }
}

/// A master's answer that a slot is served elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `-MOVED slot host:port`: the slot lives there now; the map is stale.
    Moved { slot: u16, to: String },
    /// `-ASK slot host:port`: the slot is migrating; this one request goes
    /// there, after `ASKING`; the map stays.
    Ask { slot: u16, to: String },
}

impl Redirect {
    /// The redirection an error reply (its code and message, as
    /// `MOVED 3999 127.0.0.1:6381`) holds, if it is one.
    pub fn parse(error: &str) -> Option<Redirect> {
        let mut words = error.split_whitespace();
        let kind = words.next()?;
        let slot = words.next()?.parse().ok().filter(|&s| s < SLOTS)?;
        let to = words.next()?.to_owned();
        if words.next().is_some() {
            return None;
        }
        match kind {
            "MOVED" => Some(Redirect::Moved { slot, to }),
            "ASK" => Some(Redirect::Ask { slot, to }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use myriad_testkit::ClusterSetup;

    use super::*;
    use crate::engine::redis::keys;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's check value of its CRC16.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot_of(b"foo{bar}x"), slot_of(b"bar"));
        assert_eq!(
            slot_of(b"{user1000}.following"),
            slot_of(b"{user1000}.followers")
        );
        // An empty tag is no tag; the first `{` decides.
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
    }

    fn entry(first: i64, last: i64, port: i64) -> Value {
        let master = Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ]);
        Value::Array(vec![Value::Int(first), Value::Int(last), master])
    }

    #[test]
    fn a_map_names_each_slots_master_and_refuses_gaps_by_range() {
        let reply = Value::Array(vec![
            entry(5461, 10922, 2),
            entry(0, 5460, 1),
            entry(10923, 16383, 3),
        ]);
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        assert_eq!(map.master_of(0), "127.0.0.1:1");
        assert_eq!(map.master_of(5460), "127.0.0.1:1");
        assert_eq!(map.master_of(5461), "127.0.0.1:2");
        assert_eq!(map.master_of(16383), "127.0.0.1:3");
        assert_eq!(map.masters(), ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);

        let gaps = Value::Array(vec![entry(1, 5460, 1), entry(10923, 16382, 3)]);
        let error = SlotMap::from_cluster_slots(&gaps).unwrap_err();
        assert_eq!(
            error,
            SlotMapError::Uncovered(vec![(0, 0), (5461, 10922), (16383, 16383)])
        );
        assert_eq!(
            error.to_string(),
            "the Redis Cluster serves no slots 0-0, 5461-10922, 16383-16383"
        );
        let overlap = Value::Array(vec![entry(0, 9000, 1), entry(9000, 16383, 2)]);
        assert!(matches!(
            SlotMap::from_cluster_slots(&overlap),
            Err(SlotMapError::Malformed(_))
        ));
        let empty = SlotMap::from_cluster_slots(&Value::Array(Vec::new())).unwrap_err();
        assert_eq!(empty, SlotMapError::Uncovered(vec![(0, 16383)]));
    }

    #[test]
    fn redirections_are_read_from_their_error() {
        assert_eq!(
            Redirect::parse("MOVED 3999 127.0.0.1:6381"),
            Some(Redirect::Moved {
                slot: 3999,
                to: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            Redirect::parse("ASK 1 ::1:7000"),
            Some(Redirect::Ask {
                slot: 1,
                to: "::1:7000".into()
            })
        );
        for other in [
            "MOVED 16384 h:1",
            "MOVED x h:1",
            "READONLY no",
            "MOVED 1",
            "",
        ] {
            assert_eq!(Redirect::parse(other), None, "{other}");
        }
    }

    /// Against a real 3+3 cluster: the map from any node covers every
    /// slot with the three masters, each partition's slot (the slot of its
    /// shared keys) is served by the master the map names, and another
    /// master answers `-MOVED` to it, which reads back as that master.
    #[test]
    fn a_real_clusters_map_routes_every_partition_to_its_master() {
        let setup = ClusterSetup::start();
        let url = &setup.urls()[0];
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        let masters = map.masters();
        assert_eq!(masters.len(), 3, "{masters:?}");
        let port = |address: &str| address.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        for partition in 0..16 {
            let base = keys::base("p", partition);
            let [totals, ..] = keys::shared(&base);
            let slot = slot_of(totals.as_bytes());
            let owner = map.master_of(slot);
            let on_owner = setup.node(port(owner)).command(&["SET", &totals, "1"]);
            assert_eq!(on_owner.unwrap(), "+OK", "{totals} on {owner}");
            let other = masters.iter().find(|m| **m != owner).unwrap();
            let moved = setup
                .node(port(other))
                .command(&["SET", &totals, "1"])
                .unwrap();
            let redirect = Redirect::parse(moved.trim_start_matches('-'));
            assert_eq!(
                redirect,
                Some(Redirect::Moved {
                    slot,
                    to: owner.to_owned()
                }),
                "{totals} on {other}"
            );
        }
    }

    /// The publish script over a real 3+3 cluster, sent where the map
    /// routes each partition: it runs there (offsets 1 then 2 in one
    /// epoch, history kept: every key it touches is in its declared slot),
    /// and another master answers it with `-MOVED` to that one.
    #[test]
    fn the_publish_script_runs_on_its_partitions_master_in_a_real_cluster() {
        let setup = ClusterSetup::start();
        let connect = |address: &str| {
            redis::Client::open(format!("redis://{address}"))
                .unwrap()
                .get_connection()
                .unwrap()
        };
        let mut any = connect(setup.urls()[0].trim_start_matches("redis://"));
        let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut any).unwrap();
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        let script = redis::Script::new(crate::engine::redis::PUBLISH_SCRIPT);
        for master in map.masters() {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(crate::engine::redis::PUBLISH_SCRIPT)
                .query(&mut connect(master))
                .unwrap();
        }
        let epoch = "00000000000000e1";
        for partition in 0..6 {
            let base = keys::base("p", partition);
            let owner = map.master_of(slot_of(base.as_bytes()));
            let subject = format!("news.{partition}");
            let call = || {
                let publications = [(subject.as_str(), "hello", 10, 0)];
                crate::engine::redis::publish_call(&script, &base, 1 << 20, epoch, "", publications)
            };
            let mut con = connect(owner);
            for offset in 1..=2 {
                let reply: Vec<Value> = call().query(&mut con).unwrap();
                assert_eq!(reply[4], Value::BulkString(epoch.into()), "{base}");
                assert_eq!(reply[5], Value::Int(offset), "{base}");
            }
            let history = format!("{base}:h:{subject}");
            let kept: i64 = redis::cmd("LLEN").arg(&history).query(&mut con).unwrap();
            assert_eq!(kept, 2, "{history}");
            let other = map.masters().into_iter().find(|m| *m != owner).unwrap();
            let refused = call().query::<Value>(&mut connect(other)).unwrap_err();
            assert_eq!(refused.code(), Some("MOVED"), "{refused}");
        }
    }
}
