//! File data on its way to the devices: the write queue that joins new
//! data into long runs ([`super::dataq`]), whose data the next writes are
//! and whether they skip the queue, and the writer thread that carries
//! runs to the devices off the filesystem lock ([`super::datawrite`]).
//! Data, not trees: the store counts bytes; everything about when a run
//! reaches the devices is decided here.
//!
//! Runs are kept by logical address and mapped through the chunk map only
//! when they are written: one run becomes a write to every copy of every
//! stripe unit it covers, on whichever devices hold them (DUP twice on one
//! device, RAID1 once per device, RAID0/RAID10 unit by unit). Reads that
//! must see queued data overlay by logical address too.

use super::dataq::{self, DataQueue, Owner};
use super::datawrite::{DataWait, DataWriter, Destination, ParitySink, Target};
use crate::chunk::rmw::{DeviceLookup, ParityWriter};
use crate::chunk::ChunkMap;
use crate::io::BlockDevice;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The devices present, by devid, with their names for errors.
struct DevMap(BTreeMap<u64, (Arc<dyn BlockDevice>, Arc<str>)>);

impl DeviceLookup for DevMap {
    fn device(&self, devid: u64) -> Option<&dyn BlockDevice> {
        self.0.get(&devid).map(|d| d.0.as_ref())
    }
}

/// The data write path of a mounted filesystem.
pub struct DataIo {
    /// The devices present, by devid, with their names for errors (empty
    /// names on a single-device filesystem).
    devs: Arc<DevMap>,
    /// The filesystem's one writer of RAID5/6 rows.
    parity: Arc<ParityWriter>,
    /// Opened degraded: a copy on a missing device is not written (a piece
    /// with no copy on a present device still fails).
    degraded: bool,
    /// New data queued in long sequential runs until the queue fills, a
    /// commit, or an fsync that needs it.
    queue: DataQueue,
    /// Whose data the next writes are.
    owner: Owner,
    /// The next writes go out at once (an fsync's own data, ahead of the
    /// queue).
    direct: bool,
    /// Carries queued runs to the devices off the filesystem lock, when
    /// clients share the filesystem or a script cannot crash.
    writer: Option<DataWriter>,
}

impl DataIo {
    /// The data path of the devices `devs` (devid, device, name), writing
    /// on the caller's thread; RAID5/6 rows through `parity`.
    pub fn new(
        devs: Vec<(u64, Arc<dyn BlockDevice>, String)>,
        degraded: bool,
        parity: Arc<ParityWriter>,
    ) -> DataIo {
        let named = devs.len() > 1;
        DataIo {
            devs: Arc::new(DevMap(
                devs.into_iter()
                    .map(|(id, d, n)| (id, (d, Arc::from(if named { n.as_str() } else { "" }))))
                    .collect(),
            )),
            parity,
            degraded,
            queue: DataQueue::default(),
            owner: (0, 0),
            direct: false,
            writer: None,
        }
    }

