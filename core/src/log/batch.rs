//! Several clients (threads) on one filesystem, their fsyncs batched into
//! shared log syncs as btrfs_sync_log batches the writers of one log
//! sub-transaction: a client logs its inode, lets go of the filesystem so
//! others can log theirs, then syncs the log; whoever syncs first makes all
//! of them durable and the rest find their sub-transaction synced.

use crate::fs::{Filesystem, Loc};
use crate::fs::{FsyncTicket, LogSyncStep};
use crate::Result;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One scheduler tick of the kernel the benchmarks compare with (HZ=250),
/// what btrfs_sync_log sleeps for other log writers to join.
const LOG_BATCH_TICK: Duration = Duration::from_millis(4);
/// Ticks a log sync waits at most while fsyncs keep joining (the kernel's
/// loop has no bound; with 32 dbench clients every tick brings another
/// fsync, so the bound is the batch window). Each client that waits for a
/// sub-transaction's sync looks, and the first whose batch stopped growing
/// (or who reached the bound) syncs it; a window also ends as soon as
/// every seated client waits for the sync, since nobody is left to join.
/// Four ticks, 16 ms, keep flushes per fsync under the kernel's on the
/// three benchmarks with more throughput than eight (BENCHMARKS.md, runs
/// of 2026-12-02 07:16 and 07:21).
const LOG_BATCH_MAX_TICKS: usize = 4;

/// A [`Filesystem`] shared by client threads whose fsyncs batch into shared
/// log syncs: logging happens under the lock, the log sync's I/O and its
/// batching wait outside it.
pub struct SharedFs {
    fs: Mutex<Filesystem>,
    seats: SeatBoard,
}

/// Key of one log sub-transaction's sync: (subvolume, transaction, log
/// sub-transaction).
type SyncKey = (u64, u64, i64);

/// Whoever holds a filesystem that clients share: the log sync of a
/// batched fsync asks it for the filesystem for its short steps and runs
/// its I/O and its waits without it. [`SharedFs`] is one; a read-write
/// mount, whose lock holds more than the filesystem, is another.
pub trait FsHolder {
    /// Run `f` on the filesystem, alone; an error when it is gone (a
    /// client panicked on it, or a failed commit stopped it).
    fn with_fs<R>(&self, f: impl FnOnce(&mut Filesystem) -> Result<R>) -> Result<R>;
}

/// Who may still join a log sync: the clients that took a seat, and how
/// many of them wait for each sub-transaction's sync. When every seated
/// client waits for the same one, no fsync can join it any more and its
/// batching window ends at once. With nobody seated (clients that come
/// and go, as a mount's) every window runs its ticks, as the kernel's.
pub struct SeatBoard {
    state: Mutex<Seats>,
    /// Signalled when a client starts waiting for a log sync or leaves.
    changed: Condvar,
    /// Ticks a log sync's batching window lasts at most (0: no window; a
    /// sync still batches the fsyncs that logged while the one before it
    /// ran).
    max_ticks: usize,
}

impl Default for SeatBoard {
    fn default() -> SeatBoard {
        SeatBoard::with_window(LOG_BATCH_MAX_TICKS)
    }
}

#[derive(Default)]
struct Seats {
    seated: usize,
    waiting: HashMap<SyncKey, usize>,
}

/// A client's place at the filesystem, for as long as it runs a workload.
pub struct Seat<'a> {
    board: &'a SeatBoard,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.board.state().seated -= 1;
        self.board.changed.notify_all();
    }
}

/// A client waiting for one sub-transaction's sync, counted while it does.
struct Waiting<'a> {
    board: &'a SeatBoard,
    key: SyncKey,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut s = self.board.state();
        if let Some(n) = s.waiting.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.waiting.remove(&self.key);
            }
        }
    }
}

impl SeatBoard {
    /// A board whose log syncs wait at most `max_ticks` ticks for more
    /// fsyncs to join (0: they go at once).
    pub fn with_window(max_ticks: usize) -> SeatBoard {
        SeatBoard {
            state: Mutex::default(),
            changed: Condvar::new(),
            max_ticks,
        }
    }

