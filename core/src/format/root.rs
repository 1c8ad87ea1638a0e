//! `btrfs_root_item` (439 bytes; images from before 3.x store only the first
//! 239 bytes, up to `level`) and `btrfs_root_ref` (ROOT_REF / ROOT_BACKREF).

use super::inode::{InodeItem, Timespec};
use super::key::DiskKey;
use super::{Le16, Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RootItem {
    pub inode: InodeItem,
    pub generation: Le64,
    pub root_dirid: Le64,
    pub bytenr: Le64,
    pub byte_limit: Le64,
    pub bytes_used: Le64,
    pub last_snapshot: Le64,
    pub flags: Le64,
    pub refs: Le32,
    pub drop_progress: DiskKey,
    pub drop_level: u8,
    pub level: u8,
    pub generation_v2: Le64,
    pub uuid: [u8; 16],
    pub parent_uuid: [u8; 16],
    pub received_uuid: [u8; 16],
    pub ctransid: Le64,
    pub otransid: Le64,
    pub stransid: Le64,
    pub rtransid: Le64,
    pub ctime: Timespec,
    pub otime: Timespec,
    pub stime: Timespec,
    pub rtime: Timespec,
    pub reserved: [Le64; 8],
}

pub const ROOT_ITEM_SIZE: usize = 439;
/// Size of the legacy root item, which ends after `level`.
pub const ROOT_ITEM_LEGACY_SIZE: usize = 239;

impl RootItem {
    /// Parse a root item of either size; a legacy item is zero-extended, as
    /// the kernel's `btrfs_read_root_item` does.
    pub fn parse(data: &[u8]) -> Result<RootItem> {
        if data.len() < ROOT_ITEM_LEGACY_SIZE {
            return Err(Error::corrupt(
                format!(
                    "root item size {} smaller than {ROOT_ITEM_LEGACY_SIZE}",
                    data.len()
                ),
                0,
            ));
        }
        let mut buf = [0u8; ROOT_ITEM_SIZE];
        let n = data.len().min(ROOT_ITEM_SIZE);
        buf[..n].copy_from_slice(&data[..n]);
        RootItem::read_from_bytes(&buf).map_err(|_| Error::corrupt("root item", 0))
    }
    /// True when the v2 fields (uuids, transids, times) are meaningful.
    pub fn has_v2(&self) -> bool {
        self.generation_v2.get() == self.generation.get()
    }
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RootRef {
    pub dirid: Le64,
    pub sequence: Le64,
    pub name_len: Le16,
}

pub fn parse_root_ref(data: &[u8]) -> Result<(&RootRef, &[u8])> {
    let r: &RootRef = super::view(data, "root ref")?;
    let n = r.name_len.get() as usize;
    if data.len() != 18 + n {
        return Err(Error::corrupt(
            format!(
                "root ref name_len {n} does not fit item size {}",
                data.len()
            ),
            0,
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
