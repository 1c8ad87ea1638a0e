//! `btrfs check --readonly`, the btrfs-progs oracle, called in one place.
//!
//! [`btrfs_check`] runs it (the distribution's btrfs-progs or 6.14, on one
//! image or a device set) and returns what it said as a [`CheckVerdict`];
//! the judgements the tests make of it are methods there
//! ([`CheckVerdict::require_clean`], [`CheckVerdict::require_clean_but_free_space`])
//! or the wrappers [`check_clean`], [`check_set_clean`] and
//! [`assert_btrfs_check_clean`].
//!
//! Whether btrfs-progs is there at all is the caller's probe
//! ([`crate::require_btrfs_progs`], [`crate::require_progs_new`]): a test
//! skips with its reason, or fails under `BTRKIT_REQUIRE_ORACLES=1`.

use crate::mount::{attach_loop, detach_loop};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long a check may run when the caller sets no limit.
const DEFAULT_LIMIT: Duration = Duration::from_secs(3600);

/// How often a check that could not learn the mount status is tried.
const MOUNT_STATUS_ATTEMPTS: u64 = 5;

/// Which btrfs-progs answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progs {
    /// `btrfs` on PATH (the distribution's, 6.2 here).
    Distro,
    /// btrfs-progs 6.14 ([`crate::progs_new_dir`]).
    New,
}

impl Progs {
    /// The `btrfs` program to run.
    pub fn btrfs(self) -> Result<PathBuf, String> {
        match self {
            Progs::Distro => Ok(PathBuf::from("btrfs")),
            Progs::New => crate::progs_new_dir()
                .map(|d| d.join("btrfs"))
                .ok_or_else(|| "btrfs-progs 6.14 is not available".to_string()),
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Progs::Distro => "btrfs check",
            Progs::New => "btrfs check 6.14",
        }
    }
}

/// What one `btrfs check --readonly` said.
#[derive(Clone, Debug)]
pub struct CheckVerdict {
    /// It exited 0.
    pub clean: bool,
    /// Its exit code: -1 when a signal ended it, -2 when it ran past its
    /// time limit and was killed.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// stdout then stderr.
    pub output: String,
    /// What it was pointed at: the image, or the set's first loop device.
    pub checked: PathBuf,
    /// Loop devices the set's devices were on (detached again), empty for
    /// one image.
    pub loops: Vec<PathBuf>,
    pub progs: Progs,
}

/// `btrfs check --readonly EXTRA... DEV` by `progs`, killed after `limit`
/// (an hour if None). One path is checked as it is; the devices of a set
/// are put on loop devices first (btrfs-progs finds the others by its
/// scan) and detached afterwards. Err when it cannot be run at all.
pub fn btrfs_check_with<P: AsRef<Path>>(
    devs: &[P],
    progs: Progs,
    extra: &[&str],
    limit: Option<Duration>,
) -> Result<CheckVerdict, String> {
    assert!(!devs.is_empty(), "btrfs check of no device");
    let btrfs = progs.btrfs()?;
    let loops: Vec<PathBuf> = if devs.len() > 1 {
        let mut loops = Vec::new();
        for d in devs {
            match attach_loop(d.as_ref()) {
                Ok(l) => loops.push(l),
                Err(e) => {
                    for l in &loops {
                        let _ = detach_loop(l);
                    }
                    return Err(e);
                }
            }
        }
        loops
    } else {
        Vec::new()
    };
    let checked = loops
        .first()
        .cloned()
        .unwrap_or_else(|| devs[0].as_ref().to_path_buf());
    // btrfs check first asks whether the filesystem is mounted, scanning
    // every block device for its other members; a loop device another test
    // detaches during that scan makes it give up before checking anything
    // ("could not check mount status: No such device or address"). That
    // says nothing about the image, so the check is run again.
    let mut attempt = 0;
    let r = loop {
        let mut c = Command::new(&btrfs);
        c.args(["check", "--readonly"])
            .args(extra)
            .arg(&checked)
            .stdin(std::process::Stdio::null());
        let r = crate::fsck_support::run_with_limit(c, limit.unwrap_or(DEFAULT_LIMIT));
        attempt += 1;
        if attempt < MOUNT_STATUS_ATTEMPTS && r.stderr.contains("could not check mount status") {
            std::thread::sleep(Duration::from_millis(200 * attempt));
            continue;
        }
        break r;
    };
    for l in &loops {
        let _ = detach_loop(l);
    }
    if r.code == -1 && r.stdout.is_empty() && r.stderr.starts_with("spawn failed") {
        return Err(format!("{}: {}", btrfs.display(), r.stderr));
    }
    let (stdout, stderr) = (r.stdout, r.stderr);
    Ok(CheckVerdict {
        clean: r.code == 0,
        code: r.code,
        output: format!("{stdout}{stderr}"),
        stdout,
        stderr,
        checked,
        loops,
        progs,
    })
}

