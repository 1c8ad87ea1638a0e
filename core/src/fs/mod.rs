//! Files and directories on top of the transaction engine: inode items,
//! names (dir item, dir index, inode ref), xattrs, and file data (inline and
//! regular extents with their extent items and checksums).

pub mod csum_tree;

use crate::format::consts::*;
use crate::format::dir::{name_hash, DirItem};
use crate::format::extent::{write_inline_refs, ExtentItem, InlineRef};
use crate::format::file_extent::FileExtentItem;
use crate::format::inode::{InodeItem, InodeRef};
use crate::format::key::Key;
use crate::trans::Fs;
use crate::{Error, Result};
use zerocopy::{FromBytes, IntoBytes};

/// Largest data extent the kernel creates for uncompressed writes.
pub const MAX_EXTENT_SIZE: u64 = 128 << 20;
/// Default `max_inline` mount option.
pub const MAX_INLINE: usize = 2048;

/// Directory entry type of a mode.
pub fn ftype_of_mode(mode: u32) -> u8 {
    match mode & 0o170000 {
        0o100000 => BTRFS_FT_REG_FILE,
        0o040000 => BTRFS_FT_DIR,
        0o020000 => BTRFS_FT_CHRDEV,
        0o060000 => BTRFS_FT_BLKDEV,
        0o010000 => BTRFS_FT_FIFO,
        0o140000 => BTRFS_FT_SOCK,
        0o120000 => BTRFS_FT_SYMLINK,
        _ => BTRFS_FT_UNKNOWN,
    }
}

impl Fs {
    pub fn put_inode(&mut self, tree: u64, ino: u64, item: &InodeItem) -> Result<()> {
        self.update_item(tree, &Key::new(ino, BTRFS_INODE_ITEM_KEY, 0), item.as_bytes())
    }

    pub fn get_inode(&mut self, tree: u64, ino: u64) -> Result<Option<InodeItem>> {
        let k = Key::new(ino, BTRFS_INODE_ITEM_KEY, 0);
        match self.lookup(tree, &k)? {
            Some(d) => Ok(Some(InodeItem::read_from_bytes(&d).map_err(|_| Error::corrupt_key("inode item size", 0, k))?)),
            None => Ok(None),
        }
    }

    /// Append an entry to a packed item (dir item, xattr, inode ref),
    /// creating the item when it does not exist.
    fn append_packed(&mut self, tree: u64, key: &Key, entry: &[u8]) -> Result<()> {
        match self.lookup(tree, key)? {
            Some(mut d) => {
                d.extend_from_slice(entry);
                self.update_item(tree, key, &d)
            }
            None => self.insert_item(tree, key, entry),
        }
    }

    /// Add name `name` for inode `ino` in directory `parent` with dir index
    /// `index`: DIR_ITEM, DIR_INDEX and INODE_REF. The caller updates link
    /// counts and the directory's size.
    pub fn add_link(&mut self, tree: u64, parent: u64, ino: u64, name: &[u8], ftype: u8, index: u64) -> Result<()> {
        if name.is_empty() || name.len() > BTRFS_NAME_LEN {
            return Err(Error::Invalid(format!("name of {} bytes", name.len())));
        }
        let location = Key::new(ino, BTRFS_INODE_ITEM_KEY, 0);
        let di = DirItem {
            location: location.to_disk(),
            transid: self.transid.into(),
            data_len: 0.into(),
            name_len: (name.len() as u16).into(),
            type_: ftype,
        };
        let mut d = di.as_bytes().to_vec();
        d.extend_from_slice(name);
        self.append_packed(tree, &Key::new(parent, BTRFS_DIR_ITEM_KEY, name_hash(name)), &d)?;
        self.insert_item(tree, &Key::new(parent, BTRFS_DIR_INDEX_KEY, index), &d)?;
        let mut r = InodeRef { index: index.into(), name_len: (name.len() as u16).into() }.as_bytes().to_vec();
        r.extend_from_slice(name);
        self.append_packed(tree, &Key::new(ino, BTRFS_INODE_REF_KEY, parent), &r)
    }

