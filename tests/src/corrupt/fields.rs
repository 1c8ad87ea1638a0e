//! Field names of every item body the generator edits, the superblock and
//! the tree block header: name -> (offset, width) inside the structure.
//! Offsets and widths come from btrkit-core's format structures
//! (`offset_of!` and the field's size), never from numbers written here,
//! so they follow the format module.
//!
//! Names are the C member names of `btrfs_tree.h` (`generation`,
//! `disk_bytenr`, ...), nested members joined with a dot
//! (`location.objectid`, `inode.generation`, `dev_item.bytes_used`), and
//! for an extent item's inline references `ref[N].FIELD` (N from 0 in item
//! order): `ref[N].type` (the type byte), `ref[N].offset` (the root of a
//! TREE_BLOCK_REF, the parent of a SHARED_BLOCK_REF or SHARED_DATA_REF,
//! the owner of an EXTENT_OWNER_REF, the file offset of an
//! EXTENT_DATA_REF), `ref[N].root`, `ref[N].objectid`, `ref[N].count`.
//! A few aliases as btrfs-corrupt-block spells them: `isize` for an
//! inode's `size`.

use btrkit_core::format::block_group::BlockGroupItem;
use btrkit_core::format::chunk::{ChunkItem, Stripe};
use btrkit_core::format::consts::*;
use btrkit_core::format::dev::{DevExtent, DevItem};
use btrkit_core::format::dir::DirItem;
use btrkit_core::format::extent::{
    parse_extent_item, ExtentDataRef, ExtentItem, TreeBlockInfo, EXTENT_ITEM_SIZE,
    TREE_BLOCK_INFO_SIZE,
};
use btrkit_core::format::file_extent::{FileExtentItem, FILE_EXTENT_INLINE_DATA_START};
use btrkit_core::format::free_space::FreeSpaceInfo;
use btrkit_core::format::header::{Header, Item};
use btrkit_core::format::inode::{InodeExtref, InodeItem, InodeRef};
use btrkit_core::format::key::Key;
use btrkit_core::format::root::{RootItem, RootRef};
use btrkit_core::format::superblock::Superblock;

/// One field: where it is in its structure and how wide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDef {
    pub name: String,
    /// Byte offset inside the item body (or superblock, or block header).
    pub off: usize,
    /// Width in bytes: 1, 2, 4 or 8 for integers (little-endian); more for
    /// byte arrays (uuids), set as hex bytes.
    pub width: usize,
}

impl FieldDef {
    pub fn new(name: impl Into<String>, off: usize, width: usize) -> FieldDef {
        FieldDef {
            name: name.into(),
            off,
            width,
        }
    }
    /// The same field `base` bytes further on, its name prefixed.
    fn shifted(mut self, prefix: &str, base: usize) -> FieldDef {
        self.name = format!("{prefix}{}", self.name);
        self.off += base;
        self
    }
    /// Whether it is an integer (set by value) rather than a byte array.
    pub fn is_int(&self) -> bool {
        matches!(self.width, 1 | 2 | 4 | 8)
    }
}

/// `FieldDef` of member `$f` (a dotted path) of the core structure `$t`.
macro_rules! fld {
    ($t:ty, $name:expr, $($f:ident).+) => {{
        let z = <$t as zerocopy::FromZeros>::new_zeroed();
        FieldDef::new(
            $name,
            core::mem::offset_of!($t, $($f).+),
            core::mem::size_of_val(&z.$($f).+),
        )
    }};
}

/// `btrfs_inode_item` (also the head of a root item).
pub fn inode_fields() -> Vec<FieldDef> {
    let mut v = vec![
        fld!(InodeItem, "generation", generation),
        fld!(InodeItem, "transid", transid),
        fld!(InodeItem, "size", size),
        fld!(InodeItem, "nbytes", nbytes),
        fld!(InodeItem, "block_group", block_group),
        fld!(InodeItem, "nlink", nlink),
        fld!(InodeItem, "uid", uid),
        fld!(InodeItem, "gid", gid),
        fld!(InodeItem, "mode", mode),
        fld!(InodeItem, "rdev", rdev),
        fld!(InodeItem, "flags", flags),
        fld!(InodeItem, "sequence", sequence),
    ];
    for (n, t) in [
        ("atime", core::mem::offset_of!(InodeItem, atime)),
        ("ctime", core::mem::offset_of!(InodeItem, ctime)),
        ("mtime", core::mem::offset_of!(InodeItem, mtime)),
        ("otime", core::mem::offset_of!(InodeItem, otime)),
    ] {
        use btrkit_core::format::inode::Timespec;
        v.push(fld!(Timespec, "sec", sec).shifted(&format!("{n}."), t));
        v.push(fld!(Timespec, "nsec", nsec).shifted(&format!("{n}."), t));
    }
    v
}

