//! Kernel crash images and manifests, the oracle for log replay and for
//! the engine.
//!
//! A scenario (`tests/scenarios/*.scn`) is run with real syscalls on a btrfs
//! filesystem that the Linux kernel mounts from a sparse loop image with
//! `commit=600`, so nothing reaches disk except what the steps make durable
//! (fsync, fdatasync, sync). At `crash` the backing file is copied while the
//! filesystem is still mounted: the copy holds exactly what a power failure at
//! that instant would leave, usually with a log tree. Mounting a copy of it
//! makes the kernel replay the log; [`manifest_of_image`] then records what a
//! user sees of every path, the reference `btrkit-replay` must reproduce.
//!
//! The scenario language is core's (`btrkit_core::workload::script`): one
//! parser for the engine (btrkit-shell) and this kernel harness. Every verb
//! runs here with the syscall or `btrfs` command a user would use; the
//! shell's engine switches (`set`) and `crash --keep-random` are refused.
//! Kernel scenarios write the warm-up files (see
//! `btrkit_core::workload::content::warmup_steps`) unless they say `warmup
//! no`.
//!
//! Every `crash` but the last is an intermediate one: the image is taken, the
//! live filesystem is thrown away, the image is mounted again (the kernel
//! replays its log) and the steps go on. The last `crash` (or the end of the
//! steps) gives the crash image.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::mount::LoopMount;
use crate::sys::run;

pub use btrkit_core::workload::content::{file_content, file_name, file_size, FillStream, Prng};
pub use btrkit_core::workload::manifest::{
    check_expectations, content_hash, md5_hex, Entry, Manifest, Outcome,
};
pub use btrkit_core::workload::script::{
    parse_num, Expect, Fill, NodeKind, Script as Scenario, Step, SyncKind,
};

/// Errors of this module are strings: they end up in test failure messages.
pub type Res<T> = Result<T, String>;

/// Bumped whenever a change here changes the crash images a scenario gives,
/// so cached images are regenerated.
pub const GENERATOR_VERSION: u32 = 4;

/// A scenario file.
pub fn load_scenario(path: &Path) -> Res<Scenario> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Scenario::parse(&name, &text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The scenarios of a directory, sorted by file name.
pub fn load_dir(dir: &Path) -> Res<Vec<Scenario>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    files.sort();
    files.iter().map(|p| load_scenario(p)).collect()
}

// ---------------------------------------------------------------------------
// Commands

/// Copy keeping holes, as the crash capture and every image copy do.
pub fn copy_sparse(from: &Path, to: &Path) -> Res<()> {
    run(Command::new("cp").arg("--sparse=always").arg(from).arg(to)).map(|_| ())
}

/// Whether this machine can run the kernel oracle; `Err` says why not.
pub fn can_run() -> Res<()> {
    if !crate::sys::is_root() {
        return Err("needs root (loop devices and mount)".into());
    }
    // Loop devices that attach and detach, btrfs in the kernel (loaded when
    // it is a module).
    crate::mount::probe()?;
    for tool in ["mkfs.btrfs", "btrfs", "losetup", "mount", "umount", "cp"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!("{tool} is not installed"));
        }
    }
    Ok(())
}

/// At most this many kernel runs (mkfs, mount, workload, manifests) at once in
/// this process; `BTRKIT_KCRASH_JOBS` overrides the default of 2.
pub fn max_jobs() -> usize {
    std::env::var("BTRKIT_KCRASH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2)
}

static SLOTS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A held kernel slot; see [`slot`].
pub struct Slot(());

/// Wait for one of the [`max_jobs`] slots. Hold it for the kernel-heavy part
/// of a test so parallel tests of one binary do not overload the machine.
pub fn slot() -> Slot {
    let (m, cv) = &SLOTS;
    let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
    while *n >= max_jobs() {
        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
    }
    *n += 1;
    Slot(())
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (m, cv) = &SLOTS;
        let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        cv.notify_one();
    }
}

/// Run `f` on every item with at most `jobs` threads; results in input order.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(usize, &T) -> R + Sync,
) -> Vec<R> {
    let queue = Mutex::new((0..items.len()).collect::<VecDeque<_>>());
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1).min(items.len().max(1)) {
            s.spawn(|| loop {
                let Some(i) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                    break;
                };
                let r = f(i, &items[i]);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

// ---------------------------------------------------------------------------
// Running a scenario on the kernel

fn cpath(p: &Path) -> Res<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("NUL in path {}", p.display()))
}

fn errno(what: &str, p: &Path) -> String {
    format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    )
}

fn check(r: libc::c_int, what: &str, p: &Path) -> Res<()> {
    if r != 0 {
        return Err(errno(what, p));
    }
    Ok(())
}

fn fsync_fd(fd: libc::c_int, data_only: bool, p: &Path) -> Res<()> {
    // SAFETY: integer arguments only: `fd` is the caller's open descriptor (a closed one makes
    // the call fail with EBADF), no memory is passed.
    let r = unsafe {
        if data_only {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    };
    check(r, if data_only { "fdatasync" } else { "fsync" }, p)
}

/// Write `len` bytes of `fill` at `off` through `fd` in 1 MiB pieces. With
/// `enospc_ok`, running out of space ends the write quietly.
fn write_fill_fd(
    fd: libc::c_int,
    p: &Path,
    off: u64,
    len: u64,
    fill: &Fill,
    enospc_ok: bool,
) -> Res<()> {
    let mut stream = FillStream::new(fill);
    let mut buf = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        stream.next(&mut buf[..n]);
        let mut w = 0;
        while w < n {
            // SAFETY: the pointer and length are those of the live slice `buf[w..n]`, which the
            // kernel only reads.
            let r = unsafe {
                libc::pwrite(
                    fd,
                    buf[w..n].as_ptr().cast(),
                    n - w,
                    (off + done + w as u64) as libc::off_t,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if enospc_ok && e.raw_os_error() == Some(libc::ENOSPC) {
                    return Ok(());
                }
                return Err(format!("write {}: {e}", p.display()));
            }
            w += r as usize;
        }
        done += n as u64;
    }
    Ok(())
}

/// An open descriptor that closes on drop.
struct Fd(libc::c_int);
impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: `self.0` came from open(2), this Fd alone owns it, and it is closed once,
            // here.
            unsafe { libc::close(self.0) };
        }
    }
}

