//! Back references of shared extents: tree blocks and data extents used by
//! more than one tree (snapshots), with inline refs kept in the kernel's
//! order and keyed ref items once the extent item would grow past the
//! kernel's inline limit. Copying a shared tree block follows the kernel's
//! `update_ref_for_cow`: the blocks below it gain references (shared ones
//! naming the old block, when this tree owned it and it turns into a full
//! back-reference block; plain ones naming this tree otherwise), and this
//! tree's reference to the old block is dropped without freeing it.

use super::delayed::{BackRef, NewExtent, RefHead};
use super::{Store, TreeId};
use crate::format::consts::*;
use crate::format::extent::{
    extent_data_ref_hash, parse_extent_item, write_inline_refs, ExtentDataRef, InlineRef,
};
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::key::Key;
use crate::tree::edit;
use crate::{Error, Result};
use zerocopy::{FromBytes, IntoBytes};

/// Extent accounting: the extent tree's items and back references, changed through delayed refs queued during the transaction and run at commit. Obtained from [`Store::extent_refs`].
pub struct ExtentRefs<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`ExtentRefs`].
    pub fn extent_refs(&mut self) -> ExtentRefs<'_> {
        ExtentRefs { st: self }
    }
}

const EXTENT_TREE: u64 = BTRFS_EXTENT_TREE_OBJECTID;

fn same_ref(a: &InlineRef, b: &InlineRef) -> bool {
    use InlineRef::*;
    match (a, b) {
        (TreeBlock { root: x }, TreeBlock { root: y }) => x == y,
        (SharedBlock { parent: x }, SharedBlock { parent: y }) => x == y,
        (
            ExtentData {
                root: r1,
                objectid: o1,
                offset: f1,
                ..
            },
            ExtentData {
                root: r2,
                objectid: o2,
                offset: f2,
                ..
            },
        ) => r1 == r2 && o1 == o2 && f1 == f2,
        (SharedData { parent: x, .. }, SharedData { parent: y, .. }) => x == y,
        _ => false,
    }
}

fn with_count(r: &InlineRef, count: u32) -> InlineRef {
    match *r {
        InlineRef::ExtentData {
            root,
            objectid,
            offset,
            ..
        } => InlineRef::ExtentData {
            root,
            objectid,
            offset,
            count,
        },
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
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                ..
            } => extent_data_ref_hash(root, objectid, offset),
            InlineRef::SharedData { parent, .. } => parent,
            InlineRef::Owner { root } => root,
        };
        (r.type_key(), std::cmp::Reverse(v))
    });
}

/// Key of the keyed form of a ref.
pub(super) fn keyed_key(bytenr: u64, r: &InlineRef) -> Key {
    match *r {
        InlineRef::TreeBlock { root } => Key::new(bytenr, BTRFS_TREE_BLOCK_REF_KEY, root),
        InlineRef::SharedBlock { parent } => Key::new(bytenr, BTRFS_SHARED_BLOCK_REF_KEY, parent),
        InlineRef::ExtentData {
            root,
            objectid,
            offset,
            ..
        } => Key::new(
            bytenr,
            BTRFS_EXTENT_DATA_REF_KEY,
            extent_data_ref_hash(root, objectid, offset),
        ),
        InlineRef::SharedData { parent, .. } => Key::new(bytenr, BTRFS_SHARED_DATA_REF_KEY, parent),
        InlineRef::Owner { root } => Key::new(bytenr, BTRFS_EXTENT_OWNER_REF_KEY, root),
    }
}

