//! Data writes carried out by a thread of their own, off the filesystem
//! lock, when several clients share the filesystem: the queued runs of new
//! data (see [`super::dataq`]) go to the device while the clients go on,
//! as the kernel's writeback submits bios and the flusher does not hold
//! the inode or the transaction while the disk takes them.
//!
//! Invariants, which make the writes look to the engine as if they were
//! made at submission:
//! - jobs reach the device in submission order (one writer, FIFO), so two
//!   writes to one place end as they would;
//! - a read overlays every job not yet completed, oldest first, so it sees
//!   every write submitted before it;
//! - whoever flushes the device to make data durable first waits for the
//!   jobs submitted before (a log sync for those before it was prepared,
//!   a commit for all);
//! - a write that must not wait in line (in place, or an fsync's own data
//!   going at once) first waits for the queued jobs it overlaps;
//! - a failed write is sticky: every later wait reports it (as a mapping's
//!   writeback error fails every later fsync), none is dropped;
//! - at most `IN_FLIGHT` bytes wait (a submission past it waits for
//!   room), so memory stays bounded.

use crate::io::BlockDevice;
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Most bytes submitted and not yet written.
const IN_FLIGHT: usize = 16 << 20;
/// Written buffers kept for the data queue to reuse (each up to a run).
const SPARE: usize = 6;

/// Where part of a job's bytes go: `len` bytes from `from` in its data to
/// one copy of one stripe unit, or into a RAID5/6 chunk with its parity.
pub struct Target {
    /// Offset of the piece in the job's data.
    pub from: usize,
    /// Length of the piece.
    pub len: usize,
    /// Where it goes.
    pub to: Destination,
}

/// The place a [`Target`]'s bytes are written.
pub enum Destination {
    /// One copy: physical offset `phys` of `dev`.
    Copy {
        /// The device the copy is on.
        dev: Arc<dyn BlockDevice>,
        /// The device's name for an error, empty on a single-device
        /// filesystem.
        name: Arc<str>,
        /// Physical byte offset on `dev`.
        phys: u64,
    },
    /// Logical address `logical` of a RAID5/6 chunk: written with the
    /// parity of its rows by the filesystem's one parity writer, when the
    /// job's turn comes (so the rows' other data is what the jobs before
    /// left on the devices).
    Parity {
        /// The logical address of the piece.
        logical: u64,
        /// The writer, the chunk and the devices.
        sink: Arc<ParitySink>,
    },
}

/// What a parity [`Destination`] needs to write: the filesystem's parity
/// writer, the chunk's mapping and the devices present.
pub struct ParitySink {
    /// The filesystem's one writer of RAID5/6 rows.
    pub writer: Arc<crate::chunk::rmw::ParityWriter>,
    /// The chunk the piece is in (alone).
    pub chunk: crate::chunk::ChunkMap,
    /// The devices present.
    pub devs: Arc<dyn crate::chunk::rmw::DeviceLookup + Send + Sync>,
    /// Stripes on missing devices are left unwritten.
    pub degraded: bool,
}

impl Target {
    /// A target of one copy.
    pub fn copy(
        dev: Arc<dyn BlockDevice>,
        name: Arc<str>,
        phys: u64,
        from: usize,
        len: usize,
    ) -> Target {
        Target {
            from,
            len,
            to: Destination::Copy { dev, name, phys },
        }
    }

    /// Write this target's piece of `data`; an error names the device.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        let piece = data.get(self.from..self.from + self.len).ok_or_else(|| {
            Error::Internal(format!(
                "data target {}+{} outside its run of {} bytes",
                self.from,
                self.len,
                data.len()
            ))
        })?;
        match &self.to {
            Destination::Copy { dev, name, phys } => {
                dev.write_at(*phys, piece).map_err(|e| match e {
                    Error::Io { context, err } if !name.is_empty() => Error::Io {
                        context: format!("{name}: {context}"),
                        err,
                    },
                    e => e,
                })
            }
            Destination::Parity { logical, sink } => sink
                .writer
                .write(
                    &sink.chunk,
                    &[(*logical, piece)],
                    sink.devs.as_ref(),
                    sink.degraded,
                )
                .map(|_| ()),
        }
    }
}

/// A run of data for logical address `at` and the copies it is written to.
struct Job {
    seq: u64,
    at: u64,
    data: Arc<Vec<u8>>,
    targets: Vec<Target>,
}

