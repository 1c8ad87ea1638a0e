//! Environment probes. Each prints `SKIP: <test>: <reason>` to stderr when the
//! requirement is missing, so a skipped test is visible in `cargo test` output
//! (run with `--nocapture` to see it) rather than silently passing.
//!
//! With `BTRKIT_REQUIRE_ORACLES=1` (CI sets it: CI has root, loop devices,
//! btrfs-progs and ../shared) a skip is a failure: a run that silently lost
//! its kernel or btrfs-progs oracle would otherwise be green.
//!
//! The test name comes from the current thread's name, which libtest sets to
//! the test's path.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Return early from a test unless every probe holds:
/// `skip_unless!(require_root(), require_btrfs_progs());`
/// Probes are `bool` expressions that print their own skip reason.
#[macro_export]
macro_rules! skip_unless {
    ($($probe:expr),+ $(,)?) => {
        $( if !$probe { return; } )+
    };
}

/// The running test's name (libtest names each test thread after the test).
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed>")
        .to_string()
}

/// True when `BTRKIT_REQUIRE_ORACLES` asks for every oracle to be present.
pub fn oracles_required() -> bool {
    std::env::var("BTRKIT_REQUIRE_ORACLES").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Print the standard skip line for the current test; with
/// `BTRKIT_REQUIRE_ORACLES=1` the skip fails the test instead.
pub fn skip(reason: &str) {
    eprintln!("SKIP: {}: {}", test_name(), reason);
    if oracles_required() {
        panic!(
            "BTRKIT_REQUIRE_ORACLES is set, so this test may not skip: {}: {reason}",
            test_name()
        );
    }
}

/// [`skip`] for part of a test: the rest of the test goes on.
pub fn skip_part(what: &str, reason: &str) {
    eprintln!("SKIP part: {}: {what}: {reason}", test_name());
    if oracles_required() {
        panic!(
            "BTRKIT_REQUIRE_ORACLES is set, so no part of this test may skip: {}: {what}: {reason}",
            test_name()
        );
    }
}

fn report(res: &Result<(), String>) -> bool {
    match res {
        Ok(()) => true,
        Err(reason) => {
            skip(reason);
            false
        }
    }
}

use crate::sys::is_root;

/// Running as root (needed for mount, losetup).
pub fn require_root() -> bool {
    report(&if is_root() {
        Ok(())
    } else {
        Err("not running as root".into())
    })
}

fn runs(prog: &str, args: &[&str]) -> bool {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `mkfs.btrfs` and `btrfs` from btrfs-progs are on PATH.
pub fn require_btrfs_progs() -> bool {
    static P: OnceLock<Result<(), String>> = OnceLock::new();
    report(P.get_or_init(|| {
        if !runs("mkfs.btrfs", &["--version"]) {
            return Err("mkfs.btrfs (btrfs-progs) not found".into());
        }
        if !runs("btrfs", &["--version"]) {
            return Err("btrfs (btrfs-progs) not found".into());
        }
        Ok(())
    }))
}

/// A loop device can be attached and detached (probed once per process with a
/// scratch file), and the kernel knows btrfs or can load it; see
/// [`crate::mount::probe`].
pub fn require_loop() -> bool {
    report(&crate::mount::probe())
}

/// Everything a kernel-mount test needs: root, btrfs-progs, loop devices.
pub fn require_kernel_mount() -> bool {
    require_root() && require_btrfs_progs() && require_loop()
}

/// btrfs-progs 6.14 beside the distribution's (`../shared/oracle/progs-new.sh`
/// installs it on first use): its directory, holding `mkfs.btrfs` and
/// `btrfs`.
pub fn progs_new_dir() -> Option<PathBuf> {
    static P: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = P.get_or_init(|| {
        let script = repo_root().join("../shared/oracle/progs-new.sh");
        if !script.exists() {
            return Err(format!("{} is missing", script.display()));
        }
        let o = std::process::Command::new("bash")
            .arg(&script)
            .output()
            .map_err(|e| format!("progs-new.sh: {e}"))?;
        let dir = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        if !o.status.success() || !dir.join("mkfs.btrfs").exists() {
            return Err(format!(
                "btrfs-progs 6.14 could not be installed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(dir)
    });
    match r {
        Ok(d) => Some(d.clone()),
        Err(e) => {
            let _ = report(&Err(e.clone()));
            None
        }
    }
}

/// btrfs-progs 6.14 is there (see [`progs_new_dir`]).
pub fn require_progs_new() -> bool {
    progs_new_dir().is_some()
}

/// A FUSE mount can be made (root, /dev/fuse, fusermount3).
pub fn require_fuse() -> bool {
    require_root() && report(&crate::mount::fuse_probe())
}

/// Repository root: the parent of this crate's manifest directory.
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(|p| p.to_path_buf()).unwrap_or(here)
}

/// `../shared` next to the repository root, if present.
pub fn require_shared() -> Option<PathBuf> {
    let p = repo_root().join("..").join("shared");
    if p.is_dir() {
        Some(p.canonicalize().unwrap_or(p))
    } else {
        skip(&format!("shared fixtures not found at {}", p.display()));
        None
    }
}
