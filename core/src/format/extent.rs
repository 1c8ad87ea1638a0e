//! Extent tree items: `btrfs_extent_item` (+ `btrfs_tree_block_info` for
//! non-skinny tree blocks) followed by inline refs, and the keyed ref items
//! `btrfs_extent_data_ref` / `btrfs_shared_data_ref`.

use super::consts::*;
use super::key::{DiskKey, Key};
use super::{Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_extent_item`: the 24-byte head of an EXTENT_ITEM or
/// METADATA_ITEM, followed by a [`TreeBlockInfo`] for non-skinny tree blocks
/// and then the inline refs.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentItem {
    /// Total references to the extent, inline and keyed.
    pub refs: Le64,
    /// Transaction that allocated the extent.
    pub generation: Le64,
    /// BTRFS_EXTENT_FLAG_DATA or BTRFS_EXTENT_FLAG_TREE_BLOCK, the latter maybe
    /// with BTRFS_BLOCK_FLAG_FULL_BACKREF.
    pub flags: Le64,
}

/// `struct btrfs_tree_block_info`: what an EXTENT_ITEM of a tree block records
/// about it (SKINNY_METADATA moves the level into the key).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct TreeBlockInfo {
    /// First key of the block (unused by the kernel, often zero).
    pub key: DiskKey,
    /// Level of the block.
    pub level: u8,
}

/// `struct btrfs_extent_inline_ref`: the type byte and first 8 bytes of an
/// inline ref. For EXTENT_DATA_REF a whole [`ExtentDataRef`] starts at
/// `offset`; SHARED_DATA_REF adds a le32 count.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentInlineRef {
    /// Ref key type (TREE_BLOCK_REF, SHARED_BLOCK_REF, EXTENT_DATA_REF,
    /// SHARED_DATA_REF, EXTENT_OWNER_REF); C's `type`.
    pub type_: u8,
    /// Root id for TREE_BLOCK_REF and EXTENT_OWNER_REF, parent block bytenr for
    /// SHARED_*.
    pub offset: Le64,
}

/// `struct btrfs_extent_data_ref`: a data extent referenced by file extents of
/// one inode, inline or keyed (bytenr, EXTENT_DATA_REF,
/// [`extent_data_ref_hash`]).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentDataRef {
    /// Id of the subvolume tree holding the file extent items.
    pub root: Le64,
    /// Inode number of the file.
    pub objectid: Le64,
    /// The referencing EXTENT_DATA key offset minus that item's `offset`: the
    /// file offset where byte 0 of the extent would sit.
    pub offset: Le64,
    /// Number of file extent items of that (root, inode, offset) referring to
    /// the extent.
    pub count: Le32,
}

/// `struct btrfs_shared_data_ref`: a data extent referenced from the leaf at
/// the key offset (bytenr, SHARED_DATA_REF, parent).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct SharedDataRef {
    /// Number of file extent items in that leaf referring to the extent.
    pub count: Le32,
}

/// The pre-2.6.31 ref format, still readable in ancient images.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentRefV0 {
    /// Id of the referencing tree.
    pub root: Le64,
    /// Generation of the referencing block when the ref was made.
    pub generation: Le64,
    /// Inode number for a data extent, level for a tree block.
    pub objectid: Le64,
    /// Number of references this record stands for.
    pub count: Le32,
}

/// Size of [`ExtentItem`] in bytes.
pub const EXTENT_ITEM_SIZE: usize = 24;
/// Size of [`TreeBlockInfo`] in bytes.
pub const TREE_BLOCK_INFO_SIZE: usize = 18;

/// One inline back reference of an extent item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InlineRef {
    /// TREE_BLOCK_REF: a tree block referenced by the tree `root`.
    TreeBlock {
        /// Id of the referencing tree.
        root: u64,
    },
    /// SHARED_BLOCK_REF: a tree block referenced by the node at `parent`
    /// (FULL_BACKREF).
    SharedBlock {
        /// Logical address of the referencing node.
        parent: u64,
    },
    /// EXTENT_DATA_REF: a data extent referenced by file extents of one inode.
    ExtentData {
        /// Id of the subvolume tree.
        root: u64,
        /// Inode number.
        objectid: u64,
        /// File offset of byte 0 of the extent (key offset less `offset`).
        offset: u64,
        /// Number of file extent items referring to the extent.
        count: u32,
    },
    /// SHARED_DATA_REF: a data extent referenced from the leaf at `parent`.
    SharedData {
        /// Logical address of the referencing leaf.
        parent: u64,
        /// Number of file extent items in that leaf referring to the extent.
        count: u32,
    },
    /// Simple-quota owner (EXTENT_OWNER_REF).
    Owner {
        /// Subvolume the extent's space is charged to.
        root: u64,
    },
}

impl InlineRef {
    /// The ref's key type, written as its inline type byte (BTRFS_*_REF_KEY).
    pub fn type_key(&self) -> u8 {
        match self {
            InlineRef::TreeBlock { .. } => BTRFS_TREE_BLOCK_REF_KEY,
            InlineRef::SharedBlock { .. } => BTRFS_SHARED_BLOCK_REF_KEY,
            InlineRef::ExtentData { .. } => BTRFS_EXTENT_DATA_REF_KEY,
            InlineRef::SharedData { .. } => BTRFS_SHARED_DATA_REF_KEY,
            InlineRef::Owner { .. } => BTRFS_EXTENT_OWNER_REF_KEY,
        }
    }
    /// The number of references this entry stands for.
    pub fn count(&self) -> u64 {
        match self {
            InlineRef::ExtentData { count, .. } | InlineRef::SharedData { count, .. } => {
                *count as u64
            }
            InlineRef::Owner { .. } => 0,
            _ => 1,
        }
    }
    /// Size of this ref when stored inline.
    pub fn inline_size(&self) -> usize {
        match self {
            InlineRef::ExtentData { .. } => 1 + 28,
            InlineRef::SharedData { .. } => 1 + 8 + 4,
            _ => 1 + 8,
        }
    }
}

/// A parsed EXTENT_ITEM or METADATA_ITEM, borrowing the item's bytes.
#[derive(Debug, Clone)]
pub struct ExtentView<'a> {
    /// The fixed head.
    pub item: &'a ExtentItem,
    /// Present for EXTENT_ITEM keys of tree blocks (non-skinny metadata).
    pub tree_block_info: Option<&'a TreeBlockInfo>,
    /// The inline refs, in item order.
    pub refs: Vec<InlineRef>,
}

/// Parse an EXTENT_ITEM or METADATA_ITEM with its inline refs.
pub fn parse_extent_item<'a>(key: &Key, data: &'a [u8]) -> Result<ExtentView<'a>> {
    if data.len() < EXTENT_ITEM_SIZE {
        if data.len() == 4 {
            return Err(Error::Unsupported(
                "v0 extent item (pre-2.6.31 format)".into(),
            ));
        }
        return Err(Error::corrupt_item(
            format!("extent item size {} too small", data.len()),
            0,
            None,
        ));
    }
    let item: &ExtentItem = super::view(data, "extent item")?;
    let mut p = EXTENT_ITEM_SIZE;
    let mut tree_block_info = None;
    if key.ty == BTRFS_EXTENT_ITEM_KEY && item.flags.get() & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
        tree_block_info = Some(super::view::<TreeBlockInfo>(&data[p..], "tree block info")?);
        p += TREE_BLOCK_INFO_SIZE;
    }
    let mut refs = Vec::new();
    while p < data.len() {
        let t = data[p];
        let rest = &data[p + 1..];
        let need = match t {
            BTRFS_TREE_BLOCK_REF_KEY | BTRFS_SHARED_BLOCK_REF_KEY | BTRFS_EXTENT_OWNER_REF_KEY => 8,
            BTRFS_EXTENT_DATA_REF_KEY => 28,
            BTRFS_SHARED_DATA_REF_KEY => 12,
            _ => {
                return Err(Error::corrupt_item(
                    format!("extent item inline ref type {t} unknown at item offset {p}"),
                    0,
                    None,
                ))
            }
        };
        if rest.len() < need {
            return Err(Error::corrupt_item(
                format!("extent item inline ref type {t} at item offset {p} truncated"),
                0,
                None,
            ));
        }
        let u64_at = |o: usize| u64::from_le_bytes(rest[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(rest[o..o + 4].try_into().unwrap_or([0; 4]));
        refs.push(match t {
            BTRFS_TREE_BLOCK_REF_KEY => InlineRef::TreeBlock { root: u64_at(0) },
            BTRFS_SHARED_BLOCK_REF_KEY => InlineRef::SharedBlock { parent: u64_at(0) },
            BTRFS_EXTENT_OWNER_REF_KEY => InlineRef::Owner { root: u64_at(0) },
            BTRFS_EXTENT_DATA_REF_KEY => InlineRef::ExtentData {
                root: u64_at(0),
                objectid: u64_at(8),
                offset: u64_at(16),
                count: u32_at(24),
            },
            _ => InlineRef::SharedData {
                parent: u64_at(0),
                count: u32_at(8),
            },
        });
        p += 1 + need;
    }
    Ok(ExtentView {
        item,
        tree_block_info,
        refs,
    })
}

/// Key offset of a keyed EXTENT_DATA_REF: the kernel's `hash_extent_data_ref`.
pub fn extent_data_ref_hash(root: u64, objectid: u64, offset: u64) -> u64 {
    use super::dir::raw_crc32c;
    let high = raw_crc32c(!0u32, &root.to_le_bytes());
    let mut low = raw_crc32c(!0u32, &objectid.to_le_bytes());
    low = raw_crc32c(low, &offset.to_le_bytes());
    ((high as u64) << 31) ^ (low as u64)
}

/// Serialize inline refs after an extent item head.
pub fn write_inline_refs(out: &mut Vec<u8>, refs: &[InlineRef]) {
    for r in refs {
        out.push(r.type_key());
        match *r {
            InlineRef::TreeBlock { root: v }
            | InlineRef::SharedBlock { parent: v }
            | InlineRef::Owner { root: v } => out.extend_from_slice(&v.to_le_bytes()),
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                count,
            } => {
                out.extend_from_slice(
                    ExtentDataRef {
                        root: root.into(),
                        objectid: objectid.into(),
                        offset: offset.into(),
                        count: count.into(),
                    }
                    .as_bytes(),
                );
            }
            InlineRef::SharedData { parent, count } => {
                out.extend_from_slice(&parent.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<ExtentItem>(), EXTENT_ITEM_SIZE);
        assert_eq!(core::mem::size_of::<TreeBlockInfo>(), TREE_BLOCK_INFO_SIZE);
        assert_eq!(core::mem::size_of::<ExtentDataRef>(), 28);
        assert_eq!(core::mem::size_of::<ExtentInlineRef>(), 9);
    }
    #[test]
    fn inline_refs_roundtrip() {
        let refs = vec![
            InlineRef::TreeBlock { root: 5 },
            InlineRef::SharedBlock { parent: 1 << 20 },
            InlineRef::ExtentData {
                root: 5,
                objectid: 257,
                offset: 0,
                count: 2,
            },
            InlineRef::SharedData {
                parent: 30408704,
                count: 1,
            },
        ];
        let mut d = ExtentItem {
            refs: 5.into(),
            generation: 7.into(),
            flags: BTRFS_EXTENT_FLAG_DATA.into(),
        }
        .as_bytes()
        .to_vec();
        write_inline_refs(&mut d, &refs);
        let v = parse_extent_item(&Key::new(1 << 20, BTRFS_EXTENT_ITEM_KEY, 4096), &d).unwrap();
        assert_eq!(v.refs, refs);
        assert!(parse_extent_item(
            &Key::new(1 << 20, BTRFS_EXTENT_ITEM_KEY, 4096),
            &d[..d.len() - 1]
        )
        .is_err());
    }
}
