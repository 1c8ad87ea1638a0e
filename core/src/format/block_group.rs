//! `btrfs_block_group_item` (24 bytes), keyed (start, BLOCK_GROUP_ITEM, length).

use super::Le64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_block_group_item`: the body of a BLOCK_GROUP_ITEM, in the
/// extent tree or the block group tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct BlockGroupItem {
    /// Bytes of the block group allocated to extents.
    pub used: Le64,
    /// Object id of the chunk backing the group: always
    /// BTRFS_FIRST_CHUNK_TREE_OBJECTID (256).
    pub chunk_objectid: Le64,
    /// Type and profile bits (BTRFS_BLOCK_GROUP_*), equal to the chunk's
    /// `type`.
    pub flags: Le64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<super::BlockGroupItem>(), 24);
        let b: Vec<u8> = (0..24u8).collect();
        crate::format::roundtrip::<super::BlockGroupItem>(&b);
    }
}
