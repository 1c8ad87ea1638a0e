//! A regular file or block device as a [`BlockDevice`]: positioned reads
//! and writes, an optional read-only memory map, O_DIRECT for large reads
//! and writes, fdatasync for flushes.

use super::{past_end, BlockDevice, IoBuf};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A regular file or block device. Opened read-only unless asked to write;
/// a read-only device refuses writes, so a reporting command can never
/// change an image by mistake.
pub struct FileDevice {
    file: File,
    size: u64,
    writable: bool,
    map: Option<memmap2::Mmap>,
    /// The same file opened with O_DIRECT, for `read_once`; made on first use.
    direct: std::sync::OnceLock<Option<File>>,
    /// The same file opened with O_DIRECT for writing, for `write_direct`.
    direct_w: std::sync::OnceLock<Option<File>>,
    /// A map of the file never read through, for mincore; made on first use.
    residency_map: std::sync::OnceLock<Option<memmap2::Mmap>>,
    path: std::path::PathBuf,
    /// Bytes written since writeback of the file was last started.
    unkicked: std::sync::atomic::AtomicU64,
    /// Bytes read through the map since its pages were last let go.
    mapped_reads: std::sync::atomic::AtomicU64,
}

/// Reads this large bypass the map: one `pread` is one request to the
/// device, with the kernel's readahead for the file behind it, where the
/// map would take a fault per page and a copy all the same.
const MAP_READ_MAX: usize = 64 << 10;

/// Bytes read through the map after which every page it holds is let go
/// (MADV_DONTNEED: the page table entries dropped, the pages stay in the
/// page cache for the next fault). Pages a process maps count as its
/// resident set, which users read and container limits charge: without
/// this a whole-image read leaves the image resident in every reader.
const MAP_RESIDENT: u64 = 8 << 20;

/// Start writeback of the file's dirty pages after this many bytes
/// written, so the device works while the engine does and the flush that
/// follows finds little left (write-behind).
const WRITE_BEHIND: u64 = 32 << 20;

