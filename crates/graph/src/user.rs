//! User ids and follow edges.
//!
//! A user is a non-negative integer no larger than 2^53 − 1, the largest
//! integer every JSON reader (JavaScript's included) holds exactly. Seed
//! 004's dataset numbers users the same way. Integer ids keep the graph's
//! tables and indexes compact: a million users and fifteen million edges
//! is the dataset this crate is sized for.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// A user's id; see the module docs for its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UserId(u64);

/// Why a user id was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UserIdError {
    #[error("user id {0} is out of range (0 to 9007199254740991)")]
    OutOfRange(u128),
    #[error("user id {0:?} is not a decimal integer")]
    NotANumber(String),
}

impl UserId {
    /// The largest id: 2^53 − 1.
    pub const MAX: u64 = (1 << 53) - 1;

    pub fn new(id: u64) -> Result<UserId, UserIdError> {
        if id > Self::MAX {
            return Err(UserIdError::OutOfRange(id.into()));
        }
        Ok(UserId(id))
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// For stores: ids they hand back were checked when they went in.
    pub(crate) fn from_stored(id: i64) -> UserId {
        debug_assert!((0..=Self::MAX as i64).contains(&id));
        UserId(id as u64)
    }

    pub(crate) fn stored(self) -> i64 {
        self.0 as i64
    }
}

impl FromStr for UserId {
    type Err = UserIdError;

    fn from_str(text: &str) -> Result<UserId, UserIdError> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(UserIdError::NotANumber(text.chars().take(32).collect()));
        }
        match text.parse::<u128>() {
            Ok(id) if id <= u128::from(Self::MAX) => Ok(UserId(id as u64)),
            Ok(id) => Err(UserIdError::OutOfRange(id)),
            // More digits than even u128 holds.
            Err(_) => Err(UserIdError::OutOfRange(u128::MAX)),
        }
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// `follower` follows `followee`: what `followee` sends reaches `follower`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Edge {
    pub follower: UserId,
    pub followee: UserId,
}

impl Edge {
    pub fn new(follower: UserId, followee: UserId) -> Edge {
        Edge { follower, followee }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_within_the_json_safe_range() {
        assert_eq!("0".parse::<UserId>().unwrap().get(), 0);
        assert_eq!(
            "9007199254740991".parse::<UserId>().unwrap().get(),
            UserId::MAX
        );
        assert_eq!(
            "9007199254740992".parse::<UserId>(),
            Err(UserIdError::OutOfRange(9007199254740992))
        );
        assert!(matches!(
            "99999999999999999999999999999999999999999999".parse::<UserId>(),
            Err(UserIdError::OutOfRange(_))
        ));
        for bad in ["", "-1", "+1", "1.0", " 1", "0x10", "abc"] {
            assert!(
                matches!(bad.parse::<UserId>(), Err(UserIdError::NotANumber(_))),
                "{bad:?}"
            );
        }
        assert!(UserId::new(UserId::MAX + 1).is_err());
    }
}