/// Wait for the writeback already under way on `p` to end (it starts
/// none), then give the ordered extent's completion worker a moment.
fn settle_writeback(p: &Path) -> Res<()> {
    let f = open_fd(p, libc::O_RDONLY, 0)?;
    check(
        // SAFETY: `f` keeps the descriptor open across the call; integer arguments only.
        unsafe {
            libc::sync_file_range(
                f.0,
                0,
                0,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )
        },
        "sync_file_range(wait)",
        p,
    )?;
    std::thread::sleep(Duration::from_millis(5));
    Ok(())
}

fn open_fd(p: &Path, flags: libc::c_int, mode: libc::mode_t) -> Res<Fd> {
    let c = cpath(p)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(errno("open", p));
    }
    Ok(Fd(fd))
}

/// Runs steps on a mounted filesystem with real syscalls. Descriptors
/// opened by `open-fd` and `tmpfile` stay open under their names until
/// `close-fd`, and steps naming them use them (as kcrash.py does).
pub struct Runner {
    root: PathBuf,
    fds: HashMap<String, Fd>,
}

impl Runner {
    pub fn new(root: &Path) -> Runner {
        Runner {
            root: root.to_path_buf(),
            fds: HashMap::new(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// Close every descriptor (before an unmount).
    pub fn close_all(&mut self) {
        self.fds.clear();
    }

    /// The descriptor a step uses for `name`: the held one, or a new one
    /// (`None` in the second field) opened with `flags`.
    fn fd(&self, name: &str, flags: libc::c_int) -> Res<(libc::c_int, Option<Fd>)> {
        if let Some(f) = self.fds.get(name) {
            return Ok((f.0, None));
        }
        let p = self.p(name);
        let f = match open_fd(&p, flags, 0o644) {
            Ok(f) => f,
            // Directories open read-only (fsync of a directory).
            Err(_) if flags & libc::O_CREAT == 0 => open_fd(&p, libc::O_RDONLY, 0)?,
            Err(e) => return Err(e),
        };
        Ok((f.0, Some(f)))
    }

    fn btrfs(&self, args: &[&str], path: Option<&Path>) -> Res<()> {
        let mut c = Command::new("btrfs");
        c.args(args);
        if let Some(p) = path {
            c.arg(p);
        }
        run(&mut c).map(drop)
    }

    /// Run one step. `Crash` and `Remount` need the mount and are handled by
    /// [`generate`]; the shell's inspection verbs do nothing here and its
    /// engine switches are refused.
    pub fn apply(&mut self, st: &Step) -> Res<()> {
        let io = |what: &str, p: &Path, r: std::io::Result<()>| {
            r.map_err(|e| format!("{what} {}: {e}", p.display()))
        };
        match st {
            Step::Mkdir(p) => io("mkdir", &self.p(p), std::fs::create_dir(self.p(p))),
            Step::Create(p) => {
                let p = self.p(p);
                open_fd(&p, libc::O_CREAT | libc::O_WRONLY, 0o644).map(drop)
            }
            Step::Write {
                path,
                off,
                len,
                fill,
                enospc_ok,
            } => {
                let (fd, _own) = self.fd(path, libc::O_CREAT | libc::O_WRONLY)?;
                write_fill_fd(fd, &self.p(path), *off, *len, fill, *enospc_ok)
            }
            Step::Swrite {
                path,
                off,
                len,
                byte,
                datasync,
            } => {
                let p = self.p(path);
                let flag = if *datasync {
                    libc::O_DSYNC
                } else {
                    libc::O_SYNC
                };
                let f = open_fd(&p, libc::O_CREAT | libc::O_WRONLY | flag, 0o644)?;
                write_fill_fd(f.0, &p, *off, *len, &Fill::Byte(*byte), false)
            }
            Step::Dwrite {
                path,
                off,
                len,
                byte,
                chunk,
            } => {
                let p = self.p(path);
                let f = open_fd(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_DIRECT, 0o644)?;
                // O_DIRECT wants an aligned buffer: a private anonymous mapping.
                let n = (*chunk).max(1) as usize;
                // SAFETY: a new private anonymous mapping of `n >= 1` bytes; no existing memory
                // is touched.
                let buf = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        n,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                if buf == libc::MAP_FAILED {
                    return Err(errno("mmap", &p));
                }
                // SAFETY: `buf` is the writable mapping of `n` bytes made above (MAP_FAILED
                // returned early) and nothing else refers to it.
                unsafe { std::ptr::write_bytes(buf as *mut u8, *byte, n) };
                let mut done = 0u64;
                let mut res = Ok(());
                while done < *len {
                    let k = (*len - done).min(n as u64) as usize;
                    // SAFETY: `f` is open; the kernel reads `k <= n` bytes of the live `n`-byte
                    // mapping `buf`.
                    let r = unsafe { libc::pwrite(f.0, buf, k, (off + done) as libc::off_t) };
                    if r <= 0 {
                        res = Err(errno("dwrite", &p));
                        break;
                    }
                    done += r as u64;
                }
                // SAFETY: unmaps exactly the mapping made above; `buf` is not used afterwards.
                unsafe { libc::munmap(buf, n) };
                res
            }
            Step::Mwrite {
                path,
                off,
                len,
                byte,
            } => {
                let p = self.p(path);
                let f = open_fd(&p, libc::O_RDWR, 0)?;
                let pg = 4096u64;
                let start = off / pg * pg;
                let maplen = (off + len - start) as usize;
                if maplen == 0 {
                    return Ok(());
                }
                // SAFETY: a new shared mapping of `maplen > 0` bytes of the open `f` at the
                // page-aligned offset `start`; no existing memory is touched.
                let m = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        maplen,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        f.0,
                        start as libc::off_t,
                    )
                };
                if m == libc::MAP_FAILED {
                    return Err(errno("mmap", &p));
                }
                // SAFETY: `(off - start) + len == maplen`, so the bytes written lie inside the
                // mapping made above (MAP_FAILED returned early). A range past the file's end
                // would raise SIGBUS, a crash of the test rather than memory corruption; the
                // scenarios write inside their files.
                unsafe {
                    std::ptr::write_bytes(
                        (m as *mut u8).add((off - start) as usize),
                        *byte,
                        *len as usize,
                    )
                };
                // munmap: the pages stay dirty, nothing is synced.
                // SAFETY: unmaps exactly the mapping made above; `m` is not used afterwards.
                unsafe { libc::munmap(m, maplen) };
                Ok(())
            }
            Step::Msync { path, range } => {
                let p = self.p(path);
                let f = open_fd(&p, libc::O_RDWR, 0)?;
                let size = std::fs::metadata(&p)
                    .map_err(|e| format!("stat {}: {e}", p.display()))?
                    .len();
                let (off, len) = range.unwrap_or((0, size));
                let pg = 4096u64;
                let start = off / pg * pg;
                let maplen = (off + len - start) as usize;
                if maplen == 0 {
                    return Ok(());
                }
                // SAFETY: a new shared mapping of `maplen > 0` bytes of the open `f` at the
                // page-aligned offset `start`; no existing memory is touched.
                let m = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        maplen,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        f.0,
                        start as libc::off_t,
                    )
                };
                if m == libc::MAP_FAILED {
                    return Err(errno("mmap", &p));
                }
                // SAFETY: `m` and `maplen` are the live mapping made above (MAP_FAILED returned
                // early).
                let r = unsafe { libc::msync(m, maplen, libc::MS_SYNC) };
                // SAFETY: unmaps exactly the mapping made above; `m` is not used afterwards.
                unsafe { libc::munmap(m, maplen) };
                check(r, "msync", &p)
            }
            Step::SyncRange {
                path,
                off,
                len,
                flags,
            } => {
                let p = self.p(path);
                let f = open_fd(&p, libc::O_RDWR, 0)?;
                check(
                    // SAFETY: `f` keeps the descriptor open across the call; integer arguments
                    // only.
                    unsafe { libc::sync_file_range(f.0, *off as i64, *len as i64, *flags) },
                    "sync_file_range",
                    &p,
                )
            }
            Step::Truncate(p, size) => {
                let (fd, _own) = self.fd(p, libc::O_WRONLY)?;
                check(
                    // SAFETY: `fd` is held open by the runner's table or by `_own` until after
                    // the call; integer arguments only.
                    unsafe { libc::ftruncate(fd, *size as libc::off_t) },
                    "truncate",
                    &self.p(p),
                )
            }
            Step::Fallocate {
                path,
                off,
                len,
                keep,
                enospc_ok,
            } => self.falloc_enospc_ok(
                path,
                if *keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 },
                *off,
                *len,
                *enospc_ok,
            ),
            Step::Punch { path, off, len } => self.falloc(
                path,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                *off,
                *len,
            ),
            Step::ZeroRange {
                path,
                off,
                len,
                keep,
            } => self.falloc(
                path,
                libc::FALLOC_FL_ZERO_RANGE | if *keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 },
                *off,
                *len,
            ),
            Step::Collapse { path, off, len } => {
                self.falloc(path, libc::FALLOC_FL_COLLAPSE_RANGE, *off, *len)
            }
            Step::Clone {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                let (sfd, _s) = self.fd(src, libc::O_RDONLY)?;
                let (dfd, _d) = self.fd(dst, libc::O_RDWR | libc::O_CREAT)?;
                // struct file_clone_range { s64 src_fd; u64 src_offset, src_length, dest_offset; }
                let arg: [u64; 4] = [sfd as u64, *src_off, *len, *dst_off];
                const FICLONERANGE: libc::c_ulong = 0x4020_940d;
                check(
                    // SAFETY: FICLONERANGE (_IOW(0x94, 13, struct file_clone_range), size 32 in
                    // the request number) reads a struct file_clone_range { s64 src_fd; u64
                    // src_offset, src_length, dest_offset; } from its argument: `arg` is
                    // exactly those four 8-byte fields in that order and lives across the call.
                    // `sfd` and `dfd` are held open by `_s`/`_d` or the runner's table.
                    unsafe { libc::ioctl(dfd, FICLONERANGE as _, arg.as_ptr()) },
                    "clone",
                    &self.p(dst),
                )
            }
            Step::Link(a, b) => io("link", &self.p(b), std::fs::hard_link(self.p(a), self.p(b))),
            Step::Symlink { target, path } => io(
                "symlink",
                &self.p(path),
                std::os::unix::fs::symlink(target, self.p(path)),
            ),
            Step::Rename(a, b) => {
                let (from, to) = (self.p(a), self.p(b));
                // Replacing a non-empty regular file: btrfs_rename starts
                // writeback of the source's data (filemap_flush), whose
                // ordered extent completes in a worker shortly after. A
                // commit in the next microseconds may miss it or not; a
                // program's next step normally finds it done, and so do
                // the scenarios: wait for that writeback to end.
                let flushes = std::fs::symlink_metadata(&from).is_ok_and(|m| m.is_file())
                    && std::fs::symlink_metadata(&to).is_ok_and(|m| m.is_file() && m.len() > 0);
                io("rename", &from, std::fs::rename(&from, &to))?;
                if flushes {
                    settle_writeback(&to)?;
                }
                Ok(())
            }
            Step::Exchange(a, b) => {
                let (ca, cb) = (cpath(&self.p(a))?, cpath(&self.p(b))?);
                check(
                    // SAFETY: two NUL-terminated paths that live across the call, which only
                    // reads them; AT_FDCWD and a flag are integers.
                    unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            ca.as_ptr(),
                            libc::AT_FDCWD,
                            cb.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    },
                    "exchange",
                    &self.p(a),
                )
            }
            Step::Unlink(p) => io("unlink", &self.p(p), std::fs::remove_file(self.p(p))),
            Step::Rmdir(p) => io("rmdir", &self.p(p), std::fs::remove_dir(self.p(p))),
            Step::SetXattr { path, name, value } => {
                let p = self.p(path);
                let cn = CString::new(name.as_str()).map_err(|_| "NUL in xattr name")?;
                // SAFETY: NUL-terminated strings (the path's CString is a temporary that lives
                // to the end of the statement, past the call) and the live buffer `value` of
                // `value.len()` bytes, which the kernel only reads.
                let r = unsafe {
                    libc::lsetxattr(
                        cpath(&p)?.as_ptr(),
                        cn.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                };
                check(r, &format!("setxattr {name}"), &p)
            }
            Step::RemoveXattr { path, name } => {
                let p = self.p(path);
                let cn = CString::new(name.as_str()).map_err(|_| "NUL in xattr name")?;
                check(
                    // SAFETY: NUL-terminated strings that live past the call (the path's
                    // CString is a temporary of this statement).
                    unsafe { libc::lremovexattr(cpath(&p)?.as_ptr(), cn.as_ptr()) },
                    &format!("removexattr {name}"),
                    &p,
                )
            }
            Step::Fsync(p) | Step::Fdatasync(p) => {
                let (fd, _own) = self.fd(p, libc::O_RDONLY)?;
                fsync_fd(fd, matches!(st, Step::Fdatasync(_)), &self.p(p))
            }
            Step::Sync => {
                // syncfs on btrfs commits the running transaction.
                let f = open_fd(&self.root, libc::O_RDONLY, 0)?;
                // SAFETY: `f` keeps the descriptor open across the call.
                check(unsafe { libc::syncfs(f.0) }, "syncfs", &self.root)
            }
            Step::Chmod(p, mode) => {
                use std::os::unix::fs::PermissionsExt;
                let p = self.p(p);
                io(
                    "chmod",
                    &p,
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)),
                )
            }
            Step::Chown(p, u, g) => io(
                "chown",
                &self.p(p),
                std::os::unix::fs::lchown(self.p(p), Some(*u), Some(*g)),
            ),
            Step::Touch(p) => {
                let p = self.p(p);
                if std::fs::symlink_metadata(&p).is_err() {
                    open_fd(&p, libc::O_CREAT | libc::O_WRONLY, 0o644)?;
                }
                check(
                    // SAFETY: a NUL-terminated path that lives past the call; a null `times`
                    // means "now" (utimensat(2)), nothing is read through it.
                    unsafe {
                        libc::utimensat(libc::AT_FDCWD, cpath(&p)?.as_ptr(), std::ptr::null(), 0)
                    },
                    "touch",
                    &p,
                )
            }
            Step::Mknod(p, kind) => {
                let p = self.p(p);
                let (mode, dev) = match kind {
                    NodeKind::Fifo => (libc::S_IFIFO | 0o644, 0),
                    NodeKind::Chr(a, b) => (libc::S_IFCHR | 0o644, libc::makedev(*a, *b)),
                    NodeKind::Blk(a, b) => (libc::S_IFBLK | 0o644, libc::makedev(*a, *b)),
                };
                check(
                    // SAFETY: a NUL-terminated path that lives past the call; integer arguments
                    // otherwise.
                    unsafe { libc::mknod(cpath(&p)?.as_ptr(), mode, dev) },
                    "mknod",
                    &p,
                )
            }
            Step::Tmpfile(h) => {
                let f = open_fd(&self.root, libc::O_TMPFILE | libc::O_RDWR, 0o644)?;
                self.fds.insert(h.clone(), f);
                Ok(())
            }
            Step::OpenFd(p) => {
                let path = self.p(p);
                let flags = if path.is_dir() {
                    libc::O_RDONLY
                } else {
                    libc::O_RDWR
                };
                let f = open_fd(&path, flags, 0)?;
                self.fds.insert(p.clone(), f);
                Ok(())
            }
            Step::CloseFd(p) => self
                .fds
                .remove(p)
                .map(drop)
                .ok_or_else(|| format!("close-fd {p}: not open")),
            Step::Evict => std::fs::write("/proc/sys/vm/drop_caches", "2\n")
                .map_err(|e| format!("drop_caches: {e}")),
            Step::Sleep(s) => {
                std::thread::sleep(Duration::from_secs_f64(*s));
                Ok(())
            }
            Step::SubvolCreate(p) => self.btrfs(&["subvolume", "create"], Some(&self.p(p))),
            Step::Snapshot(a, b) => {
                let mut c = Command::new("btrfs");
                c.args(["subvolume", "snapshot"])
                    .arg(self.p(a))
                    .arg(self.p(b));
                run(&mut c).map(drop)
            }
            Step::SubvolDelete(p) => self.btrfs(&["subvolume", "delete"], Some(&self.p(p))),
            Step::SubvolSetDefault(p) => {
                self.btrfs(&["subvolume", "set-default"], Some(&self.p(p)))
            }
            Step::QuotaEnable => {
                // Enabling starts a rescan; wait for it, so the counters are
                // complete before the next steps.
                self.btrfs(&["quota", "enable"], Some(&self.root.clone()))?;
                self.btrfs(&["quota", "rescan", "-W"], Some(&self.root.clone()))
            }
            Step::BalanceMetadata => {
                self.btrfs(&["balance", "start", "-m"], Some(&self.root.clone()))
            }
            Step::Balance(args) => {
                let mut a: Vec<&str> = vec!["balance", "start"];
                a.extend(args.iter().map(String::as_str));
                self.btrfs(&a, Some(&self.root.clone()))
            }
            Step::WriteFiles {
                dir,
                count,
                min,
                max,
                sync,
            } => {
                let d = self.p(dir);
                for i in 0..*count {
                    let p = d.join(file_name(i));
                    let data = file_content(i, file_size(i, *min, *max));
                    let f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o644)
                        .open(&p)
                        .map_err(|e| format!("create {}: {e}", p.display()))?;
                    f.write_all_at(&data, 0)
                        .map_err(|e| format!("write {}: {e}", p.display()))?;
                    let r = match sync {
                        SyncKind::None => Ok(()),
                        SyncKind::Fsync => f.sync_all(),
                        SyncKind::Fdatasync => f.sync_data(),
                    };
                    r.map_err(|e| format!("sync {}: {e}", p.display()))?;
                }
                Ok(())
            }
            Step::Read { .. } | Step::Ls(_) | Step::Stat(_) | Step::Stats { .. } => Ok(()),
            Step::Set { name, .. } => {
                Err(format!("set {name}: an engine switch; the kernel has none"))
            }
            Step::Crash {
                keep_random: Some(_),
            } => Err(
                "crash --keep-random: the kernel harness can only take the image as it is".into(),
            ),
            Step::Crash { .. } | Step::Remount => Err(format!(
                "{}: needs the mount (run through generate)",
                st.verb()
            )),
        }
    }

    fn falloc(&self, path: &str, mode: libc::c_int, off: u64, len: u64) -> Res<()> {
        self.falloc_enospc_ok(path, mode, off, len, false)
    }

    /// fallocate(2); with `enospc_ok`, ENOSPC is an outcome, not a failure.
    fn falloc_enospc_ok(
        &self,
        path: &str,
        mode: libc::c_int,
        off: u64,
        len: u64,
        enospc_ok: bool,
    ) -> Res<()> {
        // fallocate(1), which kcrash.py runs, creates a missing file.
        let (fd, _own) = self.fd(path, libc::O_WRONLY | libc::O_CREAT)?;
        // SAFETY: `fd` is held open by the runner's table or by `_own` until after the call;
        // integer arguments only.
        let r = unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) };
        if r != 0
            && enospc_ok
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSPC)
        {
            return Ok(());
        }
        check(r, "fallocate", &self.p(path))
    }
}

