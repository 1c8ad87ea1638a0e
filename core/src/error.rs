//! Typed errors of the engine. Every error caused by bytes read from disk is
//! `Corrupt` and names what was wrong, the logical block (or byte offset for
//! the superblock) and, where one applies, the key of the item.

use crate::format::key::Key;
use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("corrupt {what} at {}{}", Loc(*bytenr), KeySuffix(key))]
    Corrupt {
        what: String,
        bytenr: u64,
        key: Option<Key>,
    },
    /// The OS error is part of the message (not a separate source), so a
    /// binary printing the error chain shows it once.
    #[error("{context}: {err}")]
    Io { context: String, err: std::io::Error },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("not a btrfs image: {0}")]
    NotBtrfs(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

struct Loc(u64);
impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bytenr {}", self.0)
    }
}
struct KeySuffix<'a>(&'a Option<Key>);
impl fmt::Display for KeySuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(k) => write!(f, " key ({} {} {})", k.objectid, k.ty, k.offset),
            None => Ok(()),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn corrupt(what: impl Into<String>, bytenr: u64) -> Self {
        Error::Corrupt { what: what.into(), bytenr, key: None }
    }
    pub fn corrupt_key(what: impl Into<String>, bytenr: u64, key: Key) -> Self {
        Error::Corrupt { what: what.into(), bytenr, key: Some(key) }
    }
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), err: source }
    }
    /// Attach a block number and key to an item-level parse error that was
    /// raised without knowing where the item lives.
    pub fn at(self, bytenr: u64, key: Key) -> Self {
        match self {
            Error::Corrupt { what, .. } => Error::Corrupt { what, bytenr, key: Some(key) },
            e => e,
        }
    }
}
