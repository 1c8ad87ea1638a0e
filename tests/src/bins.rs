//! Paths to the workspace binaries.
//!
//! `tests/` is its own crate, so cargo gives it no `CARGO_BIN_EXE_*` for the
//! binaries of the other workspace crates. [`bin_path`] finds them next to the
//! test executable instead: the test runs from `<target>/<profile>/deps/`, so
//! the binaries are in `<target>/<profile>/`. When a binary is missing, or
//! older than any source file of its crate or of `core/`, it is built once per
//! test process with `cargo build -p <name>` into that same target directory
//! and profile (a `--release` test run builds release binaries). Set
//! `BTRKIT_NO_BUILD=1` to use whatever binary is there without building.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::SystemTime;

/// `<target>/<profile>` of the running test executable.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe"); // OK: test harness only
    let deps = exe.parent().expect("test exe has a parent directory");
    // `deps/` for integration tests and unit tests alike.
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().map(Path::to_path_buf).unwrap_or_else(|| deps.to_path_buf())
    } else {
        deps.to_path_buf()
    }
}

fn newest_mtime(dir: &Path, newest: &mut SystemTime) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            newest_mtime(&p, newest);
        } else if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
            if m > *newest {
                *newest = m;
            }
        }
    }
}

/// True when `bin` is older than a source it depends on (its crate's `src/`
/// and `Cargo.toml`, `core/src`, and the workspace `Cargo.lock`).
fn stale(bin: &Path, crate_dir: &Path) -> bool {
    let Ok(bt) = std::fs::metadata(bin).and_then(|m| m.modified()) else { return true };
    let root = crate::env::repo_root();
    let mut newest = SystemTime::UNIX_EPOCH;
    newest_mtime(&crate_dir.join("src"), &mut newest);
    newest_mtime(&root.join("core").join("src"), &mut newest);
    for f in [crate_dir.join("Cargo.toml"), root.join("Cargo.lock")] {
        if let Ok(m) = std::fs::metadata(f).and_then(|m| m.modified()) {
            newest = newest.max(m);
        }
    }
    newest > bt
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
    let crate_dir = crate::env::repo_root().join(name.strip_prefix("btrkit-").unwrap_or(name));
    let no_build = std::env::var_os("BTRKIT_NO_BUILD").is_some_and(|v| v != "0" && !v.is_empty());
    if !no_build && stale(&bin, &crate_dir) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let target_dir = prof.parent().map(Path::to_path_buf).unwrap_or_else(|| prof.clone());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(crate::env::repo_root())
            .args(["build", "--quiet", "-p", name, "--bin", name, "--target-dir"])
            .arg(&target_dir);
        if prof.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        eprintln!("building {name} into {}", prof.display());
        let out = cmd.output().unwrap_or_else(|e| panic!("cannot run cargo to build {name}: {e}"));
        if !out.status.success() {
            panic!("cargo build -p {name} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    assert!(bin.exists(), "binary {name} not found at {}", bin.display());
    map.insert(name.to_string(), bin.clone());
    bin
}