fn key_fields(prefix: &str, base: usize) -> Vec<FieldDef> {
    use btrkit_core::format::key::DiskKey;
    vec![
        fld!(DiskKey, "objectid", objectid).shifted(prefix, base),
        fld!(DiskKey, "type", type_).shifted(prefix, base),
        fld!(DiskKey, "offset", offset).shifted(prefix, base),
    ]
}

fn root_item_fields(len: usize) -> Vec<FieldDef> {
    let mut v: Vec<FieldDef> = inode_fields()
        .into_iter()
        .map(|f| f.shifted("inode.", core::mem::offset_of!(RootItem, inode)))
        .collect();
    v.extend([
        fld!(RootItem, "generation", generation),
        fld!(RootItem, "root_dirid", root_dirid),
        fld!(RootItem, "bytenr", bytenr),
        fld!(RootItem, "byte_limit", byte_limit),
        fld!(RootItem, "bytes_used", bytes_used),
        fld!(RootItem, "last_snapshot", last_snapshot),
        fld!(RootItem, "flags", flags),
        fld!(RootItem, "refs", refs),
        fld!(RootItem, "drop_level", drop_level),
        fld!(RootItem, "level", level),
        fld!(RootItem, "generation_v2", generation_v2),
        fld!(RootItem, "uuid", uuid),
        fld!(RootItem, "parent_uuid", parent_uuid),
        fld!(RootItem, "received_uuid", received_uuid),
        fld!(RootItem, "ctransid", ctransid),
        fld!(RootItem, "otransid", otransid),
        fld!(RootItem, "stransid", stransid),
        fld!(RootItem, "rtransid", rtransid),
    ]);
    v.extend(key_fields(
        "drop_progress.",
        core::mem::offset_of!(RootItem, drop_progress),
    ));
    // A legacy (short) root item has only the fields that fit.
    v.retain(|f| f.off + f.width <= len);
    v
}

fn dir_item_fields() -> Vec<FieldDef> {
    let mut v = key_fields("location.", core::mem::offset_of!(DirItem, location));
    v.extend([
        fld!(DirItem, "transid", transid),
        fld!(DirItem, "data_len", data_len),
        fld!(DirItem, "name_len", name_len),
        fld!(DirItem, "type", type_),
    ]);
    v
}

fn file_extent_fields(data: &[u8]) -> Vec<FieldDef> {
    let mut v = vec![
        fld!(FileExtentItem, "generation", generation),
        fld!(FileExtentItem, "ram_bytes", ram_bytes),
        fld!(FileExtentItem, "compression", compression),
        fld!(FileExtentItem, "encryption", encryption),
        fld!(FileExtentItem, "other_encoding", other_encoding),
        fld!(FileExtentItem, "type", type_),
    ];
    let ty_off = core::mem::offset_of!(FileExtentItem, type_);
    // An inline extent's data starts where disk_bytenr would be.
    let inline = data.get(ty_off) == Some(&BTRFS_FILE_EXTENT_INLINE);
    if !inline {
        v.extend([
            fld!(FileExtentItem, "disk_bytenr", disk_bytenr),
            fld!(FileExtentItem, "disk_num_bytes", disk_num_bytes),
            fld!(FileExtentItem, "offset", offset),
            fld!(FileExtentItem, "num_bytes", num_bytes),
        ]);
    } else {
        debug_assert_eq!(FILE_EXTENT_INLINE_DATA_START, ty_off + 1);
    }
    v
}

