//! The few system calls the test helpers make outside [`crate::kcrash`], each
//! behind a safe function: the rest of this crate denies `unsafe`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))
}

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Running with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// fallocate(2) on an open file.
pub fn fallocate(f: &std::fs::File, mode: libc::c_int, off: u64, len: u64) -> std::io::Result<()> {
    let (off, len) = (off as libc::off_t, len as libc::off_t);
    // SAFETY: a descriptor the borrowed File keeps open; integer arguments only.
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) })
}

/// lsetxattr(2): sets `name` on `p` itself (not a symlink's target).
pub fn lsetxattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let cp = cpath(p)?;
    let cn = CString::new(name)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in name"))?;
    // SAFETY: NUL-terminated strings that outlive the call, and a live buffer
    // of exactly `value.len()` bytes.
    check(unsafe {
        libc::lsetxattr(
            cp.as_ptr(),
            cn.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// mkfifo(3).
pub fn mkfifo(p: &Path, mode: u32) -> std::io::Result<()> {
    let cp = cpath(p)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    check(unsafe { libc::mkfifo(cp.as_ptr(), mode as libc::mode_t) })
}
