//! Constants with their C names (btrfs_tree.h, ctree.h).

/// `btrfs_super_block.magic`: the ASCII bytes "_BHRfS_M" read as a
/// little-endian u64.
pub const BTRFS_MAGIC: u64 = 0x4D5F_5366_5248_425F; // "_BHRfS_M"
/// Byte offset of the primary superblock on every device (64 KiB).
pub const BTRFS_SUPER_INFO_OFFSET: u64 = 65536;
/// Size of a superblock copy in bytes, whatever the sector size.
pub const BTRFS_SUPER_INFO_SIZE: usize = 4096;
/// Number of superblock copies per device (primary plus two mirrors).
pub const BTRFS_SUPER_MIRROR_MAX: usize = 3;
/// Mirror `n > 0` sits at 16 KiB << (12 * n): 64 MiB and 256 GiB; see
/// [`btrfs_sb_offset`].
pub const BTRFS_SUPER_MIRROR_SHIFT: u32 = 12;
/// Room reserved for a checksum in headers and the superblock, in bytes; the
/// checksum type uses the first 4 (crc32c), 8 (xxhash64) or 32 (sha256,
/// blake2b) of them.
pub const BTRFS_CSUM_SIZE: usize = 32;
/// Size of a filesystem id (`fsid`, `metadata_uuid`) in bytes.
pub const BTRFS_FSID_SIZE: usize = 16;
/// Size of any other uuid (device, chunk tree, subvolume) in bytes.
pub const BTRFS_UUID_SIZE: usize = 16;
/// Size of `btrfs_super_block.label` in bytes, NUL terminator included.
pub const BTRFS_LABEL_SIZE: usize = 256;
/// Capacity of `btrfs_super_block.sys_chunk_array` in bytes.
pub const BTRFS_SYSTEM_CHUNK_ARRAY_SIZE: usize = 2048;
/// Number of `btrfs_root_backup` slots in the superblock.
pub const BTRFS_NUM_BACKUP_ROOTS: usize = 4;
/// Bound on tree height: every valid node level is below 8.
pub const BTRFS_MAX_LEVEL: u8 = 8;
/// Longest file or xattr name in bytes.
pub const BTRFS_NAME_LEN: usize = 255;
/// `btrfs_chunk.stripe_len` of every chunk: 64 KiB.
pub const BTRFS_STRIPE_LEN: u64 = 65536;
/// Smallest tree block size accepted, in bytes.
pub const BTRFS_MIN_NODESIZE: u32 = 4096;
/// Largest tree block size accepted, in bytes (BTRFS_MAX_METADATA_BLOCKSIZE).
pub const BTRFS_MAX_NODESIZE: u32 = 65536;

/// Byte offset of superblock copy `mirror` (0, 1, 2) on a device.
pub fn btrfs_sb_offset(mirror: usize) -> u64 {
    if mirror == 0 {
        BTRFS_SUPER_INFO_OFFSET
    } else {
        (16 * 1024u64) << (BTRFS_SUPER_MIRROR_SHIFT as u64 * mirror as u64)
    }
}

