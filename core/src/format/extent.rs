//! Extent tree items: `btrfs_extent_item` (+ `btrfs_tree_block_info` for
//! non-skinny tree blocks) followed by inline refs, and the keyed ref items
//! `btrfs_extent_data_ref` / `btrfs_shared_data_ref`.

use super::consts::*;
use super::key::{DiskKey, Key};
use super::{Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentItem {
    pub refs: Le64,
    pub generation: Le64,
    pub flags: Le64,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct TreeBlockInfo {
    pub key: DiskKey,
    pub level: u8,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentInlineRef {
    pub type_: u8,
    pub offset: Le64,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentDataRef {
    pub root: Le64,
    pub objectid: Le64,
    pub offset: Le64,
    pub count: Le32,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct SharedDataRef {
    pub count: Le32,
}

/// The pre-2.6.31 ref format, still readable in ancient images.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct ExtentRefV0 {
    pub root: Le64,
    pub generation: Le64,
    pub objectid: Le64,
    pub count: Le32,
}

pub const EXTENT_ITEM_SIZE: usize = 24;
pub const TREE_BLOCK_INFO_SIZE: usize = 18;

/// One inline back reference of an extent item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InlineRef {
    TreeBlock {
        root: u64,
    },
    SharedBlock {
        parent: u64,
    },
    ExtentData {
        root: u64,
        objectid: u64,
        offset: u64,
        count: u32,
    },
    SharedData {
        parent: u64,
        count: u32,
    },
    /// Simple-quota owner (EXTENT_OWNER_REF).
    Owner {
        root: u64,
    },
}

impl InlineRef {
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

#[derive(Debug, Clone)]
pub struct ExtentView<'a> {
    pub item: &'a ExtentItem,
    /// Present for EXTENT_ITEM keys of tree blocks (non-skinny metadata).
    pub tree_block_info: Option<&'a TreeBlockInfo>,
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
        return Err(Error::corrupt(
            format!("extent item size {} too small", data.len()),
            0,
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
                return Err(Error::corrupt(
                    format!("extent item inline ref type {t} unknown at item offset {p}"),
                    0,
                ))
            }
        };
        if rest.len() < need {
            return Err(Error::corrupt(
                format!("extent item inline ref type {t} at item offset {p} truncated"),
                0,
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
