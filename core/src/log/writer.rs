//! The fsync log writer: the inverse of `replay.rs`, as the kernel's
//! tree-log.c writes it (Linux 6.18).
//!
//! An fsync writes the file's dirty pages back, then either skips (the
//! inode is already in the synced log, or unchanged since the last commit),
//! or logs the inode into its subvolume's log tree and syncs the log
//! (`Store::sync_log`: log blocks, flush, primary superblock naming the log
//! root tree, flush), or gives up and commits the transaction, counting
//! why. The running transaction stays in memory either way.
//!
//! What an inode's logging writes (btrfs_log_inode):
//! - full sync (new inode, truncate that dropped extents, clone, inline
//!   extent, reload after eviction): every item of the inode in the log is
//!   replaced: the inode item, all its names, all its xattrs, the extents
//!   the transaction made (all of them after a clone), those at or past
//!   the end of the file, their checksums, and with no-holes a hole item
//!   for every gap;
//! - fast: the inode item, the extents of the ranges changed since the
//!   last logging, their checksums, prealloc past the end;
//! - "exists" (ancestors, new entries of a logged directory, conflicting
//!   inodes, new names): an inode item of generation 0 (replay keeps an
//!   existing inode's item), names and xattrs, no data;
//! - a directory: its item, names, xattrs, the index entries added in this
//!   transaction and DIR_LOG_INDEX ranges over which replay deletes the
//!   committed entries the log does not hold.
//!
//! Then the inode's new ancestors, its old parents after an unlink or
//! rename, the targets of new directory entries and the inodes whose names
//! a new inode took are logged too, as the kernel does.

use super::syncio::{LogIoDone, LogIoGate, PendingLogSync};
use crate::error::{Error, Result};
use crate::format::consts::*;
use crate::format::dir::{parse_dir_items, DirLogItem};
use crate::format::file_extent::{parse_file_extent, FileExtent, FileExtentItem};
use crate::format::inode::{parse_inode_extrefs, parse_inode_refs, InodeItem};
use crate::format::key::Key;
use crate::fs::extents::{drop_extents_in, extent_key, extents_in, extents_in_tree};
use crate::fs::inode::{is_dir, is_reg};
use crate::fs::{
    FsyncLog, FsyncTicket, Loc, LogAnswer, LogContext, LogSyncStep, NameChange, ROOT_DIR,
};
use crate::trans::TreeId;
use crate::CorruptKind;
use std::collections::{HashSet, VecDeque};
use zerocopy::{FromBytes, IntoBytes};

/// How much of an inode a logging writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogMode {
    /// Everything needed to reproduce it (LOG_INODE_ALL).
    All,
    /// That it exists, with its names (LOG_INODE_EXISTS).
    Exists,
}

/// Conflicting inodes logged per fsync before it commits instead.
const MAX_CONFLICT_INODES: usize = 10;

/// Ancestors walked before the chain is taken as broken.
const MAX_DEPTH: usize = 4096;

/// Why a logging call stopped.
#[derive(Debug)]
enum Stop {
    /// The log cannot express this: an fsync commits the transaction, and
    /// so does every later fsync of it (BTRFS_LOG_FORCE_COMMIT is an error
    /// code since Linux 6.3, so btrfs_log_inode_parent marks the log for a
    /// full commit, a new name's logging included). The reason is counted.
    Commit(&'static str),
    Err(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Err(e)
    }
}

type LResult<T> = std::result::Result<T, Stop>;

/// What an fsync's logging ended with.
enum Outcome {
    /// Sync the log.
    Sync,
    /// Already in the synced log: nothing to write (BTRFS_NO_LOG_SYNC).
    NoSync,
}

/// One logging's working state (btrfs_log_ctx).
struct Ctx {
    /// The inode the fsync (or new name) is for.
    inode: Loc,
    /// A fully logged directory had new entries whose targets need logging.
    log_new_dentries: bool,
    logging_new_name: bool,
    logging_conflict_inodes: bool,
    /// Inodes whose names a newly logged inode took: (inode, parent).
    conflicts: VecDeque<(u64, u64)>,
    conflicts_seen: usize,
    /// Log and sync even an inode already in the synced log (fast fsync
    /// without the 2015 skip: one log sync per fsync).
    always_sync: bool,
    /// Logging the targets of a directory's new entries
    /// (logging_new_delayed_dentries).
    logging_new_delayed: bool,
}

impl Ctx {
    fn new(inode: Loc) -> Ctx {
        Ctx {
            inode,
            log_new_dentries: false,
            logging_new_name: false,
            logging_conflict_inodes: false,
            conflicts: VecDeque::new(),
            conflicts_seen: 0,
            always_sync: false,
            logging_new_delayed: false,
        }
    }
}

fn log_tree(l: Loc) -> TreeId {
    TreeId::Log(l.subvol)
}

fn fs_tree(l: Loc) -> TreeId {
    TreeId::Tree(l.subvol)
}

/// Every item of `ino` with a type in `[lo, hi]`.
fn inode_range(ino: u64, lo: u8, hi: u8) -> (Key, Key) {
    (Key::new(ino, lo, 0), Key::new(ino, hi, u64::MAX))
}

/// A subvolume's log bookkeeping (root->log_transid, last_log_commit):
/// the log sub-transaction now being filled, and the last one synced.
#[derive(Clone, Copy, Debug, Default)]
pub struct SubvolLog {
    /// Log sub-transaction now being filled (`root->log_transid`).
    pub log_transid: i64,
    /// Last log sub-transaction synced (`root->last_log_commit`).
    pub last_log_commit: i64,
    /// Every log sub-transaction below this one is on disk
    /// (log_transid_committed + 1): recorded once a sync's last flush
    /// returned, never when it starts.
    pub durable: i64,
    /// fsyncs that came to this subvolume (root->log_batch): a log sync
    /// waiting for others to join goes out once it stops changing.
    pub log_batch: u64,
    /// The client (thread) that started logging into the running
    /// sub-transaction (log_start_pid), and whether another one logged
    /// into it too (BTRFS_ROOT_MULTI_LOG_TASKS).
    pub start_client: Option<std::thread::ThreadId>,
    /// Another client logged into the running sub-transaction too
    /// (BTRFS_ROOT_MULTI_LOG_TASKS).
    pub multi_clients: bool,
    /// More than one client logged into the sub-transaction synced last:
    /// the next one's first client is likely to be joined too.
    pub prev_multi_clients: bool,
}

/// The filesystem's fsync log (the tree log): per-subvolume log
/// sub-transactions, the transaction in which logging gave up, and the
/// log sync whose I/O may be running. A mount holds it as its
/// [`FsyncLog`].
#[derive(Debug, Default)]
pub struct LogState {
    /// Log bookkeeping per subvolume (root objectid).
    pub subvols: std::collections::HashMap<u64, SubvolLog>,
    /// Transaction in which logging gave up: every later fsync in it
    /// commits (last_trans_log_full_commit).
    pub full_commit_trans: u64,
    /// The log sync whose I/O may be running without the filesystem.
    pub io: std::sync::Arc<LogIoGate>,
}

impl LogState {
    /// A new log, as a mount holds it.
    pub fn boxed() -> Box<dyn FsyncLog> {
        Box::<LogState>::default()
    }
}

/// The log writer at work: the log's state and what it may use of the
/// mount (the trees it writes, the inode views it reads).
struct LogWriter<'c, 'a> {
    cx: &'c mut LogContext<'a>,
    log: &'c mut LogState,
}

impl FsyncLog for LogState {
    fn sub_transaction(&self, subvol: u64) -> i64 {
        self.subvols.get(&subvol).map_or(0, |s| s.log_transid)
    }

    fn io_gate(&self) -> &std::sync::Arc<LogIoGate> {
        &self.io
    }

    fn absorb_io(&mut self, cx: &mut LogContext<'_>) {
        let Some(d) = self.io.take_finished() else {
            return;
        };
        if d.trans != cx.transid() {
            return;
        }
        if !d.ok {
            self.full_commit_trans = d.trans;
            return;
        }
        let s = self.subvols.entry(d.subvol).or_default();
        s.last_log_commit = s.last_log_commit.max(d.log_transid);
        s.durable = s.durable.max(d.log_transid + 1);
    }

    fn fsync_begins(&mut self, cx: &mut LogContext<'_>, l: Loc) {
        self.absorb_io(cx);
        cx.stats.fsyncs += 1;
        self.subvols.entry(l.subvol).or_default().log_batch += 1;
    }

