//! File data on its way to the device: the write queue that joins new
//! data into long runs ([`super::dataq`]), whose data the next writes are
//! and whether they skip the queue, and the writer thread that carries
//! runs to the device off the filesystem lock ([`super::datawrite`]).
//! Data, not trees: the store maps logical addresses and counts bytes;
//! everything about when a run reaches the device is decided here.

use super::dataq::{self, DataQueue, Owner};
use super::datawrite::{DataWait, DataWriter};
use crate::io::BlockDevice;
use crate::Result;
use std::sync::Arc;

/// The data write path of a mounted filesystem.
pub struct DataIo {
    dev: Arc<dyn BlockDevice>,
    /// New data queued in long sequential runs until the queue fills, a
    /// commit, or an fsync that needs it.
    queue: DataQueue,
    /// Whose data the next writes are.
    owner: Owner,
    /// The next writes go out at once (an fsync's own data, ahead of the
    /// queue).
    direct: bool,
    /// Carries queued runs to the device off the filesystem lock, when
    /// clients share the filesystem or a script cannot crash.
    writer: Option<DataWriter>,
}

impl DataIo {
    /// The data path of `dev`, writing on the caller's thread.
    pub fn new(dev: Arc<dyn BlockDevice>) -> DataIo {
        DataIo {
            dev,
            queue: DataQueue::default(),
            owner: (0, 0),
            direct: false,
            writer: None,
        }
    }

    /// Whose data the following writes are; `direct`: they go to the
    /// device at once instead of joining the queue.
    pub fn set_context(&mut self, owner: Owner, direct: bool) {
        self.owner = owner;
        self.direct = direct;
    }

    /// Carry queued runs to the device on a thread of their own from now on.
    pub fn start_writer(&mut self) -> Result<()> {
        if self.writer.is_none() {
            self.writer = Some(DataWriter::start(self.dev.clone())?);
        }
        Ok(())
    }

    /// Back to writing runs on the caller's thread, once every submitted
    /// one is written. A failed write keeps the writer (and its sticky
    /// error, which every later flush of data reports).
    pub fn stop_writer(&mut self) -> Result<()> {
        if let Some(w) = &self.writer {
            w.wait_all()?;
        }
        self.writer = None;
        Ok(())
    }

    /// A wait for the data writes submitted so far (None: there is no
    /// writer thread, every write is done when it returns).
    pub fn wait_handle(&self) -> Option<DataWait> {
        self.writer.as_ref().map(|w| w.waiter())
    }

    /// Sends `runs` to the device (or the writer), counting their bytes
    /// into `written`.
    fn write_runs(&mut self, runs: Vec<dataq::Run>, written: &mut u64) -> Result<()> {
        for r in runs {
            *written += r.data.len() as u64;
            match &self.writer {
                Some(w) => w.submit(r.phys, r.data),
                None => {
                    self.dev.write_at(r.phys, &r.data)?;
                    self.queue.recycle(r);
                }
            }
        }
        Ok(())
    }

    /// Write `data` at physical `phys` of space allocated in this
    /// transaction: queued (combined with its neighbours), or at once.
    pub fn write_new(&mut self, phys: u64, data: &[u8], written: &mut u64) -> Result<()> {
        if self.direct {
            if let Some(w) = &self.writer {
                w.wait_overlapping(phys, phys + data.len() as u64)?;
            }
            *written += data.len() as u64;
            return self.dev.write_at(phys, data);
        }
        if let Some(w) = &self.writer {
            for v in w.take_spare() {
                self.queue.give_spare(v);
            }
        }
        let out = self.queue.push(phys, data, self.owner);
        self.write_runs(out, written)
    }

    /// Overwrite data in place (nodatacow and preallocated extents): goes
    /// straight to the device, after any queued write to the same place.
    pub fn write_in_place(&mut self, phys: u64, data: &[u8], written: &mut u64) -> Result<()> {
        let end = phys + data.len() as u64;
        let hit = self.queue.take_overlapping(phys, end);
        self.write_runs(hit, written)?;
        if let Some(w) = &self.writer {
            w.wait_overlapping(phys, end)?;
        }
        *written += data.len() as u64;
        self.dev.write_at(phys, data)
    }

    /// Whether a read of the device may miss data still queued or being
    /// written.
    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty() || self.writer.is_some()
    }

    /// Lays what is queued or being written at physical `phys` over `buf`
    /// (read from the device).
    pub fn overlay(&self, phys: u64, buf: &mut [u8]) {
        if let Some(w) = &self.writer {
            w.overlay(phys, buf);
        }
        self.queue.overlay(phys, buf);
    }

    /// Write every queued run, and wait until all are on the device.
    pub fn flush(&mut self, written: &mut u64) -> Result<()> {
        let all = self.queue.take_all();
        self.write_runs(all, written)?;
        match &self.writer {
            Some(w) => w.wait_all(),
            None => Ok(()),
        }
    }

    /// Whether nothing is queued.
    pub fn queue_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Write the queued runs meeting physical `[phys, end)`.
    pub fn write_overlapping(&mut self, phys: u64, end: u64, written: &mut u64) -> Result<()> {
        let hit = self.queue.take_overlapping(phys, end);
        self.write_runs(hit, written)
    }

    /// When the queued batch holding `owner`'s data goes (None: none
    /// queued, or it may go now).
    pub fn batch_due(&self, owner: Owner) -> Option<std::time::Instant> {
        self.queue.batch_due(owner)
    }

    /// Whether the queued batch may go now (see [`dataq`]).
    pub fn batch_open(&self) -> bool {
        self.queue.batch_open()
    }

    /// Write the queued runs holding `owner`'s data (what an fsync of it
    /// waits for).
    pub fn write_owner(&mut self, owner: Owner, written: &mut u64) -> Result<()> {
        let mine = self.queue.take_owner(owner);
        self.write_runs(mine, written)
    }
}
