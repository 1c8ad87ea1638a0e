//! The tree store: every tree of the filesystem (the log trees and the log
//! root tree included), copy-on-write edits of them, exact space
//! accounting, delayed back references, qgroup accounting, and the commit
//! protocol. Files and directories live a layer up, in `fs`.
//!
//! Invariants kept during a transaction `transid`:
//! - a block is modified only after it was copied (CoW) in this transaction
//!   or log: it is dirty in the cache, its header generation is `transid`
//!   and its bytenr is new, so the committed trees (and a log already
//!   synced) are never overwritten;
//! - a block freed in this transaction that the committed trees still use
//!   is pinned, never reused before the commit is durable;
//! - extent tree changes are queued as delayed refs and applied at commit,
//!   which loops until the extent tree, block group items, free space tree,
//!   quota tree and root items stop changing.
//!
//! Commit = write every dirty block (each DUP copy), flush, write every
//! superblock copy (generation + 1, backup roots rotated), flush. A crash at
//! any point leaves the previous or the new generation. The log trees of
//! the transaction are dropped by the commit: their blocks never had extent
//! items and become free once the commit is durable.
//!
//! Which type owns what (one job each; [`Store`] is the tree editor and
//! composes the rest):
//! - [`Store`]: tree blocks (copy-on-write, search, insert, delete), root
//!   items and root states, the superblock being built, the block cache
//!   ([`CacheControl`] for its clean part);
//! - [`Space`] (state) and [`Chunks`] (its edits): block groups and free
//!   space, chunk items, dev extents, device items, new chunks;
//! - [`ExtentRefs`]: extent items and back references (delayed refs run at
//!   commit); [`Committed`]: reads of the trees as last committed;
//! - [`Quotas`] over `qgroup::Qgroups`: the quota tree's status, info and
//!   limit items; [`Csums`]: the checksum tree; [`Subtrees`]: snapshots
//!   and dropped trees; [`Relocation`]: moving a block group's tree blocks;
//! - `Commit` (behind [`Store::commit`]): block group, free space tree and
//!   root items at commit, the dirty blocks, every superblock copy;
//!   [`LogTrees`]: log trees, the log root tree and the superblock's
//!   log_root;
//! - [`DataPath`] over `dataio::DataIo`: file data on the devices;
//! - [`RepairEdits`]: the edits only repair makes.

mod backref;
mod btree;
mod cache;
pub(crate) mod chunk_alloc;
mod chunk_tree;
mod commit;
mod csum;
pub mod dataio;
pub mod dataq;
pub mod datawrite;
pub mod delayed;
mod fst;
pub mod items;
pub mod loggate;
mod logsync;
pub mod membership;
pub mod qgroup;
mod refs;
pub mod relocate;
mod repair;
mod subtree;

pub use backref::Committed;
pub use btree::next_key;
pub use cache::BlockCache;
pub use chunk_alloc::{Chunks, Space};
pub use chunk_tree::ChunkTreeReplaced;
pub(crate) use commit::super_bytes;
pub use csum::{Csums, SectorSums};
pub use dataio::DataPath;
pub use logsync::LogSyncIo;
pub use logsync::LogTrees;
pub use qgroup::Quotas;
pub use refs::ExtentRefs;
pub use relocate::Relocation;
pub use repair::RepairEdits;
pub use subtree::Subtrees;

use crate::alloc::{super_stripes, Allocator, BlockGroup, RangeSet};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::format::superblock::Superblock;
use crate::image::Image;
use crate::io::BlockDevice;
use crate::tree::node::Expect;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Which tree. Trees with a ROOT_ITEM in the root tree are named by their
/// id; the log root tree and each subvolume's log tree have names of their
/// own, since all their blocks carry the same owner (TREE_LOG).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TreeId {
    /// The root tree (1): the superblock points to it.
    Root,
    /// The chunk tree (3): the superblock points to it.
    Chunk,
    /// A tree with a ROOT_ITEM in the root tree (extent, dev, fs, csum,
    /// quota, uuid, free space, block group, subvolumes).
    Tree(u64),
    /// The log root tree: the superblock's `log_root` points to it.
    LogRoot,
    /// The log tree of a subvolume.
    Log(u64),
}