// Object ids of trees and special objects.
/// Object id of device stats items in the dev tree: (0, PERSISTENT_ITEM,
/// devid).
pub const BTRFS_DEV_STATS_OBJECTID: u64 = 0;
/// The root tree (tree of tree roots), whose root the superblock points to.
pub const BTRFS_ROOT_TREE_OBJECTID: u64 = 1;
/// The extent tree: extent items, back references, block groups.
pub const BTRFS_EXTENT_TREE_OBJECTID: u64 = 2;
/// The chunk tree: logical-to-physical chunk mapping and device items.
pub const BTRFS_CHUNK_TREE_OBJECTID: u64 = 3;
/// The device tree: dev extents (physical-to-chunk), dev stats, dev replace.
pub const BTRFS_DEV_TREE_OBJECTID: u64 = 4;
/// The top-level subvolume (FS_TREE, id 5).
pub const BTRFS_FS_TREE_OBJECTID: u64 = 5;
/// Directory inode in the root tree holding the "default" subvolume entry.
pub const BTRFS_ROOT_TREE_DIR_OBJECTID: u64 = 6;
/// The checksum tree: EXTENT_CSUM items for data.
pub const BTRFS_CSUM_TREE_OBJECTID: u64 = 7;
/// The quota tree: qgroup status, info, limit and relation items.
pub const BTRFS_QUOTA_TREE_OBJECTID: u64 = 8;
/// The UUID tree: subvolume uuid and received uuid to subvolume id.
pub const BTRFS_UUID_TREE_OBJECTID: u64 = 9;
/// The free space tree (space cache v2).
pub const BTRFS_FREE_SPACE_TREE_OBJECTID: u64 = 10;
/// The block group tree (BLOCK_GROUP_TREE compat_ro feature).
pub const BTRFS_BLOCK_GROUP_TREE_OBJECTID: u64 = 11;
/// The RAID stripe tree (RAID_STRIPE_TREE incompat feature).
pub const BTRFS_RAID_STRIPE_TREE_OBJECTID: u64 = 12;
/// The remap tree: addresses of relocated block groups and where they moved.
pub const BTRFS_REMAP_TREE_OBJECTID: u64 = 13;
/// Object id used by btrfstune's checksum type change: the new checksums in the
/// csum tree, and (CSUM_CHANGE, TEMPORARY_ITEM, new type) in the root tree
/// while it runs.
pub const BTRFS_CSUM_CHANGE_OBJECTID: u64 = -13i64 as u64;
/// Balance state item in the root tree: (BALANCE, TEMPORARY_ITEM, 0).
pub const BTRFS_BALANCE_OBJECTID: u64 = -4i64 as u64;
/// Object id of ORPHAN_ITEMs: in the root tree for dead roots, in a subvolume
/// tree for unlinked inodes still to be freed.
pub const BTRFS_ORPHAN_OBJECTID: u64 = -5i64 as u64;
/// Log trees: their ROOT_ITEMs in the log root tree, keyed by subvolume id, and
/// the owner of log tree blocks.
pub const BTRFS_TREE_LOG_OBJECTID: u64 = -6i64 as u64;
/// Temporary ORPHAN_ITEMs that log replay adds to a subvolume tree for inodes
/// whose link count it must fix.
pub const BTRFS_TREE_LOG_FIXUP_OBJECTID: u64 = -7i64 as u64;
/// Relocation trees: (TREE_RELOC, ROOT_ITEM, source tree id).
pub const BTRFS_TREE_RELOC_OBJECTID: u64 = -8i64 as u64;
/// The data relocation tree, an fs tree whose one file stages relocated data.
pub const BTRFS_DATA_RELOC_TREE_OBJECTID: u64 = -9i64 as u64;
/// Object id of EXTENT_CSUM items in the csum tree.
pub const BTRFS_EXTENT_CSUM_OBJECTID: u64 = -10i64 as u64;
/// Space cache v1 header items in the root tree: (FREE_SPACE, 0, block group
/// start).
pub const BTRFS_FREE_SPACE_OBJECTID: u64 = -11i64 as u64;
/// The obsolete inode number cache (inode_cache mount option, removed in 5.11).
pub const BTRFS_FREE_INO_OBJECTID: u64 = -12i64 as u64;
/// Dummy object id standing for several object ids.
pub const BTRFS_MULTIPLE_OBJECTIDS: u64 = -255i64 as u64;
/// First inode number and subvolume id for ordinary use; also the root
/// directory inode of every fs tree.
pub const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
/// Last inode number and subvolume id for ordinary use.
pub const BTRFS_LAST_FREE_OBJECTID: u64 = -256i64 as u64;
/// Object id of every CHUNK_ITEM key: (256, CHUNK_ITEM, logical start).
pub const BTRFS_FIRST_CHUNK_TREE_OBJECTID: u64 = 256;
/// Object id of DEV_ITEM keys in the chunk tree: (1, DEV_ITEM, devid).
pub const BTRFS_DEV_ITEMS_OBJECTID: u64 = 1;
/// Inode number of the kernel's in-memory btree inode; never on disk.
pub const BTRFS_BTREE_INODE_OBJECTID: u64 = 1;
/// Inode number of the empty placeholder directory shown for a subvolume entry
/// whose subvolume is not linked there.
pub const BTRFS_EMPTY_SUBVOL_DIR_OBJECTID: u64 = 2;
/// Device id of the target device while a device replace runs.
pub const BTRFS_DEV_REPLACE_DEVID: u64 = 0;