    fn log_for_fsync(
        &mut self,
        cx: &mut LogContext<'_>,
        l: Loc,
        changes: Vec<NameChange>,
    ) -> Result<LogAnswer<FsyncTicket>> {
        LogWriter { cx, log: self }.log_for_fsync(l, changes)
    }

    fn sync_begin(
        &mut self,
        cx: &mut LogContext<'_>,
        ticket: FsyncTicket,
    ) -> Result<LogAnswer<LogSyncStep>> {
        LogWriter { cx, log: self }.sync_begin(ticket)
    }

    fn batch_pending(&mut self, cx: &mut LogContext<'_>, ticket: FsyncTicket) -> Option<u64> {
        self.absorb_io(cx);
        let FsyncTicket::LogSync {
            inode,
            trans,
            log_transid,
        } = ticket
        else {
            return None;
        };
        if cx.opts.ssd || cx.transid() != trans {
            return None;
        }
        let s = self.subvols.get(&inode.subvol)?;
        let multi = s.multi_clients || s.prev_multi_clients;
        (multi && s.durable <= log_transid && s.log_transid == log_transid).then_some(s.log_batch)
    }

    /// Bring the log up to date with the names just changed, as the
    /// kernel's unlink, link and rename do inline (btrfs_log_new_name,
    /// btrfs_del_dir_entries_in_log): the log must follow the namespace
    /// as it was at the change, not as it is at the next fsync (a name
    /// unlinked in between is not part of what the rename logged). A
    /// logging that cannot be done, for whatever reason, marks the
    /// transaction for a full commit (btrfs_set_log_full_commit) and does
    /// not fail the name change, which is already made: the next fsync
    /// commits, and a real I/O error surfaces there.
    fn names_changed(&mut self, cx: &mut LogContext<'_>, changes: Vec<NameChange>) {
        if changes.is_empty() {
            return;
        }
        let t = cx.transid();
        if (LogWriter { cx, log: self })
            .apply_log_ops(changes)
            .is_err()
        {
            self.full_commit_trans = t;
        }
    }

    fn force_full_commit(&mut self, trans: u64) {
        self.full_commit_trans = trans;
    }
}

impl LogWriter<'_, '_> {
    /// The logging half of an fsync whose writeback is done: skip, log
    /// (and leave the log sync to the ticket), or commit.
    fn log_for_fsync(
        &mut self,
        l: Loc,
        changes: Vec<NameChange>,
    ) -> Result<LogAnswer<FsyncTicket>> {
        let t = self.cx.transid();
        let committed = t - 1;
        let rt = self.cx.rt(l)?;
        let (full, last_trans) = (rt.full_sync, rt.last_trans);
        // The 2015 change: a fast fsync of an inode unchanged since the
        // last commit, with nothing in flight, syncs nothing. Without it
        // every fast fsync syncs the log.
        let may_skip = full || self.cx.switches.fast_fsync_skip;
        if may_skip && last_trans > committed {
            // Logged by another client's fsync whose log sync has not
            // ended, and unchanged since: that sync is what this one needs.
            let rt = self.cx.rt(l)?;
            let unchanged = rt.logged_trans == t && rt.last_sub_trans <= rt.last_log_commit;
            if let Some(sub) = self.sync_pending(l)?.filter(|_| unchanged) {
                return Ok(LogAnswer::Go(FsyncTicket::LogSync {
                    inode: l,
                    trans: t,
                    log_transid: sub,
                }));
            }
        }
        if may_skip && (self.in_synced_log(l)? || last_trans <= committed) {
            self.cx.rt(l)?.full_sync = false;
            self.cx.stats.log_syncs_skipped += 1;
            return Ok(LogAnswer::Go(FsyncTicket::Done));
        }
        let mut ctx = Ctx::new(l);
        ctx.always_sync = !may_skip;
        let r = self
            .apply_log_ops(changes)
            .and_then(|_| self.log_inode_parent(l, LogMode::All, &mut ctx));
        match r {
            Ok(Outcome::NoSync) => {
                self.cx.stats.log_syncs_skipped += 1;
                Ok(LogAnswer::Go(FsyncTicket::Done))
            }
            Ok(Outcome::Sync) => {
                let log_transid = self.log.sub_transaction(l.subvol);
                Ok(LogAnswer::Go(FsyncTicket::LogSync {
                    inode: l,
                    trans: t,
                    log_transid,
                }))
            }
            Err(Stop::Commit(reason)) => Ok(LogAnswer::Commit(reason)),
            Err(Stop::Err(e)) => {
                // The logging stopped half-way (no space for the log's
                // blocks, a read that failed): the log may hold part of
                // the inode, or a directory range that claims entries it
                // never got, and no later sync of this transaction may
                // write it. btrfs_log_inode_parent marks the transaction
                // for full commits and commits; an error the commit meets
                // too surfaces there.
                self.log.full_commit_trans = t;
                Ok(LogAnswer::Commit(match e {
                    Error::NoSpace(_) => "no space for the log",
                    Error::Io { .. } | Error::MissingDevice { .. } => "logging failed: I/O error",
                    Error::Corrupt { .. } => "logging failed: damaged metadata",
                    _ => "logging failed",
                }))
            }
        }
    }

    /// Where the log sync a ticket needs stands
    /// ([`Filesystem::log_sync_begin`](crate::fs::Filesystem::log_sync_begin)).
    fn sync_begin(&mut self, ticket: FsyncTicket) -> Result<LogAnswer<LogSyncStep>> {
        self.log.absorb_io(self.cx);
        let FsyncTicket::LogSync {
            inode,
            trans,
            log_transid,
        } = ticket
        else {
            return Ok(LogAnswer::Go(LogSyncStep::Done));
        };
        if self.cx.transid() != trans {
            // Committed since: the log went with the commit.
            self.cx.stats.log_syncs_joined += 1;
            return Ok(LogAnswer::Go(LogSyncStep::Done));
        }
        let durable = self
            .log
            .subvols
            .get(&inode.subvol)
            .is_some_and(|s| s.durable > log_transid);
        if durable {
            self.cx.stats.log_syncs_joined += 1;
            return Ok(LogAnswer::Go(LogSyncStep::Done));
        }
        if self.log.io.busy() {
            return Ok(LogAnswer::Go(LogSyncStep::Wait));
        }
        if self.log.full_commit_trans == trans {
            // Since this client logged, the transaction was marked for full
            // commits (btrfs_set_log_full_commit): a log sync or a logging
            // failed, or another client's fsync met a new chunk. The log
            // cannot be trusted to hold what it logged.
            return Ok(LogAnswer::Commit(
                "new chunk or failed logging in this transaction",
            ));
        }
        // The data the logged extents name: with sync-io-first, only the
        // queued runs holding this file's data (its own fsync writeback went
        // out at once, and logging wrote what other logged files need);
        // without it, everything queued ahead of it too.
        if self.cx.switches.sync_io_first {
            self.cx
                .store
                .data()
                .write_data_of((inode.subvol, inode.ino))?;
        } else {
            self.cx.store.data().flush_data()?;
        }
        let io = match self.cx.store.log_trees().prepare_log_sync(inode.subvol) {
            Ok(Some(io)) => io,
            Ok(None) => {
                // A chunk was allocated since this client logged (for the
                // log's own blocks, perhaps): the log may depend on it.
                self.log.full_commit_trans = trans;
                return Ok(LogAnswer::Commit("new chunk in this transaction"));
            }
            Err(e) => {
                // Some of the log's blocks may count as written already:
                // the log can no longer be trusted to be whole.
                self.log.full_commit_trans = trans;
                return Err(e);
            }
        };
        let s = self.log.subvols.entry(inode.subvol).or_default();
        let synced = s.log_transid;
        s.log_transid += 1;
        s.start_client = None;
        s.prev_multi_clients = s.multi_clients;
        self.cx.stats.log_syncs += 1;
        if !self.log.io.start() {
            return Err(Error::Internal(
                "log sync gate taken under the filesystem".into(),
            ));
        }
        Ok(LogAnswer::Go(LogSyncStep::Io(PendingLogSync::new(
            io,
            self.log.io.clone(),
            LogIoDone {
                subvol: inode.subvol,
                trans,
                log_transid: synced,
                ok: false,
            },
        ))))
    }
}

impl LogWriter<'_, '_> {
    /// btrfs_inode_in_log: logged in this transaction, and nothing changed
    /// since the log sync that holds it.
    fn in_synced_log(&mut self, l: Loc) -> Result<bool> {
        let t = self.cx.transid();
        let root_commit = self
            .log
            .subvols
            .get(&l.subvol)
            .map_or(0, |s| s.last_log_commit);
        let rt = self.cx.rt(l)?;
        let in_log = rt.logged_trans == t
            && rt.last_sub_trans <= rt.last_log_commit
            && rt.last_sub_trans <= root_commit;
        Ok(in_log && self.sync_pending(l)?.is_none())
    }

