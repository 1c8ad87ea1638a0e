//! `struct btrfs_super_block` (4096 bytes), its `btrfs_root_backup` slots and
//! the embedded `btrfs_dev_item`.

use super::chunk::{parse_chunk, ChunkItem, Stripe, CHUNK_ITEM_SIZE, STRIPE_SIZE};
use super::consts::*;
use super::dev::DevItem;
use super::key::{DiskKey, Key, DISK_KEY_SIZE};
use super::{Le16, Le32, Le64};
use crate::CorruptKind;
use crate::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_root_backup`: the main tree roots of one recent commit, for
/// mounting with `-o usebackuproot` when the newest roots are damaged.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RootBackup {
    /// Logical address of the root tree's root node.
    pub tree_root: Le64,
    /// Generation of that node.
    pub tree_root_gen: Le64,
    /// Logical address of the chunk tree's root node.
    pub chunk_root: Le64,
    /// Generation of that node.
    pub chunk_root_gen: Le64,
    /// Logical address of the extent tree's root node.
    pub extent_root: Le64,
    /// Generation of that node.
    pub extent_root_gen: Le64,
    /// Logical address of the FS_TREE root node.
    pub fs_root: Le64,
    /// Generation of that node.
    pub fs_root_gen: Le64,
    /// Logical address of the device tree's root node.
    pub dev_root: Le64,
    /// Generation of that node.
    pub dev_root_gen: Le64,
    /// Logical address of the csum tree's root node.
    pub csum_root: Le64,
    /// Generation of that node.
    pub csum_root_gen: Le64,
    /// The superblock's `total_bytes` at that commit.
    pub total_bytes: Le64,
    /// The superblock's `bytes_used` at that commit.
    pub bytes_used: Le64,
    /// The superblock's `num_devices` at that commit.
    pub num_devices: Le64,
    /// Reserved, zero.
    pub unused_64: [Le64; 4],
    /// Level of the root tree's root node.
    pub tree_root_level: u8,
    /// Level of the chunk tree's root node.
    pub chunk_root_level: u8,
    /// Level of the extent tree's root node.
    pub extent_root_level: u8,
    /// Level of the FS_TREE root node.
    pub fs_root_level: u8,
    /// Level of the device tree's root node.
    pub dev_root_level: u8,
    /// Level of the csum tree's root node.
    pub csum_root_level: u8,
    /// Reserved, zero.
    pub unused_8: [u8; 10],
}

/// `struct btrfs_super_block`, at [`btrfs_sb_offset`] on every device; all
/// copies of a commit are equal except `bytenr`, `csum` and `dev_item`.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct Superblock {
    /// Checksum of the rest of the block (bytes 32..4096), `csum_type` sets how
    /// many bytes are used.
    pub csum: [u8; BTRFS_CSUM_SIZE],
    /// Filesystem uuid, as users see it.
    pub fsid: [u8; BTRFS_FSID_SIZE],
    /// Physical byte offset of this copy on its device; must equal where it was
    /// read.
    pub bytenr: Le64,
    /// BTRFS_SUPER_FLAG_*; the kernel also sets BTRFS_HEADER_FLAG_WRITTEN
    /// when it writes the block.
    pub flags: Le64,
    /// [`BTRFS_MAGIC`].
    pub magic: Le64,
    /// Transaction this superblock commits.
    pub generation: Le64,
    /// Logical address of the root tree's root node.
    pub root: Le64,
    /// Logical address of the chunk tree's root node.
    pub chunk_root: Le64,
    /// Logical address of the log root tree's root node, 0 when there is no log
    /// to replay.
    pub log_root: Le64,
    /// Deprecated, never used; 0.
    pub log_root_transid: Le64,
    /// Sum of the sizes of all devices, in bytes.
    pub total_bytes: Le64,
    /// Bytes allocated to extents, data and metadata.
    pub bytes_used: Le64,
    /// Object id of the root tree directory: BTRFS_ROOT_TREE_DIR_OBJECTID (6).
    pub root_dir_objectid: Le64,
    /// Number of devices in the filesystem.
    pub num_devices: Le64,
    /// Sector size in bytes: the unit of data allocation and data checksums.
    pub sectorsize: Le32,
    /// Tree block size in bytes.
    pub nodesize: Le32,
    /// Obsolete leaf size; equals `nodesize`.
    pub leafsize: Le32,
    /// Unused; mkfs writes the sector size.
    pub stripesize: Le32,
    /// Bytes of `sys_chunk_array` in use.
    pub sys_chunk_array_size: Le32,
    /// Generation of the chunk tree's root node.
    pub chunk_root_generation: Le64,
    /// Compatible features; none are defined.
    pub compat_flags: Le64,
    /// BTRFS_FEATURE_COMPAT_RO_*: features an unaware kernel may only mount
    /// read-only.
    pub compat_ro_flags: Le64,
    /// BTRFS_FEATURE_INCOMPAT_*: features an unaware kernel must refuse.
    pub incompat_flags: Le64,
    /// BTRFS_CSUM_TYPE_* of all tree block and data checksums.
    pub csum_type: Le16,
    /// Level of the root tree's root node.
    pub root_level: u8,
    /// Level of the chunk tree's root node.
    pub chunk_root_level: u8,
    /// Level of the log root tree's root node.
    pub log_root_level: u8,
    /// The device item of the device this copy is on.
    pub dev_item: DevItem,
    /// Filesystem label, NUL terminated unless it fills the field.
    pub label: [u8; BTRFS_LABEL_SIZE],
    /// Generation the v1 free space cache was last written in; when it differs
    /// from `generation` the kernel discards the whole cache.
    pub cache_generation: Le64,
    /// Generation the UUID tree was last known complete in; when it differs
    /// from `generation` the kernel checks and rebuilds the tree at mount.
    pub uuid_tree_generation: Le64,
    /// Uuid written in tree block headers when METADATA_UUID is set (see
    /// [`Superblock::tree_fsid`]).
    pub metadata_uuid: [u8; BTRFS_FSID_SIZE],
    /// Number of global roots (extent tree v2).
    pub nr_global_roots: Le64,
    /// Reserved, zero.
    pub reserved: [Le64; 27],
    /// Packed (`btrfs_disk_key`, `btrfs_chunk` + stripes) pairs of the SYSTEM
    /// chunks, enough to read the chunk tree.
    pub sys_chunk_array: [u8; BTRFS_SYSTEM_CHUNK_ARRAY_SIZE],
    /// Backup roots of the last commits, used in rotation.
    pub super_roots: [RootBackup; BTRFS_NUM_BACKUP_ROOTS],
    /// Padding to 4096 bytes, zero.
    pub padding: [u8; 565],
}

impl Superblock {
    /// The label up to its first NUL, lossily decoded as UTF-8.
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
            let e = Error::corrupt_as(
                CorruptKind::Superblock,
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
                    Some(Error::corrupt_as(
                        CorruptKind::Superblock,
                        format!("sys_chunk_array truncated key at offset {p}"),
                        at,
                    )),
                );
            };
            let key = Key::from(dk);
            if key.ty != BTRFS_CHUNK_ITEM_KEY {
                let e = Error::corrupt_key_as(
                    CorruptKind::Superblock,
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
    /// True when any of the incompat feature bits `f` is set.
    pub fn has_incompat(&self, f: u64) -> bool {
        self.incompat_flags.get() & f != 0
    }
    /// True when any of the compat_ro feature bits `f` is set.
    pub fn has_compat_ro(&self, f: u64) -> bool {
        self.compat_ro_flags.get() & f != 0
    }
}

/// One entry of the system chunk array, copied out of the superblock.
#[derive(Clone, Debug)]
pub struct SysChunkEntry {
    /// The entry's key, (FIRST_CHUNK_TREE, CHUNK_ITEM, logical start).
    pub key: Key,
    /// The chunk head.
    pub chunk: ChunkItem,
    /// Its `num_stripes` stripes.
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
