//! `btrfs_chunk` (48 bytes) followed by `num_stripes` `btrfs_stripe` (32
//! bytes each), in the chunk tree and in the superblock's sys_chunk_array.

use super::{Le16, Le32, Le64};
use crate::CorruptKind;
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_chunk` up to `sub_stripes`: the head of a CHUNK_ITEM, mapping
/// the logical range (key offset, `length`) to its stripes. The first stripe,
/// which C embeds, is parsed as part of the [`Stripe`] array.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ChunkItem {
    /// Logical size of the chunk in bytes.
    pub length: Le64,
    /// Tree that owns the chunk's block group: BTRFS_EXTENT_TREE_OBJECTID (2).
    pub owner: Le64,
    /// Bytes per stripe unit before moving to the next device:
    /// BTRFS_STRIPE_LEN.
    pub stripe_len: Le64,
    /// Type and profile bits (BTRFS_BLOCK_GROUP_*); C's `type`.
    pub type_: Le64,
    /// Optimal I/O alignment in bytes (mkfs writes the stripe length).
    pub io_align: Le32,
    /// Optimal I/O width in bytes (mkfs writes the stripe length).
    pub io_width: Le32,
    /// Minimal I/O size in bytes: the filesystem's sector size.
    pub sector_size: Le32,
    /// Number of [`Stripe`] records after the head; at least 1.
    pub num_stripes: Le16,
    /// Copies per stripe set: 2 for RAID10; other profiles ignore it (the
    /// kernel writes 1).
    pub sub_stripes: Le16,
}

/// `struct btrfs_stripe`: where one stripe of a chunk lives.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Stripe {
    /// Device holding the stripe.
    pub devid: Le64,
    /// Physical byte offset of the stripe on that device.
    pub offset: Le64,
    /// Uuid of that device (`btrfs_dev_item.uuid`).
    pub dev_uuid: [u8; 16],
}

/// Size of [`ChunkItem`] in bytes: `sizeof(struct btrfs_chunk)` less its
/// embedded stripe.
pub const CHUNK_ITEM_SIZE: usize = 48;
/// Size of [`Stripe`] (`struct btrfs_stripe`) in bytes.
pub const STRIPE_SIZE: usize = 32;

/// Split a chunk item into its head and stripes; the item must be exactly
/// as long as `num_stripes` says.
pub fn parse_chunk(data: &[u8]) -> Result<(&ChunkItem, &[Stripe])> {
    let c: &ChunkItem = super::view(data, "chunk item")?;
    let n = c.num_stripes.get() as usize;
    if n == 0 {
        return Err(Error::corrupt_as(
            CorruptKind::ChunkMap,
            "chunk item with zero stripes",
            0,
        ));
    }
    let want = CHUNK_ITEM_SIZE + n * STRIPE_SIZE;
    if data.len() < want {
        return Err(Error::corrupt_as(
            CorruptKind::ChunkMap,
            format!(
                "chunk item of {} bytes holds fewer than its {n} stripes",
                data.len()
            ),
            0,
        ));
    }
    let stripes = <[Stripe]>::ref_from_bytes(&data[CHUNK_ITEM_SIZE..want])
        .map_err(|_| Error::corrupt_as(CorruptKind::ChunkMap, "chunk stripes", 0))?;
    Ok((c, stripes))
}

/// Every way a chunk item breaks the rules the kernel's tree checker
/// enforces (btrfs_check_chunk_valid), for a chunk at `logical` of a
/// filesystem with `sectorsize`; empty when the chunk is valid.
pub fn chunk_problems(
    c: &ChunkItem,
    logical: u64,
    sectorsize: u32,
    mixed_groups: bool,
) -> Vec<String> {
    use super::consts::*;
    let mut out = Vec::new();
    let (length, stripe_len, ty) = (c.length.get(), c.stripe_len.get(), c.type_.get());
    let (num, sub) = (c.num_stripes.get(), c.sub_stripes.get());
    let profile = ty & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    // (ncopies, nparity) of each profile.
    let (ncopies, nparity) = match profile {
        BTRFS_BLOCK_GROUP_RAID1 | BTRFS_BLOCK_GROUP_DUP | BTRFS_BLOCK_GROUP_RAID10 => (2, 0),
        BTRFS_BLOCK_GROUP_RAID1C3 => (3, 0),
        BTRFS_BLOCK_GROUP_RAID1C4 => (4, 0),
        BTRFS_BLOCK_GROUP_RAID5 => (1, 1),
        BTRFS_BLOCK_GROUP_RAID6 => (1, 2),
        _ => (1, 0),
    };
    if num == 0 {
        out.push("num_stripes is 0".to_string());
    } else if num < ncopies {
        out.push(format!(
            "num_stripes {num} below the profile's {ncopies} copies"
        ));
    }
    if nparity > 0 && num == nparity {
        out.push(format!("num_stripes {num} equals the parity stripes"));
    }
    let ss = sectorsize as u64;
    if ss == 0 || !logical.is_multiple_of(ss) {
        out.push(format!(
            "logical {logical} not aligned to the sector size {sectorsize}"
        ));
    }
    if c.sector_size.get() != sectorsize {
        out.push(format!(
            "sector_size {} differs from the filesystem's {sectorsize}",
            c.sector_size.get()
        ));
    }
    if length == 0 || ss == 0 || length % ss != 0 {
        out.push(format!("invalid length {length}"));
    }
    if logical.checked_add(length).is_none() {
        out.push(format!("logical {logical} + length {length} overflows"));
    }
    if stripe_len != BTRFS_STRIPE_LEN {
        out.push(format!(
            "stripe_len {stripe_len}, must be {BTRFS_STRIPE_LEN}"
        ));
    }
    if length >= (u32::MAX as u64) << 16 {
        out.push(format!("length {length} too large"));
    }
    if ty & !(BTRFS_BLOCK_GROUP_TYPE_MASK | BTRFS_BLOCK_GROUP_PROFILE_MASK) != 0 {
        out.push(format!(
            "unknown type bits 0x{:x}",
            ty & !(BTRFS_BLOCK_GROUP_TYPE_MASK | BTRFS_BLOCK_GROUP_PROFILE_MASK)
        ));
    }
    if profile.count_ones() > 1 {
        out.push(format!("more than one profile bit: 0x{profile:x}"));
    }
    if ty & BTRFS_BLOCK_GROUP_TYPE_MASK == 0 {
        out.push("no data/metadata/system type".to_string());
    }
    if ty & BTRFS_BLOCK_GROUP_SYSTEM != 0
        && ty & (BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DATA) != 0
    {
        out.push(format!("system chunk also data or metadata: 0x{ty:x}"));
    }
    if !mixed_groups && ty & BTRFS_BLOCK_GROUP_METADATA != 0 && ty & BTRFS_BLOCK_GROUP_DATA != 0 {
        out.push(format!(
            "mixed data and metadata without the mixed_groups feature: 0x{ty:x}"
        ));
    }
    let stripes_ok = match profile {
        BTRFS_BLOCK_GROUP_RAID0 => true,
        BTRFS_BLOCK_GROUP_RAID10 => sub == 2,
        BTRFS_BLOCK_GROUP_RAID1 => num == 2,
        BTRFS_BLOCK_GROUP_RAID1C3 => num == 3,
        BTRFS_BLOCK_GROUP_RAID1C4 => num == 4,
        BTRFS_BLOCK_GROUP_RAID5 => num >= 2,
        BTRFS_BLOCK_GROUP_RAID6 => num >= 3,
        BTRFS_BLOCK_GROUP_DUP => num == 2,
        0 => num == 1,
        _ => true,
    };
    if profile.count_ones() <= 1 && !stripes_ok {
        out.push(format!(
            "num_stripes:sub_stripes {num}:{sub} invalid for profile 0x{profile:x}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<ChunkItem>(), CHUNK_ITEM_SIZE);
        assert_eq!(core::mem::size_of::<Stripe>(), STRIPE_SIZE);
        let mut b: Vec<u8> = (0..(48 + 64) as u32).map(|i| i as u8).collect();
        b[44] = 2;
        b[45] = 0;
        let (c, s) = parse_chunk(&b).unwrap();
        assert_eq!(c.num_stripes.get(), 2);
        assert_eq!(s.len(), 2);
        crate::format::roundtrip::<ChunkItem>(&b[..48]);
        assert!(parse_chunk(&b[..100]).is_err());
    }

    #[test]
    fn chunk_rules() {
        use crate::format::consts::*;
        let mut c = ChunkItem::read_from_bytes(&[0u8; 48]).unwrap();
        c.length = (8u64 << 20).into();
        c.stripe_len = BTRFS_STRIPE_LEN.into();
        c.type_ = (BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP).into();
        c.sector_size = 4096.into();
        c.num_stripes = 2.into();
        c.sub_stripes = 1.into();
        assert!(chunk_problems(&c, 1 << 20, 4096, false).is_empty());
        let mut bad = c;
        bad.stripe_len = (1u64 << 45).into();
        assert_eq!(chunk_problems(&bad, 1 << 20, 4096, false).len(), 1);
        let mut bad = c;
        bad.type_ = (BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10).into();
        bad.num_stripes = 1.into();
        bad.sub_stripes = 0.into();
        assert!(!chunk_problems(&bad, 1 << 20, 4096, false).is_empty());
        let mut bad = c;
        bad.type_ = (BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA).into();
        bad.num_stripes = 1.into();
        assert!(!chunk_problems(&bad, 1 << 20, 4096, false).is_empty());
        assert!(chunk_problems(&bad, 1 << 20, 4096, true).is_empty());
    }
}