/// The fields of an EXTENT_ITEM / METADATA_ITEM, inline refs included
/// (as far as they parse; an item whose refs do not parse has its head
/// fields only).
fn extent_item_fields(key: &Key, data: &[u8]) -> Vec<FieldDef> {
    let mut v = vec![
        fld!(ExtentItem, "refs", refs),
        fld!(ExtentItem, "generation", generation),
        fld!(ExtentItem, "flags", flags),
    ];
    let Ok(view) = parse_extent_item(key, data) else {
        return v;
    };
    let mut p = EXTENT_ITEM_SIZE;
    if view.tree_block_info.is_some() {
        v.extend(key_fields(
            "key.",
            EXTENT_ITEM_SIZE + core::mem::offset_of!(TreeBlockInfo, key),
        ));
        v.push(fld!(TreeBlockInfo, "level", level).shifted("", EXTENT_ITEM_SIZE));
        p += TREE_BLOCK_INFO_SIZE;
    }
    for (i, r) in view.refs.iter().enumerate() {
        let pre = format!("ref[{i}].");
        v.push(FieldDef::new(format!("{pre}type"), p, 1));
        let body = p + 1;
        match r.type_key() {
            BTRFS_EXTENT_DATA_REF_KEY => {
                for f in [
                    fld!(ExtentDataRef, "root", root),
                    fld!(ExtentDataRef, "objectid", objectid),
                    fld!(ExtentDataRef, "offset", offset),
                    fld!(ExtentDataRef, "count", count),
                ] {
                    v.push(f.shifted(&pre, body));
                }
            }
            BTRFS_SHARED_DATA_REF_KEY => {
                v.push(FieldDef::new(format!("{pre}offset"), body, 8));
                v.push(FieldDef::new(format!("{pre}count"), body + 8, 4));
            }
            _ => v.push(FieldDef::new(format!("{pre}offset"), body, 8)),
        }
        p += r.inline_size();
    }
    v
}

fn dev_item_fields() -> Vec<FieldDef> {
    vec![
        fld!(DevItem, "devid", devid),
        fld!(DevItem, "total_bytes", total_bytes),
        fld!(DevItem, "bytes_used", bytes_used),
        fld!(DevItem, "io_align", io_align),
        fld!(DevItem, "io_width", io_width),
        fld!(DevItem, "sector_size", sector_size),
        fld!(DevItem, "type", type_),
        fld!(DevItem, "generation", generation),
        fld!(DevItem, "start_offset", start_offset),
        fld!(DevItem, "dev_group", dev_group),
        fld!(DevItem, "seek_speed", seek_speed),
        fld!(DevItem, "bandwidth", bandwidth),
        fld!(DevItem, "uuid", uuid),
        fld!(DevItem, "fsid", fsid),
    ]
}

fn chunk_fields(data: &[u8]) -> Vec<FieldDef> {
    let mut v = vec![
        fld!(ChunkItem, "length", length),
        fld!(ChunkItem, "owner", owner),
        fld!(ChunkItem, "stripe_len", stripe_len),
        fld!(ChunkItem, "type", type_),
        fld!(ChunkItem, "io_align", io_align),
        fld!(ChunkItem, "io_width", io_width),
        fld!(ChunkItem, "sector_size", sector_size),
        fld!(ChunkItem, "num_stripes", num_stripes),
        fld!(ChunkItem, "sub_stripes", sub_stripes),
    ];
    let head = core::mem::size_of::<ChunkItem>();
    let ss = core::mem::size_of::<Stripe>();
    let n = data.len().saturating_sub(head) / ss;
    for i in 0..n.min(16) {
        let pre = format!("stripe[{i}].");
        v.push(fld!(Stripe, "devid", devid).shifted(&pre, head + i * ss));
        v.push(fld!(Stripe, "offset", offset).shifted(&pre, head + i * ss));
        v.push(fld!(Stripe, "dev_uuid", dev_uuid).shifted(&pre, head + i * ss));
    }
    v
}

