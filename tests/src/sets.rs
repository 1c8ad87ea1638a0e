//! Device sets in the tests: copies of a set, the kernel's view of one
//! (loop devices, `device=` options), `btrfs check` and btrkit-fsck over
//! every device.

use crate::bin_path;
use crate::fsck_support::fsck_bin;
use crate::kcrash::{self, Manifest};
use crate::mount::{attach_loop, detach_loop, LoopMount};
use crate::sys::must_run;
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
    read_paths_match_with(devs, want, work, &[])
}

/// [`read_paths_match`], both tools given `flags` (`--degraded`).
pub fn read_paths_match_with(
    devs: &[PathBuf],
    want: &Manifest,
    work: &Path,
    flags: &[&str],
) -> Result<(), String> {
    let digests: Vec<String> = devs
        .iter()
        .map(|d| kcrash::image_digest(d))
        .collect::<Result<_, _>>()?;
    let paths: Vec<&Path> = devs.iter().map(PathBuf::as_path).collect();
    let m = crate::FuseMount::mount(&paths, &work.join("fuse"), flags)?;
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
        .args(flags)
        .args(devs)
        .arg(&out)
        .args(["-m", "--snapshots", "--json", "--device-nodes"])
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

/// Image files of 256 MiB made one filesystem by mkfs.btrfs `extra`.
pub fn mkfs(images: &[&Path], extra: &[&str]) {
    for img in images {
        std::fs::File::create(img)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
    }
    must_run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .args(extra)
            .args(images),
    );
}

/// A filesystem on `n` image files made by mkfs.btrfs with `args`, the
/// files written by the kernel through a mount of all of them.
pub struct KernelSet {
    _dir: tempfile::TempDir,
    /// The device files, devid order.
    pub paths: Vec<PathBuf>,
}

impl KernelSet {
    /// Make it: `n` files of 256 MiB, mkfs.btrfs `args`, files written.
    pub fn new(n: usize, args: &[&str]) -> KernelSet {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (1..=n)
            .map(|i| dir.path().join(format!("d{i}.img")))
            .collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        // Without the free space tree: mkfs.btrfs 6.2 leaves stale entries
        // in it; the kernel builds it at the first mount (space_cache=v2).
        let mut a = vec!["-R", "^free-space-tree"];
        a.extend_from_slice(args);
        mkfs(&refs, &a);
        let mut opts: Vec<String> = paths[1..]
            .iter()
            .map(|p| format!("device={}", p.display()))
            .collect();
        opts.push("space_cache=v2".into());
        let m = LoopMount::new(&paths[0], &opts.join(",")).unwrap();
        write_files(m.path());
        drop(m);
        KernelSet { _dir: dir, paths }
    }
}

/// Files of many sizes (inline, one sector, several stripe units), a
/// hard link, a symlink and an xattr, in a few directories.
pub fn write_files(root: &Path) {
    let mut g = btrkit_core::util::prng::Prng::new(0x9e37_79b9_7f4a_7c15);
    for d in 0..4 {
        let dir = root.join(format!("dir{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..60 {
            let len = match f % 4 {
                0 => g.below(2000),
                1 => 4096,
                2 => g.below(300_000),
                _ => 65536 * 3 + g.below(65536),
            } as usize;
            let mut data = vec![0u8; len];
            g.fill(&mut data);
            std::fs::write(dir.join(format!("f{f}")), data).unwrap();
        }
    }
    std::fs::hard_link(root.join("dir0/f1"), root.join("dir1/link")).unwrap();
    std::os::unix::fs::symlink("dir0/f2", root.join("sym")).unwrap();
    must_run(
        Command::new("setfattr")
            .args(["-n", "user.k", "-v", "v"])
            .arg(root.join("dir2/f3")),
    );
}

/// btrkit-fsck's JSON report (exit code, report) over `devs`.
pub fn fsck(devs: &[&Path], extra: &[&str]) -> (i32, serde_json::Value, String) {
    let o = Command::new(fsck_bin())
        .arg("--json")
        .args(extra)
        .args(devs)
        .output()
        .unwrap();
    let code = o.status.code().unwrap_or(-1);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (code, v, err)
}

/// (severity, category, message) of each finding of a JSON report.
pub fn findings(r: &serde_json::Value) -> Vec<(String, String, String)> {
    r["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["severity"].as_str().unwrap_or("").to_string(),
                        f["category"].as_str().unwrap_or("").to_string(),
                        f["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `btrkit-dump tree` over `devs` (plus `extra` arguments).
pub fn dump(devs: &[&Path], extra: &[&str]) -> String {
    let o = Command::new(bin_path("btrkit-dump"))
        .arg("tree")
        .args(extra)
        .args(devs)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "btrkit-dump tree {devs:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `btrfs inspect-internal dump-tree` of the set, its devices on loop
/// devices (btrfs-progs finds the others by scanning).
pub fn progs_dump(paths: &[PathBuf]) -> String {
    let loops: Vec<PathBuf> = paths.iter().map(|p| attach_loop(p).unwrap()).collect();
    let o = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree"])
        .arg(&loops[0])
        .output();
    for l in &loops {
        let _ = detach_loop(l);
    }
    let o = o.unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with("btrfs-progs"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Every file's extents under `root` as `filefrag -v` shows them without
/// their addresses (logical range, length, flags: shared or not, encoded,
/// unwritten), the files in path order: what a relocation must keep.
pub fn extents_of(root: &Path) -> Vec<String> {
    let o = Command::new("sh")
        .arg("-c")
        .arg("find . -type f -print0 | sort -z | xargs -0 filefrag -v 2>&1 | grep -v '^Filesystem type'")
        .current_dir(root)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 6
                && f[0].ends_with(':')
                && f[0].trim_end_matches(':').parse::<u64>().is_ok()
            {
                let flags = f.last().filter(|x| !x.ends_with(':')).unwrap_or(&"");
                format!("{} {} {} {flags}", f[1], f[2], f[5])
            } else {
                l.to_string()
            }
        })
        .collect()
}
