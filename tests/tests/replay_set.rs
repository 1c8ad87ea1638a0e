//! `btrkit-replay` on filesystems of several devices against the kernel's
//! own replay of the same crash: scenarios of the replay corpus run by the
//! kernel on sets of loop devices (raid1 on two, raid10 on four, raid1c3 on
//! three, raid5 on three, raid6 on four), every device copied at the crash. For each: the kernel replays a
//! copy of the set at mount; `btrkit-replay a b ... -o DIR` writes one file
//! per device, leaves the crash devices untouched, and its set mounts
//! read-only with exactly the kernel's tree; btrkit-fsck and btrfs check
//! find it clean; a second copy replayed in place gives the same.
//!
//! Also degraded: RAID1, RAID5 and RAID6 crash sets with a device (RAID6:
//! two) lost, replayed by the kernel at a degraded mount and by
//! `btrkit-replay --degraded` (which writes the parity of the rows it
//! touches on the devices left, as the kernel does); btrkit-fsck finds the
//! parity of our degraded replay consistent once the set is whole again
//! where the lost devices were not written.
//!
//! `BTRKIT_SET_SCENARIOS=N` runs every Nth scenario of the corpus per
//! profile (default 4, each profile a different quarter).

use btrkit_tests::kcrash::{self, Scenario};
use btrkit_tests::oracle;
use btrkit_tests::sets::{self, fsck_clean, manifest};
use btrkit_tests::{require_kernel_mount, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The two tests run one at a time: both attach copies of the same cached
/// crash sets (one filesystem id) to loop devices, and btrfs-progs' device
/// scan during one test's `btrfs check` picks up the other test's mounted
/// loop device of that id ("Device or resource busy").
static SETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[path = "common/families.rs"]
mod families;

fn copy_set(devs: &[PathBuf], dir: &Path, prefix: &str) -> Vec<PathBuf> {
    sets::copy_set(devs, dir, prefix).unwrap()
}

fn replay(args: &[&Path], flags: &[&str]) -> Result<(), String> {
    let o = Command::new(kcrash::replay_bin())
        .args(flags)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "btrkit-replay {flags:?}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

fn one(scn: &Scenario, n: usize, profile: &[&str]) -> Result<(), String> {
    let work = tempfile::Builder::new()
        .prefix(&format!("set-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let crash = {
        let _s = kcrash::slot();
        kcrash::generate_on_set(scn, &w.join("gen"), n, profile)?
    };
    let devs = crash.devices.clone();
    assert_eq!(devs.len(), n);
    let before: Vec<Vec<u8>> = devs.iter().map(|d| std::fs::read(d).unwrap()).collect();

    // The kernel's replay of a copy.
    let k = copy_set(&devs, &w.join("k"), "k");
    let kernel = manifest(&k, "rw").map_err(|e| format!("kernel mount: {e}"))?;

    // Ours, into one file per device (given in reverse order), after a
    // dry run that writes nothing.
    let rev: Vec<&Path> = devs.iter().rev().map(PathBuf::as_path).collect();
    replay(&rev, &["--dry-run"])?;
    let out = w.join("out");
    replay(&rev, &["-o", out.to_str().unwrap()])?;
    for (d, b) in devs.iter().zip(&before) {
        if std::fs::read(d).unwrap() != *b {
            return Err(format!("{} changed by --dry-run or -o", d.display()));
        }
    }
    let ours: Vec<PathBuf> = devs
        .iter()
        .map(|d| out.join(d.file_name().unwrap()))
        .collect();
    for o in &ours {
        let (_, log) = kcrash::super_log_root(o)?;
        if log != 0 {
            return Err(format!("{}: log_root {log} after replay", o.display()));
        }
    }
    fsck_clean(&ours).map_err(|e| format!("btrkit-fsck of ours: {e}"))?;
    oracle::check_set_clean(&ours).map_err(|e| format!("btrfs check of ours: {e}"))?;
    let m = manifest(&ours, "ro").map_err(|e| format!("mount of ours: {e}"))?;
    if m != kernel {
        return Err(format!(
            "ours differs from the kernel's:\n{}",
            kernel.short_diff(&m, 8)
        ));
    }

    // In place, on another copy.
    let inplace = copy_set(&devs, &w.join("p"), "p");
    let refs: Vec<&Path> = inplace.iter().map(PathBuf::as_path).collect();
    replay(&refs, &[])?;
    let m = manifest(&inplace, "ro").map_err(|e| format!("mount in place: {e}"))?;
    if m != kernel {
        return Err(format!("in place differs:\n{}", kernel.short_diff(&m, 8)));
    }
    Ok(())
}

/// The replay corpus but for scenarios that choose their own profiles.
fn set_corpus() -> Vec<Scenario> {
    families::corpus()
        .into_iter()
        .filter(|s| {
            !s.mkfs
                .iter()
                .any(|a| matches!(a.as_str(), "-d" | "-m" | "-M" | "--mixed"))
        })
        .collect()
}

#[test]
fn replay_on_sets_matches_the_kernel() {
    skip_unless!(require_kernel_mount());
    let _one_at_a_time = SETS.lock().unwrap_or_else(|e| e.into_inner());
    let every: usize = std::env::var("BTRKIT_SET_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(1);
    let corpus = set_corpus();
    let profiles: [(usize, &[&str]); 5] = [
        (2, &["-d", "raid1", "-m", "raid1"]),
        (4, &["-d", "raid10", "-m", "raid10"]),
        (3, &["-d", "raid1c3", "-m", "raid1c3"]),
        (3, &["-d", "raid5", "-m", "raid5"]),
        (4, &["-d", "raid6", "-m", "raid6"]),
    ];
    let mut jobs = Vec::new();
    for (p, (n, args)) in profiles.iter().enumerate() {
        for (i, s) in corpus.iter().enumerate() {
            if i % every == p % every {
                jobs.push((s.clone(), *n, *args));
            }
        }
    }
    let results = kcrash::parallel_map(&jobs, kcrash::max_jobs(), |_, (s, n, args)| {
        (format!("{} on {args:?}", s.name), one(s, *n, args))
    });
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}")))
        .collect();
    eprintln!("{} set scenarios, {} failed", jobs.len(), failed.len());
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The errors btrkit-fsck --degraded --check-data-csum finds on `devs`
/// (mkfs.btrfs 6.2's stale free space entries aside).
fn fsck_errors(devs: &[PathBuf]) -> Result<Vec<String>, String> {
    let o = Command::new(btrkit_tests::fsck_support::fsck_bin())
        .args(["--json", "--degraded", "--check-data-csum"])
        .args(devs)
        .output()
        .map_err(|e| e.to_string())?;
    let r: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|_| format!("btrkit-fsck: {}", String::from_utf8_lossy(&o.stderr)))?;
    Ok(r["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "error" && f["category"] != "free-space-stale")
        .map(|f| f["message"].to_string())
        .collect())
}

/// A crash set of `n` devices made with `profile`, the devices `lose`
/// (indexes) lost: the kernel replays the log at a degraded mount of the
/// others; `btrkit-replay --degraded` on the others gives the same tree
/// (without `--degraded`, a refusal that writes nothing), and btrkit-fsck
/// reads ours degraded without an error the kernel's replay does not
/// leave as well.
fn one_degraded(scn: &Scenario, n: usize, profile: &[&str], lose: &[usize]) -> Result<(), String> {
    let work = tempfile::Builder::new()
        .prefix(&format!("deg-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let crash = {
        let _s = kcrash::slot();
        kcrash::generate_on_set(scn, &w.join("gen"), n, profile)?
    };
    let left: Vec<PathBuf> = crash
        .devices
        .iter()
        .enumerate()
        .filter(|(i, _)| !lose.contains(i))
        .map(|(_, d)| d.clone())
        .collect();
    let k = copy_set(&left, &w.join("k"), "k");
    let kernel = manifest(&k, "rw,degraded").map_err(|e| format!("kernel mount: {e}"))?;

    let ours = copy_set(&left, &w.join("o"), "o");
    let refs: Vec<&Path> = ours.iter().map(PathBuf::as_path).collect();
    let before: Vec<Vec<u8>> = ours.iter().map(|d| std::fs::read(d).unwrap()).collect();
    if replay(&refs, &[]).is_ok()
        || ours
            .iter()
            .zip(&before)
            .any(|(d, b)| std::fs::read(d).unwrap() != *b)
    {
        return Err("a set with devices lost replayed without --degraded".into());
    }
    replay(&refs, &["--degraded"])?;
    let (_, log) = kcrash::super_log_root(&ours[0])?;
    if log != 0 {
        return Err(format!("log_root {log} after replay"));
    }
    let m = manifest(&ours, "ro,degraded").map_err(|e| format!("mount of ours: {e}"))?;
    if m != kernel {
        return Err(format!(
            "ours differs from the kernel's:\n{}",
            kernel.short_diff(&m, 8)
        ));
    }
    // What the kernel's own replay leaves wrong (a file without a hole
    // item where its log dropped a piece, on a filesystem without
    // no-holes: see regress-random-1900) ours may leave too; nothing more.
    let kernel_errors = fsck_errors(&k)?;
    let errors: Vec<String> = fsck_errors(&ours)?
        .into_iter()
        .filter(|e| !kernel_errors.contains(e))
        .collect();
    if !errors.is_empty() {
        return Err(format!(
            "btrkit-fsck --degraded of ours: {}",
            errors.join(" | ")
        ));
    }
    Ok(())
}

#[test]
fn degraded_replay_matches_the_kernel() {
    skip_unless!(require_kernel_mount());
    let _one_at_a_time = SETS.lock().unwrap_or_else(|e| e.into_inner());
    let profiles: [(usize, &[&str], &[usize]); 3] = [
        (2, &["-d", "raid1", "-m", "raid1"], &[1]),
        (3, &["-d", "raid5", "-m", "raid5"], &[1]),
        (4, &["-d", "raid6", "-m", "raid6"], &[0, 2]),
    ];
    let mut corpus = Vec::new();
    for (p, prof) in profiles.iter().enumerate() {
        for (i, s) in set_corpus().into_iter().enumerate() {
            if i % 8 == p {
                corpus.push((s, *prof));
            }
        }
    }
    // BTRKIT_ONLY=NAME: only the scenarios whose name contains NAME.
    if let Ok(only) = std::env::var("BTRKIT_ONLY") {
        corpus.retain(|(s, _)| s.name.contains(&only));
    }
    let results = kcrash::parallel_map(&corpus, kcrash::max_jobs(), |_, (s, (n, args, lose))| {
        (
            format!("{} on {args:?} without {lose:?}", s.name),
            one_degraded(s, *n, args, lose),
        )
    });
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}")))
        .collect();
    eprintln!(
        "{} degraded scenarios, {} failed",
        corpus.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
