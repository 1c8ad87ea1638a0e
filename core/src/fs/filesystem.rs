//! The mounted filesystem: the tree store plus what the kernel keeps in
//! memory for a mount (inodes with their page cache, open files, the
//! running transaction's age, the clock), and the operations a process
//! performs on it.
//!
//! Invariants:
//! - inode items in the tree are authoritative for everything but the
//!   in-memory size (`i_size`, which runs ahead of the item's size while
//!   written data is only in the page cache) and the runtime state;
//! - the item's size is `disk_i_size`: what the data written back supports;
//! - dirty pages are the only data not yet in an extent; a commit after a
//!   `sync` (which writes them all back) leaves none.

use super::inode::*;
use super::options::MountOptions;
use super::pagecache::PageCache;
use crate::format::consts::*;
use crate::format::inode::{InodeItem, Timespec};
use crate::format::key::Key;
use crate::io::BlockDevice;
use crate::trans::{Store, TreeId};
use crate::util::hash::FastMap as HashMap;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// An inode: (subvolume tree, inode number).
///
/// One kind of inode has no item: the empty directory the kernel shows
/// for a subvolume entry that no ROOT_REF links under the directory
/// holding it (a snapshot keeps its source's entry naming a nested
/// subvolume, but the nested subvolume is not linked under the snapshot).
/// Like the kernel's placeholder (new_simple_dir) it is inode
/// BTRFS_EMPTY_SUBVOL_DIR_OBJECTID of the directory's tree, and `parent`
/// is that directory (the placeholder takes its owner from it). `parent`
/// is 0 for every inode with an item. Two placeholders in one directory
/// are the same `Loc`: what tells them apart is the entry's name, which
/// every operation on one has at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    /// Subvolume tree (root objectid) the inode lives in.
    pub subvol: u64,
    /// Inode number in that tree (BTRFS_EMPTY_SUBVOL_DIR_OBJECTID for a placeholder).
    pub ino: u64,
    /// For a placeholder, the directory whose entry it stands for; 0 otherwise.
    pub parent: u64,
}

impl Loc {
    /// The inode `ino` of subvolume `subvol` (not a placeholder).
    pub fn new(subvol: u64, ino: u64) -> Loc {
        Loc {
            subvol,
            ino,
            parent: 0,
        }
    }

    /// The empty-subvolume placeholder for an entry of directory `dir`.
    pub fn placeholder(dir: Loc) -> Loc {
        Loc {
            subvol: dir.subvol,
            ino: BTRFS_EMPTY_SUBVOL_DIR_OBJECTID,
            parent: dir.ino,
        }
    }

    /// Whether this is an empty-subvolume placeholder (no inode item).
    pub fn is_placeholder(&self) -> bool {
        self.ino == BTRFS_EMPTY_SUBVOL_DIR_OBJECTID
    }
}

/// Engine switches (`set NAME on|off`), each a result of Btrfs's history.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Switches {
    /// Skip the log sync when a fast fsync finds nothing changed since the
    /// last commit and no ordered extents in range.
    pub fast_fsync_skip: bool,
    /// Log inodes whose names a new inode takes instead of committing.
    pub log_conflicting_inodes: bool,
    /// Write data for fsync and O_SYNC at once, ahead of background
    /// writeback.
    pub sync_io_first: bool,
}

impl Default for Switches {
    fn default() -> Switches {
        Switches {
            fast_fsync_skip: true,
            log_conflicting_inodes: true,
            sync_io_first: true,
        }
    }
}

/// What the engine counts.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EngineStats {
    /// Transaction commits, for any reason.
    pub commits: u64,
    /// Commits by the reason given to the commit (`"fsync"`, `"sync"`, ...).
    pub commit_reasons: BTreeMap<String, u64>,
    /// fsync calls (every `fsync_prepare`, placeholders included).
    pub fsyncs: u64,
    /// Log syncs started (btrfs_sync_log writing the log trees and the superblock).
    pub log_syncs: u64,
    /// fsyncs that needed no log sync: the inode was already in the synced log,
    /// unchanged since the last commit, or logging found nothing to sync.
    pub log_syncs_skipped: u64,
    /// fsyncs made durable by another client's log sync (batched).
    pub log_syncs_joined: u64,
    /// fsyncs that committed the transaction instead of logging
    /// (BTRFS_LOG_FORCE_COMMIT, or a log already marked for a full commit).
    pub full_commits: u64,
    /// `full_commits` by the reason logging gave up.
    pub full_commit_reasons: BTreeMap<String, u64>,
    /// Inodes logged because a logged inode took a name they had in the
    /// committed tree (add_conflicting_inode, log_conflicting_inodes).
    pub conflicting_inodes_logged: u64,
    /// Ordered extents completed (btrfs_finish_one_ordered).
    pub ordered_extents: u64,
    /// Data bytes submitted by writeback and direct writes (uncompressed).
    pub writeback_bytes: u64,
    /// Compressed extents written by writeback.
    pub compressed_extents: u64,
    /// Inline extents written by writeback.
    pub inline_extents: u64,
    /// In-place data writes, one per extent written over (nodatacow or
    /// preallocated space).
    pub nocow_writes: u64,
}

