//! Names of object ids, key types and flags exactly as btrfs-progs'
//! `print-tree.c` prints them, so `btrkit-dump tree` output can be diffed
//! against `btrfs inspect-internal dump-tree`.

use super::consts::*;
use super::key::Key;
use super::qgroup::qgroupid_str;
use std::fmt::Write;

/// print-tree.c's name of key type `ty` ("INODE_ITEM", ...); type 0 under
/// FREE_SPACE_OBJECTID is "UNTYPED". None for an unknown type.
pub fn key_type_name(objectid: u64, ty: u8) -> Option<&'static str> {
    Some(match ty {
        0 if objectid == BTRFS_FREE_SPACE_OBJECTID => "UNTYPED",
        BTRFS_INODE_ITEM_KEY => "INODE_ITEM",
        BTRFS_INODE_REF_KEY => "INODE_REF",
        BTRFS_INODE_EXTREF_KEY => "INODE_EXTREF",
        BTRFS_XATTR_ITEM_KEY => "XATTR_ITEM",
        BTRFS_VERITY_DESC_ITEM_KEY => "VERITY_DESC_ITEM",
        BTRFS_VERITY_MERKLE_ITEM_KEY => "VERITY_MERKLE_ITEM",
        BTRFS_ORPHAN_ITEM_KEY => "ORPHAN_ITEM",
        BTRFS_DIR_LOG_ITEM_KEY => "DIR_LOG_ITEM",
        BTRFS_DIR_LOG_INDEX_KEY => "DIR_LOG_INDEX",
        BTRFS_DIR_ITEM_KEY => "DIR_ITEM",
        BTRFS_DIR_INDEX_KEY => "DIR_INDEX",
        BTRFS_EXTENT_DATA_KEY => "EXTENT_DATA",
        BTRFS_CSUM_ITEM_KEY => "CSUM_ITEM",
        BTRFS_EXTENT_CSUM_KEY => "EXTENT_CSUM",
        BTRFS_ROOT_ITEM_KEY => "ROOT_ITEM",
        BTRFS_ROOT_BACKREF_KEY => "ROOT_BACKREF",
        BTRFS_ROOT_REF_KEY => "ROOT_REF",
        BTRFS_EXTENT_ITEM_KEY => "EXTENT_ITEM",
        BTRFS_METADATA_ITEM_KEY => "METADATA_ITEM",
        BTRFS_EXTENT_OWNER_REF_KEY => "EXTENT_OWNER_REF",
        BTRFS_TREE_BLOCK_REF_KEY => "TREE_BLOCK_REF",
        BTRFS_EXTENT_DATA_REF_KEY => "EXTENT_DATA_REF",
        BTRFS_EXTENT_REF_V0_KEY => "EXTENT_REF_V0",
        BTRFS_SHARED_BLOCK_REF_KEY => "SHARED_BLOCK_REF",
        BTRFS_SHARED_DATA_REF_KEY => "SHARED_DATA_REF",
        BTRFS_BLOCK_GROUP_ITEM_KEY => "BLOCK_GROUP_ITEM",
        BTRFS_FREE_SPACE_INFO_KEY => "FREE_SPACE_INFO",
        BTRFS_FREE_SPACE_EXTENT_KEY => "FREE_SPACE_EXTENT",
        BTRFS_FREE_SPACE_BITMAP_KEY => "FREE_SPACE_BITMAP",
        BTRFS_DEV_EXTENT_KEY => "DEV_EXTENT",
        BTRFS_DEV_ITEM_KEY => "DEV_ITEM",
        BTRFS_CHUNK_ITEM_KEY => "CHUNK_ITEM",
        BTRFS_RAID_STRIPE_KEY => "RAID_STRIPE",
        BTRFS_QGROUP_STATUS_KEY => "QGROUP_STATUS",
        BTRFS_QGROUP_INFO_KEY => "QGROUP_INFO",
        BTRFS_QGROUP_LIMIT_KEY => "QGROUP_LIMIT",
        BTRFS_QGROUP_RELATION_KEY => "QGROUP_RELATION",
        BTRFS_TEMPORARY_ITEM_KEY => "TEMPORARY_ITEM",
        BTRFS_PERSISTENT_ITEM_KEY => "PERSISTENT_ITEM",
        BTRFS_IDENTITY_REMAP_KEY => "IDENTITY_REMAP",
        BTRFS_REMAP_KEY => "REMAP",
        BTRFS_REMAP_BACKREF_KEY => "REMAP_BACKREF",
        BTRFS_DEV_REPLACE_KEY => "DEV_REPLACE",
        BTRFS_UUID_KEY_SUBVOL => "UUID_KEY_SUBVOL",
        BTRFS_UUID_KEY_RECEIVED_SUBVOL => "UUID_KEY_RECEIVED_SUBVOL",
        BTRFS_STRING_ITEM_KEY => "STRING_ITEM",
        _ => return None,
    })
}

