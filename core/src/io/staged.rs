//! Superblock writes held back until a new filesystem is complete: see
//! [`StagedSuper`].

use super::BlockDevice;
use crate::format::consts::*;
use crate::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A device that holds superblock writes in memory and passes every other
/// write through. Used while creating a filesystem, so the target never
/// carries a valid superblock until [`StagedSuper::publish`] writes the final
/// one: a failure half-way leaves an image that is clearly not a btrfs
/// filesystem.
pub struct StagedSuper {
    inner: Arc<dyn BlockDevice>,
    /// (offset, bytes) of each superblock copy written so far.
    supers: Mutex<Vec<(u64, Vec<u8>)>>,
    /// After publishing, superblock writes go straight to the device.
    published: AtomicBool,
}

fn is_super_range(offset: u64, len: usize) -> bool {
    (0..BTRFS_SUPER_MIRROR_MAX).any(|m| {
        let s = btrfs_sb_offset(m);
        offset < s + BTRFS_SUPER_INFO_SIZE as u64 && offset + len as u64 > s
    })
}

impl StagedSuper {
    /// Hold the superblock writes to `inner` (4 KiB writes over a copy's
    /// place) until [`publish`](Self::publish).
    pub fn new(inner: Arc<dyn BlockDevice>) -> StagedSuper {
        StagedSuper {
            inner,
            supers: Mutex::new(Vec::new()),
            published: AtomicBool::new(false),
        }
    }

    /// Write the held superblocks to the device and flush.
    pub fn publish(&self) -> Result<()> {
        self.inner.flush()?;
        let supers = self.supers.lock().map(|s| s.clone()).unwrap_or_default();
        for (off, data) in supers {
            self.inner.write_at(off, &data)?;
        }
        self.inner.flush()?;
        self.published.store(true, Ordering::SeqCst);
        if let Ok(mut s) = self.supers.lock() {
            s.clear();
        }
        Ok(())
    }
}

impl BlockDevice for StagedSuper {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)?;
        if is_super_range(offset, buf.len()) {
            if let Ok(s) = self.supers.lock() {
                for (o, d) in s.iter() {
                    let (a, b) = (
                        (*o).max(offset),
                        (*o + d.len() as u64).min(offset + buf.len() as u64),
                    );
                    if a < b {
                        buf[(a - offset) as usize..(b - offset) as usize]
                            .copy_from_slice(&d[(a - o) as usize..(b - o) as usize]);
                    }
                }
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if !self.published.load(Ordering::SeqCst)
            && is_super_range(offset, buf.len())
            && buf.len() == BTRFS_SUPER_INFO_SIZE
        {
            if let Ok(mut s) = self.supers.lock() {
                s.retain(|(o, _)| *o != offset);
                s.push((offset, buf.to_vec()));
            }
            return Ok(());
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn clone_from_file(
        &self,
        src: &std::fs::File,
        src_off: u64,
        len: u64,
        offset: u64,
    ) -> Result<()> {
        if is_super_range(offset, len as usize) {
            return Err(crate::Error::Invalid(format!(
                "a reflink of {len} bytes at byte {offset} would cover a superblock"
            )));
        }
        self.inner.clone_from_file(src, src_off, len, offset)
    }
}
