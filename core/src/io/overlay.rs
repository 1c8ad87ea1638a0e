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
    pub fn new(inner: Arc<dyn BlockDevice>) -> OverlayDevice {
        OverlayDevice { inner, pages: Mutex::new(BTreeMap::new()) }
    }
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.pages.lock().map(|p| p.len() as u64 * PAGE).unwrap_or(0)
    }
}

impl BlockDevice for OverlayDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)?;
        let pages = self.pages.lock().map_err(|_| Error::Invalid("overlay lock poisoned".into()))?;
        let end = offset + buf.len() as u64;
        for (&p, data) in pages.range(offset / PAGE * PAGE..end) {
            let (a, b) = (p.max(offset), (p + PAGE).min(end));
            if a < b {
                buf[(a - offset) as usize..(b - offset) as usize].copy_from_slice(&data[(a - p) as usize..(b - p) as usize]);
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
                let pages = self.pages.lock().map_err(|_| Error::Invalid("overlay lock poisoned".into()))?;
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
            page[(a - p) as usize..(b - p) as usize].copy_from_slice(&buf[(a - offset) as usize..(b - offset) as usize]);
            self.pages.lock().map_err(|_| Error::Invalid("overlay lock poisoned".into()))?.insert(p, page);
            p += PAGE;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

/// Copy a file keeping its holes (SEEK_DATA / SEEK_HOLE), to a new file.
pub fn sparse_copy(src: &std::path::Path, dst: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let s = std::fs::File::open(src).map_err(|e| Error::io(format!("cannot open {}", src.display()), e))?;
    let len = s.metadata().map_err(|e| Error::io(format!("cannot stat {}", src.display()), e))?.len();
    let d = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| Error::io(format!("cannot create {}", dst.display()), e))?;
    d.set_len(len).map_err(|e| Error::io(format!("cannot size {}", dst.display()), e))?;
    let fd = s.as_raw_fd();
    let mut buf = vec![0u8; 8 << 20];
    let mut pos: i64 = 0;
    while (pos as u64) < len {
        // SAFETY: lseek on an open descriptor.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { len as i64 } else { hole };
        let mut off = data as u64;
        while off < hole as u64 {
            let n = ((hole as u64 - off) as usize).min(buf.len());
            // In-kernel copy first (no round trip through user memory, and
            // a reflink where the filesystem can); plain copy otherwise.
            let mut so = off as i64;
            let mut dof = off as i64;
            // SAFETY: both descriptors are open; offsets are owned locals.
            let c = unsafe { libc::copy_file_range(fd, &mut so, d.as_raw_fd(), &mut dof, n, 0) };
            if c > 0 {
                off += c as u64;
                continue;
            }
            s.read_exact_at(&mut buf[..n], off).map_err(|e| Error::io(format!("read {}", src.display()), e))?;
            d.write_all_at(&buf[..n], off).map_err(|e| Error::io(format!("write {}", dst.display()), e))?;
            off += n as u64;
        }
        pos = hole;
    }
    d.sync_all().map_err(|e| Error::io(format!("sync {}", dst.display()), e))
}