impl TreeId {
    /// The tree a root id names (1: root tree, 3: chunk tree).
    pub fn of(id: u64) -> TreeId {
        match id {
            BTRFS_ROOT_TREE_OBJECTID => TreeId::Root,
            BTRFS_CHUNK_TREE_OBJECTID => TreeId::Chunk,
            id => TreeId::Tree(id),
        }
    }
    /// The owner field of this tree's block headers.
    pub fn owner(self) -> u64 {
        match self {
            TreeId::Root => BTRFS_ROOT_TREE_OBJECTID,
            TreeId::Chunk => BTRFS_CHUNK_TREE_OBJECTID,
            TreeId::Tree(id) => id,
            TreeId::LogRoot | TreeId::Log(_) => BTRFS_TREE_LOG_OBJECTID,
        }
    }
    /// Whether this is a log tree or the log root tree (blocks owned by TREE_LOG,
    /// allocated without extent items, dropped by the next commit).
    pub fn is_log(self) -> bool {
        matches!(self, TreeId::LogRoot | TreeId::Log(_))
    }
    /// The id back references and qgroups name (the owner for log trees).
    pub fn id(self) -> u64 {
        self.owner()
    }
}

impl From<u64> for TreeId {
    fn from(id: u64) -> TreeId {
        TreeId::of(id)
    }
}

/// Where a tree's root lives and whether it changed.
#[derive(Clone, Debug)]
pub struct RootState {
    /// Which tree this is the root of.
    pub id: TreeId,
    /// Logical address (bytes) of the tree's current root block; changes when the
    /// root is copied, split or collapsed in this transaction.
    pub bytenr: u64,
    /// Level of the current root block.
    pub level: u8,
    /// The tree's ROOT_ITEM and its key (in the root tree, or for a log tree
    /// in the log root tree); None for the root, chunk and log root trees,
    /// which the superblock points to.
    pub item: Option<(Key, RootItem)>,
    /// The root moved or the root item changed since the last commit: the commit
    /// writes the root item back (`btrfs_update_root`).
    pub dirty: bool,
}

/// Bytes written and flushes issued, by kind (the engine's counters).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct IoStats {
    /// File data written to the device, in bytes.
    pub data_bytes: u64,
    /// Log tree and log root tree blocks written by log syncs, in bytes (every
    /// DUP copy counted).
    pub log_bytes: u64,
    /// Other tree blocks written by commits, in bytes (every DUP copy counted).
    pub metadata_bytes: u64,
    /// Superblock copies written by commits and log syncs, in bytes.
    pub super_bytes: u64,
    /// Device write-cache flushes issued: by [`Store::flush_device`] (twice per
    /// commit) and two per log sync.
    pub flushes: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Log syncs prepared (superblocks naming a log root written).
    pub log_syncs: u64,
}

/// The clean part of the tree block cache, as callers outside the store
/// may change it: evicted past its limit, dropped, its limit set. Dirty
/// blocks are the transaction's and only the store touches them.
pub struct CacheControl<'a>(&'a mut BlockCache);

impl CacheControl<'_> {
    /// Evict clean blocks past the cache limit (between operations only).
    pub fn trim(&mut self) {
        self.0.trim();
    }
    /// Drop every clean block (caches dropped).
    pub fn drop_clean(&mut self) {
        self.0.drop_clean();
    }
    /// Bytes of clean tree blocks the cache may keep (default
    /// [`DEFAULT_CLEAN_CACHE`]); applied at the next trim.
    pub fn set_limit(&mut self, bytes: usize) {
        self.0.set_clean_limit(bytes);
    }
}

/// Clean tree blocks kept in memory before the least recently used go.
pub const DEFAULT_CLEAN_CACHE: usize = 64 << 20;