pub use btrkit_core::workload::content::WARMUP_DIR;

/// A crash image: the backing file of a live mount copied at `crash`.
#[derive(Clone, Debug)]
pub struct CrashImage {
    /// The crash image (of a set: its first device).
    pub path: PathBuf,
    /// Every device's crash image, `path` first.
    pub devices: Vec<PathBuf>,
    /// Superblock `log_root` (0: no log, the kernel would not replay).
    pub log_root: u64,
    pub generation: u64,
}

/// Superblock `(generation, log_root)` of an image.
pub fn super_log_root(img: &Path) -> Res<(u64, u64)> {
    let dev = btrkit_core::io::FileDevice::open(img, false)
        .map_err(|e| format!("{}: {e}", img.display()))?;
    let sb = btrkit_core::image::read_superblock(&dev, 0)
        .map_err(|e| format!("{}: {e}", img.display()))?;
    Ok((sb.generation.get(), sb.log_root.get()))
}

/// Run `scn` in `work` (which must be empty or absent and private to this
/// run: it holds the live image and the mount point) and leave the crash
/// image at `work/crash.img`. Checks the log expectation of the scenario.
/// A scenario with `devices N` runs on N devices (its `mkfs` names the
/// profiles).
pub fn generate(scn: &Scenario, work: &Path) -> Res<CrashImage> {
    generate_on_set(scn, work, scn.devices, &[])
}

