//! A copy-on-write view of a device: see [`OverlayDevice`].

use super::BlockDevice;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const PAGE: u64 = 4096;

/// A copy-on-write view of a device: writes land in memory (4 KiB pages)
/// and reads see them over the unchanged device. `--dry-run` runs a whole
/// replay through one, so nothing reaches the image.
pub struct OverlayDevice {
    inner: Arc<dyn BlockDevice>,
    pages: Mutex<BTreeMap<u64, Box<[u8]>>>,
}

impl OverlayDevice {
    /// A view over `inner` with no write yet; `inner` is only ever read.
    pub fn new(inner: Arc<dyn BlockDevice>) -> OverlayDevice {
        OverlayDevice {
            inner,
            pages: Mutex::new(BTreeMap::new()),
        }
    }
    /// A second view over the same device with this one's writes so far;
    /// the two go their own ways from here.
    pub fn fork(&self) -> OverlayDevice {
        let pages = self.pages.lock().map(|p| p.clone()).unwrap_or_default();
        OverlayDevice {
            inner: self.inner.clone(),
            pages: Mutex::new(pages),
        }
    }
    /// Write this view's pages to `dev` (a copy of the device under it).
    pub fn write_pages_to(&self, dev: &dyn BlockDevice) -> Result<()> {
        let pages = self
            .pages
            .lock()
            .map_err(|_| Error::Internal("overlay lock poisoned".into()))?;
        for (p, data) in pages.iter() {
            let n = PAGE.min(dev.size().saturating_sub(*p)) as usize;
            dev.write_at(*p, &data[..n])?;
        }
        dev.flush()
    }
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.pages
            .lock()
            .map(|p| p.len() as u64 * PAGE)
            .unwrap_or(0)
    }
}

impl BlockDevice for OverlayDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)?;
        let pages = self
            .pages
            .lock()
            .map_err(|_| Error::Internal("overlay lock poisoned".into()))?;
        let end = offset + buf.len() as u64;
        for (&p, data) in pages.range(offset / PAGE * PAGE..end) {
            let (a, b) = (p.max(offset), (p + PAGE).min(end));
            if a < b {
                buf[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&data[(a - p) as usize..(b - p) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let end = offset + buf.len() as u64;
        if end > self.size() {
            return Err(super::past_end(offset, buf.len(), self.size()));
        }
        let mut p = offset / PAGE * PAGE;
        while p < end {
            let mut page = {
                let pages = self
                    .pages
                    .lock()
                    .map_err(|_| Error::Internal("overlay lock poisoned".into()))?;
                pages.get(&p).cloned()
            };
            if page.is_none() {
                let mut v = vec![0u8; PAGE as usize];
                let n = PAGE.min(self.size() - p) as usize;
                self.inner.read_at(p, &mut v[..n])?;
                page = Some(v.into_boxed_slice());
            }
            let mut page = page.unwrap_or_else(|| vec![0u8; PAGE as usize].into_boxed_slice());
            let (a, b) = (p.max(offset), (p + PAGE).min(end));
            page[(a - p) as usize..(b - p) as usize]
                .copy_from_slice(&buf[(a - offset) as usize..(b - offset) as usize]);
            self.pages
                .lock()
                .map_err(|_| Error::Internal("overlay lock poisoned".into()))?
                .insert(p, page);
            p += PAGE;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}
