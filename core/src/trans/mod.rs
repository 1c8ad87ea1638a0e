//! Transactions: copy-on-write edits of any tree, exact space accounting,
//! and the commit protocol.
//!
//! Invariants kept during a transaction `transid`:
//! - a block is modified only after it was copied (CoW) in this transaction:
//!   its header generation is `transid` and its bytenr is new, so the
//!   committed trees are never overwritten;
//! - a block freed in this transaction that the committed trees still use is
//!   pinned, never reused before the commit is durable;
//! - extent tree changes are queued as delayed refs and applied at commit,
//!   which loops until the extent tree, block group items, free space tree
//!   and root items stop changing.
//!
//! Commit = write every dirty block (each DUP copy), flush, write every
//! superblock copy (generation + 1, backup roots rotated), flush. A crash at
//! any point leaves the previous or the new generation.

mod btree;
mod chunk_alloc;
mod commit;
pub mod delayed;
mod fst;
mod refs;

use crate::alloc::{super_stripes, Allocator, BlockGroup, RangeSet};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::format::superblock::Superblock;
use crate::image::Image;
use crate::io::BlockDevice;
use crate::tree::node::Expect;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Where a tree's root lives and whether it changed.
#[derive(Clone, Debug)]
pub struct RootState {
    pub id: u64,
    pub bytenr: u64,
    pub level: u8,
    /// The tree's ROOT_ITEM and its key in the root tree (None for the root
    /// and chunk trees, which the superblock points to).
    pub item: Option<(Key, RootItem)>,
    pub dirty: bool,
}

pub struct Fs {
    img: Image,
    /// The superblock being built for the next commit.
    pub sb: Superblock,
    pub transid: u64,
    blocks: HashMap<u64, Vec<u8>>,
    dirty: HashSet<u64>,
    roots: BTreeMap<u64, RootState>,
    pub alloc: Allocator,
    /// Back reference changes not yet applied to the extent tree.
    delayed: delayed::DelayedRefs,
    chunk_tree_uuid: [u8; 16],
    /// Tree holding block group items (extent tree, or block group tree).
    bg_tree: u64,
    /// Data written to new extents, combined into large sequential writes:
    /// (physical offset of the first byte, bytes). Flushed before commit.
    data_wbuf: Option<(u64, Vec<u8>)>,
}

