//! Files and directories on top of the transaction engine: inode items,
//! names (dir item, dir index, inode ref), xattrs, and file data (inline and
//! regular extents with their extent items and checksums).

pub mod csum_tree;

use crate::format::consts::*;
use crate::format::dir::{name_hash, DirItem};
use crate::trans::delayed::BackRef;
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

/// Directory entry type of a mode (BTRFS_FT_UNKNOWN when it has none).
pub fn ftype_of_mode(mode: u32) -> u8 {
    crate::format::dir::ftype_of_mode(mode).unwrap_or(BTRFS_FT_UNKNOWN)
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
        let transid = self.transid;
        self.queue_new_data_extent(bytenr, len, transid, BackRef::Data { root: tree, objectid: ino, offset: file_off });
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

/// Split a packed DIR_ITEM / XATTR_ITEM / INODE_REF body into entries and
/// rebuild it without the entry for which `matches` is true.
fn remove_packed_entry(data: &[u8], ty: u8, name: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut out = Vec::with_capacity(data.len());
    let mut found = false;
    match ty {
        BTRFS_INODE_REF_KEY => {
            for e in crate::format::inode::parse_inode_refs(data)? {
                if !found && e.name == name {
                    found = true;
                    continue;
                }
                out.extend_from_slice(InodeRef { index: e.index.into(), name_len: (e.name.len() as u16).into() }.as_bytes());
                out.extend_from_slice(e.name);
            }
        }
        _ => {
            for e in crate::format::dir::parse_dir_items(data)? {
                if !found && e.name == name {
                    found = true;
                    continue;
                }
                out.extend_from_slice(e.item.as_bytes());
                out.extend_from_slice(e.name);
                out.extend_from_slice(e.data);
            }
        }
    }
    Ok(found.then_some(out))
}

impl Fs {
    /// Remove one entry from a packed item; the item goes when it empties.
    fn remove_entry(&mut self, tree: u64, key: &Key, name: &[u8]) -> Result<bool> {
        let Some(d) = self.lookup(tree, key)? else { return Ok(false) };
        match remove_packed_entry(&d, key.ty, name).map_err(|e| e.at(0, *key))? {
            None => Ok(false),
            Some(rest) if rest.is_empty() => self.delete_item(tree, key),
            Some(rest) => self.update_item(tree, key, &rest).map(|_| true),
        }
    }

    /// Drop one reference to a data extent; the extent, its checksums and
    /// its space go with the last one.
    pub fn drop_data_ref(&mut self, tree: u64, ino: u64, file_off_minus_offset: u64, bytenr: u64, len: u64) -> Result<()> {
        self.queue_data_ref(bytenr, len, BackRef::Data { root: tree, objectid: ino, offset: file_off_minus_offset }, -1);
        Ok(())
    }

    /// Remove every item of inode `ino`, releasing its data extents.
    pub fn drop_inode_items(&mut self, tree: u64, ino: u64) -> Result<()> {
        let items = self.items_in(tree, Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))?;
        for (k, d) in items {
            // The item goes first: copying a leaf a snapshot shares gives
            // its data extents shared references, which must exist before
            // this tree's own reference is dropped.
            self.delete_item(tree, &k)?;
            if k.ty == BTRFS_EXTENT_DATA_KEY {
                if let Ok(crate::format::file_extent::FileExtent::Disk { item, .. }) = crate::format::file_extent::parse_file_extent(&d) {
                    let b = item.disk_bytenr.get();
                    if b != 0 {
                        self.drop_data_ref(tree, ino, k.offset.wrapping_sub(item.offset.get()), b, item.disk_num_bytes.get())?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Remove name `name` from directory `parent` (as unlink(2) for a file
    /// or rmdir(2) for an empty directory). Returns the inode it named.
    pub fn unlink(&mut self, tree: u64, parent: u64, name: &[u8], now: crate::format::inode::Timespec) -> Result<u64> {
        let dkey = Key::new(parent, BTRFS_DIR_ITEM_KEY, name_hash(name));
        let d = self.lookup(tree, &dkey)?.ok_or_else(|| Error::Invalid(format!("no entry '{}' in directory {parent}", String::from_utf8_lossy(name))))?;
        let ents = crate::format::dir::parse_dir_items(&d).map_err(|e| e.at(0, dkey))?;
        let ent = ents.iter().find(|e| e.name == name).ok_or_else(|| Error::Invalid(format!("no entry '{}' in directory {parent}", String::from_utf8_lossy(name))))?;
        let ino = Key::from(&ent.item.location).objectid;
        // The dir index comes from the inode's back reference.
        let rkey = Key::new(ino, BTRFS_INODE_REF_KEY, parent);
        let r = self.lookup(tree, &rkey)?.ok_or_else(|| Error::corrupt_key("name without inode ref", 0, rkey))?;
        let index = crate::format::inode::parse_inode_refs(&r)
            .map_err(|e| e.at(0, rkey))?
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.index)
            .ok_or_else(|| Error::corrupt_key("inode ref lacks the name", 0, rkey))?;
        self.remove_entry(tree, &dkey, name)?;
        self.delete_item(tree, &Key::new(parent, BTRFS_DIR_INDEX_KEY, index))?;
        self.remove_entry(tree, &rkey, name)?;
        let mut inode = self.get_inode(tree, ino)?.ok_or_else(|| Error::corrupt("entry names a missing inode", ino))?;
        let is_dir = inode.mode.get() & 0o170000 == 0o040000;
        let nlink = if is_dir { 0 } else { inode.nlink.get().saturating_sub(1) };
        if nlink == 0 {
            self.drop_inode_items(tree, ino)?;
        } else {
            inode.nlink.set(nlink);
            inode.ctime = now;
            inode.transid.set(self.transid);
            self.put_inode(tree, ino, &inode)?;
        }
        if let Some(mut p) = self.get_inode(tree, parent)? {
            p.size.set(p.size.get().saturating_sub(2 * name.len() as u64));
            p.mtime = now;
            p.ctime = now;
            p.transid.set(self.transid);
            self.put_inode(tree, parent, &p)?;
        }
        Ok(ino)
    }
}