/// Every field of the item `key` with body `data`, by its key type. Items
/// with no fixed fields (ORPHAN_ITEM, FREE_SPACE_EXTENT, csums) have none:
/// use raw offsets for them.
pub fn item_fields(key: &Key, data: &[u8]) -> Vec<FieldDef> {
    let mut v = match key.ty {
        BTRFS_INODE_ITEM_KEY => inode_fields(),
        BTRFS_INODE_REF_KEY => vec![
            fld!(InodeRef, "index", index),
            fld!(InodeRef, "name_len", name_len),
        ],
        BTRFS_INODE_EXTREF_KEY => vec![
            fld!(InodeExtref, "parent_objectid", parent_objectid),
            fld!(InodeExtref, "index", index),
            fld!(InodeExtref, "name_len", name_len),
        ],
        BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => dir_item_fields(),
        BTRFS_EXTENT_DATA_KEY => file_extent_fields(data),
        BTRFS_ROOT_ITEM_KEY => root_item_fields(data.len()),
        BTRFS_ROOT_REF_KEY | BTRFS_ROOT_BACKREF_KEY => vec![
            fld!(RootRef, "dirid", dirid),
            fld!(RootRef, "sequence", sequence),
            fld!(RootRef, "name_len", name_len),
        ],
        BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY => extent_item_fields(key, data),
        BTRFS_EXTENT_DATA_REF_KEY => vec![
            fld!(ExtentDataRef, "root", root),
            fld!(ExtentDataRef, "objectid", objectid),
            fld!(ExtentDataRef, "offset", offset),
            fld!(ExtentDataRef, "count", count),
        ],
        BTRFS_SHARED_DATA_REF_KEY => vec![FieldDef::new("count", 0, 4)],
        BTRFS_BLOCK_GROUP_ITEM_KEY => vec![
            fld!(BlockGroupItem, "used", used),
            fld!(BlockGroupItem, "chunk_objectid", chunk_objectid),
            fld!(BlockGroupItem, "flags", flags),
        ],
        BTRFS_DEV_EXTENT_KEY => vec![
            fld!(DevExtent, "chunk_tree", chunk_tree),
            fld!(DevExtent, "chunk_objectid", chunk_objectid),
            fld!(DevExtent, "chunk_offset", chunk_offset),
            fld!(DevExtent, "length", length),
            fld!(DevExtent, "chunk_tree_uuid", chunk_tree_uuid),
        ],
        BTRFS_DEV_ITEM_KEY => dev_item_fields(),
        BTRFS_CHUNK_ITEM_KEY => chunk_fields(data),
        BTRFS_FREE_SPACE_INFO_KEY => vec![
            fld!(FreeSpaceInfo, "extent_count", extent_count),
            fld!(FreeSpaceInfo, "flags", flags),
        ],
        _ => Vec::new(),
    };
    // Only what lies inside the body (a short or damaged item).
    v.retain(|f| f.off + f.width <= data.len());
    v
}

