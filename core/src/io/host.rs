//! What btrkit asks of the host's files beyond reads and writes: where a
//! sparse file holds data (SEEK_DATA/SEEK_HOLE), whether a path may be
//! read, a file's extended attributes, the local time zone and the heap's
//! trim thresholds, and reflinks (FICLONERANGE). The libc calls live here, in
//! one place, each with what makes it sound.

use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// The data runs of `f` in `[start, end)`, in order, holes skipped
/// (SEEK_DATA/SEEK_HOLE). On a filesystem that cannot tell (SEEK_DATA
/// failing otherwise than ENXIO at the first call), the whole range is
/// one run: data is never taken for a hole.
pub fn data_runs(f: &File, start: u64, end: u64) -> DataRuns<'_> {
    DataRuns {
        f,
        pos: start,
        end,
        first: true,
    }
}

/// The data runs of a file as `(start, end)` byte ranges, in order: see
/// [`data_runs`].
pub struct DataRuns<'a> {
    f: &'a File,
    pos: u64,
    end: u64,
    first: bool,
}

impl Iterator for DataRuns<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        // Bounded: every run returned moves `pos` forward by at least a
        // byte, and a run that would not ends the iteration.
        if self.pos >= self.end || self.pos > i64::MAX as u64 {
            return None;
        }
        let fd = self.f.as_raw_fd();
        let first = std::mem::replace(&mut self.first, false);
        #[allow(unsafe_code)]
        // SAFETY: lseek on a descriptor `self.f` keeps open; it only moves
        // the file offset, and the offset passed is in range.
        let d = unsafe { libc::lseek(fd, self.pos as libc::off_t, libc::SEEK_DATA) };
        if d < 0 {
            let unsupported = std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO);
            let run = (first && unsupported).then_some((self.pos, self.end));
            self.pos = self.end;
            return run;
        }
        let d = d as u64;
        if d >= self.end {
            self.pos = self.end;
            return None;
        }
        #[allow(unsafe_code)]
        // SAFETY: as above; `d` came from the kernel.
        let h = unsafe { libc::lseek(fd, d as libc::off_t, libc::SEEK_HOLE) };
        let h = if h < 0 {
            self.end
        } else {
            (h as u64).min(self.end)
        };
        if h <= d {
            self.pos = self.end;
            return None;
        }
        self.pos = h;
        Some((d, h))
    }
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: NUL in path", path.display()),
        )
    })
}

/// Whether this process may read `path` (faccessat with the effective ids,
/// as open checks them).
pub fn readable(path: &Path) -> std::io::Result<()> {
    let c = c_path(path)?;
    #[allow(unsafe_code)]
    // SAFETY: a NUL-terminated path that outlives the call; faccessat only
    // reads it.
    let r = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::R_OK, libc::AT_EACCESS) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The extended attributes of `path` itself (not of a symlink's target):
/// (name, value) pairs.
pub fn xattrs(path: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c = c_path(path)?;
    #[allow(unsafe_code)]
    // SAFETY: a NUL-terminated path; a null buffer of length 0 asks for
    // the size only.
    let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if n <= 0 {
        return Ok(Vec::new());
    }
    let mut names = vec![0u8; n as usize];
    #[allow(unsafe_code)]
    // SAFETY: the buffer is `names.len()` bytes long and writable.
    let n = unsafe {
        libc::llistxattr(
            c.as_ptr(),
            names.as_mut_ptr() as *mut libc::c_char,
            names.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    names.truncate(n as usize);
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "xattr name with a NUL")
        })?;
        #[allow(unsafe_code)]
        // SAFETY: NUL-terminated path and name; a null buffer of length 0
        // asks for the size only.
        let vn = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), std::ptr::null_mut(), 0) };
        if vn < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut v = vec![0u8; vn as usize];
        #[allow(unsafe_code)]
        // SAFETY: the buffer is `v.len()` bytes long and writable.
        let vn = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cn.as_ptr(),
                v.as_mut_ptr() as *mut libc::c_void,
                v.len(),
            )
        };
        if vn < 0 {
            return Err(std::io::Error::last_os_error());
        }
        v.truncate(vn as usize);
        out.push((name.to_vec(), v));
    }
    Ok(out)
}

/// The host's local time of `t` seconds since the epoch (localtime_r, the
/// TZ rules libc loaded): `(year, month 1-12, day, hour, minute, second,
/// offset from UTC in seconds)`, or None where libc cannot represent it.
pub fn local_time(t: i64) -> Option<(i64, u32, u32, u32, u32, u32, i64)> {
    let tt = libc::time_t::try_from(t).ok()?;
    #[allow(unsafe_code)]
    // SAFETY: a zeroed tm is a valid value of the plain C struct, and
    // localtime_r writes only the tm we own (no shared static buffer).
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&tt, &mut tm).is_null() {
            return None;
        }
        tm
    };
    Some((
        tm.tm_year as i64 + 1900,
        (tm.tm_mon + 1) as u32,
        tm.tm_mday as u32,
        tm.tm_hour as u32,
        tm.tm_min as u32,
        tm.tm_sec as u32,
        tm.tm_gmtoff as i64,
    ))
}

/// Keep freed heap memory mapped (glibc): a process that reads thousands of
/// node-sized blocks into short-lived buffers would otherwise hand the heap
/// top back to the kernel and fault it in again page by page. Call before
/// other threads start; a no-op elsewhere than glibc.
pub fn keep_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only adjusts allocator thresholds, and is called
    // before any other thread allocates.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

