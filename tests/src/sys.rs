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

/// lseek(2) with SEEK_DATA: the first data at or after `off`.
pub fn seek_data(f: &std::fs::File, off: u64) -> std::io::Result<u64> {
    // SAFETY: a descriptor the borrowed File keeps open; integer arguments only.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
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

/// Runs `cmd` (stdout discarded) to its end and returns whether it exited
/// 0, its peak resident set in KiB (wait4's ru_maxrss) and its stderr.
pub fn run_peak_rss(cmd: &mut std::process::Command) -> std::io::Result<(bool, i64, String)> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    // Drained on a thread: a child blocked on a full pipe would never exit.
    let mut pipe = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped (Child::wait is never
    // called on it); status and ru point at live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r != pid {
        return Err(std::io::Error::last_os_error());
    }
    let err = reader.join().unwrap_or_default();
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, ru.ru_maxrss, err))
}

/// One extent of a file's FIEMAP: (logical, length, fe_flags).
pub type FiemapExtent = (u64, u64, u32);
/// fiemap_extent's fe_flags.
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// Every extent of `f` in logical order (the FS_IOC_FIEMAP ioctl, asked
/// again from the end of the last extent until the one marked last).
pub fn fiemap(f: &std::fs::File) -> std::io::Result<Vec<FiemapExtent>> {
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const N: usize = 128;
    let mut out = Vec::new();
    let mut start = 0u64;
    // Bounded: each round moves `start` past an extent, and the kernel
    // marks the file's last extent.
    loop {
        // struct fiemap (32 bytes: fm_start, fm_length, fm_flags and
        // fm_mapped_extents, fm_extent_count and reserved) then N struct
        // fiemap_extent of 56 bytes, as u64 words.
        let mut buf = vec![0u64; (32 + 56 * N) / 8];
        buf[0] = start;
        buf[1] = u64::MAX - start;
        buf[3] = N as u64;
        // SAFETY: the buffer holds the header and fm_extent_count = N
        // extents, which bounds what the kernel writes; it outlives the call.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP as _, buf.as_mut_ptr()) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mapped = (buf[2] >> 32) as usize;
        let mut last = mapped == 0;
        for i in 0..mapped.min(N) {
            let e = &buf[4 + i * 7..4 + i * 7 + 7];
            let (logical, length, flags) = (e[0], e[2], e[5] as u32);
            out.push((logical, length, flags));
            last |= flags & FIEMAP_EXTENT_LAST != 0;
            start = logical + length;
        }
        if last || mapped < N {
            return Ok(out);
        }
    }
}

/// A global allocator that refuses (returns null, so the process aborts
/// naming the size) any single allocation above `CAP` bytes made on a
/// thread that armed it with [`CappedAlloc::armed`]; other threads and
/// other sizes go to the system allocator. For tests that read damaged
/// bytes: a size taken from disk without a bound shows up as an abort.
pub struct CappedAlloc<const CAP: usize>;

thread_local! {
    static ARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
static LARGEST_REFUSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl<const CAP: usize> CappedAlloc<CAP> {
    /// Runs `f` with the cap armed on this thread.
    pub fn armed<T>(f: impl FnOnce() -> T) -> T {
        struct Disarm;
        impl Drop for Disarm {
            fn drop(&mut self) {
                let _ = ARMED.try_with(|a| a.set(false));
            }
        }
        ARMED.with(|a| a.set(true));
        let _d = Disarm;
        f()
    }

    /// The largest allocation refused so far (0: none).
    pub fn largest_refused() -> usize {
        LARGEST_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn refuses(size: usize) -> bool {
        if size > CAP && ARMED.try_with(|a| a.get()).unwrap_or(false) {
            LARGEST_REFUSED.fetch_max(size, std::sync::atomic::Ordering::Relaxed);
            return true;
        }
        false
    }
}

// SAFETY: every request the cap does not refuse goes unchanged to the
// system allocator, which upholds GlobalAlloc's contract; a refusal is a
// null return, which the contract allows.
unsafe impl<const CAP: usize> std::alloc::GlobalAlloc for CappedAlloc<CAP> {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if Self::refuses(l.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, passed on as the contract requires.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: `p` came from System with layout `l` (every allocation
        // this type returns does).
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        if Self::refuses(new) {
            return std::ptr::null_mut();
        }
        // SAFETY: as in dealloc; `new` is the caller's size.
        unsafe { std::alloc::System.realloc(p, l, new) }
    }
}

/// Runs `cmd` (stdin from /dev/null) to its end: its output when it exits
/// 0, otherwise the rendered command line with its exit status, stderr and
/// stdout. The one way the helpers run a command that must succeed; see
/// [`must_run`] for the panicking form.
pub fn run(cmd: &mut std::process::Command) -> Result<std::process::Output, String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{shown}: cannot start: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{shown}: {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', " "),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// [`run`] for a command a test cannot go on without: its output, or a
/// panic naming the command line with its stderr.
pub fn must_run(cmd: &mut std::process::Command) -> std::process::Output {
    run(cmd).unwrap_or_else(|e| panic!("{e}"))
}