impl Job {
    fn end(&self) -> u64 {
        self.at.saturating_add(self.data.len() as u64)
    }
}

#[derive(Default)]
struct State {
    /// Jobs not yet completed, oldest first; the front one may be being
    /// written now (it stays here until it is).
    jobs: VecDeque<Job>,
    bytes: usize,
    submitted: u64,
    completed: u64,
    /// The first failed write, as (OS error kind, message).
    failed: Option<(std::io::ErrorKind, String)>,
    stop: bool,
    spare: Vec<Vec<u8>>,
}

struct Shared {
    state: Mutex<State>,
    /// The writer has work (or should stop).
    work: Condvar,
    /// A job completed.
    done: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::util::sync::lock(&self.state)
    }

    fn wait_done<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        crate::util::sync::wait(&self.done, g)
    }

    fn wait_for(&self, seq: u64) -> Result<()> {
        let mut s = self.state();
        while s.completed < seq && s.failed.is_none() {
            s = self.wait_done(s);
        }
        match &s.failed {
            Some((kind, msg)) => Err(Error::Io {
                context: "data write".into(),
                err: std::io::Error::new(*kind, msg.clone()),
            }),
            None => Ok(()),
        }
    }

    fn run(&self) {
        loop {
            let (seq, targets, data) = {
                let mut s = self.state();
                loop {
                    if let Some(j) = s.jobs.front_mut() {
                        // The targets leave the job: only the writer uses them.
                        break (j.seq, std::mem::take(&mut j.targets), j.data.clone());
                    }
                    if s.stop {
                        return;
                    }
                    s = crate::util::sync::wait(&self.work, s);
                }
            };
            let r = targets.iter().try_for_each(|t| t.write(&data));
            drop(targets);
            let mut s = self.state();
            if let Some(j) = s.jobs.pop_front() {
                s.bytes -= j.data.len();
                drop(j);
            }
            s.completed = seq;
            if let Err(e) = r {
                if s.failed.is_none() {
                    let kind = match &e {
                        Error::Io { err, .. } => err.kind(),
                        _ => std::io::ErrorKind::Other,
                    };
                    s.failed = Some((kind, e.to_string()));
                }
            }
            if let Ok(v) = Arc::try_unwrap(data) {
                if s.spare.len() < SPARE {
                    s.spare.push(v);
                }
            }
            self.done.notify_all();
        }
    }
}

/// The writer thread and its queue.
pub struct DataWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Waits for the jobs submitted before it was made (a log sync takes one
/// along to wait before its flush, off the filesystem lock).
pub struct DataWait {
    shared: Arc<Shared>,
    seq: u64,
}

impl DataWait {
    /// Block until every job submitted before this wait was made is written.
    /// Fails with the writer's sticky error if any write failed, even one
    /// submitted later.
    pub fn wait(&self) -> Result<()> {
        self.shared.wait_for(self.seq)
    }
}

impl DataWriter {
    /// Spawn the writer thread (`btrkit-data`), with an empty queue.
    pub fn start() -> Result<DataWriter> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("btrkit-data".into())
            .spawn(move || s.run())
            .map_err(|e| Error::Io {
                context: "starting the data writer".into(),
                err: e,
            })?;
        Ok(DataWriter {
            shared,
            thread: Some(thread),
        })
    }

    /// Queue `data`, for logical address `at`, to be written to `targets`.
    pub fn submit(&self, at: u64, data: Vec<u8>, targets: Vec<Target>) {
        if data.is_empty() {
            return;
        }
        let mut s = self.shared.state();
        while s.bytes > 0 && s.bytes + data.len() > IN_FLIGHT && s.failed.is_none() {
            s = self.shared.wait_done(s);
        }
        s.submitted += 1;
        let seq = s.submitted;
        s.bytes += data.len();
        s.jobs.push_back(Job {
            seq,
            at,
            data: Arc::new(data),
            targets,
        });
        self.shared.work.notify_one();
    }

    /// A wait for everything submitted so far.
    pub fn waiter(&self) -> DataWait {
        DataWait {
            shared: self.shared.clone(),
            seq: self.shared.state().submitted,
        }
    }

    /// Wait until everything submitted so far is written.
    pub fn wait_all(&self) -> Result<()> {
        self.waiter().wait()
    }

    /// Wait until the jobs meeting logical `[at, end)` are written.
    pub fn wait_overlapping(&self, at: u64, end: u64) -> Result<()> {
        let last = {
            let s = self.shared.state();
            s.jobs
                .iter()
                .filter(|j| j.at < end && at < j.end())
                .map(|j| j.seq)
                .max()
        };
        match last {
            Some(seq) => self.shared.wait_for(seq),
            None => Ok(()),
        }
    }

    /// Copy what jobs not yet completed hold for logical `[at, at+len)`
    /// over `buf` (read from the devices), oldest first.
    pub fn overlay(&self, at: u64, buf: &mut [u8]) {
        let end = at.saturating_add(buf.len() as u64);
        let s = self.shared.state();
        for j in s.jobs.iter().filter(|j| j.at < end && at < j.end()) {
            let (a, b) = (at.max(j.at), end.min(j.end()));
            buf[(a - at) as usize..(b - at) as usize]
                .copy_from_slice(&j.data[(a - j.at) as usize..(b - j.at) as usize]);
        }
    }

    /// Buffers the writer is done with.
    pub fn take_spare(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.shared.state().spare)
    }
}

