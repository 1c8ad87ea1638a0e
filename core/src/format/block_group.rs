//! `btrfs_block_group_item` (24 bytes), keyed (start, BLOCK_GROUP_ITEM, length).

use super::Le64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct BlockGroupItem {
    pub used: Le64,
    pub chunk_objectid: Le64,
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
