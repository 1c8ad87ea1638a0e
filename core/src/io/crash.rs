//! A device in memory that models a volatile write cache, for crash
//! exploration: see [`CrashDevice`].

use super::{past_end, BlockDevice};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const PAGE: u64 = 4096;

/// A device that models a volatile write cache. Writes land in `pending`
/// until a flush makes them durable. A power failure keeps what is durable
/// plus any subset of `pending`; [`CrashDevice::crash_device`] builds such a
/// device. A write budget (`fail_after_writes`) cuts a sequence of writes at
/// any point: every write after the budget is refused, as if power failed.
///
/// The starting image is shared, not copied: durable changes are kept as
/// 4 KiB pages over it, so large sparse images cost only what is written.
pub struct CrashDevice {
    base: Arc<Vec<u8>>,
    inner: Mutex<CrashState>,
}

#[derive(Clone)]
struct CrashState {
    durable: BTreeMap<u64, Box<[u8]>>,
    /// Writes not yet flushed, in order.
    pending: Vec<(u64, Vec<u8>)>,
    writes: u64,
    budget: Option<u64>,
    /// A write was refused: the power is off until the budget is reset.
    crashed: bool,
}

impl CrashDevice {
    /// A device starting as `image`, nothing pending.
    pub fn new(image: Vec<u8>) -> CrashDevice {
        CrashDevice::from_shared(Arc::new(image))
    }
    /// A device starting as `base`, which is shared and never written: many
    /// devices (one per crash point) can start from one image.
    pub fn from_shared(base: Arc<Vec<u8>>) -> CrashDevice {
        CrashDevice {
            base,
            inner: Mutex::new(CrashState {
                durable: BTreeMap::new(),
                pending: Vec::new(),
                writes: 0,
                budget: None,
                crashed: false,
            }),
        }
    }
    fn state(&self) -> std::sync::MutexGuard<'_, CrashState> {
        crate::util::sync::lock(&self.inner)
    }
    /// Refuse every write after the next `n`.
    pub fn fail_after_writes(&self, n: Option<u64>) {
        let mut s = self.state();
        s.budget = n.map(|n| s.writes + n);
        s.crashed = false;
    }
    /// Writes accepted so far.
    pub fn writes(&self) -> u64 {
        self.state().writes
    }
    /// Writes since the last flush, not yet durable: the indices
    /// [`crash_device`](Self::crash_device) asks `keep` about.
    pub fn pending_writes(&self) -> usize {
        self.state().pending.len()
    }

    fn apply(base: &[u8], durable: &mut BTreeMap<u64, Box<[u8]>>, off: u64, data: &[u8]) {
        let end = off + data.len() as u64;
        let mut p = off / PAGE * PAGE;
        while p < end {
            let page = durable.entry(p).or_insert_with(|| {
                let mut v = vec![0u8; PAGE as usize];
                let n = (base.len() as u64).saturating_sub(p).min(PAGE) as usize;
                v[..n].copy_from_slice(&base[p as usize..p as usize + n]);
                v.into_boxed_slice()
            });
            let (a, b) = (p.max(off), (p + PAGE).min(end));
            page[(a - p) as usize..(b - p) as usize]
                .copy_from_slice(&data[(a - off) as usize..(b - off) as usize]);
            p += PAGE;
        }
    }

    /// The device after a power failure that kept what was flushed and, of
    /// the unflushed writes, those for which `keep(index)` is true.
    pub fn crash_device(&self, keep: impl Fn(usize) -> bool) -> CrashDevice {
        let s = self.state();
        let mut durable = s.durable.clone();
        for (i, (off, data)) in s.pending.iter().enumerate() {
            if keep(i) {
                Self::apply(&self.base, &mut durable, *off, data);
            }
        }
        CrashDevice {
            base: self.base.clone(),
            inner: Mutex::new(CrashState {
                durable,
                pending: Vec::new(),
                writes: 0,
                budget: None,
                crashed: false,
            }),
        }
    }

    /// A power failure that tears writes: of each unflushed write, only the
    /// 4 KiB pages for which `keep(write index, page index)` is true reach
    /// the disk (a large write is not atomic on real hardware).
    pub fn crash_device_torn(&self, keep: impl Fn(usize, usize) -> bool) -> CrashDevice {
        let s = self.state();
        let mut durable = s.durable.clone();
        for (i, (off, data)) in s.pending.iter().enumerate() {
            for (j, chunk) in data.chunks(PAGE as usize).enumerate() {
                if keep(i, j) {
                    Self::apply(&self.base, &mut durable, off + j as u64 * PAGE, chunk);
                }
            }
        }
        CrashDevice {
            base: self.base.clone(),
            inner: Mutex::new(CrashState {
                durable,
                pending: Vec::new(),
                writes: 0,
                budget: None,
                crashed: false,
            }),
        }
    }

    /// Like [`crash_device`](Self::crash_device), as a whole image in memory.
    pub fn crash_image(&self, keep: impl Fn(usize) -> bool) -> Vec<u8> {
        let d = self.crash_device(keep);
        let s = d.state();
        let mut img = (*d.base).clone();
        for (p, page) in &s.durable {
            let n = (img.len() as u64 - p).min(PAGE) as usize;
            img[*p as usize..*p as usize + n].copy_from_slice(&page[..n]);
        }
        img
    }
    /// The image as a reader sees it now (durable plus every pending write).
    pub fn current_image(&self) -> Vec<u8> {
        self.crash_image(|_| true)
    }
}