/// A filesystem open for writing with one running transaction, `transid`:
/// the counterpart of the kernel's `btrfs_fs_info` together with its running
/// `btrfs_transaction`. Tree blocks are read into a [`BlockCache`], copied on
/// write, and stay in memory until [`Store::commit`] (or a log sync) writes
/// them; see the module docs for the invariants kept.
pub struct Store {
    img: Image,
    /// The superblock being built for the next commit.
    sb: Superblock,
    /// Id of the running transaction (the last committed generation + 1): the
    /// header generation of every block copied in it.
    transid: u64,
    cache: BlockCache,
    /// Inode and dir items by key (see [`items`]).
    items: items::ItemCache,
    roots: BTreeMap<TreeId, RootState>,
    /// Block groups, free space, chunks and device items (see [`Space`]).
    space: chunk_alloc::Space,
    /// Back reference changes not yet applied to the extent tree.
    delayed: delayed::DelayedRefs,
    chunk_tree_uuid: [u8; 16],
    /// Tree holding block group items (extent tree, or block group tree).
    bg_tree: u64,
    /// File data on its way to the device (see [`dataio`]).
    data: dataio::DataIo,
    /// Blocks of log trees (allocated without extent items): bytenr ->
    /// written to disk by a log sync.
    log_blocks: HashMap<u64, bool>,
    /// Qgroup counters, when quotas are on.
    qgroups: qgroup::Qgroups,
    /// I/O counters since the store was opened.
    stats: IoStats,
}