// Item key types.
/// Inode item: (ino, INODE_ITEM, 0) -> `btrfs_inode_item`.
pub const BTRFS_INODE_ITEM_KEY: u8 = 1;
/// Inode back reference: (ino, INODE_REF, parent dir ino) -> packed
/// `btrfs_inode_ref` + name.
pub const BTRFS_INODE_REF_KEY: u8 = 12;
/// Extended inode ref: (ino, INODE_EXTREF, extref hash) -> packed
/// `btrfs_inode_extref` + name.
pub const BTRFS_INODE_EXTREF_KEY: u8 = 13;
/// Extended attribute: (ino, XATTR_ITEM, name hash) -> `btrfs_dir_item` with
/// name and value.
pub const BTRFS_XATTR_ITEM_KEY: u8 = 24;
/// fs-verity descriptor: (ino, VERITY_DESC_ITEM, 0) holds
/// `btrfs_verity_descriptor_item`, then the descriptor's bytes from offset 1.
pub const BTRFS_VERITY_DESC_ITEM_KEY: u8 = 36;
/// fs-verity Merkle tree bytes: (ino, VERITY_MERKLE_ITEM, byte offset in the
/// tree).
pub const BTRFS_VERITY_MERKLE_ITEM_KEY: u8 = 37;
/// Orphan item, empty: (ORPHAN, ORPHAN_ITEM, ino or root id).
pub const BTRFS_ORPHAN_ITEM_KEY: u8 = 48;
/// Log tree: (dir, DIR_LOG_ITEM, first hash) -> `btrfs_dir_log_item`, the
/// logged DIR_ITEM hash range.
pub const BTRFS_DIR_LOG_ITEM_KEY: u8 = 60;
/// Log tree: (dir, DIR_LOG_INDEX, first index) -> `btrfs_dir_log_item`, the
/// logged index range.
pub const BTRFS_DIR_LOG_INDEX_KEY: u8 = 72;
/// Directory entry by name: (dir, DIR_ITEM, name hash) -> one or more
/// `btrfs_dir_item`.
pub const BTRFS_DIR_ITEM_KEY: u8 = 84;
/// Directory entry by position: (dir, DIR_INDEX, index) -> exactly one
/// `btrfs_dir_item`.
pub const BTRFS_DIR_INDEX_KEY: u8 = 96;
/// File extent: (ino, EXTENT_DATA, file offset) -> `btrfs_file_extent_item`.
pub const BTRFS_EXTENT_DATA_KEY: u8 = 108;
/// Legacy per-file checksum item; current kernels store only EXTENT_CSUM.
pub const BTRFS_CSUM_ITEM_KEY: u8 = 120;
/// Data checksums: (EXTENT_CSUM, EXTENT_CSUM, logical bytenr) -> one checksum
/// per sector.
pub const BTRFS_EXTENT_CSUM_KEY: u8 = 128;
/// Tree root: (tree id, ROOT_ITEM, offset) -> `btrfs_root_item`; the offset is
/// 0, a snapshot's creation transid, or for reloc and log trees the id of the
/// tree they shadow.
pub const BTRFS_ROOT_ITEM_KEY: u8 = 132;
/// Subvolume link, child side: (child, ROOT_BACKREF, parent) ->
/// `btrfs_root_ref` + name.
pub const BTRFS_ROOT_BACKREF_KEY: u8 = 144;
/// Subvolume link, parent side: (parent, ROOT_REF, child) -> `btrfs_root_ref` +
/// name.
pub const BTRFS_ROOT_REF_KEY: u8 = 156;
/// Extent: (bytenr, EXTENT_ITEM, length) -> `btrfs_extent_item` + inline refs.
pub const BTRFS_EXTENT_ITEM_KEY: u8 = 168;
/// Skinny tree block extent: (bytenr, METADATA_ITEM, level) ->
/// `btrfs_extent_item` + inline refs.
pub const BTRFS_METADATA_ITEM_KEY: u8 = 169;
/// Simple-quota owner, an inline ref holding the owning root id.
pub const BTRFS_EXTENT_OWNER_REF_KEY: u8 = 172;
/// Tree block ref by root, empty: (bytenr, TREE_BLOCK_REF, root id).
pub const BTRFS_TREE_BLOCK_REF_KEY: u8 = 176;
/// Data ref by (root, inode, offset): (bytenr, EXTENT_DATA_REF, hash) ->
/// `btrfs_extent_data_ref`.
pub const BTRFS_EXTENT_DATA_REF_KEY: u8 = 178;
/// Pre-2.6.31 back reference (`btrfs_extent_ref_v0`).
pub const BTRFS_EXTENT_REF_V0_KEY: u8 = 180;
/// Tree block ref by parent, empty: (bytenr, SHARED_BLOCK_REF, parent bytenr).
pub const BTRFS_SHARED_BLOCK_REF_KEY: u8 = 182;
/// Data ref by parent leaf: (bytenr, SHARED_DATA_REF, parent bytenr) ->
/// `btrfs_shared_data_ref`.
pub const BTRFS_SHARED_DATA_REF_KEY: u8 = 184;
/// Block group: (start, BLOCK_GROUP_ITEM, length) -> `btrfs_block_group_item`.
pub const BTRFS_BLOCK_GROUP_ITEM_KEY: u8 = 192;
/// Free space tree: (bg start, FREE_SPACE_INFO, bg length) ->
/// `btrfs_free_space_info`.
pub const BTRFS_FREE_SPACE_INFO_KEY: u8 = 198;
/// Free space tree: a free range, empty: (start, FREE_SPACE_EXTENT, length).
pub const BTRFS_FREE_SPACE_EXTENT_KEY: u8 = 199;
/// Free space tree: (start, FREE_SPACE_BITMAP, length) -> one bit per sector,
/// set when free.
pub const BTRFS_FREE_SPACE_BITMAP_KEY: u8 = 200;
/// Device extent: (devid, DEV_EXTENT, physical offset) -> `btrfs_dev_extent`.
pub const BTRFS_DEV_EXTENT_KEY: u8 = 204;
/// Device: (DEV_ITEMS, DEV_ITEM, devid) -> `btrfs_dev_item`.
pub const BTRFS_DEV_ITEM_KEY: u8 = 216;
/// Chunk: (FIRST_CHUNK_TREE, CHUNK_ITEM, logical start) -> `btrfs_chunk` +
/// stripes.
pub const BTRFS_CHUNK_ITEM_KEY: u8 = 228;
/// RAID stripe extent: (logical, RAID_STRIPE, length) -> `btrfs_raid_stride`
/// array.
pub const BTRFS_RAID_STRIPE_KEY: u8 = 230;
/// Remap tree, empty: (start, IDENTITY_REMAP, length), a range of a remapped
/// block group not moved.
pub const BTRFS_IDENTITY_REMAP_KEY: u8 = 234;
/// Remap tree: (old address, REMAP, length) -> `btrfs_remap`, the new address.
pub const BTRFS_REMAP_KEY: u8 = 235;
/// Remap tree: (new address, REMAP_BACKREF, length) -> `btrfs_remap`, the old
/// address.
pub const BTRFS_REMAP_BACKREF_KEY: u8 = 236;
/// Quota state, one per filesystem: (0, QGROUP_STATUS, 0) ->
/// `btrfs_qgroup_status_item`.
pub const BTRFS_QGROUP_STATUS_KEY: u8 = 240;
/// Qgroup usage: (0, QGROUP_INFO, qgroupid) -> `btrfs_qgroup_info_item`.
pub const BTRFS_QGROUP_INFO_KEY: u8 = 242;
/// Qgroup limits: (0, QGROUP_LIMIT, qgroupid) -> `btrfs_qgroup_limit_item`.
pub const BTRFS_QGROUP_LIMIT_KEY: u8 = 244;
/// Qgroup membership, empty, stored both ways: (member, QGROUP_RELATION,
/// parent) and (parent, .., member).
pub const BTRFS_QGROUP_RELATION_KEY: u8 = 246;
/// Temporary state (also BTRFS_BALANCE_ITEM_KEY): balance at (BALANCE,
/// TEMPORARY_ITEM, 0).
pub const BTRFS_TEMPORARY_ITEM_KEY: u8 = 248; // also BTRFS_BALANCE_ITEM_KEY
/// Persistent state (also BTRFS_DEV_STATS_KEY): dev stats at (DEV_STATS,
/// PERSISTENT_ITEM, devid).
pub const BTRFS_PERSISTENT_ITEM_KEY: u8 = 249; // also BTRFS_DEV_STATS_KEY
/// Device replace state: (0, DEV_REPLACE, 0) in the dev tree ->
/// `btrfs_dev_replace_item`.
pub const BTRFS_DEV_REPLACE_KEY: u8 = 250;
/// UUID tree: subvolume uuid (its two halves as objectid, offset) -> le64
/// subvolume ids.
pub const BTRFS_UUID_KEY_SUBVOL: u8 = 251;
/// UUID tree: received uuid (its two halves as objectid, offset) -> le64
/// subvolume ids.
pub const BTRFS_UUID_KEY_RECEIVED_SUBVOL: u8 = 252;
/// Free-form string item, for debugging; the kernel never writes it.
pub const BTRFS_STRING_ITEM_KEY: u8 = 253;

