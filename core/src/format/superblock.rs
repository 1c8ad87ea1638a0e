//! `struct btrfs_super_block` (4096 bytes), its `btrfs_root_backup` slots and
//! the embedded `btrfs_dev_item`.

use super::chunk::{parse_chunk, ChunkItem, Stripe, CHUNK_ITEM_SIZE, STRIPE_SIZE};
use super::consts::*;
use super::dev::DevItem;
use super::key::{DiskKey, Key, DISK_KEY_SIZE};
use super::{Le16, Le32, Le64};
use crate::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RootBackup {
    pub tree_root: Le64,
    pub tree_root_gen: Le64,
    pub chunk_root: Le64,
    pub chunk_root_gen: Le64,
    pub extent_root: Le64,
    pub extent_root_gen: Le64,
    pub fs_root: Le64,
    pub fs_root_gen: Le64,
    pub dev_root: Le64,
    pub dev_root_gen: Le64,
    pub csum_root: Le64,
    pub csum_root_gen: Le64,
    pub total_bytes: Le64,
    pub bytes_used: Le64,
    pub num_devices: Le64,
    pub unused_64: [Le64; 4],
    pub tree_root_level: u8,
    pub chunk_root_level: u8,
    pub extent_root_level: u8,
    pub fs_root_level: u8,
    pub dev_root_level: u8,
    pub csum_root_level: u8,
    pub unused_8: [u8; 10],
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Superblock {
    pub csum: [u8; BTRFS_CSUM_SIZE],
    pub fsid: [u8; BTRFS_FSID_SIZE],
    pub bytenr: Le64,
    pub flags: Le64,
    pub magic: Le64,
    pub generation: Le64,
    pub root: Le64,
    pub chunk_root: Le64,
    pub log_root: Le64,
    pub log_root_transid: Le64,
    pub total_bytes: Le64,
    pub bytes_used: Le64,
    pub root_dir_objectid: Le64,
    pub num_devices: Le64,
    pub sectorsize: Le32,
    pub nodesize: Le32,
    pub leafsize: Le32,
    pub stripesize: Le32,
    pub sys_chunk_array_size: Le32,
    pub chunk_root_generation: Le64,
    pub compat_flags: Le64,
    pub compat_ro_flags: Le64,
    pub incompat_flags: Le64,
    pub csum_type: Le16,
    pub root_level: u8,
    pub chunk_root_level: u8,
    pub log_root_level: u8,
    pub dev_item: DevItem,
    pub label: [u8; BTRFS_LABEL_SIZE],
    pub cache_generation: Le64,
    pub uuid_tree_generation: Le64,
    pub metadata_uuid: [u8; BTRFS_FSID_SIZE],
    pub nr_global_roots: Le64,
    pub reserved: [Le64; 27],
    pub sys_chunk_array: [u8; BTRFS_SYSTEM_CHUNK_ARRAY_SIZE],
    pub super_roots: [RootBackup; BTRFS_NUM_BACKUP_ROOTS],
    pub padding: [u8; 565],
}

impl Superblock {
    pub fn label_str(&self) -> String {
        let end = self
            .label
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.label.len());
        String::from_utf8_lossy(&self.label[..end]).into_owned()
    }
    /// The uuid written into tree block headers: `metadata_uuid` when the
    /// METADATA_UUID feature is on, the fsid otherwise.
    pub fn tree_fsid(&self) -> [u8; 16] {
        if self.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_METADATA_UUID != 0 {
            self.metadata_uuid
        } else {
            self.fsid
        }
    }
    /// The valid prefix of the system chunk array, clamped to its capacity.
    pub fn sys_chunk_array(&self) -> &[u8] {
        let n = (self.sys_chunk_array_size.get() as usize).min(BTRFS_SYSTEM_CHUNK_ARRAY_SIZE);
        &self.sys_chunk_array[..n]
    }
    /// Decode the system chunk array for display: the entries before the
    /// first malformed one, and the error that stopped decoding, if any.
    /// Unlike the chunk map bootstrap this never fails outright, so a damaged
    /// array can still be shown.
    pub fn sys_chunk_entries(&self) -> (Vec<SysChunkEntry>, Option<Error>) {
        let at = self.bytenr.get();
        let size = self.sys_chunk_array_size.get() as usize;
        let mut out = Vec::new();
        if size > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE {
            let e = Error::corrupt(
                format!("sys_chunk_array_size {size} exceeds {BTRFS_SYSTEM_CHUNK_ARRAY_SIZE}"),
                at,
            );
            return (out, Some(e));
        }
        let arr = self.sys_chunk_array();
        let mut p = 0usize;
        while p < arr.len() {
            let Ok((dk, _)) = DiskKey::read_from_prefix(&arr[p..]) else {
                return (
                    out,
                    Some(Error::corrupt(
                        format!("sys_chunk_array truncated key at offset {p}"),
                        at,
                    )),
                );
            };
            let key = Key::from(dk);
            if key.ty != BTRFS_CHUNK_ITEM_KEY {
                let e = Error::corrupt_key(
                    format!("sys_chunk_array entry at offset {p} is not a chunk item"),
                    at,
                    key,
                );
                return (out, Some(e));
            }
            p += DISK_KEY_SIZE;
            match parse_chunk(&arr[p..]) {
                Ok((c, s)) => {
                    out.push(SysChunkEntry {
                        key,
                        chunk: *c,
                        stripes: s.to_vec(),
                    });
                    p += CHUNK_ITEM_SIZE + s.len() * STRIPE_SIZE;
                }
                Err(e) => return (out, Some(e.at(at, key))),
            }
        }
        (out, None)
    }
    pub fn has_incompat(&self, f: u64) -> bool {
        self.incompat_flags.get() & f != 0
    }
    pub fn has_compat_ro(&self, f: u64) -> bool {
        self.compat_ro_flags.get() & f != 0
    }
}

