//! Inode items: reading, writing and making them, and the mode rules.

use crate::format::consts::*;
use crate::format::inode::{InodeItem, Timespec};
use crate::format::key::Key;
use crate::trans::{Store, TreeId};
use crate::{Error, Result};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Mask of the file type bits of `st_mode`.
pub const S_IFMT: u32 = 0o170000;
/// File type bits of a regular file.
pub const S_IFREG: u32 = 0o100000;
/// File type bits of a directory.
pub const S_IFDIR: u32 = 0o040000;
/// File type bits of a symbolic link.
pub const S_IFLNK: u32 = 0o120000;
/// File type bits of a FIFO.
pub const S_IFIFO: u32 = 0o010000;
/// File type bits of a character device.
pub const S_IFCHR: u32 = 0o020000;
/// File type bits of a block device.
pub const S_IFBLK: u32 = 0o060000;
/// File type bits of a Unix socket.
pub const S_IFSOCK: u32 = 0o140000;

/// Whether `mode` is a directory's.
pub fn is_dir(mode: u32) -> bool {
    mode & S_IFMT == S_IFDIR
}
/// Whether `mode` is a regular file's.
pub fn is_reg(mode: u32) -> bool {
    mode & S_IFMT == S_IFREG
}
/// Whether `mode` is a symbolic link's.
pub fn is_symlink(mode: u32) -> bool {
    mode & S_IFMT == S_IFLNK
}

/// Directory entry type (BTRFS_FT_*) of a mode (BTRFS_FT_UNKNOWN for none).
pub fn ftype_of_mode(mode: u32) -> u8 {
    crate::format::dir::ftype_of_mode(mode).unwrap_or(BTRFS_FT_UNKNOWN)
}

/// Key of the INODE_ITEM of `ino`: `(ino, INODE_ITEM, 0)`.
pub fn inode_key(ino: u64) -> Key {
    Key::new(ino, BTRFS_INODE_ITEM_KEY, 0)
}

/// The inode item of `ino` in subvolume `subvol`, `None` when it does not exist.
/// An item of the wrong size is reported as corruption.
pub fn get_inode(st: &mut Store, subvol: u64, ino: u64) -> Result<Option<InodeItem>> {
    let k = inode_key(ino);
    match st.with_item(TreeId::Tree(subvol), &k, |d| {
        InodeItem::read_from_bytes(d).ok()
    })? {
        Some(Some(i)) => Ok(Some(i)),
        Some(None) => Err(Error::corrupt_key_as(
            crate::CorruptKind::Item,
            "inode item size",
            0,
            k,
        )),
        None => Ok(None),
    }
}

/// What orphan cleanup did with one orphan item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanOutcome {
    /// No inode has the number: only the orphan item went.
    NoInode,
    /// The inode still has links (an interrupted fs-verity build, or an
    /// orphan item a kernel before 4.18 left for a truncate): its verity
    /// items (this many) and the orphan item went, nothing else.
    Linked(usize),
    /// An unlinked inode: deleted with every item and data reference.
    Deleted,
}

/// The orphan cleanup the kernel runs on a read-write mount
/// (`btrfs_orphan_cleanup`) for the orphan item of `ino` in `subvol`. One
/// rule for the mount and for repair: an unlinked inode is deleted with
/// its data; a linked one loses its fs-verity items (a build the crash
/// interrupted) and keeps its extents even past its size, as the kernel
/// keeps them; the orphan item goes in every case.
pub fn clean_orphan(st: &mut Store, subvol: u64, ino: u64) -> Result<OrphanOutcome> {
    let t = TreeId::Tree(subvol);
    let outcome = match get_inode(st, subvol, ino)? {
        None => OrphanOutcome::NoInode,
        Some(i) if i.nlink.get() == 0 => {
            crate::fs::extents::drop_inode_items(st, subvol, ino)?;
            OrphanOutcome::Deleted
        }
        Some(_) => {
            let verity = st.items_in(
                t,
                Key::new(ino, BTRFS_VERITY_DESC_ITEM_KEY, 0),
                Key::new(ino, BTRFS_VERITY_MERKLE_ITEM_KEY, u64::MAX),
            )?;
            for (k, _) in &verity {
                st.delete_item(t, k)?;
            }
            OrphanOutcome::Linked(verity.len())
        }
    };
    st.delete_item(
        t,
        &Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, ino),
    )?;
    Ok(outcome)
}

/// Change an inode item in place; false when the inode does not exist.
pub fn modify_inode(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    f: impl FnOnce(&mut InodeItem),
) -> Result<bool> {
    let k = inode_key(ino);
    match st.modify_item(
        TreeId::Tree(subvol),
        &k,
        |d| match InodeItem::mut_from_bytes(d) {
            Ok(i) => {
                f(i);
                true
            }
            Err(_) => false,
        },
    )? {
        Some(true) => Ok(true),
        Some(false) => Err(Error::corrupt_key_as(
            crate::CorruptKind::Item,
            "inode item size",
            0,
            k,
        )),
        None => Ok(false),
    }
}

/// Write the inode item of `ino` in `subvol`: inserted when missing, overwritten otherwise.
pub fn put_inode(st: &mut Store, subvol: u64, ino: u64, item: &InodeItem) -> Result<()> {
    st.update_item(TreeId::Tree(subvol), &inode_key(ino), item.as_bytes())
}

/// A new inode: one link, created in `transid` at `now`.
pub fn new_inode_item(
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    now: Timespec,
    transid: u64,
) -> InodeItem {
    let mut i = InodeItem::new_zeroed();
    i.generation.set(transid);
    i.transid.set(transid);
    i.nlink.set(1);
    i.uid.set(uid);
    i.gid.set(gid);
    i.mode.set(mode);
    i.rdev.set(rdev);
    i.atime = now;
    i.mtime = now;
    i.ctime = now;
    i.otime = now;
    i
}

/// A device number as the inode item's `rdev` holds it: the kernel's
/// own dev_t (fill_inode_item stores `i_rdev`, MKDEV: a 12-bit major
/// above a 20-bit minor), not the encoding stat(2) and mknod(2) use.
pub fn encode_dev(major: u32, minor: u32) -> u64 {
    (((major & 0xfff) << 20) | (minor & 0xf_ffff)) as u64
}

/// (major, minor) of an `rdev` (MAJOR and MINOR of the kernel's dev_t).
pub fn decode_dev(rdev: u64) -> (u32, u32) {
    let d = rdev as u32;
    (d >> 20, d & 0xf_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn dev_numbers_roundtrip() {
        for (a, b) in [(1, 3), (8, 17), (259, 70000)] {
            assert_eq!(decode_dev(encode_dev(a, b)), (a, b));
        }
        // What the kernel's mknod stored (btrfs inspect-internal
        // dump-tree of `mknod c 1 3` and `mknod b 7 200`).
        assert_eq!(encode_dev(1, 3), 1_048_579);
        assert_eq!(encode_dev(7, 200), 7_340_232);
    }
}