impl BlockDevice for CrashDevice {
    fn size(&self) -> u64 {
        self.base.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let size = self.base.len() as u64;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= size)
            .ok_or_else(|| past_end(offset, buf.len(), size))?;
        buf.copy_from_slice(&self.base[offset as usize..end as usize]);
        let s = self.state();
        for (&p, page) in s.durable.range(offset / PAGE * PAGE..end) {
            let (a, b) = (p.max(offset), (p + PAGE).min(end));
            if a < b {
                buf[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&page[(a - p) as usize..(b - p) as usize]);
            }
        }
        // Later writes win: overlay pending writes in order.
        for (o, d) in &s.pending {
            let (ws, we) = (*o, *o + d.len() as u64);
            let (s0, e0) = (ws.max(offset), we.min(end));
            if s0 < e0 {
                buf[(s0 - offset) as usize..(e0 - offset) as usize]
                    .copy_from_slice(&d[(s0 - ws) as usize..(e0 - ws) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut s = self.state();
        if s.crashed || s.budget.is_some_and(|b| s.writes >= b) {
            s.crashed = true;
            return Err(Error::io(
                "simulated power failure",
                std::io::Error::other("write after crash point"),
            ));
        }
        let size = self.base.len() as u64;
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > size)
        {
            return Err(past_end(offset, buf.len(), size));
        }
        s.writes += 1;
        s.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let mut s = self.state();
        if s.crashed {
            return Err(Error::io(
                "simulated power failure",
                std::io::Error::other("flush after crash point"),
            ));
        }
        let pending = std::mem::take(&mut s.pending);
        for (o, d) in pending {
            Self::apply(&self.base, &mut s.durable, o, &d);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn flushed_survives_unflushed_may_not() {
        let d = CrashDevice::new(vec![0; 64]);
        d.write_at(0, &[1; 8]).unwrap();
        d.flush().unwrap();
        d.write_at(8, &[2; 8]).unwrap();
        let mut b = [0u8; 16];
        d.read_at(0, &mut b).unwrap();
        assert_eq!(&b[8..], &[2; 8]);
        let lost = d.crash_image(|_| false);
        assert_eq!(&lost[..8], &[1; 8]);
        assert_eq!(&lost[8..16], &[0; 8]);
        let kept = d.crash_device(|_| true);
        let mut c = [0u8; 16];
        kept.read_at(0, &mut c).unwrap();
        assert_eq!(c, b);
        d.fail_after_writes(Some(0));
        assert!(d.flush().is_ok());
        assert!(d.write_at(16, &[3; 8]).is_err());
        assert!(d.flush().is_err());
    }
}