/// `btrfs check --readonly` of one image or a set by `progs`.
pub fn btrfs_check<P: AsRef<Path>>(devs: &[P], progs: Progs) -> Result<CheckVerdict, String> {
    btrfs_check_with(devs, progs, &[], None)
}

impl CheckVerdict {
    /// Killed at its time limit.
    pub fn timed_out(&self) -> bool {
        self.code == -2
    }

    /// Exited 0 and said "no error found".
    pub fn no_error_found(&self) -> bool {
        self.clean && self.output.contains("no error found")
    }

    /// Ok when it exited 0 and said "no error found"; otherwise the
    /// problems it names on the first line, then its report without the
    /// space statistics.
    pub fn require_clean(&self) -> Result<(), String> {
        if self.no_error_found() {
            return Ok(());
        }
        let lines: Vec<&str> = self
            .output
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| {
                !l.starts_with("total ")
                    && !l.contains(" bytes: ")
                    && !l.starts_with(" referenced")
                    && !l.starts_with("found ")
            })
            .collect();
        let problems: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                (l.contains("error")
                    || l.contains("invalid")
                    || l.contains("mismatch")
                    || l.contains("missing"))
                    && !l.starts_with("error: errors found")
            })
            .take(4)
            .collect();
        Err(format!(
            "{} --readonly fails (exit {}): {}\n{}",
            self.progs.name(),
            self.code,
            if problems.is_empty() {
                "see below".to_string()
            } else {
                problems.join("; ")
            },
            lines
                .iter()
                .take(40)
                .copied()
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }

    /// Ok unless a line reports an error other than stale free space
    /// entries (all mkfs.btrfs 6.2 may leave on a set) or the scan meeting
    /// loop devices other tests are tearing down.
    pub fn require_clean_but_free_space(&self) -> Result<(), String> {
        let bad: Vec<&str> = self
            .output
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("error") && !l.contains("no error found"))
            .filter(|l| !l.contains("free space") && !l.contains("errors found in free space"))
            .filter(|l| !l.contains("cannot scan"))
            .filter(|l| {
                !l.contains("cannot open /dev/loop")
                    || self.loops.iter().any(|d| l.contains(&*d.to_string_lossy()))
            })
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {}", self.progs.name(), bad.join(" | ")))
        }
    }
}

/// `btrfs check --readonly` by `progs` exits 0 and finds no error
/// ([`CheckVerdict::require_clean`]).
pub fn check_clean<P: AsRef<Path>>(devs: &[P], progs: Progs) -> Result<(), String> {
    btrfs_check(devs, progs)?.require_clean()
}

/// `btrfs check --readonly` of a set by the distribution's btrfs-progs:
/// no error but stale free space entries
/// ([`CheckVerdict::require_clean_but_free_space`]).
pub fn check_set_clean<P: AsRef<Path>>(devs: &[P]) -> Result<(), String> {
    btrfs_check(devs, Progs::Distro)?.require_clean_but_free_space()
}

/// Panics, naming `what`, unless `btrfs check --readonly` by `progs`
/// exits 0 and finds no error.
pub fn assert_btrfs_check_clean<P: AsRef<Path>>(devs: &[P], progs: Progs, what: &str) {
    if let Err(e) = check_clean(devs, progs) {
        panic!("{what}: {e}");
    }
}