impl ExtentRefs<'_> {
    /// The extent item of a tree block (`level` Some) or data extent.
    pub(super) fn extent_item_key(
        &mut self,
        bytenr: u64,
        level: Option<u8>,
    ) -> Result<(Key, Vec<u8>)> {
        let keys: Vec<Key> = match level {
            Some(l) => vec![
                Key::new(bytenr, BTRFS_METADATA_ITEM_KEY, l as u64),
                Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, self.st.nodesize() as u64),
            ],
            None => {
                // A data extent's length is the key offset: find it.
                match self
                    .st
                    .next_item(EXTENT_TREE, &Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0))?
                {
                    Some((k, _)) if k.objectid == bytenr && k.ty == BTRFS_EXTENT_ITEM_KEY => {
                        vec![k]
                    }
                    _ => vec![],
                }
            }
        };
        for k in keys {
            if let Some(d) = self.st.lookup(EXTENT_TREE, &k)? {
                return Ok((k, d));
            }
        }
        Err(Error::corrupt_as(
            crate::CorruptKind::Reference,
            "extent without extent item",
            bytenr,
        ))
    }

    /// Reference count and flags of an extent as they stand with the
    /// queued changes applied: the extent item's, or a new extent's.
    pub(super) fn extent_refs_now(&mut self, bytenr: u64, level: Option<u8>) -> Result<(u64, u64)> {
        let pending = self
            .st
            .delayed
            .get(bytenr)
            .map(|h| (h.delta(), h.new.map(|n| n.flags)));
        if let Some((delta, Some(flags))) = pending {
            return Ok((delta.max(0) as u64, flags));
        }
        let (key, d) = self.extent_item_key(bytenr, level)?;
        let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
        let refs = (v.item.refs.get() as i64 + pending.map_or(0, |p| p.0)).max(0) as u64;
        Ok((refs, v.item.flags.get()))
    }

    /// References a data extent has with queued changes counted (0 when it
    /// does not exist).
    pub fn data_extent_refs(&mut self, bytenr: u64) -> Result<u64> {
        match self.extent_refs_now(bytenr, None) {
            Ok((refs, _)) => Ok(refs),
            Err(Error::Corrupt { .. }) if self.st.delayed.get(bytenr).is_none() => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Whether data extent `bytenr` is referenced only through `r` (one back
    /// reference, whatever its count, and nothing queued for another): what
    /// allows writing it in place (the kernel's btrfs_cross_ref_exist).
    pub fn data_extent_exclusive(&mut self, bytenr: u64, r: BackRef) -> Result<bool> {
        if let Some(h) = self.st.delayed.get(bytenr) {
            if h.refs.keys().any(|k| *k != r) {
                return Ok(false);
            }
            if h.new.is_some() {
                return Ok(true);
            }
        }
        let (key, d) = match self.extent_item_key(bytenr, None) {
            Ok(x) => x,
            Err(Error::Corrupt { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
        if v.refs.len() != 1 {
            return Ok(false);
        }
        let mine = BackRef::of_inline(&v.refs[0]) == Some(r);
        Ok(mine && v.refs[0].count() == v.item.refs.get())
    }

    /// Whether a data extent exists: in the extent tree, or queued as new.
    pub fn data_extent_exists(&mut self, bytenr: u64, num_bytes: u64) -> Result<bool> {
        if self.st.delayed.get(bytenr).is_some_and(|h| h.new.is_some()) {
            return Ok(true);
        }
        Ok(self
            .st
            .lookup(
                EXTENT_TREE,
                &Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, num_bytes),
            )?
            .is_some())
    }

    /// Queue one more (`delta` > 0) or one less reference to a data extent.
    pub fn queue_data_ref(&mut self, bytenr: u64, num_bytes: u64, r: BackRef, delta: i64) {
        self.st.delayed.add(bytenr, num_bytes, None, r, delta);
    }

    /// Queue a data extent allocated in this transaction with its first
    /// reference; the extent item is inserted when the refs run.
    pub fn queue_new_data_extent(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        generation: u64,
        r: BackRef,
    ) {
        let new = NewExtent {
            generation,
            flags: BTRFS_EXTENT_FLAG_DATA,
            first_key: Key::MIN,
        };
        self.st.delayed.add_new(bytenr, num_bytes, None, new, r);
    }

    /// Apply one head of queued changes: insert a new extent's item with its
    /// references, or add then drop references of an existing one (adds
    /// first, so the count never passes through zero on the way).
    pub(super) fn run_ref_head(&mut self, bytenr: u64, head: RefHead) -> Result<()> {
        let (adds, drops): (Vec<(BackRef, i64)>, Vec<(BackRef, i64)>) = head
            .refs
            .iter()
            .map(|(r, d)| (*r, *d))
            .partition(|(_, d)| *d > 0);
        if let Some(new) = head.new {
            if let Some((r, d)) = drops.first() {
                return Err(Error::Internal(format!("extent {bytenr} allocated in this transaction loses reference {r:?} ({d}) it never had")));
            }
            if adds.is_empty() {
                // Written and released in the same transaction: its space
                // stays pinned (a log may still point at it) and its
                // checksums go.
                if head.level.is_none() {
                    self.st.csums().csum_delete(bytenr, head.num_bytes)?;
                }
                return self.st.space.alloc.release(bytenr, head.num_bytes, true);
            }
            return self.insert_extent_item(bytenr, head.num_bytes, head.level, new, &adds);
        }
        for (r, d) in adds.iter().chain(drops.iter()) {
            self.modify_ref(bytenr, head.level, r.inline(d.unsigned_abs() as u32), *d)?;
        }
        Ok(())
    }

    /// Insert the extent item of a new extent with `refs` (all positive):
    /// inline while the item stays within the kernel's inline limit, keyed
    /// after that.
    fn insert_extent_item(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        level: Option<u8>,
        new: NewExtent,
        refs: &[(BackRef, i64)],
    ) -> Result<()> {
        let total: i64 = refs.iter().map(|(_, d)| *d).sum();
        let head = crate::format::extent::ExtentItem {
            refs: (total as u64).into(),
            generation: new.generation.into(),
            flags: new.flags.into(),
        };
        let mut data = head.as_bytes().to_vec();
        let key = match level {
            Some(l) if self.st.skinny() => Key::new(bytenr, BTRFS_METADATA_ITEM_KEY, l as u64),
            Some(l) => {
                data.extend_from_slice(
                    crate::format::extent::TreeBlockInfo {
                        key: new.first_key.to_disk(),
                        level: l,
                    }
                    .as_bytes(),
                );
                Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, num_bytes)
            }
            None => Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, num_bytes),
        };
        let max = self.max_inline_extent_item();
        let mut inline: Vec<InlineRef> = refs.iter().map(|(r, d)| r.inline(*d as u32)).collect();
        // Simple quotas: the subvolume that allocated the extent is what it
        // counts for, named by an owner ref in a data extent (always
        // inline, first) and by the header of a tree block.
        if self.st.qgroups.simple.is_some() {
            let mut owner = refs.iter().find_map(|(r, _)| match *r {
                BackRef::Data { root, .. } if level.is_none() => Some(root),
                BackRef::Tree { root } if level.is_some() => Some(root),
                _ => None,
            });
            if owner.is_none() && level.is_some() {
                owner = Some(self.st.quotas().tree_block_owner(bytenr)?);
            }
            if let Some(root) = owner {
                if level.is_none() {
                    inline.push(InlineRef::Owner { root });
                }
                self.st
                    .quotas()
                    .squota_delta(root, num_bytes, new.generation, true);
            }
        }
        sort_refs(&mut inline);
        let mut size = data.len();
        let mut keyed = Vec::new();
        let mut kept = Vec::new();
        for r in inline {
            if matches!(r, InlineRef::Owner { .. }) || size + r.inline_size() <= max {
                size += r.inline_size();
                kept.push(r);
            } else {
                keyed.push(r);
            }
        }
        write_inline_refs(&mut data, &kept);
        self.st.insert_item(EXTENT_TREE, &key, &data)?;
        for r in keyed {
            let kk = keyed_key(bytenr, &r);
            self.keyed_ref_update(kk, &r, r.count() as i64, None)?;
        }
        Ok(())
    }

    /// Largest extent item (head and inline refs) the kernel keeps inline.
    pub(super) fn max_inline_extent_item(&self) -> usize {
        ((self.st.nodesize() as usize - crate::format::header::HEADER_SIZE) >> 4)
            - crate::format::header::ITEM_SIZE
    }

    /// Add `delta` (+1 or -1, or a count) to one back reference of an
    /// extent. When the last reference goes, the extent item goes and its
    /// space (and for data, its checksums) is released. Returns the refs left.
    pub(super) fn modify_ref(
        &mut self,
        bytenr: u64,
        level: Option<u8>,
        r: InlineRef,
        delta: i64,
    ) -> Result<u64> {
        let (key, d) = self.extent_item_key(bytenr, level)?;
        let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
        let head_len = d.len() - v.refs.iter().map(|r| r.inline_size()).sum::<usize>();
        let head = d[..head_len].to_vec();
        let mut refs = v.refs.clone();
        let total = v.item.refs.get() as i64 + delta;
        if total < 0 {
            return Err(Error::corrupt_key_as(
                crate::CorruptKind::Reference,
                "extent reference count would go negative",
                bytenr,
                key,
            ));
        }
        let gen = v.item.generation.get();
        let flags = v.item.flags.get();
        match refs.iter().position(|x| same_ref(x, &r)) {
            Some(p) => {
                let c = refs[p].count().max(1) as i64 + delta;
                if c <= 0 {
                    refs.remove(p);
                } else if matches!(
                    r,
                    InlineRef::ExtentData { .. } | InlineRef::SharedData { .. }
                ) {
                    refs[p] = with_count(&refs[p], c as u32);
                } else {
                    return Err(Error::corrupt_key_as(
                        crate::CorruptKind::Reference,
                        "duplicate tree block reference",
                        bytenr,
                        key,
                    ));
                }
            }
            None => {
                let kk = keyed_key(bytenr, &r);
                let keyed = self.st.lookup(EXTENT_TREE, &kk)?;
                if delta > 0 && keyed.is_none() {
                    let max = self.max_inline_extent_item();
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
            self.st.delete_item(EXTENT_TREE, &key)?;
            let len = if key.ty == BTRFS_METADATA_ITEM_KEY {
                self.st.nodesize() as u64
            } else {
                key.offset
            };
            if self.st.qgroups.simple.is_some() {
                let owner = match (level, r) {
                    (None, _) => v.refs.iter().find_map(|x| match *x {
                        InlineRef::Owner { root } => Some(root),
                        _ => None,
                    }),
                    (Some(_), InlineRef::TreeBlock { root }) => Some(root),
                    (Some(_), _) => Some(self.st.quotas().tree_block_owner(bytenr)?),
                };
                if let Some(root) = owner {
                    self.st.quotas().squota_delta(root, len, gen, false);
                }
            }
            if level.is_none() {
                self.st.csums().csum_delete(bytenr, len)?;
            }
            // Data stays pinned until the commit is durable even when this
            // transaction wrote it: a log tree may point at it. A tree block
            // of this transaction was never written and is free at once.
            self.st
                .space
                .alloc
                .release(bytenr, len, level.is_none() || gen < self.st.transid)?;
            return Ok(0);
        }
        let mut nd = head;
        nd[..8].copy_from_slice(&(total as u64).to_le_bytes());
        let _ = flags;
        write_inline_refs(&mut nd, &refs);
        self.st.update_item(EXTENT_TREE, &key, &nd)?;
        Ok(total as u64)
    }

    pub(super) fn keyed_ref_update(
        &mut self,
        kk: Key,
        r: &InlineRef,
        delta: i64,
        cur: Option<Vec<u8>>,
    ) -> Result<()> {
        match *r {
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                ..
            } => {
                let count = match &cur {
                    Some(c) => {
                        let x = ExtentDataRef::read_from_bytes(c).map_err(|_| {
                            Error::corrupt_key_as(
                                crate::CorruptKind::Item,
                                "extent data ref size",
                                kk.objectid,
                                kk,
                            )
                        })?;
                        if x.root.get() != root
                            || x.objectid.get() != objectid
                            || x.offset.get() != offset
                        {
                            return Err(Error::Unsupported(
                                "extent data ref hash collision".into(),
                            ));
                        }
                        x.count.get() as i64
                    }
                    None => 0,
                } + delta;
                if count <= 0 {
                    self.st.delete_item(EXTENT_TREE, &kk)?;
                } else {
                    let x = ExtentDataRef {
                        root: root.into(),
                        objectid: objectid.into(),
                        offset: offset.into(),
                        count: (count as u32).into(),
                    };
                    self.st.update_item(EXTENT_TREE, &kk, x.as_bytes())?;
                }
            }
            InlineRef::SharedData { .. } => {
                let count = cur
                    .as_deref()
                    .and_then(|c| c.get(..4))
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                    .unwrap_or(0)
                    + delta;
                if count <= 0 {
                    self.st.delete_item(EXTENT_TREE, &kk)?;
                } else {
                    self.st
                        .update_item(EXTENT_TREE, &kk, &(count as u32).to_le_bytes())?;
                }
            }
            _ => {
                if delta > 0 {
                    if cur.is_some() {
                        return Err(Error::corrupt_key_as(
                            crate::CorruptKind::Reference,
                            "duplicate keyed tree block reference",
                            kk.objectid,
                            kk,
                        ));
                    }
                    self.st.insert_item(EXTENT_TREE, &kk, &[])?;
                } else if cur.is_none() || !self.st.delete_item(EXTENT_TREE, &kk)? {
                    return Err(Error::corrupt_key_as(
                        crate::CorruptKind::Reference,
                        "dropping a reference the extent does not have",
                        kk.objectid,
                        kk,
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn set_full_backref(&mut self, bytenr: u64, level: u8) -> Result<()> {
        let (key, mut d) = self.extent_item_key(bytenr, Some(level))?;
        let f = u64::from_le_bytes(d[16..24].try_into().unwrap_or([0; 8]))
            | BTRFS_BLOCK_FLAG_FULL_BACKREF;
        d[16..24].copy_from_slice(&f.to_le_bytes());
        self.st.update_item(EXTENT_TREE, &key, &d)
    }

    /// Add (`delta` 1) or remove (-1) a reference from every block and data
    /// extent `block` points to: shared ones naming `block` when `full`,
    /// plain ones naming `tree` otherwise.
    pub(super) fn change_children_refs(
        &mut self,
        tree: u64,
        block: &[u8],
        block_bytenr: u64,
        full: bool,
        delta: i64,
    ) -> Result<()> {
        let level = edit::level(block);
        let n = edit::nritems(block);
        if level > 0 {
            for i in 0..n {
                let (child, _) = edit::node_ptr(block, i);
                let r = if full {
                    BackRef::SharedTree {
                        parent: block_bytenr,
                    }
                } else {
                    BackRef::Tree { root: tree }
                };
                let ns = self.st.nodesize() as u64;
                self.st.delayed.add(child, ns, Some(level - 1), r, delta);
            }
            return Ok(());
        }
        for i in 0..n {
            let k = edit::leaf_key(block, i);
            if k.ty != BTRFS_EXTENT_DATA_KEY {
                continue;
            }
            if let Ok(FileExtent::Disk { item, .. }) = parse_file_extent(edit::item_data(block, i))
            {
                let b = item.disk_bytenr.get();
                if b == 0 {
                    continue;
                }
                let r = if full {
                    BackRef::SharedData {
                        parent: block_bytenr,
                    }
                } else {
                    BackRef::Data {
                        root: tree,
                        objectid: k.objectid,
                        offset: k.offset.wrapping_sub(item.offset.get()),
                    }
                };
                self.st
                    .delayed
                    .add(b, item.disk_num_bytes.get(), None, r, delta);
            }
        }
        Ok(())
    }

    /// Reference bookkeeping before copying committed block `bytenr` of
    /// `tree` that may be shared. Returns true when the old block stays in
    /// use by other trees (so the copy must not free it).
    pub(super) fn cow_shared_refs(
        &mut self,
        tree: TreeId,
        bytenr: u64,
        buf: &[u8],
    ) -> Result<bool> {
        let level = edit::level(buf);
        let (refs, flags) = self.extent_refs_now(bytenr, Some(level))?;
        let owner = edit::owner(buf);
        let tree = tree.id();
        let full = flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0;
        if refs > 1 {
            if owner == tree && !full {
                self.change_children_refs(tree, buf, bytenr, true, 1)?;
                self.set_full_backref(bytenr, level)?;
            } else {
                self.change_children_refs(tree, buf, bytenr, false, 1)?;
            }
            let ns = self.st.nodesize() as u64;
            self.st
                .delayed
                .add(bytenr, ns, Some(level), BackRef::Tree { root: tree }, -1);
            return Ok(true);
        }
        if full {
            self.change_children_refs(tree, buf, bytenr, false, 1)?;
            self.change_children_refs(tree, buf, bytenr, true, -1)?;
        }
        Ok(false)
    }
}
