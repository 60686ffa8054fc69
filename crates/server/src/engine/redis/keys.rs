//! The engine's key layout in Redis: the partition a subject belongs to and
//! the names of its keys and channel. Below the scripts' callers, which
//! all build names here; lib.lua holds the same layout from the other side.
//!
//! A partition is the group of subjects whose keys one script may touch
//! together: a publish run of several subjects, the byte budget evicting
//! another subject's oldest entry, the sweep. Every key and the channel of
//! a partition start with its *base*, `<prefix>:{<partition>}`, whose hash
//! tag puts all of them in one Redis Cluster slot: Redis hashes the first
//! `{…}` of a name, which is the partition's as long as the prefix holds
//! no brace (the config refuses one). The partition's
//! shared keys ([`SHARED`]) are the scripts' `KEYS[]`, so a script's slot
//! is declared and every key it makes in Lua from the same base lies in it.
//! Today a partition is one configured instance: the ring's choice.

use super::ring;

/// A partition's keys shared by its subjects, as the scripts take them in
/// `KEYS[1..=3]` (lib.lua): the totals, the oldest-entry index and the
/// expiry index.
pub const SHARED: [&str; 3] = ["totals", "oldest", "expiry"];

/// The partition of `subject` among `partitions`.
pub fn partition_of(subject: &str, partitions: usize) -> usize {
    ring::instance_of(subject, partitions)
}

/// What every key and channel of `partition` starts with, hash tag included.
pub fn base(prefix: &str, partition: usize) -> String {
    format!("{prefix}:{{{partition}}}")
}

/// The shared keys of the partition whose base is `base`, in [`SHARED`]'s
/// order.
pub fn shared(base: &str) -> [String; 3] {
    SHARED.map(|name| format!("{base}:{name}"))
}

/// The channel carrying `subject`'s publications, under its partition's
/// `base`.
pub fn channel(base: &str, subject: &str) -> String {
    format!("{base}:c:{subject}")
}

/// The subject a channel of this engine (under `prefix`) carries, or `None`
/// for a name that is not one.
pub fn subject_of<'a>(prefix: &str, channel: &'a [u8]) -> Option<&'a str> {
    let rest = channel
        .strip_prefix(prefix.as_bytes())?
        .strip_prefix(b":{")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let subject = rest[digits..].strip_prefix(b"}:c:")?;
    std::str::from_utf8(subject).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of `key` Redis Cluster hashes (its hash tag rule).
    fn hashed(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn a_partitions_keys_and_channels_hash_alike() {
        for prefix in ["myriad", "a:b"] {
            for partition in [0, 7, 15] {
                let base = base(prefix, partition);
                let names = [
                    format!("{base}:s:news"),
                    format!("{base}:h:{{other}}"),
                    format!("{base}:pn:news:node-1"),
                    channel(&base, "{tagged}"),
                ];
                let [totals, oldest, expiry] = shared(&base);
                let tag = hashed(&totals);
                for name in names.iter().chain([&oldest, &expiry]) {
                    assert_eq!(hashed(name), tag, "{name} vs {totals}");
                }
            }
        }
        assert_ne!(hashed(&base("myriad", 0)), hashed(&base("myriad", 1)));
    }

    #[test]
    fn channels_read_back_as_their_subject() {
        for subject in ["news", "", "a:{1}:c:b", "ünï"] {
            let name = channel(&base("p", 12), subject);
            assert_eq!(subject_of("p", name.as_bytes()), Some(subject));
        }
        assert_eq!(subject_of("p", b"p:c:news"), None);
        assert_eq!(subject_of("p", b"p:{}:c:news"), None);
        assert_eq!(subject_of("q", b"p:{0}:c:news"), None);
        assert_eq!(subject_of("p", b"p:{0}:s:news"), None);
    }

    #[test]
    fn partitions_follow_the_ring() {
        for i in 0..100 {
            let s = format!("user.{i}");
            assert_eq!(partition_of(&s, 4), ring::instance_of(&s, 4));
        }
    }
}