// Checksum types.
/// `btrfs_super_block.csum_type`: crc32c, 4 bytes.
pub const BTRFS_CSUM_TYPE_CRC32: u16 = 0;
/// `btrfs_super_block.csum_type`: xxhash64, 8 bytes.
pub const BTRFS_CSUM_TYPE_XXHASH: u16 = 1;
/// `btrfs_super_block.csum_type`: sha256, 32 bytes.
pub const BTRFS_CSUM_TYPE_SHA256: u16 = 2;
/// `btrfs_super_block.csum_type`: blake2b-256, 32 bytes.
pub const BTRFS_CSUM_TYPE_BLAKE2: u16 = 3;

// Superblock flags.
/// `btrfs_header.flags`: block written out; it must be COWed before being
/// changed again.
pub const BTRFS_HEADER_FLAG_WRITTEN: u64 = 1 << 0;
/// `btrfs_header.flags`: block of a relocation tree.
pub const BTRFS_HEADER_FLAG_RELOC: u64 = 1 << 1;
/// `btrfs_super_block.flags`: the filesystem hit an error.
pub const BTRFS_SUPER_FLAG_ERROR: u64 = 1 << 2;
/// `btrfs_super_block.flags`: seed device, read-only base for sprouted
/// filesystems.
pub const BTRFS_SUPER_FLAG_SEEDING: u64 = 1 << 32;
/// `btrfs_super_block.flags`: a btrfs-image metadata dump, data absent.
pub const BTRFS_SUPER_FLAG_METADUMP: u64 = 1 << 33;
/// `btrfs_super_block.flags`: a btrfs-image metadata dump, version 2.
pub const BTRFS_SUPER_FLAG_METADUMP_V2: u64 = 1 << 34;
/// `btrfs_super_block.flags`: btrfstune rewriting the fsid, unfinished.
pub const BTRFS_SUPER_FLAG_CHANGING_FSID: u64 = 1 << 35;
/// `btrfs_super_block.flags`: btrfstune changing the metadata_uuid, unfinished.
pub const BTRFS_SUPER_FLAG_CHANGING_FSID_V2: u64 = 1 << 36;
/// `btrfs_super_block.flags`: btrfstune converting to or from the block group
/// tree, unfinished.
pub const BTRFS_SUPER_FLAG_CHANGING_BG_TREE: u64 = 1 << 38;
/// `btrfs_super_block.flags`: btrfstune rewriting data checksums, unfinished.
pub const BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM: u64 = 1 << 39;
/// `btrfs_super_block.flags`: btrfstune rewriting metadata checksums,
/// unfinished.
pub const BTRFS_SUPER_FLAG_CHANGING_META_CSUM: u64 = 1 << 40;