impl Store {
    /// Open a writable filesystem on `dev`.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Store> {
        let img = Image::open(
            dev,
            crate::image::OpenOptions {
                writable: true,
                ..Default::default()
            },
        )?;
        Store::from_image(img)
    }

    /// Open a writable store on an image already opened writable. Refuses a
    /// filesystem whose superblock names a log to replay (see
    /// [`Store::open_for_replay`]).
    pub fn from_image(img: Image) -> Result<Store> {
        if img.sb.log_root.get() != 0 {
            return Err(Error::Unsupported(
                "the filesystem has a log tree to replay; replay it before writing".into(),
            ));
        }
        Store::from_image_any(img)
    }

    /// Open a filesystem whose log is about to be replayed: the log's blocks
    /// must be pinned (see `pin_range`) before anything is allocated.
    pub fn open_for_replay(dev: Arc<dyn BlockDevice>) -> Result<Store> {
        let img = Image::open(
            dev,
            crate::image::OpenOptions {
                writable: true,
                ..Default::default()
            },
        )?;
        Store::from_image_any(img)
    }

    /// [`Store::open_for_replay`] on an image already opened writable, on
    /// one device or several (a replay writes tree blocks to every copy on
    /// every device, and every device's superblocks).
    pub fn from_image_for_replay(img: Image) -> Result<Store> {
        Store::from_image_any(img)
    }

    /// Open the same devices again for replay, from what is on disk (a
    /// salvage retry after a replay that failed before its commit).
    pub fn reopen_for_replay(&self) -> Result<Store> {
        let img = self.img.reopen(crate::image::OpenOptions {
            writable: true,
            ..Default::default()
        })?;
        Store::from_image_any(img)
    }

    fn from_image_any(img: Image) -> Result<Store> {
        let chunk_root = img.read_tree_block(img.sb.chunk_root.get(), &Expect::default(), false)?;
        let chunk_tree_uuid = chunk_root.header().chunk_tree_uuid;
        Store::from_parts(img, chunk_tree_uuid)
    }

    /// Open a writable store on an image whose chunk tree is to be
    /// replaced ([`Store::replace_chunk_tree`]): its chunk map was
    /// recovered some other way ([`Image::open_with_chunk_map`]) and its
    /// chunk tree is never read; `chunk_tree_uuid` is what the new tree's
    /// blocks carry. Refuses a filesystem with a log to replay, as
    /// [`Store::from_image`] does.
    pub fn from_image_without_chunk_tree(img: Image, chunk_tree_uuid: [u8; 16]) -> Result<Store> {
        if img.sb.log_root.get() != 0 {
            return Err(Error::Unsupported(
                "the filesystem has a log tree to replay; replay it before writing".into(),
            ));
        }
        Store::from_parts(img, chunk_tree_uuid)
    }

    fn from_parts(img: Image, chunk_tree_uuid: [u8; 16]) -> Result<Store> {
        let sb = *img.sb;
        let bg_tree = if sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
            BTRFS_BLOCK_GROUP_TREE_OBJECTID
        } else {
            BTRFS_EXTENT_TREE_OBJECTID
        };
        let nodesize = img.nodesize as usize;
        let data = dataio::DataIo::new(
            img.devices()
                .map(|(id, d)| (id, d.clone(), img.device_name(id)))
                .collect(),
            img.degraded,
            img.parity.clone(),
        );
        let other_dev_items = img
            .devices()
            .filter(|&(id, _)| id != sb.dev_item.devid.get())
            .filter_map(|(id, _)| Some((id, *img.own_dev_item(id)?)))
            .collect();
        let mut fs = Store {
            transid: sb.generation.get() + 1,
            sb,
            img,
            cache: BlockCache::new(nodesize, DEFAULT_CLEAN_CACHE),
            items: Default::default(),
            roots: BTreeMap::new(),
            space: chunk_alloc::Space {
                alloc: Allocator::default(),
                pending_chunks: Vec::new(),
                other_dev_items,
                chunk_allocated: false,
                chunk_cap: None,
                restripe_target: Default::default(),
                alloc_limit: Default::default(),
                pending_stripes: Vec::new(),
            },
            delayed: delayed::DelayedRefs::default(),
            chunk_tree_uuid,
            bg_tree,
            data,
            log_blocks: HashMap::new(),
            qgroups: qgroup::Qgroups::default(),
            stats: IoStats::default(),
        };
        fs.load_block_groups()?;
        fs.quotas().load_qgroups()?;
        Ok(fs)
    }

    /// The image the store was opened on. Its superblock is the last committed
    /// one, not [`Store::sb`].
    pub fn image(&self) -> &Image {
        &self.img
    }
    /// Tree block size in bytes.
    pub fn nodesize(&self) -> u32 {
        self.img.nodesize
    }
    /// Sector size in bytes: the unit of data extents and checksums.
    pub fn sectorsize(&self) -> u32 {
        self.img.sectorsize
    }
    /// Whether the free space tree is on (compat_ro FREE_SPACE_TREE), so commits
    /// keep it in step with the block groups.
    pub fn has_fst(&self) -> bool {
        self.sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0
    }
    /// Whether tree block extents are METADATA_ITEMs keyed by level (incompat
    /// SKINNY_METADATA) rather than EXTENT_ITEMs with a `btrfs_tree_block_info`.
    pub fn skinny(&self) -> bool {
        self.sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA != 0
    }

    /// The tree holding the block group items (extent tree, or block group
    /// tree with compat_ro BLOCK_GROUP_TREE).
    pub fn block_group_tree(&self) -> u64 {
        self.bg_tree
    }

    /// Keep the block group items in tree `id` from now on: the next commit
    /// writes every dirty group's item there. The caller moves the items
    /// (deletes them from the old tree, marks every group dirty) and sets
    /// the compat_ro flag to match, in the same transaction.
    pub fn set_block_group_tree(&mut self, id: u64) {
        self.bg_tree = id;
    }

    /// Whether the filesystem has the NO_HOLES incompat feature (no explicit
    /// hole extent items).
    pub fn no_holes(&self) -> bool {
        self.sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_NO_HOLES != 0
    }

    /// Read every block group and derive its free space from the extent tree.
    fn load_block_groups(&mut self) -> Result<()> {
        let sizes: BTreeMap<u64, u64> = self.img.devices().map(|(id, d)| (id, d.size())).collect();
        let dev_size = |devid: u64| sizes.get(&devid).copied();
        // Block group items.
        let mut groups = BTreeMap::new();
        // An interrupted btrfstune conversion (CHANGING_BG_TREE) leaves
        // block group items in both trees: every one of them counts.
        let mut trees = vec![self.bg_tree];
        if self.sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_BG_TREE != 0 {
            for t in [BTRFS_EXTENT_TREE_OBJECTID, BTRFS_BLOCK_GROUP_TREE_OBJECTID] {
                if t != self.bg_tree && self.tree_exists(t)? {
                    trees.push(t);
                }
            }
        }
        for tree in trees {
            let bgt = self.root_state(tree)?.clone();
            let mut k = Key::new(0, BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
            // Keys only grow: the walk ends at the largest key whatever a
            // hostile tree holds.
            let mut last_seen: Option<Key> = None;
            while let Some((key, data)) = self.next_item(bgt.id, &k)? {
                if last_seen.is_some_and(|l| key <= l) || key == Key::MAX {
                    break;
                }
                last_seen = Some(key);
                k = crate::trans::next_key(&key);
                if key.ty != BTRFS_BLOCK_GROUP_ITEM_KEY {
                    if key.ty < BTRFS_BLOCK_GROUP_ITEM_KEY {
                        k = Key::new(key.objectid, BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
                    } else {
                        let Some(o) = key.objectid.checked_add(1) else {
                            break;
                        };
                        k = Key::new(o, BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
                    }
                    continue;
                }
                // An empty or overflowing range is no group (the checker
                // reports it; what lies there then belongs to none).
                if key.offset == 0 || key.objectid.checked_add(key.offset).is_none() {
                    continue;
                }
                let bgi: &crate::format::block_group::BlockGroupItem =
                    crate::format::view(&data, "block group item")?;
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
                    read_only: false,
                    size_class: crate::alloc::SizeClass::None,
                };
                g.free.insert(start, start + length);
                for (a, b) in super_stripes(&self.img.chunks, start, length, &dev_size) {
                    g.excluded.insert(a, b);
                    g.free.remove(a, b);
                }
                groups.insert(start, g);
            }
        }
        self.space.alloc.groups = groups;
        // Allocated extents, and for each data-only group the first extent
        // at or after each fifth of it (load_block_group_size_class samples
        // five): the smallest of them gives the group its size class.
        let ns = self.nodesize() as u64;
        let mut samples: BTreeMap<u64, [Option<u64>; 5]> = BTreeMap::new();
        let mut k = Key::MIN;
        let mut last_seen: Option<Key> = None;
        while let Some((key, _)) = self.next_item(BTRFS_EXTENT_TREE_OBJECTID, &k)? {
            if last_seen.is_some_and(|l| key <= l) || key == Key::MAX {
                break;
            }
            last_seen = Some(key);
            k = crate::trans::next_key(&key);
            let len = match key.ty {
                BTRFS_EXTENT_ITEM_KEY => key.offset,
                BTRFS_METADATA_ITEM_KEY => ns,
                _ => continue,
            };
            let g = self.space.alloc.group_of_mut(key.objectid).ok_or_else(|| {
                Error::corrupt_key_as(
                    crate::CorruptKind::Allocation,
                    "extent outside every block group",
                    key.objectid,
                    key,
                )
            })?;
            // Clipped to its group: a hostile length frees nothing past it.
            let end = key.objectid.saturating_add(len).min(g.end());
            g.free.remove(key.objectid, end);
            g.used = g.used.saturating_add(end - key.objectid);
            if key.ty == BTRFS_EXTENT_ITEM_KEY
                && g.uses_size_class()
                && key.objectid.saturating_add(len) <= g.end()
            {
                let (start, fifth) = (g.start, g.length / 5);
                let slots = samples.entry(start).or_default();
                for (i, slot) in slots.iter_mut().enumerate() {
                    if slot.is_none() && key.objectid >= start + i as u64 * fifth {
                        *slot = Some(len);
                    }
                }
            }
        }
        for (start, slots) in samples {
            if let (Some(g), Some(min)) = (
                self.space.alloc.groups.get_mut(&start),
                slots.iter().flatten().min(),
            ) {
                g.size_class = crate::alloc::SizeClass::of(*min);
            }
        }
        // Free space tree format per group.
        if self.has_fst() {
            let starts: Vec<(u64, u64)> = self
                .space
                .alloc
                .groups
                .values()
                .map(|g| (g.start, g.length))
                .collect();
            for (s, l) in starts {
                if let Some(d) = self.lookup(
                    BTRFS_FREE_SPACE_TREE_OBJECTID,
                    &Key::new(s, BTRFS_FREE_SPACE_INFO_KEY, l),
                )? {
                    let fi: &crate::format::free_space::FreeSpaceInfo =
                        crate::format::view(&d, "free space info")?;
                    if let Some(g) = self.space.alloc.groups.get_mut(&s) {
                        g.fst_bitmaps = fi.flags.get() & BTRFS_FREE_SPACE_USING_BITMAPS != 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// The root state of tree `id`, loading it from the superblock or the
    /// root tree the first time. Log trees exist only once created.
    pub fn root_state(&mut self, id: impl Into<TreeId>) -> Result<&RootState> {
        let id = id.into();
        match self.find_root(id)? {
            Some(st) => Ok(st),
            None => Err(Error::Invalid(match id {
                TreeId::Tree(n) => format!("tree {} does not exist", n as i64),
                _ => format!("{id:?} does not exist"),
            })),
        }
    }

    /// The root state of tree `id` (see [`Store::root_state`]), None when
    /// no such tree exists. Errors are only those of reading the root tree.
    fn find_root(&mut self, id: TreeId) -> Result<Option<&RootState>> {
        if !self.roots.contains_key(&id) {
            let st = match id {
                TreeId::Root => RootState {
                    id,
                    bytenr: self.sb.root.get(),
                    level: self.sb.root_level,
                    item: None,
                    dirty: false,
                },
                TreeId::Chunk => RootState {
                    id,
                    bytenr: self.sb.chunk_root.get(),
                    level: self.sb.chunk_root_level,
                    item: None,
                    dirty: false,
                },
                TreeId::Tree(n) => {
                    let start = Key::new(n, BTRFS_ROOT_ITEM_KEY, 0);
                    let (key, data) = match self.next_item(TreeId::Root, &start)? {
                        Some((k, d)) if k.objectid == n && k.ty == BTRFS_ROOT_ITEM_KEY => (k, d),
                        _ => return Ok(None),
                    };
                    let ri = RootItem::parse(&data).map_err(|e| e.at(0, key))?;
                    RootState {
                        id,
                        bytenr: ri.bytenr.get(),
                        level: ri.level,
                        item: Some((key, ri)),
                        dirty: false,
                    }
                }
                TreeId::LogRoot | TreeId::Log(_) => return Ok(None),
            };
            self.roots.insert(id, st);
        }
        Ok(self.roots.get(&id))
    }

    /// The block groups, by start address, as the next commit writes them.
    pub fn block_groups(&self) -> impl Iterator<Item = &BlockGroup> {
        self.space.alloc.groups.values()
    }

    /// The superblock the next commit writes (feature flags, sizes, the
    /// roots as of the last commit).
    pub fn sb(&self) -> &Superblock {
        &self.sb
    }

    /// Id of the running transaction (the last committed generation + 1):
    /// the header generation of every block copied in it.
    pub fn transid(&self) -> u64 {
        self.transid
    }

    /// Qgroup counters, when quotas are on.
    pub fn qgroups(&self) -> &qgroup::Qgroups {
        &self.qgroups
    }

    /// I/O counters since the store was opened.
    pub fn stats(&self) -> IoStats {
        self.stats
    }

    /// Change fields of the superblock the next commit writes (sizes,
    /// generations of caches and trees kept outside the root tree); the
    /// roots, the generation and the backups are the commit's own.
    pub fn update_superblock(&mut self, f: impl FnOnce(&mut Superblock)) {
        f(&mut self.sb)
    }

    /// Set an incompat feature bit; the superblock carries it from the next
    /// commit on.
    pub fn set_incompat(&mut self, bit: u64) {
        let f = self.sb.incompat_flags.get();
        self.sb.incompat_flags.set(f | bit);
    }

    /// Whether a chunk was allocated in this transaction: a log must not
    /// depend on it (btrfs_make_block_group forces a full commit).
    pub fn chunk_allocated(&self) -> bool {
        self.space.chunk_allocated
    }

    /// Whether tree `id` exists: the root and chunk trees always, a tree with a
    /// ROOT_ITEM in the root tree, and a log tree only once started in this
    /// transaction. Loads its root state as a side effect.
    pub fn tree_exists(&mut self, id: impl Into<TreeId>) -> Result<bool> {
        Ok(self.find_root(id.into())?.is_some())
    }

    /// Make sure block `bytenr` is in the cache, reading and validating it.
    fn load(&mut self, tree: TreeId, bytenr: u64, expect: Expect) -> Result<()> {
        if self.cache.contains(bytenr) {
            return Ok(());
        }
        let node = self.img.read_tree_block(
            bytenr,
            &Expect {
                owner: Some(tree.owner()),
                ..expect
            },
            tree.is_log(),
        )?;
        self.cache.insert_clean(bytenr, node.into_vec());
        Ok(())
    }

    fn buf(&self, bytenr: u64) -> Result<&Vec<u8>> {
        self.cache
            .get(bytenr)
            .ok_or_else(|| Error::Internal(format!("block {bytenr} not loaded")))
    }
    fn buf_mut(&mut self, bytenr: u64) -> Result<&mut Vec<u8>> {
        if !self.cache.is_dirty(bytenr) {
            return Err(Error::Internal(format!(
                "block {bytenr} modified without CoW"
            )));
        }
        self.cache
            .get_dirty_mut(bytenr)
            .ok_or_else(|| Error::Internal(format!("block {bytenr} not loaded")))
    }

    /// Allocate a new tree block for `tree` at `level` and queue its ref.
    /// Log tree blocks get no extent item and do not count as used space
    /// (replay pins them instead).
    fn alloc_tree_block(&mut self, tree: TreeId, level: u8, first_key: Key) -> Result<u64> {
        let ns = self.nodesize() as u64;
        let ty = if tree == TreeId::Chunk {
            BTRFS_BLOCK_GROUP_SYSTEM
        } else {
            BTRFS_BLOCK_GROUP_METADATA
        };
        let bytenr = self.chunks().alloc_space(ty, ns, ns, !tree.is_log())?;
        if tree.is_log() {
            self.log_blocks.insert(bytenr, false);
        } else {
            let new = delayed::NewExtent {
                generation: self.transid,
                flags: BTRFS_EXTENT_FLAG_TREE_BLOCK,
                first_key,
            };
            self.delayed.add_new(
                bytenr,
                ns,
                Some(level),
                new,
                delayed::BackRef::Tree { root: tree.id() },
            );
        }
        if let Some(RootState {
            item: Some((_, ri)),
            ..
        }) = self.roots.get_mut(&tree)
        {
            ri.bytes_used.set(ri.bytes_used.get().saturating_add(ns));
        }
        Ok(bytenr)
    }

    /// Drop the tree's reference to a block. A block allocated in this
    /// transaction (never written) is free again at once; a committed one
    /// loses its reference when the delayed refs run, and its space stays
    /// pinned until the commit is durable. A log block a log sync wrote
    /// stays pinned until the commit: the superblock may still point to it.
    fn free_tree_block(&mut self, tree: TreeId, bytenr: u64, level: u8) -> Result<()> {
        let ns = self.nodesize() as u64;
        if tree.is_log() {
            let written = self.log_blocks.remove(&bytenr).unwrap_or(true);
            self.space.alloc.release_unaccounted(bytenr, ns, written)?;
        } else if self.delayed.get(bytenr).is_some_and(|h| h.new.is_some()) {
            self.delayed.remove(bytenr);
            self.space.alloc.release(bytenr, ns, false)?;
        } else {
            self.delayed.add(
                bytenr,
                ns,
                Some(level),
                delayed::BackRef::Tree { root: tree.id() },
                -1,
            );
        }
        self.cache.remove(bytenr);
        if let Some(RootState {
            item: Some((_, ri)),
            ..
        }) = self.roots.get_mut(&tree)
        {
            ri.bytes_used.set(ri.bytes_used.get().saturating_sub(ns));
        }
        Ok(())
    }

    /// Copy-on-write: return the bytenr of a block of `tree` that may be
    /// modified in this transaction, copying it if needed.
    fn cow(&mut self, tree: TreeId, bytenr: u64) -> Result<u64> {
        if self.cache.is_dirty(bytenr) {
            return Ok(bytenr);
        }
        let buf = self.buf(bytenr)?.clone();
        let level = crate::tree::edit::level(&buf);
        let hdr_gen = u64::from_le_bytes(buf[0x50..0x58].try_into().unwrap_or([0; 8]));
        let maybe_shared = match (tree, self.roots.get(&tree)) {
            (
                TreeId::Tree(id),
                Some(RootState {
                    item: Some((_, ri)),
                    ..
                }),
            ) => is_fstree(id) && hdr_gen <= ri.last_snapshot.get(),
            _ => false,
        };
        let still_used = maybe_shared
            && self.tree_block_shared(bytenr, level)?
            && self.extent_refs().cow_shared_refs(tree, bytenr, &buf)?;
        let first_key = if crate::tree::edit::nritems(&buf) > 0 {
            crate::tree::edit::key_at(&buf, 0)
        } else {
            Key::MIN
        };
        let nb = self.alloc_tree_block(tree, level, first_key)?;
        let mut nbuf = buf;
        crate::tree::edit::set_header_location(&mut nbuf, nb, self.transid, tree.owner());
        if still_used {
            // Other trees keep the old block; only this tree's reference
            // went (in cow_shared_refs).
            self.cache.remove(bytenr);
            if let Some(RootState {
                item: Some((_, ri)),
                ..
            }) = self.roots.get_mut(&tree)
            {
                ri.bytes_used
                    .set(ri.bytes_used.get().saturating_sub(self.img.nodesize as u64));
            }
        } else {
            self.free_tree_block(tree, bytenr, level)?;
        }
        self.cache.insert_dirty(nb, tree, nbuf);
        Ok(nb)
    }

    /// Whether a committed tree block has more than one reference or full
    /// back references (so other trees use it too), queued changes counted.
    fn tree_block_shared(&mut self, bytenr: u64, level: u8) -> Result<bool> {
        let (refs, flags) = self.extent_refs().extent_refs_now(bytenr, Some(level))?;
        Ok(refs != 1 || flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0)
    }

    /// A new empty block for `tree`.
    fn new_block(&mut self, tree: TreeId, level: u8, first_key: Key) -> Result<u64> {
        let nb = self.alloc_tree_block(tree, level, first_key)?;
        let mut buf = vec![0u8; self.nodesize() as usize];
        let fsid = self.sb.tree_fsid();
        crate::tree::edit::init_block(
            &mut buf,
            nb,
            level,
            tree.owner(),
            self.transid,
            &fsid,
            &self.chunk_tree_uuid,
        );
        self.cache.insert_dirty(nb, tree, buf);
        Ok(nb)
    }

    fn set_root(&mut self, tree: TreeId, bytenr: u64, level: u8) -> Result<()> {
        let st = self
            .roots
            .get_mut(&tree)
            .ok_or_else(|| Error::Internal("root not loaded".into()))?;
        st.bytenr = bytenr;
        st.level = level;
        st.dirty = true;
        Ok(())
    }

    /// Create a new, empty tree `id` with a fresh root item.
    pub fn create_tree(&mut self, id: u64, root_item: RootItem) -> Result<()> {
        let tid = TreeId::Tree(id);
        if self.tree_exists(tid)? {
            return Err(Error::Invalid(format!("tree {id} exists")));
        }
        let key = Key::new(id, BTRFS_ROOT_ITEM_KEY, 0);
        self.items.forget_tree(tid);
        self.roots.insert(
            tid,
            RootState {
                id: tid,
                bytenr: 0,
                level: 0,
                item: Some((key, root_item)),
                dirty: true,
            },
        );
        let b = self.new_block(tid, 0, Key::MIN)?;
        self.set_root(tid, b, 0)?;
        // The root item is inserted at commit with the final location.
        let mut data = vec![0u8; crate::format::root::ROOT_ITEM_SIZE];
        data.copy_from_slice(zerocopy::IntoBytes::as_bytes(&root_item));
        self.insert_item(TreeId::Root, &key, &data)
    }

    /// Trees that exist in memory now (loaded, created or log).
    pub fn loaded_trees(&self) -> Vec<TreeId> {
        self.roots.keys().copied().collect()
    }

    /// The tree block cache, to read its sizes.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// What callers may change of the tree block cache: see
    /// [`CacheControl`].
    pub fn cache_control(&mut self) -> CacheControl<'_> {
        CacheControl(&mut self.cache)
    }

    /// Inode and dir items the item cache keeps before starting over (a
    /// reader bounding its memory lowers it).
    pub fn set_item_cache_limit(&mut self, entries: usize) {
        self.items.set_limit(entries);
    }

    /// The device the filesystem is on.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        self.img.device()
    }

    /// File data I/O: see [`DataPath`].
    pub fn data(&mut self) -> DataPath<'_> {
        DataPath {
            io: &mut self.data,
            img: &self.img,
            data_bytes: &mut self.stats.data_bytes,
        }
    }
}
