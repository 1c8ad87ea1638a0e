//! `btrfs_dev_item` (98 bytes; also inside the superblock) and
//! `btrfs_dev_extent` (48 bytes).

use super::{Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_dev_item`: one device of the filesystem, keyed (DEV_ITEMS,
/// DEV_ITEM, devid) in the chunk tree; the superblock holds the item of its own
/// device.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DevItem {
    /// Device id, unique in the filesystem; the key offset.
    pub devid: Le64,
    /// Size of the device usable by the filesystem, in bytes.
    pub total_bytes: Le64,
    /// Bytes of the device allocated to dev extents.
    pub bytes_used: Le64,
    /// Optimal I/O alignment in bytes (mkfs writes the sector size).
    pub io_align: Le32,
    /// Optimal I/O width in bytes (mkfs writes the sector size).
    pub io_width: Le32,
    /// Minimal I/O size in bytes (the filesystem's sector size).
    pub sector_size: Le32,
    /// Device type, for future allocation policy; 0. C's `type`.
    pub type_: Le64,
    /// Expected generation of the device; unused, 0.
    pub generation: Le64,
    /// Start of the usable area for stripe alignment; unused, 0.
    pub start_offset: Le64,
    /// Grouping hint for allocation; unused, 0.
    pub dev_group: Le32,
    /// Seek speed hint, 0-100; unused, 0.
    pub seek_speed: u8,
    /// Bandwidth hint, 0-100; unused, 0.
    pub bandwidth: u8,
    /// Uuid of the device, as in its stripes' `dev_uuid`.
    pub uuid: [u8; 16],
    /// Filesystem the device belongs to: the fsid, or `metadata_uuid` when
    /// METADATA_UUID is set (a seed device keeps its seed's).
    pub fsid: [u8; 16],
}

/// `struct btrfs_dev_extent`: a physical range of a device given to a chunk,
/// keyed (devid, DEV_EXTENT, physical offset) in the dev tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DevExtent {
    /// Tree holding the chunk: BTRFS_CHUNK_TREE_OBJECTID (3).
    pub chunk_tree: Le64,
    /// Object id of the chunk's key: BTRFS_FIRST_CHUNK_TREE_OBJECTID (256).
    pub chunk_objectid: Le64,
    /// Logical start of the chunk (its CHUNK_ITEM key offset).
    pub chunk_offset: Le64,
    /// Length of the range on the device, in bytes.
    pub length: Le64,
    /// Uuid of the chunk tree (`btrfs_header.chunk_tree_uuid`).
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