    /// The log sub-transaction the inode was last logged whole into, while
    /// its sync has not ended (one client's fsync logged it, another's
    /// asks): the kernel's second fsync waits on the inode lock for that
    /// sync, this one waits for it by ticket.
    fn sync_pending(&mut self, l: Loc) -> Result<Option<i64>> {
        let t = self.cx.transid();
        let durable = self.log.subvols.get(&l.subvol).map_or(0, |s| s.durable);
        let rt = self.cx.rt(l)?;
        Ok((rt.logged_into.0 == t && rt.logged_into.1 >= durable).then_some(rt.logged_into.1))
    }

    /// Whether the inode exists now.
    fn exists(&mut self, l: Loc) -> Result<bool> {
        Ok(crate::fs::inode::get_inode(self.cx.store, l.subvol, l.ino)?.is_some())
    }

    /// inode_logged for an inode that may be gone: its log tree says.
    fn logged_maybe_gone(&mut self, l: Loc) -> Result<bool> {
        if self.exists(l)? {
            return self.cx.inode_logged(l);
        }
        if !self.cx.store.log_trees().has_log(l.subvol) {
            return Ok(false);
        }
        Ok(self
            .cx
            .store
            .lookup(log_tree(l), &Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0))?
            .is_some())
    }

    /// need_log_inode: an unchanged directory, or an inode already logged
    /// in this transaction with nothing to copy again, needs nothing.
    fn need_log_inode(&mut self, l: Loc) -> Result<bool> {
        let t = self.cx.transid();
        let dir = is_dir(self.cx.item(l)?.mode.get());
        if dir && self.cx.rt(l)?.last_trans < t {
            return Ok(false);
        }
        if self.cx.inode_logged(l)? && !self.cx.rt(l)?.copy_everything {
            return Ok(false);
        }
        Ok(true)
    }

    /// btrfs_log_inode_parent.
    fn log_inode_parent(&mut self, l: Loc, mode: LogMode, ctx: &mut Ctx) -> LResult<Outcome> {
        let t = self.cx.transid();
        if !self.cx.opts.treelog {
            return Err(Stop::Commit("notreelog"));
        }
        let ri = self.cx.store.root_item(l.subvol)?;
        if ri.refs.get() == 0 {
            return Err(Stop::Commit("subvolume being deleted"));
        }
        if ri.generation.get() == t {
            return Err(Stop::Commit("subvolume created in this transaction"));
        }
        // An inode with no links left (unlinked while open, or O_TMPFILE)
        // is logged like any other (the kernel since 6.15): its item says
        // nlink 0, which replay skips, and the directories it lost its
        // names from are logged in full below (last_unlink_trans), so
        // replay drops those names and the inode goes with its last one.
        let it = self.cx.item(l)?;
        if !ctx.always_sync && self.in_synced_log(l)? {
            return Ok(Outcome::NoSync);
        }
        if self.cx.store.chunk_allocated() {
            self.log.full_commit_trans = t;
        }
        if self.log.full_commit_trans == t {
            return Err(Stop::Commit(
                "new chunk or failed logging in this transaction",
            ));
        }
        let me = std::thread::current().id();
        if self.cx.store.log_trees().start_log(l.subvol)? {
            let batch = self.log.subvols.get(&l.subvol).map_or(0, |s| s.log_batch);
            self.log.subvols.insert(
                l.subvol,
                SubvolLog {
                    log_batch: batch,
                    start_client: Some(me),
                    ..Default::default()
                },
            );
        } else {
            let s = self.log.subvols.entry(l.subvol).or_default();
            match s.start_client {
                None => {
                    s.start_client = Some(me);
                    s.multi_clients = false;
                }
                Some(c) if c != me => s.multi_clients = true,
                Some(_) => {}
            }
        }
        self.log_inode(l, mode, ctx)?;
        let rt = self.cx.rt(l)?;
        let (last_unlink, gen) = (rt.last_unlink_trans, it.generation.get());
        if is_reg(it.mode.get()) && gen < t && last_unlink < t {
            return Ok(Outcome::Sync);
        }
        let log_dentries = is_dir(it.mode.get()) && ctx.log_new_dentries;
        if last_unlink >= t {
            self.log_all_parents(l, ctx)?;
        }
        self.log_all_new_ancestors(l, ctx)?;
        if log_dentries {
            self.log_new_dir_dentries(l, ctx)?;
        }
        Ok(Outcome::Sync)
    }