/// Backref revision in the top byte of `btrfs_header.flags` of blocks written
/// since 2.6.31 (0 is the old format).
pub const BTRFS_MIXED_BACKREF_REV: u8 = 1;
/// Bit position of the backref revision in `btrfs_header.flags`.
pub const BTRFS_BACKREF_REV_SHIFT: u32 = 56;

// Feature flags.
/// compat_ro: the free space tree exists.
pub const BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE: u64 = 1 << 0;
/// compat_ro: the free space tree is complete and may be trusted.
pub const BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID: u64 = 1 << 1;
/// compat_ro: some inode has fs-verity items.
pub const BTRFS_FEATURE_COMPAT_RO_VERITY: u64 = 1 << 2;
/// compat_ro: block group items live in the block group tree, not the extent
/// tree.
pub const BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE: u64 = 1 << 3;

/// incompat: back references of the 2.6.31 format (full and shared refs).
pub const BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF: u64 = 1 << 0;
/// incompat: the default subvolume was changed from FS_TREE.
pub const BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL: u64 = 1 << 1;
/// incompat: data and metadata may share block groups.
pub const BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS: u64 = 1 << 2;
/// incompat: LZO compressed extents may exist.
pub const BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO: u64 = 1 << 3;
/// incompat: zstd compressed extents may exist.
pub const BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD: u64 = 1 << 4;
/// incompat: node size may exceed 4 KiB.
pub const BTRFS_FEATURE_INCOMPAT_BIG_METADATA: u64 = 1 << 5;
/// incompat: INODE_EXTREF items may exist (more hard links than fit in an
/// INODE_REF).
pub const BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF: u64 = 1 << 6;
/// incompat: RAID5 or RAID6 chunks may exist.
pub const BTRFS_FEATURE_INCOMPAT_RAID56: u64 = 1 << 7;
/// incompat: tree blocks may use METADATA_ITEM, without
/// `btrfs_tree_block_info`.
pub const BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA: u64 = 1 << 8;
/// incompat: holes are implicit; no file extent items with `disk_bytenr` 0
/// required.
pub const BTRFS_FEATURE_INCOMPAT_NO_HOLES: u64 = 1 << 9;
/// incompat: tree blocks carry `metadata_uuid`, which may differ from the fsid.
pub const BTRFS_FEATURE_INCOMPAT_METADATA_UUID: u64 = 1 << 10;
/// incompat: RAID1C3 or RAID1C4 chunks may exist.
pub const BTRFS_FEATURE_INCOMPAT_RAID1C34: u64 = 1 << 11;
/// incompat: zoned mode (sequential-write zones).
pub const BTRFS_FEATURE_INCOMPAT_ZONED: u64 = 1 << 12;
/// incompat: extent tree v2 (global roots); experimental.
pub const BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2: u64 = 1 << 13;
/// incompat: the RAID stripe tree maps logical to physical addresses.
pub const BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE: u64 = 1 << 14;
/// incompat: simple quotas (EXTENT_OWNER_REF inline refs).
pub const BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA: u64 = 1 << 16;

