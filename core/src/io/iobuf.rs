//! A read buffer for large direct reads: page aligned (as O_DIRECT wants)
//! and backed by huge pages where the kernel has them. A 4 MiB read into
//! 4 KiB pages is a thousand DMA segments, more than a virtio or NVMe
//! request takes at once, so the kernel splits it; into two huge pages it
//! is one request.

use crate::{Error, Result};

const HUGE: usize = 2 << 20;

/// A reusable buffer for [`BlockDevice::read_once`](super::BlockDevice::read_once):
/// aligned to 2 MiB, backed by huge pages where the kernel has them, grown
/// on demand and never shrunk.
pub struct IoBuf {
    mem: Option<memmap2::MmapMut>,
    /// Offset of the first huge-page-aligned byte in `mem`.
    start: usize,
    cap: usize,
}

impl Default for IoBuf {
    fn default() -> Self {
        IoBuf::new()
    }
}

impl IoBuf {
    /// An empty buffer; memory is mapped by the first [`get`](Self::get).
    pub fn new() -> IoBuf {
        IoBuf {
            mem: None,
            start: 0,
            cap: 0,
        }
    }

    /// A buffer of at least `len` bytes (its contents are whatever the last
    /// read left).
    pub fn get(&mut self, len: usize) -> Result<&mut [u8]> {
        if self.mem.is_none() || self.cap < len {
            let cap = len.max(1).next_multiple_of(HUGE);
            let mut m = memmap2::MmapMut::map_anon(cap + HUGE)
                .map_err(|e| Error::io(format!("cannot map a {cap}-byte read buffer"), e))?;
            let start = (HUGE - (m.as_ptr() as usize) % HUGE) % HUGE;
            #[cfg(target_os = "linux")]
            {
                // Only a hint: without huge pages the buffer still works.
                let _ = m.advise_range(memmap2::Advice::HugePage, start, cap);
            }
            // Fault the pages in now, so the first read does not: a write
            // per page (the kernel hands them out zeroed; filling them
            // would zero each twice).
            for b in m[start..start + cap].iter_mut().step_by(4096) {
                *b = 0;
            }
            self.mem = Some(m);
            self.start = start;
            self.cap = cap;
        }
        let start = self.start;
        match self.mem.as_mut() {
            Some(m) => Ok(&mut m[start..start + len]),
            None => Err(Error::Internal("read buffer missing".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_grows() {
        let mut b = IoBuf::new();
        let s = b.get(4096).unwrap();
        assert_eq!(s.len(), 4096);
        assert_eq!(s.as_ptr() as usize % 4096, 0);
        s[4095] = 7;
        let s = b.get(5 << 20).unwrap();
        assert_eq!(s.len(), 5 << 20);
        assert_eq!(s.as_ptr() as usize % HUGE, 0);
        s[(5 << 20) - 1] = 1;
    }
}
