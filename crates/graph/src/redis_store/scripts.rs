//! The store's Lua scripts, put together from the files beside this one,
//! and the one shape of answer they all give.
//!
//! Each script opens with `#!lua` (Redis 7's flags line, no flags): Redis
//! then refuses a script that may write before running any of it when it
//! is out of memory or a read-only replica, instead of failing it at its
//! first write with earlier writes kept. `keys.lua` opens every script;
//! `guard.lua` opens the plain writes, `holds.lua` the steps of a bulk
//! change, and `limit.lua` (clause 3) is shared by the two that check it.
//! The scripts name keys they build from the prefix rather than passing
//! them in `KEYS`: fine on a standalone Redis, which is what this store
//! runs on (not Redis Cluster, whose slots need declared keys).

use std::sync::LazyLock;

use redis::Script;

use crate::store::StoreError;
use crate::user::UserId;

macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!("#!lua\n", $(include_str!(concat!("lua/", $file))),+)))
    };
}

/// One batch of users and edges (the plain path of every add).
pub(super) static FOLLOW: LazyLock<Script> =
    script!("keys.lua", "guard.lua", "limit.lua", "follow.lua");
/// One batch of unfollows.
pub(super) static UNFOLLOW: LazyLock<Script> = script!("keys.lua", "guard.lua", "unfollow.lua");
/// A bulk change's steps, in the order they run (`super::bulk`).
pub(super) static BEGIN: LazyLock<Script> = script!("keys.lua", "guard.lua", "begin.lua");
pub(super) static VALIDATE: LazyLock<Script> =
    script!("keys.lua", "holds.lua", "limit.lua", "validate.lua");
pub(super) static STAGE: LazyLock<Script> = script!("keys.lua", "holds.lua", "stage.lua");
pub(super) static COMMIT: LazyLock<Script> = script!("keys.lua", "holds.lua", "commit.lua");
pub(super) static APPLY: LazyLock<Script> = script!("keys.lua", "holds.lua", "apply.lua");
pub(super) static DISCARD: LazyLock<Script> = script!("keys.lua", "holds.lua", "discard.lua");
/// Finishing or discarding what a silent client's bulk change left.
pub(super) static TAKEOVER: LazyLock<Script> = script!("keys.lua", "takeover.lua");

/// A script's answer: `{code, values…}`, the codes of `keys.lua`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reply {
    /// Done; what it counted.
    Ok(Vec<i64>),
    /// Clause 3 refused the batch: this user would follow too many.
    Limit(UserId),
    /// Another client's bulk change holds the store.
    Busy,
    /// A bulk change whose client went silent must be finished or
    /// discarded before this write.
    Recover,
    /// This client's bulk change lost its lock to another client.
    Lost,
}

impl Reply {
    pub(super) fn decode(answer: Vec<i64>) -> Result<Reply, StoreError> {
        let odd = || StoreError::Backend(format!("a graph script answered {answer:?}"));
        let (&code, values) = answer.split_first().ok_or_else(odd)?;
        Ok(match code {
            0 => Reply::Ok(values.to_vec()),
            1 => {
                let user = values
                    .first()
                    .and_then(|&id| u64::try_from(id).ok())
                    .and_then(|id| UserId::new(id).ok())
                    .ok_or_else(odd)?;
                Reply::Limit(user)
            }
            2 => Reply::Busy,
            3 => Reply::Recover,
            4 => Reply::Lost,
            _ => return Err(odd()),
        })
    }
}

/// The `n`th value of an `Ok` answer, as a count.
pub(super) fn count(values: &[i64], n: usize) -> Result<u64, StoreError> {
    values
        .get(n)
        .and_then(|&v| u64::try_from(v).ok())
        .ok_or_else(|| StoreError::Backend(format!("a graph script answered {values:?}")))
}