/// [`generate`] on a filesystem of `n` devices made with the scenario's
/// mkfs options and `profile` (`-d raid1 -m raid1`...): the crash images
/// are `work/crash.img` (devid 1) and `work/crash-N.img`, each copied from
/// its device at the crash with nothing committed in between (commit=600).
pub fn generate_on_set(scn: &Scenario, work: &Path, n: usize, profile: &[&str]) -> Res<CrashImage> {
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let name = |base: &str, i: usize| {
        if i == 1 {
            work.join(format!("{base}.img"))
        } else {
            work.join(format!("{base}-{i}.img"))
        }
    };
    let lives: Vec<PathBuf> = (1..=n).map(|i| name("live", i)).collect();
    let crashes: Vec<PathBuf> = (1..=n).map(|i| name("crash", i)).collect();
    for (l, c) in lives.iter().zip(&crashes) {
        let _ = std::fs::remove_file(l);
        let _ = std::fs::remove_file(c);
        File::create(l)
            .and_then(|f| f.set_len(scn.fssize))
            .map_err(|e| format!("{}: {e}", l.display()))?;
    }
    run(Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .args(&scn.mkfs)
        .args(profile)
        .args(&lives))
    .map_err(|e| format!("{}: {e}", scn.name))?;
    let live = lives[0].clone();
    let crash = crashes[0].clone();
    let mut opts = scn.mount_options();
    for l in &lives[1..] {
        opts.push_str(&format!(",device={}", l.display()));
    }
    let mnt = work.join("mnt");
    let mut m = Some(LoopMount::mount(&live, &mnt, &opts)?);
    let mut r = Runner::new(&mnt);
    if scn.warmup.unwrap_or(true) {
        for st in btrkit_core::workload::content::warmup_steps() {
            r.apply(&st).map_err(|e| format!("warm-up: {e}"))?;
        }
    }
    // Whatever mount and warm-up dirtied goes into a commit before the steps
    // (the warm-up ends with one).
    if !scn.warmup.unwrap_or(true) {
        r.apply(&Step::Sync)?;
    }
    let n_crashes = scn.steps.iter().filter(|(_, s)| s.is_crash()).count();
    let mut seen = 0;
    for (line, st) in &scn.steps {
        match st {
            Step::Crash { keep_random: None } => {
                seen += 1;
                let tmps: Vec<PathBuf> = (0..lives.len())
                    .map(|i| work.join(format!("crash-{i}.tmp")))
                    .collect();
                for (l, t) in lives.iter().zip(&tmps) {
                    copy_sparse(l, t)?;
                }
                if seen < n_crashes {
                    // The live filesystem is thrown away unsynced; the next
                    // steps run on what the kernel makes of the crash image.
                    r.close_all();
                    if let Some(old) = m.take() {
                        old.unmount()?;
                    }
                    for (t, l) in tmps.iter().zip(&lives) {
                        std::fs::rename(t, l).map_err(|e| e.to_string())?;
                    }
                    m = Some(LoopMount::mount(&live, &mnt, &opts)?);
                    continue;
                }
                for (t, c) in tmps.iter().zip(&crashes) {
                    std::fs::rename(t, c).map_err(|e| e.to_string())?;
                }
                break;
            }
            Step::Remount => {
                r.close_all();
                if let Some(old) = m.take() {
                    old.unmount()?;
                }
                m = Some(LoopMount::mount(&live, &mnt, &opts)?);
            }
            _ => r
                .apply(st)
                .map_err(|e| format!("{} line {line}: {e}", scn.name))?,
        }
    }
    r.close_all();
    if !crash.exists() {
        for (l, c) in lives.iter().zip(&crashes) {
            copy_sparse(l, c)?;
        }
    }
    if let Some(m) = m.take() {
        m.unmount()?;
    }
    for l in &lives {
        let _ = std::fs::remove_file(l);
    }
    let (generation, log_root) = super_log_root(&crash)?;
    let want = scn.wants_log();
    if want && log_root == 0 {
        return Err(format!("{}: the crash image has no log tree (log_root 0), the kernel committed instead of logging", scn.name));
    }
    if scn.expect_log == Some(false) && log_root != 0 {
        return Err(format!(
            "{}: the crash image has a log tree at {log_root}, the scenario expects none",
            scn.name
        ));
    }
    Ok(CrashImage {
        path: crash,
        devices: crashes,
        log_root,
        generation,
    })
}

