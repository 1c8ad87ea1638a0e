//! Typed errors of the engine. Every error caused by bytes read from disk is
//! `Corrupt` and names what was wrong, the logical block (or byte offset for
//! the superblock) and, where one applies, the key of the item.

use crate::format::key::Key;
use std::fmt;

/// What a tree block check found wrong (btrfs-progs' tree-checker and the
/// read-time checks of disk-io.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ProblemKind {
    /// The stored checksum does not match the block's contents.
    Checksum,
    /// A header field is wrong: block size, `bytenr` not the block's address,
    /// `fsid`.
    Header,
    /// A generation (of the block or of a pointer in it) newer than the
    /// filesystem's.
    Generation,
    /// The block's generation differs from what its parent's pointer records
    /// (`verify_parent_transid`): a lost or misdirected write.
    ParentTransid,
    /// The level is `BTRFS_MAX_LEVEL` or more, or not the one the parent
    /// expects.
    Level,
    /// The header owner is not the tree being read (`btrfs_check_eb_owner`).
    Owner,
    /// The first key differs from the parent's key for the block
    /// (`btrfs_verify_level_key`).
    FirstKey,
    /// Keys are not in strictly ascending order.
    KeyOrder,
    /// Items or pointers out of place: `nritems` beyond the block's capacity, a
    /// node with no pointers, item data not packed from the end of the leaf or
    /// outside its data area, a child pointer not sector aligned.
    ItemBounds,
    /// An item's body does not decode for its key type.
    ItemBody,
}

/// What kind of damage a [`Error::Corrupt`] is: callers decide on this,
/// never on the message. Each kind names what is damaged; [`Other`] is only
/// for damage no other kind describes.
///
/// [`Other`]: CorruptKind::Other
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum CorruptKind {
    /// A tree block failed one of the block checks.
    Block(ProblemKind),
    /// A block of an fsync log tree is damaged, unreadable or linked
    /// twice, or a log tree's root item is unusable (what `btrkit-replay
    /// --salvage` works around).
    LogBlock,
    /// The shape of the trees: a loop, a block referenced twice, a tree
    /// deeper than the format allows; or a walk that does not end (a loop in
    /// the directory hierarchy, the back references or the log's directory
    /// index ranges).
    Structure,
    /// The superblock: a copy that does not decode, fails its checksum or
    /// holds impossible values (sizes, levels, root addresses), and its
    /// `sys_chunk_array`.
    Superblock,
    /// One item on its own: a body that does not decode for its key type
    /// (wrong size, a name or ref running past the item's end, an unknown
    /// type byte) or whose fields contradict each other. Chunk items are
    /// [`ChunkMap`](Self::ChunkMap), device items and dev extents
    /// [`Device`](Self::Device).
    Item,
    /// Items that disagree with each other: an item another one requires is
    /// missing (an extent without its extent item, a name without its inode
    /// or inode ref, a dir item without its dir index, a tree the root tree
    /// does not hold), or references that do not add up (a count going
    /// negative, a back reference twice or absent).
    Reference,
    /// Address translation: a chunk item that does not decode or is
    /// impossible (no stripes, a bad length, a profile its stripes do not
    /// fit), chunks that overlap, a logical address or range no chunk maps
    /// or that crosses the end of a chunk or a stripe, a tree block address
    /// not sector aligned; and a chunk map rebuilt by `rescue chunk-recover`
    /// that does not read back.
    ChunkMap,
    /// Device records: a device item or dev extent that is missing, does
    /// not decode, is not sector aligned, lies on a device not in the set or
    /// does not fit the block group it backs.
    Device,
    /// Space accounting: an extent outside every block group, or claimed
    /// as free or allocated when it is not.
    Allocation,
    /// File data: a compressed extent that does not decompress or is
    /// shorter than its reference, data past the end of the address space,
    /// data without the checksums it needs.
    Data,
    /// Bytes no copy holds any more: every mirror of a range failed, or a
    /// RAID5/6 stripe its parity cannot rebuild.
    Lost,
    /// Damage no other kind describes.
    Other,
}

/// Every error of the engine. Callers decide on the variant (and on a
/// `Corrupt` error's [`CorruptKind`]), never on the message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bytes read from disk are wrong: damage, not a bug and not bad input.
    #[error("corrupt {what} at {}{}", Loc(*bytenr), KeySuffix(key))]
    Corrupt {
        /// What kind of damage, for callers to act on.
        kind: CorruptKind,
        /// What was wrong, for a human.
        what: String,
        /// Where: a logical address (of the tree block, or of the extent or
        /// range at fault) or, for a superblock, the byte offset of the copy;
        /// 0 when not known.
        bytenr: u64,
        /// The key of the item at fault, when an item is.
        key: Option<Key>,
    },
    /// The OS error is part of the message (not a separate source), so a
    /// binary printing the error chain shows it once.
    #[error("{context}: {err}")]
    Io {
        /// What was being done, such as `cannot open <path>`.
        context: String,
        /// The OS error.
        err: std::io::Error,
    },
    /// A valid filesystem, or request, using what this engine does not
    /// implement: an incompat feature, a multi-device profile, a checksum type.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Devices of a filesystem on several devices that were not given, or a
    /// read whose every copy lies on such a device.
    #[error("{what}")]
    MissingDevice {
        /// The devids not present (empty when the chunk tree could not be
        /// read to name them).
        devids: Vec<u64>,
        /// What is missing, for a human.
        what: String,
    },
    /// No free space to allocate from (ENOSPC).
    #[error("no space left: {0}")]
    NoSpace(String),
    /// The image holds no btrfs filesystem: no magic in the superblock copy
    /// read, or too small to hold the primary one.
    #[error("not a btrfs image: {0}")]
    NotBtrfs(String),
    /// A bad argument from the caller (EINVAL).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The engine's own state is not what it must be (a bug, not bad
    /// input and not damage on disk).
    #[error("internal error: {0}")]
    Internal(String),
    /// A file operation refused as the kernel refuses it (ENOENT, EEXIST,
    /// ENOTEMPTY, EISDIR...).
    #[error("{msg}: {}", errno_name(*errno))]
    Errno {
        /// The errno value (`libc::E*`).
        errno: i32,
        /// What was refused, for a human.
        msg: String,
    },
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

