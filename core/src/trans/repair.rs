//! What `fsck --repair` changes that only the store can: the allocator's
//! block groups, the free space tree, the device items. Each primitive
//! leaves the running transaction consistent; the caller commits once.
//!
//! The allocator's view is derived from the extent tree when the store is
//! opened (`load_block_groups`): every used-bytes count and every free
//! range written here comes from there, never from the items repaired.

use super::{Store, TreeId};
use crate::format::consts::*;
use crate::format::dev::DevItem;
use crate::format::key::Key;
use crate::{Error, Result};
use zerocopy::{FromBytes, IntoBytes};

/// Repair internals: the edits btrkit-fsck --repair makes that no file operation makes (extent items rebuilt, trees emptied or re-pointed, mended leaves written, dev extents and device sizes fixed). Obtained from [`Store::repair`].
pub struct RepairEdits<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`RepairEdits`].
    pub fn repair(&mut self) -> RepairEdits<'_> {
        RepairEdits { st: self }
    }
}

const FST: u64 = BTRFS_FREE_SPACE_TREE_OBJECTID;

/// What [`Store::fix_device_sizes`] changed, one line each.
pub type Changes = Vec<String>;

impl RepairEdits<'_> {
    /// Empty the free space tree and let the commit write every block
    /// group's entries again from the allocator; the tree is marked valid.
    /// Items keyed outside every block group (stale entries) go too.
    pub fn rebuild_free_space_tree(&mut self) -> Result<()> {
        if !self.st.has_fst() {
            return Ok(());
        }
        if !self.st.tree_exists(FST)? {
            return Err(Error::Unsupported(
                "the free space tree has no root item; it cannot be rebuilt in place".into(),
            ));
        }
        self.empty_tree(FST)?;
        for g in self.st.space.alloc.groups.values_mut() {
            g.fst_bitmaps = false;
            g.dirty = true;
        }
        let ro = self.st.sb.compat_ro_flags.get();
        self.st
            .sb
            .compat_ro_flags
            .set(ro | BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID);
        Ok(())
    }

    /// Delete every item of tree `id` (its root stays); returns how many
    /// went.
    pub fn empty_tree(&mut self, id: u64) -> Result<usize> {
        let items = self.st.items_in(id, Key::MIN, Key::MAX)?;
        // From the end: each deletion leaves the keys before it in place.
        for (k, _) in items.iter().rev() {
            self.st.delete_item(id, k)?;
        }
        Ok(items.len())
    }

    /// The v1 free space cache's headers in the root tree: (header key,
    /// cache inode number).
    pub fn space_cache_headers(&mut self) -> Result<Vec<(Key, u64)>> {
        let hdrs = self.st.items_in(
            TreeId::Root,
            Key::new(BTRFS_FREE_SPACE_OBJECTID, 0, 0),
            Key::new(BTRFS_FREE_SPACE_OBJECTID, u8::MAX, u64::MAX),
        )?;
        Ok(hdrs
            .into_iter()
            .map(|(k, d)| {
                let ino = d
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0);
                (k, ino)
            })
            .collect())
    }

    /// Device items and the superblock's device totals made consistent
    /// with the devices and the dev tree: each device's bytes_used is what
    /// its dev extents add up to; its total_bytes is sector aligned and no
    /// larger than the device, but never below the end of its last dev
    /// extent (that is data, not a size error); the superblock's
    /// total_bytes is their sum and num_devices their count.
    pub fn fix_device_sizes(&mut self) -> Result<Changes> {
        let mut changes = Vec::new();
        let ss = self.st.sectorsize() as u64;
        let dev_items = self.st.items_in(
            TreeId::Chunk,
            Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, 0),
            Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, u64::MAX),
        )?;
        if dev_items.is_empty() {
            return Err(Error::Unsupported(
                "the chunk tree holds no device item to repair".into(),
            ));
        }
        let mut total = 0u64;
        for (k, d) in &dev_items {
            let devid = k.offset;
            let mut di = DevItem::read_from_bytes(d).map_err(|_| {
                Error::corrupt_key_as(crate::CorruptKind::Device, "dev item size", 0, *k)
            })?;
            let exts = self.st.items_in(
                BTRFS_DEV_TREE_OBJECTID,
                Key::new(devid, BTRFS_DEV_EXTENT_KEY, 0),
                Key::new(devid, BTRFS_DEV_EXTENT_KEY, u64::MAX),
            )?;
            let mut used = 0u64;
            let mut end = 0u64;
            for (ek, ed) in &exts {
                let len = ed
                    .get(24..32)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0);
                used = used.saturating_add(len);
                end = end.max(ek.offset.saturating_add(len));
            }
            let size = self.st.img.device_of(devid).map(|d| d.size());
            let mut want = di.total_bytes.get() / ss * ss;
            if let Some(sz) = size {
                want = want.min(sz / ss * ss);
            }
            want = want.max(end.div_ceil(ss) * ss);
            if want != di.total_bytes.get() || used != di.bytes_used.get() {
                changes.push(format!(
                    "device {devid}: total_bytes {} -> {want}, bytes_used {} -> {used}",
                    di.total_bytes.get(),
                    di.bytes_used.get()
                ));
                di.total_bytes.set(want);
                di.bytes_used.set(used);
                self.st.update_item(TreeId::Chunk, k, di.as_bytes())?;
            }
            // The superblocks carry each device's own item: it follows the
            // chunk tree's (the commit writes it).
            if self.st.space.dev_item_of(&self.st.sb, devid).is_some() {
                self.st.space.set_dev_item(&mut self.st.sb, devid, di);
            }
            total = total.saturating_add(want);
        }
        let n = dev_items.len() as u64;
        if self.st.sb.total_bytes.get() != total || self.st.sb.num_devices.get() != n {
            changes.push(format!(
                "superblock: total_bytes {} -> {total}, num_devices {} -> {n}",
                self.st.sb.total_bytes.get(),
                self.st.sb.num_devices.get()
            ));
            self.st.sb.total_bytes.set(total);
            self.st.sb.num_devices.set(n);
        }
        Ok(changes)
    }

    /// Replace the back references of extent `bytenr` (an extent item that
    /// exists) with `refs`, what the trees that use it hold: the item's
    /// inline refs and its keyed ref items go, and the item is written
    /// again with the right count, inline refs in the kernel's order as far
    /// as the inline limit allows and keyed ones after. Generation, flags,
    /// tree block info and a simple-quota owner ref are kept. With no refs
    /// the extent is unused: its item goes and its space (and a data
    /// extent's checksums) is freed at the commit.
    pub fn rewrite_extent_refs(
        &mut self,
        bytenr: u64,
        refs: &[crate::format::extent::InlineRef],
    ) -> Result<String> {
        use crate::format::extent::{parse_extent_item, write_inline_refs, InlineRef};
        const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;
        let items = self.extent_records(bytenr)?;
        let Some((key, data)) = items
            .iter()
            .find(|(k, _)| matches!(k.ty, BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY))
            .cloned()
        else {
            return Err(Error::Invalid(format!(
                "extent {bytenr} has no extent item"
            )));
        };
        let v = parse_extent_item(&key, &data).map_err(|e| e.at(0, key))?;
        let head_len = data.len() - v.refs.iter().map(|r| r.inline_size()).sum::<usize>();
        let mut head = data[..head_len].to_vec();
        let owner: Vec<InlineRef> = v
            .refs
            .iter()
            .filter(|r| matches!(r, InlineRef::Owner { .. }))
            .copied()
            .collect();
        let old_total = v.item.refs.get();
        let data_extent = v.item.flags.get() & BTRFS_EXTENT_FLAG_DATA != 0;
        for (k, _) in &items {
            self.st.delete_item(EXTENT, k)?;
        }
        let len = if key.ty == BTRFS_METADATA_ITEM_KEY {
            self.st.nodesize() as u64
        } else {
            key.offset
        };
        let level = if key.ty == BTRFS_METADATA_ITEM_KEY {
            Some(key.offset.min(255) as u8)
        } else {
            v.tree_block_info.map(|t| t.level)
        };
        self.st.qgroups.note_rewritten(bytenr, len, level);
        if refs.is_empty() {
            if data_extent {
                self.st.csums().csum_delete(bytenr, len)?;
            }
            self.st.space.alloc.release(bytenr, len, true)?;
            return Ok(format!(
                "extent {bytenr}+{len}: no tree uses it, freed ({old_total} refs dropped)"
            ));
        }
        let total: u64 = refs.iter().map(|r| r.count().max(1)).sum();
        head[..8].copy_from_slice(&total.to_le_bytes());
        let mut inline: Vec<InlineRef> = refs.to_vec();
        super::refs::sort_refs(&mut inline);
        let max = self.st.extent_refs().max_inline_extent_item();
        let mut size = head.len() + owner.iter().map(|r| r.inline_size()).sum::<usize>();
        let mut kept = owner;
        let mut keyed = Vec::new();
        for r in inline {
            if size + r.inline_size() <= max {
                size += r.inline_size();
                kept.push(r);
            } else {
                keyed.push(r);
            }
        }
        super::refs::sort_refs(&mut kept);
        write_inline_refs(&mut head, &kept);
        self.st.insert_item(EXTENT, &key, &head)?;
        for r in &keyed {
            let kk = super::refs::keyed_key(bytenr, r);
            self.st
                .extent_refs()
                .keyed_ref_update(kk, r, r.count().max(1) as i64, None)?;
        }
        Ok(format!(
            "extent {bytenr}+{len}: {old_total} refs -> {total} ({} inline, {} keyed)",
            kept.len(),
            keyed.len()
        ))
    }

    /// Insert the extent item of an extent in use whose item is missing
    /// (its range already taken from the allocator): a tree block's
    /// generation and first key from its header, a data extent's
    /// generation the running transaction's; references as
    /// [`Store::rewrite_extent_refs`] writes them.
    pub fn add_extent_item(
        &mut self,
        bytenr: u64,
        len: u64,
        level: Option<u8>,
        refs: &[crate::format::extent::InlineRef],
    ) -> Result<String> {
        use crate::format::extent::{ExtentItem, TreeBlockInfo};
        const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;
        let (key, mut data) = match level {
            Some(l) => {
                let node = self
                    .st
                    .img
                    .read_tree_block(bytenr, &Default::default(), false)?;
                let head = ExtentItem {
                    refs: 0.into(),
                    generation: node.generation().into(),
                    flags: BTRFS_EXTENT_FLAG_TREE_BLOCK.into(),
                };
                let mut d = head.as_bytes().to_vec();
                if self.st.skinny() {
                    (Key::new(bytenr, BTRFS_METADATA_ITEM_KEY, l as u64), d)
                } else {
                    let first = node.key(0).unwrap_or(Key::MIN);
                    d.extend_from_slice(
                        TreeBlockInfo {
                            key: first.to_disk(),
                            level: l,
                        }
                        .as_bytes(),
                    );
                    (Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, len), d)
                }
            }
            None => {
                let head = ExtentItem {
                    refs: 0.into(),
                    generation: self.st.transid.into(),
                    flags: BTRFS_EXTENT_FLAG_DATA.into(),
                };
                (
                    Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, len),
                    head.as_bytes().to_vec(),
                )
            }
        };
        // A placeholder with no refs, then the refs written as for an
        // existing item.
        data[..8].copy_from_slice(&1u64.to_le_bytes());
        self.st.insert_item(EXTENT, &key, &data)?;
        let c = self.rewrite_extent_refs(bytenr, refs)?;
        Ok(format!("extent {bytenr}+{len}: item written; {c}"))
    }

    /// The extent tree's records of extent `bytenr`: its extent item and
    /// keyed back references (not a block group item starting there).
    fn extent_records(&mut self, bytenr: u64) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut items = self.st.items_in(
            BTRFS_EXTENT_TREE_OBJECTID,
            Key::new(bytenr, 0, 0),
            Key::new(bytenr, u8::MAX, u64::MAX),
        )?;
        items.retain(|(k, _)| {
            matches!(
                k.ty,
                BTRFS_EXTENT_ITEM_KEY
                    | BTRFS_METADATA_ITEM_KEY
                    | BTRFS_TREE_BLOCK_REF_KEY
                    | BTRFS_SHARED_BLOCK_REF_KEY
                    | BTRFS_EXTENT_DATA_REF_KEY
                    | BTRFS_SHARED_DATA_REF_KEY
            )
        });
        Ok(items)
    }

    /// Delete every item of extent `bytenr` (its extent item, readable or
    /// not, and its keyed references) and write it again as
    /// [`Store::add_extent_item`] does, keeping what the old item's fixed
    /// head says when it is sane: its generation (not from the future) and
    /// a tree block's FULL_BACKREF flag (its children's references name it
    /// as their parent). The range stays allocated; with no references it
    /// is freed.
    pub fn rebuild_extent_item(
        &mut self,
        bytenr: u64,
        len: u64,
        level: Option<u8>,
        refs: &[crate::format::extent::InlineRef],
    ) -> Result<String> {
        use crate::format::extent::ExtentItem;
        const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;
        let items = self.extent_records(bytenr)?;
        let mut old: Option<ExtentItem> = None;
        for (k, d) in &items {
            if matches!(k.ty, BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY) {
                old = old.or_else(|| ExtentItem::read_from_prefix(d).ok().map(|(h, _)| h));
            }
            self.st.delete_item(EXTENT, k)?;
        }
        let c = self.add_extent_item(bytenr, len, level, refs)?;
        if refs.is_empty() {
            return Ok(c);
        }
        let Some(old) = old else { return Ok(c) };
        let (gen, flags) = (old.generation.get(), old.flags.get());
        let keep_full = level.is_some() && flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0;
        let keep_gen = level.is_none() && gen != 0 && gen <= self.st.transid;
        if !keep_full && !keep_gen {
            return Ok(c);
        }
        let got = self.st.items_in(
            EXTENT,
            Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0),
            Key::new(bytenr, BTRFS_METADATA_ITEM_KEY, u64::MAX),
        )?;
        if let Some((k, mut d)) = got.into_iter().next() {
            if let Ok((mut h, _)) = ExtentItem::read_from_prefix(&d) {
                if keep_full {
                    h.flags.set(h.flags.get() | BTRFS_BLOCK_FLAG_FULL_BACKREF);
                }
                if keep_gen {
                    h.generation.set(gen);
                }
                let n = std::mem::size_of::<ExtentItem>();
                d[..n].copy_from_slice(h.as_bytes());
                self.st.update_item(EXTENT, &k, &d)?;
            }
        }
        Ok(c)
    }

    /// Delete dev extent `devid:physical` (one no chunk stripe owns) and
    /// bring the device items' byte counts in line.
    pub fn delete_dev_extent(&mut self, devid: u64, physical: u64) -> Result<String> {
        let k = Key::new(devid, BTRFS_DEV_EXTENT_KEY, physical);
        if self.st.lookup(BTRFS_DEV_TREE_OBJECTID, &k)?.is_none() {
            return Ok(format!("dev extent {devid}:{physical}: gone already"));
        }
        self.st.delete_item(BTRFS_DEV_TREE_OBJECTID, &k)?;
        let mut c = format!("dev extent {devid}:{physical}: deleted");
        for more in self.fix_device_sizes()? {
            c.push_str("; ");
            c.push_str(&more);
        }
        Ok(c)
    }

    /// Write dev extent `devid:physical` as chunk `chunk`'s stripe of
    /// `length` bytes records it, and bring the device items' counts in
    /// line.
    pub fn dev_extent_from_chunk(
        &mut self,
        devid: u64,
        physical: u64,
        chunk: u64,
        length: u64,
    ) -> Result<String> {
        use crate::format::dev::DevExtent;
        let k = Key::new(devid, BTRFS_DEV_EXTENT_KEY, physical);
        let Some(d) = self.st.lookup(BTRFS_DEV_TREE_OBJECTID, &k)? else {
            return Ok(format!("dev extent {devid}:{physical}: gone"));
        };
        let mut de = DevExtent::read_from_bytes(&d).map_err(|_| {
            Error::corrupt_key_as(crate::CorruptKind::Device, "dev extent size", 0, k)
        })?;
        let (old_chunk, old_len) = (de.chunk_offset.get(), de.length.get());
        de.chunk_tree.set(BTRFS_CHUNK_TREE_OBJECTID);
        de.chunk_objectid.set(BTRFS_FIRST_CHUNK_TREE_OBJECTID);
        de.chunk_offset.set(chunk);
        de.length.set(length);
        de.chunk_tree_uuid = self.st.chunk_tree_uuid;
        self.st
            .update_item(BTRFS_DEV_TREE_OBJECTID, &k, de.as_bytes())?;
        let mut c = format!(
            "dev extent {devid}:{physical}: chunk {old_chunk} length {old_len} -> chunk {chunk} length {length}"
        );
        for more in self.fix_device_sizes()? {
            c.push_str("; ");
            c.push_str(&more);
        }
        Ok(c)
    }

    /// The checksum item keyed at `bytenr` overlaps the item before it:
    /// it is deleted and its checksums are inserted again past the earlier
    /// item's end. Where both items hold a checksum for a sector, the one
    /// the data matches stays (the earlier one when neither or both do).
    pub fn cut_csum_overlap(&mut self, bytenr: u64) -> Result<String> {
        const CSUM: u64 = BTRFS_CSUM_TREE_OBJECTID;
        let cs = self.st.image().csum.size();
        let ss = self.st.sectorsize() as u64;
        let k = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, bytenr);
        let Some(later) = self.st.lookup(CSUM, &k)? else {
            return Ok(format!("checksum item {bytenr}: gone already"));
        };
        let lo = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0);
        let before = Key::new(
            BTRFS_EXTENT_CSUM_OBJECTID,
            BTRFS_EXTENT_CSUM_KEY,
            bytenr.saturating_sub(1),
        );
        let Some((pk, earlier)) = self
            .st
            .prev_item(CSUM, &before, &lo)?
            .filter(|_| bytenr > 0)
        else {
            return Ok(format!("checksum item {bytenr}: no item before it"));
        };
        let sectors = |d: &[u8]| (d.len() / cs.max(1)) as u64;
        let p_end = pk.offset.saturating_add(sectors(&earlier) * ss);
        let l_end = bytenr.saturating_add(sectors(&later) * ss);
        if p_end <= bytenr {
            return Ok(format!("checksum item {bytenr}: no overlap left"));
        }
        self.st.delete_item(CSUM, &k)?;
        let mut replaced = 0u64;
        let overlap_end = p_end.min(l_end);
        let mut buf = vec![0u8; ss as usize];
        let csum_type = self.st.image().csum;
        let mut at = bytenr;
        while at < overlap_end {
            let li = ((at - bytenr) / ss) as usize * cs;
            let pi = ((at - pk.offset) / ss) as usize * cs;
            let (ls, ps) = (&later[li..li + cs], &earlier[pi..pi + cs]);
            if ls != ps && self.st.data().read_data(at, &mut buf).is_ok() {
                let sum = csum_type.compute(&buf);
                if &sum[..cs] == ls && &sum[..cs] != ps {
                    self.st.csums().csum_delete(at, ss)?;
                    self.st.csums().csum_insert(at, ls)?;
                    replaced += 1;
                }
            }
            at += ss;
        }
        if l_end > p_end {
            let skip = ((p_end - bytenr) / ss) as usize * cs;
            self.st.csums().csum_insert(p_end, &later[skip..])?;
        }
        Ok(format!(
            "checksum item {bytenr}: cut at {p_end}, where the item at {} ends ({replaced} sectors took the later checksum, which the data matches)",
            pk.offset
        ))
    }

    /// Point tree `tree`'s root item at block `bytenr` (a subvolume whose
    /// root item was left at a freed tree). Must run before anything reads
    /// the tree in this transaction; the commit writes the item back.
    pub fn point_root_at(
        &mut self,
        tree: u64,
        bytenr: u64,
        level: u8,
        generation: u64,
    ) -> Result<String> {
        let id = TreeId::of(tree);
        let st = self.st.root_state(id)?;
        let (old, old_level) = (st.bytenr, st.level);
        if self.st.cache.contains(old) {
            return Err(Error::Internal(format!(
                "tree {tree} was read before its root item was repaired"
            )));
        }
        let st = self
            .st
            .roots
            .get_mut(&id)
            .ok_or_else(|| Error::Internal("root not loaded".into()))?;
        let Some((_, ri)) = st.item.as_mut() else {
            return Err(Error::Invalid(format!("tree {tree} has no root item")));
        };
        ri.generation.set(generation);
        st.bytenr = bytenr;
        st.level = level;
        st.dirty = true;
        Ok(format!(
            "tree {tree}: root item moved from block {old} (level {old_level}) to {bytenr} (level {level}, generation {generation})"
        ))
    }

    /// Write leaf `bytenr` again, its item offsets mended
    /// ([`crate::tree::mend`]), through copy-on-write in every tree that
    /// holds it: `tree` and, for a subvolume's leaf, every live subvolume
    /// sharing it (a snapshot keeping the damaged block would still hold
    /// it). Returns what changed.
    pub fn rewrite_mended_leaf(&mut self, tree: u64, bytenr: u64) -> Result<String> {
        let (node, _) = self
            .st
            .img
            .read_damaged_tree_block(bytenr, &crate::tree::node::Expect::default())?;
        let m = crate::tree::mend::mend_item_offsets(node.bytes(), self.st.img.csum.size())
            .ok_or_else(|| Error::Invalid(format!("leaf {bytenr} cannot be mended")))?;
        let key = crate::tree::edit::key_at(&m.block, 0);
        let mut trees = vec![tree];
        if is_fstree(tree) {
            trees = vec![BTRFS_FS_TREE_OBJECTID];
            let items = self.st.items_in(
                TreeId::Root,
                Key::new(BTRFS_FIRST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0),
                Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
            )?;
            for (k, d) in items {
                if k.ty == BTRFS_ROOT_ITEM_KEY
                    && crate::format::root::RootItem::parse(&d).is_ok_and(|r| r.refs.get() > 0)
                {
                    trees.push(k.objectid);
                }
            }
        }
        let mut rewritten = 0;
        for t in trees {
            let id = TreeId::of(t);
            if !self.st.tree_exists(id)? {
                continue;
            }
            // A copy in another tree drops the block from the cache while
            // it is still shared: put the mended leaf back each time.
            if !self.st.cache.contains(bytenr) {
                self.st.cache.insert_clean(bytenr, m.block.clone());
            }
            if !self.leaf_on_path(id, &key, bytenr)? {
                continue;
            }
            self.st.search_mut(id, &key, None)?;
            rewritten += 1;
        }
        if rewritten == 0 {
            return Err(Error::Invalid(format!(
                "leaf {bytenr} is not reached from tree {tree}"
            )));
        }
        // Freeing the old block at commit reads its head: the mended one.
        if !self.st.cache.contains(bytenr) {
            self.st.cache.insert_clean(bytenr, m.block);
        }
        Ok(format!(
            "leaf {bytenr} (tree {tree}): {} items placed again, {} dropped, copied in {rewritten} tree(s)",
            m.realigned.len(),
            m.dropped.len()
        ))
    }

    /// Whether the search path of `key` in tree `id` ends at leaf `bytenr`
    /// (read down to its parent only: the leaf itself may be damaged).
    fn leaf_on_path(&mut self, id: TreeId, key: &Key, bytenr: u64) -> Result<bool> {
        let root = self.st.load_root(id)?;
        if root == bytenr {
            return Ok(true);
        }
        let Some((parent, slot)) = self.st.node_on_path(id, root, key, 1)? else {
            return Ok(false);
        };
        Ok(crate::tree::edit::node_ptr(self.st.buf(parent)?, slot).0 == bytenr)
    }

    /// Copy every block on the search path of `key` in tree `tree`: each
    /// gets this transaction's generation, and so do the pointers to it
    /// and, at commit, the tree's root item.
    pub fn recow_path(&mut self, tree: u64, key: &Key) -> Result<String> {
        let (path, _) = self.st.search_mut(TreeId::of(tree), key, None)?;
        Ok(format!(
            "tree {}: {} block(s) on the path to {} copied at generation {}",
            tree as i64,
            path.len(),
            crate::format::names::key_string(key),
            self.st.transid
        ))
    }
}
