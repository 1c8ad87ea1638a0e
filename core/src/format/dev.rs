//! `btrfs_dev_item` (98 bytes; also inside the superblock) and
//! `btrfs_dev_extent` (48 bytes).

use super::{Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DevItem {
    pub devid: Le64,
    pub total_bytes: Le64,
    pub bytes_used: Le64,
    pub io_align: Le32,
    pub io_width: Le32,
    pub sector_size: Le32,
    pub type_: Le64,
    pub generation: Le64,
    pub start_offset: Le64,
    pub dev_group: Le32,
    pub seek_speed: u8,
    pub bandwidth: u8,
    pub uuid: [u8; 16],
    pub fsid: [u8; 16],
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DevExtent {
    pub chunk_tree: Le64,
    pub chunk_objectid: Le64,
    pub chunk_offset: Le64,
    pub length: Le64,
    pub chunk_tree_uuid: [u8; 16],
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<DevItem>(), 98);
        assert_eq!(core::mem::size_of::<DevExtent>(), 48);
        let b: Vec<u8> = (0..98u8).collect();
        crate::format::roundtrip::<DevItem>(&b);
    }
}
