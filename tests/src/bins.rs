//! Paths to the workspace binaries.
//!
//! `tests/` is its own crate, so cargo gives it no `CARGO_BIN_EXE_*` for the
//! binaries of the other workspace crates. [`bin_path`] finds them next to the
//! test executable instead: the test runs from `<target>/<profile>/deps/`, so
//! the binaries are in `<target>/<profile>/`.
//!
//! The first lookup of a binary in a test process runs
//! `cargo build -p <name> --bin <name>` into that same target directory and
//! profile (a `--release` test run builds release binaries), guarded by a
//! mutex so it happens once. Cargo's own fingerprints decide whether anything
//! is rebuilt (a no-op takes well under a second), so a test never runs a
//! binary that is missing or stale — e.g. left by another branch in a shared
//! target directory. Set `BTRKIT_NO_BUILD=1` to use the binary that is there
//! without invoking cargo (packaged test runs); if cargo cannot be started at
//! all, an existing binary is used with a warning.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// `<target>/<profile>` of the running test executable.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe"); // OK: test harness only
    let deps = exe.parent().expect("test exe has a parent directory");
    // `deps/` for integration tests and unit tests alike.
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| deps.to_path_buf())
    } else {
        deps.to_path_buf()
    }
}

/// Path of workspace binary `name` (e.g. `"btrkit-dump"`), built if needed.
/// Panics with the cargo output when the build fails: a test cannot proceed
/// without the binary it exercises.
pub fn bin_path(name: &str) -> PathBuf {
    static DONE: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    let map = done.get_or_insert_with(HashMap::new);
    if let Some(p) = map.get(name) {
        return p.clone();
    }
    let prof = profile_dir();
    let bin = prof.join(name);
    let no_build = std::env::var_os("BTRKIT_NO_BUILD").is_some_and(|v| v != "0" && !v.is_empty());
    if !no_build {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let target_dir = prof
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| prof.clone());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(crate::env::repo_root())
            .args([
                "build",
                "--quiet",
                "-p",
                name,
                "--bin",
                name,
                "--target-dir",
            ])
            .arg(&target_dir);
        // The output directory is named after the profile (`debug` is dev).
        match prof.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some(p) => {
                cmd.args(["--profile", p]);
            }
        }
        match cmd.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "cargo build -p {name} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) if bin.exists() => {
                eprintln!("warning: cannot run cargo ({e}); using {}", bin.display())
            }
            Err(e) => panic!("cannot run cargo to build {name}: {e}"),
        }
    }
    assert!(bin.exists(), "binary {name} not found at {}", bin.display());
    map.insert(name.to_string(), bin.clone());
    bin
}
