//! Several clients (threads) on one filesystem, their fsyncs batched into
//! shared log syncs as btrfs_sync_log batches the writers of one log
//! sub-transaction: a client logs its inode, lets go of the filesystem so
//! others can log theirs, then syncs the log; whoever syncs first makes all
//! of them durable and the rest find their sub-transaction synced.

use super::writer::{FsyncTicket, LogSyncStep};
use crate::fs::{Filesystem, Loc};
use crate::Result;
use std::sync::{Mutex, MutexGuard};

/// One scheduler tick of the kernel the benchmarks compare with (HZ=250),
/// what btrfs_sync_log sleeps for other log writers to join.
const LOG_BATCH_TICK: std::time::Duration = std::time::Duration::from_millis(4);
/// Ticks a log sync waits at most while fsyncs keep joining (the kernel's
/// loop has no bound; with 32 dbench clients every tick brings another
/// fsync, so the bound is the batch window). Each client that waits for a
/// sub-transaction's sync looks, and the first whose batch stopped growing
/// (or who reached the bound) syncs it. Four ticks, 16 ms, keep flushes
/// per fsync under the kernel's on the three benchmarks with more
/// throughput than eight (BENCHMARKS.md, run of 2026-12-02 08:00).
const LOG_BATCH_MAX_TICKS: usize = 4;

pub struct SharedFs {
    fs: Mutex<Filesystem>,
}

impl SharedFs {
    pub fn new(mut fs: Filesystem) -> SharedFs {
        // Data runs go to the device off the lock while clients share it;
        // a writer thread that cannot start leaves them written in line.
        let _ = fs.store.start_data_writer();
        SharedFs { fs: Mutex::new(fs) }
    }

    /// The filesystem, for one operation at a time. A client that panicked
    /// holding it leaves it as it was at the panic.
    pub fn lock(&self) -> MutexGuard<'_, Filesystem> {
        match self.fs.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// fsync from one client: log under the lock, give the others a
    /// chance to log into the same sub-transaction, then sync it (or find
    /// it synced by one of them).
    pub fn fsync(&self, l: Loc, datasync: bool, range: Option<(u64, u64)>) -> Result<()> {
        let ticket = self.lock().fsync_prepare(l, datasync, range)?;
        if ticket == FsyncTicket::Done {
            return Ok(());
        }
        std::thread::yield_now();
        self.finish(ticket)
    }

    /// The log sync a ticket needs: its I/O runs without the filesystem,
    /// so the other clients write and log into the next sub-transaction
    /// meanwhile; a client whose sub-transaction is being synced by
    /// another waits for that sync's end and finds it durable.
    fn finish(&self, ticket: FsyncTicket) -> Result<()> {
        // btrfs_sync_log's batching: while other clients' fsyncs keep
        // coming, sleep a tick and look again (bounded here, so a steady
        // stream of fsyncs cannot hold a sync back for long).
        let mut last = None;
        for _ in 0..LOG_BATCH_MAX_TICKS {
            match self.lock().log_batch_pending(ticket) {
                Some(b) if last != Some(b) => last = Some(b),
                _ => break,
            }
            std::thread::sleep(LOG_BATCH_TICK);
        }
        loop {
            let (step, gate) = {
                let mut fs = self.lock();
                (fs.log_sync_begin(ticket)?, fs.log.io.clone())
            };
            match step {
                LogSyncStep::Done => return Ok(()),
                LogSyncStep::Wait => gate.wait_idle(),
                LogSyncStep::Io(p) => {
                    let r = p.run();
                    if r.is_err() {
                        self.lock().absorb_log_io();
                    }
                    return r;
                }
            }
        }
    }

    /// pwrite on an O_SYNC / O_DSYNC descriptor from one client: the
    /// write and its logging under the lock, the log sync batched.
    pub fn write_sync(&self, l: Loc, off: u64, data: &[u8], datasync: bool) -> Result<()> {
        let ticket = {
            let mut fs = self.lock();
            fs.write(l, off, data)?;
            fs.fsync_prepare(
                l,
                datasync,
                Some((off, off.saturating_add(data.len() as u64))),
            )?
        };
        if ticket == FsyncTicket::Done {
            return Ok(());
        }
        std::thread::yield_now();
        self.finish(ticket)
    }

    /// The filesystem for one caller again: its data writes are carried
    /// out in line from now on, once the submitted ones are written (a
    /// failed one stays to be reported by the next flush of data).
    pub fn into_inner(self) -> Filesystem {
        let mut fs = match self.fs.into_inner() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        let _ = fs.store.stop_data_writer();
        fs
    }
}
