//! The data write queue: data written to new extents waits here, combined
//! into long sequential runs, until the queue is full, a commit writes
//! everything, or an fsync needs one file's data on disk (then only the
//! runs holding that file's data go, unless the 2009 behaviour is asked
//! for and everything queued goes first). Runs remember which files'
//! data they hold.
//!
//! The queue is also the batch a writer that did not ask for its data to
//! go at once waits on: it goes when the block layer of the 2009 result
//! would have unplugged it, 3 ms after its oldest run was queued or once
//! it holds 4 runs (unplug_delay, unplug_thresh). Nobody waits on
//! background data, so the queue otherwise keeps it until it fills and
//! combines more.

use crate::util::hash::FastMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Whose data a write is: (subvolume, inode).
pub type Owner = (u64, u64);

/// Bytes in one combined run.
const RUN_LIMIT: usize = 4 << 20;
/// Bytes queued before the oldest runs are written. Small: what waits
/// here is not being written yet, and a background writeback of the
/// whole dirty limit at once would otherwise leave the disk idle while
/// the queue fills (the device's own queue, write-behind where there is
/// one, is where writes wait while the disk is busy).
const QUEUE_LIMIT: usize = 4 << 20;
/// Written runs' buffers kept for reuse (a run's buffer grows to a few
/// MiB; a fresh one faults its pages in again).
const SPARE_RUNS: usize = 4;
/// How long the oldest queued run waits for others to join its batch.
const UNPLUG_DELAY: Duration = Duration::from_millis(3);
/// Runs that make a batch go at once.
const UNPLUG_THRESH: usize = 4;

/// Contiguous file data queued for one logical range, up to
/// 4 MiB, combined from writes that each started where the previous ended.
pub struct Run {
    /// Logical byte address where the run goes (mapped to its copies when written).
    pub at: u64,
    /// The bytes to write at `at`.
    pub data: Vec<u8>,
    owners: FastMap<Owner, ()>,
    queued: Instant,
}

impl Run {
    fn end(&self) -> u64 {
        self.at + self.data.len() as u64
    }
}

/// The queue of data [`Run`]s not yet submitted to the device, oldest first,
/// bounded at 4 MiB in total (see the module docs).
#[derive(Default)]
pub struct DataQueue {
    runs: VecDeque<Run>,
    bytes: usize,
    spare: Vec<Vec<u8>>,
}

impl DataQueue {
    /// Queue `data` for `at`; returns the runs that must be written now
    /// to keep the queue within its limit (oldest first).
    pub fn push(&mut self, at: u64, data: &[u8], owner: Owner) -> Vec<Run> {
        match self.runs.back_mut() {
            Some(r) if r.end() == at && r.data.len() + data.len() <= RUN_LIMIT => {
                r.data.extend_from_slice(data);
                r.owners.insert(owner, ());
            }
            _ => {
                let mut v = self.spare.pop().unwrap_or_default();
                v.clear();
                v.extend_from_slice(data);
                let mut owners = FastMap::default();
                owners.insert(owner, ());
                self.runs.push_back(Run {
                    at,
                    data: v,
                    owners,
                    queued: Instant::now(),
                });
            }
        }
        self.bytes += data.len();
        let mut out = Vec::new();
        while self.bytes > QUEUE_LIMIT && self.runs.len() > 1 {
            if let Some(r) = self.take_front() {
                out.push(r);
            }
        }
        out
    }

    fn take_front(&mut self) -> Option<Run> {
        let r = self.runs.pop_front()?;
        self.bytes -= r.data.len();
        Some(r)
    }

    /// A written run's buffer, for the next run to fill.
    pub fn give_spare(&mut self, v: Vec<u8>) {
        if self.spare.len() < SPARE_RUNS {
            self.spare.push(v);
        }
    }

    /// Every queued run, oldest first.
    pub fn take_all(&mut self) -> Vec<Run> {
        self.bytes = 0;
        self.runs.drain(..).collect()
    }

    /// The runs holding data of `owner`.
    pub fn take_owner(&mut self, owner: Owner) -> Vec<Run> {
        let (mine, rest): (Vec<Run>, Vec<Run>) = self
            .runs
            .drain(..)
            .partition(|r| r.owners.contains_key(&owner));
        self.runs = rest.into();
        self.bytes = self.runs.iter().map(|r| r.data.len()).sum();
        mine
    }