    /// Every copy of logical `[at, at+len)`: a target per copy of each
    /// stripe unit, on the devices present.
    fn targets(&self, map: &ChunkMap, at: u64, len: usize) -> Result<Vec<Target>> {
        let mut out = Vec::new();
        for p in map.pieces(at, len as u64)? {
            let from = (p.offset - at) as usize;
            if p.parity.is_some() {
                // The pieces of one chunk are one target, so a row the run
                // covers is written whole, with no read.
                let chunk = map
                    .lookup(p.offset)
                    .ok_or_else(|| Error::Internal("parity piece outside its chunk".into()))?;
                if let Some(Target {
                    len: l,
                    to: Destination::Parity { sink, .. },
                    ..
                }) = out.last_mut()
                {
                    if sink.chunk.lookup(p.offset).is_some() {
                        *l += p.len as usize;
                        continue;
                    }
                }
                out.push(Target {
                    from,
                    len: p.len as usize,
                    to: Destination::Parity {
                        logical: p.offset,
                        sink: Arc::new(ParitySink {
                            writer: self.parity.clone(),
                            chunk: ChunkMap::of_one(chunk.clone()),
                            devs: self.devs.clone(),
                            degraded: self.degraded,
                        }),
                    },
                });
                continue;
            }
            let mut written = 0;
            let mut missing = Vec::new();
            for (devid, phys) in p.copies {
                match self.devs.0.get(&devid) {
                    Some((dev, name)) => {
                        out.push(Target::copy(
                            dev.clone(),
                            name.clone(),
                            phys,
                            from,
                            p.len as usize,
                        ));
                        written += 1;
                    }
                    None => missing.push(devid),
                }
            }
            if written == 0 || (!missing.is_empty() && !self.degraded) {
                return Err(Error::MissingDevice {
                    what: format!(
                        "data at logical {} has a copy on devid {} and the device is missing",
                        p.offset,
                        missing
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    devids: missing,
                });
            }
        }
        Ok(out)
    }

    /// Write `data` for logical `at` to every copy now, on this thread.
    fn write_now(&self, map: &ChunkMap, at: u64, data: &[u8]) -> Result<()> {
        for t in self.targets(map, at, data.len())? {
            t.write(data)?;
        }
        Ok(())
    }

    /// Whose data the following writes are; `direct`: they go to the
    /// device at once instead of joining the queue.
    pub fn set_context(&mut self, owner: Owner, direct: bool) {
        self.owner = owner;
        self.direct = direct;
    }

    /// Carry queued runs to the devices on a thread of their own from now on.
    pub fn start_writer(&mut self) -> Result<()> {
        if self.writer.is_none() {
            self.writer = Some(DataWriter::start()?);
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

    /// Sends `runs` to the devices (or the writer), counting their bytes
    /// into `written`.
    fn write_runs(
        &mut self,
        map: &ChunkMap,
        runs: Vec<dataq::Run>,
        written: &mut u64,
    ) -> Result<()> {
        for r in runs {
            *written += r.data.len() as u64;
            let targets = self.targets(map, r.at, r.data.len())?;
            match &self.writer {
                Some(w) => w.submit(r.at, r.data, targets),
                None => {
                    for t in &targets {
                        t.write(&r.data)?;
                    }
                    self.queue.recycle(r);
                }
            }
        }
        Ok(())
    }

    /// Write `data` at logical `at`, space allocated in this transaction:
    /// queued (combined with its neighbours), or at once.
    pub fn write_new(
        &mut self,
        map: &ChunkMap,
        at: u64,
        data: &[u8],
        written: &mut u64,
    ) -> Result<()> {
        if self.direct {
            if let Some(w) = &self.writer {
                w.wait_overlapping(at, at + data.len() as u64)?;
            }
            *written += data.len() as u64;
            return self.write_now(map, at, data);
        }
        if let Some(w) = &self.writer {
            for v in w.take_spare() {
                self.queue.give_spare(v);
            }
        }
        let out = self.queue.push(at, data, self.owner);
        self.write_runs(map, out, written)
    }

    /// Overwrite data in place at logical `at` (nodatacow and preallocated
    /// extents): goes straight to the devices, after any queued write to
    /// the same place.
    pub fn write_in_place(
        &mut self,
        map: &ChunkMap,
        at: u64,
        data: &[u8],
        written: &mut u64,
    ) -> Result<()> {
        let end = at + data.len() as u64;
        let hit = self.queue.take_overlapping(at, end);
        self.write_runs(map, hit, written)?;
        if let Some(w) = &self.writer {
            w.wait_overlapping(at, end)?;
        }
        *written += data.len() as u64;
        self.write_now(map, at, data)
    }

    /// Whether a read of the devices may miss data still queued or being
    /// written.
    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty() || self.writer.is_some()
    }

    /// Lays what is queued or being written at logical `at` over `buf`
    /// (read from the devices).
    pub fn overlay(&self, at: u64, buf: &mut [u8]) {
        if let Some(w) = &self.writer {
            w.overlay(at, buf);
        }
        self.queue.overlay(at, buf);
    }

    /// Write every queued run, and wait until all are on the devices.
    pub fn flush(&mut self, map: &ChunkMap, written: &mut u64) -> Result<()> {
        let all = self.queue.take_all();
        self.write_runs(map, all, written)?;
        match &self.writer {
            Some(w) => w.wait_all(),
            None => Ok(()),
        }
    }

    /// Whether nothing is queued.
    pub fn queue_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Write the queued runs meeting logical `[at, end)`.
    pub fn write_overlapping(
        &mut self,
        map: &ChunkMap,
        at: u64,
        end: u64,
        written: &mut u64,
    ) -> Result<()> {
        let hit = self.queue.take_overlapping(at, end);
        self.write_runs(map, hit, written)
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
    pub fn write_owner(&mut self, map: &ChunkMap, owner: Owner, written: &mut u64) -> Result<()> {
        let mine = self.queue.take_owner(owner);
        self.write_runs(map, mine, written)
    }
}

/// File data I/O of the store: data written to new space or in place,
/// queued and combined or at once, read back with what is still queued
/// laid over it. Borrows the data queue, the devices and the byte counter
/// only. Obtained from [`super::Store::data`].
pub struct DataPath<'a> {
    pub(super) io: &'a mut DataIo,
    pub(super) img: &'a crate::image::Image,
    pub(super) data_bytes: &'a mut u64,
}

impl DataPath<'_> {
    /// Whose data the following writes are; `direct`: they go to the
    /// device at once instead of joining the queue.
    pub fn set_data_context(&mut self, owner: dataq::Owner, direct: bool) {
        self.io.set_context(owner, direct);
    }

    /// Carry queued runs to the device from now on on a thread of their
    /// own (several clients share the filesystem).
    pub fn start_data_writer(&mut self) -> Result<()> {
        self.io.start_writer()
    }

    /// Back to writing runs on the caller's thread, once every submitted
    /// one is written.
    pub fn stop_data_writer(&mut self) -> Result<()> {
        self.io.stop_writer()
    }

    /// A wait for the data writes submitted so far (None: there is no
    /// writer thread, every write is done when it returns).
    pub fn data_wait(&self) -> Option<DataWait> {
        self.io.wait_handle()
    }

    /// Write `data` at logical `bytenr`, space allocated in this
    /// transaction, to every copy: queued (combined with its neighbours),
    /// or at once.
    pub fn write_new_data(&mut self, bytenr: u64, data: &[u8]) -> Result<()> {
        self.io
            .write_new(&self.img.chunks, bytenr, data, self.data_bytes)
    }

    /// New data at logical `bytenr` (allocated in this transaction) that
    /// shares `len` bytes of `src` at `src_off` on every copy (mkfs
    /// `--reflink`): nothing is written, the image file's blocks become
    /// the source's. Stripes split it as a write would; RAID5/6 refuse
    /// (parity has to be computed from the bytes).
    pub fn clone_new_data(
        &mut self,
        bytenr: u64,
        src: &std::fs::File,
        src_off: u64,
        len: u64,
    ) -> Result<()> {
        for p in self.img.chunks.pieces(bytenr, len)? {
            if p.parity.is_some() {
                return Err(Error::Unsupported(
                    "reflinks into RAID5/6 data (its parity is computed from the bytes)".into(),
                ));
            }
            let from = src_off + (p.offset - bytenr);
            for &(devid, phys) in &p.copies {
                let dev = self
                    .img
                    .device_of(devid)
                    .ok_or_else(|| Error::MissingDevice {
                        devids: vec![devid],
                        what: "a reflink of new data".into(),
                    })?;
                dev.clone_from_file(src, from, p.len, phys)?;
            }
        }
        Ok(())
    }

    /// Overwrite data in place at logical `bytenr` (nodatacow and
    /// preallocated extents), every copy: goes straight to the devices,
    /// after any queued write to the same place.
    pub fn write_in_place_data(&mut self, bytenr: u64, data: &[u8]) -> Result<()> {
        self.io
            .write_in_place(&self.img.chunks, bytenr, data, self.data_bytes)
    }

    /// Read data at logical `bytenr`, including what is still queued or
    /// being written.
    pub fn read_data(&self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.img.read_logical(bytenr, buf)?;
        if self.io.has_pending() {
            self.io.overlay(bytenr, buf);
        }
        Ok(())
    }

    /// Read data at logical `bytenr` stripe unit by stripe unit from the
    /// first copy (or RAID5/6 rebuild) `accept` takes (see
    /// [`Image::read_logical_checked`]), then what is still queued or being
    /// written over it.
    pub fn read_data_checked(
        &self,
        bytenr: u64,
        buf: &mut [u8],
        accept: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<()> {
        self.img.read_logical_checked(bytenr, buf, accept)?;
        if self.io.has_pending() {
            self.io.overlay(bytenr, buf);
        }
        Ok(())
    }

    /// Write every queued run, and wait until all are on the devices.
    pub fn flush_data(&mut self) -> Result<()> {
        self.io.flush(&self.img.chunks, self.data_bytes)
    }

    /// Write the queued runs meeting logical `[bytenr, bytenr+len)`. A log
    /// about to name an extent must find its data on the device before its
    /// own flush: the kernel logs a file extent item only once the ordered
    /// extent's write completed, and whoever syncs the log (maybe another
    /// client's fsync) flushes only what was written by then.
    pub fn write_data_in(&mut self, bytenr: u64, len: u64) -> Result<()> {
        if self.io.queue_empty() || len == 0 {
            return Ok(());
        }
        self.io
            .write_overlapping(&self.img.chunks, bytenr, bytenr + len, self.data_bytes)
    }

    /// When the queued batch holding `owner`'s data goes (None: none
    /// queued, or it may go now).
    pub fn data_batch_due(&self, owner: dataq::Owner) -> Option<std::time::Instant> {
        self.io.batch_due(owner)
    }

    /// Write the whole queue if its batch may go (see [`dataq`]).
    pub fn release_open_batch(&mut self) -> Result<()> {
        if self.io.batch_open() {
            return self.flush_data();
        }
        Ok(())
    }

    /// Write the queued runs holding `owner`'s data (what an fsync of it
    /// waits for).
    pub fn write_data_of(&mut self, owner: dataq::Owner) -> Result<()> {
        self.io
            .write_owner(&self.img.chunks, owner, self.data_bytes)
    }
}
