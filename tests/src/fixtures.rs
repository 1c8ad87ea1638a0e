//! Shared fixture images and a bounded way to run the binaries on them.
//!
//! The btrfs-progs fsck-test images live outside the repository, in
//! `../shared/fixtures/btrfs-progs-fsck/` relative to the repo root, one
//! `NAME.tar.xz` per image holding a sparse `NAME.raw`. Some have an apparent
//! size of several terabytes, so they are only ever extracted with `tar`
//! (which keeps holes) into one temp directory per test process, and each is
//! extracted at most once however many tests ask for it.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use crate::env::repo_root;

/// `../shared/fixtures/btrfs-progs-fsck` relative to the repo root, when present.
pub fn fsck_fixture_dir() -> Option<PathBuf> {
    let d = repo_root().join("../shared/fixtures/btrfs-progs-fsck");
    d.is_dir().then_some(d)
}

/// Names (archive stem, without `.tar.xz`) of every fsck fixture, sorted.
pub fn fsck_fixture_names() -> Vec<String> {
    let Some(dir) = fsck_fixture_dir() else {
        return Vec::new();
    };
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".tar.xz"))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `verdicts.tsv`: image name -> "corrupt" or "clean".
pub fn fsck_verdicts() -> HashMap<String, String> {
    let Some(dir) = fsck_fixture_dir() else {
        return HashMap::new();
    };
    let text = std::fs::read_to_string(dir.join("verdicts.tsv")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_once('\t'))
        .map(|(a, b)| (a.trim().to_owned(), b.trim().to_owned()))
        .collect()
}

struct Cache {
    dir: tempfile::TempDir,
    /// name -> extracted image path, or the reason extraction failed.
    done: HashMap<String, Result<PathBuf, String>>,
}

fn cache() -> &'static Mutex<Option<Cache>> {
    static CACHE: OnceLock<Mutex<Option<Cache>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(None))
}

/// The extracted raw image of fixture `name`; extracted on first use and
/// shared by every later caller in this process. The temp directory lives
/// until the process exits (statics are not dropped, so it is removed by
/// `cleanup_fixture_cache` or left in the system temp dir).
pub fn fsck_fixture(name: &str) -> Result<PathBuf, String> {
    let dir = fsck_fixture_dir()
        .ok_or_else(|| "../shared/fixtures/btrfs-progs-fsck is missing".to_string())?;
    // Extraction runs under the lock: tests asking for the same image wait
    // for one tar instead of racing two into the same file.
    let mut guard = cache().lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        let td = tempfile::Builder::new()
            .prefix("btrkit-fixtures-")
            .tempdir()
            .map_err(|e| format!("cannot create fixture cache dir: {e}"))?;
        *guard = Some(Cache {
            dir: td,
            done: HashMap::new(),
        });
    }
    let c = guard.as_mut().ok_or("fixture cache missing")?; // OK: set just above
    if let Some(r) = c.done.get(name) {
        return r.clone();
    }
    let archive = dir.join(format!("{name}.tar.xz"));
    let dest = c.dir.path().join(name);
    let r = (|| {
        std::fs::create_dir_all(&dest).map_err(|e| format!("mkdir {}: {e}", dest.display()))?;
        let out = Command::new("tar")
            .arg("-xJf")
            .arg(&archive)
            .arg("-C")
            .arg(&dest)
            .output()
            .map_err(|e| format!("cannot run tar: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "tar -xJf {name}.tar.xz failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let raw = dest.join(format!("{name}.raw"));
        if raw.is_file() {
            Ok(raw)
        } else {
            Err(format!("{name}.tar.xz holds no {name}.raw"))
        }
    })();
    c.done.insert(name.to_owned(), r.clone());
    r
}

/// Remove the extracted fixtures now (statics are never dropped).
pub fn cleanup_fixture_cache() {
    let mut guard = cache().lock().unwrap_or_else(|p| p.into_inner());
    *guard = None;
}

/// Removes the extracted fixtures when dropped, so a test that fails (panics)
/// half-way leaves no images behind: `let _cache = FixtureCacheGuard;`.
pub struct FixtureCacheGuard;

impl Drop for FixtureCacheGuard {
    fn drop(&mut self) {
        cleanup_fixture_cache();
    }
}

/// What a bounded run of a command gave.
#[derive(Debug)]
pub struct RunOutput {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The command was killed for running past its time limit.
    pub timed_out: bool,
}

impl RunOutput {
    /// Exit code, None when killed by a signal or timed out.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
    /// A panic (Rust exits with 101) or death by a signal.
    pub fn crashed(&self) -> bool {
        !self.timed_out && (self.code().is_none() || self.code() == Some(101))
    }
    pub fn describe(&self) -> String {
        let tail = |s: &str| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(8)..].join("\n")
        };
        format!(
            "status {:?} timed_out {} after {:?}\n--- stderr (tail) ---\n{}\n--- stdout (tail) ---\n{}",
            self.status,
            self.timed_out,
            self.elapsed,
            tail(&self.stderr),
            tail(&self.stdout)
        )
    }
}