/// Incompat features this engine can read. Anything else is refused.
pub const SUPPORTED_INCOMPAT: u64 = BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF
    | BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL
    | BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS
    | BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO
    | BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD
    | BTRFS_FEATURE_INCOMPAT_BIG_METADATA
    | BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF
    | BTRFS_FEATURE_INCOMPAT_RAID56
    | BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA
    | BTRFS_FEATURE_INCOMPAT_NO_HOLES
    | BTRFS_FEATURE_INCOMPAT_METADATA_UUID
    | BTRFS_FEATURE_INCOMPAT_RAID1C34
    | BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA;

/// Compat-ro features this engine knows; any other allows read-only access
/// only.
pub const SUPPORTED_COMPAT_RO: u64 = BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE
    | BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID
    | BTRFS_FEATURE_COMPAT_RO_VERITY
    | BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE;

// Block group / chunk type flags.
/// Block group / chunk type: file data.
pub const BTRFS_BLOCK_GROUP_DATA: u64 = 1 << 0;
/// Block group / chunk type: the chunk tree.
pub const BTRFS_BLOCK_GROUP_SYSTEM: u64 = 1 << 1;
/// Block group / chunk type: every other tree.
pub const BTRFS_BLOCK_GROUP_METADATA: u64 = 1 << 2;
/// Profile: striped over all stripes, no redundancy.
pub const BTRFS_BLOCK_GROUP_RAID0: u64 = 1 << 3;
/// Profile: two copies on two devices.
pub const BTRFS_BLOCK_GROUP_RAID1: u64 = 1 << 4;
/// Profile: two copies, which may be on the same device.
pub const BTRFS_BLOCK_GROUP_DUP: u64 = 1 << 5;
/// Profile: striped over mirrored pairs (`sub_stripes` 2).
pub const BTRFS_BLOCK_GROUP_RAID10: u64 = 1 << 6;
/// Profile: striped with one parity stripe.
pub const BTRFS_BLOCK_GROUP_RAID5: u64 = 1 << 7;
/// Profile: striped with two parity stripes.
pub const BTRFS_BLOCK_GROUP_RAID6: u64 = 1 << 8;
/// Profile: three copies on three devices.
pub const BTRFS_BLOCK_GROUP_RAID1C3: u64 = 1 << 9;
/// Profile: four copies on four devices.
pub const BTRFS_BLOCK_GROUP_RAID1C4: u64 = 1 << 10;
/// The type bits (DATA, SYSTEM, METADATA).
pub const BTRFS_BLOCK_GROUP_TYPE_MASK: u64 =
    BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_METADATA;