/// Runtime state of an inode, as the kernel's in-core `btrfs_inode`.
#[derive(Debug, Default)]
pub struct InodeRt {
    /// Size as a reader sees it (runs ahead of the item while data is dirty).
    pub i_size: u64,
    /// Size in the inode item: what written-back data supports.
    pub disk_i_size: u64,
    /// The file's page cache (the inode's address_space).
    pub pages: PageCache,
    /// Next directory index (directories), loaded on first use.
    pub index_cnt: Option<u64>,
    /// Open file descriptions on the inode.
    pub opens: u32,
    /// Truncated from a non-zero size to zero: the next close starts
    /// writeback of what was written since (BTRFS_INODE_FLUSH_ON_CLOSE,
    /// for applications that replace a file's content in place).
    pub flush_on_close: bool,
    /// Transaction that last changed the inode.
    pub last_trans: u64,
    /// Log sub-transaction (the subvolume's log_transid) of the last
    /// change, and the last one logged; the inode is in the synced log
    /// when logged in this transaction and `last_sub_trans` is at most both
    /// its and the subvolume's `last_log_commit`.
    pub last_sub_trans: i64,
    /// Log sub-transaction last logged for this inode (`btrfs_inode.last_log_commit`).
    pub last_log_commit: i64,
    /// (transaction, log sub-transaction) the inode was last logged whole
    /// into. The kernel's inode lock holds a second fsync of the inode
    /// until the first one's log sync ended; clients sharing the engine
    /// are not held, so until that sub-transaction is durable the inode
    /// does not count as in the synced log.
    pub logged_into: (u64, i64),
    /// Transaction in which the inode was last logged (0: not known, the
    /// log tree says).
    pub logged_trans: u64,
    /// The next fsync must log everything the slow way (new inode, truncate
    /// that dropped extents, clone, inline extent, reload after eviction in
    /// the transaction that changed it).
    pub full_sync: bool,
    /// The next logging copies the inode item, names and xattrs again
    /// (xattr change, new name): COPY_EVERYTHING.
    pub copy_everything: bool,
    /// Transaction of the last unlink or rename away of one of its names
    /// (for a directory: of an entry moved out, a subvolume deleted or
    /// made in it), and of the last clone into or out of it.
    pub last_unlink_trans: u64,
    /// Transaction of the last clone into or out of the inode
    /// (`btrfs_inode.last_reflink_trans`).
    pub last_reflink_trans: u64,
    /// The directory that held the last name of an inode that has none
    /// left but is still open (0: none): the parent of the open file's
    /// dentry, where an fsync through the descriptor starts its walk up
    /// the new ancestors.
    pub unlinked_from: u64,
    /// Directories: the highest index logged in this transaction, and the
    /// first one the new-dentries walk has not looked at.
    pub last_dir_index_offset: u64,
    /// Directories: the transaction in which the directory was last logged
    /// in full (its entries and deletion ranges), not only as existing.
    pub dir_logged_full_trans: u64,
    /// The transaction in which the inode was last logged as existing
    /// because it was a conflicting inode (its entries not in the log).
    pub conflict_logged_trans: u64,
    /// First directory index the new-dentries walk has not looked at
    /// (`btrfs_inode.first_dir_index_to_log`).
    pub first_dir_index_to_log: u64,
    /// File ranges whose extents changed since the inode was last logged
    /// (what a fast fsync logs).
    pub modified: Vec<(u64, u64)>,
    /// Hole extent maps cached by lookups (btrfs_get_extent over a hole
    /// caches `[start, start + len)`, or up to the next extent), `start ->
    /// end`: punch and zero-range decide from them as the kernel does, so a
    /// hole looked up before later writes keeps the bounds it had then.
    pub hole_maps: std::collections::BTreeMap<u64, u64>,
    /// (mtime, ctime) a buffered write set in memory; the item gets them
    /// when the data is written back.
    pub pending_times: Option<(Timespec, Timespec)>,
    /// The compression type of the inode's `btrfs.compression` property
    /// (0: none); `None` until read.
    pub prop_compress: Option<u8>,
    /// The page cache holds (clean or dirty) pages of the file: such an
    /// inode is not evicted by `drop_caches` of dentries and inodes.
    pub has_page_cache: bool,
    /// I_DIRTY_PAGES with its dirtied_when: a page was dirtied, and no
    /// sync or flusher pass has written the inode back since (an fsync's
    /// or a punch's ranged writeback does not clear it). Such an inode is
    /// off the inode LRU, so `drop_caches` does not evict it, even once a
    /// truncate emptied its page cache.
    pub pages_dirtied_at: Option<std::time::Duration>,
}

/// A mounted filesystem: the tree store with its running transaction and
/// log trees, the in-memory inodes, page cache and dirty data, and the
/// engine's options, switches and counters (the kernel's `btrfs_fs_info`
/// plus the VFS state of a mount).
pub struct Filesystem {
    /// The trees, the running transaction and the log trees.
    pub store: Store,
    /// The fsync log (its state is the log layer's).
    pub(super) log: Box<dyn super::fsync::FsyncLog>,
    /// Name changes of the running namespace operation, for the log.
    pub(super) name_changes: Vec<super::fsync::NameChange>,
    /// Mount options.
    pub opts: MountOptions,
    /// Engine switches selecting historical kernel behaviour.
    pub switches: Switches,
    /// Counters of commits, fsyncs, log syncs and writeback.
    pub stats: EngineStats,
    pub(super) inodes: super::icache::InodeCache,
    /// What path walks found and new names made, by (directory, name).
    pub(super) dcache: super::dcache::DentryCache,
    /// Dirty file data awaiting writeback.
    pub(super) dirty: super::dirty::DirtyData,
    /// Next free inode number per subvolume (root->free_objectid).
    free_ino: HashMap<u64, u64>,
    /// The engine's clock and the running transaction's age.
    pub(super) clock: super::clock::Clock,
    /// The default subvolume (what a mount shows at `/`).
    pub(super) default_subvol: u64,
    /// Next subvolume id (the root tree's free objectid), from the mount
    /// on (None only while the filesystem is being set up).
    pub(super) next_subvol_id: Option<u64>,
    /// Deleted subvolumes waiting for the cleaner: (id, transaction of
    /// the deletion).
    pub(super) deleted_subvols: Vec<(u64, u64)>,
    /// Subvolumes dropped in the last commit whose qgroups go next.
    pub(super) dropped_qgroups: Vec<u64>,
    /// Whom the operations act for: the owner of what they create.
    pub creds: Creds,
}

