//! Back references of shared extents: tree blocks and data extents used by
//! more than one tree (snapshots), with inline refs kept in the kernel's
//! order and keyed ref items once the extent item would grow past the
//! kernel's inline limit. Copying a shared tree block follows the kernel's
//! `update_ref_for_cow`: the blocks below it gain references (shared ones
//! naming the old block, when this tree owned it and it turns into a full
//! back-reference block; plain ones naming this tree otherwise), and this
//! tree's reference to the old block is dropped without freeing it.

use super::Fs;
use crate::format::consts::*;
use crate::format::extent::{extent_data_ref_hash, parse_extent_item, write_inline_refs, ExtentDataRef, InlineRef};
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::key::Key;
use crate::tree::edit;
use crate::{Error, Result};
use zerocopy::{FromBytes, IntoBytes};

const EXTENT_TREE: u64 = BTRFS_EXTENT_TREE_OBJECTID;

fn same_ref(a: &InlineRef, b: &InlineRef) -> bool {
    use InlineRef::*;
    match (a, b) {
        (TreeBlock { root: x }, TreeBlock { root: y }) => x == y,
        (SharedBlock { parent: x }, SharedBlock { parent: y }) => x == y,
        (ExtentData { root: r1, objectid: o1, offset: f1, .. }, ExtentData { root: r2, objectid: o2, offset: f2, .. }) => r1 == r2 && o1 == o2 && f1 == f2,
        (SharedData { parent: x, .. }, SharedData { parent: y, .. }) => x == y,
        _ => false,
    }
}

fn with_count(r: &InlineRef, count: u32) -> InlineRef {
    match *r {
        InlineRef::ExtentData { root, objectid, offset, .. } => InlineRef::ExtentData { root, objectid, offset, count },
        InlineRef::SharedData { parent, .. } => InlineRef::SharedData { parent, count },
        other => other,
    }
}

/// Kernel order of inline refs: by type, then descending hash or offset.
pub(crate) fn sort_refs(refs: &mut [InlineRef]) {
    refs.sort_by_key(|r| {
        let v = match *r {
            InlineRef::TreeBlock { root } => root,
            InlineRef::SharedBlock { parent } => parent,
            InlineRef::ExtentData { root, objectid, offset, .. } => extent_data_ref_hash(root, objectid, offset),
            InlineRef::SharedData { parent, .. } => parent,
            InlineRef::Owner { root } => root,
        };
        (r.type_key(), std::cmp::Reverse(v))
    });
}

/// Key of the keyed form of a ref.
fn keyed_key(bytenr: u64, r: &InlineRef) -> Key {
    match *r {
        InlineRef::TreeBlock { root } => Key::new(bytenr, BTRFS_TREE_BLOCK_REF_KEY, root),
        InlineRef::SharedBlock { parent } => Key::new(bytenr, BTRFS_SHARED_BLOCK_REF_KEY, parent),
        InlineRef::ExtentData { root, objectid, offset, .. } => Key::new(bytenr, BTRFS_EXTENT_DATA_REF_KEY, extent_data_ref_hash(root, objectid, offset)),
        InlineRef::SharedData { parent, .. } => Key::new(bytenr, BTRFS_SHARED_DATA_REF_KEY, parent),
        InlineRef::Owner { root } => Key::new(bytenr, BTRFS_EXTENT_OWNER_REF_KEY, root),
    }
}