/// Set extended attribute `name` of `path` itself (not of a symlink's
/// target) to `value` (lsetxattr).
pub fn set_xattr(path: &Path, name: &[u8], value: &[u8]) -> std::io::Result<()> {
    let c = c_path(path)?;
    let cn = CString::new(name).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "xattr name with a NUL")
    })?;
    #[allow(unsafe_code)]
    // SAFETY: NUL-terminated path and name; the value is `value.len()`
    // readable bytes.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            cn.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Set the access and modification times of `path` itself (a symlink is
/// not followed): (seconds, negative before 1970; nanoseconds) each
/// (utimensat). Nanoseconds are clamped below 10^9 (a larger count would
/// make utimensat fail, or be read as UTIME_NOW / UTIME_OMIT); seconds a
/// 32-bit `time_t` cannot hold are EOVERFLOW rather than wrapped.
pub fn set_times(path: &Path, atime: (i64, u32), mtime: (i64, u32)) -> std::io::Result<()> {
    let c = c_path(path)?;
    let ts = |t: (i64, u32)| -> std::io::Result<libc::timespec> {
        Ok(libc::timespec {
            tv_sec: libc::time_t::try_from(t.0)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::EOVERFLOW))?,
            tv_nsec: t.1.min(crate::format::inode::MAX_NSEC) as libc::c_long,
        })
    };
    let times = [ts(atime)?, ts(mtime)?];
    #[allow(unsafe_code)]
    // SAFETY: a NUL-terminated path and an array of two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The soft limit on open descriptors raised to the hard one (a restore
/// holds one per directory being filled, a bounded number).
pub fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}
/// Make a special file at `path`: a FIFO, socket, or character or block
/// device `(major, minor)`, with the type and permission bits of `mode`
/// (mknod).
pub fn mknod(path: &Path, mode: u32, rdev: (u32, u32)) -> std::io::Result<()> {
    let c = c_path(path)?;
    let dev = libc::makedev(rdev.0, rdev.1);
    #[allow(unsafe_code)]
    // SAFETY: a NUL-terminated path; mode and dev are plain values.
    let r = unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, dev) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// FICLONERANGE: the `len` bytes of `dst` at `dst_off` share the blocks of
/// `src` at `src_off` (both on one filesystem that shares blocks; offsets
/// and `len` multiples of its block size).
pub fn clone_range(
    src: &File,
    src_off: u64,
    len: u64,
    dst: &File,
    dst_off: u64,
) -> std::io::Result<()> {
    let arg = libc::file_clone_range {
        src_fd: src.as_raw_fd() as i64,
        src_offset: src_off,
        src_length: len,
        dest_offset: dst_off,
    };
    // SAFETY: both descriptors are open for the call (borrowed Files);
    // the kernel only reads `arg`.
    #[allow(unsafe_code)]
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONERANGE, &arg) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// BTRFS_IOC_SYNC (_IO(0x94, 8)), what `btrfs filesystem sync` sends.
pub const BTRFS_IOC_SYNC: u32 = 0x9408;

/// BTRFS_IOC_SYNC on the filesystem holding `path`: everything written
/// back and committed. The kernel's btrfs and `btrkit-mount --rw` (which
/// gets it through FUSE, where syncfs(2) never reaches a server) answer it.
pub fn btrfs_sync(path: &Path) -> std::io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: an ioctl without an argument on a descriptor open for the
    // call.
    #[allow(unsafe_code)]
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BTRFS_IOC_SYNC as libc::c_ulong) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Why a reflink failed with `e`, for a person.
pub fn clone_failure(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EXDEV) => "the source and the image are on different filesystems",
        Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => {
            "the filesystem holding them cannot share blocks (reflinks need btrfs, or xfs made with reflink=1)"
        }
        _ => "FICLONERANGE failed",
    }
}

/// Whether `dir` (where an image file is or goes) can share the blocks of
/// the file `src` (its first `len` bytes, a multiple of the block size):
/// a reflink into an unnamed temporary file there (O_TMPFILE), so nothing
/// visible is made. The error says why not.
pub fn probe_clone(src: &Path, len: u64, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let s = File::open(src)?;
    let t = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)?;
    clone_range(&s, 0, len, &t, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn data_runs_skip_holes() {
        let td = tempfile::tempdir().unwrap();
        let p = td.path().join("sparse");
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[1u8; 4096], 8 << 20).unwrap();
        f.write_all_at(&[2u8; 4096], 40 << 20).unwrap();
        let runs: Vec<_> = data_runs(&f, 0, 64 << 20).collect();
        // Every written byte is in a run; a filesystem may round runs out
        // or (without hole support) give one run of everything.
        for at in [8u64 << 20, 40 << 20] {
            assert!(
                runs.iter().any(|&(s, e)| s <= at && at + 4096 <= e),
                "{at} not in {runs:?}"
            );
        }
        assert!(runs.windows(2).all(|w| w[0].1 <= w[1].0), "{runs:?}");
        // A range past the data has none; an empty range has none.
        let tail: Vec<_> = data_runs(&f, 48 << 20, 64 << 20).collect();
        assert!(tail.iter().all(|&(s, e)| s < e && e <= 64 << 20));
        assert_eq!(data_runs(&f, 5, 5).count(), 0);
    }
}
