//! Back reference walking: which subvolume trees reference an extent,
//! either as the last commit left the trees or as they are now (after the
//! delayed refs ran). Qgroup accounting compares the two.
//!
//! An extent's references name either a tree directly ("indirect": the
//! extent is reachable from that root, through a parent found by searching
//! the tree) or a parent block ("shared": a full back reference). Both lead
//! to parent blocks, whose own references are resolved in turn, until tree
//! roots are reached, as the kernel's `btrfs_find_all_roots` does.

use super::delayed::BackRef;
use super::{Store, TreeId};
use crate::format::consts::*;
use crate::format::extent::{parse_extent_item, ExtentDataRef};
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use zerocopy::FromBytes;

/// Reads of the trees as the last commit left them (the blocks this transaction copied are read from their committed addresses): committed items, extents and the trees that reference them, for qgroup accounting and the log. Obtained from [`Store::committed`].
pub struct Committed<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Committed`].
    pub fn committed(&mut self) -> Committed<'_> {
        Committed { st: self }
    }
}

/// Which state of the trees to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// As the last commit left them (the superblock on disk).
    Committed,
    /// As they are in the running transaction.
    Current,
}

/// Bound on blocks visited per extent: far more than any real sharing, small
/// enough that damaged references cannot keep the walk going.
const MAX_VISITS: usize = 1 << 20;

/// A root as a view sees it: (bytenr, level, generation).
type RootLoc = (u64, u8, u64);

pub(super) struct RootCache {
    committed: BTreeMap<u64, Option<RootLoc>>,
}

impl RootCache {
    pub(super) fn new() -> RootCache {
        RootCache {
            committed: BTreeMap::new(),
        }
    }
}

enum Parent {
    Root,
    Block(u64),
}

impl Committed<'_> {
    /// Root location of tree `id` in `view` (None when it does not exist).
    fn view_root(&mut self, view: View, id: u64, cache: &mut RootCache) -> Result<Option<RootLoc>> {
        match view {
            View::Current => {
                if !self.st.tree_exists(id)? {
                    return Ok(None);
                }
                let st = self.st.root_state(id)?.clone();
                let gen = st
                    .item
                    .as_ref()
                    .map(|(_, ri)| ri.generation.get())
                    .unwrap_or(self.st.transid);
                Ok(Some((st.bytenr, st.level, gen)))
            }
            View::Committed => {
                if let Some(r) = cache.committed.get(&id) {
                    return Ok(*r);
                }
                let r = if id == BTRFS_ROOT_TREE_OBJECTID {
                    Some((
                        self.st.img.sb.root.get(),
                        self.st.img.sb.root_level,
                        self.st.img.sb.generation.get(),
                    ))
                } else {
                    let (rb, rl, rg) = (
                        self.st.img.sb.root.get(),
                        self.st.img.sb.root_level,
                        self.st.img.sb.generation.get(),
                    );
                    let root = self.st.load_root_at(TreeId::Root, rb, rl, Some(rg))?;
                    match self.st.next_item_from(
                        TreeId::Root,
                        root,
                        &Key::new(id, BTRFS_ROOT_ITEM_KEY, 0),
                    )? {
                        Some((k, d, _)) if k.objectid == id && k.ty == BTRFS_ROOT_ITEM_KEY => {
                            let ri = RootItem::parse(&d).map_err(|e| e.at(0, k))?;
                            Some((ri.bytenr.get(), ri.level, ri.generation.get()))
                        }
                        _ => None,
                    }
                };
                cache.committed.insert(id, r);
                Ok(r)
            }
        }
    }

    /// Items of tree `id` with keys in `[start, end]` as the last commit
    /// left them (empty when the tree did not exist then).
    pub fn committed_items_in(
        &mut self,
        id: u64,
        start: Key,
        end: Key,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut cache = RootCache::new();
        let Some((rb, rl, rg)) = self.view_root(View::Committed, id, &mut cache)? else {
            return Ok(Vec::new());
        };
        let t = TreeId::Tree(id);
        let root = self.st.load_root_at(t, rb, rl, Some(rg))?;
        let mut out = Vec::new();
        let mut k = start;
        while let Some((key, d, _)) = self.st.next_item_from(t, root, &k)? {
            if key > end {
                break;
            }
            out.push((key, d));
            if key == Key::MAX {
                break;
            }
            k = super::btree::next_key(&key);
        }
        Ok(out)
    }

    /// The item of tree `id` with exactly `key`, as the last commit left it.
    pub fn committed_lookup(&mut self, id: u64, key: &Key) -> Result<Option<Vec<u8>>> {
        Ok(self
            .committed_items_in(id, *key, *key)?
            .into_iter()
            .next()
            .map(|(_, d)| d))
    }

    /// Every extent of the extent tree in `view`, as (bytenr, bytes, level
    /// of a tree block): what a quota rescan accounts.
    pub(super) fn view_extents(
        &mut self,
        view: View,
        cache: &mut RootCache,
    ) -> Result<Vec<(u64, u64, Option<u8>)>> {
        let Some((rb, rl, rg)) = self.view_root(view, BTRFS_EXTENT_TREE_OBJECTID, cache)? else {
            return Ok(Vec::new());
        };
        let t = TreeId::Tree(BTRFS_EXTENT_TREE_OBJECTID);
        let root = self.st.load_root_at(t, rb, rl, Some(rg))?;
        let ns = self.st.nodesize() as u64;
        let mut out = Vec::new();
        let mut k = Key::MIN;
        while let Some((key, d, _)) = self.st.next_item_from(t, root, &k)? {
            match key.ty {
                BTRFS_EXTENT_ITEM_KEY => {
                    let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
                    let tb = v.item.flags.get() & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0;
                    let level = tb.then(|| v.tree_block_info.map(|t| t.level).unwrap_or(0));
                    out.push((key.objectid, key.offset, level));
                }
                BTRFS_METADATA_ITEM_KEY => {
                    // The level is the key's offset; anything past u8 is not
                    // a level a tree can have.
                    let level = u8::try_from(key.offset).map_err(|_| {
                        Error::corrupt_key_as(
                            crate::CorruptKind::Item,
                            "metadata item level",
                            key.objectid,
                            key,
                        )
                    })?;
                    out.push((key.objectid, ns, Some(level)));
                }
                _ => {}
            }
            if key == Key::MAX {
                break;
            }
            k = super::btree::next_key(&key);
        }
        Ok(out)
    }

    /// The back references (with counts) of an extent in `view`: the
    /// extent tree's item, inline and keyed.
    pub(super) fn view_backrefs(
        &mut self,
        view: View,
        bytenr: u64,
        cache: &mut RootCache,
    ) -> Result<Vec<(BackRef, u64)>> {
        let Some((rb, rl, rg)) = self.view_root(view, BTRFS_EXTENT_TREE_OBJECTID, cache)? else {
            return Ok(Vec::new());
        };
        let t = TreeId::Tree(BTRFS_EXTENT_TREE_OBJECTID);
        let root = self.st.load_root_at(t, rb, rl, Some(rg))?;
        let mut out = Vec::new();
        let mut k = Key::new(bytenr, 0, 0);
        while let Some((key, d, _)) = self.st.next_item_from(t, root, &k)? {
            if key.objectid != bytenr {
                break;
            }
            k = super::btree::next_key(&key);
            match key.ty {
                BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY => {
                    let v = parse_extent_item(&key, &d).map_err(|e| e.at(0, key))?;
                    for r in &v.refs {
                        if let Some(b) = BackRef::of_inline(r) {
                            out.push((b, r.count().max(1)));
                        }
                    }
                }
                BTRFS_TREE_BLOCK_REF_KEY => out.push((BackRef::Tree { root: key.offset }, 1)),
                BTRFS_SHARED_BLOCK_REF_KEY => {
                    out.push((BackRef::SharedTree { parent: key.offset }, 1))
                }
                BTRFS_EXTENT_DATA_REF_KEY => {
                    let x = ExtentDataRef::read_from_bytes(&d).map_err(|_| {
                        Error::corrupt_key_as(
                            crate::CorruptKind::Item,
                            "extent data ref size",
                            bytenr,
                            key,
                        )
                    })?;
                    out.push((
                        BackRef::Data {
                            root: x.root.get(),
                            objectid: x.objectid.get(),
                            offset: x.offset.get(),
                        },
                        x.count.get() as u64,
                    ));
                }
                BTRFS_SHARED_DATA_REF_KEY => {
                    let c = d
                        .get(..4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(1);
                    out.push((BackRef::SharedData { parent: key.offset }, c as u64));
                }
                _ => {}
            }
            if out.len() > MAX_VISITS {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Reference,
                    "extent with too many back references",
                    bytenr,
                ));
            }
        }
        Ok(out)
    }

    /// Subvolume trees (fs tree ids) that reference extent `bytenr` (a tree
    /// block when `level` is Some) in `view`.
    pub(super) fn extent_roots(
        &mut self,
        view: View,
        bytenr: u64,
        level: Option<u8>,
        cache: &mut RootCache,
    ) -> Result<BTreeSet<u64>> {
        let mut roots = BTreeSet::new();
        let mut seen = BTreeSet::new();
        // (extent, level of the block; None for data)
        let mut work: Vec<(u64, Option<u8>)> = vec![(bytenr, level)];
        while let Some((b, lvl)) = work.pop() {
            if !seen.insert(b) {
                continue;
            }
            if seen.len() > MAX_VISITS {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "back reference walk does not end",
                    bytenr,
                ));
            }
            for (r, count) in self.view_backrefs(view, b, cache)? {
                match r {
                    BackRef::SharedTree { parent } => {
                        work.push((parent, Some(lvl.unwrap_or(0) + 1)))
                    }
                    BackRef::SharedData { parent } => work.push((parent, Some(0))),
                    BackRef::Tree { root } => {
                        let Some(l) = lvl else { continue };
                        if !is_fstree(root) {
                            continue;
                        }
                        if let Some(p) = self.tree_parent(view, root, b, l, cache)? {
                            match p {
                                Parent::Root => {
                                    roots.insert(root);
                                }
                                Parent::Block(pb) => work.push((pb, Some(l + 1))),
                            }
                        }
                    }
                    BackRef::Data {
                        root,
                        objectid,
                        offset,
                    } => {
                        if lvl.is_some() || !is_fstree(root) {
                            continue;
                        }
                        for leaf in
                            self.data_parents(view, root, b, objectid, offset, count, cache)?
                        {
                            work.push((leaf, Some(0)));
                        }
                    }
                }
            }
        }
        Ok(roots)
    }

    /// The block of tree `root` that points to tree block `b` (at `level`),
    /// or `Root` when `b` is the tree's root.
    fn tree_parent(
        &mut self,
        view: View,
        root: u64,
        b: u64,
        level: u8,
        cache: &mut RootCache,
    ) -> Result<Option<Parent>> {
        let Some((rb, rl, rg)) = self.view_root(view, root, cache)? else {
            return Ok(None);
        };
        if rb == b {
            return Ok(Some(Parent::Root));
        }
        if rl <= level {
            return Ok(None);
        }
        let t = TreeId::Tree(root);
        let (_, first) = self.st.block_head(t, b)?;
        let Some(first) = first else { return Ok(None) };
        let top = self.st.load_root_at(t, rb, rl, Some(rg))?;
        let Some((node, _)) = self.st.node_on_path(t, top, &first, level + 1)? else {
            return Ok(None);
        };
        // The pointer is in this node (the search path of the block's first
        // key leads to it); a stale reference finds nothing.
        Ok(self
            .st
            .node_children(node)?
            .iter()
            .any(|(_, c)| *c == b)
            .then_some(Parent::Block(node)))
    }

    /// Leaves of tree `root` holding file extent items of inode `objectid`
    /// that point to data extent `b` with reference offset `offset` (at most
    /// `count` items are looked for, as many as the reference counts).
    #[allow(clippy::too_many_arguments)]
    fn data_parents(
        &mut self,
        view: View,
        root: u64,
        b: u64,
        objectid: u64,
        offset: u64,
        count: u64,
        cache: &mut RootCache,
    ) -> Result<Vec<u64>> {
        let Some((rb, rl, rg)) = self.view_root(view, root, cache)? else {
            return Ok(Vec::new());
        };
        let t = TreeId::Tree(root);
        let top = self.st.load_root_at(t, rb, rl, Some(rg))?;
        let mut leaves = Vec::new();
        let mut found = 0u64;
        // A clone from a later offset of the extent into an earlier file
        // offset makes the reference offset wrap below zero: search the
        // whole file then, as the kernel does.
        let start = if offset > i64::MAX as u64 { 0 } else { offset };
        let mut k = Key::new(objectid, BTRFS_EXTENT_DATA_KEY, start);
        let mut steps = 0usize;
        while let Some((key, d, leaf)) = self.st.next_item_from(t, top, &k)? {
            if key.objectid != objectid || key.ty != BTRFS_EXTENT_DATA_KEY {
                break;
            }
            steps += 1;
            if steps > MAX_VISITS {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "file extent scan does not end",
                    b,
                ));
            }
            k = super::btree::next_key(&key);
            if let Ok(FileExtent::Disk { item, .. }) = parse_file_extent(&d) {
                if item.disk_bytenr.get() == b
                    && key.offset.wrapping_sub(item.offset.get()) == offset
                {
                    if leaves.last() != Some(&leaf) {
                        leaves.push(leaf);
                    }
                    found += 1;
                    if found >= count {
                        break;
                    }
                }
            }
        }
        Ok(leaves)
    }
}