/// Key of a cached crash image: scenario text, generator version, kernel.
fn cache_key(scn: &Scenario) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut h = Fnv::new();
    h.update(scn.text.as_bytes());
    h.update(&GENERATOR_VERSION.to_le_bytes());
    h.update(kernel.trim().as_bytes());
    format!("{}-{:016x}", scn.name, h.finish())
}

/// The crash image of `scn`, generated once and kept in `cache` (keyed by the
/// scenario text, generator version and kernel release). Set
/// `BTRKIT_KCRASH_FRESH=1` to regenerate once per process. Threads asking for
/// the same scenario wait for one generation.
pub fn cached_crash_image(scn: &Scenario, cache: &Path) -> Res<CrashImage> {
    static LOCKS: Mutex<Option<HashMap<String, Arc<Mutex<()>>>>> = Mutex::new(None);
    static FRESH_DONE: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let key = cache_key(scn);
    let lock = LOCKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(key.clone())
        .or_default()
        .clone();
    let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
    let path = cache.join(format!("{key}.img"));
    // A set's other devices beside it, as generate_on_set names them.
    let paths: Vec<PathBuf> = std::iter::once(path.clone())
        .chain((2..=scn.devices).map(|i| cache.join(format!("{key}-{i}.img"))))
        .collect();
    let fresh = std::env::var("BTRKIT_KCRASH_FRESH").is_ok_and(|v| v == "1")
        && FRESH_DONE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert(key.clone());
    if paths.iter().all(|p| p.exists()) && !fresh {
        let (generation, log_root) = super_log_root(&path)?;
        return Ok(CrashImage {
            devices: paths,
            path,
            log_root,
            generation,
        });
    }
    std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    // Older images of this scenario (other text, generator or kernel) go:
    // `NAME-<16 hex>.img`, and `NAME-<16 hex>-N.img` of a set.
    if let Ok(rd) = std::fs::read_dir(cache) {
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = f
                .strip_prefix(scn.name.as_str())
                .and_then(|r| r.strip_prefix('-'))
                .and_then(|r| r.strip_suffix(".img"))
            else {
                continue;
            };
            let hex = rest.split('-').next().unwrap_or("");
            let tail_ok = rest[hex.len()..]
                .strip_prefix('-')
                .is_none_or(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            let stale = hex.len() == 16
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
                && (rest.len() == 16 || tail_ok);
            if stale && !paths.contains(&e.path()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let work = tempfile::Builder::new()
        .prefix(&format!("kcrash-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let c = {
        let _s = slot();
        generate(scn, work.path())?
    };
    // Into place by a rename only: a run killed while copying leaves a
    // `.part` file, never a cached image cut short.
    for (from, to) in c.devices.iter().zip(&paths) {
        let part = to.with_extension("img.part");
        std::fs::rename(from, to)
            .or_else(|_| {
                copy_sparse(from, &part)
                    .map_err(std::io::Error::other)
                    .and_then(|_| std::fs::rename(&part, to))
            })
            .map_err(|e| format!("{}: {e}", to.display()))?;
    }
    Ok(CrashImage {
        devices: paths,
        path,
        ..c
    })
}

/// Where the test binaries and tools keep cached crash images: next to the
/// binaries of the current profile (`target/debug/kcrash-cache`).
pub fn default_cache_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir.join("kcrash-cache")
}

// ---------------------------------------------------------------------------
// Manifests

/// FNV-1a 64, for cache keys only.
struct Fnv(u64);
impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub fn image_digest(p: &Path) -> Res<String> {
    let f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let mut parts = Vec::new();
    parts.extend_from_slice(&size.to_le_bytes());
    let mut buf = vec![0u8; 4 << 20];
    for (start, end) in btrkit_core::io::host::data_runs(&f, 0, size) {
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], pos)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            // A block of zeros reads the same whether stored or a hole.
            if buf[..n].iter().any(|&b| b != 0) {
                parts.extend_from_slice(&pos.to_le_bytes());
                parts.extend_from_slice(
                    &btrkit_core::csum::CsumType::Xxhash64.compute(&buf[..n])[..8],
                );
            }
            pos += n as u64;
        }
    }
    Ok(content_hash(&parts))
}

