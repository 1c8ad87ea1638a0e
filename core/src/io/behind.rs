//! Write-behind: a device whose writes are carried out by a thread of its
//! own, so the caller goes on (building the next blocks, checksumming the
//! next data) while the kernel copies the last ones into the image file.
//! This is what the kernel's own writeback gives a filesystem: submitting a
//! write does not wait for the copy.
//!
//! Invariants, which make it indistinguishable from the device under it
//! apart from timing:
//! - writes reach the inner device in the order they were made (one
//!   writer, a FIFO queue), so overlapping writes end as they would;
//! - a read of a range that meets a write not yet carried out waits until
//!   every queued write is done, so reads see every earlier write;
//! - `flush` first waits for every queued write, then flushes the inner
//!   device: what a flush makes durable is everything written before it;
//! - a failed write is reported by the next write or flush (as a kernel's
//!   writeback error is reported by the next fsync), never dropped;
//! - at most [`IN_FLIGHT`] bytes wait in the queue (a write past it waits
//!   for room), so memory stays bounded.

use super::{BlockDevice, IoBuf};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Most bytes queued and not yet written: room for a good part of a
/// background writeback, so the engine goes on while the disk takes it.
const IN_FLIGHT: usize = 20 << 20;
/// Bytes of buffers kept for reuse (of the sizes writes come in).
const POOL: usize = 4 << 20;
/// Writes this large go past the page cache ([`BlockDevice::write_direct`]):
/// file data runs, which the engine keeps in its own cache if it reads them
/// again; single tree blocks stay buffered.
const DIRECT_MIN: usize = 128 << 10;
/// Longest single queued write; longer ones are queued in pieces.
const PIECE: usize = 1 << 20;
/// Buffers start on this boundary, as direct I/O wants.
const ALIGN: usize = 4096;

/// A queued write: its bytes are `buf[start..]`, `start` putting them on
/// an [`ALIGN`] boundary in memory.
struct Pending {
    at: u64,
    buf: Vec<u8>,
    start: usize,
}

impl Pending {
    fn data(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or(&[])
    }
    fn end(&self) -> u64 {
        self.at.saturating_add(self.data().len() as u64)
    }
}

struct Queue {
    writes: VecDeque<Pending>,
    /// The write being carried out now, out of the queue: (start, end).
    current: Option<(u64, u64)>,
    bytes: usize,
    /// First failed write not yet reported.
    error: Option<Error>,
    pool: Vec<Vec<u8>>,
    /// Capacity held in `pool`.
    pooled: usize,
    stop: bool,
}

impl Queue {
    fn idle(&self) -> bool {
        self.writes.is_empty() && self.current.is_none()
    }
    fn meets(&self, start: u64, end: u64) -> bool {
        let hit = |s: u64, e: u64| s < end && start < e;
        self.current.is_some_and(|(s, e)| hit(s, e))
            || self.writes.iter().any(|w| hit(w.at, w.end()))
    }
}

struct Shared {
    q: Mutex<Queue>,
    /// Signalled when a write is queued, done, or the device stops.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        crate::util::sync::lock(&self.q)
    }
    fn wait<'a>(&self, g: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        crate::util::sync::wait(&self.changed, g)
    }
    /// Wait until every queued write is carried out.
    fn drain(&self) -> MutexGuard<'_, Queue> {
        let mut g = self.lock();
        while !g.idle() {
            g = self.wait(g);
        }
        g
    }
}

