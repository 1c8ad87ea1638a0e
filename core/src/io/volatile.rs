//! A disk with a volatile write cache, over an image file: writes reach the
//! file at once (so memory stays small), but until a flush they can be
//! taken back. A power failure ([`VolatileFile::power_fail`]) restores
//! every byte written since the last flush, or keeps a random subset of
//! those writes (some torn at 4 KiB), exactly what a drive with a volatile
//! cache may leave.
//!
//! The bytes a write replaces are saved (once per flush interval) in an
//! unlinked journal file before the write; with `record_writes`, the
//! written bytes are journaled too, so a random subset can be replayed.

use super::{BlockDevice, FileDevice};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

const PAGE: u64 = 4096;

struct Journal {
    file: File,
    len: u64,
}

impl Journal {
    fn append(&mut self, data: &[u8]) -> Result<u64> {
        let at = self.len;
        self.file
            .write_all_at(data, at)
            .map_err(|e| Error::io("write the crash journal", e))?;
        self.len += data.len() as u64;
        Ok(at)
    }
    fn read(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, at)
            .map_err(|e| Error::io("read the crash journal", e))
    }
    fn clear(&mut self) -> Result<()> {
        self.file
            .set_len(0)
            .map_err(|e| Error::io("truncate the crash journal", e))?;
        self.len = 0;
        Ok(())
    }
}

struct State {
    /// Saved pre-flush bytes: start -> (end, journal offset).
    saved: BTreeMap<u64, (u64, u64)>,
    /// Writes since the last flush: (offset, length, journal offset of the
    /// data when recorded).
    writes: Vec<(u64, u64, Option<u64>)>,
    journal: Journal,
    record_writes: bool,
    /// Cut off ([`VolatileFile::cut_off`]): the device takes no more
    /// writes or flushes.
    failed: bool,
}

/// A [`FileDevice`] behind a modelled volatile write cache: writes reach the
/// file at once, and [`power_fail`](Self::power_fail) takes back those made
/// since the last flush, all of them or all but a random, possibly torn,
/// subset. The bytes to restore are kept in an unlinked journal file, not
/// in memory.
pub struct VolatileFile {
    inner: FileDevice,
    state: Mutex<State>,
}