/// The field `name` of an item (with the aliases of btrfs-corrupt-block).
pub fn item_field(key: &Key, data: &[u8], name: &str) -> Result<FieldDef, String> {
    let name = match (key.ty, name) {
        (BTRFS_INODE_ITEM_KEY, "isize") => "size",
        (_, n) => n,
    };
    let all = item_fields(key, data);
    all.iter().find(|f| f.name == name).cloned().ok_or_else(|| {
        format!(
            "no field {name:?} in this item (key type {}, {} bytes); fields: {}",
            key.ty,
            data.len(),
            all.iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The superblock's fields (`dev_item.*` for its copy of the device item).
pub fn super_fields() -> Vec<FieldDef> {
    let mut v = vec![
        fld!(Superblock, "bytenr", bytenr),
        fld!(Superblock, "flags", flags),
        fld!(Superblock, "magic", magic),
        fld!(Superblock, "generation", generation),
        fld!(Superblock, "root", root),
        fld!(Superblock, "chunk_root", chunk_root),
        fld!(Superblock, "log_root", log_root),
        fld!(Superblock, "log_root_transid", log_root_transid),
        fld!(Superblock, "total_bytes", total_bytes),
        fld!(Superblock, "bytes_used", bytes_used),
        fld!(Superblock, "root_dir_objectid", root_dir_objectid),
        fld!(Superblock, "num_devices", num_devices),
        fld!(Superblock, "sectorsize", sectorsize),
        fld!(Superblock, "nodesize", nodesize),
        fld!(Superblock, "leafsize", leafsize),
        fld!(Superblock, "stripesize", stripesize),
        fld!(Superblock, "sys_chunk_array_size", sys_chunk_array_size),
        fld!(Superblock, "chunk_root_generation", chunk_root_generation),
        fld!(Superblock, "compat_flags", compat_flags),
        fld!(Superblock, "compat_ro_flags", compat_ro_flags),
        fld!(Superblock, "incompat_flags", incompat_flags),
        fld!(Superblock, "csum_type", csum_type),
        fld!(Superblock, "root_level", root_level),
        fld!(Superblock, "chunk_root_level", chunk_root_level),
        fld!(Superblock, "log_root_level", log_root_level),
        fld!(Superblock, "cache_generation", cache_generation),
        fld!(Superblock, "uuid_tree_generation", uuid_tree_generation),
        fld!(Superblock, "fsid", fsid),
        fld!(Superblock, "metadata_uuid", metadata_uuid),
        fld!(Superblock, "nr_global_roots", nr_global_roots),
    ];
    let base = core::mem::offset_of!(Superblock, dev_item);
    v.extend(
        dev_item_fields()
            .into_iter()
            .map(|f| f.shifted("dev_item.", base)),
    );
    v
}

/// The tree block header's fields (`shift_items` and the item header
/// fields are operations of their own).
pub fn header_fields() -> Vec<FieldDef> {
    vec![
        fld!(Header, "bytenr", bytenr),
        fld!(Header, "flags", flags),
        fld!(Header, "generation", generation),
        fld!(Header, "owner", owner),
        fld!(Header, "nritems", nritems),
        fld!(Header, "level", level),
        fld!(Header, "fsid", fsid),
        fld!(Header, "chunk_tree_uuid", chunk_tree_uuid),
    ]
}

/// An item header's fields (`btrfs_item`: its data offset and size).
pub fn item_header_fields() -> Vec<FieldDef> {
    vec![fld!(Item, "offset", offset), fld!(Item, "size", size)]
}

/// Look a field up by name in a list.
pub fn by_name(list: &[FieldDef], name: &str, what: &str) -> Result<FieldDef, String> {
    list.iter()
        .find(|f| f.name == name)
        .cloned()
        .ok_or_else(|| {
            format!(
                "no {what} field {name:?}; fields: {}",
                list.iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_format() {
        // Spot checks against btrfs_tree.h.
        let f = |l: &[FieldDef], n: &str| by_name(l, n, "").unwrap();
        let ino = inode_fields();
        assert_eq!(f(&ino, "mode"), FieldDef::new("mode", 52, 4));
        assert_eq!(f(&ino, "flags"), FieldDef::new("flags", 64, 8));
        assert_eq!(f(&ino, "otime.nsec"), FieldDef::new("otime.nsec", 156, 4));
        let sb = super_fields();
        assert_eq!(f(&sb, "bytes_used"), FieldDef::new("bytes_used", 0x78, 8));
        assert_eq!(f(&sb, "num_devices"), FieldDef::new("num_devices", 0x88, 8));
        assert_eq!(
            f(&sb, "dev_item.bytes_used"),
            FieldDef::new("dev_item.bytes_used", 0xc9 + 16, 8)
        );
        let h = header_fields();
        assert_eq!(f(&h, "generation"), FieldDef::new("generation", 80, 8));
        assert_eq!(f(&h, "level"), FieldDef::new("level", 100, 1));
        let ri = root_item_fields(439);
        assert_eq!(f(&ri, "generation"), FieldDef::new("generation", 160, 8));
        assert_eq!(f(&ri, "level"), FieldDef::new("level", 238, 1));
        let d = dir_item_fields();
        assert_eq!(f(&d, "name_len"), FieldDef::new("name_len", 27, 2));
    }

    #[test]
    fn extent_item_inline_refs() {
        use btrkit_core::format::extent::{write_inline_refs, InlineRef};
        let mut d = vec![0u8; EXTENT_ITEM_SIZE];
        write_inline_refs(
            &mut d,
            &[
                InlineRef::ExtentData {
                    root: 5,
                    objectid: 257,
                    offset: 0,
                    count: 1,
                },
                InlineRef::SharedData {
                    parent: 4096,
                    count: 2,
                },
            ],
        );
        let k = Key::new(1 << 20, BTRFS_EXTENT_ITEM_KEY, 4096);
        let v = item_fields(&k, &d);
        let f = |n: &str| v.iter().find(|f| f.name == n).cloned().unwrap();
        assert_eq!(f("ref[0].type").off, 24);
        assert_eq!(f("ref[0].objectid").off, 24 + 1 + 8);
        assert_eq!(f("ref[0].count").off, 24 + 1 + 24);
        assert_eq!(f("ref[1].type").off, 24 + 29);
        assert_eq!(
            f("ref[1].count"),
            FieldDef::new("ref[1].count", 24 + 29 + 9, 4)
        );
    }
}