/// What a user sees of one path.
fn list_xattrs(p: &Path) -> Res<BTreeMap<String, Vec<u8>>> {
    let cp = cpath(p)?;
    let mut out = BTreeMap::new();
    // SAFETY: `cp` is NUL-terminated and lives past the call; a null buffer of size 0 only asks
    // for the list's length.
    let n = unsafe { libc::llistxattr(cp.as_ptr(), std::ptr::null_mut(), 0) };
    if n < 0 {
        return Err(errno("listxattr", p));
    }
    let mut names = vec![0u8; n as usize + 1];
    // SAFETY: `names` is a live buffer of `names.len()` bytes; the kernel writes at most that
    // many.
    let n = unsafe { libc::llistxattr(cp.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        return Err(errno("listxattr", p));
    }
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name).map_err(|_| "NUL in xattr name")?;
        // SAFETY: `cp` and `cn` are NUL-terminated and live past the call; a null buffer of
        // size 0 only asks for the value's length.
        let len = unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), std::ptr::null_mut(), 0) };
        if len < 0 {
            return Err(errno("getxattr", p));
        }
        let mut v = vec![0u8; len as usize];
        let len =
            // SAFETY: `v` is a live buffer of `v.len()` bytes; the kernel writes at most that
            // many.
            unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if len < 0 {
            return Err(errno("getxattr", p));
        }
        v.truncate(len as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    Ok(out)
}

