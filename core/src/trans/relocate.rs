//! Block group relocation (balance, shrink, device removal): everything a
//! block group holds moves elsewhere, then the group goes. One group at a
//! time, as the kernel's btrfs_relocate_chunk: the group is set read-only
//! (nothing new lands in it), its contents are copied out in one
//! transaction, which commits, and the empty group loses its items
//! everywhere the kernel keeps them: block group item, free space tree,
//! chunk item (and the superblock's system chunk array), dev extents and
//! the device's used bytes. A cut anywhere leaves the old or the new place
//! of every extent; running the command again finishes the job.
//!
//! Subvolume trees share blocks (snapshots) and data (reflinks,
//! snapshots). Every block of them that has to change — one lying in the
//! group, a leaf naming a data extent that moves, and every block above
//! either — is copied exactly once, and every tree that reached the old
//! block reaches the copy: sharing is kept, as the kernel's relocation
//! trees keep it. Each copy takes over the old block's back references
//! (a full back reference names the copied parent); a moved data extent
//! takes over its extent's. The other trees are never shared and are
//! copied the ordinary way (a copy-on-write path to every leaf).

use super::delayed::{BackRef, NewExtent};
use super::{Store, TreeId};
use crate::format::chunk::ChunkItem;
use crate::format::consts::*;
use crate::format::extent::parse_extent_item;
use crate::format::file_extent::{parse_file_extent, FileExtent, FileExtentItem};
use crate::format::key::Key;
use crate::tree::edit;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use zerocopy::FromBytes;