/// A device whose writes a thread of its own carries out while the caller
/// goes on. It behaves as `inner` but for timing: writes reach `inner` in
/// the order made, a read waits for the queued writes it meets, `flush`
/// waits for every queued write before flushing `inner`, and a failed write
/// is reported by the next write or flush. At most 20 MiB wait in the queue.
pub struct WriteBehind {
    inner: Arc<dyn BlockDevice>,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl WriteBehind {
    /// Wrap `inner`, starting the writer thread. Dropping the device carries
    /// out the writes still queued, then ends the thread.
    pub fn new(inner: Arc<dyn BlockDevice>) -> Result<WriteBehind> {
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                writes: VecDeque::new(),
                current: None,
                bytes: 0,
                error: None,
                pool: Vec::new(),
                pooled: 0,
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let (dev, sh) = (inner.clone(), shared.clone());
        let writer = std::thread::Builder::new()
            .name("write-behind".into())
            .spawn(move || write_loop(dev.as_ref(), &sh))
            .map_err(|e| Error::io("start the write-behind thread", e))?;
        Ok(WriteBehind {
            inner,
            shared,
            writer: Some(writer),
        })
    }

    /// Wait for queued writes that meet `[offset, offset + len)`.
    fn settle(&self, offset: u64, len: usize) {
        let end = offset.saturating_add(len as u64);
        let g = self.shared.lock();
        if g.meets(offset, end) {
            drop(g);
            drop(self.shared.drain());
        }
    }
}

fn write_loop(dev: &dyn BlockDevice, sh: &Shared) {
    let mut g = sh.lock();
    loop {
        let Some(w) = g.writes.pop_front() else {
            if g.stop {
                return;
            }
            g = sh.wait(g);
            continue;
        };
        g.current = Some((w.at, w.end()));
        drop(g);
        let data = w.data();
        let res = if data.len() >= DIRECT_MIN {
            dev.write_direct(w.at, data)
        } else {
            dev.write_at(w.at, data)
        };
        let len = data.len();
        g = sh.lock();
        g.current = None;
        g.bytes -= len;
        if let Err(e) = res {
            g.error.get_or_insert(e);
        }
        if g.pooled + w.buf.capacity() <= POOL {
            g.pooled += w.buf.capacity();
            g.pool.push(w.buf);
        }
        sh.changed.notify_all();
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        // Queued writes are carried out before the thread ends (a dropped
        // device still holds what was written to it).
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
    }
}

impl BlockDevice for WriteBehind {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.settle(offset, buf.len());
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| Error::Invalid("write range overflows".into()))?;
        if end > self.inner.size() {
            return Err(super::past_end(offset, buf.len(), self.inner.size()));
        }
        // In pieces, so the first is being written while the next are
        // copied (a writeback of many files comes as one long run).
        let mut at = offset;
        for piece in buf.chunks(PIECE) {
            self.queue(at, piece)?;
            at += piece.len() as u64;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let mut g = self.shared.drain();
        if let Some(e) = g.error.take() {
            return Err(e);
        }
        drop(g);
        self.inner.flush()
    }
    fn rotational(&self) -> Option<bool> {
        self.inner.rotational()
    }
    fn prefetch(&self, offset: u64, len: u64) {
        self.inner.prefetch(offset, len)
    }
    fn read_once(
        &self,
        offset: u64,
        len: usize,
        buf: &mut IoBuf,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<()> {
        self.settle(offset, len);
        self.inner.read_once(offset, len, buf, f)
    }
}

impl WriteBehind {
    fn queue(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut g = self.shared.lock();
        if let Some(e) = g.error.take() {
            return Err(e);
        }
        // A write larger than the bound goes alone.
        while g.bytes > 0 && g.bytes + buf.len() > IN_FLIGHT {
            g = self.shared.wait(g);
        }
        let need = buf.len() + ALIGN;
        let mut b = match g.pool.iter().position(|p| p.capacity() >= need) {
            Some(i) => {
                let b = g.pool.swap_remove(i);
                g.pooled -= b.capacity();
                b
            }
            None => Vec::new(),
        };
        drop(g);
        b.clear();
        b.reserve_exact(need);
        // The capacity holds `need` bytes, so nothing below moves the buffer.
        let start = (ALIGN - b.as_ptr() as usize % ALIGN) % ALIGN;
        b.resize(start, 0);
        b.extend_from_slice(buf);
        let mut g = self.shared.lock();
        g.bytes += buf.len();
        g.writes.push_back(Pending {
            at: offset,
            buf: b,
            start,
        });
        drop(g);
        self.shared.changed.notify_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;

    /// Whatever the interleaving, reads see every earlier write, overlapping
    /// writes end in order, and a flush leaves nothing queued.
    #[test]
    fn reads_see_earlier_writes_in_order() {
        let mem = Arc::new(MemDevice::new(vec![0u8; 1 << 20]));
        let d = WriteBehind::new(mem.clone()).unwrap();
        let mut model = vec![0u8; 1 << 20];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % ((1 << 20) - 70_000)) as usize;
            let len = 1 + (x >> 40) as usize % 65_536;
            if i % 3 == 0 {
                let mut got = vec![0u8; len];
                d.read_at(off as u64, &mut got).unwrap();
                assert_eq!(got, model[off..off + len], "read {i} at {off}+{len}");
            } else {
                let fill = vec![(i % 251) as u8; len];
                d.write_at(off as u64, &fill).unwrap();
                model[off..off + len].copy_from_slice(&fill);
            }
        }
        d.flush().unwrap();
        let mut all = vec![0u8; 1 << 20];
        mem.read_at(0, &mut all).unwrap();
        assert!(all == model, "the device under it ends as the writes say");
    }