/// Append the name of key type `ty` to `out`, or `UNKNOWN.<ty>` as print-tree.c
/// does.
pub fn write_key_type(out: &mut String, objectid: u64, ty: u8) {
    match key_type_name(objectid, ty) {
        Some(n) => out.push_str(n),
        None => {
            let _ = write!(out, "UNKNOWN.{ty}");
        }
    }
}

/// Well-known tree and object names, independent of the key type.
pub fn objectid_name(objectid: u64) -> Option<&'static str> {
    Some(match objectid {
        BTRFS_ROOT_TREE_OBJECTID => "ROOT_TREE",
        BTRFS_EXTENT_TREE_OBJECTID => "EXTENT_TREE",
        BTRFS_CHUNK_TREE_OBJECTID => "CHUNK_TREE",
        BTRFS_DEV_TREE_OBJECTID => "DEV_TREE",
        BTRFS_FS_TREE_OBJECTID => "FS_TREE",
        BTRFS_ROOT_TREE_DIR_OBJECTID => "ROOT_TREE_DIR",
        BTRFS_CSUM_TREE_OBJECTID => "CSUM_TREE",
        BTRFS_BALANCE_OBJECTID => "BALANCE",
        BTRFS_ORPHAN_OBJECTID => "ORPHAN",
        BTRFS_TREE_LOG_OBJECTID => "TREE_LOG",
        BTRFS_TREE_LOG_FIXUP_OBJECTID => "LOG_FIXUP",
        BTRFS_TREE_RELOC_OBJECTID => "TREE_RELOC",
        BTRFS_DATA_RELOC_TREE_OBJECTID => "DATA_RELOC_TREE",
        BTRFS_EXTENT_CSUM_OBJECTID => "EXTENT_CSUM",
        BTRFS_FREE_SPACE_OBJECTID => "FREE_SPACE",
        BTRFS_FREE_INO_OBJECTID => "FREE_INO",
        BTRFS_QUOTA_TREE_OBJECTID => "QUOTA_TREE",
        BTRFS_UUID_TREE_OBJECTID => "UUID_TREE",
        BTRFS_FREE_SPACE_TREE_OBJECTID => "FREE_SPACE_TREE",
        BTRFS_BLOCK_GROUP_TREE_OBJECTID => "BLOCK_GROUP_TREE",
        BTRFS_RAID_STRIPE_TREE_OBJECTID => "RAID_STRIPE_TREE",
        BTRFS_REMAP_TREE_OBJECTID => "REMAP_TREE",
        BTRFS_CSUM_CHANGE_OBJECTID => "CSUM_CHANGE",
        BTRFS_MULTIPLE_OBJECTIDS => "MULTIPLE",
        u64::MAX => "-1",
        _ => return None,
    })
}