impl Drop for DataWriter {
    /// Every submitted job is written before the thread ends.
    fn drop(&mut self) {
        self.shared.state().stop = true;
        self.shared.work.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;

    fn to(dev: &Arc<MemDevice>, phys: u64, len: usize) -> Vec<Target> {
        vec![Target::copy(dev.clone(), "".into(), phys, 0, len)]
    }

    #[test]
    fn writes_land_in_order_and_reads_see_them_first() {
        let mem = Arc::new(MemDevice::new(vec![0; 1 << 20]));
        let w = DataWriter::start().unwrap_or_else(|e| panic!("{e}"));
        for i in 0..64u8 {
            let at = 4096 * (i as u64 % 8);
            w.submit(at, vec![i; 4096], to(&mem, at, 4096));
            let mut b = vec![0u8; 4096];
            mem.read_at(4096 * (i as u64 % 8), &mut b)
                .unwrap_or_else(|e| panic!("{e}"));
            w.overlay(4096 * (i as u64 % 8), &mut b);
            assert!(b.iter().all(|&x| x == i), "read after write {i}");
        }
        w.wait_all().unwrap_or_else(|e| panic!("{e}"));
        for slot in 0..8u64 {
            let mut b = vec![0u8; 4096];
            mem.read_at(4096 * slot, &mut b)
                .unwrap_or_else(|e| panic!("{e}"));
            // The last of the writes to each slot: 56..64.
            assert!(b.iter().all(|&x| x as u64 == 56 + slot));
        }
    }

    #[test]
    fn a_failed_write_fails_every_later_wait() {
        let mem = Arc::new(MemDevice::new(vec![0; 8192]));
        let w = DataWriter::start().unwrap_or_else(|e| panic!("{e}"));
        w.submit(1 << 30, vec![1; 4096], to(&mem, 1 << 30, 4096));
        assert!(w.wait_all().is_err());
        w.submit(0, vec![1; 4096], to(&mem, 0, 4096));
        assert!(w.wait_all().is_err(), "sticky");
    }

    #[test]
    fn one_job_goes_to_every_copy() {
        let (a, b) = (
            Arc::new(MemDevice::new(vec![0; 1 << 16])),
            Arc::new(MemDevice::new(vec![0; 1 << 16])),
        );
        let w = DataWriter::start().unwrap_or_else(|e| panic!("{e}"));
        let data: Vec<u8> = (0..8192u32).map(|i| (i / 4096) as u8 + 1).collect();
        let mut t = to(&a, 4096, 8192);
        t.extend(to(&b, 0, 4096));
        t.push(Target::copy(b.clone(), "b".into(), 32768, 4096, 4096));
        w.submit(1 << 40, data, t);
        w.wait_all().unwrap_or_else(|e| panic!("{e}"));
        let read = |d: &MemDevice, at: u64| {
            let mut v = vec![0u8; 4096];
            d.read_at(at, &mut v).unwrap_or_else(|e| panic!("{e}"));
            v
        };
        assert_eq!(read(&a, 4096), vec![1; 4096]);
        assert_eq!(read(&a, 8192), vec![2; 4096]);
        assert_eq!(read(&b, 0), vec![1; 4096]);
        assert_eq!(read(&b, 32768), vec![2; 4096]);
    }
}