/// Relocation of block groups (balance, shrink, device removal): every
/// extent in a group copied out, the group and its chunk removed.
/// Obtained from [`Store::relocation`].
pub struct Relocation<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Relocation`].
    pub fn relocation(&mut self) -> Relocation<'_> {
        Relocation { st: self }
    }
}

/// Most leaves one tree's rewrite visits (bounds a damaged tree).
const MAX_LEAVES: usize = 1 << 26;

/// Most subvolume tree blocks one walk visits (bounds damaged pointers).
const MAX_WALK: usize = 1 << 27;

/// Largest piece of a data extent copied at once (bounds memory).
const COPY_PIECE: u64 = 4 << 20;

/// Passes over the unshared trees after the copy's commit: the commit
/// itself may have copied blocks of them that still lay in the group.
const SETTLE_PASSES: usize = 4;

/// What relocating one block group moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Data extents copied out, and their bytes on disk.
    pub data_extents: u64,
    /// Bytes of those extents.
    pub data_bytes: u64,
    /// Subvolume tree blocks copied (those in the group and every block
    /// above them or above a leaf naming a moved extent).
    pub tree_blocks: u64,
}

/// A data extent of the group: where it was, where it goes, its length.
#[derive(Clone, Copy, Debug)]
struct DataMove {
    new: u64,
    len: u64,
}

/// The subvolume trees as a graph: which blocks point to which, the
/// tree each block was first reached from, and the tree roots.
#[derive(Default)]
struct Graph {
    parents: HashMap<u64, Vec<u64>>,
    tree_of: HashMap<u64, u64>,
    level_of: HashMap<u64, u8>,
    roots: BTreeMap<u64, u64>,
    /// Blocks that must change themselves (in the group, or a leaf naming
    /// a moved extent).
    changed: BTreeSet<u64>,
}

impl Relocation<'_> {
    /// Relocate every metadata and system block group (balance -m -s).
    pub fn relocate_metadata(&mut self) -> Result<()> {
        let old: Vec<u64> = self
            .st
            .space
            .alloc
            .groups
            .values()
            .filter(|g| !g.is_data() && (g.is_metadata() || g.is_system()))
            .map(|g| g.start)
            .collect();
        for s in old {
            self.relocate_group(s)?;
        }
        Ok(())
    }

    /// Move everything block group `start` holds elsewhere and remove the
    /// group. Commits (the caller's pending changes first). The group must
    /// not be the only place its type can go: new space comes from the
    /// other groups or new chunks of the type's profile.
    pub fn relocate_group(&mut self, start: u64) -> Result<Moved> {
        self.check_relocatable()?;
        self.st.commit()?;
        let (len, flags) = match self.st.space.alloc.groups.get_mut(&start) {
            Some(g) => {
                g.read_only = true;
                (g.length, g.flags)
            }
            None => return Err(Error::Invalid(format!("no block group at {start}"))),
        };
        let r = self.move_out(start, len, flags);
        if r.is_err() {
            // Nothing of a failed attempt is committed; the group takes
            // allocations again.
            if let Some(g) = self.st.space.alloc.groups.get_mut(&start) {
                g.read_only = false;
            }
        }
        let moved = r?;
        let Some(g) = self.st.space.alloc.groups.get(&start) else {
            return Ok(moved);
        };
        if g.used != 0 {
            return Err(Error::NoSpace(format!(
                "block group {start} still holds {} bytes after relocation",
                g.used
            )));
        }
        self.remove_block_group(start)?;
        self.st.commit()?;
        Ok(moved)
    }

    /// States a relocation cannot work from: a subvolume deleted but not
    /// yet dropped, an interrupted balance of the kernel's (its relocation
    /// trees).
    fn check_relocatable(&mut self) -> Result<()> {
        let mut k = Key::new(0, BTRFS_ROOT_ITEM_KEY, 0);
        let mut guard = 0usize;
        while let Some((key, d)) = self.st.next_item(TreeId::Root, &k)? {
            guard += 1;
            if guard > MAX_WALK {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "root tree does not end",
                    key.objectid,
                ));
            }
            if key == Key::MAX {
                break;
            }
            k = super::btree::next_key(&key);
            if key.objectid == BTRFS_TREE_RELOC_OBJECTID {
                return Err(Error::Unsupported(
                    "the filesystem holds an interrupted balance of the kernel's (relocation trees): mount it to let the kernel finish or cancel it".into(),
                ));
            }
            if key.objectid == BTRFS_BALANCE_OBJECTID {
                return Err(Error::Unsupported(
                    "the filesystem holds a paused balance of the kernel's: mount it and run `btrfs balance cancel`".into(),
                ));
            }
            if key.ty == BTRFS_ROOT_ITEM_KEY && is_fstree(key.objectid) {
                let ri = crate::format::root::RootItem::parse(&d).map_err(|e| e.at(0, key))?;
                if ri.refs.get() == 0 {
                    return Err(Error::Unsupported(format!(
                        "subvolume {} is deleted but its tree not yet dropped",
                        key.objectid
                    )));
                }
            }
        }
        Ok(())
    }

    /// The copy of a read-only group's contents, committed.
    fn move_out(&mut self, start: u64, len: u64, flags: u64) -> Result<Moved> {
        let end = start + len;
        let (data, blocks) = self.group_extents(start, end)?;
        let mut moved = Moved::default();
        let fs_blocks = blocks.iter().any(|(_, _, fs)| *fs);
        if !data.is_empty() || fs_blocks {
            moved = self.move_shared(start, end, &data)?;
        }
        // Blocks of the unshared trees: each such tree copied leaf by leaf.
        let mut trees: BTreeSet<u64> = blocks
            .iter()
            .filter(|(_, _, fs)| !fs)
            .map(|(_, owner, _)| *owner)
            .collect();
        if flags & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
            trees.insert(BTRFS_CHUNK_TREE_OBJECTID);
        }
        for t in &trees {
            self.rewrite_tree(tree_id(*t))?;
        }
        self.st.data().flush_data()?;
        self.st.commit()?;
        for _ in 0..SETTLE_PASSES {
            let used = self.st.space.alloc.groups.get(&start).map_or(0, |g| g.used);
            if used == 0 {
                break;
            }
            let (_, blocks) = self.group_extents(start, end)?;
            if blocks.iter().any(|(_, _, fs)| *fs) {
                return Err(Error::Internal(format!(
                    "subvolume tree blocks still in block group {start} after their copy"
                )));
            }
            let trees: BTreeSet<u64> = blocks.iter().map(|(_, o, _)| *o).collect();
            if trees.is_empty() {
                break;
            }
            for t in trees {
                self.rewrite_tree(tree_id(t))?;
            }
            self.st.commit()?;
        }
        Ok(moved)
    }

    /// The extents of `[start, end)`: data extents (bytenr, length), and
    /// tree blocks (bytenr, the tree a plain back reference names, whether
    /// a subvolume tree holds it).
    #[allow(clippy::type_complexity)]
    fn group_extents(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<(Vec<(u64, u64)>, Vec<(u64, u64, bool)>)> {
        let items = self.st.items_in(
            BTRFS_EXTENT_TREE_OBJECTID,
            Key::new(start, 0, 0),
            Key::new(end - 1, u8::MAX, u64::MAX),
        )?;
        let mut data = Vec::new();
        let mut blocks = Vec::new();
        for (k, d) in items {
            if k.objectid < start || k.objectid >= end {
                continue;
            }
            let tree_block = match k.ty {
                BTRFS_METADATA_ITEM_KEY => true,
                BTRFS_EXTENT_ITEM_KEY => {
                    let v = parse_extent_item(&k, &d).map_err(|e| e.at(0, k))?;
                    v.item.flags.get() & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0
                }
                _ => continue,
            };
            if !tree_block {
                data.push((k.objectid, k.offset));
                continue;
            }
            let refs = self.backrefs(k.objectid)?;
            // A block with only full back references belongs to
            // subvolume trees (only they are shared).
            let owner = refs.iter().find_map(|(r, _)| match r {
                BackRef::Tree { root } => Some(*root),
                _ => None,
            });
            let fs = match owner {
                Some(o) => is_fstree(o),
                None => true,
            };
            blocks.push((k.objectid, owner.unwrap_or(0), fs));
        }
        Ok((data, blocks))
    }

    fn backrefs(&mut self, bytenr: u64) -> Result<Vec<(BackRef, u64)>> {
        let mut cache = super::backref::RootCache::new();
        self.st
            .committed()
            .view_backrefs(super::backref::View::Current, bytenr, &mut cache)
    }

    /// The subvolume trees' share of a group: its data extents copied out
    /// and every subvolume block that has to change copied once.
    fn move_shared(&mut self, start: u64, end: u64, data: &[(u64, u64)]) -> Result<Moved> {
        let t = self.st.transid;
        let ns = self.st.nodesize() as u64;
        let ss = self.st.sectorsize() as u64;
        // New places for the data first (the walk needs to know what
        // moves), the bytes and checksums copied.
        if !data.is_empty() && self.st.qgroups.enabled && self.st.qgroups.simple.is_some() {
            // A moved extent would need its owner reference carried over
            // and its charge left where it is.
            return Err(Error::Unsupported(
                "relocating data with simple quotas enabled".into(),
            ));
        }
        // The whole group's data read ahead: the copies below then find
        // it in the page cache instead of waiting on each read in turn.
        self.prefetch_data(data);
        let mut moves: BTreeMap<u64, DataMove> = BTreeMap::new();
        for &(old, len) in data {
            let new = self
                .st
                .chunks()
                .alloc_space(BTRFS_BLOCK_GROUP_DATA, len, ss, true)?;
            if new >= start && new < end {
                return Err(Error::Internal(format!(
                    "data extent {old} moved into its own read-only group"
                )));
            }
            self.copy_data(old, new, len)?;
            moves.insert(old, DataMove { new, len });
        }
        let g = self.walk_subvolumes(start, end, &moves)?;
        // Every block above a changed one changes too.
        let mut dirty: BTreeSet<u64> = BTreeSet::new();
        let mut queue: VecDeque<u64> = g.changed.iter().copied().collect();
        while let Some(b) = queue.pop_front() {
            if !dirty.insert(b) {
                continue;
            }
            if let Some(ps) = g.parents.get(&b) {
                queue.extend(ps.iter().copied());
            }
        }
        let mut map: HashMap<u64, u64> = HashMap::with_capacity(dirty.len());
        for &b in &dirty {
            let nb = self
                .st
                .chunks()
                .alloc_space(BTRFS_BLOCK_GROUP_METADATA, ns, ns, true)?;
            if nb >= start && nb < end {
                return Err(Error::Internal(format!(
                    "tree block {b} copied into its own read-only group"
                )));
            }
            map.insert(b, nb);
        }
        for &b in &dirty {
            self.copy_block(b, &g, &map, &moves)?;
        }
        for (&old, m) in &moves {
            self.move_data_refs(old, m, &map)?;
        }
        for (&rb, &id) in &g.roots {
            let Some(&nb) = map.get(&rb) else { continue };
            self.st.root_state(id)?;
            let st = self
                .st
                .roots
                .get_mut(&TreeId::Tree(id))
                .ok_or_else(|| Error::Internal(format!("tree {id} not loaded")))?;
            st.bytenr = nb;
            st.dirty = true;
            // The copies carry this transaction's generation though other
            // trees may share them: a later copy-on-write must look their
            // references up (btrfs_block_can_be_shared), as after a
            // snapshot.
            self.st.update_root_item(id, |r| r.last_snapshot.set(t))?;
        }
        Ok(Moved {
            data_extents: moves.len() as u64,
            data_bytes: moves.values().map(|m| m.len).sum(),
            tree_blocks: dirty.len() as u64,
        })
    }

    /// Ask the devices to read ahead the first copy of every extent in
    /// `data`.
    fn prefetch_data(&self, data: &[(u64, u64)]) {
        self.st.img.prefetch_data(data);
    }

    /// Copy the bytes of data extent `old` to `new` (every copy of the
    /// new place), and its checksums.
    fn copy_data(&mut self, old: u64, new: u64, len: u64) -> Result<()> {
        let ss = self.st.sectorsize() as u64;
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(COPY_PIECE);
            let mut buf = vec![0u8; n as usize];
            self.st.data().read_data(old + off, &mut buf)?;
            self.st.data().write_new_data(new + off, &buf)?;
            let sums = self.st.csums().csum_lookup(old + off, n)?;
            // Runs of sectors with checksums keep them; a nodatasum or
            // preallocated extent has none.
            let mut run: Option<(u64, Vec<u8>)> = None;
            for (i, s) in sums.iter().enumerate() {
                match (s, &mut run) {
                    (Some(c), Some((_, v))) => v.extend_from_slice(c),
                    (Some(c), None) => run = Some((i as u64, c.to_vec())),
                    (None, Some(_)) => {
                        if let Some((first, v)) = run.take() {
                            self.st.csums().csum_insert(new + off + first * ss, &v)?;
                        }
                    }
                    (None, None) => {}
                }
            }
            if let Some((first, v)) = run.take() {
                self.st.csums().csum_insert(new + off + first * ss, &v)?;
            }
            off += n;
        }
        Ok(())
    }

    /// Every subvolume tree, each block once: who points to whom, and
    /// which blocks must change themselves.
    fn walk_subvolumes(
        &mut self,
        start: u64,
        end: u64,
        moves: &BTreeMap<u64, DataMove>,
    ) -> Result<Graph> {
        let mut g = Graph::default();
        let mut ids = Vec::new();
        let mut k = Key::new(0, BTRFS_ROOT_ITEM_KEY, 0);
        while let Some((key, _)) = self.st.next_item(TreeId::Root, &k)? {
            if key == Key::MAX {
                break;
            }
            k = super::btree::next_key(&key);
            if key.ty == BTRFS_ROOT_ITEM_KEY && is_fstree(key.objectid) {
                ids.push(key.objectid);
            }
        }
        let mut visits = 0usize;
        for id in ids {
            let tree = TreeId::Tree(id);
            let root = self.st.load_root(tree)?;
            g.roots.insert(root, id);
            if g.tree_of.contains_key(&root) {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    format!("tree {id}'s root block is reachable from another tree"),
                    root,
                ));
            }
            g.tree_of.insert(root, id);
            let mut queue = VecDeque::from([root]);
            while let Some(b) = queue.pop_front() {
                visits += 1;
                if visits > MAX_WALK {
                    return Err(Error::corrupt_as(
                        crate::CorruptKind::Structure,
                        "subvolume trees do not end",
                        b,
                    ));
                }
                let (level, n) = {
                    let buf = self.st.buf(b)?;
                    (edit::level(buf), edit::nritems(buf))
                };
                g.level_of.insert(b, level);
                if b >= start && b < end {
                    g.changed.insert(b);
                }
                if level == 0 {
                    if !moves.is_empty() && leaf_names_moved(self.st.buf(b)?, moves) {
                        g.changed.insert(b);
                    }
                    continue;
                }
                for slot in 0..n {
                    let c = self.st.load_child(tree, b, slot)?;
                    g.parents.entry(c).or_default().push(b);
                    if let std::collections::hash_map::Entry::Vacant(e) = g.tree_of.entry(c) {
                        e.insert(id);
                        queue.push_back(c);
                    }
                }
            }
        }
        Ok(g)
    }

    /// Copy block `b` to `map[b]`: pointers to copied children and moved
    /// extents changed, the old block's references taken over.
    fn copy_block(
        &mut self,
        b: u64,
        g: &Graph,
        map: &HashMap<u64, u64>,
        moves: &BTreeMap<u64, DataMove>,
    ) -> Result<()> {
        let t = self.st.transid;
        let ns = self.st.nodesize() as u64;
        let nb = map[&b];
        let tree = TreeId::Tree(g.tree_of.get(&b).copied().unwrap_or(BTRFS_FS_TREE_OBJECTID));
        let level = g.level_of.get(&b).copied().unwrap_or(0);
        self.st.load(
            tree,
            b,
            crate::tree::node::Expect {
                level: Some(level),
                ..Default::default()
            },
        )?;
        let mut buf = self.st.buf(b)?.clone();
        let owner = edit::owner(&buf);
        let (_, flags) = self.st.extent_refs().extent_refs_now(b, Some(level))?;
        let full = flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0;
        let first_key = if edit::nritems(&buf) > 0 {
            edit::key_at(&buf, 0)
        } else {
            Key::MIN
        };
        edit::set_header_location(&mut buf, nb, t, owner);
        let n = edit::nritems(&buf);
        if level > 0 {
            for i in 0..n {
                let (c, _) = edit::node_ptr(&buf, i);
                match map.get(&c) {
                    Some(&nc) => edit::node_set_ptr(&mut buf, i, nc, t),
                    None if full => {
                        // The child's full back reference names this block.
                        let d = &mut self.st.delayed;
                        d.add(
                            c,
                            ns,
                            Some(level - 1),
                            BackRef::SharedTree { parent: b },
                            -1,
                        );
                        d.add(
                            c,
                            ns,
                            Some(level - 1),
                            BackRef::SharedTree { parent: nb },
                            1,
                        );
                    }
                    None => {}
                }
            }
        } else {
            for i in 0..n {
                if edit::leaf_key(&buf, i).ty != BTRFS_EXTENT_DATA_KEY {
                    continue;
                }
                let (disk, disk_len) = match parse_file_extent(edit::item_data(&buf, i)) {
                    Ok(FileExtent::Disk { item, .. }) => {
                        (item.disk_bytenr.get(), item.disk_num_bytes.get())
                    }
                    _ => continue,
                };
                if disk == 0 {
                    continue;
                }
                if let Some(m) = moves.get(&disk) {
                    let (fe, _) = FileExtentItem::mut_from_prefix(edit::item_data_mut(&mut buf, i))
                        .map_err(|_| {
                            Error::corrupt_as(
                                crate::CorruptKind::Item,
                                "file extent item too short",
                                b,
                            )
                        })?;
                    fe.disk_bytenr.set(m.new);
                } else if full {
                    let d = &mut self.st.delayed;
                    d.add(disk, disk_len, None, BackRef::SharedData { parent: b }, -1);
                    d.add(disk, disk_len, None, BackRef::SharedData { parent: nb }, 1);
                }
            }
        }
        // The copy's references are the old block's, a copied parent
        // named by its new address.
        let refs = self.backrefs(b)?;
        if refs.is_empty() {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Reference,
                "tree block without back references",
                b,
            ));
        }
        let mut first = true;
        for (r, count) in refs {
            let nr = match r {
                BackRef::SharedTree { parent } => BackRef::SharedTree {
                    parent: *map.get(&parent).ok_or_else(|| {
                        Error::corrupt_as(
                            crate::CorruptKind::Reference,
                            format!("tree block's back reference names block {parent}, which no subvolume tree reaches it from"),
                            b,
                        )
                    })?,
                },
                r => r,
            };
            let count = count as i64;
            if first {
                self.st.delayed.add_new(
                    nb,
                    ns,
                    Some(level),
                    NewExtent {
                        generation: t,
                        flags: BTRFS_EXTENT_FLAG_TREE_BLOCK
                            | (flags & BTRFS_BLOCK_FLAG_FULL_BACKREF),
                        first_key,
                    },
                    nr,
                );
                if count > 1 {
                    self.st.delayed.add(nb, ns, Some(level), nr, count - 1);
                }
                first = false;
            } else {
                self.st.delayed.add(nb, ns, Some(level), nr, count);
            }
            self.st.delayed.add(b, ns, Some(level), r, -count);
        }
        self.st.cache.remove(b);
        self.st.cache.insert_dirty(nb, TreeId::Tree(owner), buf);
        Ok(())
    }

    /// A moved data extent takes over the old one's references (a full
    /// back reference names the copied leaf); the old one loses them, and
    /// with the last its checksums.
    fn move_data_refs(&mut self, old: u64, m: &DataMove, map: &HashMap<u64, u64>) -> Result<()> {
        let t = self.st.transid;
        let refs = self.backrefs(old)?;
        if refs.is_empty() {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Reference,
                "data extent without back references",
                old,
            ));
        }
        let mut first = true;
        for (r, count) in refs {
            let nr = match r {
                BackRef::SharedData { parent } => BackRef::SharedData {
                    parent: *map.get(&parent).ok_or_else(|| {
                        Error::corrupt_as(
                            crate::CorruptKind::Reference,
                            format!("data extent's back reference names leaf {parent}, which no subvolume tree holds"),
                            old,
                        )
                    })?,
                },
                BackRef::Data { root, .. } if !is_fstree(root) => {
                    return Err(Error::Unsupported(format!(
                        "data extent {old} belongs to tree {root} (a free space cache file): clear the v1 space cache first"
                    )))
                }
                r => r,
            };
            let count = count as i64;
            if first {
                self.st.delayed.add_new(
                    m.new,
                    m.len,
                    None,
                    NewExtent {
                        generation: t,
                        flags: BTRFS_EXTENT_FLAG_DATA,
                        first_key: Key::MIN,
                    },
                    nr,
                );
                if count > 1 {
                    self.st.delayed.add(m.new, m.len, None, nr, count - 1);
                }
                first = false;
            } else {
                self.st.delayed.add(m.new, m.len, None, nr, count);
            }
            self.st.delayed.add(old, m.len, None, r, -count);
        }
        Ok(())
    }

    /// Copy every block of tree `t` (a search path to every leaf, copied
    /// on the way down).
    fn rewrite_tree(&mut self, t: TreeId) -> Result<()> {
        let mut k = Key::MIN;
        for _ in 0..MAX_LEAVES {
            let (path, _) = self.st.search_mut(t, &k, None)?;
            let leaf = path
                .last()
                .map(|s| s.bytenr)
                .ok_or_else(|| Error::Internal("empty path".into()))?;
            let buf = self.st.buf(leaf)?;
            let n = crate::tree::edit::nritems(buf);
            if n == 0 {
                return Ok(());
            }
            let last = crate::tree::edit::leaf_key(buf, n - 1);
            if last == Key::MAX {
                return Ok(());
            }
            let next = super::btree::next_key(&last);
            match self.st.next_item(t, &next)? {
                Some((nk, _)) => k = nk,
                None => return Ok(()),
            }
        }
        Err(Error::Internal("tree rewrite does not end".into()))
    }

    /// Remove an empty block group and its chunk.
    fn remove_block_group(&mut self, start: u64) -> Result<()> {
        let g = self
            .st
            .space
            .alloc
            .groups
            .remove(&start)
            .ok_or_else(|| Error::Invalid(format!("block group {start} not found")))?;
        let bgt = TreeId::Tree(self.st.bg_tree);
        self.st
            .delete_item(bgt, &Key::new(start, BTRFS_BLOCK_GROUP_ITEM_KEY, g.length))?;
        if self.st.has_fst() {
            let items = self.st.items_in(
                BTRFS_FREE_SPACE_TREE_OBJECTID,
                Key::new(start, 0, 0),
                Key::new(start + g.length - 1, u8::MAX, u64::MAX),
            )?;
            for (k, _) in items {
                if k.objectid >= start && k.objectid < start + g.length {
                    self.st.delete_item(BTRFS_FREE_SPACE_TREE_OBJECTID, &k)?;
                }
            }
        }
        let ckey = Key::new(BTRFS_FIRST_CHUNK_TREE_OBJECTID, BTRFS_CHUNK_ITEM_KEY, start);
        let cdata = self.st.lookup(TreeId::Chunk, &ckey)?.ok_or_else(|| {
            Error::corrupt_key_as(
                crate::CorruptKind::Reference,
                "block group without chunk item",
                start,
                ckey,
            )
        })?;
        let (chunk, stripes) =
            crate::format::chunk::parse_chunk(&cdata).map_err(|e| e.at(start, ckey))?;
        let (chunk, stripes): (ChunkItem, Vec<crate::format::chunk::Stripe>) =
            (*chunk, stripes.to_vec());
        self.st.delete_item(TreeId::Chunk, &ckey)?;
        let stripe = crate::chunk::stripe_length(
            chunk.type_.get(),
            chunk.length.get(),
            stripes.len() as u64,
        );
        let mut touched: Vec<u64> = Vec::new();
        for s in &stripes {
            let devid = s.devid.get();
            self.st.delete_item(
                BTRFS_DEV_TREE_OBJECTID,
                &Key::new(devid, BTRFS_DEV_EXTENT_KEY, s.offset.get()),
            )?;
            if let Some(mut di) = self.st.space.dev_item_of(&self.st.sb, devid) {
                di.bytes_used
                    .set(di.bytes_used.get().saturating_sub(stripe));
                self.st.space.set_dev_item(&mut self.st.sb, devid, di);
            }
            if !touched.contains(&devid) {
                touched.push(devid);
            }
        }
        self.st.chunks().write_dev_items_used(&touched)?;
        if g.is_system() {
            self.remove_sys_chunk(start)?;
        }
        self.st.img.chunks.remove(start);
        Ok(())
    }

    /// Drop chunk `logical` from the superblock's system chunk array.
    fn remove_sys_chunk(&mut self, logical: u64) -> Result<()> {
        let n = self.st.sb.sys_chunk_array_size.get() as usize;
        let arr = self.st.sb.sys_chunk_array[..n].to_vec();
        let mut out = Vec::with_capacity(n);
        let mut p = 0usize;
        while p + 17 <= arr.len() {
            let key = Key::from(crate::format::view::<crate::format::key::DiskKey>(
                &arr[p..p + 17],
                "sys chunk key",
            )?);
            let body = &arr[p + 17..];
            let (_, stripes) = crate::format::chunk::parse_chunk(body).map_err(|e| e.at(0, key))?;
            let len = crate::format::chunk::CHUNK_ITEM_SIZE
                + stripes.len() * crate::format::chunk::STRIPE_SIZE;
            if key.offset != logical {
                out.extend_from_slice(&arr[p..p + 17 + len]);
            }
            p += 17 + len;
        }
        self.st.sb.sys_chunk_array[..n].fill(0);
        self.st.sb.sys_chunk_array[..out.len()].copy_from_slice(&out);
        self.st.sb.sys_chunk_array_size.set(out.len() as u32);
        Ok(())
    }
}

impl Store {
    /// The chunk map (every chunk's stripes).
    pub fn chunk_map(&self) -> &crate::chunk::ChunkMap {
        &self.img.chunks
    }

    /// Devices of the filesystem that are present.
    pub fn num_devices_present(&self) -> u64 {
        self.img.devices().count() as u64
    }
}

/// The tree id of a root tree item's objectid.
fn tree_id(id: u64) -> TreeId {
    match id {
        BTRFS_ROOT_TREE_OBJECTID => TreeId::Root,
        BTRFS_CHUNK_TREE_OBJECTID => TreeId::Chunk,
        n => TreeId::Tree(n),
    }
}

/// Whether a leaf has a file extent item naming one of the moved extents.
fn leaf_names_moved(buf: &[u8], moves: &BTreeMap<u64, DataMove>) -> bool {
    (0..edit::nritems(buf)).any(|i| {
        edit::leaf_key(buf, i).ty == BTRFS_EXTENT_DATA_KEY
            && matches!(parse_file_extent(edit::item_data(buf, i)),
                Ok(FileExtent::Disk { item, .. }) if moves.contains_key(&item.disk_bytenr.get()))
    })
}