/// print-tree.c's `print_objectid`: the object id as the key type wants it.
pub fn write_objectid(out: &mut String, objectid: u64, ty: u8) {
    match ty {
        BTRFS_PERSISTENT_ITEM_KEY => {
            if objectid == BTRFS_DEV_STATS_OBJECTID {
                out.push_str("DEV_STATS");
            } else {
                let _ = write!(out, "{objectid}");
            }
            return;
        }
        BTRFS_DEV_EXTENT_KEY => {
            let _ = write!(out, "{objectid}");
            return;
        }
        BTRFS_QGROUP_RELATION_KEY => {
            out.push_str(&qgroupid_str(objectid));
            return;
        }
        BTRFS_UUID_KEY_SUBVOL | BTRFS_UUID_KEY_RECEIVED_SUBVOL => {
            let _ = write!(out, "0x{objectid:016x}");
            return;
        }
        _ => {}
    }
    if objectid == BTRFS_ROOT_TREE_OBJECTID && ty == BTRFS_DEV_ITEM_KEY {
        out.push_str("DEV_ITEMS");
    } else if objectid == BTRFS_FIRST_CHUNK_TREE_OBJECTID && ty == BTRFS_CHUNK_ITEM_KEY {
        out.push_str("FIRST_CHUNK_TREE");
    } else if let Some(n) = objectid_name(objectid) {
        out.push_str(n);
    } else {
        let _ = write!(out, "{objectid}");
    }
}

/// print-tree.c's `btrfs_print_key`, without the leading "key ": `(OBJ TYPE OFF)`.
pub fn write_key(out: &mut String, k: &Key) {
    out.push('(');
    write_objectid(out, k.objectid, k.ty);
    out.push(' ');
    write_key_type(out, k.objectid, k.ty);
    match k.ty {
        BTRFS_QGROUP_RELATION_KEY | BTRFS_QGROUP_INFO_KEY | BTRFS_QGROUP_LIMIT_KEY => {
            let _ = write!(out, " {})", qgroupid_str(k.offset));
        }
        BTRFS_UUID_KEY_SUBVOL | BTRFS_UUID_KEY_RECEIVED_SUBVOL => {
            let _ = write!(out, " 0x{:016x})", k.offset);
        }
        BTRFS_ROOT_ITEM_KEY => {
            // Only a reloc tree's offset is a tree id; for others it is the
            // creation generation, printed as a plain number even when -1.
            out.push(' ');
            if k.objectid == BTRFS_TREE_RELOC_OBJECTID {
                write_objectid(out, k.offset, k.ty);
            } else {
                let _ = write!(out, "{}", k.offset);
            }
            out.push(')');
        }
        _ if k.offset == u64::MAX => out.push_str(" -1)"),
        _ => {
            let _ = write!(out, " {})", k.offset);
        }
    }
}

/// A key as btrfs-progs prints it: `(OBJ TYPE OFF)`, see [`write_key`].
pub fn key_string(k: &Key) -> String {
    let mut s = String::with_capacity(48);
    write_key(&mut s, k);
    s
}

/// Parse a tree name as users type it (`root`, `extent`, `fs`, `csum`, ...,
/// or a number, or a C-style name such as `FS_TREE`).
pub fn parse_tree_name(s: &str) -> Option<u64> {
    let l = s.to_ascii_lowercase();
    let l = l.trim_end_matches("_tree").trim_end_matches("-tree");
    Some(match l {
        "root" => BTRFS_ROOT_TREE_OBJECTID,
        "extent" => BTRFS_EXTENT_TREE_OBJECTID,
        "chunk" => BTRFS_CHUNK_TREE_OBJECTID,
        "dev" | "device" => BTRFS_DEV_TREE_OBJECTID,
        "fs" | "5" => BTRFS_FS_TREE_OBJECTID,
        "csum" | "checksum" => BTRFS_CSUM_TREE_OBJECTID,
        "quota" => BTRFS_QUOTA_TREE_OBJECTID,
        "uuid" => BTRFS_UUID_TREE_OBJECTID,
        "free_space" | "free-space" | "fst" => BTRFS_FREE_SPACE_TREE_OBJECTID,
        "block_group" | "block-group" | "bgt" => BTRFS_BLOCK_GROUP_TREE_OBJECTID,
        "raid_stripe" | "raid-stripe" => BTRFS_RAID_STRIPE_TREE_OBJECTID,
        "data_reloc" | "data-reloc" => BTRFS_DATA_RELOC_TREE_OBJECTID,
        "tree_log" | "log" => BTRFS_TREE_LOG_OBJECTID,
        _ => {
            if let Some(h) = l.strip_prefix("0x") {
                return u64::from_str_radix(h, 16).ok();
            }
            if let Ok(v) = l.parse::<i64>() {
                return Some(v as u64);
            }
            return None;
        }
    })
}

