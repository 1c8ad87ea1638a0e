//! Device sets in the tests: copies of a set, the kernel's view of one
//! (loop devices, `device=` options), `btrfs check` and btrkit-fsck over
//! every device.

use crate::kcrash::{self, Manifest};
use crate::mount::{attach_loop, detach_loop};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `device=` options naming every device after the first.
pub fn device_opts(devs: &[PathBuf]) -> String {
    devs[1..]
        .iter()
        .map(|d| format!(",device={}", d.display()))
        .collect()
}

/// Sparse copies of every device as `dir/PREFIXn.img`, devid order.
pub fn copy_set(devs: &[PathBuf], dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    devs.iter()
        .enumerate()
        .map(|(i, d)| {
            let c = dir.join(format!("{prefix}{}.img", i + 1));
            kcrash::copy_sparse(d, &c).map(|_| c)
        })
        .collect()
}

/// What the kernel shows of the set mounted with `opts` (a read-write
/// mount replays a log in place).
pub fn manifest(devs: &[PathBuf], opts: &str) -> Result<Manifest, String> {
    kcrash::manifest_in_place(&devs[0], &format!("{opts}{}", device_opts(devs)))
}

/// `btrfs check --readonly` of a set (its devices on loop devices, found
/// by btrfs-progs' scan). mkfs.btrfs 6.2's stale free space entries are
/// all it may report.
pub fn progs_check(devs: &[PathBuf]) -> Result<(), String> {
    let loops: Vec<PathBuf> = devs
        .iter()
        .map(|d| attach_loop(d))
        .collect::<Result<_, _>>()?;
    let o = Command::new("btrfs")
        .args(["check", "--readonly"])
        .arg(&loops[0])
        .output();
    for l in &loops {
        let _ = detach_loop(l);
    }
    let o = o.map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("error") && !l.contains("no error found"))
        .filter(|l| !l.contains("free space") && !l.contains("errors found in free space"))
        // The scan of every block device meets loop devices other tests
        // are tearing down.
        .filter(|l| !l.contains("cannot scan"))
        .filter(|l| {
            !l.contains("cannot open /dev/loop")
                || loops.iter().any(|d| l.contains(&*d.to_string_lossy()))
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("btrfs check: {}", bad.join(" | ")))
    }
}

/// btrkit-fsck --check-mirrors --check-data-csum over the set: no error
/// but mkfs.btrfs 6.2's stale free space entries.
pub fn fsck_clean(devs: &[PathBuf]) -> Result<(), String> {
    let o = Command::new(crate::fsck_support::fsck_bin())
        .args(["--json", "--check-mirrors", "--check-data-csum"])
        .args(devs)
        .output()
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|_| format!("btrkit-fsck: {}", String::from_utf8_lossy(&o.stderr)))?;
    let errors: Vec<String> = v["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "error" && f["category"] != "free-space-stale")
        .map(|f| format!("{}: {}", f["category"], f["message"]))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("btrkit-fsck: {}", errors.join(" | ")))
    }
}

/// What a FUSE mount and a restore to a host directory cannot keep: inode
/// numbers and extent maps (both), a directory's size and link count (a
/// restore's directories belong to the host filesystem).
pub fn without_host_fields(m: &Manifest, restored: bool) -> Manifest {
    let mut out = m.clone();
    for e in out.entries.values_mut() {
        e.ino = 0;
        e.alloc.clear();
        if restored && e.kind == 'd' {
            e.size = 0;
            e.nlink = 0;
        }
    }
    out
}

/// btrkit-mount and btrkit-restore of the crash set `devs` (its log
/// applied in memory) show `want` (what the kernel shows after its own
/// replay of the same set), and leave every device as it was.
pub fn read_paths_match(devs: &[PathBuf], want: &Manifest, work: &Path) -> Result<(), String> {
    let digests: Vec<String> = devs
        .iter()
        .map(|d| kcrash::image_digest(d))
        .collect::<Result<_, _>>()?;
    let paths: Vec<&Path> = devs.iter().map(PathBuf::as_path).collect();
    let m = crate::FuseMount::mount(&paths, &work.join("fuse"), &[])?;
    let mounted = kcrash::manifest_of_tree(m.path());
    m.unmount()?;
    let (mounted, want_m) = (
        without_host_fields(&mounted?, false),
        without_host_fields(want, false),
    );
    if mounted != want_m {
        return Err(format!(
            "btrkit-mount (B) differs from the kernel's replay (A):\n{}",
            want_m.short_diff(&mounted, 12)
        ));
    }
    let out = work.join("restored");
    let o = Command::new(crate::bin_path("btrkit-restore"))
        .args(devs)
        .arg(&out)
        .args(["-m", "--snapshots", "--json"])
        .output()
        .map_err(|e| format!("btrkit-restore: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "btrkit-restore exit {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let (mut restored, mut want_r) = (
        without_host_fields(&kcrash::manifest_of_tree(&out)?, true),
        without_host_fields(want, true),
    );
    // The host directory may refuse xattrs (ext4 keeps a file's in one
    // block): the report names each such file, whose xattrs are then not
    // compared.
    let report: serde_json::Value =
        serde_json::from_slice(&o.stdout).map_err(|e| format!("restore report: {e}"))?;
    for w in report["warnings"].as_array().into_iter().flatten() {
        let w = w.as_str().unwrap_or("");
        if let Some((path, _)) = w.split_once(": xattr") {
            for m in [&mut restored, &mut want_r] {
                if let Some(e) = m.entries.get_mut(path) {
                    e.xattrs.clear();
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    if restored != want_r {
        return Err(format!(
            "btrkit-restore (B) differs from the kernel's replay (A):\n{}",
            want_r.short_diff(&restored, 12)
        ));
    }
    for (d, before) in devs.iter().zip(&digests) {
        if &kcrash::image_digest(d)? != before {
            return Err(format!(
                "{} changed by btrkit-mount or btrkit-restore",
                d.display()
            ));
        }
    }
    Ok(())
}
