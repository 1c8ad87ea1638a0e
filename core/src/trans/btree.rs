//! CoW B-tree edits: search with copy-on-write down the path, proactive node
//! splits on insert, leaf splits at the point that makes the new item fit,
//! key fix-ups, and on delete removal of empty blocks, merges of sparse
//! siblings and root shrink.

use super::{items, Store, TreeId};
use crate::format::consts::BTRFS_MAX_LEVEL;
use crate::format::header::{HEADER_SIZE, ITEM_SIZE};
use crate::format::key::Key;
use crate::tree::edit;
use crate::tree::node::Expect;
use crate::{Error, Result};

/// One level of a search path: a block and the slot followed in it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Step {
    pub(super) bytenr: u64,
    pub(super) slot: usize,
}

impl Store {
    pub(super) fn load_child(&mut self, tree: TreeId, parent: u64, slot: usize) -> Result<u64> {
        let child = crate::tree::node::child_in(self.buf(parent)?, slot, tree.owner())
            .ok_or_else(|| Error::Internal(format!("block {parent} has no child {slot}")))?;
        self.load(tree, child.bytenr, child.expect)?;
        Ok(child.bytenr)
    }

    pub(super) fn load_root(&mut self, tree: TreeId) -> Result<u64> {
        // Every search starts here: the root item is not copied out.
        let st = self.root_state(tree)?;
        let (bytenr, level) = (st.bytenr, st.level);
        let item_gen = st.item.as_ref().map(|(_, ri)| ri.generation.get());
        if !self.cache.contains(bytenr) {
            let gen = match (item_gen, tree) {
                (Some(g), _) => Some(g),
                (None, TreeId::Root) => Some(self.img.sb.generation.get()),
                (None, TreeId::Chunk) => Some(self.img.sb.chunk_root_generation.get()),
                // The log root tree: its generation is the log's transaction.
                (None, _) => None,
            };
            self.load(tree, bytenr, Expect::root_block(level, gen))?;
        }
        Ok(bytenr)
    }

    /// Read-only search: the first item with key >= `key`, with its data.
    pub fn next_item(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
    ) -> Result<Option<(Key, Vec<u8>)>> {
        let tree: TreeId = tree.into();
        let b = self.load_root(tree)?;
        Ok(self.next_item_from(tree, b, key)?.map(|(k, d, _)| (k, d)))
    }

    /// Run `f` on the data of the item with exactly `key` (None when there
    /// is none), without copying it out.
    pub fn with_item<R>(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let tree: TreeId = tree.into();
        if items::cacheable(tree, key) {
            if let Some(hit) = self.items.get(tree, key) {
                return Ok(hit.map(f));
            }
            let got = self.with_item_searched(tree, key, |d| d.to_vec())?;
            self.items.put(tree, key, got.as_deref());
            return Ok(got.map(|d| f(&d)));
        }
        self.with_item_searched(tree, key, f)
    }

    /// [`Store::with_item`] by a search from the root.
    fn with_item_searched<R>(
        &mut self,
        tree: TreeId,
        key: &Key,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let mut b = self.load_root(tree)?;
        for _ in 0..=crate::format::consts::BTRFS_MAX_LEVEL {
            let buf = self.buf(b)?;
            if edit::level(buf) == 0 {
                return Ok(match edit::search(buf, key) {
                    Ok(s) => Some(f(edit::item_data(buf, s))),
                    Err(_) => None,
                });
            }
            let slot = match edit::search(buf, key) {
                Ok(s) => s,
                Err(s) => s.saturating_sub(1),
            };
            b = self.load_child(tree, b, slot)?;
        }
        Err(Error::corrupt_as(
            crate::CorruptKind::Structure,
            "tree deeper than the format allows",
            b,
        ))
    }