/// Name of a `btrfs_super_block.csum_type` as btrfs-progs prints it, "unknown"
/// for an unknown type.
pub fn csum_type_name(t: u16) -> &'static str {
    match t {
        BTRFS_CSUM_TYPE_CRC32 => "crc32c",
        BTRFS_CSUM_TYPE_XXHASH => "xxhash64",
        BTRFS_CSUM_TYPE_SHA256 => "sha256",
        BTRFS_CSUM_TYPE_BLAKE2 => "blake2b",
        _ => "unknown",
    }
}

/// Names of the incompat feature bits in `flags`, unknown bits as one "unknown
/// flag: 0x.." entry.
pub fn incompat_names(flags: u64) -> Vec<String> {
    let table: &[(u64, &str)] = &[
        (BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF, "MIXED_BACKREF"),
        (BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL, "DEFAULT_SUBVOL"),
        (BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS, "MIXED_GROUPS"),
        (BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO, "COMPRESS_LZO"),
        (BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD, "COMPRESS_ZSTD"),
        (BTRFS_FEATURE_INCOMPAT_BIG_METADATA, "BIG_METADATA"),
        (BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF, "EXTENDED_IREF"),
        (BTRFS_FEATURE_INCOMPAT_RAID56, "RAID56"),
        (BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA, "SKINNY_METADATA"),
        (BTRFS_FEATURE_INCOMPAT_NO_HOLES, "NO_HOLES"),
        (BTRFS_FEATURE_INCOMPAT_METADATA_UUID, "METADATA_UUID"),
        (BTRFS_FEATURE_INCOMPAT_RAID1C34, "RAID1C34"),
        (BTRFS_FEATURE_INCOMPAT_ZONED, "ZONED"),
        (BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2, "EXTENT_TREE_V2"),
        (BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE, "RAID_STRIPE_TREE"),
        (BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA, "SIMPLE_QUOTA"),
    ];
    flag_names(flags, table)
}

/// Names of the compat_ro feature bits in `flags`, unknown bits as one "unknown
/// flag: 0x.." entry.
pub fn compat_ro_names(flags: u64) -> Vec<String> {
    let table: &[(u64, &str)] = &[
        (BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE, "FREE_SPACE_TREE"),
        (
            BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID,
            "FREE_SPACE_TREE_VALID",
        ),
        (BTRFS_FEATURE_COMPAT_RO_VERITY, "VERITY"),
        (BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE, "BLOCK_GROUP_TREE"),
    ];
    flag_names(flags, table)
}

/// Names of the `btrfs_super_block.flags` bits in `flags`, unknown bits as one
/// "unknown flag: 0x.." entry.
pub fn super_flag_names(flags: u64) -> Vec<String> {
    let table: &[(u64, &str)] = &[
        (BTRFS_HEADER_FLAG_WRITTEN, "WRITTEN"),
        (BTRFS_HEADER_FLAG_RELOC, "RELOC"),
        (BTRFS_SUPER_FLAG_ERROR, "ERROR"),
        (BTRFS_SUPER_FLAG_SEEDING, "SEEDING"),
        (BTRFS_SUPER_FLAG_METADUMP, "METADUMP"),
        (BTRFS_SUPER_FLAG_METADUMP_V2, "METADUMP_V2"),
        (BTRFS_SUPER_FLAG_CHANGING_FSID, "CHANGING_FSID"),
        (BTRFS_SUPER_FLAG_CHANGING_FSID_V2, "CHANGING_FSID_V2"),
        (BTRFS_SUPER_FLAG_CHANGING_BG_TREE, "CHANGING_BG_TREE"),
        (BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM, "CHANGING_DATA_CSUM"),
        (BTRFS_SUPER_FLAG_CHANGING_META_CSUM, "CHANGING_META_CSUM"),
    ];
    flag_names(flags, table)
}