    pub fn set_xattr(&mut self, tree: u64, ino: u64, name: &[u8], value: &[u8]) -> Result<()> {
        let di = DirItem {
            location: Key::MIN.to_disk(),
            transid: self.transid.into(),
            data_len: (value.len() as u16).into(),
            name_len: (name.len() as u16).into(),
            type_: BTRFS_FT_XATTR,
        };
        let mut d = di.as_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(value);
        let max = self.nodesize() as usize - crate::format::header::HEADER_SIZE - crate::format::header::ITEM_SIZE;
        if d.len() > max {
            return Err(Error::Invalid(format!("xattr {} of {} bytes does not fit in a tree block", String::from_utf8_lossy(name), value.len())));
        }
        self.append_packed(tree, &Key::new(ino, BTRFS_XATTR_ITEM_KEY, name_hash(name)), &d)
    }

    /// Store `data` (at most MAX_INLINE bytes, file offset 0) inline.
    pub fn write_inline(&mut self, tree: u64, ino: u64, data: &[u8]) -> Result<()> {
        let mut v = Vec::with_capacity(21 + data.len());
        v.extend_from_slice(&self.transid.to_le_bytes());
        v.extend_from_slice(&(data.len() as u64).to_le_bytes());
        v.extend_from_slice(&[BTRFS_COMPRESS_NONE, 0, 0, 0, BTRFS_FILE_EXTENT_INLINE]);
        v.extend_from_slice(data);
        self.insert_item(tree, &Key::new(ino, BTRFS_EXTENT_DATA_KEY, 0), &v)
    }

    /// Write `data` as one new regular extent at `file_off` of inode `ino`:
    /// data blocks, checksums, extent item and file extent item. `data` is
    /// padded with zeros to the sector size. Returns the bytes the extent
    /// adds to the inode's nbytes.
    pub fn write_extent(&mut self, tree: u64, ino: u64, file_off: u64, data: &[u8], datasum: bool) -> Result<u64> {
        let ss = self.sectorsize() as u64;
        let len = (data.len() as u64).div_ceil(ss) * ss;
        if len == 0 || len > MAX_EXTENT_SIZE {
            return Err(Error::Invalid(format!("data extent of {len} bytes")));
        }
        let bytenr = self.alloc_space(BTRFS_BLOCK_GROUP_DATA, len, ss)?;
        // New space: no committed tree points here, so it is written directly.
        let mut padded;
        let buf = if data.len() as u64 == len {
            data
        } else {
            padded = Vec::with_capacity(len as usize);
            padded.extend_from_slice(data);
            padded.resize(len as usize, 0);
            &padded[..]
        };
        for phys in self.image().chunks.map(bytenr, len, self.image().devid)? {
            self.write_new_data(phys, buf)?;
        }
        if datasum {
            let csum = self.image().csum;
            let cs = csum.size();
            let mut sums = Vec::with_capacity((len / ss) as usize * cs);
            for sector in buf.chunks(ss as usize) {
                sums.extend_from_slice(&csum.compute(sector)[..cs]);
            }
            self.csum_insert(bytenr, &sums)?;
        }
        let head = ExtentItem { refs: 1.into(), generation: self.transid.into(), flags: BTRFS_EXTENT_FLAG_DATA.into() };
        let mut ei = head.as_bytes().to_vec();
        write_inline_refs(&mut ei, &[InlineRef::ExtentData { root: tree, objectid: ino, offset: file_off, count: 1 }]);
        self.insert_item(BTRFS_EXTENT_TREE_OBJECTID, &Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, len), &ei)?;
        let fe = FileExtentItem {
            generation: self.transid.into(),
            ram_bytes: len.into(),
            compression: BTRFS_COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0.into(),
            type_: BTRFS_FILE_EXTENT_REG,
            disk_bytenr: bytenr.into(),
            disk_num_bytes: len.into(),
            offset: 0.into(),
            num_bytes: len.into(),
        };
        self.insert_item(tree, &Key::new(ino, BTRFS_EXTENT_DATA_KEY, file_off), fe.as_bytes())?;
        Ok(len)
    }

    /// An explicit hole extent (needed where the no-holes feature is off).
    pub fn write_hole(&mut self, tree: u64, ino: u64, file_off: u64, len: u64) -> Result<()> {
        let fe = FileExtentItem {
            generation: self.transid.into(),
            ram_bytes: len.into(),
            compression: 0,
            encryption: 0,
            other_encoding: 0.into(),
            type_: BTRFS_FILE_EXTENT_REG,
            disk_bytenr: 0.into(),
            disk_num_bytes: 0.into(),
            offset: 0.into(),
            num_bytes: len.into(),
        };
        self.insert_item(tree, &Key::new(ino, BTRFS_EXTENT_DATA_KEY, file_off), fe.as_bytes())
    }
}
