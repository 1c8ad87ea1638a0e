//! fsync as the filesystem sees it. The filesystem writes a file's dirty
//! pages back and commits when told to; what goes into the log, when the
//! log is synced and what an fsync may skip are the log's business (the
//! `log` layer above), reached through the [`FsyncLog`] the filesystem
//! holds, as inode.c reaches tree-log.c through a handful of hooks.
//!
//! The log works on a [`LogContext`]: the trees it writes and the inode
//! views it reads, nothing of the page cache, the writeback or the
//! namespace operations. Name changes are recorded here as they happen
//! ([`NameChange`]) and handed to the log when the operation that made
//! them ends, so the log follows the namespace as it was at the change.

use super::filesystem::{EngineStats, Filesystem, InodeRt, Loc, Switches};
use super::inode::{is_dir, is_reg, is_symlink};
use super::options::MountOptions;
use super::writeback::Reason;
use crate::format::inode::{InodeItem, Timespec};
use crate::trans::loggate::{LogIoGate, PendingLogSync};
use crate::trans::Store;
use crate::{Error, Result};
use std::sync::Arc;

/// The steps of an fsync, for callers that run them apart (several clients sharing one log sync, as the kernel's log batching does): the file's writeback, logging it, the log sync, the full commit when the log cannot be used. Obtained from [`Filesystem::fsync_path`].
pub struct FsyncPath<'a> {
    fs: &'a mut Filesystem,
}

impl Filesystem {
    /// See [`FsyncPath`].
    pub fn fsync_path(&mut self) -> FsyncPath<'_> {
        FsyncPath { fs: self }
    }
}

/// A change to names that the log must reflect when it already holds the
/// inode or directory: recorded by the namespace operation, applied by
/// the log when the operation ends (or before an fsync logs anything).
#[derive(Clone, Debug)]
pub enum NameChange {
    /// A name went (unlink, rmdir, a rename's replaced target):
    /// btrfs_del_inode_ref_in_log and btrfs_del_dir_entries_in_log.
    Unlink {
        /// Directory that held the name.
        dir: Loc,
        /// The name removed.
        name: Vec<u8>,
        /// DIR_INDEX of the name in `dir`.
        index: u64,
        /// Inode the name pointed to.
        inode: Loc,
    },
    /// A name came (link; rename with the old name): btrfs_log_new_name.
    NewName {
        /// Inode that got the new name.
        inode: Loc,
        /// For a rename, the old name: (directory, name, DIR_INDEX); `None` for a link.
        old: Option<(Loc, Vec<u8>, u64)>,
        /// Directory holding the new name.
        parent: Loc,
    },
}

/// What an fsync has left to do after logging: nothing, or the sync of
/// the log sub-transaction it logged into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncTicket {
    /// Nothing left: the fsync was skipped, committed, or needed no log sync.
    Done,
    /// The log sub-transaction the fsync logged into must be synced.
    LogSync {
        /// The inode fsynced (its subvolume's log is the one to sync).
        inode: Loc,
        /// Transaction logged in; if it committed since, nothing is left to sync.
        trans: u64,
        /// Log sub-transaction (`root->log_transid`) the inode was logged into.
        log_transid: i64,
    },
}

/// Where the log sync of a ticket stands (see
/// [`Filesystem::log_sync_begin`]).
pub enum LogSyncStep {
    /// The sub-transaction is durable (synced, or committed with the transaction).
    Done,
    /// Another log sync's I/O is running: wait for it, then ask again.
    Wait,
    /// This caller runs the log sync's I/O (off the filesystem lock), then
    /// absorbs its result.
    Io(PendingLogSync),
}