    /// btrfs_log_inode.
    fn log_inode(&mut self, l: Loc, mode: LogMode, ctx: &mut Ctx) -> LResult<()> {
        let t = self.cx.transid();
        let it = self.cx.item(l)?;
        let m = it.mode.get();
        // A symlink's target is its data: always logged whole.
        let mode = if crate::fs::inode::is_symlink(m) {
            LogMode::All
        } else {
            mode
        };
        let dir = is_dir(m);
        let logged_before = self.cx.inode_logged(l)?;
        if dir && mode == LogMode::All && self.cx.rt(l)?.last_unlink_trans >= t {
            return Err(Stop::Commit(
                "directory lost an entry the log cannot follow",
            ));
        }
        let log = log_tree(l);
        // Logged as existing, a file carries the smaller of its logged and
        // current sizes, and an exists-form size of 0 tells replay to keep
        // the committed size. When that is what it would get and a full
        // logging earlier in this log transaction is in the log, the full
        // item stays: the exists form would undo what that fsync made
        // durable (a truncate to 0, or a size the file was truncated from
        // since). The kernel logs its in-memory item whenever the inode's
        // leaf is unchanged (its delayed inode not yet written) and loses
        // that fsync otherwise.
        let full_item = match (dir, mode, logged_before) {
            (false, LogMode::Exists, true) => {
                let now = self.cx.rt(l)?.i_size;
                self.cx
                    .store
                    .lookup(log, &Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0))?
                    .filter(|d| {
                        InodeItem::read_from_prefix(d).is_ok_and(|(x, _)| {
                            x.generation.get() != 0 && x.size.get().min(now) == 0
                        })
                    })
            }
            _ => None,
        };
        if dir {
            self.cx.rt(l)?.copy_everything = false;
            if logged_before {
                self.log_drop_items(log, l.ino, BTRFS_XATTR_ITEM_KEY)?;
            }
            self.log_copy_meta(l, mode, 0, ctx)?;
        } else {
            let i_size = self.cx.rt(l)?.i_size;
            let mut logged_isize = 0;
            if mode == LogMode::Exists && logged_before {
                // The size an earlier logging recorded, never more than now.
                logged_isize = match self
                    .cx
                    .store
                    .lookup(log, &Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0))?
                {
                    Some(d) => InodeItem::read_from_prefix(&d)
                        .map(|(x, _)| x.size.get().min(i_size))
                        .unwrap_or(0),
                    None => 0,
                };
            }
            let rt = self.cx.rt(l)?;
            if rt.full_sync {
                if mode == LogMode::Exists {
                    if logged_before {
                        self.log_drop_items(log, l.ino, BTRFS_XATTR_ITEM_KEY)?;
                    }
                    self.log_copy_meta(l, mode, logged_isize, ctx)?;
                } else {
                    rt.full_sync = false;
                    rt.copy_everything = false;
                    if logged_before {
                        self.log_drop_items(log, l.ino, u8::MAX)?;
                    }
                    self.log_copy_meta(l, mode, logged_isize, ctx)?;
                    self.log_extents_full(l)?;
                }
            } else if std::mem::take(&mut rt.copy_everything) || mode == LogMode::Exists {
                if logged_before {
                    self.log_drop_items(log, l.ino, BTRFS_XATTR_ITEM_KEY)?;
                }
                self.log_copy_meta(l, mode, logged_isize, ctx)?;
                if mode == LogMode::All {
                    self.log_changed_extents(l, logged_before)?;
                }
            } else {
                // The fast path: the inode item, the changed extents.
                self.log_inode_item(l, LogMode::All, 0)?;
                if self.cx.rt(l)?.logged_trans < t {
                    self.log_copy_xattrs(l)?;
                }
                self.log_changed_extents(l, logged_before)?;
            }
        }
        if let Some(item) = full_item {
            self.cx
                .store
                .update_item(log, &Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0), &item)?;
        }
        // Entries an earlier logging of the directory in this transaction
        // logged had their targets logged then: btrfs_log_get_delayed_items
        // skips delayed items already logged, so a target changed since
        // (an xattr, say) is not logged again through its entry.
        let logged_upto = if dir && mode == LogMode::All && !ctx.logging_new_delayed {
            Some(self.logged_dir_index(l, logged_before)?)
        } else {
            None
        };
        if dir && mode == LogMode::All {
            self.log_directory_changes(l, logged_before, ctx)?;
        }
        let new_delayed = match logged_upto {
            Some(after) => self.new_entries(l, after)?,
            None => Vec::new(),
        };
        let sub = self.log.subvols.get(&l.subvol).map_or(0, |s| s.log_transid);
        let rt = self.cx.rt(l)?;
        rt.logged_trans = t;
        if dir && mode == LogMode::All {
            rt.dir_logged_full_trans = t;
        }
        if !ctx.logging_new_name && mode == LogMode::All {
            rt.last_log_commit = rt.last_sub_trans;
            rt.logged_into = (t, sub);
        }
        if mode == LogMode::All {
            rt.last_reflink_trans = 0;
        }
        self.log_conflicting_inodes(l, ctx)?;
        self.log_new_delayed_dentries(l, new_delayed, ctx)
    }

    /// The entries a directory got in this transaction, as (index, target,
    /// is a directory): in the kernel they are delayed items until the
    /// transaction commits.
    fn new_entries(&mut self, dir: Loc, after: u64) -> Result<Vec<(Loc, bool)>> {
        let t = self.cx.transid();
        let items = self.cx.store.items_in(
            fs_tree(dir),
            Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, after.saturating_add(1)),
            Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
        )?;
        let mut out = Vec::new();
        for (k, data) in items {
            let entries = parse_dir_items(&data).map_err(|e| e.at(0, k))?;
            let Some(e) = entries.first() else { continue };
            let loc = Key::from(&e.item.location);
            if e.item.transid.get() != t || loc.ty == BTRFS_ROOT_ITEM_KEY {
                continue;
            }
            out.push((
                Loc::new(dir.subvol, loc.objectid),
                e.item.type_ == BTRFS_FT_DIR,
            ));
        }
        Ok(out)
    }

    /// log_new_delayed_dentries: a fully logged directory's entries made in
    /// this transaction are still delayed items in the kernel, and their
    /// targets are logged with it (as existing; directories in full), a
    /// new name's logging included, so replay finds an inode for every
    /// entry it puts back.
    fn log_new_delayed_dentries(
        &mut self,
        _dir: Loc,
        entries: Vec<(Loc, bool)>,
        ctx: &mut Ctx,
    ) -> LResult<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let saved = ctx.log_new_dentries;
        ctx.logging_new_delayed = true;
        let mut r = Ok(());
        for (target, is_dir) in entries {
            if !self.exists(target)? || !self.need_log_inode(target)? {
                continue;
            }
            ctx.log_new_dentries = false;
            r = self.log_inode(
                target,
                if is_dir {
                    LogMode::All
                } else {
                    LogMode::Exists
                },
                ctx,
            );
            if r.is_ok() && ctx.log_new_dentries {
                r = self.log_new_dir_dentries(target, ctx);
            }
            if r.is_err() {
                break;
            }
        }
        ctx.log_new_dentries = saved;
        ctx.logging_new_delayed = false;
        r
    }

    /// Delete every item of `ino` with type <= `max_type` from the log
    /// (drop_inode_items; with 255 all of them, as truncating the inode in
    /// the log does).
    fn log_drop_items(&mut self, log: TreeId, ino: u64, max_type: u8) -> Result<()> {
        let (lo, hi) = inode_range(ino, 0, max_type);
        for (k, _) in self.cx.store.items_in(log, lo, hi)? {
            self.cx.store.delete_item(log, &k)?;
        }
        Ok(())
    }

    /// The inode item as the log records it (fill_inode_item): "exists"
    /// gives generation 0 and the size an earlier logging recorded (replay
    /// then keeps an existing inode's own item); otherwise the inode as it
    /// is, with its in-memory size.
    fn log_inode_item(&mut self, l: Loc, mode: LogMode, logged_isize: u64) -> Result<()> {
        let t = self.cx.transid();
        let mut it = self.cx.item(l)?;
        match mode {
            LogMode::Exists => {
                it.generation.set(0);
                it.size.set(logged_isize);
            }
            LogMode::All => {
                if is_reg(it.mode.get()) {
                    let s = self.cx.rt(l)?.i_size;
                    it.size.set(s);
                }
            }
        }
        it.transid.set(t);
        it.block_group.set(0);
        self.cx.store.update_item(
            log_tree(l),
            &Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0),
            it.as_bytes(),
        )
    }

    /// Inode item, every name (checked for names another inode had at the
    /// last commit), every xattr (copy_inode_items_to_log).
    fn log_copy_meta(
        &mut self,
        l: Loc,
        mode: LogMode,
        logged_isize: u64,
        ctx: &mut Ctx,
    ) -> LResult<()> {
        self.log_inode_item(l, mode, logged_isize)?;
        let (lo, hi) = inode_range(l.ino, BTRFS_INODE_REF_KEY, BTRFS_INODE_EXTREF_KEY);
        let refs = self.cx.store.items_in(fs_tree(l), lo, hi)?;
        for (k, d) in refs {
            self.cx.store.update_item(log_tree(l), &k, &d)?;
            // Every ref item of every inode, new or old: a name another
            // inode held at the last commit makes that inode conflicting
            // (since the kernel's "always detect conflicting inodes when
            // logging inode refs", 6.19 and stable from 6.1).
            let names = ref_names(&k, &d)?;
            if let Some((other, parent)) = self.ref_name_override(l, &names)? {
                if other != ctx.inode.ino {
                    self.add_conflicting_inode(Loc::new(l.subvol, other), parent, ctx)?;
                }
            }
        }
        self.log_copy_xattrs(l)?;
        Ok(())
    }

    /// Every xattr of the inode: replay deletes those the log lacks.
    fn log_copy_xattrs(&mut self, l: Loc) -> Result<()> {
        let (lo, hi) = inode_range(l.ino, BTRFS_XATTR_ITEM_KEY, BTRFS_XATTR_ITEM_KEY);
        for (k, d) in self.cx.store.items_in(fs_tree(l), lo, hi)? {
            self.cx.store.update_item(log_tree(l), &k, &d)?;
        }
        Ok(())
    }

    /// One file extent item into the log, over whatever the log held in
    /// its range, with the checksums of its data when the transaction
    /// wrote it.
    fn log_one_extent(
        &mut self,
        l: Loc,
        key: Key,
        data: &[u8],
        drop_first: bool,
        datasum: bool,
    ) -> Result<()> {
        let log = log_tree(l);
        let ss = self.cx.store.sectorsize() as u64;
        let t = self.cx.transid();
        if drop_first {
            if let Some((s, e)) = crate::fs::extents::extent_span(ss, key.offset, data) {
                drop_extents_in(self.cx.store, log, l.ino, s, e)?;
            }
        }
        self.cx.store.update_item(log, &key, data)?;
        if let FileExtent::Disk { head, item } =
            parse_file_extent(data).map_err(|e| e.at(0, key))?
        {
            let b = item.disk_bytenr.get();
            if b != 0 && head.type_ == BTRFS_FILE_EXTENT_REG && head.generation.get() == t {
                self.cx
                    .store
                    .data()
                    .write_data_in(b, item.disk_num_bytes.get())?;
            }
            if datasum
                && b != 0
                && head.type_ == BTRFS_FILE_EXTENT_REG
                && head.generation.get() == t
            {
                let (start, len) = if head.compression != BTRFS_COMPRESS_NONE {
                    (b, item.disk_num_bytes.get())
                } else {
                    (b + item.offset.get(), item.num_bytes.get())
                };
                self.log_csums(l, start, len)?;
            }
        }
        Ok(())
    }

    /// The csum tree's checksums of `[start, start+len)` into the log, over
    /// any it held there (shared extents may have put some in already).
    fn log_csums(&mut self, l: Loc, start: u64, len: u64) -> Result<()> {
        let log = log_tree(l);
        let ss = self.cx.store.sectorsize() as u64;
        let sums = self.cx.store.csums().csum_lookup(start, len)?;
        self.cx.store.csums().csum_delete_in(log, start, len)?;
        let mut run_start = start;
        let mut run: Vec<u8> = Vec::new();
        for (i, c) in sums.iter().enumerate() {
            let at = start + i as u64 * ss;
            match c {
                Some(c) => {
                    if run.is_empty() {
                        run_start = at;
                    }
                    run.extend_from_slice(c);
                }
                None => {
                    if !run.is_empty() {
                        self.cx.store.csums().csum_insert_in(log, run_start, &run)?;
                        run.clear();
                    }
                }
            }
        }
        if !run.is_empty() {
            self.cx.store.csums().csum_insert_in(log, run_start, &run)?;
        }
        Ok(())
    }

    /// A hole item (btrfs_insert_hole_extent): replay drops the range.
    fn log_hole(&mut self, l: Loc, start: u64, len: u64) -> Result<()> {
        let t = self.cx.transid();
        let fe = FileExtentItem::new(
            BTRFS_FILE_EXTENT_REG,
            t,
            0,
            0,
            0,
            len,
            len,
            BTRFS_COMPRESS_NONE,
        );
        self.cx
            .store
            .update_item(log_tree(l), &extent_key(l.ino, start), fe.as_bytes())
    }

    /// The full-sync extents: those the transaction made or that lie at or
    /// past the end (all of them after a clone in this transaction), and
    /// with no-holes a hole item for every gap up to the end
    /// (copy_items, btrfs_log_prealloc_extents, btrfs_log_holes).
    fn log_extents_full(&mut self, l: Loc) -> Result<()> {
        let t = self.cx.transid();
        let ss = self.cx.store.sectorsize() as u64;
        let rt = self.cx.rt(l)?;
        let (i_size, reflinked) = (rt.i_size, rt.last_reflink_trans >= t);
        rt.modified.clear();
        let datasum = self.cx.datasum(l)?;
        let items = extents_in(self.cx.store, l.subvol, l.ino, 0, u64::MAX)?;
        let mut prev_end = 0u64;
        let mut holes = Vec::new();
        for (k, d) in &items {
            let gen =
                u64::from_le_bytes(d.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
            if gen == t || k.offset >= i_size || reflinked {
                self.log_one_extent(l, *k, d, false, datasum)?;
            }
            if let Some((s, e)) = crate::fs::extents::extent_span(ss, k.offset, d) {
                if s > prev_end {
                    holes.push((prev_end, s - prev_end));
                }
                prev_end = prev_end.max(e);
            }
        }
        if self.cx.no_holes() && i_size > 0 {
            let end = i_size.div_ceil(ss) * ss;
            if prev_end < end {
                holes.push((prev_end, end - prev_end));
            }
            for (s, len) in holes {
                if s < end {
                    self.log_hole(l, s, len.min(end - s))?;
                }
            }
        }
        Ok(())
    }

    /// The fast path's extents: in every range changed since the last
    /// logging, the items the transaction made and a hole item for every
    /// gap (btrfs_log_changed_extents); then prealloc past the end.
    fn log_changed_extents(&mut self, l: Loc, logged_before: bool) -> Result<()> {
        let t = self.cx.transid();
        let ss = self.cx.store.sectorsize() as u64;
        let datasum = self.cx.datasum(l)?;
        let rt = self.cx.rt(l)?;
        let i_size = rt.i_size;
        // Extent maps never overlap: neither do the ranges logged (two
        // overlapping changes would otherwise log overlapping items).
        // Extent maps cover whole sectors: so do the ranges (a range
        // recorded at a byte size, as a truncate's, would log a hole item
        // of unaligned length, which the kernel's tree checker refuses).
        let ranges = merge_ranges(
            std::mem::take(&mut rt.modified)
                .into_iter()
                .map(|(a, b)| (a / ss * ss, b.div_ceil(ss).saturating_mul(ss)))
                .collect(),
        );
        // Logged extent maps leave the changed list and merge with their
        // neighbours (btrfs_clear_em_logging's try_merge_map): cached
        // holes touching them join.
        for &(a, b) in &ranges {
            rt.join_hole_maps(a, b);
        }
        // Every changed range is logged whole, past the end of the file
        // too (a punch there leaves a hole extent map, which btrfs_log_
        // changed_extents logs over what an earlier fsync put in the log);
        // only prealloc extents at or past the end wait for
        // log_prealloc_extents.
        let mut logged_upto = 0u64;
        for (a, b) in ranges {
            if a >= b {
                continue;
            }
            let items = extents_in(self.cx.store, l.subvol, l.ino, a, b)?;
            let mut pos = a;
            for (k, d) in items {
                let Some((s, e)) = crate::fs::extents::extent_span(ss, k.offset, &d) else {
                    continue;
                };
                if s > pos {
                    self.log_gap(l, pos, s, logged_before)?;
                }
                pos = pos.max(e);
                if s < logged_upto {
                    continue;
                }
                let (gen, prealloc) = match parse_file_extent(&d).map_err(|e| e.at(0, k))? {
                    FileExtent::Inline { head, .. } => (head.generation.get(), false),
                    FileExtent::Disk { head, .. } => (
                        head.generation.get(),
                        head.type_ == BTRFS_FILE_EXTENT_PREALLOC,
                    ),
                };
                if gen < t || (prealloc && s >= i_size) {
                    continue;
                }
                self.log_one_extent(l, k, &d, logged_before, datasum)?;
                logged_upto = e;
            }
            if pos < b {
                self.log_gap(l, pos, b, logged_before)?;
            }
        }
        self.log_prealloc_extents(l)
    }

    /// A gap among the subvolume's extents in a changed range: a hole.
    fn log_gap(&mut self, l: Loc, s: u64, e: u64, logged_before: bool) -> Result<()> {
        if logged_before {
            drop_extents_in(self.cx.store, log_tree(l), l.ino, s, e)?;
        }
        self.log_hole(l, s, e - s)
    }

    /// Extents at or past the end of a preallocating file, which replay
    /// would otherwise cut off (btrfs_log_prealloc_extents).
    fn log_prealloc_extents(&mut self, l: Loc) -> Result<()> {
        if self.cx.item(l)?.flags.get() & BTRFS_INODE_PREALLOC == 0 {
            return Ok(());
        }
        let i_size = self.cx.rt(l)?.i_size;
        let ss = self.cx.store.sectorsize() as u64;
        let items = extents_in(self.cx.store, l.subvol, l.ino, i_size, u64::MAX)?;
        let mut truncate_at = i_size;
        let mut past = Vec::new();
        for (k, d) in items {
            if k.offset < i_size {
                // A prealloc extent across the end keeps its logged copy.
                if let Some((_, e)) = crate::fs::extents::extent_span(ss, k.offset, &d) {
                    truncate_at = truncate_at.max(e);
                }
                continue;
            }
            past.push((k, d));
        }
        let Some(first) = past.first().map(|(k, _)| k.offset) else {
            return Ok(());
        };
        let log = log_tree(l);
        // truncate_inode_items on the log: items from `from` on go, one
        // across it is cut there.
        let from = first.min(truncate_at);
        for (k, d) in extents_in_tree(self.cx.store, log, l.ino, from, u64::MAX)? {
            if k.offset >= from {
                self.cx.store.delete_item(log, &k)?;
            } else if let Some(cut) =
                // Cut at a sector boundary, as truncate_inode_items rounds
                // the kept length up (the tree checker wants it aligned).
                crate::format::file_extent::cut_to(
                    &d,
                    (from - k.offset).div_ceil(ss) * ss,
                )
            {
                self.cx.store.update_item(log, &k, &cut)?;
            }
        }
        for (k, d) in past {
            self.cx.store.update_item(log, &k, &d)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Directories

    /// log_directory_changes: the index entries this transaction added and
    /// the ranges in which replay deletes what the log lacks, leaf by leaf
    /// over the leaves this transaction changed.
    /// The highest index of `dir` logged in this transaction
    /// (update_last_dir_index_offset: found in the log when not known).
    fn logged_dir_index(&mut self, dir: Loc, logged_before: bool) -> Result<u64> {
        if self.cx.rt(dir)?.last_dir_index_offset == 0 {
            let last = if logged_before {
                self.cx
                    .store
                    .prev_item(
                        log_tree(dir),
                        &Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
                        &Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, 0),
                    )?
                    .map_or(1, |(k, _)| k.offset)
            } else {
                1
            };
            self.cx.rt(dir)?.last_dir_index_offset = last;
        }
        Ok(self.cx.rt(dir)?.last_dir_index_offset)
    }

    fn log_directory_changes(
        &mut self,
        dir: Loc,
        logged_before: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        self.logged_dir_index(dir, logged_before)?;
        let mut min_offset = 2u64;
        for _ in 0..(1 << 20) {
            let last = self.log_dir_items(dir, min_offset, ctx)?;
            if last == u64::MAX {
                return Ok(());
            }
            min_offset = last + 1;
        }
        Err(Error::corrupt_as(
            CorruptKind::Structure,
            "directory index ranges do not end",
            dir.ino,
        ))
    }

    /// log_dir_items from `min_offset`: returns the last index the pass
    /// covered (u64::MAX: the end).
    fn log_dir_items(&mut self, dir: Loc, min_offset: u64, ctx: &mut Ctx) -> Result<u64> {
        let t = self.cx.transid();
        let fs = fs_tree(dir);
        let is_index = |k: &Key| k.objectid == dir.ino && k.ty == BTRFS_DIR_INDEX_KEY;
        let mut last_old = min_offset - 1;
        let mut last_offset = u64::MAX;
        let lo = Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, 0);
        let start = Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, min_offset);
        let found = self
            .cx
            .store
            .search_forward(fs, &start, t)?
            .filter(is_index);
        let Some(first) = found else {
            // No changed leaf from here: deletions can only be past the
            // last entry.
            if let Some((k, _)) = self.cx.store.prev_item(
                fs,
                &Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
                &lo,
            )? {
                last_old = k.offset;
            }
            self.insert_dir_log_key(dir, last_old + 1, u64::MAX)?;
            return Ok(u64::MAX);
        };
        if first.offset > 0 {
            if let Some((k, _)) = self.cx.store.prev_item(
                fs,
                &Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, first.offset - 1),
                &lo,
            )? {
                last_old = k.offset;
            }
        }
        let mut cur = first;
        let mut batch: Vec<(Key, Vec<u8>)> = Vec::new();
        for _ in 0..(1 << 20) {
            let Some((_, items)) = self.cx.store.leaf_from(fs, &cur)? else {
                break;
            };
            let mut last_key = None;
            let mut left_dir = false;
            for (k, d) in items {
                if !is_index(&k) {
                    left_dir = true;
                    break;
                }
                last_key = Some(k);
                let e = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
                let Some(e) = e.first() else { continue };
                if e.item.transid.get() < t {
                    if k.offset > last_old + 1 {
                        self.insert_dir_log_key(dir, last_old + 1, k.offset - 1)?;
                    }
                    last_old = k.offset;
                } else if k.offset > self.cx.rt(dir)?.last_dir_index_offset {
                    if Key::from(&e.item.location).ty != BTRFS_ROOT_ITEM_KEY {
                        ctx.log_new_dentries = true;
                    }
                    batch.push((k, d.clone()));
                }
            }
            self.flush_dir_batch(dir, &mut batch)?;
            if left_dir {
                break;
            }
            let Some(lk) = last_key else { break };
            match self.cx.store.leaf_from(fs, &crate::trans::next_key(&lk))? {
                Some((gen, items)) => {
                    let Some((fk, _)) = items.first() else { break };
                    if !is_index(fk) {
                        break;
                    }
                    if gen != t {
                        last_offset = fk.offset - 1;
                        break;
                    }
                    cur = *fk;
                }
                None => break,
            }
        }
        if last_old < last_offset {
            self.insert_dir_log_key(dir, last_old + 1, last_offset)?;
        }
        Ok(last_offset)
    }

    /// Copy new index entries into the log (flush_dir_items_batch).
    fn flush_dir_batch(&mut self, dir: Loc, batch: &mut Vec<(Key, Vec<u8>)>) -> Result<()> {
        let (Some(first), Some(last)) = (
            batch.first().map(|(k, _)| k.offset),
            batch.last().map(|(k, _)| k.offset),
        ) else {
            return Ok(());
        };
        for (k, d) in batch.drain(..) {
            self.cx.store.update_item(log_tree(dir), &k, &d)?;
        }
        let rt = self.cx.rt(dir)?;
        rt.last_dir_index_offset = last;
        if rt.first_dir_index_to_log == 0 {
            rt.first_dir_index_to_log = first;
        }
        Ok(())
    }

    /// A DIR_LOG_INDEX range `[first, last]` (inclusive); ranges with the
    /// same start only grow (insert_dir_log_key).
    fn insert_dir_log_key(&mut self, dir: Loc, first: u64, last: u64) -> Result<()> {
        let log = log_tree(dir);
        let k = Key::new(dir.ino, BTRFS_DIR_LOG_INDEX_KEY, first);
        let end = match self.cx.store.lookup(log, &k)? {
            Some(d) => DirLogItem::read_from_prefix(&d)
                .map(|(x, _)| x.end.get().max(last))
                .unwrap_or(last),
            None => last,
        };
        let item = DirLogItem { end: end.into() };
        self.cx.store.update_item(log, &k, item.as_bytes())
    }

    /// log_new_dir_dentries: the targets of the entries a directory
    /// logging copied: files "exist", directories in full, breadth first.
    fn log_new_dir_dentries(&mut self, start: Loc, ctx: &mut Ctx) -> LResult<()> {
        let t = self.cx.transid();
        let mut queue = VecDeque::from([start]);
        let mut guard = 0usize;
        while let Some(d) = queue.pop_front() {
            guard += 1;
            if guard > 1 << 20 {
                return Err(Error::corrupt_as(
                    CorruptKind::Structure,
                    "directory tree does not end",
                    d.ino,
                )
                .into());
            }
            let from = self.cx.rt(d)?.first_dir_index_to_log;
            if from == 0 {
                continue;
            }
            let items = self.cx.store.items_in(
                log_tree(d),
                Key::new(d.ino, BTRFS_DIR_INDEX_KEY, from),
                Key::new(d.ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
            )?;
            let mut next = from;
            for (k, data) in items {
                next = k.offset + 1;
                let entries = parse_dir_items(&data).map_err(|e| e.at(0, k))?;
                let Some(e) = entries.first() else { continue };
                let loc = Key::from(&e.item.location);
                if e.item.transid.get() != t || loc.ty == BTRFS_ROOT_ITEM_KEY {
                    continue;
                }
                let target = Loc::new(d.subvol, loc.objectid);
                if !self.exists(target)? || !self.need_log_inode(target)? {
                    continue;
                }
                if e.item.type_ == BTRFS_FT_DIR {
                    ctx.log_new_dentries = false;
                    self.log_inode(target, LogMode::All, ctx)?;
                    if ctx.log_new_dentries {
                        queue.push_back(target);
                    }
                } else {
                    self.log_inode(target, LogMode::Exists, ctx)?;
                }
            }
            self.cx.rt(d)?.first_dir_index_to_log = next;
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Parents

    /// The first parent of an inode (its only one when it has one link).
    fn first_parent(&mut self, l: Loc) -> Result<Option<Loc>> {
        let links = crate::fs::names::links_of(self.cx.store, l.subvol, l.ino)?;
        Ok(links.first().map(|x| Loc::new(l.subvol, x.parent)))
    }

    /// Ancestors made in this transaction, from `dir` up, "exist"
    /// (log_new_ancestors): replay needs them to put the inode's names in.
    fn log_new_ancestors_from(&mut self, dir: Loc, ctx: &mut Ctx) -> LResult<()> {
        let t = self.cx.transid();
        let mut p = dir;
        for _ in 0..MAX_DEPTH {
            if !self.exists(p)? {
                return Err(Stop::Commit("an ancestor directory is gone"));
            }
            if self.cx.item(p)?.generation.get() >= t && self.need_log_inode(p)? {
                self.log_inode(p, LogMode::Exists, ctx)?;
            }
            if p.ino == ROOT_DIR {
                return Ok(());
            }
            match self.first_parent(p)? {
                Some(q) => p = q,
                None => return Err(Stop::Commit("an ancestor has no name")),
            }
        }
        Err(Error::corrupt_as(
            CorruptKind::Structure,
            "directory chain does not reach the root",
            dir.ino,
        )
        .into())
    }

    /// log_all_new_ancestors: through the inode's one parent, or through
    /// every parent of a hard-linked inode.
    fn log_all_new_ancestors(&mut self, l: Loc, ctx: &mut Ctx) -> LResult<()> {
        if l.ino == ROOT_DIR {
            return Ok(());
        }
        let it = self.cx.item(l)?;
        if it.nlink.get() == 0 {
            // The open file's dentry still has the directory it was
            // unlinked from as its parent (log_new_ancestors_fast).
            let from = self.cx.rt(l)?.unlinked_from;
            if from == 0 || !self.exists(Loc::new(l.subvol, from))? {
                return Ok(());
            }
            return self.log_new_ancestors_from(Loc::new(l.subvol, from), ctx);
        }
        if it.nlink.get() < 2 || is_dir(it.mode.get()) {
            return match self.first_parent(l)? {
                Some(p) => self.log_new_ancestors_from(p, ctx),
                None => Ok(()),
            };
        }
        let (lo, hi) = inode_range(l.ino, BTRFS_INODE_REF_KEY, BTRFS_INODE_EXTREF_KEY);
        let refs = self.cx.store.items_in(fs_tree(l), lo, hi)?;
        if refs.iter().any(|(k, _)| k.ty == BTRFS_INODE_EXTREF_KEY) {
            return Err(Stop::Commit("hard links in extended references"));
        }
        for (k, _) in refs {
            self.log_new_ancestors_from(Loc::new(l.subvol, k.offset), ctx)?;
        }
        Ok(())
    }

    /// btrfs_log_all_parents: after an unlink or rename away, every
    /// directory the inode had a name in at the last commit is logged in
    /// full, so replay drops the names it lost.
    fn log_all_parents(&mut self, l: Loc, ctx: &mut Ctx) -> LResult<()> {
        let (lo, hi) = inode_range(l.ino, BTRFS_INODE_REF_KEY, BTRFS_INODE_EXTREF_KEY);
        let mut committed: Vec<(u64, Vec<u8>, u64)> = Vec::new();
        for (k, d) in self
            .cx
            .store
            .committed()
            .committed_items_in(l.subvol, lo, hi)?
        {
            committed.extend(ref_entries(&k, &d)?);
        }
        let mut current: HashSet<(u64, Vec<u8>)> = HashSet::new();
        for (k, d) in self.cx.store.items_in(fs_tree(l), lo, hi)? {
            current.extend(ref_names(&k, &d)?);
        }
        let moved_dir = is_dir(self.cx.item(l)?.mode.get());
        // Key order, as the kernel walks the commit root's refs.
        let mut seen = HashSet::new();
        let parents: Vec<u64> = committed
            .iter()
            .map(|(p, _, _)| *p)
            .filter(|p| seen.insert(*p))
            .collect();
        for p in parents {
            let pl = Loc::new(l.subvol, p);
            if !self.exists(pl)? {
                return Err(Stop::Commit("an old parent directory is gone"));
            }
            // A parent logged only as existing because it was a
            // conflicting inode has none of its entries in the log: when
            // this inode is a directory that lost a name there and the
            // log does not record that name's deletion (the parent was
            // logged after the rename, so btrfs_log_new_name could not),
            // that parent is logged in full now (the kernel skips it as
            // already logged and writes a log it cannot replay: the
            // directory keeps both links). Otherwise it is skipped as the
            // kernel skips it: a recorded deletion takes the old name away
            // at replay, and a file's lost name is the kernel's to keep
            // (its own log keeps it). Logged as existing otherwise (a new
            // name's ancestor, a renamed directory), or with every name
            // this inode had there still in place (a link elsewhere marks
            // a file as if it lost one), it is skipped too.
            let t = self.cx.transid();
            let only_exists = moved_dir
                && self.cx.inode_logged(pl)?
                && {
                    let rt = self.cx.rt(pl)?;
                    rt.dir_logged_full_trans < t && rt.conflict_logged_trans == t
                }
                && self.lost_name_unrecorded(pl, &committed, &current)?;
            if self.need_log_inode(pl)? || only_exists {
                ctx.log_new_dentries = false;
                self.log_inode(pl, LogMode::All, ctx)?;
                if ctx.log_new_dentries {
                    self.log_new_dir_dentries(pl, ctx)?;
                }
            }
        }
        Ok(())
    }

    /// Whether `dir` is the parent of a name in `committed` that is not in
    /// `current` and whose deletion no DIR_LOG_INDEX range of the log
    /// records.
    fn lost_name_unrecorded(
        &mut self,
        dir: Loc,
        committed: &[(u64, Vec<u8>, u64)],
        current: &HashSet<(u64, Vec<u8>)>,
    ) -> Result<bool> {
        for (p, name, index) in committed {
            if *p != dir.ino || current.contains(&(*p, name.clone())) {
                continue;
            }
            let lo = Key::new(dir.ino, BTRFS_DIR_LOG_INDEX_KEY, 0);
            let hi = Key::new(dir.ino, BTRFS_DIR_LOG_INDEX_KEY, *index);
            let mut recorded = false;
            for (k, d) in self.cx.store.items_in(log_tree(dir), lo, hi)? {
                let end = DirLogItem::read_from_prefix(&d)
                    .map(|(x, _)| x.end.get())
                    .unwrap_or(0);
                if k.offset <= *index && *index <= end {
                    recorded = true;
                    break;
                }
            }
            if !recorded {
                return Ok(true);
            }
        }
        Ok(false)
    }

    // ------------------------------------------------------------------
    // Name conflicts (the 2016 change)

    /// btrfs_check_ref_name_override over the names of one ref item: the
    /// first of them that the last commit has in its directory decides.
    /// Held then by this inode: no conflict; by another: (that inode, the
    /// directory). A name that was a subvolume's cannot be logged over.
    fn ref_name_override(
        &mut self,
        l: Loc,
        names: &[(u64, Vec<u8>)],
    ) -> LResult<Option<(u64, u64)>> {
        for (parent, name) in names {
            let k = Key::new(
                *parent,
                BTRFS_DIR_ITEM_KEY,
                crate::format::dir::name_hash(name),
            );
            let Some(d) = self.cx.store.committed().committed_lookup(l.subvol, &k)? else {
                continue;
            };
            let entries = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
            let Some(e) = entries.iter().find(|e| e.name == name.as_slice()) else {
                continue;
            };
            let loc = Key::from(&e.item.location);
            if loc.ty != BTRFS_INODE_ITEM_KEY {
                return Err(Stop::Commit("name was a subvolume's"));
            }
            return Ok((loc.objectid != l.ino).then_some((loc.objectid, *parent)));
        }
        Ok(None)
    }

    fn add_conflicting_inode(&mut self, other: Loc, parent: u64, ctx: &mut Ctx) -> LResult<()> {
        if !self.cx.switches.log_conflicting_inodes {
            return Err(Stop::Commit("name taken from a renamed or unlinked inode"));
        }
        if ctx.conflicts_seen >= MAX_CONFLICT_INODES {
            return Err(Stop::Commit("too many conflicting inodes"));
        }
        if !self.exists(other)? {
            // Gone: replay drops its entry when it adds ours, unless it was
            // a directory (which may have held subvolumes): then its
            // parent is logged.
            let was_dir = match self
                .cx
                .store
                .committed()
                .committed_lookup(other.subvol, &Key::new(other.ino, BTRFS_INODE_ITEM_KEY, 0))?
            {
                Some(d) => InodeItem::read_from_prefix(&d)
                    .map(|(x, _)| is_dir(x.mode.get()))
                    .unwrap_or(false),
                None => false,
            };
            if was_dir {
                ctx.conflicts_seen += 1;
                ctx.conflicts.push_back((other.ino, parent));
            }
            return Ok(());
        }
        if !self.need_log_inode(other)? {
            return Ok(());
        }
        if !self.can_log_conflicting_inode(other)? {
            return Err(Stop::Commit(
                "a conflicting directory moved in this transaction",
            ));
        }
        ctx.conflicts_seen += 1;
        ctx.conflicts.push_back((other.ino, parent));
        Ok(())
    }

    /// can_log_conflicting_inode: a directory moved to another parent in
    /// this transaction cannot be logged as existing (its new name would
    /// be added at replay while the old one stays: two links).
    fn can_log_conflicting_inode(&mut self, l: Loc) -> Result<bool> {
        let t = self.cx.transid();
        Ok(!is_dir(self.cx.item(l)?.mode.get()) || self.cx.rt(l)?.last_unlink_trans < t)
    }

    /// log_conflicting_inodes: by the outermost logging only.
    fn log_conflicting_inodes(&mut self, l: Loc, ctx: &mut Ctx) -> LResult<()> {
        if ctx.logging_conflict_inodes || ctx.conflicts.is_empty() {
            return Ok(());
        }
        let saved = ctx.log_new_dentries;
        ctx.logging_conflict_inodes = true;
        let r = (|| {
            while let Some((ino, parent)) = ctx.conflicts.pop_front() {
                let other = Loc::new(l.subvol, ino);
                if !self.exists(other)? {
                    // Gone (a directory): its old parent is logged in full,
                    // so replay records the deletion, with the targets of
                    // the parent's new entries.
                    let p = Loc::new(l.subvol, parent);
                    if !self.exists(p)? {
                        return Err(Stop::Commit("a conflicting inode's parent is gone"));
                    }
                    if !self.can_log_conflicting_inode(p)? {
                        return Err(Stop::Commit(
                            "a conflicting directory's parent lost an entry",
                        ));
                    }
                    ctx.log_new_dentries = false;
                    self.log_inode(p, LogMode::All, ctx)?;
                    self.cx.stats.conflicting_inodes_logged += 1;
                    if ctx.log_new_dentries {
                        self.log_new_dir_dentries(p, ctx)?;
                    }
                } else if self.need_log_inode(other)? {
                    self.log_inode(other, LogMode::Exists, ctx)?;
                    self.cx.rt(other)?.conflict_logged_trans = self.cx.transid();
                    self.cx.stats.conflicting_inodes_logged += 1;
                }
            }
            Ok(())
        })();
        ctx.log_new_dentries = saved;
        ctx.logging_conflict_inodes = false;
        ctx.conflicts.clear();
        r
    }

    // ------------------------------------------------------------------
    // Name changes of logged inodes

    /// Bring the log up to date with the name changes made since the last
    /// logging (the kernel makes these edits as the unlink or rename
    /// happens; none can be seen before the next log sync, which comes
    /// after this).
    fn apply_log_ops(&mut self, changes: Vec<NameChange>) -> LResult<()> {
        for op in changes {
            match op {
                NameChange::Unlink {
                    dir,
                    name,
                    index,
                    inode,
                } => {
                    if !self.cx.store.log_trees().has_log(dir.subvol) {
                        continue;
                    }
                    if self.logged_maybe_gone(inode)? {
                        self.log_del_inode_ref(inode, dir.ino, &name)?;
                    }
                    if self.logged_maybe_gone(dir)? {
                        self.log_del_dir_entry(dir, &name, index)?;
                    }
                }
                NameChange::NewName {
                    inode,
                    old,
                    parent: _,
                } => {
                    if !self.cx.store.log_trees().has_log(inode.subvol) {
                        continue;
                    }
                    if !self.exists(inode)? {
                        // Gone since (its new name unlinked too): at the
                        // rename the old name left the old directory's log
                        // and the inode was logged with its new name, which
                        // the unlink then removed; the old name is all
                        // that is left to take out of the log.
                        if let Some((odir, oname, oidx)) = &old {
                            let t = self.cx.transid();
                            if self.exists(*odir)?
                                && self.cx.inode_logged(*odir)?
                                && self.cx.rt(*odir)?.logged_trans == t
                                && !self.log_del_dir_entry(*odir, oname, *oidx)?
                            {
                                self.insert_dir_log_key(*odir, *oidx, *oidx)?;
                            }
                            self.log_del_inode_ref(inode, odir.ino, oname)?;
                        }
                        continue;
                    }
                    let t = self.cx.transid();
                    if !self.cx.inode_logged(inode)? {
                        let Some((odir, _, _)) = &old else { continue };
                        if !self.logged_maybe_gone(*odir)? {
                            continue;
                        }
                    }
                    if let Some((odir, oname, oidx)) = &old {
                        if self.exists(*odir)?
                            && self.cx.inode_logged(*odir)?
                            && self.cx.rt(*odir)?.logged_trans == t
                            && !self.log_del_dir_entry(*odir, oname, *oidx)?
                        {
                            self.insert_dir_log_key(*odir, *oidx, *oidx)?;
                        }
                    }
                    let mut ctx = Ctx::new(inode);
                    ctx.logging_new_name = true;
                    match self.log_inode_parent(inode, LogMode::Exists, &mut ctx) {
                        Ok(_) => {}
                        Err(Stop::Commit(_)) => self.log.full_commit_trans = t,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Remove one name from the inode's logged reference item
    /// (btrfs_del_inode_ref on the log).
    fn log_del_inode_ref(&mut self, inode: Loc, parent: u64, name: &[u8]) -> Result<()> {
        let log = log_tree(inode);
        let k = Key::new(inode.ino, BTRFS_INODE_REF_KEY, parent);
        if let Some(d) = self.cx.store.lookup(log, &k)? {
            let entries = parse_inode_refs(&d).map_err(|e| e.at(0, k))?;
            if entries.iter().any(|e| e.name == name) {
                let mut out = Vec::new();
                for e in entries.iter().filter(|e| e.name != name) {
                    crate::format::inode::encode_inode_ref(&mut out, e.index, e.name);
                }
                if out.is_empty() {
                    self.cx.store.delete_item(log, &k)?;
                } else {
                    self.cx.store.update_item(log, &k, &out)?;
                }
                return Ok(());
            }
        }
        let k = Key::new(
            inode.ino,
            BTRFS_INODE_EXTREF_KEY,
            crate::format::dir::extref_hash(parent, name),
        );
        if let Some(d) = self.cx.store.lookup(log, &k)? {
            let entries = parse_inode_extrefs(&d).map_err(|e| e.at(0, k))?;
            let mut out = Vec::new();
            for e in entries
                .iter()
                .filter(|e| !(e.parent == parent && e.name == name))
            {
                crate::format::inode::encode_inode_extref(&mut out, e.parent, e.index, e.name);
            }
            if out.is_empty() {
                self.cx.store.delete_item(log, &k)?;
            } else {
                self.cx.store.update_item(log, &k, &out)?;
            }
        }
        Ok(())
    }

    /// Delete a logged index entry of `dir` (del_logged_dentry); whether
    /// the log held it.
    fn log_del_dir_entry(&mut self, dir: Loc, name: &[u8], index: u64) -> Result<bool> {
        let log = log_tree(dir);
        let k = Key::new(dir.ino, BTRFS_DIR_INDEX_KEY, index);
        let Some(d) = self.cx.store.lookup(log, &k)? else {
            return Ok(false);
        };
        let entries = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
        if !entries.iter().any(|e| e.name == name) {
            return Ok(false);
        }
        self.cx.store.delete_item(log, &k)?;
        Ok(true)
    }
}

/// `ranges` sorted, with overlapping or touching ones joined.
fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The (parent, name) pairs of one INODE_REF or INODE_EXTREF item.
fn ref_names(k: &Key, d: &[u8]) -> Result<Vec<(u64, Vec<u8>)>> {
    Ok(ref_entries(k, d)?
        .into_iter()
        .map(|(p, n, _)| (p, n))
        .collect())
}

/// The (parent, name, dir index) of every name in an INODE_REF or
/// INODE_EXTREF item.
fn ref_entries(k: &Key, d: &[u8]) -> Result<Vec<(u64, Vec<u8>, u64)>> {
    Ok(match k.ty {
        BTRFS_INODE_REF_KEY => parse_inode_refs(d)
            .map_err(|e| e.at(0, *k))?
            .iter()
            .map(|e| (k.offset, e.name.to_vec(), e.index))
            .collect(),
        _ => parse_inode_extrefs(d)
            .map_err(|e| e.at(0, *k))?
            .iter()
            .map(|e| (e.parent, e.name.to_vec(), e.index))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn changed_ranges_are_joined() {
        assert_eq!(
            super::merge_ranges(vec![
                (303104, 401408),
                (262144, 344064),
                (0, 4096),
                (4096, 8192)
            ]),
            vec![(0, 8192), (262144, 401408)]
        );
    }
}