    /// The runs meeting `[at, end)`.
    pub fn take_overlapping(&mut self, at: u64, end: u64) -> Vec<Run> {
        // Most calls meet nothing: leave the queue as it is then.
        if !self.runs.iter().any(|r| r.at < end && at < r.end()) {
            return Vec::new();
        }
        let (hit, rest): (Vec<Run>, Vec<Run>) = self
            .runs
            .drain(..)
            .partition(|r| r.at < end && at < r.end());
        self.runs = rest.into();
        self.bytes = self.runs.iter().map(|r| r.data.len()).sum();
        hit
    }

    /// Keep a written run's buffer for reuse.
    pub fn recycle(&mut self, r: Run) {
        self.give_spare(r.data);
    }

    /// Copy queued bytes of `[at, at + buf.len())` over `buf`.
    pub fn overlay(&self, at: u64, buf: &mut [u8]) {
        let end = at + buf.len() as u64;
        for r in &self.runs {
            let (s, e) = (at.max(r.at), end.min(r.end()));
            if s < e {
                buf[(s - at) as usize..(e - at) as usize]
                    .copy_from_slice(&r.data[(s - r.at) as usize..(e - r.at) as usize]);
            }
        }
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// When the batch holding `owner`'s data goes, if that is still to
    /// come (None: it holds none, or it may go now).
    pub fn batch_due(&self, owner: Owner) -> Option<Instant> {
        if !self.runs.iter().any(|r| r.owners.contains_key(&owner)) {
            return None;
        }
        self.due().filter(|t| *t > Instant::now())
    }

    /// The batch may go now.
    pub fn batch_open(&self) -> bool {
        self.due().is_some_and(|t| t <= Instant::now())
    }

    fn due(&self) -> Option<Instant> {
        let front = self.runs.front()?;
        if self.runs.len() >= UNPLUG_THRESH {
            return Some(front.queued);
        }
        Some(front.queued + UNPLUG_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_combine_and_split_by_owner() {
        let mut q = DataQueue::default();
        assert!(q.push(0, &[1; 4096], (5, 257)).is_empty());
        assert!(q.push(4096, &[2; 4096], (5, 258)).is_empty());
        assert!(q.push(1 << 20, &[3; 4096], (5, 259)).is_empty());
        let mut b = [0u8; 8192];
        q.overlay(0, &mut b);
        assert_eq!((b[0], b[4096]), (1, 2));
        // 258's data shares a run with 257's: both go; 259 stays.
        let mine = q.take_owner((5, 258));
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].data.len(), 8192);
        assert!(!q.is_empty());
        assert_eq!(q.take_overlapping(0, 1 << 20).len(), 0);
        assert_eq!(q.take_all().len(), 1);
    }

    #[test]
    fn batch_waits_for_the_unplug_delay_or_threshold() {
        let mut q = DataQueue::default();
        assert!(q.batch_due((5, 257)).is_none());
        assert!(!q.batch_open());
        q.push(0, &[1; 4096], (5, 257));
        let queued = q.runs[0].queued;
        assert_eq!(q.due(), Some(queued + UNPLUG_DELAY));
        assert!(q.batch_due((5, 258)).is_none(), "holds none of 258's data");
        std::thread::sleep(UNPLUG_DELAY);
        assert!(q.batch_due((5, 257)).is_none());
        assert!(q.batch_open());
        q.take_all();
        // Four runs (not contiguous) open the batch at once.
        for i in 0..UNPLUG_THRESH as u64 {
            q.push(i << 20, &[2; 4096], (5, 300 + i));
        }
        assert_eq!(q.due(), Some(q.runs[0].queued));
        assert!(q.batch_open());
        assert!(q.batch_due((5, 300)).is_none());
    }

    #[test]
    fn queue_stays_bounded() {
        let mut q = DataQueue::default();
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0;
        for i in 0..40u64 {
            written += q.push(i * (2 << 20), &chunk, (5, 300 + i)).len();
        }
        assert!(written >= 20, "{written}");
        assert!(q.bytes <= QUEUE_LIMIT);
    }
}