/// Logical extent map of a file, adjacent runs of one kind merged (so the
/// map does not depend on how the space is cut into extents on disk).
fn fiemap(f: &File) -> Res<Vec<(u64, u64, &'static str)>> {
    let mut out: Vec<(u64, u64, &'static str)> = Vec::new();
    let extents = match crate::sys::fiemap(f) {
        Ok(x) => x,
        // A filesystem without FIEMAP (a FUSE mount): no allocation to show.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::ENOSYS)
            ) =>
        {
            Vec::new()
        }
        Err(e) => return Err(format!("fiemap: {e}")),
    };
    for (logical, length, flags) in extents {
        let kind = if flags & crate::sys::FIEMAP_EXTENT_UNWRITTEN != 0 {
            "unwritten"
        } else {
            "data"
        };
        match out.last_mut() {
            Some(l) if l.1 == logical && l.2 == kind => l.1 = logical + length,
            _ => out.push((logical, logical + length, kind)),
        }
    }
    Ok(out)
}

fn describe(p: &Path) -> Res<Entry> {
    let md = std::fs::symlink_metadata(p).map_err(|e| format!("lstat {}: {e}", p.display()))?;
    let fmt = md.mode() & libc::S_IFMT;
    let kind = match fmt {
        libc::S_IFREG => 'f',
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        _ => 's',
    };
    let mut e = Entry {
        kind,
        ino: md.ino(),
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        nlink: md.nlink(),
        hash: None,
        md5: None,
        target: None,
        rdev: None,
        xattrs: list_xattrs(p)?,
        alloc: Vec::new(),
    };
    if kind == 'c' || kind == 'b' {
        e.rdev = Some((libc::major(md.rdev()), libc::minor(md.rdev())));
    }
    match kind {
        'f' => {
            let mut f = File::open(p).map_err(|e| format!("open {}: {e}", p.display()))?;
            let mut data = Vec::with_capacity(md.size() as usize);
            f.read_to_end(&mut data)
                .map_err(|e| format!("read {}: {e}", p.display()))?;
            e.hash = Some(content_hash(&data));
            e.md5 = Some(md5_hex(&data));
            e.alloc = fiemap(&f).map_err(|x| format!("{}: {x}", p.display()))?;
        }
        'l' => {
            let t = std::fs::read_link(p).map_err(|e| format!("readlink {}: {e}", p.display()))?;
            e.target = Some(String::from_utf8_lossy(t.as_os_str().as_bytes()).into_owned());
        }
        _ => {}
    }
    Ok(e)
}