impl Fs {
    /// Open a writable filesystem on `dev`.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Fs> {
        let img = Image::open(dev, crate::image::OpenOptions { writable: true, ..Default::default() })?;
        Fs::from_image(img)
    }

    pub fn from_image(img: Image) -> Result<Fs> {
        if img.sb.log_root.get() != 0 {
            return Err(Error::Unsupported("the filesystem has a log tree to replay; replay it before writing".into()));
        }
        Fs::from_image_any(img)
    }

    /// Open a filesystem whose log is about to be replayed: the log's blocks
    /// must be pinned (see `pin_range`) before anything is allocated.
    pub fn open_for_replay(dev: Arc<dyn BlockDevice>) -> Result<Fs> {
        let img = Image::open(dev, crate::image::OpenOptions { writable: true, ..Default::default() })?;
        Fs::from_image_any(img)
    }

    /// Keep `[start, start+len)` out of allocation until the next commit is
    /// durable, without an extent item (log blocks during replay). Fails when
    /// the range is not free space of a block group.
    pub fn pin_range(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.alloc.group_of_mut(start).ok_or_else(|| Error::corrupt(format!("log block {start} outside every block group"), start))?;
        if start + len > g.end() {
            return Err(Error::corrupt(format!("log block {start}+{len} crosses the end of its block group"), start));
        }
        if g.pinned.contains(start, start + len) {
            return Ok(());
        }
        if !g.free.contains(start, start + len) {
            return Err(Error::corrupt(format!("log block {start} overlaps allocated space"), start));
        }
        g.free.remove(start, start + len);
        g.pinned.insert(start, start + len);
        Ok(())
    }

    /// A data extent written in the crashed transaction becomes allocated:
    /// it was pinned while the log was read, or is still free.
    pub fn account_data_extent(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.alloc.group_of_mut(start).ok_or_else(|| Error::corrupt(format!("logged data extent {start}+{len} outside every block group"), start))?;
        if g.pinned.contains(start, start + len) {
            g.pinned.remove(start, start + len);
        } else if g.free.contains(start, start + len) {
            g.free.remove(start, start + len);
        } else {
            return Err(Error::corrupt(format!("logged data extent {start}+{len} overlaps allocated space"), start));
        }
        g.used += len;
        g.dirty = true;
        Ok(())
    }

    /// Clear the superblock's log pointer; the next commit drops the log.
    pub fn clear_log_root(&mut self) {
        self.sb.log_root.set(0);
        self.sb.log_root_level = 0;
        self.sb.log_root_transid.set(0);
    }

    fn from_image_any(img: Image) -> Result<Fs> {
        let sb = *img.sb;
        let chunk_root = img.read_tree_block(sb.chunk_root.get(), &Expect::default(), false)?;
        let chunk_tree_uuid = chunk_root.header().chunk_tree_uuid;
        let bg_tree = if sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
            BTRFS_BLOCK_GROUP_TREE_OBJECTID
        } else {
            BTRFS_EXTENT_TREE_OBJECTID
        };
        let mut fs = Fs {
            transid: sb.generation.get() + 1,
            sb,
            img,
            blocks: HashMap::new(),
            dirty: HashSet::new(),
            roots: BTreeMap::new(),
            alloc: Allocator::default(),
            delayed: delayed::DelayedRefs::default(),
            chunk_tree_uuid,
            bg_tree,
            data_wbuf: None,
        };
        fs.load_block_groups()?;
        Ok(fs)
    }

    pub fn image(&self) -> &Image {
        &self.img
    }
    pub fn nodesize(&self) -> u32 {
        self.img.nodesize
    }
    pub fn sectorsize(&self) -> u32 {
        self.img.sectorsize
    }
    pub fn has_fst(&self) -> bool {
        self.sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0
    }
    pub fn skinny(&self) -> bool {
        self.sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA != 0
    }

    /// Read every block group and derive its free space from the extent tree.
    fn load_block_groups(&mut self) -> Result<()> {
        let dev_size = self.img.device().size();
        // Block group items.
        let mut groups = BTreeMap::new();
        let bgt = self.root_state(self.bg_tree)?.clone();
        let mut k = Key::new(0, BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
        while let Some((key, data)) = self.next_item(bgt.id, &k)? {
            k = Key::new(key.objectid, key.ty, key.offset.wrapping_add(1));
            if key.offset == u64::MAX {
                k = Key::new(key.objectid + 1, 0, 0);
            }
            if key.ty != BTRFS_BLOCK_GROUP_ITEM_KEY {
                if key.ty < BTRFS_BLOCK_GROUP_ITEM_KEY {
                    k = Key::new(key.objectid, BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
                } else {
                    k = Key::new(key.objectid + 1, BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
                }
                continue;
            }
            let bgi: &crate::format::block_group::BlockGroupItem = crate::format::view(&data, "block group item")?;
            let (start, length) = (key.objectid, key.offset);
            let mut g = BlockGroup {
                start,
                length,
                flags: bgi.flags.get(),
                used: 0,
                free: RangeSet::new(),
                pinned: RangeSet::new(),
                excluded: RangeSet::new(),
                dirty: false,
                fst_bitmaps: false,
                on_disk: true,
            };
            g.free.insert(start, start + length);
            for (a, b) in super_stripes(&self.img.chunks, start, length, dev_size) {
                g.excluded.insert(a, b);
                g.free.remove(a, b);
            }
            groups.insert(start, g);
        }
        self.alloc.groups = groups;
        // Allocated extents.
        let ns = self.nodesize() as u64;
        let mut k = Key::MIN;
        while let Some((key, _)) = self.next_item(BTRFS_EXTENT_TREE_OBJECTID, &k)? {
            k = Key::new(key.objectid, key.ty, key.offset.saturating_add(1));
            let len = match key.ty {
                BTRFS_EXTENT_ITEM_KEY => key.offset,
                BTRFS_METADATA_ITEM_KEY => ns,
                _ => continue,
            };
            let g = self
                .alloc
                .group_of_mut(key.objectid)
                .ok_or_else(|| Error::corrupt_key("extent outside every block group", key.objectid, key))?;
            g.free.remove(key.objectid, key.objectid + len);
            g.used += len;
        }
        // Free space tree format per group.
        if self.has_fst() {
            let starts: Vec<(u64, u64)> = self.alloc.groups.values().map(|g| (g.start, g.length)).collect();
            for (s, l) in starts {
                if let Some(d) = self.lookup(BTRFS_FREE_SPACE_TREE_OBJECTID, &Key::new(s, BTRFS_FREE_SPACE_INFO_KEY, l))? {
                    let fi: &crate::format::free_space::FreeSpaceInfo = crate::format::view(&d, "free space info")?;
                    if let Some(g) = self.alloc.groups.get_mut(&s) {
                        g.fst_bitmaps = fi.flags.get() & BTRFS_FREE_SPACE_USING_BITMAPS != 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// The root state of tree `id`, loading it from the superblock or the
    /// root tree the first time.
    pub fn root_state(&mut self, id: u64) -> Result<&RootState> {
        if !self.roots.contains_key(&id) {
            let st = match id {
                BTRFS_ROOT_TREE_OBJECTID => {
                    RootState { id, bytenr: self.sb.root.get(), level: self.sb.root_level, item: None, dirty: false }
                }
                BTRFS_CHUNK_TREE_OBJECTID => RootState {
                    id,
                    bytenr: self.sb.chunk_root.get(),
                    level: self.sb.chunk_root_level,
                    item: None,
                    dirty: false,
                },
                _ => {
                    let start = Key::new(id, BTRFS_ROOT_ITEM_KEY, 0);
                    let (key, data) = match self.next_item(BTRFS_ROOT_TREE_OBJECTID, &start)? {
                        Some((k, d)) if k.objectid == id && k.ty == BTRFS_ROOT_ITEM_KEY => (k, d),
                        _ => return Err(Error::Invalid(format!("tree {} does not exist", id as i64))),
                    };
                    let ri = RootItem::parse(&data).map_err(|e| e.at(0, key))?;
                    RootState { id, bytenr: ri.bytenr.get(), level: ri.level, item: Some((key, ri)), dirty: false }
                }
            };
            self.roots.insert(id, st);
        }
        self.roots.get(&id).ok_or_else(|| Error::Invalid("root state".into()))
    }

    pub fn tree_exists(&mut self, id: u64) -> Result<bool> {
        match self.root_state(id) {
            Ok(_) => Ok(true),
            Err(Error::Invalid(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn owner_of(tree: u64) -> u64 {
        tree
    }

    /// Make sure block `bytenr` is in the cache, reading and validating it.
    fn load(&mut self, tree: u64, bytenr: u64, expect: Expect) -> Result<()> {
        if self.blocks.contains_key(&bytenr) {
            return Ok(());
        }
        let log = tree == BTRFS_TREE_LOG_OBJECTID;
        let node = self.img.read_tree_block(bytenr, &Expect { owner: Some(tree), ..expect }, log)?;
        self.blocks.insert(bytenr, node.into_vec());
        Ok(())
    }

    fn buf(&self, bytenr: u64) -> Result<&Vec<u8>> {
        self.blocks.get(&bytenr).ok_or_else(|| Error::Invalid(format!("block {bytenr} not loaded")))
    }
    fn buf_mut(&mut self, bytenr: u64) -> Result<&mut Vec<u8>> {
        if !self.dirty.contains(&bytenr) {
            return Err(Error::Invalid(format!("block {bytenr} modified without CoW")));
        }
        self.blocks.get_mut(&bytenr).ok_or_else(|| Error::Invalid(format!("block {bytenr} not loaded")))
    }

    /// Allocate a new tree block for `tree` at `level` and queue its ref.
    /// Log tree blocks get no extent item (replay pins them instead).
    fn alloc_tree_block(&mut self, tree: u64, level: u8, first_key: Key) -> Result<u64> {
        let ns = self.nodesize() as u64;
        let ty = if tree == BTRFS_CHUNK_TREE_OBJECTID { BTRFS_BLOCK_GROUP_SYSTEM } else { BTRFS_BLOCK_GROUP_METADATA };
        let bytenr = self.alloc_space(ty, ns, ns)?;
        if tree != BTRFS_TREE_LOG_OBJECTID {
            let new = delayed::NewExtent { generation: self.transid, flags: BTRFS_EXTENT_FLAG_TREE_BLOCK, first_key };
            self.delayed.add_new(bytenr, ns, Some(level), new, delayed::BackRef::Tree { root: tree });
        }
        if let Some(RootState { item: Some((_, ri)), .. }) = self.roots.get_mut(&tree) {
            ri.bytes_used.set(ri.bytes_used.get() + ns);
        }
        Ok(bytenr)
    }

    /// Drop the tree's reference to a block. A block allocated in this
    /// transaction (never written) is free again at once; a committed one
    /// loses its reference when the delayed refs run, and its space stays
    /// pinned until the commit is durable.
    fn free_tree_block(&mut self, tree: u64, bytenr: u64, level: u8) -> Result<()> {
        let ns = self.nodesize() as u64;
        let fresh = self.delayed.get(bytenr).is_some_and(|h| h.new.is_some());
        if fresh {
            self.delayed.remove(bytenr);
            self.alloc.release(bytenr, ns, false)?;
        } else {
            self.delayed.add(bytenr, ns, Some(level), delayed::BackRef::Tree { root: tree }, -1);
        }
        self.blocks.remove(&bytenr);
        self.dirty.remove(&bytenr);
        if let Some(RootState { item: Some((_, ri)), .. }) = self.roots.get_mut(&tree) {
            ri.bytes_used.set(ri.bytes_used.get().saturating_sub(ns));
        }
        Ok(())
    }

    /// Copy-on-write: return the bytenr of a block of `tree` that may be
    /// modified in this transaction, copying it if needed.
    fn cow(&mut self, tree: u64, bytenr: u64) -> Result<u64> {
        if self.dirty.contains(&bytenr) {
            return Ok(bytenr);
        }
        let buf = self.buf(bytenr)?.clone();
        let level = crate::tree::edit::level(&buf);
        let hdr_gen = u64::from_le_bytes(buf[0x50..0x58].try_into().unwrap_or([0; 8]));
        let maybe_shared = match self.roots.get(&tree) {
            Some(RootState { item: Some((_, ri)), .. }) => is_fstree(tree) && hdr_gen <= ri.last_snapshot.get(),
            _ => false,
        };
        let still_used = maybe_shared && self.tree_block_shared(bytenr, level)? && self.cow_shared_refs(tree, bytenr, &buf)?;
        let first_key = if crate::tree::edit::nritems(&buf) > 0 { crate::tree::edit::key_at(&buf, 0) } else { Key::MIN };
        let nb = self.alloc_tree_block(tree, level, first_key)?;
        let mut nbuf = buf;
        crate::tree::edit::set_header_location(&mut nbuf, nb, self.transid, Self::owner_of(tree));
        if still_used {
            // Other trees keep the old block; only this tree's reference
            // went (in cow_shared_refs).
            self.blocks.remove(&bytenr);
            if let Some(RootState { item: Some((_, ri)), .. }) = self.roots.get_mut(&tree) {
                ri.bytes_used.set(ri.bytes_used.get().saturating_sub(self.img.nodesize as u64));
            }
        } else {
            self.free_tree_block(tree, bytenr, level)?;
        }
        self.blocks.insert(nb, nbuf);
        self.dirty.insert(nb);
        Ok(nb)
    }

    /// Whether a committed tree block has more than one reference or full
    /// back references (so other trees use it too), queued changes counted.
    fn tree_block_shared(&mut self, bytenr: u64, level: u8) -> Result<bool> {
        let (refs, flags) = self.extent_refs_now(bytenr, Some(level))?;
        Ok(refs != 1 || flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0)
    }

    /// A new empty block for `tree`.
    fn new_block(&mut self, tree: u64, level: u8, first_key: Key) -> Result<u64> {
        let nb = self.alloc_tree_block(tree, level, first_key)?;
        let mut buf = vec![0u8; self.nodesize() as usize];
        let fsid = self.sb.tree_fsid();
        crate::tree::edit::init_block(&mut buf, nb, level, Self::owner_of(tree), self.transid, &fsid, &self.chunk_tree_uuid);
        self.blocks.insert(nb, buf);
        self.dirty.insert(nb);
        Ok(nb)
    }

    fn set_root(&mut self, tree: u64, bytenr: u64, level: u8) -> Result<()> {
        let st = self.roots.get_mut(&tree).ok_or_else(|| Error::Invalid("root not loaded".into()))?;
        st.bytenr = bytenr;
        st.level = level;
        st.dirty = true;
        Ok(())
    }

    /// Create a new, empty tree `id` with a fresh root item.
    pub fn create_tree(&mut self, id: u64, root_item: RootItem) -> Result<()> {
        if self.tree_exists(id)? {
            return Err(Error::Invalid(format!("tree {id} exists")));
        }
        let key = Key::new(id, BTRFS_ROOT_ITEM_KEY, 0);
        self.roots.insert(id, RootState { id, bytenr: 0, level: 0, item: Some((key, root_item)), dirty: true });
        let b = self.new_block(id, 0, Key::MIN)?;
        self.set_root(id, b, 0)?;
        // The root item is inserted at commit with the final location.
        let mut data = vec![0u8; crate::format::root::ROOT_ITEM_SIZE];
        data.copy_from_slice(zerocopy::IntoBytes::as_bytes(&root_item));
        self.insert_item(BTRFS_ROOT_TREE_OBJECTID, &key, &data)
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        self.img.device()
    }

    /// Write `data` to physical offset `phys` of space allocated in this
    /// transaction, combining consecutive writes.
    pub fn write_new_data(&mut self, phys: u64, data: &[u8]) -> Result<()> {
        const LIMIT: usize = 16 << 20;
        if let Some((start, buf)) = &mut self.data_wbuf {
            if *start + buf.len() as u64 == phys && buf.len() + data.len() <= LIMIT {
                buf.extend_from_slice(data);
                return Ok(());
            }
        }
        self.flush_data()?;
        if data.len() >= LIMIT {
            return self.img.device().write_at(phys, data);
        }
        let mut v = Vec::with_capacity(LIMIT);
        v.extend_from_slice(data);
        self.data_wbuf = Some((phys, v));
        Ok(())
    }

    pub fn flush_data(&mut self) -> Result<()> {
        if let Some((start, buf)) = self.data_wbuf.take() {
            self.img.device().write_at(start, &buf)?;
        }
        Ok(())
    }
}
