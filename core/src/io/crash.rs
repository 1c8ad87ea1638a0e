use super::{past_end, BlockDevice};
use crate::{Error, Result};
use std::sync::Mutex;

/// A device that models a volatile write cache. Writes land in `pending`
/// until a flush moves them to `durable`. A power failure keeps `durable`
/// plus any subset of `pending`; [`CrashDevice::crash_image`] builds such an
/// image. A write budget (`fail_after_writes`) cuts a sequence of writes at
/// any point: every write after the budget is refused, as if power failed.
pub struct CrashDevice {
    inner: Mutex<CrashState>,
}

struct CrashState {
    durable: Vec<u8>,
    /// Writes not yet flushed, in order.
    pending: Vec<(u64, Vec<u8>)>,
    writes: u64,
    budget: Option<u64>,
    /// A write was refused: the power is off until the budget is reset.
    crashed: bool,
}

impl CrashDevice {
    pub fn new(image: Vec<u8>) -> CrashDevice {
        CrashDevice { inner: Mutex::new(CrashState { durable: image, pending: Vec::new(), writes: 0, budget: None, crashed: false }) }
    }
    /// Refuse every write after the next `n`.
    pub fn fail_after_writes(&self, n: Option<u64>) {
        if let Ok(mut s) = self.inner.lock() {
            s.budget = n.map(|n| s.writes + n);
            s.crashed = false;
        }
    }
    /// Writes accepted so far.
    pub fn writes(&self) -> u64 {
        self.inner.lock().map(|s| s.writes).unwrap_or(0)
    }
    pub fn pending_writes(&self) -> usize {
        self.inner.lock().map(|s| s.pending.len()).unwrap_or(0)
    }
    /// The image after a power failure that kept what was flushed and, of
    /// the unflushed writes, those for which `keep(index)` is true.
    pub fn crash_image(&self, keep: impl Fn(usize) -> bool) -> Vec<u8> {
        let s = match self.inner.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        let mut img = s.durable.clone();
        for (i, (off, data)) in s.pending.iter().enumerate() {
            if keep(i) {
                img[*off as usize..*off as usize + data.len()].copy_from_slice(data);
            }
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
        self.inner.lock().map(|s| s.durable.len() as u64).unwrap_or(0)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let s = self.inner.lock().map_err(|_| Error::Invalid("crash device lock poisoned".into()))?;
        let size = s.durable.len() as u64;
        let end = offset.checked_add(buf.len() as u64).filter(|&e| e <= size).ok_or_else(|| past_end(offset, buf.len(), size))?;
        buf.copy_from_slice(&s.durable[offset as usize..end as usize]);
        // Later writes win: overlay pending writes in order.
        for (o, d) in &s.pending {
            let (ws, we) = (*o, *o + d.len() as u64);
            let (s0, e0) = (ws.max(offset), we.min(end));
            if s0 < e0 {
                buf[(s0 - offset) as usize..(e0 - offset) as usize].copy_from_slice(&d[(s0 - ws) as usize..(e0 - ws) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut s = self.inner.lock().map_err(|_| Error::Invalid("crash device lock poisoned".into()))?;
        if s.crashed || s.budget.is_some_and(|b| s.writes >= b) {
            s.crashed = true;
            return Err(Error::io("simulated power failure", std::io::Error::other("write after crash point")));
        }
        let size = s.durable.len() as u64;
        if offset.checked_add(buf.len() as u64).is_none_or(|e| e > size) {
            return Err(past_end(offset, buf.len(), size));
        }
        s.writes += 1;
        s.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let mut s = self.inner.lock().map_err(|_| Error::Invalid("crash device lock poisoned".into()))?;
        if s.crashed {
            return Err(Error::io("simulated power failure", std::io::Error::other("flush after crash point")));
        }
        let pending = std::mem::take(&mut s.pending);
        for (o, d) in pending {
            s.durable[o as usize..o as usize + d.len()].copy_from_slice(&d);
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
        d.fail_after_writes(Some(0));
        assert!(d.flush().is_ok());
        assert!(d.write_at(16, &[3; 8]).is_err());
        assert!(d.flush().is_err());
    }
}
