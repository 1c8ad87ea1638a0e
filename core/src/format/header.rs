//! `struct btrfs_header` (101 bytes), leaf `struct btrfs_item` (25 bytes) and
//! node `struct btrfs_key_ptr` (33 bytes). Item offsets in a leaf count from
//! the end of the header.

use super::consts::*;
use super::key::DiskKey;
use super::{Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Header {
    pub csum: [u8; BTRFS_CSUM_SIZE],
    pub fsid: [u8; BTRFS_FSID_SIZE],
    pub bytenr: Le64,
    pub flags: Le64,
    pub chunk_tree_uuid: [u8; BTRFS_UUID_SIZE],
    pub generation: Le64,
    pub owner: Le64,
    pub nritems: Le32,
    pub level: u8,
}

pub const HEADER_SIZE: usize = 101;
pub const ITEM_SIZE: usize = 25;
pub const KEY_PTR_SIZE: usize = 33;

impl Header {
    /// Header flags without the backref revision in the top byte.
    pub fn flag_bits(&self) -> u64 {
        self.flags.get() & ((1u64 << BTRFS_BACKREF_REV_SHIFT) - 1)
    }
    pub fn backref_rev(&self) -> u8 {
        (self.flags.get() >> BTRFS_BACKREF_REV_SHIFT) as u8
    }
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Item {
    pub key: DiskKey,
    pub offset: Le32,
    pub size: Le32,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct KeyPtr {
    pub key: DiskKey,
    pub blockptr: Le64,
    pub generation: Le64,
}

/// Most items a leaf of `nodesize` can hold (each item needs its header).
pub fn max_leaf_items(nodesize: u32) -> usize {
    (nodesize as usize - HEADER_SIZE) / ITEM_SIZE
}
/// Most pointers a node of `nodesize` can hold.
pub fn max_node_ptrs(nodesize: u32) -> usize {
    (nodesize as usize - HEADER_SIZE) / KEY_PTR_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};
    #[test]
    fn layout_and_roundtrip() {
        assert_eq!(size_of::<Header>(), HEADER_SIZE);
        assert_eq!(size_of::<Item>(), ITEM_SIZE);
        assert_eq!(size_of::<KeyPtr>(), KEY_PTR_SIZE);
        assert_eq!(offset_of!(Header, bytenr), 0x30);
        assert_eq!(offset_of!(Header, generation), 0x50);
        assert_eq!(offset_of!(Header, nritems), 0x60);
        assert_eq!(offset_of!(Header, level), 0x64);
        let b: Vec<u8> = (0..HEADER_SIZE as u32).map(|i| (i * 13) as u8).collect();
        crate::format::roundtrip::<Header>(&b);
        let b: Vec<u8> = (0..KEY_PTR_SIZE as u32).map(|i| (i * 5) as u8).collect();
        crate::format::roundtrip::<KeyPtr>(&b);
        let b: Vec<u8> = (0..ITEM_SIZE as u32).map(|i| (i * 3) as u8).collect();
        crate::format::roundtrip::<Item>(&b);
    }
}
