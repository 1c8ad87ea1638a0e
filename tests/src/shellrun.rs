//! A scenario run through btrkit-shell, as the tests that hold btrkit's
//! engine against the kernel run it: the same warm-up the kernel harness
//! writes (so inode numbers agree), a fresh image (or set) in a work
//! directory, and what the run left.

use crate::kcrash::Scenario;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The scenario cut before its first crash and ended with `sync`, without
/// its expectations (they describe the state after the crash).
pub fn cut_before_crash(s: &Scenario) -> Option<Scenario> {
    let mut lines: Vec<String> = Vec::new();
    for line in s.text.lines() {
        let t = line.trim_start();
        if t.starts_with("crash") {
            break;
        }
        if t.starts_with("expect") {
            continue;
        }
        lines.push(line.to_string());
    }
    lines.push("expect-log any".into());
    lines.push("sync".into());
    Scenario::parse(&format!("{}-cut", s.name), &(lines.join("\n") + "\n")).ok()
}

/// The last non-empty line of a tool's output (its one-line error).
pub fn last_line(s: &str) -> &str {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// What a btrkit-shell run left.
pub struct ShellRun {
    /// The image and the set's other devices, devid order.
    pub devices: Vec<PathBuf>,
    /// btrkit-shell exited 0.
    pub ok: bool,
    /// Its standard error, trimmed.
    pub stderr: String,
    /// Its exit code.
    pub code: Option<i32>,
}

impl ShellRun {
    /// Every device is there and the run either succeeded or failed only
    /// on its expectations (a caller that judges the recovered state
    /// itself can go on).
    pub fn only_expectations_failed(&self) -> bool {
        self.devices.iter().all(|d| d.exists()) && (self.ok || self.stderr.contains("expect"))
    }

    /// The run's failure in one line.
    pub fn failure(&self) -> String {
        format!(
            "btrkit-shell exit {:?}: {}",
            self.code,
            last_line(&self.stderr)
        )
    }
}

/// Run `scn` through btrkit-shell on fresh devices `<work>/<name>.img`
/// (and `<name>-2.img`... for a set), the script saved beside them. Err
/// only when btrkit-shell could not be started or the script not saved.
pub fn run(scn: &Scenario, work: &Path, name: &str) -> Result<ShellRun, String> {
    let img = work.join(format!("{name}.img"));
    let devices = btrkit_core::workload::session::device_paths(&img, scn.devices.max(1));
    for d in &devices {
        let _ = std::fs::remove_file(d);
    }
    let mut text = scn.text.clone();
    if scn.warmup.unwrap_or(true) {
        text = format!("warmup yes\n{text}");
    }
    let script = work.join(format!("{name}.scn"));
    std::fs::write(&script, text).map_err(|e| e.to_string())?;
    let o = Command::new(crate::bin_path("btrkit-shell"))
        .arg(&img)
        .arg(&script)
        .arg("-q")
        .output()
        .map_err(|e| format!("btrkit-shell: {e}"))?;
    Ok(ShellRun {
        devices,
        ok: o.status.success(),
        stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        code: o.status.code(),
    })
}