impl VolatileFile {
    /// Wrap an image opened for writing. `record_writes`: keep the written
    /// bytes too, so a crash can keep a random subset of them.
    pub fn new(inner: FileDevice, record_writes: bool) -> Result<VolatileFile> {
        let file = tempfile::tempfile().map_err(|e| Error::io("create the crash journal", e))?;
        Ok(VolatileFile {
            inner,
            state: Mutex::new(State {
                saved: BTreeMap::new(),
                writes: Vec::new(),
                journal: Journal { file, len: 0 },
                record_writes,
                failed: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::util::sync::lock(&self.state)
    }

    /// Writes since the last flush.
    pub fn unflushed_writes(&self) -> usize {
        self.lock().writes.len()
    }

    /// Save the current bytes of `[off, end)` not saved since the flush.
    fn save_old(&self, s: &mut State, off: u64, end: u64) -> Result<()> {
        let mut gaps = Vec::new();
        let mut pos = off;
        let first = s
            .saved
            .range(..=off)
            .next_back()
            .map(|(k, _)| *k)
            .unwrap_or(off);
        for (&a, &(b, _)) in s.saved.range(first..end) {
            if b <= pos {
                continue;
            }
            if a > pos {
                gaps.push((pos, a.min(end)));
            }
            pos = pos.max(b);
            if pos >= end {
                break;
            }
        }
        if pos < end {
            gaps.push((pos, end));
        }
        for (a, b) in gaps {
            let mut buf = vec![0u8; (b - a) as usize];
            self.inner.read_at(a, &mut buf)?;
            let at = s.journal.append(&buf)?;
            s.saved.insert(a, (b, at));
        }
        Ok(())
    }

    /// Power failure: undo every write since the last flush, except, with
    /// `keep_random`, a seeded random subset of them (each kept write may
    /// lose some of its 4 KiB pages: a torn write). The file is flushed
    /// after, so the result is what a restart finds.
    pub fn power_fail(&self, keep_random: Option<u64>) -> Result<()> {
        let mut s = self.lock();
        // Everything back to the last flush.
        let saved: Vec<(u64, u64, u64)> = s.saved.iter().map(|(a, (b, j))| (*a, *b, *j)).collect();
        for (a, b, j) in saved {
            let mut buf = vec![0u8; (b - a) as usize];
            s.journal.read(j, &mut buf)?;
            self.inner.write_at(a, &buf)?;
        }
        if let Some(seed) = keep_random {
            let mut rng = crate::util::prng::Prng::new(seed);
            let writes = s.writes.clone();
            for (off, len, j) in writes {
                let Some(j) = j else { continue };
                if rng.below(2) == 0 {
                    continue;
                }
                let mut buf = vec![0u8; len as usize];
                s.journal.read(j, &mut buf)?;
                let torn = rng.below(4) == 0;
                for (i, chunk) in buf.chunks(PAGE as usize).enumerate() {
                    if torn && rng.below(2) == 0 {
                        continue;
                    }
                    self.inner.write_at(off + i as u64 * PAGE, chunk)?;
                }
            }
        }
        self.inner.flush()?;
        s.saved.clear();
        s.writes.clear();
        s.journal.clear()
    }

    /// The power goes for good: from now on every write and flush fails.
    /// Call it before [`power_fail`](Self::power_fail) when threads of the
    /// run may still be writing (a mount whose log syncs run without its
    /// lock): what they would write after the failure never lands.
    pub fn cut_off(&self) {
        self.lock().failed = true;
    }
}

/// The error of a write or flush after the power failed.
fn no_power() -> Error {
    Error::io(
        "the device lost power",
        std::io::Error::from_raw_os_error(libc::EIO),
    )
}

impl BlockDevice for VolatileFile {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn rotational(&self) -> Option<bool> {
        self.inner.rotational()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }
    // Writes and flushes run under the state's lock, so a power failure
    // happens between two of them, never in the middle of one.
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut s = self.lock();
        if s.failed {
            return Err(no_power());
        }
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| Error::Invalid("write range overflows".into()))?;
        if end > self.inner.size() {
            return Err(super::past_end(offset, buf.len(), self.inner.size()));
        }
        self.save_old(&mut s, offset, end)?;
        let j = if s.record_writes {
            Some(s.journal.append(buf)?)
        } else {
            None
        };
        s.writes.push((offset, buf.len() as u64, j));
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<()> {
        let mut s = self.lock();
        if s.failed {
            return Err(no_power());
        }
        self.inner.flush()?;
        s.saved.clear();
        s.writes.clear();
        s.journal.clear()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_failure_keeps_only_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, vec![7u8; 64 << 10]).unwrap();
        let d = VolatileFile::new(FileDevice::open(&p, true).unwrap(), true).unwrap();
        d.write_at(0, &[1; 4096]).unwrap();
        d.flush().unwrap();
        d.write_at(4096, &[2; 8192]).unwrap();
        d.write_at(6000, &[3; 100]).unwrap();
        let mut b = [0u8; 4];
        d.read_at(6000, &mut b).unwrap();
        assert_eq!(b, [3; 4]);
        d.power_fail(None).unwrap();
        let img = std::fs::read(&p).unwrap();
        assert!(img[..4096].iter().all(|&x| x == 1));
        assert!(img[4096..].iter().all(|&x| x == 7));
        // A kept subset: every byte is either old or from a write.
        d.write_at(8192, &[4; 8192]).unwrap();
        d.write_at(20000, &[5; 10]).unwrap();
        d.power_fail(Some(11)).unwrap();
        let img = std::fs::read(&p).unwrap();
        assert!(img[8192..16384].iter().all(|&x| x == 4 || x == 7));
        assert!(img[20000..20010].iter().all(|&x| x == 5 || x == 7));
        // Cut off: nothing more lands, reads still work.
        d.cut_off();
        assert!(d.write_at(0, &[9; 4096]).is_err());
        assert!(d.flush().is_err());
        d.power_fail(None).unwrap();
        assert!(std::fs::read(&p).unwrap()[..4096].iter().all(|&x| x == 1));
        d.read_at(0, &mut b).unwrap();
    }
}