impl Fs {
    /// The extent item of a tree block (`level` Some) or data extent.
    fn extent_item_key(&mut self, bytenr: u64, level: Option<u8>) -> Result<(Key, Vec<u8>)> {
        let keys: Vec<Key> = match level {
            Some(l) => vec![Key::new(bytenr, BTRFS_METADATA_ITEM_KEY, l as u64), Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, self.nodesize() as u64)],
            None => {
                // A data extent's length is the key offset: find it.
                match self.next_item(EXTENT_TREE, &Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0))? {
                    Some((k, _)) if k.objectid == bytenr && k.ty == BTRFS_EXTENT_ITEM_KEY => vec![k],
                    _ => vec![],
                }
            }
        };
        for k in keys {
            if let Some(d) = self.lookup(EXTENT_TREE, &k)? {
                return Ok((k, d));
            }
        }
        Err(Error::corrupt("extent without extent item", bytenr))
    }

    /// Add `delta` (+1 or -1, or a count) to one back reference of an
    /// extent. When the last reference goes, the extent item goes and its
    /// space (and for data, its checksums) is released. Returns the refs left.
    pub fn modify_ref(&mut self, bytenr: u64, level: Option<u8>, r: InlineRef, delta: i64) -> Result<u64> {
        let (key, d) = self.extent_item_key(bytenr, level)?;
        let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
        let head_len = d.len() - v.refs.iter().map(|r| r.inline_size()).sum::<usize>();
        let head = d[..head_len].to_vec();
        let mut refs = v.refs.clone();
        let total = v.item.refs.get() as i64 + delta;
        if total < 0 {
            return Err(Error::corrupt_key("extent reference count would go negative", bytenr, key));
        }
        let gen = v.item.generation.get();
        let flags = v.item.flags.get();
        match refs.iter().position(|x| same_ref(x, &r)) {
            Some(p) => {
                let c = refs[p].count().max(1) as i64 + delta;
                if c <= 0 {
                    refs.remove(p);
                } else if matches!(r, InlineRef::ExtentData { .. } | InlineRef::SharedData { .. }) {
                    refs[p] = with_count(&refs[p], c as u32);
                } else {
                    return Err(Error::corrupt_key("duplicate tree block reference", bytenr, key));
                }
            }
            None => {
                let kk = keyed_key(bytenr, &r);
                let keyed = self.lookup(EXTENT_TREE, &kk)?;
                if delta > 0 && keyed.is_none() {
                    let max = ((self.nodesize() as usize - crate::format::header::HEADER_SIZE) >> 4) - crate::format::header::ITEM_SIZE;
                    let cur: usize = d.len();
                    if cur + r.inline_size() <= max {
                        refs.push(with_count(&r, delta as u32));
                        sort_refs(&mut refs);
                    } else {
                        self.keyed_ref_update(kk, &r, delta, None)?;
                    }
                } else {
                    self.keyed_ref_update(kk, &r, delta, keyed)?;
                }
            }
        }
        if total == 0 {
            self.delete_item(EXTENT_TREE, &key)?;
            let len = if key.ty == BTRFS_METADATA_ITEM_KEY { self.nodesize() as u64 } else { key.offset };
            if level.is_none() {
                self.csum_delete(bytenr, len)?;
            }
            self.alloc.release(bytenr, len, gen < self.transid)?;
            return Ok(0);
        }
        let mut nd = head;
        nd[..8].copy_from_slice(&(total as u64).to_le_bytes());
        let _ = flags;
        write_inline_refs(&mut nd, &refs);
        self.update_item(EXTENT_TREE, &key, &nd)?;
        Ok(total as u64)
    }

    fn keyed_ref_update(&mut self, kk: Key, r: &InlineRef, delta: i64, cur: Option<Vec<u8>>) -> Result<()> {
        match *r {
            InlineRef::ExtentData { root, objectid, offset, .. } => {
                let count = match &cur {
                    Some(c) => {
                        let x = ExtentDataRef::read_from_bytes(c).map_err(|_| Error::corrupt_key("extent data ref size", kk.objectid, kk))?;
                        if x.root.get() != root || x.objectid.get() != objectid || x.offset.get() != offset {
                            return Err(Error::Unsupported("extent data ref hash collision".into()));
                        }
                        x.count.get() as i64
                    }
                    None => 0,
                } + delta;
                if count <= 0 {
                    self.delete_item(EXTENT_TREE, &kk)?;
                } else {
                    let x = ExtentDataRef { root: root.into(), objectid: objectid.into(), offset: offset.into(), count: (count as u32).into() };
                    self.update_item(EXTENT_TREE, &kk, x.as_bytes())?;
                }
            }
            InlineRef::SharedData { .. } => {
                let count = cur.as_deref().and_then(|c| c.get(..4)).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).unwrap_or(0) + delta;
                if count <= 0 {
                    self.delete_item(EXTENT_TREE, &kk)?;
                } else {
                    self.update_item(EXTENT_TREE, &kk, &(count as u32).to_le_bytes())?;
                }
            }
            _ => {
                if delta > 0 {
                    if cur.is_some() {
                        return Err(Error::corrupt_key("duplicate keyed tree block reference", kk.objectid, kk));
                    }
                    self.insert_item(EXTENT_TREE, &kk, &[])?;
                } else if cur.is_none() || !self.delete_item(EXTENT_TREE, &kk)? {
                    return Err(Error::corrupt_key("dropping a reference the extent does not have", kk.objectid, kk));
                }
            }
        }
        Ok(())
    }

    fn set_full_backref(&mut self, bytenr: u64, level: u8) -> Result<()> {
        let (key, mut d) = self.extent_item_key(bytenr, Some(level))?;
        let f = u64::from_le_bytes(d[16..24].try_into().unwrap_or([0; 8])) | BTRFS_BLOCK_FLAG_FULL_BACKREF;
        d[16..24].copy_from_slice(&f.to_le_bytes());
        self.update_item(EXTENT_TREE, &key, &d)
    }

    /// Add (`delta` 1) or remove (-1) a reference from every block and data
    /// extent `block` points to: shared ones naming `block` when `full`,
    /// plain ones naming `tree` otherwise.
    fn change_children_refs(&mut self, tree: u64, block: &[u8], block_bytenr: u64, full: bool, delta: i64) -> Result<()> {
        let level = edit::level(block);
        let n = edit::nritems(block);
        if level > 0 {
            for i in 0..n {
                let (child, _) = edit::node_ptr(block, i);
                let r = if full { InlineRef::SharedBlock { parent: block_bytenr } } else { InlineRef::TreeBlock { root: tree } };
                self.modify_ref(child, Some(level - 1), r, delta)?;
            }
            return Ok(());
        }
        for i in 0..n {
            let k = edit::leaf_key(block, i);
            if k.ty != BTRFS_EXTENT_DATA_KEY {
                continue;
            }
            if let Ok(FileExtent::Disk { item, .. }) = parse_file_extent(edit::item_data(block, i)) {
                let b = item.disk_bytenr.get();
                if b == 0 {
                    continue;
                }
                let r = if full {
                    InlineRef::SharedData { parent: block_bytenr, count: 1 }
                } else {
                    InlineRef::ExtentData { root: tree, objectid: k.objectid, offset: k.offset.wrapping_sub(item.offset.get()), count: 1 }
                };
                self.modify_ref(b, None, r, delta)?;
            }
        }
        Ok(())
    }

    /// Reference bookkeeping before copying committed block `bytenr` of
    /// `tree` that may be shared. Returns true when the old block stays in
    /// use by other trees (so the copy must not free it).
    pub(super) fn cow_shared_refs(&mut self, tree: u64, bytenr: u64, buf: &[u8]) -> Result<bool> {
        let level = edit::level(buf);
        let (key, d) = self.extent_item_key(bytenr, Some(level))?;
        let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
        let (refs, flags) = (v.item.refs.get(), v.item.flags.get());
        let owner = u64::from_le_bytes(buf[0x58..0x60].try_into().unwrap_or([0; 8]));
        let full = flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0;
        if refs > 1 {
            if owner == tree && !full {
                self.change_children_refs(tree, buf, bytenr, true, 1)?;
                self.set_full_backref(bytenr, level)?;
            } else {
                self.change_children_refs(tree, buf, bytenr, false, 1)?;
            }
            self.modify_ref(bytenr, Some(level), InlineRef::TreeBlock { root: tree }, -1)?;
            return Ok(true);
        }
        if full {
            self.change_children_refs(tree, buf, bytenr, false, 1)?;
            self.change_children_refs(tree, buf, bytenr, true, -1)?;
        }
        Ok(false)
    }
}