/// The profile bits; none set means single.
pub const BTRFS_BLOCK_GROUP_PROFILE_MASK: u64 = BTRFS_BLOCK_GROUP_RAID0
    | BTRFS_BLOCK_GROUP_RAID1
    | BTRFS_BLOCK_GROUP_DUP
    | BTRFS_BLOCK_GROUP_RAID10
    | BTRFS_BLOCK_GROUP_RAID5
    | BTRFS_BLOCK_GROUP_RAID6
    | BTRFS_BLOCK_GROUP_RAID1C3
    | BTRFS_BLOCK_GROUP_RAID1C4;

// Extent item flags.
/// `btrfs_extent_item.flags`: a data extent.
pub const BTRFS_EXTENT_FLAG_DATA: u64 = 1 << 0;
/// `btrfs_extent_item.flags`: a tree block.
pub const BTRFS_EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;
/// `btrfs_extent_item.flags`: tree block referenced by parent
/// (SHARED_BLOCK_REF) rather than by root.
pub const BTRFS_BLOCK_FLAG_FULL_BACKREF: u64 = 1 << 8;

// File extent types and compression.
/// `btrfs_file_extent_item.type`: data stored in the item itself.
pub const BTRFS_FILE_EXTENT_INLINE: u8 = 0;
/// `btrfs_file_extent_item.type`: regular extent on disk (`disk_bytenr` 0 is a
/// hole).
pub const BTRFS_FILE_EXTENT_REG: u8 = 1;
/// `btrfs_file_extent_item.type`: preallocated, unwritten; reads as zeros.
pub const BTRFS_FILE_EXTENT_PREALLOC: u8 = 2;
/// `btrfs_file_extent_item.compression`: uncompressed.
pub const BTRFS_COMPRESS_NONE: u8 = 0;
/// `btrfs_file_extent_item.compression`: zlib.
pub const BTRFS_COMPRESS_ZLIB: u8 = 1;
/// `btrfs_file_extent_item.compression`: LZO, in per-sector segments.
pub const BTRFS_COMPRESS_LZO: u8 = 2;
/// `btrfs_file_extent_item.compression`: zstd.
pub const BTRFS_COMPRESS_ZSTD: u8 = 3;

// Directory entry types (BTRFS_FT_*).
/// `btrfs_dir_item.type`: unknown.
pub const BTRFS_FT_UNKNOWN: u8 = 0;
/// `btrfs_dir_item.type`: regular file.
pub const BTRFS_FT_REG_FILE: u8 = 1;
/// `btrfs_dir_item.type`: directory (or a subvolume's root).
pub const BTRFS_FT_DIR: u8 = 2;
/// `btrfs_dir_item.type`: character device.
pub const BTRFS_FT_CHRDEV: u8 = 3;
/// `btrfs_dir_item.type`: block device.
pub const BTRFS_FT_BLKDEV: u8 = 4;
/// `btrfs_dir_item.type`: named pipe.
pub const BTRFS_FT_FIFO: u8 = 5;
/// `btrfs_dir_item.type`: socket.
pub const BTRFS_FT_SOCK: u8 = 6;
/// `btrfs_dir_item.type`: symbolic link.
pub const BTRFS_FT_SYMLINK: u8 = 7;
/// `btrfs_dir_item.type` of every XATTR_ITEM entry.
pub const BTRFS_FT_XATTR: u8 = 8;
/// One past the largest file type.
pub const BTRFS_FT_MAX: u8 = 9;
/// Bit OR'd into `btrfs_dir_item.type` when the name is fscrypt-encrypted.
pub const BTRFS_FT_ENCRYPTED: u8 = 0x80;