/// The credentials an operation runs with (root for scripts; a FUSE
/// request's caller on a read-write mount).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Creds {
    /// The file system user id.
    pub uid: u32,
    /// The file system group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// The umask a new inode's mode gets when its directory has no default
    /// ACL (the VFS applies it itself on mounts without POSIX ACLs: 0).
    pub umask: u32,
}

impl Creds {
    /// in_group_p.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// inode_init_owner: the (uid, gid, mode) of a new inode of `mode` in
    /// a directory of `dir_mode` owned by group `dir_gid`. A set-group-id
    /// directory gives its group, and its set-group-id bit to directories;
    /// a group-executable set-group-id file made there by someone outside
    /// that group and without CAP_FSETID (root has it) loses the bit.
    pub fn new_owner(&self, dir_mode: u32, dir_gid: u32, mode: u32) -> (u32, u32, u32) {
        if dir_mode & libc::S_ISGID == 0 {
            return (self.uid, self.gid, mode);
        }
        let mut mode = mode;
        if mode & libc::S_IFMT == libc::S_IFDIR {
            mode |= libc::S_ISGID;
        } else if mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP)
            && !self.in_group(dir_gid)
            && self.uid != 0
        {
            mode &= !libc::S_ISGID;
        }
        (self.uid, dir_gid, mode)
    }
}

/// The default top-level subvolume (BTRFS_FS_TREE_OBJECTID, 5).
pub const FS_TREE: u64 = BTRFS_FS_TREE_OBJECTID;
/// Inode number of a subvolume's root directory (BTRFS_FIRST_FREE_OBJECTID, 256).
pub const ROOT_DIR: u64 = BTRFS_FIRST_FREE_OBJECTID;

