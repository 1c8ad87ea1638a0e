//! The filesystem layer: inodes, names, xattrs and file data on top of the
//! tree store. Each file rule lives here once (directory size, link
//! counts, the inline limit, dropping extents), and mkfs `--rootdir`, log
//! replay and the engine all use it.
//!
//! [`Filesystem`] is the mount: inodes and their runtime state, names,
//! reads and writes, the transaction's age ([`clock::Clock`]). Its jobs
//! apart from that are views: `Subvols` (subvolumes, snapshots, orphan
//! cleanup), `Writeback` (delayed allocation and ordered extents),
//! `FsyncPath` (an fsync's steps), `Xattrs` (extended attributes and
//! properties), `FileRanges` (fallocate, punch, zero, clone). Items on
//! disk are encoded in `format` and edited through `trans::Store`.

pub mod acl;
pub mod clock;
pub mod compress;
pub mod data;
mod dcache;
mod dirty;
pub mod extents;
mod file;
mod filesystem;
pub mod fsync;
mod icache;
pub mod inode;
pub mod names;
pub mod ops;
pub mod options;
mod pagecache;
mod props;
pub mod read;
pub mod rename;
pub mod subvol;
pub mod writeback;
pub mod xattr;

pub use extents::{MAX_EXTENT_SIZE, MAX_INLINE};
pub use file::FileRanges;
pub use file::{SYNC_RANGE_WAIT_AFTER, SYNC_RANGE_WAIT_BEFORE, SYNC_RANGE_WRITE};
pub use filesystem::{Creds, EngineStats, Filesystem, InodeRt, Loc, Switches, FS_TREE, ROOT_DIR};
pub use fsync::{FsyncLog, FsyncPath, FsyncTicket, LogAnswer, LogContext, LogSyncStep, NameChange};
pub use inode::ftype_of_mode;
pub use ops::Stat;
pub use options::MountOptions;
pub use props::{Xattrs, COMPRESSION};
pub use subvol::Subvols;
pub use writeback::Writeback;