/// A profile name as mkfs.btrfs takes it (`-m`/`-d`), as block group
/// profile bits: single, dup, raid0, raid1, raid1c3, raid1c4, raid10,
/// raid5, raid6.
pub fn parse_profile(name: &str) -> crate::Result<u64> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "single" => 0,
        "dup" => BTRFS_BLOCK_GROUP_DUP,
        "raid0" => BTRFS_BLOCK_GROUP_RAID0,
        "raid1" => BTRFS_BLOCK_GROUP_RAID1,
        "raid1c3" => BTRFS_BLOCK_GROUP_RAID1C3,
        "raid1c4" => BTRFS_BLOCK_GROUP_RAID1C4,
        "raid10" => BTRFS_BLOCK_GROUP_RAID10,
        "raid5" => BTRFS_BLOCK_GROUP_RAID5,
        "raid6" => BTRFS_BLOCK_GROUP_RAID6,
        _ => {
            return Err(crate::Error::Invalid(format!(
                "unknown profile '{name}' (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6)"
            )))
        }
    })
}

/// A profile's name as btrfs(8) takes it (`single`, `dup`, `raid1`...).
pub fn profile_name(flags: u64) -> &'static str {
    match flags & BTRFS_BLOCK_GROUP_PROFILE_MASK {
        0 => "single",
        BTRFS_BLOCK_GROUP_RAID0 => "raid0",
        BTRFS_BLOCK_GROUP_RAID1 => "raid1",
        BTRFS_BLOCK_GROUP_DUP => "dup",
        BTRFS_BLOCK_GROUP_RAID10 => "raid10",
        BTRFS_BLOCK_GROUP_RAID5 => "raid5",
        BTRFS_BLOCK_GROUP_RAID6 => "raid6",
        BTRFS_BLOCK_GROUP_RAID1C3 => "raid1c3",
        BTRFS_BLOCK_GROUP_RAID1C4 => "raid1c4",
        _ => "unknown",
    }
}

/// Block group or chunk flags as btrfs-progs prints them: `TYPE|profile`, e.g.
/// `DATA|single`, `METADATA|DUP`.
pub fn block_group_flags_str(flags: u64) -> String {
    let ty = match flags & BTRFS_BLOCK_GROUP_TYPE_MASK {
        BTRFS_BLOCK_GROUP_DATA => "DATA",
        BTRFS_BLOCK_GROUP_SYSTEM => "SYSTEM",
        BTRFS_BLOCK_GROUP_METADATA => "METADATA",
        x if x == BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA => "DATA|METADATA",
        _ => "UNKNOWN",
    };
    let prof = match flags & BTRFS_BLOCK_GROUP_PROFILE_MASK {
        0 => "single",
        BTRFS_BLOCK_GROUP_RAID0 => "RAID0",
        BTRFS_BLOCK_GROUP_RAID1 => "RAID1",
        BTRFS_BLOCK_GROUP_DUP => "DUP",
        BTRFS_BLOCK_GROUP_RAID10 => "RAID10",
        BTRFS_BLOCK_GROUP_RAID5 => "RAID5",
        BTRFS_BLOCK_GROUP_RAID6 => "RAID6",
        BTRFS_BLOCK_GROUP_RAID1C3 => "RAID1C3",
        BTRFS_BLOCK_GROUP_RAID1C4 => "RAID1C4",
        _ => "UNKNOWN",
    };
    format!("{ty}|{prof}")
}

