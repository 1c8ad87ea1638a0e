//! `struct btrfs_header` (101 bytes), leaf `struct btrfs_item` (25 bytes) and
//! node `struct btrfs_key_ptr` (33 bytes). Item offsets in a leaf count from
//! the end of the header.

use super::consts::*;
use super::key::DiskKey;
use super::{Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_header`, at the start of every tree block (node or leaf).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Header {
    /// Checksum of the block from `fsid` to its end; `csum_type` sets how many
    /// bytes are used.
    pub csum: [u8; BTRFS_CSUM_SIZE],
    /// Filesystem id: the fsid, or `metadata_uuid` with METADATA_UUID.
    pub fsid: [u8; BTRFS_FSID_SIZE],
    /// Logical address of this block; must equal where it was read from.
    pub bytenr: Le64,
    /// BTRFS_HEADER_FLAG_* in the low bits, the backref revision in the top
    /// byte.
    pub flags: Le64,
    /// Uuid of the chunk tree.
    pub chunk_tree_uuid: [u8; BTRFS_UUID_SIZE],
    /// Transaction that wrote the block.
    pub generation: Le64,
    /// Id of the tree the block belongs to (for shared blocks, the tree that
    /// allocated it).
    pub owner: Le64,
    /// Number of items (leaf) or key pointers (node).
    pub nritems: Le32,
    /// Level of the block: 0 for a leaf, otherwise a node.
    pub level: u8,
}

/// Size of [`Header`] in bytes.
pub const HEADER_SIZE: usize = 101;
/// Size of a leaf's [`Item`] in bytes.
pub const ITEM_SIZE: usize = 25;
/// Size of a node's [`KeyPtr`] in bytes.
pub const KEY_PTR_SIZE: usize = 33;

impl Header {
    /// Header flags without the backref revision in the top byte.
    pub fn flag_bits(&self) -> u64 {
        self.flags.get() & ((1u64 << BTRFS_BACKREF_REV_SHIFT) - 1)
    }
    /// The backref revision from the top byte of `flags`:
    /// BTRFS_MIXED_BACKREF_REV, or 0 for blocks from before 2.6.31.
    pub fn backref_rev(&self) -> u8 {
        (self.flags.get() >> BTRFS_BACKREF_REV_SHIFT) as u8
    }
}

/// `struct btrfs_item`: one slot of a leaf, in key order after the header; the
/// data lives at the leaf's end.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Item {
    /// The item's key.
    pub key: DiskKey,
    /// Offset of the item's data, counted from the end of the header.
    pub offset: Le32,
    /// Size of the item's data in bytes.
    pub size: Le32,
}

/// `struct btrfs_key_ptr`: one child pointer of a node.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct KeyPtr {
    /// First key of the child's subtree.
    pub key: DiskKey,
    /// Logical address of the child block.
    pub blockptr: Le64,
    /// Generation of the child; must equal its header's `generation`.
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
