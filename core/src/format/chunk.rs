//! `btrfs_chunk` (48 bytes) followed by `num_stripes` `btrfs_stripe` (32
//! bytes each), in the chunk tree and in the superblock's sys_chunk_array.

use super::{Le16, Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ChunkItem {
    pub length: Le64,
    pub owner: Le64,
    pub stripe_len: Le64,
    pub type_: Le64,
    pub io_align: Le32,
    pub io_width: Le32,
    pub sector_size: Le32,
    pub num_stripes: Le16,
    pub sub_stripes: Le16,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Stripe {
    pub devid: Le64,
    pub offset: Le64,
    pub dev_uuid: [u8; 16],
}

pub const CHUNK_ITEM_SIZE: usize = 48;
pub const STRIPE_SIZE: usize = 32;

/// Split a chunk item into its head and stripes; the item must be exactly
/// as long as `num_stripes` says.
pub fn parse_chunk(data: &[u8]) -> Result<(&ChunkItem, &[Stripe])> {
    let c: &ChunkItem = super::view(data, "chunk item")?;
    let n = c.num_stripes.get() as usize;
    if n == 0 {
        return Err(Error::corrupt("chunk item with zero stripes", 0));
    }
    let want = CHUNK_ITEM_SIZE + n * STRIPE_SIZE;
    if data.len() < want {
        return Err(Error::corrupt(format!("chunk item of {} bytes holds fewer than its {n} stripes", data.len()), 0));
    }
    let stripes = <[Stripe]>::ref_from_bytes(&data[CHUNK_ITEM_SIZE..want])
        .map_err(|_| Error::corrupt("chunk stripes", 0))?;
    Ok((c, stripes))
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
}