impl FileDevice {
    /// Open the file or block device at `path`, read-write when `writable`. Its
    /// size is fixed here: a file's length, or a block device's end. A
    /// directory is `Invalid`.
    pub fn open(path: &Path, writable: bool) -> Result<FileDevice> {
        let ctx = || format!("cannot open {}", path.display());
        let meta = std::fs::metadata(path).map_err(|e| Error::io(ctx(), e))?;
        if meta.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is a directory, not an image",
                path.display()
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| Error::io(ctx(), e))?;
        // A read-only block device opens for writing and fails each
        // write (EPERM): refused here, in one line, before anything runs.
        #[cfg(target_os = "linux")]
        if writable {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            if meta.file_type().is_block_device() {
                let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
                let ro = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/ro"));
                if ro.is_ok_and(|v| v.trim() == "1") {
                    return Err(Error::io(
                        format!(
                            "cannot open {} for writing: a read-only device",
                            path.display()
                        ),
                        std::io::Error::from_raw_os_error(libc::EROFS),
                    ));
                }
            }
        }
        let size = device_size(&file).map_err(|e| Error::io(ctx(), e))?;
        Ok(FileDevice {
            file,
            size,
            writable,
            map: None,
            direct: std::sync::OnceLock::new(),
            direct_w: std::sync::OnceLock::new(),
            residency_map: std::sync::OnceLock::new(),
            path: path.to_path_buf(),
            unkicked: std::sync::atomic::AtomicU64::new(0),
            mapped_reads: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Open read-only with a memory map for fast whole-image scans.
    pub fn open_mmap(path: &Path) -> Result<FileDevice> {
        let mut d = FileDevice::open(path, false)?;
        if d.size > 0 {
            // SAFETY: the map is read-only; if another process truncates the
            // file under us reads may fault, as with any mmap reader. The
            // tools document that an image must not change while they run.
            let m = unsafe {
                memmap2::MmapOptions::new()
                    .len(d.size as usize)
                    .map(&d.file)
            };
            if let Ok(m) = m {
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Random);
                d.map = Some(m);
            }
        }
        Ok(d)
    }

    /// Open the image files or block devices at `paths` read-only with
    /// memory maps, each named by its path: the devices a reading tool
    /// (restore, mount, a set's assembly) starts from.
    pub fn open_all_mmap(
        paths: &[std::path::PathBuf],
    ) -> Result<Vec<(String, std::sync::Arc<dyn super::BlockDevice>)>> {
        let mut out: Vec<(String, std::sync::Arc<dyn super::BlockDevice>)> =
            Vec::with_capacity(paths.len());
        for p in paths {
            out.push((
                p.display().to_string(),
                std::sync::Arc::new(FileDevice::open_mmap(p)?),
            ));
        }
        Ok(out)
    }

    /// Count `len` bytes read through the map; past [`MAP_RESIDENT`],
    /// let every mapped page go. Readers on other threads lose nothing:
    /// their next access faults the page in again from the page cache.
    fn note_mapped_read(&self, m: &memmap2::Mmap, len: usize) {
        use std::sync::atomic::Ordering;
        let before = self.mapped_reads.fetch_add(len as u64, Ordering::Relaxed);
        if before < MAP_RESIDENT && before + len as u64 >= MAP_RESIDENT {
            #[cfg(unix)]
            // SAFETY: the map is a read-only shared map of a file: dropping
            // its page table entries changes no byte anyone can read
            // through it (unlike a private or anonymous map, which
            // DONTNEED zeroes); slices handed out by `slice` stay valid and
            // fault their pages in again from the file.
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
            self.mapped_reads.store(0, Ordering::Relaxed);
        }
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether every page of the range is in the page cache (asked of
    /// the kernel with mincore on a map of the file; nothing is read).
    fn all_cached(&self, offset: u64, len: usize) -> bool {
        #[cfg(target_os = "linux")]
        {
            let Some(m) = self
                .residency_map
                .get_or_init(|| {
                    if self.size == 0 || self.size > usize::MAX as u64 {
                        return None;
                    }
                    // SAFETY: read-only shared map that is never read
                    // through; it only gives mincore an address range.
                    unsafe {
                        memmap2::MmapOptions::new()
                            .len(self.size as usize)
                            .map(&self.file)
                    }
                    .ok()
                })
                .as_ref()
            else {
                return false;
            };
            const PAGE: u64 = 4096;
            let start = offset - offset % PAGE;
            let end = (offset + len as u64).div_ceil(PAGE) * PAGE;
            let end = end.min(m.len() as u64);
            if end <= start {
                return false;
            }
            let mut vec = vec![0u8; ((end - start) / PAGE) as usize + 1];
            // SAFETY: the range lies inside our mapping (page aligned: the
            // map starts on a page boundary) and `vec` has a byte per page.
            let r = unsafe {
                libc::mincore(
                    m.as_ptr().add(start as usize) as *mut libc::c_void,
                    (end - start) as usize,
                    vec.as_mut_ptr(),
                )
            };
            return r == 0
                && vec[..((end - start).div_ceil(PAGE)) as usize]
                    .iter()
                    .all(|v| v & 1 == 1);
        }
        #[allow(unreachable_code)]
        false
    }

    fn direct_file(&self) -> Option<&File> {
        self.direct.get_or_init(|| self.open_direct(false)).as_ref()
    }

    /// The file again, with O_DIRECT: None where that cannot be had (no
    /// O_DIRECT on its file system, or the path names another file now).
    fn open_direct(&self, write: bool) -> Option<File> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let f = OpenOptions::new()
                .read(true)
                .write(write)
                .custom_flags(libc::O_DIRECT)
                .open(&self.path)
                .ok()?;
            // The path must still name the file we opened.
            let (a, b) = (f.metadata().ok()?, self.file.metadata().ok()?);
            use std::os::unix::fs::MetadataExt;
            (a.dev() == b.dev() && a.ino() == b.ino()).then_some(f)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = write;
            None
        }
    }
}

fn device_size(f: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = f.metadata()?;
    if meta.file_type().is_file() {
        return Ok(meta.len());
    }
    // Block devices report 0 in metadata; seek to the end instead.
    let mut g = f.try_clone()?;
    g.seek(SeekFrom::End(0))
}

/// The rotational flag of block device `major:minor` in sysfs; a
/// partition's is its disk's.
#[cfg(target_os = "linux")]
fn sysfs_rotational(major: u64, minor: u64) -> Option<bool> {
    let dev = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    [
        dev.join("queue/rotational"),
        dev.join("../queue/rotational"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|v| match v.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    })
}

impl BlockDevice for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }
    fn clone_from_file(&self, src: &File, src_off: u64, len: u64, offset: u64) -> Result<()> {
        if !self.writable {
            return Err(Error::Invalid(format!(
                "{} is open read-only",
                self.path.display()
            )));
        }
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(Error::io(
                format!("reflink of {len} bytes at byte {offset} past the end of the image"),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        crate::io::host::clone_range(src, src_off, len, &self.file, offset).map_err(|e| {
            let why = crate::io::host::clone_failure(&e);
            Error::io(
                format!(
                    "cannot share {len} bytes with {} at byte {offset}: {why}",
                    self.path.display()
                ),
                e,
            )
        })
    }
    /// As a loop device over the image decides (loop_update_rotational):
    /// a block device's own flag, or that of the device holding the file;
    /// a file on a filesystem without one (tmpfs) counts as spinning.
    fn rotational(&self) -> Option<bool> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let md = self.file.metadata().ok()?;
            let dev = if md.file_type().is_block_device() {
                md.rdev()
            } else {
                md.dev()
            };
            let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
            if major == 0 {
                return Some(true);
            }
            sysfs_rotational(major, minor)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(past_end(offset, buf.len(), self.size));
        }
        if let Some(m) = self.map.as_ref().filter(|_| buf.len() < MAP_READ_MAX) {
            // The map is advised random (no readahead past what is asked),
            // so a read of several pages would fault them in one by one:
            // one hint first makes it one I/O when they are not cached.
            if buf.len() > 4096 {
                self.prefetch(offset, buf.len() as u64);
            }
            buf.copy_from_slice(&m[offset as usize..offset as usize + buf.len()]);
            self.note_mapped_read(m, buf.len());
            return Ok(());
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io(format!("read of {} bytes at byte {offset}", buf.len()), e))
    }
    fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.size) || (self.map.is_some() && len < MAP_READ_MAX) {
            let mut v = vec![0u8; len];
            self.read_at(offset, &mut v)?;
            return Ok(v);
        }
        let mut v: Vec<u8> = Vec::with_capacity(len);
        let mut done = 0usize;
        // Bounded: every round reads at least one byte or returns.
        while done < len {
            let spare = &mut v.spare_capacity_mut()[..len - done];
            // SAFETY: pread writes at most `spare.len()` bytes into memory we
            // own and never reads it; the bytes it reports written become
            // initialized, and only those are added to the length below.
            let n = unsafe {
                libc::pread(
                    std::os::fd::AsRawFd::as_raw_fd(&self.file),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io(
                    format!("read of {len} bytes at byte {offset}"),
                    e,
                ));
            }
            if n == 0 {
                return Err(Error::io(
                    format!("read of {len} bytes at byte {offset}"),
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ));
            }
            done += n as usize;
            // SAFETY: pread initialized `done` bytes from the start in all.
            unsafe { v.set_len(done) };
        }
        Ok(v)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(Error::io(
                "write to an image opened read-only",
                std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            ));
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| Error::io(format!("write of {} bytes at byte {offset}", buf.len()), e))?;
        use std::sync::atomic::Ordering;
        if self.unkicked.fetch_add(buf.len() as u64, Ordering::Relaxed) + buf.len() as u64
            >= WRITE_BEHIND
        {
            self.unkicked.store(0, Ordering::Relaxed);
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: an advisory call on a descriptor we own: it only
                // starts writeback, and its result changes nothing here
                // (the flush that makes data durable is fdatasync).
                unsafe {
                    libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
                }
            }
        }
        Ok(())
    }
    fn write_direct(&self, offset: u64, buf: &[u8]) -> Result<()> {
        const ALIGN: u64 = 4096;
        let aligned = offset.is_multiple_of(ALIGN)
            && (buf.len() as u64).is_multiple_of(ALIGN)
            && (buf.as_ptr() as u64).is_multiple_of(ALIGN)
            && offset.saturating_add(buf.len() as u64) <= self.size;
        let direct = if aligned && self.writable {
            self.direct_w
                .get_or_init(|| self.open_direct(true))
                .as_ref()
        } else {
            None
        };
        match direct.map(|d| d.write_all_at(buf, offset)) {
            Some(Ok(())) => Ok(()),
            // Refused (alignment the device wants larger): the cache takes it.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => self.write_at(offset, buf),
            Some(Err(e)) => Err(Error::io(
                format!("direct write of {} bytes at byte {offset}", buf.len()),
                e,
            )),
            None => self.write_at(offset, buf),
        }
    }
    fn flush(&self) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        self.file
            .sync_data()
            .map_err(|e| Error::io("flush (fdatasync)", e))
    }
    fn next_data(&self, offset: u64) -> Option<u64> {
        use std::os::fd::AsRawFd;
        if offset >= self.size {
            return None;
        }
        let Ok(off) = libc::off_t::try_from(offset) else {
            return Some(offset);
        };
        // SAFETY: lseek on a descriptor we own; every read and write of
        // the device is positioned (pread, pwrite), so moving the file
        // offset changes nothing else.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), off, libc::SEEK_DATA) };
        if r >= 0 {
            return Some((r as u64).max(offset));
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // Only holes from `offset` to the end.
            Some(libc::ENXIO) => None,
            // A block device or a file system without SEEK_DATA: read it.
            _ => Some(offset),
        }
    }
    fn prefetch(&self, offset: u64, len: u64) {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain advisory call on a descriptor we own; its
            // result is only a hint and is ignored.
            unsafe {
                libc::posix_fadvise(
                    self.file.as_raw_fd(),
                    offset as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
    }
    fn read_once(
        &self,
        offset: u64,
        len: usize,
        buf: &mut IoBuf,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(past_end(offset, len, self.size));
        }
        let b = buf.get(len)?;
        let ctx = || format!("read of {len} bytes at byte {offset}");
        // A range the page cache already holds is copied from it (a second
        // check of the same image reads nothing from the device); the rest
        // is read past the cache. Direct reads need offset and length
        // aligned to the device's logical block; sector-aligned data always
        // is on 512- and 4096-byte devices. Anything the direct path
        // refuses (alignment, a file system without O_DIRECT) goes through
        // the page cache.
        let direct_ok = offset.is_multiple_of(4096)
            && len.is_multiple_of(4096)
            && !self.all_cached(offset, len);
        match self
            .direct_file()
            .filter(|_| direct_ok)
            .map(|d| d.read_exact_at(b, offset))
        {
            Some(Ok(())) => {}
            Some(Err(e)) if e.raw_os_error() != Some(libc::EINVAL) => {
                return Err(Error::io(ctx(), e))
            }
            _ => self
                .file
                .read_exact_at(b, offset)
                .map_err(|e| Error::io(ctx(), e))?,
        }
        f(b);
        Ok(())
    }
    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let m = self.map.as_ref()?;
        let end = (offset as usize).checked_add(len)?;
        let s = m.get(offset as usize..end)?;
        self.note_mapped_read(m, len);
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read_vec` reads without zeroing first, and gives what `read_at`
    /// gives; past the end is an error, as for `read_at`.
    #[test]
    fn read_vec_is_read_at() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(f.path(), &data).unwrap();
        let dev = FileDevice::open(f.path(), false).unwrap();
        assert_eq!(dev.read_vec(12_345, 40_000).unwrap(), data[12_345..52_345]);
        assert_eq!(dev.read_vec(0, 0).unwrap(), Vec::<u8>::new());
        assert!(dev.read_vec(90_000, 20_000).is_err());
    }

    /// Through the map or around it, small reads and large, before and
    /// after the map lets its pages go: the file's bytes, always; and a
    /// slice taken before the pages went still reads them.
    #[test]
    fn mapped_reads_are_the_file_across_releases() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let len = (3 * MAP_RESIDENT as usize) + 12_345;
        let data: Vec<u8> = (0..len as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(f.path(), &data).unwrap();
        let dev = FileDevice::open_mmap(f.path()).unwrap();
        assert!(dev.map.is_some());
        let early = dev.slice(4096, 8192).unwrap();
        // First every byte through the map (the pages let go three
        // times), then sizes on both sides of MAP_READ_MAX.
        let mut through_map = 0u64;
        for sizes in [
            &[4096, MAP_READ_MAX - 1][..],
            &[4096, MAP_READ_MAX - 1, MAP_READ_MAX, 1 << 20],
        ] {
            let (mut off, mut k) = (0usize, 0usize);
            while off < len {
                let n = sizes[k % sizes.len()].min(len - off);
                let mut buf = vec![0u8; n];
                dev.read_at(off as u64, &mut buf).unwrap();
                assert_eq!(buf, data[off..off + n], "read of {n} at {off}");
                assert_eq!(dev.read_vec(off as u64, n).unwrap(), data[off..off + n]);
                if n < MAP_READ_MAX {
                    through_map += 2 * n as u64;
                }
                off += n;
                k += 1;
            }
        }
        // The count started over: the pages were let go.
        let left = dev.mapped_reads.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            through_map > 3 * MAP_RESIDENT && left < MAP_RESIDENT,
            "{left} of {through_map}"
        );
        assert_eq!(early, &data[4096..4096 + 8192]);
    }

    /// A file on tmpfs (no block device) counts as spinning, as a loop
    /// device over it does; a file on a block device gets that device's
    /// flag from sysfs.
    #[cfg(target_os = "linux")]
    #[test]
    fn rotational_as_a_loop_device_sees_it() {
        if std::path::Path::new("/dev/shm").is_dir() {
            let f = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
            let dev = FileDevice::open(f.path(), false).unwrap();
            assert_eq!(dev.rotational(), Some(true));
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let dev = FileDevice::open(&p, false).unwrap();
        use std::os::unix::fs::MetadataExt;
        let d = std::fs::metadata(&p).unwrap().dev();
        let (ma, mi) = (libc::major(d) as u64, libc::minor(d) as u64);
        let want = if ma == 0 {
            Some(true)
        } else {
            sysfs_rotational(ma, mi)
        };
        assert_eq!(dev.rotational(), want);
    }

    /// `read_once` gives the same bytes as `read_at` on the direct path
    /// (aligned) and the page-cache path (unaligned), and refuses a range
    /// past the end.
    #[test]
    fn read_once_matches_read_at() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let data: Vec<u8> = (0..(3u32 << 20) + 1000)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&p, &data).unwrap();
        let dev = FileDevice::open(&p, false).unwrap();
        let mut buf = IoBuf::new();
        // First with the file in the page cache (just written), then with
        // the cache dropped (the direct path).
        for pass in 0..2 {
            if pass == 1 {
                use std::os::fd::AsRawFd;
                dev.file.sync_all().unwrap();
                // SAFETY: advisory call on a descriptor we own.
                unsafe {
                    libc::posix_fadvise(dev.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
                };
            }
            for (off, len) in [
                (0u64, 4096usize),
                (8192, 2 << 20),
                (4096, (3 << 20) - 4096),
                (100, 5000),
                ((3 << 20) - 24, 1024),
            ] {
                let mut got = Vec::new();
                dev.read_once(off, len, &mut buf, &mut |b| got.extend_from_slice(b))
                    .unwrap();
                assert_eq!(
                    got,
                    &data[off as usize..off as usize + len],
                    "pass {pass}: {off}+{len}"
                );
            }
        }
        let mut called = false;
        assert!(dev
            .read_once((3 << 20) - 4096, 8192, &mut buf, &mut |_| called = true)
            .is_err());
        assert!(!called);
    }
}