    fn state(&self) -> MutexGuard<'_, Seats> {
        crate::util::sync::lock(&self.state)
    }

    fn seat(&self) -> Seat<'_> {
        self.state().seated += 1;
        Seat { board: self }
    }

    fn wait_for(&self, key: SyncKey) -> Waiting<'_> {
        *self.state().waiting.entry(key).or_default() += 1;
        self.changed.notify_all();
        Waiting { board: self, key }
    }

    /// Sleep `tick`, or less when every seated client comes to wait for
    /// the sync of `key` meanwhile (true then; never with nobody seated).
    fn tick_or_all_waiting(&self, key: SyncKey, tick: Duration) -> bool {
        let deadline = Instant::now() + tick;
        let mut s = self.state();
        loop {
            if s.seated > 0 && s.waiting.get(&key).copied().unwrap_or(0) >= s.seated {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = crate::util::sync::wait_timeout(&self.changed, s, deadline - now);
        }
    }
}

impl SharedFs {
    /// Share `fs`; starts the store's data writer thread so data runs go to the
    /// device off the lock.
    pub fn new(mut fs: Filesystem) -> SharedFs {
        // Data runs go to the device off the lock while clients share it;
        // a writer thread that cannot start leaves them written in line.
        let _ = fs.store.data().start_data_writer();
        SharedFs {
            fs: Mutex::new(fs),
            seats: SeatBoard::default(),
        }
    }

    /// A seat for a client thread of a workload, given up when dropped.
    /// Log syncs stop waiting for more fsyncs once every seated client
    /// waits for them; with no client seated they wait out their window.
    pub fn seat(&self) -> Seat<'_> {
        self.seats.seat()
    }

    /// The filesystem, for one operation at a time. A client that panicked
    /// holding it leaves it as it was at the panic.
    pub fn lock(&self) -> MutexGuard<'_, Filesystem> {
        crate::util::sync::lock(&self.fs)
    }

    /// fsync from one client: log under the lock, give the others a
    /// chance to log into the same sub-transaction, then sync it (or find
    /// it synced by one of them).
    pub fn fsync(&self, l: Loc, datasync: bool, range: Option<(u64, u64)>) -> Result<()> {
        let ticket = self.lock().fsync_path().fsync_prepare(l, datasync, range)?;
        if ticket == FsyncTicket::Done {
            return Ok(());
        }
        std::thread::yield_now();
        sync_logged(self, &self.seats, ticket)
    }

    /// pwrite on an O_SYNC / O_DSYNC descriptor from one client: the
    /// write and its logging under the lock, the log sync batched.
    pub fn write_sync(&self, l: Loc, off: u64, data: &[u8], datasync: bool) -> Result<()> {
        let ticket = {
            let mut fs = self.lock();
            fs.write(l, off, data)?;
            fs.fsync_path().fsync_prepare(
                l,
                datasync,
                Some((off, off.saturating_add(data.len() as u64))),
            )?
        };
        if ticket == FsyncTicket::Done {
            return Ok(());
        }
        std::thread::yield_now();
        sync_logged(self, &self.seats, ticket)
    }

    /// The filesystem for one caller again: its data writes are carried
    /// out in line from now on, once the submitted ones are written (a
    /// failed one stays to be reported by the next flush of data).
    pub fn into_inner(self) -> Filesystem {
        let mut fs = match self.fs.into_inner() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        let _ = fs.store.data().stop_data_writer();
        fs
    }
}

impl FsHolder for SharedFs {
    fn with_fs<R>(&self, f: impl FnOnce(&mut Filesystem) -> Result<R>) -> Result<R> {
        f(&mut self.lock())
    }
}