impl InodeRt {
    /// Join the cached hole maps meeting `[a, b)` with the holes touching
    /// them (try_merge_map on extent maps no longer in the changed list).
    pub fn join_hole_maps(&mut self, a: u64, b: u64) {
        let hit: Vec<(u64, u64)> = self
            .hole_maps
            .range(..=b)
            .filter(|(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in hit {
            if self.hole_maps.get(&s) == Some(&e) {
                self.hole_maps.remove(&s);
                super::writeback::add_hole_map(&mut self.hole_maps, s, e);
            }
        }
    }
}

/// How far the engine's clock moves at a commit (more than a tick of the
/// kernel's coarse clock at any HZ).
const COMMIT_TIME: std::time::Duration = std::time::Duration::from_millis(10);

/// Symlinks followed in one path resolution before ELOOP.
const MAX_SYMLINKS: usize = 40;

impl Filesystem {
    /// Mount the filesystem on `dev` with `opts`. A filesystem with a log
    /// must have it replayed first.
    pub fn mount(
        dev: Arc<dyn BlockDevice>,
        mut opts: MountOptions,
        log: Box<dyn super::fsync::FsyncLog>,
    ) -> Result<Filesystem> {
        // open_ctree: without ssd or nossd, a device that does not spin
        // mounts as ssd.
        if !opts.ssd_given {
            opts.ssd = dev.rotational() == Some(false);
        }
        let store = Store::open(dev)?;
        Filesystem::with_store(store, opts, log)
    }

    /// Mount an already opened `store` with `opts`: sets the incompat features a
    /// read-write mount has, reads the default subvolume, finds deleted
    /// subvolumes and cleans up orphans (open_ctree's share of the work).
    pub fn with_store(
        mut store: Store,
        opts: MountOptions,
        log: Box<dyn super::fsync::FsyncLog>,
    ) -> Result<Filesystem> {
        // A mount places data as the kernel does, by size class.
        store.chunks().use_size_classes();
        let mut fs = Filesystem {
            store,
            log,
            name_changes: Vec::new(),
            opts,
            switches: Switches::default(),
            stats: EngineStats::default(),
            inodes: Default::default(),
            dcache: Default::default(),
            dirty: Default::default(),
            free_ino: HashMap::default(),
            clock: Default::default(),
            default_subvol: FS_TREE,
            next_subvol_id: None,
            deleted_subvols: Vec::new(),
            dropped_qgroups: Vec::new(),
            creds: Creds::default(),
        };
        // As open_ctree: features a read-write mount always has, and the
        // mount's compression type.
        fs.store.set_incompat(BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF);
        if fs.store.nodesize() > 4096 {
            fs.store.set_incompat(BTRFS_FEATURE_INCOMPAT_BIG_METADATA);
        }
        match fs.opts.compress.map(|m| m.kind) {
            Some(BTRFS_COMPRESS_LZO) => fs.store.set_incompat(BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO),
            Some(BTRFS_COMPRESS_ZSTD) => {
                fs.store.set_incompat(BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD)
            }
            _ => {}
        }
        fs.default_subvol = fs.read_default_subvol()?;
        fs.next_subvol_id = Some(fs.subvols().root_tree_free_objectid()?);
        fs.subvols().find_dead_subvols()?;
        if !fs.opts.read_only {
            fs.subvols().orphan_cleanup()?;
        }
        Ok(fs)
    }

    /// The subvolume the mount's root is: `subvolid=` when given, else
    /// the one the root tree's `default` entry names.
    fn read_default_subvol(&mut self) -> Result<u64> {
        if let Some(id) = self.opts.subvolid {
            if !self.store.tree_exists(id)? {
                return Err(Error::Invalid(format!("subvolid={id}: no such subvolume")));
            }
            return Ok(id);
        }
        super::subvol::default_subvol_id(&mut self.store)
    }

    // ------------------------------------------------------------------
    // Time

    /// The engine's clock: wall time at mount plus the time `sleep` and
    /// commits added.
    pub fn clock(&self) -> &super::clock::Clock {
        &self.clock
    }

    /// Move the clock (a script's `sleep`); periodic work that falls due
    /// runs, as the kernel's transaction thread would run it.
    pub fn advance_clock(&mut self, by: std::time::Duration) -> Result<()> {
        self.clock.advance(by);
        self.periodic()
    }

    /// The commit interval and the dirty thresholds: called between
    /// operations.
    pub fn periodic(&mut self) -> Result<()> {
        let dirty_tree = self.store.cache().dirty_bytes();
        if self.dirty.bytes + dirty_tree > self.dirty.limit {
            let target = (self.dirty.limit / 2).saturating_sub(dirty_tree);
            self.writeback().writeback_oldest(target)?;
        }
        // The flusher: data dirty for longer than dirty_expire (30 s).
        let now = self.clock.uptime();
        if let Some(expired) = self.dirty.flusher_pass(now) {
            for l in expired {
                self.writeback()
                    .inode(l, 0, u64::MAX, super::writeback::Reason::Background)?;
            }
            // The same pass writes back every inode dirtied that long ago,
            // pages or not (__writeback_single_inode clears its state).
            for rt in self.inodes.states_mut() {
                if rt
                    .pages_dirtied_at
                    .is_some_and(|t| now.saturating_sub(t) >= super::dirty::DIRTY_EXPIRE)
                {
                    rt.pages_dirtied_at = None;
                }
            }
        }
        // The transaction thread: a transaction older than the interval
        // (counted from its first change) is committed.
        if let Some(age) = self.clock.trans_age() {
            if age.as_secs() >= self.opts.commit_interval {
                self.commit("interval")?;
            }
        }
        if self.store.cache().dirty_bytes() > self.dirty.metadata_limit {
            self.commit("metadata")?;
        }
        self.trim_caches();
        Ok(())
    }

    /// Bring the caches back under their limits: clean tree blocks past
    /// the block cache's, inodes neither open nor dirty past the inode
    /// cache's. A reader that never writes (restore, the mount) calls this
    /// between operations as [`periodic`](Self::periodic) does, so memory
    /// stays bounded whatever the image's size.
    pub fn trim_caches(&mut self) {
        self.store.cache_control().trim();
        let dirty = &self.dirty;
        self.inodes.shrink(|l| dirty.is_dirty(l));
    }

    /// The inode got dirty pages (`first`: it had none).
    pub(super) fn note_dirty(&mut self, l: Loc) {
        self.dirty.note_dirty(l, self.clock.uptime());
    }

    /// Commit the running transaction (`reason` is counted): with
    /// flushoncommit the dirty data is written back first, and the cleaner
    /// drops the subvolumes whose deletion an earlier commit made durable.
    pub fn commit(&mut self, reason: &str) -> Result<()> {
        // A log sync still under way finishes before the writeback (as the
        // commit waits for it before anything else).
        self.log.io_gate().wait_idle();
        self.fsync_path().absorb_log_io();
        if self.opts.flushoncommit {
            self.writeback().all(super::writeback::Reason::Sync)?;
        }
        self.subvols().finish_deleted_subvols()?;
        self.commit_only(reason)
    }

    /// Commit the running transaction as it stands: nothing is added to it
    /// that changes a reference (the commit that must follow a snapshot's
    /// qgroup inherit directly).
    pub(super) fn commit_only(&mut self, reason: &str) -> Result<()> {
        // A log sync's superblock must not land after the commit's.
        self.log.io_gate().wait_idle();
        self.fsync_path().absorb_log_io();
        self.store.data().flush_data()?;
        self.store.commit()?;
        // The log went with the commit.
        self.name_changes.clear();
        // Extent maps changed so far belong to a committed transaction: a
        // fast fsync logs only those of the next one
        // (btrfs_log_changed_extents skips older generations).
        for rt in self.inodes.states_mut() {
            rt.modified.clear();
        }
        // A commit's writes and flushes take the kernel more than a clock
        // tick: times set after it differ from those set before
        // (file_modified then changes the inode).
        self.clock.advance(COMMIT_TIME);
        self.stats.commits += 1;
        *self
            .stats
            .commit_reasons
            .entry(reason.to_string())
            .or_default() += 1;
        self.clock.committed();
        if !self.dropped_qgroups.is_empty() {
            self.subvols().remove_dropped_qgroups()?;
            self.clock.dirtied();
        }
        Ok(())
    }

    /// sync(2)/syncfs(2): write back every dirty page, then commit.
    pub fn sync(&mut self) -> Result<()> {
        self.writeback()
            .writeback_inodes(super::writeback::Reason::Sync)?;
        self.commit("sync")
    }

    /// Drop what a `drop_caches` drops: clean tree blocks, and inodes that
    /// are neither open nor dirty (their runtime state goes with them).
    /// The mount's root directory stays (its dentry is pinned), and so do
    /// the directories above an open file (its dentry pins its parents').
    pub fn evict(&mut self) {
        self.store.cache_control().drop_clean();
        let mut keep: HashSet<Loc> = HashSet::new();
        keep.insert(Loc::new(BTRFS_FS_TREE_OBJECTID, ROOT_DIR));
        for mut l in self.inodes.open() {
            // Bounded: a directory chain deeper than this is not a tree.
            for _ in 0..4096 {
                if !keep.insert(l) || l.ino == ROOT_DIR {
                    break;
                }
                match crate::fs::names::links_of(&mut self.store, l.subvol, l.ino) {
                    Ok(links) if !links.is_empty() => l = Loc::new(l.subvol, links[0].parent),
                    _ => break,
                }
            }
        }
        self.inodes.evict(&keep);
        self.dcache.clear();
    }

    /// Unmount and mount again: everything durable is committed, all
    /// runtime state goes, inode number counters restart from the trees.
    pub fn remount(&mut self) -> Result<()> {
        self.close_all()?;
        self.sync()?;
        self.inodes.clear();
        self.dcache.clear();
        self.free_ino.clear();
        self.store.cache_control().drop_clean();
        self.default_subvol = self.read_default_subvol()?;
        self.next_subvol_id = Some(self.subvols().root_tree_free_objectid()?);
        Ok(())
    }

    /// Close every open file (unmount): unlinked open files go.
    pub fn close_all(&mut self) -> Result<()> {
        for l in self.inodes.open() {
            while self.inodes.get(&l).is_some_and(|r| r.opens > 0) {
                self.close(l)?;
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Inodes

    /// The inode item of `l` (for a placeholder, the one it shows: see
    /// `read_item`).
    pub fn item(&mut self, l: Loc) -> Result<InodeItem> {
        let now = self.clock.now();
        read_item(&mut self.store, l, now)
    }

    /// A placeholder has no item to change: every operation that would
    /// write one refuses it first; this is the backstop.
    fn refuse_placeholder(l: Loc) -> Result<()> {
        if l.is_placeholder() {
            return Err(Error::errno(
                libc::EPERM,
                format!(
                    "the empty directory standing for a subvolume in directory {} of subvolume {} has no inode item",
                    l.parent, l.subvol
                ),
            ));
        }
        Ok(())
    }

    /// Write an inode item back (btrfs_update_inode): its transid is the
    /// running transaction's.
    pub(super) fn put_item(&mut self, l: Loc, item: &InodeItem) -> Result<()> {
        Self::refuse_placeholder(l)?;
        // The kernel holds an inode in memory before changing it: its
        // runtime state comes from the item as it was, not as changed.
        self.load_rt_if_exists(l)?;
        let mut it = *item;
        it.transid.set(self.store.transid());
        put_inode(&mut self.store, l.subvol, l.ino, &it)?;
        self.mark_changed(l);
        Ok(())
    }

    /// btrfs_set_inode_full_sync: the next fsync logs the inode the slow
    /// way, and, as a reflink may have happened in the transaction that
    /// last changed it, with every extent of it (last_reflink_trans
    /// catches up with last_trans: an earlier fsync in the transaction may
    /// have reset it).
    pub(super) fn set_full_sync(&mut self, l: Loc) -> Result<()> {
        let rt = self.rt(l)?;
        rt.full_sync = true;
        rt.last_reflink_trans = rt.last_reflink_trans.max(rt.last_trans);
        Ok(())
    }

    /// Load the runtime state of an inode that already has an item (a new
    /// inode's state is set up by its creator).
    fn load_rt_if_exists(&mut self, l: Loc) -> Result<()> {
        if self.inodes.contains(&l) {
            return Ok(());
        }
        if get_inode(&mut self.store, l.subvol, l.ino)?.is_some() {
            self.rt(l)?;
        }
        Ok(())
    }

    /// The runtime state of an inode, loading it the first time.
    pub fn rt(&mut self, l: Loc) -> Result<&mut InodeRt> {
        let now = self.clock.now();
        load_rt(&mut self.store, &mut self.inodes, l, now)
    }

    pub(super) fn rt_if_loaded(&mut self, l: Loc) -> Option<&mut InodeRt> {
        self.inodes.get_mut(&l)
    }

    pub(super) fn forget_inode(&mut self, l: Loc) {
        self.dirty.note_clean(l);
        if let Some(rt) = self.inodes.remove(&l) {
            self.dirty.bytes = self.dirty.bytes.saturating_sub(rt.pages.dirty_bytes());
        }
    }

    pub(super) fn loaded_inodes(&self) -> Vec<Loc> {
        self.inodes.locs()
    }

    /// The inode changed in this transaction (btrfs_set_inode_last_trans):
    /// it is no longer in the synced log.
    pub(super) fn touch_trans(&mut self, l: Loc) -> Result<()> {
        self.rt(l)?;
        self.mark_changed(l);
        self.clock.dirtied();
        Ok(())
    }

    /// Log bookkeeping of a change, when the inode's state is in memory
    /// (a later load takes the transaction from the item).
    pub(super) fn mark_changed(&mut self, l: Loc) {
        let t = self.store.transid();
        let lt = self.log.sub_transaction(l.subvol);
        if let Some(rt) = self.inodes.get_mut(&l) {
            rt.last_trans = t;
            rt.last_sub_trans = lt;
            rt.last_log_commit = lt - 1;
        }
    }

    /// Whether the inode is in this transaction's log (inode_logged):
    /// known from memory, else from the log tree.
    pub fn inode_logged(&mut self, l: Loc) -> Result<bool> {
        let now = self.clock.now();
        inode_logged(&mut self.store, &mut self.inodes, l, now)
    }

    /// The subvolume's free objectid as the kernel sets it when it loads
    /// the root (btrfs_init_root_free_objectid): one past the highest
    /// objectid in the tree then. Numbers then count up and are not
    /// reused before the next mount, so it must be fixed before anything
    /// removes an inode (unlink, rmdir, orphan cleanup): counted after, a
    /// deleted highest inode's number would come back, and a log could
    /// name an inode number the committed tree still gives another inode.
    pub(super) fn pin_free_ino(&mut self, subvol: u64) -> Result<()> {
        if self.free_ino.contains_key(&subvol) {
            return Ok(());
        }
        let hi = Key::new(BTRFS_LAST_FREE_OBJECTID, u8::MAX, u64::MAX);
        let lo = Key::new(BTRFS_FIRST_FREE_OBJECTID, 0, 0);
        let next = match self.store.prev_item(TreeId::Tree(subvol), &hi, &lo)? {
            Some((k, _)) => k.objectid + 1,
            None => BTRFS_FIRST_FREE_OBJECTID,
        };
        self.free_ino.insert(subvol, next);
        Ok(())
    }

    /// The free inode number of `subvol` is at least `next` (what a log
    /// replay before this mount left, see `log::replay::mount`).
    pub fn raise_free_ino(&mut self, subvol: u64, next: u64) -> Result<()> {
        self.pin_free_ino(subvol)?;
        if let Some(n) = self.free_ino.get_mut(&subvol) {
            *n = (*n).max(next);
        }
        Ok(())
    }

    /// A fresh inode number in `subvol` (see [`Self::pin_free_ino`]).
    pub(super) fn alloc_ino(&mut self, subvol: u64) -> Result<u64> {
        self.pin_free_ino(subvol)?;
        let n = self
            .free_ino
            .get_mut(&subvol)
            .ok_or_else(|| Error::Internal("free inode".into()))?;
        if *n >= BTRFS_LAST_FREE_OBJECTID {
            return Err(Error::errno(
                libc::ENOSPC,
                format!("no free inode numbers in subvolume {subvol}"),
            ));
        }
        let ino = *n;
        *n += 1;
        Ok(ino)
    }

    /// The next directory index of `dir`.
    pub(super) fn next_index(&mut self, dir: Loc) -> Result<u64> {
        let cur = self.rt(dir)?.index_cnt;
        let idx = match cur {
            Some(i) => i,
            None => {
                // Counted from the directory's entries as the kernel sees
                // them on reloading the inode: deletions made in this
                // transaction are delayed items not yet in the tree, so
                // the committed entries still count. An index freed in the
                // transaction is never handed out again in it (a log could
                // otherwise name an index the committed tree still uses).
                let mut next = super::names::next_dir_index(&mut self.store, dir.subvol, dir.ino)?;
                if self.item(dir)?.transid.get() == self.store.transid() {
                    let lo = Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, 0);
                    let hi = Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, u64::MAX);
                    if let Some((k, _)) = self
                        .store
                        .committed()
                        .committed_items_in(dir.subvol, lo, hi)?
                        .last()
                    {
                        next = next.max(k.offset + 1);
                    }
                }
                next
            }
        };
        self.rt(dir)?.index_cnt = Some(idx + 1);
        Ok(idx)
    }

    /// Set times and bump transid of an inode item (`m`: mtime too).
    pub(super) fn stamp(&mut self, l: Loc, ctime: bool, mtime: bool) -> Result<()> {
        let now = self.clock.now();
        let t = self.store.transid();
        self.modify(l, |it| {
            if ctime {
                it.ctime = now;
            }
            if mtime {
                it.mtime = now;
            }
            it.transid.set(t);
            it.sequence.set(it.sequence.get() + 1);
        })?;
        self.touch_trans(l)
    }

    /// file_modified: the times become now only when they are not now
    /// already (the clock's granularity), so an operation that changes
    /// nothing else leaves the inode unchanged (and a later fsync with it).
    pub(super) fn file_modified(&mut self, l: Loc) -> Result<()> {
        let now = self.clock.now();
        let it = self.item(l)?;
        if it.mtime == now && it.ctime == now {
            return Ok(());
        }
        self.stamp(l, true, true)
    }

    /// Change an inode item in place (one copy-on-write search).
    pub(super) fn modify(&mut self, l: Loc, f: impl FnOnce(&mut InodeItem)) -> Result<()> {
        Self::refuse_placeholder(l)?;
        self.load_rt_if_exists(l)?;
        let t = self.store.transid();
        let g = |it: &mut InodeItem| {
            f(it);
            it.transid.set(t);
        };
        if !modify_inode(&mut self.store, l.subvol, l.ino, g)? {
            return Err(Error::errno(
                libc::ENOENT,
                format!("inode {} of subvolume {} does not exist", l.ino, l.subvol),
            ));
        }
        self.mark_changed(l);
        Ok(())
    }

    /// Runtime state for an inode just made (its item is known).
    pub(super) fn new_rt(&mut self, l: Loc, size: u64) {
        let t = self.store.transid();
        // A new inode is logged in full the first time (its number may
        // have been logged and removed in this transaction).
        self.inodes.insert(
            l,
            InodeRt {
                i_size: size,
                disk_i_size: size,
                last_trans: t,
                full_sync: true,
                prop_compress: Some(0),
                ..Default::default()
            },
        );
        self.mark_changed(l);
        self.clock.dirtied();
    }

    // ------------------------------------------------------------------
    // Paths

    /// The root directory of the default subvolume.
    pub fn root(&self) -> Loc {
        Loc::new(self.default_subvol, ROOT_DIR)
    }

    /// Look `name` up in directory `dir`: the inode it names (a subvolume
    /// entry leads to that subvolume's root directory).
    ///
    /// Both inodes are brought into memory as a path walk brings them
    /// (iget): their runtime state then reflects the items before the
    /// operation that follows changes them.
    pub fn lookup(&mut self, dir: Loc, name: &[u8]) -> Result<Option<Loc>> {
        self.load_rt_if_exists(dir)?;
        let Some((location, _)) =
            super::names::lookup_name(&mut self.store, dir.subvol, dir.ino, name)?
        else {
            return Ok(None);
        };
        let l = self.entry_target(dir, name, &location)?;
        self.load_rt_if_exists(l)?;
        Ok(Some(l))
    }

    /// The inode entry `name` of `dir` (location `location`) leads to;
    /// lookup and readdir both ask here. An inode's entry leads to it; a
    /// subvolume's entry leads to the subvolume's root directory only when
    /// a ROOT_REF links that subvolume under this very entry (same
    /// directory, same name) and its tree exists, as the kernel's
    /// fixup_tree_root_location checks. Any other subvolume entry (a
    /// snapshot's copy of one naming a subvolume nested in its source)
    /// leads to the empty placeholder directory.
    pub(super) fn entry_target(&mut self, dir: Loc, name: &[u8], location: &Key) -> Result<Loc> {
        if location.ty != BTRFS_ROOT_ITEM_KEY {
            return Ok(Loc::new(dir.subvol, location.objectid));
        }
        let id = location.objectid;
        let k = Key::new(dir.subvol, BTRFS_ROOT_REF_KEY, id);
        let linked = match self.store.lookup(TreeId::Root, &k)? {
            Some(d) => {
                let (r, n) = crate::format::root::parse_root_ref(&d).map_err(|e| e.at(0, k))?;
                r.dirid.get() == dir.ino && n == name
            }
            None => false,
        };
        if linked && self.store.tree_exists(id)? {
            Ok(Loc::new(id, ROOT_DIR))
        } else {
            Ok(Loc::placeholder(dir))
        }
    }

    /// Resolve a path from the root; `follow`: follow a symlink in the last
    /// component too (intermediate ones are always followed).
    pub fn resolve(&mut self, path: &str, follow: bool) -> Result<Loc> {
        Ok(self.resolve_at(self.root(), path, follow, &mut 0)?.0)
    }

    /// [`Filesystem::resolve`] from `start`, with the mode of what the
    /// path leads to when the walk read it.
    fn resolve_at(
        &mut self,
        start: Loc,
        path: &str,
        follow: bool,
        links: &mut usize,
    ) -> Result<(Loc, Option<u32>)> {
        let mut cur = if path.starts_with('/') {
            self.root()
        } else {
            start
        };
        let mut comps: Vec<&str> = Vec::with_capacity(8);
        comps.extend(path.split('/').filter(|c| !c.is_empty() && *c != "."));
        let mut stack: Vec<Loc> = Vec::with_capacity(comps.len() + 1);
        stack.push(cur);
        // The mode of `cur` when the previous step read it already.
        let mut cur_mode: Option<u32> = None;
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            if *c == ".." {
                stack.pop();
                cur = stack.last().copied().unwrap_or_else(|| self.root());
                if stack.is_empty() {
                    stack.push(cur);
                }
                cur_mode = None;
                continue;
            }
            let mode = match cur_mode.take() {
                Some(m) => m,
                None => self.item(cur)?.mode.get(),
            };
            if !is_dir(mode) {
                return Err(Error::errno(
                    libc::ENOTDIR,
                    format!("{path}: a component is not a directory"),
                ));
            }
            if c.len() > BTRFS_NAME_LEN {
                return Err(Error::errno(
                    libc::ENAMETOOLONG,
                    format!("{path}: name too long"),
                ));
            }
            if let Some((next, mode)) = self.dcache.get(cur, c.as_bytes()) {
                // As the lookup would: both inodes in memory.
                self.load_rt_if_exists(cur)?;
                self.load_rt_if_exists(next)?;
                cur = next;
                cur_mode = Some(mode);
                stack.push(cur);
                continue;
            }
            let next = self.lookup(cur, c.as_bytes())?.ok_or_else(|| {
                Error::errno(libc::ENOENT, format!("{path}: no such file or directory"))
            })?;
            let nit = self.item(next)?;
            self.dcache.insert(cur, c.as_bytes(), next, nit.mode.get());
            if is_symlink(nit.mode.get()) && (!last || follow) {
                *links += 1;
                if *links > MAX_SYMLINKS {
                    return Err(Error::errno(
                        libc::ELOOP,
                        format!("{path}: too many symbolic links"),
                    ));
                }
                let target = self.read_link(next)?;
                let t = String::from_utf8_lossy(&target).into_owned();
                let (to, mode) = self.resolve_at(cur, &t, true, links)?;
                cur = to;
                cur_mode = mode;
                stack.push(cur);
                continue;
            }
            cur = next;
            cur_mode = Some(nit.mode.get());
            stack.push(cur);
        }
        Ok((cur, cur_mode))
    }

    /// The directory holding the last component of `path`, and that name.
    pub fn resolve_parent(&mut self, path: &str) -> Result<(Loc, Vec<u8>)> {
        let t = path.trim_end_matches('/');
        let (dir, name) = match t.rfind('/') {
            Some(i) => (&t[..i], &t[i + 1..]),
            None => ("", t),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(Error::errno(
                libc::EINVAL,
                format!("{path}: no name to operate on"),
            ));
        }
        if name.len() > BTRFS_NAME_LEN {
            return Err(Error::errno(
                libc::ENAMETOOLONG,
                format!("{path}: name too long"),
            ));
        }
        let (d, mode) = self.resolve_at(
            self.root(),
            if dir.is_empty() { "/" } else { dir },
            true,
            &mut 0,
        )?;
        let mode = match mode {
            Some(m) => m,
            None => self.item(d)?.mode.get(),
        };
        if !is_dir(mode) {
            return Err(Error::errno(
                libc::ENOTDIR,
                format!("{path}: parent is not a directory"),
            ));
        }
        Ok((d, name.as_bytes().to_vec()))
    }

    /// A symlink's target.
    pub fn read_link(&mut self, l: Loc) -> Result<Vec<u8>> {
        let it = self.item(l)?;
        if !is_symlink(it.mode.get()) {
            return Err(Error::errno(libc::EINVAL, "not a symbolic link"));
        }
        // A target is one inline extent (btrfs_symlink refuses a longer
        // one), so its size is bounded by what a leaf holds: a larger
        // i_size from disk is damage, not an allocation to make.
        let size = it.size.get();
        let max = super::extents::max_inline_data(&self.store);
        if size > max {
            return Err(Error::corrupt_key_as(
                crate::CorruptKind::Item,
                format!("symlink of {size} bytes, more than its one inline extent holds ({max})"),
                0,
                Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0),
            ));
        }
        super::read::read_range(&mut self.store, l.subvol, l.ino, size, 0, size, false)
    }

    /// Whether checksums are kept for an inode's data.
    pub fn datasum(&mut self, l: Loc) -> Result<bool> {
        Ok(self.item(l)?.flags.get() & BTRFS_INODE_NODATASUM == 0)
    }

    /// The log and the parts of the mount a log writer may use, apart.
    pub(super) fn log_fields(
        &mut self,
    ) -> (
        &mut dyn super::fsync::FsyncLog,
        &mut Store,
        &mut super::icache::InodeCache,
        &mut EngineStats,
        &Switches,
        &MountOptions,
    ) {
        (
            &mut *self.log,
            &mut self.store,
            &mut self.inodes,
            &mut self.stats,
            &self.switches,
            &self.opts,
        )
    }

    // ------------------------------------------------------------------
    // Open files

    /// Open an inode (a file descriptor's hold on it).
    pub fn open(&mut self, l: Loc) -> Result<()> {
        self.rt(l)?.opens += 1;
        Ok(())
    }

    /// Close (btrfs_release_file): a file truncated to zero since it was
    /// opened has its new data written back now; an inode with no links
    /// left goes with its last close.
    pub fn close(&mut self, l: Loc) -> Result<()> {
        if std::mem::take(&mut self.rt(l)?.flush_on_close) {
            self.writeback()
                .inode(l, 0, u64::MAX, super::writeback::Reason::Background)?;
        }
        let rt = self.rt(l)?;
        rt.opens = rt.opens.saturating_sub(1);
        if rt.opens == 0 {
            let it = self.item(l)?;
            if it.nlink.get() == 0 {
                self.delete_inode(l)?;
            }
        }
        Ok(())
    }

    /// Remove an inode without links: its items, data references and
    /// orphan item.
    pub(super) fn delete_inode(&mut self, l: Loc) -> Result<()> {
        self.pin_free_ino(l.subvol)?;
        self.forget_inode(l);
        super::extents::drop_inode_items(&mut self.store, l.subvol, l.ino)?;
        self.store.delete_item(
            TreeId::Tree(l.subvol),
            &Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, l.ino),
        )?;
        Ok(())
    }

