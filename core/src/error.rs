//! Typed errors of the engine. Every error caused by bytes read from disk is
//! `Corrupt` and names what was wrong, the logical block (or byte offset for
//! the superblock) and, where one applies, the key of the item.

use crate::format::key::Key;
use std::fmt;

/// What a tree block check found wrong (btrfs-progs' tree-checker and the
/// read-time checks of disk-io.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ProblemKind {
    Checksum,
    Header,
    ParentTransid,
    Level,
    Owner,
    FirstKey,
    KeyOrder,
    ItemBounds,
    ItemBody,
}

/// What kind of damage a [`Error::Corrupt`] is: callers decide on this,
/// never on the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum CorruptKind {
    /// A tree block failed one of the block checks.
    Block(ProblemKind),
    /// A block of an fsync log tree is damaged, unreadable or linked
    /// twice (what `btrkit-replay --salvage` works around).
    LogBlock,
    /// The shape of the trees: a loop, a block referenced twice, a tree
    /// deeper than the format allows.
    Structure,
    /// The superblock.
    Superblock,
    /// An item, or anything else read from disk.
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("corrupt {what} at {}{}", Loc(*bytenr), KeySuffix(key))]
    Corrupt {
        kind: CorruptKind,
        what: String,
        bytenr: u64,
        key: Option<Key>,
    },
    /// The OS error is part of the message (not a separate source), so a
    /// binary printing the error chain shows it once.
    #[error("{context}: {err}")]
    Io {
        context: String,
        err: std::io::Error,
    },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("not a btrfs image: {0}")]
    NotBtrfs(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The engine's own state is not what it must be (a bug, not bad
    /// input and not damage on disk).
    #[error("internal error: {0}")]
    Internal(String),
    /// A file operation refused as the kernel refuses it (ENOENT, EEXIST,
    /// ENOTEMPTY, EISDIR...).
    #[error("{msg}: {}", errno_name(*errno))]
    Errno { errno: i32, msg: String },
}

/// The symbolic name and text of an errno value.
pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EMLINK => "EMLINK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        libc::E2BIG => "E2BIG",
        libc::ERANGE => "ERANGE",
        _ => "",
    };
    let text = std::io::Error::from_raw_os_error(e).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    if name.is_empty() {
        text
    } else {
        format!("{name} ({text})")
    }
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
        Self::corrupt_as(CorruptKind::Other, what, bytenr)
    }
    pub fn corrupt_as(kind: CorruptKind, what: impl Into<String>, bytenr: u64) -> Self {
        Error::Corrupt {
            kind,
            what: what.into(),
            bytenr,
            key: None,
        }
    }
    pub fn corrupt_key(what: impl Into<String>, bytenr: u64, key: Key) -> Self {
        Error::Corrupt {
            kind: CorruptKind::Other,
            what: what.into(),
            bytenr,
            key: Some(key),
        }
    }
    pub fn internal(what: impl Into<String>) -> Self {
        Error::Internal(what.into())
    }
    /// The kind of damage, for a `Corrupt` error.
    pub fn corrupt_kind(&self) -> Option<CorruptKind> {
        match self {
            Error::Corrupt { kind, .. } => Some(*kind),
            _ => None,
        }
    }
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            err: source,
        }
    }
    pub fn errno(errno: i32, msg: impl Into<String>) -> Self {
        Error::Errno {
            errno,
            msg: msg.into(),
        }
    }
    /// The errno a system call would return for this error.
    pub fn as_errno(&self) -> i32 {
        match self {
            Error::Errno { errno, .. } => *errno,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::Invalid(_) => libc::EINVAL,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Io { err, .. } => err.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }
    /// Attach a block number and key to an item-level parse error that was
    /// raised without knowing where the item lives.
    pub fn at(self, bytenr: u64, key: Key) -> Self {
        match self {
            Error::Corrupt { kind, what, .. } => Error::Corrupt {
                kind,
                what,
                bytenr,
                key: Some(key),
            },
            e => e,
        }
    }
}
