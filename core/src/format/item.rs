//! Decoding of a leaf item's body by its key type. Decoding doubles as item
//! validation (the item-level half of the kernel's tree-checker): every size
//! and embedded length is checked, and a mismatch is a typed error naming the
//! key.

use super::block_group::BlockGroupItem;
use super::chunk::{parse_chunk, ChunkItem, Stripe};
use super::consts::*;
use super::dev::{DevExtent, DevItem};
use super::dir::{for_each_dir_entry, DirEntry, DirLogItem};
use super::extent::{parse_extent_item, ExtentDataRef, ExtentView, SharedDataRef};
use super::file_extent::{parse_file_extent, FileExtent};
use super::free_space::FreeSpaceInfo;
use super::inode::{
    for_each_inode_extref, for_each_inode_ref, InodeExtrefEntry, InodeItem, InodeRefEntry,
};
use super::key::Key;
use super::misc::{BalanceItem, DevReplaceItem, VerityDescItem};
use super::qgroup::{QgroupInfoItem, QgroupLimitItem, QgroupStatusItem};
use super::root::{parse_root_ref, RootItem, RootRef};
use crate::CorruptKind;
use crate::{Error, Result};
use zerocopy::FromBytes;

/// A leaf item's body decoded by its key type, borrowing the leaf's bytes; made
/// by [`decode`].
#[derive(Debug, Clone)]
pub enum ItemBody<'a> {
    /// INODE_ITEM.
    InodeItem(&'a InodeItem),
    /// INODE_REF: its names, at least one.
    InodeRef(Vec<InodeRefEntry<'a>>),
    /// INODE_EXTREF: its names, at least one.
    InodeExtref(Vec<InodeExtrefEntry<'a>>),
    /// DIR_ITEM, DIR_INDEX and XATTR_ITEM share one layout.
    DirItem(Vec<DirEntry<'a>>),
    /// DIR_LOG_ITEM or DIR_LOG_INDEX: the end of the logged range.
    DirLog(&'a DirLogItem),
    /// ORPHAN_ITEM (empty).
    Orphan,
    /// EXTENT_DATA.
    FileExtent(FileExtent<'a>),
    /// EXTENT_CSUM: the checksums, a non-zero multiple of the checksum size.
    ExtentCsum(&'a [u8]),
    /// ROOT_ITEM, zero-extended if legacy-sized.
    RootItem(Box<RootItem>),
    /// ROOT_REF or ROOT_BACKREF: the head and the name.
    RootRef(&'a RootRef, &'a [u8]),
    /// EXTENT_ITEM or METADATA_ITEM with its inline refs.
    Extent(ExtentView<'a>),
    /// Keyed TREE_BLOCK_REF (empty; the root is the key offset).
    TreeBlockRef,
    /// Keyed SHARED_BLOCK_REF (empty; the parent is the key offset).
    SharedBlockRef,
    /// Keyed EXTENT_DATA_REF.
    ExtentDataRef(&'a ExtentDataRef),
    /// Keyed SHARED_DATA_REF; the parent leaf is the key offset.
    SharedDataRef(&'a SharedDataRef),
    /// Keyed EXTENT_OWNER_REF: the owning root id.
    ExtentOwnerRef(u64),
    /// BLOCK_GROUP_ITEM.
    BlockGroup(&'a BlockGroupItem),
    /// FREE_SPACE_INFO.
    FreeSpaceInfo(&'a FreeSpaceInfo),
    /// FREE_SPACE_EXTENT (empty; the key is the free range).
    FreeSpaceExtent,
    /// FREE_SPACE_BITMAP: one bit per sector from the key objectid.
    FreeSpaceBitmap(&'a [u8]),
    /// DEV_EXTENT.
    DevExtent(&'a DevExtent),
    /// DEV_ITEM.
    DevItem(&'a DevItem),
    /// CHUNK_ITEM: the head and its stripes.
    Chunk(&'a ChunkItem, &'a [Stripe]),
    /// UUID_KEY_SUBVOL / UUID_KEY_RECEIVED_SUBVOL: subvolume ids.
    Uuid(Vec<u64>),
    /// QGROUP_STATUS, with `enable_gen` when the item is long enough to hold it
    /// (simple quotas).
    QgroupStatus(&'a QgroupStatusItem, Option<u64>),
    /// QGROUP_INFO.
    QgroupInfo(&'a QgroupInfoItem),
    /// QGROUP_LIMIT.
    QgroupLimit(&'a QgroupLimitItem),
    /// QGROUP_RELATION (both qgroup ids are in the key).
    QgroupRelation,
    /// Device stats, (DEV_STATS, PERSISTENT_ITEM, devid): the le64 counters in
    /// BTRFS_DEV_STAT_* order.
    DevStats(Vec<u64>),
    /// DEV_REPLACE.
    DevReplace(&'a DevReplaceItem),
    /// Balance state, (BALANCE, TEMPORARY_ITEM, 0).
    Balance(&'a BalanceItem),
    /// VERITY_DESC_ITEM at offset 0: the descriptor item head and any bytes
    /// after it in the item.
    VerityDesc(&'a VerityDescItem, &'a [u8]),
    /// VERITY_MERKLE_ITEM, or VERITY_DESC_ITEM past offset 0: raw bytes.
    VerityMerkle(&'a [u8]),
    /// STRING_ITEM: raw bytes.
    StringItem(&'a [u8]),
    /// A type this engine does not decode (printed as raw bytes).
    Unknown(&'a [u8]),
}

fn exact<'a, T>(data: &'a [u8], what: &str) -> Result<&'a T>
where
    T: FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    if data.len() != core::mem::size_of::<T>() {
        return Err(Error::corrupt_item(
            format!(
                "{what} item size {} want {}",
                data.len(),
                core::mem::size_of::<T>()
            ),
            0,
            None,
        ));
    }
    super::view(data, what)
}

fn empty(data: &[u8], what: &str) -> Result<()> {
    if !data.is_empty() {
        return Err(Error::corrupt_item(
            format!("{what} item size {} want 0", data.len()),
            0,
            None,
        ));
    }
    Ok(())
}

/// One entry of an item that packs several names.
#[derive(Debug, Clone, Copy)]
pub enum NameEntry<'a> {
    /// Of a DIR_ITEM, DIR_INDEX or XATTR_ITEM.
    Dir(DirEntry<'a>),
    /// Of an INODE_REF (the parent is the key offset).
    Ref(InodeRefEntry<'a>),
    /// Of an INODE_EXTREF.
    Extref(InodeExtrefEntry<'a>),
}

/// The entries of an INODE_REF, INODE_EXTREF, DIR_ITEM, DIR_INDEX or
/// XATTR_ITEM body, each handed to `f`, with the rules those items obey
/// (not empty, one entry in a DIR_INDEX, names no longer than the limit).
/// [`decode`] collects them; [`check`] only validates, without allocating.
fn names_of<'a>(key: &Key, data: &'a [u8], f: &mut dyn FnMut(NameEntry<'a>)) -> Result<()> {
    match key.ty {
        BTRFS_INODE_REF_KEY => {
            if for_each_inode_ref(data, |e| f(NameEntry::Ref(e)))? == 0 {
                return Err(Error::corrupt_item("empty inode ref item", 0, None));
            }
        }
        BTRFS_INODE_EXTREF_KEY => {
            if for_each_inode_extref(data, |e| f(NameEntry::Extref(e)))? == 0 {
                return Err(Error::corrupt_item("empty inode extref item", 0, None));
            }
        }
        _ => {
            let mut long = None;
            let n = for_each_dir_entry(data, |e| {
                if e.name.len() > BTRFS_NAME_LEN {
                    long.get_or_insert(e.name.len());
                }
                f(NameEntry::Dir(e))
            })?;
            if n == 0 {
                return Err(Error::corrupt_item("empty dir item", 0, None));
            }
            if key.ty == BTRFS_DIR_INDEX_KEY && n != 1 {
                return Err(Error::corrupt_item(
                    format!("dir index item holds {n} entries, want 1"),
                    0,
                    None,
                ));
            }
            if let Some(len) = long {
                return Err(Error::corrupt_item(
                    format!("dir item name_len {len} > {BTRFS_NAME_LEN}"),
                    0,
                    None,
                ));
            }
        }
    }
    Ok(())
}

/// Whether [`decode`] accepts the item, without building what it returns
/// (the tree checker runs this on every item read).
pub fn check(key: &Key, data: &[u8], csum_size: usize) -> Result<()> {
    match key.ty {
        BTRFS_INODE_REF_KEY
        | BTRFS_INODE_EXTREF_KEY
        | BTRFS_DIR_ITEM_KEY
        | BTRFS_DIR_INDEX_KEY
        | BTRFS_XATTR_ITEM_KEY => names_of(key, data, &mut |_| {}),
        _ => decode(key, data, csum_size).map(|_| ()),
    }
}

/// The entries of an INODE_REF, INODE_EXTREF, DIR_ITEM, DIR_INDEX or
/// XATTR_ITEM body, the first held inline: almost every such item has one
/// name, and a walk over millions of them makes no allocation for it.
#[derive(Debug, Clone)]
pub struct NameList<'a> {
    first: NameEntry<'a>,
    rest: Vec<NameEntry<'a>>,
}

impl<'a> NameList<'a> {
    /// The entries in item order.
    pub fn iter(&self) -> impl Iterator<Item = &NameEntry<'a>> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }

    /// How many entries (at least one).
    pub fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// Never: an item without a name is refused.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// The names of a name item (`key.ty` one of INODE_REF, INODE_EXTREF,
/// DIR_ITEM, DIR_INDEX, XATTR_ITEM), checked as [`decode`] checks them.
pub fn name_list<'a>(key: &Key, data: &'a [u8]) -> Result<NameList<'a>> {
    if !matches!(
        key.ty,
        BTRFS_INODE_REF_KEY
            | BTRFS_INODE_EXTREF_KEY
            | BTRFS_DIR_ITEM_KEY
            | BTRFS_DIR_INDEX_KEY
            | BTRFS_XATTR_ITEM_KEY
    ) {
        return Err(Error::corrupt_item(
            format!("item type {} holds no names", key.ty),
            0,
            None,
        ));
    }
    let mut first = None;
    let mut rest = Vec::new();
    names_of(key, data, &mut |n| {
        if first.is_none() {
            first = Some(n);
        } else {
            rest.push(n);
        }
    })?;
    first
        .map(|first| NameList { first, rest })
        .ok_or_else(|| Error::corrupt_item("name item without a name", 0, None))
}

/// Decode the item `key` with body `data`. `csum_size` is the superblock's
/// checksum size, which EXTENT_CSUM item sizes must be a multiple of. Errors
/// carry no location; callers add it with [`Error::at`].
pub fn decode<'a>(key: &Key, data: &'a [u8], csum_size: usize) -> Result<ItemBody<'a>> {
    Ok(match key.ty {
        BTRFS_INODE_ITEM_KEY => ItemBody::InodeItem(exact(data, "inode")?),
        BTRFS_INODE_REF_KEY => {
            let mut v = Vec::new();
            names_of(key, data, &mut |n| {
                if let NameEntry::Ref(e) = n {
                    v.push(e)
                }
            })?;
            ItemBody::InodeRef(v)
        }
        BTRFS_INODE_EXTREF_KEY => {
            let mut v = Vec::new();
            names_of(key, data, &mut |n| {
                if let NameEntry::Extref(e) = n {
                    v.push(e)
                }
            })?;
            ItemBody::InodeExtref(v)
        }
        BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => {
            let mut v = Vec::new();
            names_of(key, data, &mut |n| {
                if let NameEntry::Dir(e) = n {
                    v.push(e)
                }
            })?;
            ItemBody::DirItem(v)
        }
        BTRFS_DIR_LOG_ITEM_KEY | BTRFS_DIR_LOG_INDEX_KEY => {
            ItemBody::DirLog(exact(data, "dir log")?)
        }
        BTRFS_ORPHAN_ITEM_KEY => {
            empty(data, "orphan")?;
            ItemBody::Orphan
        }
        BTRFS_EXTENT_DATA_KEY => ItemBody::FileExtent(parse_file_extent(data)?),
        BTRFS_EXTENT_CSUM_KEY => {
            if csum_size == 0 || !data.len().is_multiple_of(csum_size) || data.is_empty() {
                return Err(Error::corrupt_item(
                    format!(
                        "csum item size {} not a non-zero multiple of csum size {csum_size}",
                        data.len()
                    ),
                    0,
                    None,
                ));
            }
            ItemBody::ExtentCsum(data)
        }
        BTRFS_ROOT_ITEM_KEY => ItemBody::RootItem(Box::new(RootItem::parse(data)?)),
        BTRFS_ROOT_REF_KEY | BTRFS_ROOT_BACKREF_KEY => {
            let (r, n) = parse_root_ref(data)?;
            ItemBody::RootRef(r, n)
        }
        BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY => {
            ItemBody::Extent(parse_extent_item(key, data)?)
        }
        BTRFS_TREE_BLOCK_REF_KEY => {
            empty(data, "tree block ref")?;
            ItemBody::TreeBlockRef
        }
        BTRFS_SHARED_BLOCK_REF_KEY => {
            empty(data, "shared block ref")?;
            ItemBody::SharedBlockRef
        }
        BTRFS_EXTENT_DATA_REF_KEY => ItemBody::ExtentDataRef(exact(data, "extent data ref")?),
        BTRFS_SHARED_DATA_REF_KEY => ItemBody::SharedDataRef(exact(data, "shared data ref")?),
        BTRFS_EXTENT_OWNER_REF_KEY => {
            let v: &super::Le64 = exact(data, "extent owner ref")?;
            ItemBody::ExtentOwnerRef(v.get())
        }
        BTRFS_BLOCK_GROUP_ITEM_KEY => ItemBody::BlockGroup(exact(data, "block group")?),
        BTRFS_FREE_SPACE_INFO_KEY => ItemBody::FreeSpaceInfo(exact(data, "free space info")?),
        BTRFS_FREE_SPACE_EXTENT_KEY => {
            empty(data, "free space extent")?;
            ItemBody::FreeSpaceExtent
        }
        BTRFS_FREE_SPACE_BITMAP_KEY => ItemBody::FreeSpaceBitmap(data),
        BTRFS_DEV_EXTENT_KEY => ItemBody::DevExtent(exact(data, "dev extent")?),
        BTRFS_DEV_ITEM_KEY => ItemBody::DevItem(exact(data, "dev item")?),
        BTRFS_CHUNK_ITEM_KEY => {
            let (c, s) = parse_chunk(data)?;
            if data.len() != super::chunk::CHUNK_ITEM_SIZE + s.len() * super::chunk::STRIPE_SIZE {
                return Err(Error::corrupt_as(
                    CorruptKind::ChunkMap,
                    format!(
                        "chunk item size {} does not match {} stripes",
                        data.len(),
                        s.len()
                    ),
                    0,
                ));
            }
            ItemBody::Chunk(c, s)
        }
        BTRFS_UUID_KEY_SUBVOL | BTRFS_UUID_KEY_RECEIVED_SUBVOL => {
            if data.is_empty() || !data.len().is_multiple_of(8) {
                return Err(Error::corrupt_item(
                    format!("uuid item size {} not a multiple of 8", data.len()),
                    0,
                    None,
                ));
            }
            ItemBody::Uuid(
                data.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            )
        }
        BTRFS_QGROUP_STATUS_KEY => {
            let s: &QgroupStatusItem = super::view(data, "qgroup status")?;
            let enable_gen = if data.len() >= super::qgroup::QGROUP_STATUS_SIMPLE_SIZE {
                Some(u64::from_le_bytes(
                    data[32..40].try_into().unwrap_or([0; 8]),
                ))
            } else {
                None
            };
            ItemBody::QgroupStatus(s, enable_gen)
        }
        BTRFS_QGROUP_INFO_KEY => ItemBody::QgroupInfo(exact(data, "qgroup info")?),
        BTRFS_QGROUP_LIMIT_KEY => ItemBody::QgroupLimit(exact(data, "qgroup limit")?),
        BTRFS_QGROUP_RELATION_KEY => ItemBody::QgroupRelation,
        BTRFS_PERSISTENT_ITEM_KEY if key.objectid == BTRFS_DEV_STATS_OBJECTID => {
            ItemBody::DevStats(
                data.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            )
        }
        BTRFS_DEV_REPLACE_KEY => ItemBody::DevReplace(exact(data, "dev replace")?),
        BTRFS_TEMPORARY_ITEM_KEY if key.objectid == BTRFS_BALANCE_OBJECTID => {
            ItemBody::Balance(exact(data, "balance")?)
        }
        BTRFS_VERITY_DESC_ITEM_KEY if key.offset == 0 => {
            let d: &VerityDescItem = super::view(data, "verity descriptor")?;
            ItemBody::VerityDesc(d, &data[core::mem::size_of::<VerityDescItem>()..])
        }
        BTRFS_VERITY_DESC_ITEM_KEY | BTRFS_VERITY_MERKLE_ITEM_KEY => ItemBody::VerityMerkle(data),
        BTRFS_STRING_ITEM_KEY => ItemBody::StringItem(data),
        _ => ItemBody::Unknown(data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dir::encode_dir_entry;
    use crate::format::inode::encode_inode_ref;

    fn dir_names(l: &NameList) -> Vec<Vec<u8>> {
        l.iter()
            .map(|n| match n {
                NameEntry::Dir(e) => e.name.to_vec(),
                NameEntry::Ref(e) => e.name.to_vec(),
                NameEntry::Extref(e) => e.name.to_vec(),
            })
            .collect()
    }

    #[test]
    fn name_list_matches_decode() {
        let loc = Key::new(258, BTRFS_INODE_ITEM_KEY, 0);
        let mut d = Vec::new();
        encode_dir_entry(&mut d, &loc, 7, 1, b"one", b"");
        let k = Key::new(257, BTRFS_DIR_ITEM_KEY, 5);
        let l = name_list(&k, &d).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(dir_names(&l), vec![b"one".to_vec()]);
        encode_dir_entry(&mut d, &loc, 7, 1, b"two", b"");
        encode_dir_entry(&mut d, &loc, 7, 1, b"three", b"");
        let l = name_list(&k, &d).unwrap();
        let ItemBody::DirItem(v) = decode(&k, &d, 4).unwrap() else {
            panic!("not a dir item")
        };
        let want: Vec<Vec<u8>> = v.iter().map(|e| e.name.to_vec()).collect();
        assert_eq!(dir_names(&l), want);
        assert_eq!(l.len(), 3);
        // One rule with decode: a DIR_INDEX holds one entry, an item at
        // least one, and only name items have names.
        let ki = Key::new(257, BTRFS_DIR_INDEX_KEY, 2);
        assert!(name_list(&ki, &d).is_err() && decode(&ki, &d, 4).is_err());
        assert!(name_list(&k, &[]).is_err() && decode(&k, &[], 4).is_err());
        let mut r = Vec::new();
        encode_inode_ref(&mut r, 3, b"x");
        let kr = Key::new(258, BTRFS_INODE_REF_KEY, 257);
        assert_eq!(dir_names(&name_list(&kr, &r).unwrap()), vec![b"x".to_vec()]);
        assert!(name_list(&Key::new(258, BTRFS_INODE_ITEM_KEY, 0), &r).is_err());
    }
}