    /// Dirty page and tree block bytes past which data is written back in
    /// the background.
    pub fn dirty_limit(&self) -> u64 {
        self.dirty.limit
    }

    /// Stats for `stats`: cache sizes and I/O counters.
    pub fn cache_sizes(&self) -> (u64, u64, u64) {
        (
            self.store.cache().clean_bytes(),
            self.store.cache().dirty_bytes(),
            self.dirty.bytes,
        )
    }
}

/// The inode item of `l`. An empty-subvolume placeholder has none: what
/// stat(2) shows of it is made as new_simple_dir makes it: a directory
/// with mode 0755, one link, no size, the owner and access time of the
/// directory holding the entry, changed and modified `now` (the kernel
/// makes a new one at every lookup: its dentry is never kept).
pub(super) fn read_item(store: &mut Store, l: Loc, now: Timespec) -> Result<InodeItem> {
    if l.is_placeholder() {
        let dir = read_item(store, Loc::new(l.subvol, l.parent), now)?;
        let mut it = new_inode_item(S_IFDIR | 0o755, dir.uid.get(), dir.gid.get(), 0, now, 0);
        it.generation.set(0);
        it.atime = dir.atime;
        return Ok(it);
    }
    get_inode(store, l.subvol, l.ino)?.ok_or_else(|| {
        Error::errno(
            libc::ENOENT,
            format!("inode {} of subvolume {} does not exist", l.ino, l.subvol),
        )
    })
}