// Inode flags.
/// `btrfs_inode_item.flags`: no data checksums.
pub const BTRFS_INODE_NODATASUM: u64 = 1 << 0;
/// `btrfs_inode_item.flags`: data overwritten in place (chattr +C); implies
/// NODATASUM.
pub const BTRFS_INODE_NODATACOW: u64 = 1 << 1;
/// `btrfs_inode_item.flags`: read-only; defined but not set by the kernel.
pub const BTRFS_INODE_READONLY: u64 = 1 << 2;
/// `btrfs_inode_item.flags`: never compress (chattr +m).
pub const BTRFS_INODE_NOCOMPRESS: u64 = 1 << 3;
/// `btrfs_inode_item.flags`: the inode has had preallocated extents.
pub const BTRFS_INODE_PREALLOC: u64 = 1 << 4;
/// `btrfs_inode_item.flags`: synchronous writes (chattr +S).
pub const BTRFS_INODE_SYNC: u64 = 1 << 5;
/// `btrfs_inode_item.flags`: immutable (chattr +i).
pub const BTRFS_INODE_IMMUTABLE: u64 = 1 << 6;
/// `btrfs_inode_item.flags`: append only (chattr +a).
pub const BTRFS_INODE_APPEND: u64 = 1 << 7;
/// `btrfs_inode_item.flags`: skip in dump (chattr +d).
pub const BTRFS_INODE_NODUMP: u64 = 1 << 8;
/// `btrfs_inode_item.flags`: no atime updates (chattr +A).
pub const BTRFS_INODE_NOATIME: u64 = 1 << 9;
/// `btrfs_inode_item.flags`: synchronous directory updates (chattr +D).
pub const BTRFS_INODE_DIRSYNC: u64 = 1 << 10;
/// `btrfs_inode_item.flags`: compress data (chattr +c).
pub const BTRFS_INODE_COMPRESS: u64 = 1 << 11;
/// Set in `btrfs_root_item.inode.flags` once the root item's `flags` and
/// `byte_limit` have been zeroed (old kernels left them uninitialised).
pub const BTRFS_INODE_ROOT_ITEM_INIT: u64 = 1 << 31;

// Root item flags.
/// `btrfs_root_item.flags`: read-only subvolume or snapshot.
pub const BTRFS_ROOT_SUBVOL_RDONLY: u64 = 1 << 0;
/// `btrfs_root_item.flags`: subvolume being deleted.
pub const BTRFS_ROOT_SUBVOL_DEAD: u64 = 1 << 48;

// Free space info flags.
/// `btrfs_free_space_info.flags`: the block group's free space is in
/// FREE_SPACE_BITMAP items.
pub const BTRFS_FREE_SPACE_USING_BITMAPS: u32 = 1 << 0;

// Qgroup status flags.
/// `btrfs_qgroup_status_item.flags`: quotas enabled.
pub const BTRFS_QGROUP_STATUS_FLAG_ON: u64 = 1 << 0;
/// `btrfs_qgroup_status_item.flags`: rescan in progress, resuming at `rescan`.
pub const BTRFS_QGROUP_STATUS_FLAG_RESCAN: u64 = 1 << 1;
/// `btrfs_qgroup_status_item.flags`: qgroup numbers are stale until a rescan.
pub const BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT: u64 = 1 << 2;
/// `btrfs_qgroup_status_item.flags`: simple quotas; the item carries
/// `enable_gen`.
pub const BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE: u64 = 1 << 3;

/// True when `objectid` names a tree that holds inodes (fs trees, subvolumes,
/// the data relocation tree), as opposed to a metadata tree.
pub fn is_fstree(objectid: u64) -> bool {
    objectid == BTRFS_FS_TREE_OBJECTID
        || objectid == BTRFS_DATA_RELOC_TREE_OBJECTID
        || (BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&objectid)
}
