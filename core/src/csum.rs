//! The four checksum algorithms a superblock can select. Checksums are stored
//! in a 32-byte field, zero-padded after the algorithm's digest.

use crate::format::consts::*;
use crate::{Error, Result};
use serde::Serialize;

/// Checksum algorithm of a filesystem, the superblock's `csum_type`
/// (`BTRFS_CSUM_TYPE_*`). One algorithm covers the superblock, every tree
/// block and, through the checksum tree, every data sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CsumType {
    /// CRC-32C (Castagnoli), type 0, the default: 4-byte digest, little-endian.
    Crc32c,
    /// xxHash64 with seed 0, type 1: 8-byte digest, little-endian.
    Xxhash64,
    /// SHA-256, type 2: 32-byte digest.
    Sha256,
    /// BLAKE2b with a 256-bit digest (BLAKE2b-256), type 3: 32 bytes.
    Blake2b,
}

impl CsumType {
    /// The algorithm of an on-disk `csum_type` value; an unknown one is
    /// `Unsupported`.
    pub fn from_disk(t: u16) -> Result<CsumType> {
        Ok(match t {
            BTRFS_CSUM_TYPE_CRC32 => CsumType::Crc32c,
            BTRFS_CSUM_TYPE_XXHASH => CsumType::Xxhash64,
            BTRFS_CSUM_TYPE_SHA256 => CsumType::Sha256,
            BTRFS_CSUM_TYPE_BLAKE2 => CsumType::Blake2b,
            t => return Err(Error::Unsupported(format!("checksum type {t}"))),
        })
    }
    /// The on-disk `csum_type` value (`BTRFS_CSUM_TYPE_*`).
    pub fn to_disk(self) -> u16 {
        match self {
            CsumType::Crc32c => BTRFS_CSUM_TYPE_CRC32,
            CsumType::Xxhash64 => BTRFS_CSUM_TYPE_XXHASH,
            CsumType::Sha256 => BTRFS_CSUM_TYPE_SHA256,
            CsumType::Blake2b => BTRFS_CSUM_TYPE_BLAKE2,
        }
    }
    /// Parse a name as `mkfs.btrfs --csum` takes it, ignoring case: crc32c
    /// (or crc32), xxhash (or xxhash64), sha256, blake2 (or blake2b). Anything
    /// else is `Invalid`.
    pub fn parse(name: &str) -> Result<CsumType> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "crc32c" | "crc32" => CsumType::Crc32c,
            "xxhash" | "xxhash64" => CsumType::Xxhash64,
            "sha256" => CsumType::Sha256,
            "blake2" | "blake2b" => CsumType::Blake2b,
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown checksum type '{name}' (crc32c, xxhash, sha256, blake2)"
                )))
            }
        })
    }
    /// The name btrfs-progs prints (`crc32c`, `xxhash64`, `sha256`, `blake2b`).
    pub fn name(self) -> &'static str {
        crate::format::names::csum_type_name(self.to_disk())
    }
    /// Bytes of the digest (the rest of the 32-byte field is zero).
    pub fn size(self) -> usize {
        match self {
            CsumType::Crc32c => 4,
            CsumType::Xxhash64 => 8,
            CsumType::Sha256 | CsumType::Blake2b => 32,
        }
    }
    /// Checksum of `data` laid out as the 32-byte on-disk field: the digest,
    /// then zeroes (btrfs-progs' `btrfs_csum_data`).
    pub fn compute(self, data: &[u8]) -> [u8; BTRFS_CSUM_SIZE] {
        let mut out = [0u8; BTRFS_CSUM_SIZE];
        match self {
            CsumType::Crc32c => out[..4].copy_from_slice(&crc32c::crc32c(data).to_le_bytes()),
            CsumType::Xxhash64 => {
                out[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, 0).to_le_bytes())
            }
            CsumType::Sha256 => {
                use sha2::Digest;
                out.copy_from_slice(&sha2::Sha256::digest(data));
            }
            CsumType::Blake2b => {
                use blake2::Digest;
                out.copy_from_slice(&blake2::Blake2b::<blake2::digest::consts::U32>::digest(
                    data,
                ));
            }
        }
        out
    }
    /// True when `stored` (at least `size()` bytes) matches the checksum of `data`.
    pub fn verify(self, data: &[u8], stored: &[u8]) -> bool {
        let c = self.compute(data);
        let n = self.size();
        stored.len() >= n && stored[..n] == c[..n]
    }
}

/// Checksum of a metadata block or superblock: over everything after the
/// 32-byte csum field.
pub fn block_csum(t: CsumType, block: &[u8]) -> [u8; BTRFS_CSUM_SIZE] {
    t.compute(block.get(BTRFS_CSUM_SIZE..).unwrap_or(&[]))
}

/// True when the checksum stored in the first 32 bytes of a metadata block
/// or superblock matches [`block_csum`] of it; false for a block of 32
/// bytes or less. The kernel's `btrfs_check_super_csum` and the checksum
/// step of `btrfs_validate_extent_buffer`.
pub fn verify_block(t: CsumType, block: &[u8]) -> bool {
    block.len() > BTRFS_CSUM_SIZE && t.verify(&block[BTRFS_CSUM_SIZE..], &block[..BTRFS_CSUM_SIZE])
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn known_vectors() {
        // crc32c("123456789") = 0xe3069283
        assert_eq!(
            &CsumType::Crc32c.compute(b"123456789")[..4],
            &0xe3069283u32.to_le_bytes()
        );
        // xxh64("", 0) = 0xef46db3751d8e999
        assert_eq!(
            &CsumType::Xxhash64.compute(b"")[..8],
            &0xef46db3751d8e999u64.to_le_bytes()
        );
        let s = CsumType::Sha256.compute(b"abc");
        assert_eq!(s[0], 0xba);
        assert_eq!(s[31], 0xad);
        // BLAKE2b-256("abc") starts bd dd 81 3c
        let b = CsumType::Blake2b.compute(b"abc");
        assert_eq!(&b[..4], &[0xbd, 0xdd, 0x81, 0x3c]);
        for t in [
            CsumType::Crc32c,
            CsumType::Xxhash64,
            CsumType::Sha256,
            CsumType::Blake2b,
        ] {
            assert_eq!(CsumType::from_disk(t.to_disk()).unwrap(), t);
            let mut blk = vec![7u8; 4096];
            let c = block_csum(t, &blk);
            blk[..32].copy_from_slice(&c);
            assert!(verify_block(t, &blk));
            blk[100] ^= 1;
            assert!(!verify_block(t, &blk));
        }
    }
}
