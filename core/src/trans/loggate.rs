//! A log sync's I/O without the filesystem: the writes of one log sync
//! (its blocks, a flush, the superblock, a flush) run on the syncing
//! client's thread while the other clients go on writing and logging into
//! the next log sub-transaction, so their fsyncs batch into the next sync
//! (btrfs_sync_log holds only the log mutexes through its I/O).
//!
//! Invariants: at most one log sync's I/O runs at a time (a later
//! superblock must never be overtaken by an earlier one); a commit waits
//! for it before writing its own superblocks; what a log sync made durable
//! is recorded in the filesystem only after its last flush returned, so no
//! fsync is answered before its log is on disk.

use super::LogSyncIo;
use crate::Result;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// How a log sync's I/O ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogIoDone {
    /// The subvolume whose log the sync wrote.
    pub subvol: u64,
    /// The transaction the log belongs to.
    pub trans: u64,
    /// The log sub-transaction the sync made durable.
    pub log_transid: i64,
    /// Whether every write and flush of the sync succeeded.
    pub ok: bool,
}

#[derive(Debug, Default)]
struct GateState {
    in_flight: bool,
    /// The last finished sync, until the filesystem takes note of it.
    finished: Option<LogIoDone>,
}

/// The one log sync whose I/O may be running outside the filesystem.
#[derive(Debug, Default)]
pub struct LogIoGate {
    state: Mutex<GateState>,
    idle: Condvar,
}

impl LogIoGate {
    fn state(&self) -> MutexGuard<'_, GateState> {
        crate::util::sync::lock(&self.state)
    }

    /// Whether a log sync's I/O is running now.
    pub fn busy(&self) -> bool {
        self.state().in_flight
    }

    /// Claim the gate for a log sync; false when one is running.
    pub fn start(&self) -> bool {
        let mut s = self.state();
        if s.in_flight {
            return false;
        }
        s.in_flight = true;
        true
    }

    fn finish(&self, done: LogIoDone) {
        let mut s = self.state();
        s.in_flight = false;
        s.finished = Some(done);
        self.idle.notify_all();
    }

    /// Wait until no log sync's I/O runs.
    pub fn wait_idle(&self) {
        let mut s = self.state();
        while s.in_flight {
            s = crate::util::sync::wait(&self.idle, s);
        }
    }

    /// The finished sync not yet taken note of.
    pub fn take_finished(&self) -> Option<LogIoDone> {
        self.state().finished.take()
    }
}

/// A prepared log sync holding the gate: run it (without the filesystem),
/// then the filesystem takes note of how it ended. Dropped without running,
/// it releases the gate as a failed sync.
pub struct PendingLogSync {
    io: Option<LogSyncIo>,
    gate: Arc<LogIoGate>,
    done: LogIoDone,
}

impl PendingLogSync {
    pub(crate) fn new(io: LogSyncIo, gate: Arc<LogIoGate>, done: LogIoDone) -> PendingLogSync {
        PendingLogSync {
            io: Some(io),
            gate,
            done,
        }
    }

    /// Do the sync's writes (blocks, flush, superblock, flush) on this thread,
    /// then release the gate, recording whether they succeeded.
    pub fn run(mut self) -> Result<()> {
        let r = match self.io.take() {
            Some(io) => io.run(),
            None => Ok(()),
        };
        self.gate.finish(LogIoDone {
            ok: r.is_ok(),
            ..self.done
        });
        r
    }
}

impl Drop for PendingLogSync {
    fn drop(&mut self) {
        if self.io.is_some() {
            self.gate.finish(LogIoDone {
                ok: false,
                ..self.done
            });
        }
    }
}
