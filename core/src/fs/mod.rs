//! The filesystem layer: inodes, names, xattrs and file data on top of the
//! tree store. Each file rule lives here once (directory size, link
//! counts, the inline limit, dropping extents), and mkfs `--rootdir`, log
//! replay and the engine all use it.

pub mod data;
pub mod extents;
pub mod inode;
pub mod names;
pub mod xattr;

pub use extents::{MAX_EXTENT_SIZE, MAX_INLINE};
pub use inode::ftype_of_mode;
