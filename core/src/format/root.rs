//! `btrfs_root_item` (439 bytes; images from before 3.x store only the first
//! 239 bytes, up to `level`) and `btrfs_root_ref` (ROOT_REF / ROOT_BACKREF).

use super::inode::{InodeItem, Timespec};
use super::key::DiskKey;
use super::{Le16, Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_root_item`: where a tree's root node is and, for a subvolume,
/// its identity and history; keyed (tree id, ROOT_ITEM, offset) in the root
/// tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RootItem {
    /// Stub inode item; only its flags matter (BTRFS_INODE_ROOT_ITEM_INIT).
    pub inode: InodeItem,
    /// Generation of the root node (its header's `generation`).
    pub generation: Le64,
    /// Inode number of the subvolume's top directory: BTRFS_FIRST_FREE_OBJECTID
    /// (256) for fs trees, 0 for other trees.
    pub root_dirid: Le64,
    /// Logical address of the root node.
    pub bytenr: Le64,
    /// Size limit; unused, 0.
    pub byte_limit: Le64,
    /// Bytes of tree blocks the tree owns, a multiple of the node size.
    pub bytes_used: Le64,
    /// Transaction of the last snapshot of this tree; blocks not newer may be
    /// shared.
    pub last_snapshot: Le64,
    /// BTRFS_ROOT_SUBVOL_RDONLY, BTRFS_ROOT_SUBVOL_DEAD.
    pub flags: Le64,
    /// 1 while the tree is live, 0 once a deleted subvolume awaits cleaning.
    pub refs: Le32,
    /// Key where an interrupted drop of the tree (subvolume deletion) resumes;
    /// zero when none is under way.
    pub drop_progress: DiskKey,
    /// Level of the node `drop_progress` refers to.
    pub drop_level: u8,
    /// Level of the root node.
    pub level: u8,
    /// Copy of `generation` written by kernels that know the fields after it;
    /// when the two differ those fields are stale.
    pub generation_v2: Le64,
    /// Uuid of the subvolume.
    pub uuid: [u8; 16],
    /// Uuid of the subvolume this one was snapshotted from; zero if none.
    pub parent_uuid: [u8; 16],
    /// Uuid of the sent subvolume this one was received from (btrfs receive);
    /// zero if none.
    pub received_uuid: [u8; 16],
    /// Transaction of the last change to the subvolume's contents.
    pub ctransid: Le64,
    /// Transaction that created the subvolume.
    pub otransid: Le64,
    /// Transaction of the sent subvolume when it was sent (set by receive).
    pub stransid: Le64,
    /// Transaction in which it was received.
    pub rtransid: Le64,
    /// Time of the last change to the contents.
    pub ctime: Timespec,
    /// Creation time.
    pub otime: Timespec,
    /// Send time (set by receive).
    pub stime: Timespec,
    /// Receive time.
    pub rtime: Timespec,
    /// Reserved, zero.
    pub reserved: [Le64; 8],
}

/// Size of the current [`RootItem`] in bytes.
pub const ROOT_ITEM_SIZE: usize = 439;
/// Size of the legacy root item, which ends after `level`.
pub const ROOT_ITEM_LEGACY_SIZE: usize = 239;

impl RootItem {
    /// Parse a root item of either size; a legacy item is zero-extended, as
    /// the kernel's `btrfs_read_root_item` does.
    pub fn parse(data: &[u8]) -> Result<RootItem> {
        if data.len() < ROOT_ITEM_LEGACY_SIZE {
            return Err(Error::corrupt_item(
                format!(
                    "root item size {} smaller than {ROOT_ITEM_LEGACY_SIZE}",
                    data.len()
                ),
                0,
                None,
            ));
        }
        let mut buf = [0u8; ROOT_ITEM_SIZE];
        let n = data.len().min(ROOT_ITEM_SIZE);
        buf[..n].copy_from_slice(&data[..n]);
        RootItem::read_from_bytes(&buf).map_err(|_| Error::corrupt_item("root item", 0, None))
    }
    /// True when the v2 fields (uuids, transids, times) are meaningful.
    pub fn has_v2(&self) -> bool {
        self.generation_v2.get() == self.generation.get()
    }
}

/// `struct btrfs_root_ref`, head of ROOT_REF (parent, ROOT_REF, child) and
/// ROOT_BACKREF (child, ROOT_BACKREF, parent); `name_len` bytes of name follow.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RootRef {
    /// Inode number, in the parent subvolume, of the directory holding the
    /// entry.
    pub dirid: Le64,
    /// DIR_INDEX key offset of that entry.
    pub sequence: Le64,
    /// Length of the entry's name in bytes.
    pub name_len: Le16,
}

/// Split a ROOT_REF or ROOT_BACKREF body into head and name; the item must be
/// exactly as long as `name_len` says.
pub fn parse_root_ref(data: &[u8]) -> Result<(&RootRef, &[u8])> {
    let r: &RootRef = super::view(data, "root ref")?;
    let n = r.name_len.get() as usize;
    if data.len() != 18 + n {
        return Err(Error::corrupt_item(
            format!(
                "root ref name_len {n} does not fit item size {}",
                data.len()
            ),
            0,
            None,
        ));
    }
    Ok((r, &data[18..]))
}

/// A root item for a new tree (mkfs, a new subvolume, the quota tree):
/// its root directory's inode, generation, refs 1, and for a subvolume
/// its UUID with creation times.
pub fn new_root_item(
    now: u64,
    generation: u64,
    root_dirid: u64,
    uuid: Option<[u8; 16]>,
) -> RootItem {
    let mut r = RootItem::new_zeroed();
    r.inode = super::inode::dir_inode(0, 3, 0);
    r.inode.nlink.set(1);
    r.inode.mode.set(0o040755);
    r.inode.flags.set(0);
    r.generation.set(generation);
    r.generation_v2.set(generation);
    r.root_dirid.set(root_dirid);
    r.refs.set(1);
    if let Some(u) = uuid {
        r.uuid = u;
        r.ctransid.set(generation);
        r.otransid.set(generation);
        r.ctime = super::inode::now_ts(now);
        r.otime = super::inode::now_ts(now);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<RootItem>(), ROOT_ITEM_SIZE);
        assert_eq!(
            core::mem::offset_of!(RootItem, level),
            ROOT_ITEM_LEGACY_SIZE - 1
        );
        assert_eq!(core::mem::size_of::<RootRef>(), 18);
        let b: Vec<u8> = (0..ROOT_ITEM_SIZE as u32).map(|i| (i * 3) as u8).collect();
        crate::format::roundtrip::<RootItem>(&b);
        let legacy = RootItem::parse(&b[..ROOT_ITEM_LEGACY_SIZE]).unwrap();
        assert_eq!(legacy.level, b[ROOT_ITEM_LEGACY_SIZE - 1]);
        assert_eq!(legacy.generation_v2.get(), 0);
    }
}