/// The log sync a ticket of [`crate::fs::FsyncPath::fsync_prepare`]
/// needs: its I/O runs without the filesystem, so the other clients write
/// and log into the next sub-transaction meanwhile; a client whose
/// sub-transaction is being synced by another waits for that sync's end
/// and finds it durable.
pub fn sync_logged<H: FsHolder>(holder: &H, seats: &SeatBoard, ticket: FsyncTicket) -> Result<()> {
    let FsyncTicket::LogSync {
        inode,
        trans,
        log_transid,
    } = ticket
    else {
        return Ok(());
    };
    let key = (inode.subvol, trans, log_transid);
    let _waiting = seats.wait_for(key);
    let mut ticks = seats.max_ticks;
    loop {
        batch_window(holder, seats, ticket, key, &mut ticks);
        let (step, gate) =
            holder.with_fs(|fs| Ok((fs.fsync_path().log_sync_begin(ticket)?, fs.log_io_gate())))?;
        match step {
            LogSyncStep::Done => return Ok(()),
            LogSyncStep::Wait => {
                gate.wait_idle();
                // btrfs_sync_log waits for the previous sync before it
                // batches: the clients that sync returned get a tick to
                // log into this one, even past the bound.
                ticks = ticks.max(seats.max_ticks.min(1));
            }
            LogSyncStep::Io(p) => {
                let r = p.run();
                if r.is_err() {
                    let _ = holder.with_fs(|fs| {
                        fs.fsync_path().absorb_log_io();
                        Ok(())
                    });
                }
                return r;
            }
        }
    }
}

/// btrfs_sync_log's batching: while other clients' fsyncs keep joining the
/// ticket's sub-transaction, sleep a tick and look again, spending at
/// most `ticks` (so a steady stream of fsyncs cannot hold a sync back for
/// long), and no longer once every seated client waits for this sync.
fn batch_window<H: FsHolder>(
    holder: &H,
    seats: &SeatBoard,
    ticket: FsyncTicket,
    key: SyncKey,
    ticks: &mut usize,
) {
    let mut last = None;
    while *ticks > 0 {
        match holder.with_fs(|fs| Ok(fs.fsync_path().log_batch_pending(ticket))) {
            Ok(Some(b)) if last != Some(b) => last = Some(b),
            _ => return,
        }
        if seats.tick_or_all_waiting(key, LOG_BATCH_TICK) {
            return;
        }
        *ticks -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_window_ends_when_every_seated_client_waits_for_its_sync() {
        let board = SeatBoard::default();
        let key = (5, 7, 2);
        let (_a, _b) = (board.seat(), board.seat());
        let w1 = board.wait_for(key);
        // One of two seated clients waits: the other may still join.
        assert!(!board.tick_or_all_waiting(key, Duration::from_millis(1)));
        // Waiting for another sub-transaction's sync does not count.
        let other = board.wait_for((5, 7, 1));
        assert!(!board.tick_or_all_waiting(key, Duration::from_millis(1)));
        drop(other);
        std::thread::scope(|s| {
            let t = s.spawn(|| board.tick_or_all_waiting(key, LONG));
            // The second client comes to wait: the window ends at once,
            // long before its tick.
            let _w2 = board.wait_for(key);
            assert!(t.join().unwrap());
        });
        // Its waiters gone, the sync's count goes with them.
        drop(w1);
        assert!(board.state().waiting.is_empty());
    }

    #[test]
    fn a_client_leaving_ends_a_window_the_rest_all_wait_for() {
        let board = SeatBoard::default();
        let key = (5, 7, 2);
        let a = board.seat();
        let _b = board.seat();
        let _w = board.wait_for(key);
        std::thread::scope(|s| {
            let t = s.spawn(|| board.tick_or_all_waiting(key, LONG));
            drop(a);
            assert!(t.join().unwrap());
        });
    }

    #[test]
    fn with_nobody_seated_a_window_runs_its_tick() {
        let board = SeatBoard::default();
        let key = (5, 7, 2);
        let _w = board.wait_for(key);
        assert!(!board.tick_or_all_waiting(key, Duration::from_millis(1)));
    }
}
