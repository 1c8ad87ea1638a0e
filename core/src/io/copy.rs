//! Copying a whole image file to a new one (`btrkit-replay -o`): a reflink
//! where the filesystem under the image can share blocks (one FICLONE
//! ioctl, the data is not read at all), else a copy of the data regions
//! only, keeping holes. Either way the new file is synced before returning.

use crate::{Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// How [`clone_or_copy`] made the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyMethod {
    /// FICLONE: the copy shares every block with the source until either is written.
    Reflink,
    /// The data regions (SEEK_DATA / SEEK_HOLE) copied, holes kept.
    Sparse,
}

fn open_pair(src: &Path, dst: &Path) -> Result<(File, File, u64)> {
    let s = File::open(src).map_err(|e| Error::io(format!("cannot open {}", src.display()), e))?;
    let len = s
        .metadata()
        .map_err(|e| Error::io(format!("cannot stat {}", src.display()), e))?
        .len();
    let d = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| Error::io(format!("cannot create {}", dst.display()), e))?;
    Ok((s, d, len))
}

/// Copy `src` to `dst`, which must not exist: a reflink where the
/// filesystem supports one between the two files, else [`sparse_copy`].
pub fn clone_or_copy(src: &Path, dst: &Path) -> Result<CopyMethod> {
    let (s, d, len) = open_pair(src, dst)?;
    // SAFETY: FICLONE takes the source descriptor as its argument; both
    // descriptors are open for the duration of the call.
    let r = unsafe { libc::ioctl(d.as_raw_fd(), libc::FICLONE, s.as_raw_fd()) };
    let method = if r == 0 {
        CopyMethod::Reflink
    } else {
        let e = std::io::Error::last_os_error();
        // No reflink here (another filesystem, one without shared extents,
        // two mounts): copy instead. Anything else is a real error.
        match e.raw_os_error() {
            Some(
                libc::EOPNOTSUPP
                | libc::EXDEV
                | libc::EINVAL
                | libc::ENOTTY
                | libc::ENOSYS
                | libc::EPERM,
            ) => {
                copy_data(&s, &d, len, src, dst)?;
                CopyMethod::Sparse
            }
            _ => {
                return Err(Error::io(
                    format!("cannot clone {} to {}", src.display(), dst.display()),
                    e,
                ))
            }
        }
    };
    d.sync_all()
        .map_err(|e| Error::io(format!("sync {}", dst.display()), e))?;
    Ok(method)
}

/// Copy a file keeping its holes (SEEK_DATA / SEEK_HOLE), to a new file.
pub fn sparse_copy(src: &Path, dst: &Path) -> Result<()> {
    let (s, d, len) = open_pair(src, dst)?;
    copy_data(&s, &d, len, src, dst)?;
    d.sync_all()
        .map_err(|e| Error::io(format!("sync {}", dst.display()), e))
}

fn copy_data(s: &File, d: &File, len: u64, src: &Path, dst: &Path) -> Result<()> {
    d.set_len(len)
        .map_err(|e| Error::io(format!("cannot size {}", dst.display()), e))?;
    let fd = s.as_raw_fd();
    let mut buf = Vec::new();
    for (data, hole) in super::host::data_runs(s, 0, len) {
        let mut off = data;
        while off < hole {
            let n = ((hole - off) as usize).min(8 << 20);
            // In-kernel copy first (no round trip through user memory);
            // plain copy otherwise.
            let mut so = off as i64;
            let mut dof = off as i64;
            // SAFETY: both descriptors are open; offsets are owned locals.
            let c = unsafe { libc::copy_file_range(fd, &mut so, d.as_raw_fd(), &mut dof, n, 0) };
            if c > 0 {
                off += c as u64;
                continue;
            }
            if buf.len() < n {
                buf.resize(n, 0);
            }
            s.read_exact_at(&mut buf[..n], off)
                .map_err(|e| Error::io(format!("read {}", src.display()), e))?;
            d.write_all_at(&buf[..n], off)
                .map_err(|e| Error::io(format!("write {}", dst.display()), e))?;
            off += n as u64;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_keep_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&[7u8; 10000], 40 << 20).unwrap();
        drop(f);
        let want = std::fs::read(&src).unwrap();
        let a = dir.path().join("a");
        sparse_copy(&src, &a).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), want);
        let b = dir.path().join("b");
        // Whichever way this filesystem allows, the copy is exact.
        let m = clone_or_copy(&src, &b).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), want, "{m:?}");
        // An existing target is refused, not overwritten.
        assert!(clone_or_copy(&src, &b).is_err());
        assert!(sparse_copy(&src, &a).is_err());
    }
}