/// What the log answers an fsync or a log sync with, when it is not a
/// ticket or a step: the transaction must commit (the reason is counted).
pub enum LogAnswer<T> {
    /// Go on with this.
    Go(T),
    /// The log cannot make the fsync durable: commit the transaction.
    Commit(&'static str),
}

/// The fsync log as the filesystem sees it. Its state (per subvolume log
/// sub-transactions, the log sync under way) is the log's own.
pub trait FsyncLog: Send {
    /// The running log sub-transaction of `subvol` (`root->log_transid`),
    /// which an inode's change records.
    fn sub_transaction(&self, subvol: u64) -> i64;
    /// The gate of the log sync whose I/O may run without the filesystem.
    fn io_gate(&self) -> &Arc<LogIoGate>;
    /// Take note of a log sync whose I/O ended.
    fn absorb_io(&mut self, cx: &mut LogContext<'_>);
    /// An fsync of `l` begins (counted before its writeback).
    fn fsync_begins(&mut self, cx: &mut LogContext<'_>, l: Loc);
    /// Log `l` for an fsync whose writeback is done, after applying the
    /// name changes not yet applied.
    fn log_for_fsync(
        &mut self,
        cx: &mut LogContext<'_>,
        l: Loc,
        changes: Vec<NameChange>,
    ) -> Result<LogAnswer<FsyncTicket>>;
    /// Where the log sync a ticket needs stands (see
    /// [`Filesystem::log_sync_begin`]).
    fn sync_begin(
        &mut self,
        cx: &mut LogContext<'_>,
        ticket: FsyncTicket,
    ) -> Result<LogAnswer<LogSyncStep>>;
    /// See [`Filesystem::log_batch_pending`].
    fn batch_pending(&mut self, cx: &mut LogContext<'_>, ticket: FsyncTicket) -> Option<u64>;
    /// Bring the log up to date with names just changed. Never fails the
    /// name change, which is made: a logging that cannot be done marks
    /// the transaction for a full commit.
    fn names_changed(&mut self, cx: &mut LogContext<'_>, changes: Vec<NameChange>);
    /// Every later fsync of transaction `trans` commits
    /// (btrfs_set_log_full_commit).
    fn force_full_commit(&mut self, trans: u64);
}

/// What the log writer may use of a mounted filesystem: the trees (the
/// log trees it writes, the subvolume trees it copies from) and the
/// inodes' items and runtime state.
pub struct LogContext<'a> {
    /// The trees and the running transaction.
    pub store: &'a mut Store,
    inodes: &'a mut super::icache::InodeCache,
    /// Counters the log adds to.
    pub stats: &'a mut EngineStats,
    /// Engine switches.
    pub switches: &'a Switches,
    /// Mount options.
    pub opts: &'a MountOptions,
    now: Timespec,
}

impl LogContext<'_> {
    /// Transid of the running transaction.
    pub fn transid(&self) -> u64 {
        self.store.transid()
    }

    /// The inode item of `l` ([`Filesystem::item`]).
    pub fn item(&mut self, l: Loc) -> Result<InodeItem> {
        super::filesystem::read_item(self.store, l, self.now)
    }

    /// The runtime state of `l`, loaded the first time ([`Filesystem::rt`]).
    pub fn rt(&mut self, l: Loc) -> Result<&mut InodeRt> {
        super::filesystem::load_rt(self.store, self.inodes, l, self.now)
    }

    /// [`Filesystem::inode_logged`].
    pub fn inode_logged(&mut self, l: Loc) -> Result<bool> {
        super::filesystem::inode_logged(self.store, self.inodes, l, self.now)
    }

    /// Whether the file's data is checksummed ([`Filesystem::datasum`]).
    pub fn datasum(&mut self, l: Loc) -> Result<bool> {
        Ok(self.item(l)?.flags.get() & crate::format::consts::BTRFS_INODE_NODATASUM == 0)
    }

    /// Whether the filesystem has the NO_HOLES feature.
    pub fn no_holes(&self) -> bool {
        self.store.no_holes()
    }
}

impl Filesystem {
    /// fsync(2), fdatasync(2), msync(MS_SYNC) (btrfs_sync_file): the range
    /// and `datasync` change nothing, as in the kernel, which always syncs
    /// the whole file.
    pub fn fsync(&mut self, l: Loc, datasync: bool, range: Option<(u64, u64)>) -> Result<()> {
        let ticket = self.fsync_path().fsync_prepare(l, datasync, range)?;
        self.fsync_path().fsync_finish(ticket)
    }

    /// pwrite on an O_SYNC (`datasync`: O_DSYNC) descriptor: the write,
    /// then generic_write_sync's fsync of the written range, whose data
    /// goes out as an fsync's does (ahead of background writeback with
    /// sync-io-first).
    pub fn write_sync(&mut self, l: Loc, off: u64, data: &[u8], datasync: bool) -> Result<()> {
        self.write(l, off, data)?;
        let end = off.saturating_add(data.len() as u64);
        self.fsync(l, datasync, Some((off, end)))
    }

    /// The gate of the log sync whose I/O may be running without the
    /// filesystem (clients wait on it without holding the filesystem).
    pub fn log_io_gate(&self) -> Arc<LogIoGate> {
        self.log.as_ref().io_gate().clone()
    }
}

/// Sleep until `t` (no time when it passed).
pub fn sleep_until(t: std::time::Instant) {
    let now = std::time::Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

impl FsyncPath<'_> {
    /// The log and the context it works on (disjoint parts of the mount).
    fn log_parts(&mut self) -> (&mut dyn FsyncLog, LogContext<'_>) {
        let now = self.fs.clock.now();
        let (log, store, inodes, stats, switches, opts) = self.fs.log_fields();
        (
            log,
            LogContext {
                store,
                inodes,
                stats,
                switches,
                opts,
                now,
            },
        )
    }

    /// An fsync's writeback of a file (none for others), and when its
    /// data is written: with sync-io-first it went out at once (None);
    /// without it, it joined the data queue's batch, which
    /// [`Filesystem::fsync_prepare`] waits for before it logs (the 2009
    /// fsync waiting for its bios to be unplugged, inside ->fsync under
    /// the inode's i_mutex). The wait holds the filesystem, as the engine
    /// holds it through an fsync's writeback in either position (with the
    /// switch on, the fsync's own writes go out under it).
    pub fn fsync_writeback(&mut self, l: Loc) -> Result<Option<std::time::Instant>> {
        if !is_reg(self.fs.item(l)?.mode.get()) {
            return Ok(None);
        }
        self.fsync_writeback_file(l)
    }

    fn fsync_writeback_file(&mut self, l: Loc) -> Result<Option<std::time::Instant>> {
        self.fs.writeback().inode(l, 0, u64::MAX, Reason::Fsync)?;
        if self.fs.switches.sync_io_first {
            return Ok(None);
        }
        Ok(self.fs.store.data().data_batch_due((l.subvol, l.ino)))
    }

    /// The first half of an fsync: write back, then log the inode (or
    /// skip, or commit). What is left is the log sync the ticket names,
    /// which an fsync of another client may do for it: every fsync that
    /// logged into a log sub-transaction before it is synced is made
    /// durable by that one sync (btrfs_sync_log's batching).
    pub fn fsync_prepare(
        &mut self,
        l: Loc,
        _datasync: bool,
        _range: Option<(u64, u64)>,
    ) -> Result<FsyncTicket> {
        {
            let (log, mut cx) = self.log_parts();
            log.fsync_begins(&mut cx, l);
        }
        if l.is_placeholder() {
            // The empty-subvolume placeholder's fsync does nothing
            // (noop_fsync): it has nothing on disk.
            return Ok(FsyncTicket::Done);
        }
        let m = self.fs.item(l)?.mode.get();
        if !is_reg(m) && !is_dir(m) && !is_symlink(m) {
            return Err(Error::errno(libc::EINVAL, "fsync: not a file or directory"));
        }
        if is_reg(m) {
            if let Some(due) = self.fsync_writeback_file(l)? {
                sleep_until(due);
            }
            if !self.fs.switches.sync_io_first {
                // The batch the fsync's data joined goes now (an unplug
                // sends everything queued).
                self.fs.store.data().release_open_batch()?;
            }
        }
        let changes = std::mem::take(&mut self.fs.name_changes);
        let (log, mut cx) = self.log_parts();
        match log.log_for_fsync(&mut cx, l, changes)? {
            LogAnswer::Go(ticket) => Ok(ticket),
            LogAnswer::Commit(reason) => self.full_commit(reason).map(|_| FsyncTicket::Done),
        }
    }

    /// The second half: sync the log the ticket needs, unless a commit or
    /// another fsync's log sync made it durable already. Holding the
    /// filesystem throughout; clients sharing it go through
    /// [`Filesystem::log_sync_begin`] instead, and run the I/O without it.
    pub fn fsync_finish(&mut self, ticket: FsyncTicket) -> Result<()> {
        loop {
            match self.log_sync_begin(ticket)? {
                LogSyncStep::Done => return Ok(()),
                // Another client's log sync is writing; it needs nothing
                // of the filesystem to end.
                LogSyncStep::Wait => self.fs.log_io_gate().wait_idle(),
                LogSyncStep::Io(p) => {
                    let r = p.run();
                    self.absorb_log_io();
                    return r;
                }
            }
        }
    }

    /// What the log sync a ticket needs is up to: done already (a commit,
    /// or a log sync that ended since), wait for the log sync whose I/O is
    /// running, or the I/O of a sync this caller runs. Before it is
    /// prepared, the data the log's extents name and that still sat in the
    /// queue is written; the sub-transaction moves on at once, so fsyncs
    /// from now on log into the next one.
    pub fn log_sync_begin(&mut self, ticket: FsyncTicket) -> Result<LogSyncStep> {
        let (log, mut cx) = self.log_parts();
        match log.sync_begin(&mut cx, ticket)? {
            LogAnswer::Go(step) => Ok(step),
            LogAnswer::Commit(reason) => self.full_commit(reason).map(|_| LogSyncStep::Done),
        }
    }

    /// Before a client syncs the log a ticket needs: the subvolume's fsync
    /// count, when the sync should first give other clients a tick to
    /// join it (btrfs_sync_log on a non-ssd mount, when more than one
    /// client logged into the sub-transaction; here also when more than one
    /// logged into the previous one, whose clients a sync's end sends back
    /// to fsync together while the first of them would otherwise sync
    /// alone); None when it should go at once or is not needed any more.
    pub fn log_batch_pending(&mut self, ticket: FsyncTicket) -> Option<u64> {
        let (log, mut cx) = self.log_parts();
        log.batch_pending(&mut cx, ticket)
    }

    /// Take note of a log sync whose I/O ended: its sub-transaction is
    /// durable, or, when it failed, every later fsync of the transaction
    /// commits.
    pub fn absorb_log_io(&mut self) {
        let (log, mut cx) = self.log_parts();
        log.absorb_io(&mut cx);
    }

    /// Hand the name changes of the operation that just ended to the log
    /// (btrfs_log_new_name, btrfs_del_dir_entries_in_log run inline in the
    /// kernel's unlink, link and rename).
    pub(super) fn log_name_changes(&mut self) {
        let changes = std::mem::take(&mut self.fs.name_changes);
        if changes.is_empty() {
            return;
        }
        let (log, mut cx) = self.log_parts();
        log.names_changed(&mut cx, changes);
    }

    /// The fsync commits the transaction instead of logging.
    fn full_commit(&mut self, reason: &'static str) -> Result<()> {
        self.fs.stats.full_commits += 1;
        *self
            .fs
            .stats
            .full_commit_reasons
            .entry(reason.to_string())
            .or_default() += 1;
        self.fs.commit("fsync")
    }
}