/// The result of every fallible engine call.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A [`CorruptKind::Other`] corruption at `bytenr`, with no key.
    pub fn corrupt(what: impl Into<String>, bytenr: u64) -> Self {
        Self::corrupt_as(CorruptKind::Other, what, bytenr)
    }
    /// A corruption of kind `kind` at `bytenr`, with no key.
    pub fn corrupt_as(kind: CorruptKind, what: impl Into<String>, bytenr: u64) -> Self {
        Error::Corrupt {
            kind,
            what: what.into(),
            bytenr,
            key: None,
        }
    }
    /// A [`CorruptKind::Other`] corruption of the item with `key` in the block
    /// at `bytenr`.
    pub fn corrupt_key(what: impl Into<String>, bytenr: u64, key: Key) -> Self {
        Self::corrupt_key_as(CorruptKind::Other, what, bytenr, key)
    }
    /// A corruption of kind `kind` of the item with `key` in the block at
    /// `bytenr`.
    pub fn corrupt_key_as(
        kind: CorruptKind,
        what: impl Into<String>,
        bytenr: u64,
        key: Key,
    ) -> Self {
        Error::Corrupt {
            kind,
            what: what.into(),
            bytenr,
            key: Some(key),
        }
    }
    /// A [`CorruptKind::Item`] corruption: an item that does not decode or
    /// contradicts itself, in the block at `bytenr` (0 when a decoder does not
    /// know it; [`at`](Self::at) adds it and the key later).
    pub fn corrupt_item(what: impl Into<String>, bytenr: u64, key: Option<Key>) -> Self {
        Error::Corrupt {
            kind: CorruptKind::Item,
            what: what.into(),
            bytenr,
            key,
        }
    }
    /// An [`Error::Internal`]: a broken invariant of the engine itself.
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
    /// An [`Error::Io`]: `source`, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            err: source,
        }
    }
    /// An [`Error::Errno`]: an operation refused with the errno the kernel
    /// would return.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::consts::*;
    use zerocopy::FromZeros;

    fn kind_of<T>(r: Result<T>) -> CorruptKind {
        match r {
            Err(e) => e
                .corrupt_kind()
                .unwrap_or_else(|| panic!("not a corruption: {e}")),
            Ok(_) => panic!("hostile input accepted"),
        }
    }

    /// Hostile inputs of each part of the engine come back as the kind
    /// that names what is damaged, not the catch-all.
    #[test]
    fn hostile_inputs_name_their_kind() {
        // Items that do not decode, with the key attached later by `at`.
        let root_key = Key::new(5, BTRFS_ROOT_ITEM_KEY, 0);
        assert_eq!(
            kind_of(crate::format::root::RootItem::parse(&[0u8; 100])),
            CorruptKind::Item
        );
        let e = crate::format::item::check(&Key::new(257, BTRFS_INODE_REF_KEY, 256), &[], 4)
            .unwrap_err()
            .at(4096, root_key);
        assert_eq!(e.corrupt_kind(), Some(CorruptKind::Item), "{e}");
        assert_eq!(
            kind_of(crate::format::extent::parse_extent_item(
                &Key::new(1 << 20, BTRFS_EXTENT_ITEM_KEY, 4096),
                &[0u8; 8]
            )),
            CorruptKind::Item
        );
        // A chunk item with no stripes, and an address no chunk maps.
        let chunk = [0u8; crate::format::chunk::CHUNK_ITEM_SIZE];
        assert_eq!(
            kind_of(crate::format::chunk::parse_chunk(&chunk)),
            CorruptKind::ChunkMap
        );
        assert_eq!(
            kind_of(crate::chunk::ChunkMap::new().pieces(1 << 20, 4096)),
            CorruptKind::ChunkMap
        );
        // A superblock with the magic and nothing else.
        let mut sb = crate::format::superblock::Superblock::new_zeroed();
        sb.magic = BTRFS_MAGIC.into();
        assert_eq!(
            kind_of(crate::image::check_superblock(
                &sb,
                1 << 30,
                &mut Vec::new()
            )),
            CorruptKind::Superblock
        );
        // An extent claimed where there is no block group.
        assert_eq!(
            kind_of(crate::alloc::Allocator::default().reserve(1 << 20, 4096)),
            CorruptKind::Allocation
        );
        // A tree block shorter than its header.
        assert_eq!(
            kind_of(crate::tree::node::Node::from_vec(1 << 20, vec![0u8; 16])),
            CorruptKind::Block(ProblemKind::Header)
        );
    }
}
