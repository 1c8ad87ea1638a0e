//! Free space tree: `btrfs_free_space_info` per block group, then either
//! FREE_SPACE_EXTENT items (empty, the key is the range) or FREE_SPACE_BITMAP
//! items (one bit per sector, the key is the range covered).
//!
//! Free space cache (v1): a `btrfs_free_space_header` item in the root tree
//! per block group, key (FREE_SPACE_OBJECTID, 0, block group start), names
//! an inode of the root tree whose file data is the cache: page 0 starts
//! with one crc32c per page and the generation, then
//! `btrfs_free_space_entry` records packed page by page, then one page per
//! bitmap entry.

use super::key::DiskKey;
use super::{Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_free_space_info`, keyed (bg start, FREE_SPACE_INFO, bg length)
/// in the free space tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FreeSpaceInfo {
    /// Number of free extents in the block group (FREE_SPACE_EXTENT items, or
    /// runs of set bits in its bitmaps).
    pub extent_count: Le32,
    /// BTRFS_FREE_SPACE_USING_BITMAPS when the group is described by bitmaps.
    pub flags: Le32,
}

/// `struct btrfs_free_space_header` of space cache v1, keyed (FREE_SPACE, 0, bg
/// start) in the root tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FreeSpaceHeader {
    /// Key of the cache inode's INODE_ITEM in the root tree.
    pub location: DiskKey,
    /// Generation the cache was written in; it must match the one in the cache
    /// file.
    pub generation: Le64,
    /// Number of `btrfs_free_space_entry` records in the file, bitmap entries
    /// included.
    pub num_entries: Le64,
    /// Number of bitmap entries, and of bitmap pages after the entries.
    pub num_bitmaps: Le64,
}

/// `struct btrfs_free_space_entry`, one record of a v1 cache file.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FreeSpaceEntry {
    /// Logical start of the free extent, or of the range a bitmap covers.
    pub offset: Le64,
    /// Length of the free extent, or free bytes in the bitmap.
    pub bytes: Le64,
    /// [`BTRFS_FREE_SPACE_EXTENT`] or [`BTRFS_FREE_SPACE_BITMAP`]; C's `type`.
    pub type_: u8,
}

/// `btrfs_free_space_entry` type of a free extent.
pub const BTRFS_FREE_SPACE_EXTENT: u8 = 1;
/// `btrfs_free_space_entry` type of a bitmap (its page follows the entries).
pub const BTRFS_FREE_SPACE_BITMAP: u8 = 2;
/// Mode of every free space cache inode: a regular file, 0600.
pub const FREE_SPACE_CACHE_INODE_MODE: u32 = 0o100600;

/// Bits set in a free-space bitmap item, each one a free sector.
pub fn bitmap_ranges(bitmap: &[u8], start: u64, sectorsize: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let nbits = bitmap.len() * 8;
    let mut i = 0;
    while i < nbits {
        if bitmap[i / 8] & (1 << (i % 8)) != 0 {
            let s = i;
            while i < nbits && bitmap[i / 8] & (1 << (i % 8)) != 0 {
                i += 1;
            }
            out.push((start + s as u64 * sectorsize, (i - s) as u64 * sectorsize));
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout_and_bits() {
        assert_eq!(core::mem::size_of::<FreeSpaceInfo>(), 8);
        assert_eq!(core::mem::size_of::<FreeSpaceHeader>(), 41);
        assert_eq!(core::mem::size_of::<FreeSpaceEntry>(), 17);
        let raw: Vec<u8> = (0..41).collect();
        crate::format::roundtrip::<FreeSpaceHeader>(&raw);
        crate::format::roundtrip::<FreeSpaceEntry>(&raw[..17]);
        crate::format::roundtrip::<FreeSpaceInfo>(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            bitmap_ranges(&[0b0000_0110, 0x80], 1000, 10),
            vec![(1010, 20), (1150, 10)]
        );
    }
}