/// Inode flags (`btrfs_inode_item.flags`) by name. The first
/// [`PROGS_INODE_FLAGS`] are those btrfs-progs 6.2's print-tree names, in
/// its order; then ROOT_ITEM_INIT and the read-only compat flag fs-verity
/// sets in the field's upper half.
pub const INODE_FLAG_NAMES: &[(u64, &str)] = &[
    (BTRFS_INODE_NODATASUM, "NODATASUM"),
    (BTRFS_INODE_NODATACOW, "NODATACOW"),
    (BTRFS_INODE_READONLY, "READONLY"),
    (BTRFS_INODE_NOCOMPRESS, "NOCOMPRESS"),
    (BTRFS_INODE_PREALLOC, "PREALLOC"),
    (BTRFS_INODE_SYNC, "SYNC"),
    (BTRFS_INODE_IMMUTABLE, "IMMUTABLE"),
    (BTRFS_INODE_APPEND, "APPEND"),
    (BTRFS_INODE_NODUMP, "NODUMP"),
    (BTRFS_INODE_NOATIME, "NOATIME"),
    (BTRFS_INODE_DIRSYNC, "DIRSYNC"),
    (BTRFS_INODE_COMPRESS, "COMPRESS"),
    (BTRFS_INODE_ROOT_ITEM_INIT, "ROOT_ITEM_INIT"),
    (1 << 32, "RO_VERITY"),
];

/// How many of [`INODE_FLAG_NAMES`] btrfs-progs 6.2's dump-tree prints.
pub const PROGS_INODE_FLAGS: usize = 12;

/// Names of the inode flags set in `flags`; bits without a name are shown
/// as one hex remainder.
pub fn inode_flag_names(flags: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = flags;
    for &(bit, name) in INODE_FLAG_NAMES {
        if flags & bit != 0 {
            out.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("0x{rest:x}"));
    }
    out
}

/// Name of a compression type (`btrfs_file_extent_item.compression`,
/// the `compression` property), None for a type this format does not
/// define.
pub fn compression_name(c: u8) -> Option<&'static str> {
    match c {
        BTRFS_COMPRESS_NONE => Some("none"),
        BTRFS_COMPRESS_ZLIB => Some("zlib"),
        BTRFS_COMPRESS_LZO => Some("lzo"),
        BTRFS_COMPRESS_ZSTD => Some("zstd"),
        _ => None,
    }
}

fn flag_names(flags: u64, table: &[(u64, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = flags;
    for &(bit, name) in table {
        if flags & bit != 0 {
            out.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("unknown flag: 0x{rest:x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn keys_as_btrfs_progs() {
        assert_eq!(key_string(&Key::new(256, 1, 0)), "(256 INODE_ITEM 0)");
        assert_eq!(
            key_string(&Key::new(5, 132, u64::MAX)),
            "(FS_TREE ROOT_ITEM 18446744073709551615)"
        );
        assert_eq!(
            key_string(&Key::new(2, 132, 0)),
            "(EXTENT_TREE ROOT_ITEM 0)"
        );
        assert_eq!(
            key_string(&Key::new(
                BTRFS_TREE_RELOC_OBJECTID,
                132,
                BTRFS_DATA_RELOC_TREE_OBJECTID
            )),
            "(TREE_RELOC ROOT_ITEM DATA_RELOC_TREE)"
        );
        assert_eq!(
            key_string(&Key::new(256, 228, 22020096)),
            "(FIRST_CHUNK_TREE CHUNK_ITEM 22020096)"
        );
        assert_eq!(key_string(&Key::new(1, 216, 1)), "(DEV_ITEMS DEV_ITEM 1)");
        assert_eq!(
            key_string(&Key::new(1, 204, 1 << 20)),
            "(1 DEV_EXTENT 1048576)"
        );
        assert_eq!(
            key_string(&Key::new(0x1234, 251, 0xabcd)),
            "(0x0000000000001234 UUID_KEY_SUBVOL 0x000000000000abcd)"
        );
        assert_eq!(key_string(&Key::new(0, 242, 5)), "(0 QGROUP_INFO 0/5)");
        assert_eq!(
            key_string(&Key::new(BTRFS_FREE_SPACE_OBJECTID, 0, 0)),
            "(FREE_SPACE UNTYPED 0)"
        );
        assert_eq!(
            key_string(&Key::new(0, 249, 1)),
            "(DEV_STATS PERSISTENT_ITEM 1)"
        );
        assert_eq!(key_string(&Key::new(7, 3, 1)), "(CSUM_TREE UNKNOWN.3 1)");
    }
}