    /// Over an image file: long writes go in pieces past the page cache,
    /// short ones through it, and reads in between (buffered, and direct
    /// ones of `read_once`) see all of them.
    #[test]
    fn an_image_file_gets_long_and_short_writes_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, vec![0u8; 8 << 20]).unwrap();
        let file = Arc::new(crate::io::FileDevice::open(&p, true).unwrap());
        let d = WriteBehind::new(file).unwrap();
        let mut model = vec![0u8; 8 << 20];
        let long: Vec<u8> = (0..(3 << 20) + 8192).map(|i| (i % 253) as u8).collect();
        d.write_at(1 << 20, &long).unwrap();
        model[1 << 20..(1 << 20) + long.len()].copy_from_slice(&long);
        // A short write over the middle of the long one lands after it.
        d.write_at((2 << 20) + 100, &[9; 5000]).unwrap();
        model[(2 << 20) + 100..(2 << 20) + 5100].fill(9);
        let mut got = vec![0u8; 64 << 10];
        d.read_at(2 << 20, &mut got).unwrap();
        assert!(got == model[2 << 20..(2 << 20) + (64 << 10)]);
        let mut buf = IoBuf::new();
        let mut seen = Vec::new();
        d.read_once(1 << 20, 4 << 20, &mut buf, &mut |b| seen = b.to_vec())
            .unwrap();
        assert!(seen == model[1 << 20..5 << 20], "read_once sees the writes");
        d.flush().unwrap();
        drop(d);
        assert!(
            std::fs::read(&p).unwrap() == model,
            "the file ends as written"
        );
    }

    /// A device whose writes fail.
    struct Failing;
    impl BlockDevice for Failing {
        fn size(&self) -> u64 {
            1 << 20
        }
        fn read_at(&self, _offset: u64, buf: &mut [u8]) -> Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn write_at(&self, offset: u64, _buf: &[u8]) -> Result<()> {
            Err(Error::io(
                format!("write at byte {offset}"),
                std::io::Error::from_raw_os_error(libc::EIO),
            ))
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
    }

    /// A write that fails in the background is reported by the next flush.
    #[test]
    fn a_failed_write_fails_the_next_flush() {
        let d = WriteBehind::new(Arc::new(Failing)).unwrap();
        d.write_at(4096, &[1; 4096]).unwrap();
        let e = d.flush().unwrap_err().to_string();
        assert!(e.contains("4096"), "{e}");
        // Reported once, as the kernel reports a writeback error once.
        d.flush().unwrap();
        assert!(d.write_at(1 << 30, &[1; 1]).is_err(), "past the end");
    }
}