/// Run `cmd` with stdin closed, capturing its output, and kill it once it
/// has run for `limit`.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> RunOutput {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out_t = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err_t = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= limit => {
                timed_out = true;
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    let elapsed = start.elapsed();
    RunOutput {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
        elapsed,
        timed_out,
    }
}

/// `btrkit-dump ARGS...` bounded by `limit`.
pub fn run_dump(args: &[&std::ffi::OsStr], limit: Duration) -> RunOutput {
    let mut cmd = Command::new(crate::bin_path("btrkit-dump"));
    cmd.args(args);
    run_bounded(cmd, limit)
}

/// True when `name` is an executable on PATH.
pub fn have_cmd(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

pub use crate::sys::is_root;
use crate::sys::run;

/// A sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) -> Result<(), String> {
    let f = std::fs::File::create(path).map_err(|e| format!("create {}: {e}", path.display()))?;
    f.set_len(size)
        .map_err(|e| format!("truncate {}: {e}", path.display()))
}

/// `mkfs.btrfs -f EXTRA... PATH` on a fresh sparse file of `size` bytes.
pub fn mkfs_btrfs(path: &Path, size: u64, extra: &[&str]) -> Result<(), String> {
    sparse_file(path, size)?;
    run(Command::new("mkfs.btrfs").arg("-f").args(extra).arg(path)).map(drop)
}

/// A small image written by the kernel: mkfs with 4 KiB nodes (so a few
/// hundred files already give trees of more than one level), then loop-mount
/// and create directories, small (inline) and larger files, a hard link, a
/// symlink, xattrs and a deleted file. Needs root and mkfs.btrfs.
pub fn kernel_populated_image(path: &Path, size: u64) -> Result<(), String> {
    mkfs_btrfs(path, size, &["-n", "4096"])?;
    let m = crate::mount::LoopMount::new(path, "")?;
    let root = m.path().to_path_buf();
    let io = |e: std::io::Error| e.to_string();
    for d in 0..4 {
        let dir = root.join(format!("dir{d}"));
        std::fs::create_dir(&dir).map_err(io)?;
        for f in 0..80 {
            let p = dir.join(format!("file-with-a-longish-name-{f:04}"));
            let len = match f % 4 {
                0 => 100,
                1 => 3000,
                2 => 9000,
                _ => 70_000,
            };
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(f) as u8)
                .collect();
            std::fs::write(&p, &data).map_err(io)?;
        }
    }
    std::fs::hard_link(
        root.join("dir0/file-with-a-longish-name-0001"),
        root.join("dir1/hardlink"),
    )
    .map_err(io)?;
    std::os::unix::fs::symlink("dir0/file-with-a-longish-name-0002", root.join("symlink"))
        .map_err(io)?;
    std::fs::remove_file(root.join("dir2/file-with-a-longish-name-0003")).map_err(io)?;
    let _ = run(Command::new("setfattr")
        .args(["-n", "user.test", "-v", "value"])
        .arg(root.join("dir0")));
    run(Command::new("sync").arg("-f").arg(&root))?;
    m.unmount()
}