/// The runtime state of an inode, loaded from its item the first time.
pub(super) fn load_rt<'c>(
    store: &mut Store,
    inodes: &'c mut super::icache::InodeCache,
    l: Loc,
    now: Timespec,
) -> Result<&'c mut InodeRt> {
    if !inodes.contains(&l) {
        let item = read_item(store, l, now)?;
        let transid = store.transid();
        let mut rt = InodeRt {
            i_size: item.size.get(),
            disk_i_size: item.size.get(),
            ..Default::default()
        };
        // Changed in this transaction and evicted since: which extents
        // changed is unknown, so the next fsync logs everything. The
        // unlink and reflink transactions were not kept: assume the
        // last change was one (btrfs_read_locked_inode).
        rt.last_trans = item.transid.get();
        if item.transid.get() == transid {
            rt.full_sync = true;
        }
        rt.last_unlink_trans = rt.last_trans;
        rt.last_reflink_trans = rt.last_trans;
        return Ok(inodes.insert(l, rt));
    }
    inodes
        .get_mut(&l)
        .ok_or_else(|| Error::Internal("inode state".into()))
}

/// Whether the inode is in this transaction's log (inode_logged): known
/// from memory, else from the log tree (and then remembered).
pub(super) fn inode_logged(
    store: &mut Store,
    inodes: &mut super::icache::InodeCache,
    l: Loc,
    now: Timespec,
) -> Result<bool> {
    let t = store.transid();
    let lt = load_rt(store, inodes, l, now)?.logged_trans;
    if lt == t {
        return Ok(true);
    }
    if lt > 0 || !store.log_trees().has_log(l.subvol) {
        return Ok(false);
    }
    let found = store
        .lookup(
            TreeId::Log(l.subvol),
            &Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0),
        )?
        .is_some();
    // A directory logged in full has DIR_LOG_INDEX ranges in the log; one
    // logged only as existing has its item alone. The runtime field went
    // with the evicted inode, the log still tells.
    let full_dir = found
        && store
            .prev_item(
                TreeId::Log(l.subvol),
                &Key::new(l.ino, BTRFS_DIR_LOG_INDEX_KEY, u64::MAX),
                &Key::new(l.ino, BTRFS_DIR_LOG_INDEX_KEY, 0),
            )?
            .is_some();
    let rt = load_rt(store, inodes, l, now)?;
    rt.logged_trans = if found { t } else { t - 1 };
    if full_dir {
        rt.dir_logged_full_trans = t;
    }
    Ok(found)
}