/// One entry of the system chunk array, copied out of the superblock.
#[derive(Clone, Debug)]
pub struct SysChunkEntry {
    pub key: Key,
    pub chunk: ChunkItem,
    pub stripes: Vec<Stripe>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};
    use zerocopy::FromZeros;

    #[test]
    fn layout_matches_c() {
        assert_eq!(size_of::<RootBackup>(), 168);
        assert_eq!(size_of::<Superblock>(), BTRFS_SUPER_INFO_SIZE);
        assert_eq!(offset_of!(Superblock, magic), 0x40);
        assert_eq!(offset_of!(Superblock, sectorsize), 0x90);
        assert_eq!(offset_of!(Superblock, sys_chunk_array_size), 0xa0);
        assert_eq!(offset_of!(Superblock, csum_type), 0xc4);
        assert_eq!(offset_of!(Superblock, dev_item), 0xc9);
        assert_eq!(offset_of!(Superblock, label), 0x12b);
        assert_eq!(offset_of!(Superblock, metadata_uuid), 0x23b);
        assert_eq!(offset_of!(Superblock, sys_chunk_array), 0x32b);
        assert_eq!(offset_of!(Superblock, super_roots), 0xb2b);
    }

    #[test]
    fn roundtrip() {
        let mut b = vec![0u8; BTRFS_SUPER_INFO_SIZE];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 31 % 251) as u8;
        }
        crate::format::roundtrip::<Superblock>(&b);
    }

    #[test]
    fn sys_chunk_entries_decode_and_stop_at_damage() {
        let mut sb = Superblock::new_zeroed();
        let mut arr = Vec::new();
        arr.extend_from_slice(
            Key::new(256, BTRFS_CHUNK_ITEM_KEY, 22020096)
                .to_disk()
                .as_bytes(),
        );
        let mut chunk = vec![0u8; CHUNK_ITEM_SIZE + 2 * STRIPE_SIZE];
        chunk[..8].copy_from_slice(&(8u64 << 20).to_le_bytes());
        chunk[44] = 2; // num_stripes
        chunk[CHUNK_ITEM_SIZE..CHUNK_ITEM_SIZE + 8].copy_from_slice(&1u64.to_le_bytes());
        arr.extend_from_slice(&chunk);
        let good = arr.len();
        // A second entry cut off inside its chunk item.
        arr.extend_from_slice(
            Key::new(256, BTRFS_CHUNK_ITEM_KEY, 1 << 30)
                .to_disk()
                .as_bytes(),
        );
        arr.extend_from_slice(&chunk[..20]);
        sb.sys_chunk_array[..arr.len()].copy_from_slice(&arr);

        sb.sys_chunk_array_size = (good as u32).into();
        let (v, err) = sb.sys_chunk_entries();
        assert!(err.is_none());
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].key.offset, 22020096);
        assert_eq!(v[0].chunk.length.get(), 8 << 20);
        assert_eq!(v[0].stripes.len(), 2);
        assert_eq!(v[0].stripes[0].devid.get(), 1);

        sb.sys_chunk_array_size = (arr.len() as u32).into();
        let (v, err) = sb.sys_chunk_entries();
        assert_eq!(v.len(), 1);
        assert!(err.is_some());

        sb.sys_chunk_array_size = 5000.into();
        let (v, err) = sb.sys_chunk_entries();
        assert!(v.is_empty() && err.is_some());
    }

    #[test]
    fn mirrors() {
        assert_eq!(btrfs_sb_offset(0), 64 << 10);
        assert_eq!(btrfs_sb_offset(1), 64 << 20);
        assert_eq!(btrfs_sb_offset(2), 256 << 30);
    }
}