    /// Change the data of the item with exactly `key` in place (its size
    /// stays): one copy-on-write search. None when there is no such item.
    pub fn modify_item<R>(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<Option<R>> {
        let tree: TreeId = tree.into();
        let cached = items::cacheable(tree, key);
        if cached {
            self.items.forget(tree, key);
        }
        let (path, found) = self.search_mut(tree, key, None)?;
        if !found {
            return Ok(None);
        }
        let Step { bytenr, slot } = *path
            .last()
            .ok_or_else(|| Error::Internal("empty path".into()))?;
        let data = edit::item_data_mut(self.buf_mut(bytenr)?, slot);
        let r = f(data);
        if cached {
            let now = data.to_vec();
            self.items.put(tree, key, Some(&now));
        }
        Ok(Some(r))
    }

    /// The first item with key >= `key` in the tree whose root block is
    /// `root` (loaded), with the leaf holding it.
    pub(super) fn next_item_from(
        &mut self,
        tree: TreeId,
        root: u64,
        key: &Key,
    ) -> Result<Option<(Key, Vec<u8>, u64)>> {
        let mut b = root;
        // Stack of (node, slot) to continue to the right when a leaf is exhausted.
        let mut stack: Vec<(u64, usize)> = Vec::with_capacity(BTRFS_MAX_LEVEL as usize);
        loop {
            let buf = self.buf(b)?;
            if edit::level(buf) == 0 {
                let slot = match edit::search(buf, key) {
                    Ok(s) | Err(s) => s,
                };
                if slot < edit::nritems(buf) {
                    return Ok(Some((
                        edit::leaf_key(buf, slot),
                        edit::item_data(buf, slot).to_vec(),
                        b,
                    )));
                }
                // Past the end of this leaf: next leaf to the right.
                loop {
                    let Some((n, s)) = stack.pop() else {
                        return Ok(None);
                    };
                    if s + 1 < edit::nritems(self.buf(n)?) {
                        let mut c = self.load_child(tree, n, s + 1)?;
                        while edit::level(self.buf(c)?) > 0 {
                            c = self.load_child(tree, c, 0)?;
                        }
                        let cb = self.buf(c)?;
                        if edit::nritems(cb) > 0 {
                            return Ok(Some((
                                edit::leaf_key(cb, 0),
                                edit::item_data(cb, 0).to_vec(),
                                c,
                            )));
                        }
                        stack.push((n, s + 1));
                        continue;
                    }
                }
            }
            let slot = match edit::search(buf, key) {
                Ok(s) => s,
                Err(s) => s.saturating_sub(1),
            };
            stack.push((b, slot));
            b = self.load_child(tree, b, slot)?;
        }
    }

    /// Load the root block of a tree given by its location (a committed
    /// root, say) and return it.
    pub(super) fn load_root_at(
        &mut self,
        tree: TreeId,
        bytenr: u64,
        level: u8,
        generation: Option<u64>,
    ) -> Result<u64> {
        self.load(tree, bytenr, Expect::root_block(level, generation))?;
        Ok(bytenr)
    }

    /// The node at `level` on the search path of `key` from `root`, and the
    /// slot followed in it (the last key <= `key`).
    pub(super) fn node_on_path(
        &mut self,
        tree: TreeId,
        root: u64,
        key: &Key,
        level: u8,
    ) -> Result<Option<(u64, usize)>> {
        let mut b = root;
        loop {
            let buf = self.buf(b)?;
            let l = edit::level(buf);
            if l < level {
                return Ok(None);
            }
            let slot = match edit::search(buf, key) {
                Ok(s) => s,
                Err(s) => s.saturating_sub(1),
            };
            if l == level {
                return Ok(Some((b, slot)));
            }
            if edit::nritems(buf) == 0 {
                return Ok(None);
            }
            b = self.load_child(tree, b, slot)?;
        }
    }

    /// Child pointers and first keys of a loaded node.
    pub(super) fn node_children(&self, bytenr: u64) -> Result<Vec<(Key, u64)>> {
        let buf = self.buf(bytenr)?;
        if edit::level(buf) == 0 {
            return Ok(Vec::new());
        }
        Ok((0..edit::nritems(buf))
            .map(|i| (edit::node_key(buf, i), edit::node_ptr(buf, i).0))
            .collect())
    }

    /// (level, first key) of a tree block, reading it if needed.
    pub(super) fn block_head(&mut self, tree: TreeId, bytenr: u64) -> Result<(u8, Option<Key>)> {
        self.load(tree, bytenr, Expect::default())?;
        let buf = self.buf(bytenr)?;
        let k = (edit::nritems(buf) > 0).then(|| edit::key_at(buf, 0));
        Ok((edit::level(buf), k))
    }

    /// Read-only search: the last item with `lo <= key <= hi`.
    pub fn prev_item(
        &mut self,
        tree: impl Into<TreeId>,
        hi: &Key,
        lo: &Key,
    ) -> Result<Option<(Key, Vec<u8>)>> {
        let tree: TreeId = tree.into();
        let mut b = self.load_root(tree)?;
        let mut stack: Vec<(u64, usize)> = Vec::with_capacity(BTRFS_MAX_LEVEL as usize);
        loop {
            let buf = self.buf(b)?;
            if edit::level(buf) == 0 {
                let slot = match edit::search(buf, hi) {
                    Ok(s) => Some(s),
                    Err(0) => None,
                    Err(s) => Some(s - 1),
                };
                if let Some(s) = slot {
                    let k = edit::leaf_key(buf, s);
                    return Ok((k >= *lo).then(|| (k, edit::item_data(buf, s).to_vec())));
                }
                // Before the first item of this leaf: the previous leaf's last.
                loop {
                    let Some((n, s)) = stack.pop() else {
                        return Ok(None);
                    };
                    if s > 0 {
                        let mut c = self.load_child(tree, n, s - 1)?;
                        while edit::level(self.buf(c)?) > 0 {
                            let last = edit::nritems(self.buf(c)?) - 1;
                            c = self.load_child(tree, c, last)?;
                        }
                        let cb = self.buf(c)?;
                        let cnt = edit::nritems(cb);
                        if cnt > 0 {
                            let k = edit::leaf_key(cb, cnt - 1);
                            return Ok(
                                (k >= *lo).then(|| (k, edit::item_data(cb, cnt - 1).to_vec()))
                            );
                        }
                        stack.push((n, s - 1));
                    }
                }
            }
            let slot = match edit::search(buf, hi) {
                Ok(s) => s,
                Err(s) => s.saturating_sub(1),
            };
            stack.push((b, slot));
            b = self.load_child(tree, b, slot)?;
        }
    }

    /// A copy of the data of the item with exactly `key` in `tree`, None if there
    /// is none (a `btrfs_search_slot` that must match). Inode and dir items of
    /// subvolume trees are answered from the item cache when it knows them.
    pub fn lookup(&mut self, tree: impl Into<TreeId>, key: &Key) -> Result<Option<Vec<u8>>> {
        let tree: TreeId = tree.into();
        if items::cacheable(tree, key) {
            return self.with_item(tree, key, |d| d.to_vec());
        }
        Ok(match self.next_item(tree, key)? {
            Some((k, d)) if k == *key => Some(d),
            _ => None,
        })
    }

    /// The first key >= `key` in a leaf of transaction `min_trans` or
    /// later, never entering a subtree older than that
    /// (btrfs_search_forward): what a transaction changed, found without
    /// reading what it did not.
    pub fn search_forward(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
        min_trans: u64,
    ) -> Result<Option<Key>> {
        let tree: TreeId = tree.into();
        let root = self.load_root(tree)?;
        if block_generation(self.buf(root)?) < min_trans {
            return Ok(None);
        }
        self.search_forward_in(tree, root, key, min_trans, 0)
    }

    fn search_forward_in(
        &mut self,
        tree: TreeId,
        b: u64,
        key: &Key,
        min_trans: u64,
        depth: usize,
    ) -> Result<Option<Key>> {
        if depth > crate::format::consts::BTRFS_MAX_LEVEL as usize {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Structure,
                "tree deeper than the format allows",
                b,
            ));
        }
        let buf = self.buf(b)?;
        let n = edit::nritems(buf);
        if edit::level(buf) == 0 {
            let slot = match edit::search(buf, key) {
                Ok(s) | Err(s) => s,
            };
            return Ok((slot < n).then(|| edit::leaf_key(buf, slot)));
        }
        let start = match edit::search(buf, key) {
            Ok(s) => s,
            Err(s) => s.saturating_sub(1),
        };
        for i in start..n {
            if edit::node_ptr(self.buf(b)?, i).1 < min_trans {
                continue;
            }
            let child = self.load_child(tree, b, i)?;
            let k = if i == start { *key } else { Key::MIN };
            if let Some(r) = self.search_forward_in(tree, child, &k, min_trans, depth + 1)? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// The leaf holding the first item >= `key`: its generation and its
    /// items from that one to its end.
    pub fn leaf_from(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
    ) -> Result<Option<(u64, Vec<(Key, Vec<u8>)>)>> {
        let tree: TreeId = tree.into();
        let root = self.load_root(tree)?;
        let Some((k, _, leaf)) = self.next_item_from(tree, root, key)? else {
            return Ok(None);
        };
        let buf = self.buf(leaf)?;
        let slot = match edit::search(buf, &k) {
            Ok(s) | Err(s) => s,
        };
        let items = (slot..edit::nritems(buf))
            .map(|i| (edit::leaf_key(buf, i), edit::item_data(buf, i).to_vec()))
            .collect();
        Ok(Some((block_generation(buf), items)))
    }

    /// Every item with key in `[start, end]`: one search per leaf the
    /// range covers, not one per item.
    pub fn items_in(
        &mut self,
        tree: impl Into<TreeId>,
        start: Key,
        end: Key,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let tree: TreeId = tree.into();
        let mut out = Vec::new();
        let mut k = start;
        loop {
            let root = self.load_root(tree)?;
            let Some((first, _, leaf)) = self.next_item_from(tree, root, &k)? else {
                break;
            };
            if first > end {
                break;
            }
            let buf = self.buf(leaf)?;
            let mut slot = match edit::search(buf, &first) {
                Ok(s) | Err(s) => s,
            };
            let mut last = None;
            while slot < edit::nritems(buf) {
                let key = edit::leaf_key(buf, slot);
                if key > end {
                    return Ok(out);
                }
                out.push((key, edit::item_data(buf, slot).to_vec()));
                last = Some(key);
                slot += 1;
            }
            match last {
                Some(l) if l != Key::MAX => k = next_key(&l),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Search for `key`, CoW'ing every block on the path. With `ins =
    /// Some(n)`, blocks are split on the way so the leaf has `n` free bytes
    /// at the returned slot.
    pub(super) fn search_mut(
        &mut self,
        tree: TreeId,
        key: &Key,
        ins: Option<usize>,
    ) -> Result<(Vec<Step>, bool)> {
        let r = self.load_root(tree)?;
        let nr = self.cow(tree, r)?;
        if nr != r {
            let lvl = edit::level(self.buf(nr)?);
            self.set_root(tree, nr, lvl)?;
        }
        let mut path: Vec<Step> = Vec::with_capacity(BTRFS_MAX_LEVEL as usize);
        let mut b = nr;
        loop {
            let buf = self.buf(b)?;
            let level = edit::level(buf);
            if level == 0 {
                let (slot, found) = match edit::search(buf, key) {
                    Ok(s) => (s, true),
                    Err(s) => (s, false),
                };
                path.push(Step { bytenr: b, slot });
                if let Some(need) = ins {
                    if !found
                        && edit::leaf_free(self.buf(b)?) < need
                        && !self.push_leaf(tree, &mut path, need)?
                    {
                        self.split_leaf(tree, &mut path, need)?;
                    }
                }
                return Ok((path, found));
            }
            let slot = match edit::search(buf, key) {
                Ok(s) => s,
                Err(s) => s.saturating_sub(1),
            };
            path.push(Step { bytenr: b, slot });
            if ins.is_some()
                && edit::nritems(buf) + 3 >= edit::node_capacity(buf)
                && !self.push_node(tree, &mut path)?
            {
                self.split_node(tree, &mut path)?;
            }
            let Step {
                bytenr: pb,
                slot: ps,
            } = *path
                .last()
                .ok_or_else(|| Error::Internal("empty path".into()))?;
            let child = self.load_child(tree, pb, ps)?;
            b = self.cow_child_at(tree, pb, ps, child)?;
        }
    }

    /// Add a level above the root; the old root becomes its only child.
    fn grow_root(&mut self, tree: TreeId, path: &mut Vec<Step>) -> Result<()> {
        let old = path[0].bytenr;
        let ob = self.buf(old)?;
        let level = edit::level(ob) + 1;
        let k0 = edit::key_at(ob, 0);
        let nr = self.new_block(tree, level, k0)?;
        let t = self.transid;
        edit::node_insert(self.buf_mut(nr)?, 0, &k0, old, t)?;
        self.set_root(tree, nr, level)?;
        path.insert(
            0,
            Step {
                bytenr: nr,
                slot: 0,
            },
        );
        Ok(())
    }

    /// Point `parent`'s slot at a copy of its (loaded) child `child`.
    fn cow_child_at(&mut self, tree: TreeId, parent: u64, slot: usize, child: u64) -> Result<u64> {
        let nc = self.cow(tree, child)?;
        if nc != child {
            let t = self.transid;
            edit::node_set_ptr(self.buf_mut(parent)?, slot, nc, t);
        }
        Ok(nc)
    }

    /// Run `f` on the buffers of two blocks copied in this transaction
    /// (moving items or pointers between siblings).
    fn with_pair<R>(
        &mut self,
        a: u64,
        b: u64,
        f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> Result<R>,
    ) -> Result<R> {
        let mut x = std::mem::take(self.buf_mut(a)?);
        let mut y = std::mem::take(self.buf_mut(b)?);
        let r = f(&mut x, &mut y);
        *self.buf_mut(a)? = x;
        *self.buf_mut(b)? = y;
        r
    }

    /// Before splitting a full node, move pointers to a sibling with room, as
    /// the kernel's push_nodes_for_insert does: head pointers before the
    /// path's slot to the left sibling, or tail pointers after it to the
    /// right one. Returns true when the node now has room.
    fn push_node(&mut self, tree: TreeId, path: &mut [Step]) -> Result<bool> {
        let d = path.len() - 1;
        if d == 0 {
            return Ok(false);
        }
        let Step { bytenr: b, slot: s } = path[d];
        let Step {
            bytenr: p,
            slot: ps,
        } = path[d - 1];
        let pn = edit::nritems(self.buf(p)?);
        let cap = edit::node_capacity(self.buf(b)?);
        let n = edit::nritems(self.buf(b)?);
        // Enough moved pointers that the node is no longer nearly full.
        let need = (n + 4).saturating_sub(cap).max(1);
        if ps > 0 {
            let l = self.load_child(tree, p, ps - 1)?;
            let room = cap.saturating_sub(edit::nritems(self.buf(l)?) + 3);
            let k = s.min(room).min(n / 2);
            if k >= need {
                let l2 = self.cow_child_at(tree, p, ps - 1, l)?;
                let k0 = self.with_pair(b, l2, |src, dst| {
                    edit::node_move_head(src, k, dst)?;
                    Ok(edit::node_key(src, 0))
                })?;
                edit::set_key(self.buf_mut(p)?, ps, &k0);
                path[d].slot = s - k;
                return Ok(true);
            }
        }
        if ps + 1 < pn {
            let r = self.load_child(tree, p, ps + 1)?;
            let room = cap.saturating_sub(edit::nritems(self.buf(r)?) + 3);
            let k = (n - 1 - s).min(room).min(n / 2);
            if k >= need {
                let r2 = self.cow_child_at(tree, p, ps + 1, r)?;
                let k0 = self.with_pair(b, r2, |src, dst| {
                    edit::node_move_tail_to_front(src, n - k, dst)?;
                    Ok(edit::node_key(dst, 0))
                })?;
                edit::set_key(self.buf_mut(p)?, ps + 1, &k0);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Split the node at the end of `path` in two halves.
    fn split_node(&mut self, tree: TreeId, path: &mut Vec<Step>) -> Result<()> {
        if path.len() == 1 {
            self.grow_root(tree, path)?;
        }
        let d = path.len() - 1;
        let Step { bytenr: b, slot } = path[d];
        let n = edit::nritems(self.buf(b)?);
        let mid = n / 2;
        let level = edit::level(self.buf(b)?);
        let rk = edit::node_key(self.buf(b)?, mid);
        let right = self.new_block(tree, level, rk)?;
        self.with_pair(b, right, |src, dst| edit::node_move_tail(src, mid, dst))?;
        let Step {
            bytenr: p,
            slot: ps,
        } = path[d - 1];
        let t = self.transid;
        edit::node_insert(self.buf_mut(p)?, ps + 1, &rk, right, t)?;
        if slot >= mid {
            path[d] = Step {
                bytenr: right,
                slot: slot - mid,
            };
            path[d - 1].slot = ps + 1;
        }
        Ok(())
    }

    /// Before splitting, try to make room by moving items to a sibling, as
    /// the kernel's push_leaf_right and push_leaf_left do: items after the
    /// insertion slot go to the right sibling's front, items before it to
    /// the left sibling's end. A push is made only when it frees `need`
    /// bytes, and it moves more than that: moving just enough made every
    /// following insert into the full leaf push and shift it again. To the
    /// left, as many items as the sibling holds (appends at a tree's end
    /// leave full leaves behind them). To the right, until the two leaves
    /// share the sibling's free space about evenly: a right sibling filled
    /// to the brim is split in two by the next insert into it (items that
    /// writeback adds behind appended inodes), which left the fs tree of
    /// the files benchmark 9% larger than the kernel's.
    fn push_leaf(&mut self, tree: TreeId, path: &mut [Step], need: usize) -> Result<bool> {
        let d = path.len() - 1;
        if d == 0 {
            return Ok(false);
        }
        let Step { bytenr: b, slot } = path[d];
        let Step {
            bytenr: p,
            slot: ps,
        } = path[d - 1];
        let pn = edit::nritems(self.buf(p)?);
        let (n, short, movable_right, movable_left) = {
            let buf = self.buf(b)?;
            let n = edit::nritems(buf);
            let short = need - edit::leaf_free(buf);
            let size = |i: usize| ITEM_SIZE + edit::item_size(buf, i);
            // Bytes the tail [slot, n) and the head [0, slot) could give
            // at most: a push is only worth a sibling's load if the whole
            // side covers the shortfall.
            let right: usize = (slot..n).map(size).sum();
            let left: usize = (0..slot.min(n.saturating_sub(1))).map(size).sum();
            (n, short, right, left)
        };
        let size = |buf: &[u8], i: usize| ITEM_SIZE + edit::item_size(buf, i);
        // Right: tail items [j, n) (j >= slot), at least `short` bytes and
        // then up to half the sibling's room, keeping one item's header of
        // slack there.
        if ps + 1 < pn && movable_right >= short {
            let r = self.load_child(tree, p, ps + 1)?;
            let room = edit::leaf_free(self.buf(r)?).saturating_sub(ITEM_SIZE);
            let target = short.max(room / 2);
            let buf = self.buf(b)?;
            let mut moved = 0;
            let mut j = n;
            while j > slot && moved < target && moved + size(buf, j - 1) <= room {
                j -= 1;
                moved += size(buf, j);
            }
            if moved >= short && j < n {
                let r2 = self.cow_child_at(tree, p, ps + 1, r)?;
                let k0 = self.with_pair(b, r2, |src, dst| {
                    edit::leaf_move_tail_to_front(src, j, dst)?;
                    Ok(edit::leaf_key(dst, 0))
                })?;
                edit::set_key(self.buf_mut(p)?, ps + 1, &k0);
                return Ok(true);
            }
        }
        // Left: the most head items [0, k) (k <= slot) the sibling holds,
        // keeping at least one item so the leaf's parent key stays defined.
        if ps > 0 && movable_left >= short {
            let l = self.load_child(tree, p, ps - 1)?;
            let room = edit::leaf_free(self.buf(l)?);
            let buf = self.buf(b)?;
            let mut moved = 0;
            let mut k = 0;
            while k < slot && k + 1 < n && moved + size(buf, k) <= room {
                moved += size(buf, k);
                k += 1;
            }
            if moved >= short && k > 0 {
                let l2 = self.cow_child_at(tree, p, ps - 1, l)?;
                let k0 = self.with_pair(b, l2, |src, dst| {
                    edit::leaf_move_head(src, k, dst)?;
                    Ok(edit::leaf_key(src, 0))
                })?;
                edit::set_key(self.buf_mut(p)?, ps, &k0);
                path[d].slot = slot - k;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Split the leaf at the end of `path` so an item of `need` bytes
    /// (header included) fits at the path's slot. The split point is the one
    /// closest to the middle that leaves room on the new item's side.
    fn split_leaf(&mut self, tree: TreeId, path: &mut Vec<Step>, need: usize) -> Result<()> {
        let d = path.len() - 1;
        let Step { bytenr: b, slot: s } = path[d];
        let buf = self.buf(b)?;
        let n = edit::nritems(buf);
        let cap = buf.len() - HEADER_SIZE;
        if need > cap {
            return Err(Error::NoSpace(format!(
                "item of {need} bytes cannot fit in a {}-byte leaf",
                buf.len()
            )));
        }
        // prefix[i] = bytes used by items [0, i).
        let mut prefix = vec![0usize; n + 1];
        for i in 0..n {
            prefix[i + 1] = prefix[i] + ITEM_SIZE + edit::item_size(buf, i);
        }
        let mut best: Option<(usize, bool)> = None; // (mid, new item goes left)
                                                    // mid 0 (everything moves right, the new item stays alone on the
                                                    // left) and mid n (the new item alone on the right) are allowed, so
                                                    // a leaf with one big item can still take a new one.
        let mut cands: Vec<usize> = (0..=n).collect();
        cands.sort_by_key(|&m| (m as isize - (n / 2) as isize).unsigned_abs());
        for m in cands {
            let left = prefix[m];
            let right = prefix[n] - prefix[m];
            // New item on the left: it must sort within the left part.
            if s <= m && m < n && left + need <= cap && right <= cap {
                best = Some((m, true));
                break;
            }
            if s >= m && left <= cap && right + need <= cap {
                best = Some((m, false));
                break;
            }
        }
        // No single split leaves room on the item's side (a big item in
        // the middle of a full leaf): split at the item's slot, then once
        // more so the item has a leaf of its own (split_leaf's second
        // split in the kernel). Parents keep room for three pointers.
        let (mid, goes_left, again) = match best {
            Some((m, l)) => (m, l, false),
            None if s > 0 && s < n => (s, false, true),
            None => return Err(Error::NoSpace("no leaf split point fits the item".into())),
        };
        if d == 0 {
            self.grow_root(tree, path)?;
        }
        let d = path.len() - 1;
        let rk = if mid < n {
            edit::leaf_key(self.buf(b)?, mid)
        } else {
            Key::MIN
        };
        let right = self.new_block(tree, 0, rk)?;
        self.with_pair(b, right, |src, dst| edit::leaf_move_tail(src, mid, dst))?;
        let Step {
            bytenr: p,
            slot: ps,
        } = path[d - 1];
        // An empty right leaf takes the key of the item about to be inserted;
        // the caller's insert at slot 0 keeps the parent key exact.
        let key_for_parent = if mid < n { rk } else { Key::MIN };
        let t = self.transid;
        edit::node_insert(self.buf_mut(p)?, ps + 1, &key_for_parent, right, t)?;
        if !goes_left {
            path[d] = Step {
                bytenr: right,
                slot: s - mid,
            };
            path[d - 1].slot = ps + 1;
        }
        if again {
            return self.split_leaf(tree, path, need);
        }
        Ok(())
    }

    /// After the first key of the block at `path[d]` changed to `key`,
    /// update the parents' keys while the change is at slot 0.
    fn fixup_low_keys(&mut self, path: &[Step], key: &Key) -> Result<()> {
        for d in (0..path.len().saturating_sub(1)).rev() {
            let Step { bytenr, slot } = path[d];
            edit::set_key(self.buf_mut(bytenr)?, slot, key);
            if slot != 0 {
                break;
            }
        }
        Ok(())
    }

    /// Insert an item; an existing item with the same key is an error.
    pub fn insert_item(&mut self, tree: impl Into<TreeId>, key: &Key, data: &[u8]) -> Result<()> {
        let tree: TreeId = tree.into();
        let r = self.insert_item_in(tree, key, data);
        self.cache_result(tree, key, r.is_ok(), data);
        r
    }

    /// The item cache after a change to the item with `key` that left it
    /// holding `data` (`done`), or that failed part way (then it is not
    /// known any more).
    fn cache_result(&mut self, tree: TreeId, key: &Key, done: bool, data: &[u8]) {
        if items::cacheable(tree, key) {
            if done {
                self.items.put(tree, key, Some(data));
            } else {
                self.items.forget(tree, key);
            }
        }
    }

    fn insert_item_in(&mut self, tree: TreeId, key: &Key, data: &[u8]) -> Result<()> {
        let (path, found) = self.search_mut(tree, key, Some(ITEM_SIZE + data.len()))?;
        if found {
            return Err(Error::Invalid(format!(
                "item {} exists in tree {tree:?}",
                crate::format::names::key_string(key)
            )));
        }
        let Step { bytenr, slot } = *path
            .last()
            .ok_or_else(|| Error::Internal("empty path".into()))?;
        edit::leaf_insert(self.buf_mut(bytenr)?, slot, key, data)?;
        if slot == 0 {
            self.fixup_low_keys(&path, key)?;
        }
        Ok(())
    }

    /// Replace an item's data (inserting it when missing): one search,
    /// which makes room for an insert on its way down.
    pub fn update_item(&mut self, tree: impl Into<TreeId>, key: &Key, data: &[u8]) -> Result<()> {
        let tree: TreeId = tree.into();
        let r = self.update_item_in(tree, key, data);
        self.cache_result(tree, key, r.is_ok(), data);
        r
    }

    fn update_item_in(&mut self, tree: TreeId, key: &Key, data: &[u8]) -> Result<()> {
        let (path, found) = self.search_mut(tree, key, Some(ITEM_SIZE + data.len()))?;
        let Step { bytenr, slot } = *path
            .last()
            .ok_or_else(|| Error::Internal("empty path".into()))?;
        let buf = self.buf_mut(bytenr)?;
        if !found {
            edit::leaf_insert(buf, slot, key, data)?;
            if slot == 0 {
                self.fixup_low_keys(&path, key)?;
            }
            return Ok(());
        }
        let old = edit::item_size(buf, slot);
        if data.len() > old && edit::leaf_free(buf) < data.len() - old {
            // The leaf cannot hold the larger item: it goes in again,
            // and that insert splits the leaf.
            self.delete_item(tree, key)?;
            return self.insert_item_in(tree, key, data);
        }
        if old != data.len() {
            edit::leaf_resize(buf, slot, data.len())?;
        }
        edit::item_data_mut(buf, slot).copy_from_slice(data);
        Ok(())
    }

    /// Grow the item just before `key` (the last one with a smaller key,
    /// when it is in the leaf `key` belongs in) in place by the first
    /// bytes of `data`: `accept` sees its key and data and says how many
    /// bytes it takes (0: none). One search, and the item's bytes are not
    /// copied out (btrfs_csum_file_blocks extends the checksum item before
    /// the new range so). Returns the bytes taken; 0 also when the leaf
    /// has no room or the item is in another leaf (the caller's slower
    /// path then).
    pub fn grow_prev_item(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
        data: &[u8],
        accept: impl FnOnce(&Key, &[u8]) -> usize,
    ) -> Result<usize> {
        let tree: TreeId = tree.into();
        let (path, found) = self.search_mut(tree, key, None)?;
        let Step { bytenr, slot } = *path
            .last()
            .ok_or_else(|| Error::Internal("empty path".into()))?;
        if found || slot == 0 {
            return Ok(0);
        }
        let buf = self.buf_mut(bytenr)?;
        let pk = edit::leaf_key(buf, slot - 1);
        let take = accept(&pk, edit::item_data(buf, slot - 1)).min(data.len());
        if take == 0 || edit::leaf_free(buf) < take {
            return Ok(0);
        }
        let old = edit::item_size(buf, slot - 1);
        edit::leaf_resize(buf, slot - 1, old + take)?;
        edit::item_data_mut(buf, slot - 1)[old..].copy_from_slice(&data[..take]);
        if items::cacheable(tree, &pk) {
            let now = edit::item_data(buf, slot - 1).to_vec();
            self.items.put(tree, &pk, Some(&now));
        }
        Ok(take)
    }

    /// Append `data` to the item with `key`, or insert it when there is
    /// none (btrfs_insert_empty_item, and btrfs_extend_item on EEXIST), in
    /// one search: how packed items (dir items of colliding names, inode
    /// refs) take one more entry. An item that would grow past `max`
    /// bytes is left as it is: false.
    pub fn append_item(
        &mut self,
        tree: impl Into<TreeId>,
        key: &Key,
        data: &[u8],
        max: usize,
    ) -> Result<bool> {
        let tree: TreeId = tree.into();
        if data.len() > max {
            return Ok(false);
        }
        let cached = items::cacheable(tree, key);
        if cached {
            self.items.forget(tree, key);
        }
        let (path, found) = self.search_mut(tree, key, Some(ITEM_SIZE + data.len()))?;
        let Step { bytenr, slot } = *path
            .last()
            .ok_or_else(|| Error::Internal("empty path".into()))?;
        let buf = self.buf_mut(bytenr)?;
        if !found {
            edit::leaf_insert(buf, slot, key, data)?;
            if slot == 0 {
                self.fixup_low_keys(&path, key)?;
            }
            if cached {
                self.items.put(tree, key, Some(data));
            }
            return Ok(true);
        }
        let old = edit::item_size(buf, slot);
        if old + data.len() > max {
            if cached {
                let now = edit::item_data(buf, slot).to_vec();
                self.items.put(tree, key, Some(&now));
            }
            return Ok(false);
        }
        if edit::leaf_free(buf) < data.len() {
            let mut all = edit::item_data(buf, slot).to_vec();
            all.extend_from_slice(data);
            self.update_item(tree, key, &all)?;
            return Ok(true);
        }
        edit::leaf_resize(buf, slot, old + data.len())?;
        edit::item_data_mut(buf, slot)[old..].copy_from_slice(data);
        if cached {
            let now = edit::item_data(buf, slot).to_vec();
            self.items.put(tree, key, Some(&now));
        }
        Ok(true)
    }

    /// Delete an item; returns whether it existed.
    pub fn delete_item(&mut self, tree: impl Into<TreeId>, key: &Key) -> Result<bool> {
        let tree: TreeId = tree.into();
        let cached = items::cacheable(tree, key);
        if cached {
            self.items.forget(tree, key);
        }
        let (mut path, found) = self.search_mut(tree, key, None)?;
        if !found {
            if cached {
                self.items.put(tree, key, None);
            }
            return Ok(false);
        }
        let d = path.len() - 1;
        let Step { bytenr, slot } = path[d];
        edit::leaf_delete(self.buf_mut(bytenr)?, slot, 1);
        self.rebalance_after_delete(tree, &mut path)?;
        if cached {
            self.items.put(tree, key, None);
        }
        Ok(true)
    }

    /// Restore the tree's shape after items or pointers were removed from
    /// the block at the end of `path`.
    fn rebalance_after_delete(&mut self, tree: TreeId, path: &mut Vec<Step>) -> Result<()> {
        let mut d = path.len() - 1;
        loop {
            let Step { bytenr: b, slot } = path[d];
            let buf = self.buf(b)?;
            let n = edit::nritems(buf);
            let level = edit::level(buf);
            if d == 0 {
                // Root: shrink while a node has a single child.
                let mut root = b;
                loop {
                    let rb = self.buf(root)?;
                    if edit::level(rb) == 0 || edit::nritems(rb) != 1 {
                        break;
                    }
                    let child = self.load_child(tree, root, 0)?;
                    let nc = self.cow(tree, child)?;
                    let lvl = edit::level(self.buf(nc)?);
                    self.free_tree_block(tree, root, lvl + 1)?;
                    self.set_root(tree, nc, lvl)?;
                    root = nc;
                }
                let root_level = edit::level(self.buf(root)?);
                if root_level > 0 && edit::nritems(self.buf(root)?) == 0 {
                    // Every item is gone: the root becomes an empty leaf.
                    let nb = self.new_block(tree, 0, Key::MIN)?;
                    self.free_tree_block(tree, root, root_level)?;
                    self.set_root(tree, nb, 0)?;
                }
                return Ok(());
            }
            let Step {
                bytenr: p,
                slot: ps,
            } = path[d - 1];
            if n == 0 {
                edit::node_delete(self.buf_mut(p)?, ps, 1);
                self.free_tree_block(tree, b, level)?;
                if ps == 0 && edit::nritems(self.buf(p)?) > 0 {
                    let k = edit::node_key(self.buf(p)?, 0);
                    self.fixup_low_keys(&path[..d], &k)?;
                }
                path.truncate(d);
                d -= 1;
                continue;
            }
            if slot == 0 {
                let k = edit::key_at(self.buf(b)?, 0);
                self.fixup_low_keys(&path[..=d], &k)?;
            }
            if self.try_merge(tree, path, d)? {
                path.truncate(d);
                d -= 1;
                continue;
            }
            return Ok(());
        }
    }

    /// Merge the sparse block at `path[d]` with a sibling when both fit in
    /// one block. Returns true when a pointer was removed from the parent.
    fn try_merge(&mut self, tree: TreeId, path: &mut [Step], d: usize) -> Result<bool> {
        let Step { bytenr: b, .. } = path[d];
        let Step {
            bytenr: p,
            slot: ps,
        } = path[d - 1];
        let buf = self.buf(b)?;
        let leaf = edit::level(buf) == 0;
        let cap = buf.len() - HEADER_SIZE;
        let used = |buf: &[u8]| {
            if leaf {
                edit::leaf_used(buf)
            } else {
                edit::nritems(buf) * crate::format::header::KEY_PTR_SIZE
            }
        };
        if used(buf) * 4 >= cap {
            return Ok(false);
        }
        let pn = edit::nritems(self.buf(p)?);
        // Prefer merging into the left sibling, else pull the right one in.
        let (left_slot, right_slot) = if ps > 0 {
            (ps - 1, ps)
        } else if ps + 1 < pn {
            (ps, ps + 1)
        } else {
            return Ok(false);
        };
        let l = self.load_child(tree, p, left_slot)?;
        let r = self.load_child(tree, p, right_slot)?;
        if used(self.buf(l)?) + used(self.buf(r)?) > cap {
            return Ok(false);
        }
        let l2 = self.cow_child_at(tree, p, left_slot, l)?;
        let r2 = self.cow_child_at(tree, p, right_slot, r)?;
        self.with_pair(r2, l2, |src, dst| {
            let n = edit::nritems(src);
            if leaf {
                edit::leaf_move_head(src, n, dst)
            } else {
                edit::node_move_head(src, n, dst)
            }
        })?;
        edit::node_delete(self.buf_mut(p)?, right_slot, 1);
        let lvl = edit::level(self.buf(r2)?);
        self.free_tree_block(tree, r2, lvl)?;
        path[d - 1].slot = left_slot;
        Ok(true)
    }
}

/// The smallest key greater than `k`.
pub fn next_key(k: &Key) -> Key {
    if k.offset < u64::MAX {
        Key::new(k.objectid, k.ty, k.offset + 1)
    } else if k.ty < u8::MAX {
        Key::new(k.objectid, k.ty + 1, 0)
    } else {
        Key::new(k.objectid.saturating_add(1), 0, 0)
    }
}

/// The generation in a block's header.
fn block_generation(buf: &[u8]) -> u64 {
    u64::from_le_bytes(buf[0x50..0x58].try_into().unwrap_or([0; 8]))
}