/// Manifest of a mounted (or any) directory tree, crossing into subvolumes.
pub fn manifest_of_tree(root: &Path) -> Res<Manifest> {
    let mut m = Manifest::default();
    let mut stack = vec![String::from("/")];
    while let Some(rel) = stack.pop() {
        let full = if rel == "/" {
            root.to_path_buf()
        } else {
            root.join(&rel[1..])
        };
        let e = describe(&full)?;
        if e.kind == 'd' {
            let rd =
                std::fs::read_dir(&full).map_err(|e| format!("readdir {}: {e}", full.display()))?;
            for d in rd {
                let d = d.map_err(|e| format!("readdir {}: {e}", full.display()))?;
                let name = d.file_name().to_string_lossy().into_owned();
                stack.push(if rel == "/" {
                    format!("/{name}")
                } else {
                    format!("{rel}/{name}")
                });
            }
        }
        m.entries.insert(rel, e);
    }
    Ok(m)
}

/// Copy `img` to `copy`, mount the copy with `opts` (a read-write mount
/// makes the kernel replay a log), record the manifest, unmount. The copy
/// stays, as the kernel left it, for the caller to inspect or delete.
pub fn manifest_via_copy(img: &Path, copy: &Path, opts: &str) -> Res<Manifest> {
    copy_sparse(img, copy)?;
    manifest_in_place(copy, opts)
}

/// Mount `img` itself with `opts`, record the manifest, unmount.
pub fn manifest_in_place(img: &Path, opts: &str) -> Res<Manifest> {
    let mnt = tempfile::Builder::new()
        .prefix("kcrash-mnt-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let m = LoopMount::mount(img, &mnt.path().join("m"), opts)?;
    let r = manifest_of_tree(m.path());
    m.unmount()?;
    r
}

/// Manifest of `img` after the kernel's log replay: a copy in `work` is
/// mounted read-write and deleted afterwards. `img` is never touched.
pub fn manifest_of_image(img: &Path, work: &Path) -> Res<Manifest> {
    let copy = work.join(format!("manifest-{}.img", std::process::id()));
    let r = manifest_via_copy(img, &copy, "rw");
    let _ = std::fs::remove_file(&copy);
    r
}

// ---------------------------------------------------------------------------
// Binaries and the headline workload

/// `btrkit-replay` (built if needed, see [`crate::bin_path`]), or the program
/// `BTRKIT_REPLAY_BIN` names, relative to the repository root or absolute:
/// the harness itself is checked end to end by pointing it at
/// `tests/scripts/kernel-replay-shim.sh`, which lets the kernel replay.
pub fn replay_bin() -> PathBuf {
    match std::env::var_os("BTRKIT_REPLAY_BIN") {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_relative() {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
            } else {
                p
            }
        }
        None => crate::bin_path("btrkit-replay"),
    }
}

/// The headline workload: 10,000 new files, each created, written (100 to
/// 4000 bytes of distinct content) and fsynced one by one with the periodic
/// commit pushed out to 10 minutes, then a power failure.
pub const HEADLINE: &str = "\
# 10,000 files created and fsynced one by one after the last commit. The
# kernel may still commit on its way: a new chunk makes the next fsync commit,
# and every log sync pins the log blocks it replaced until the next commit, so
# metadata space reclaim commits once pinned space gets large next to the free
# space. Small nodes (less pinned per log sync) on a roomy sparse 8 GiB image
# keep that to about one commit: over half of the files are only in the log.
fssize 8G
mkfs -n 4096
mkdir /d
sync
writefiles /d 10000 100-4000 fsync
crash
";
pub const HEADLINE_FILES: u32 = 10_000;
pub const HEADLINE_MIN: u64 = 100;
pub const HEADLINE_MAX: u64 = 4000;

pub fn headline_scenario() -> Scenario {
    Scenario::parse("headline", HEADLINE).expect("the headline scenario parses")
    // OK: constant text
}

/// Count the headline files `/d/fNNNNN` present
/// under `root`: (files present, files with the right content).
pub fn count_headline_files(root: &Path) -> Res<(u32, u32)> {
    let (mut present, mut right) = (0, 0);
    for i in 0..HEADLINE_FILES {
        let p = root.join("d").join(file_name(i));
        match std::fs::read(&p) {
            Ok(data) => {
                present += 1;
                if data == file_content(i, file_size(i, HEADLINE_MIN, HEADLINE_MAX)) {
                    right += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Ok((present, right))
}
/// Run the scenario's `expect post` steps on `img` (mounted read-write),
/// in order; one result each. `img` is changed: pass a copy.
pub fn run_posts(img: &Path, scn: &Scenario) -> Res<Vec<Res<()>>> {
    run_posts_with(img, "", scn)
}

/// [`run_posts`] with more mount options (`,device=...` of a set).
pub fn run_posts_with(img: &Path, extra_opts: &str, scn: &Scenario) -> Res<Vec<Res<()>>> {
    let posts: Vec<&Step> = scn
        .expects
        .iter()
        .filter_map(|(_, e)| {
            if let Expect::Post(s) = e {
                Some(s)
            } else {
                None
            }
        })
        .collect();
    if posts.is_empty() {
        return Ok(Vec::new());
    }
    let mnt = tempfile::Builder::new()
        .prefix("kcrash-post-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let m = LoopMount::mount(
        img,
        &mnt.path().join("m"),
        &format!("commit=600{extra_opts}"),
    )?;
    let mut r = Runner::new(m.path());
    let out = posts.iter().map(|s| r.apply(s)).collect();
    r.close_all();
    m.unmount()?;
    Ok(out)
}
