//! btrkit's engine and fsync log writer on filesystems of several devices,
//! against the kernel running the same scripts on sets of loop devices.
//!
//! Scenarios of the replay corpus (those that do not choose their own
//! profiles) get `devices N` and `mkfs -m P -d P` for each of: raid1 on
//! two devices, raid10 on four, raid1c3 on three, dup metadata with raid0
//! data on two, mixed block groups (`-M`) on one device and as raid1
//! on two, raid5 on three and raid6 on four (every write through parity). Each runs twice through each side:
//! - cut before its first crash and ended with `sync` (as engine_kernel):
//!   btrkit-shell makes the set with btrkit-mkfs's layout, the kernel runs
//!   the script on a set mkfs.btrfs made; the kernel mounts our set and must
//!   see exactly the tree of its own run, and `btrfs check` and btrkit-fsck
//!   (every copy of every block and of the data) find our set clean;
//! - whole, up to its final crash (as log_kernel): every device is left as
//!   the power failure left it; the kernel replays **our** log at mount,
//!   and every expectation must hold on what it recovers, which must equal
//!   what it recovers from its own crash set; btrfs check finds the result
//!   clean; `btrkit-replay` of our crash set gives the kernel's tree.
//!
//! `BTRKIT_ENGINE_SET_SCENARIOS=N` runs every Nth scenario per profile
//! (default 6, each profile a different share).

use btrkit_tests::kcrash::{self, Manifest, Scenario};
use btrkit_tests::oracle;
use btrkit_tests::sets::{self, copy_set, fsck_clean};
use btrkit_tests::shellrun::{self, last_line};
use btrkit_tests::{require_kernel_mount, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "common/families.rs"]
mod families;

/// The profiles: (devices, mkfs arguments, short name). Mixed block
/// groups (one device and a raid1 pair) too.
const PROFILES: [(usize, &str, &str); 8] = [
    (2, "-m raid1 -d raid1", "raid1"),
    (4, "-m raid10 -d raid10", "raid10"),
    (3, "-m raid1c3 -d raid1c3", "raid1c3"),
    (2, "-m dup -d raid0", "dup-raid0"),
    (1, "-M", "mixed"),
    (2, "-M -m raid1 -d raid1", "mixed-raid1"),
    (3, "-m raid5 -d raid5", "raid5"),
    (4, "-m raid6 -d raid6", "raid6"),
];

/// `scn` on a set: `devices N` and the profiles ahead of its text. Mixed
/// block groups take one-sector nodes: a scenario choosing its node size
/// does not run mixed.
fn on_set(scn: &Scenario, n: usize, mkfs: &str, tag: &str) -> Option<Scenario> {
    if mkfs.contains("-M")
        && scn
            .mkfs
            .iter()
            .any(|a| a.starts_with("-n") || a.starts_with("--nodesize"))
    {
        return None;
    }
    // With mixed block groups data and metadata share their space: the
    // kernel may commit where it logs on separate groups (a large file on
    // a small filesystem), so whether there is a log is left open there.
    let any_log = if mkfs.contains("-M") {
        "expect-log any\n"
    } else {
        ""
    };
    let text = format!("devices {n}\nmkfs {mkfs}\n{}{any_log}", scn.text);
    Scenario::parse(&format!("{}@{tag}", scn.name), &text).ok()
}

/// Run the script through btrkit-shell on a new set in `work`; its
/// devices, devid order. `Ok` also when only expectations failed (the
/// caller checks what the kernel recovers).
fn shell_run(scn: &Scenario, work: &Path) -> Result<Vec<PathBuf>, String> {
    let r = shellrun::run(scn, work, "ours")?;
    if !r.only_expectations_failed() {
        return Err(r.failure());
    }
    Ok(r.devices)
}

/// The kernel's run of `scn` (cached), and what it recovers from it.
fn kernel_side(scn: &Scenario, work: &Path) -> Result<Manifest, String> {
    let crash = kcrash::cached_crash_image(scn, &kcrash::default_cache_dir())
        .map_err(|e| format!("kernel run: {e}"))?;
    if crash.devices.len() != scn.devices {
        return Err(format!(
            "kernel run left {} devices, not {}",
            crash.devices.len(),
            scn.devices
        ));
    }
    let k = copy_set(&crash.devices, &work.join("k"), "k")?;
    let m = sets::manifest(&k, "rw").map_err(|e| format!("kernel's own replay: {e}"))?;
    for d in &k {
        let _ = std::fs::remove_file(d);
    }
    Ok(m)
}

/// The engine's trees against the kernel's, on the cut script.
fn engine_one(scn: &Scenario) -> Result<(), String> {
    let work = tempfile::Builder::new()
        .prefix(&format!("eset-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let kernel = kernel_side(scn, w)?;
    let _slot = kcrash::slot();
    let ours = shell_run(scn, w)?;
    let mut problems = Vec::new();
    if let Err(e) = fsck_clean(&ours) {
        problems.push(e);
    }
    if let Err(e) = oracle::check_set_clean(&ours) {
        problems.push(e);
    }
    let copy = copy_set(&ours, &w.join("c"), "c")?;
    match sets::manifest(&copy, "ro") {
        Ok(m) if m != kernel => problems.push(format!(
            "the kernel sees our set differently (A = kernel run, B = btrkit run):\n{}",
            kernel.short_diff(&m, 12)
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("kernel mount of our set: {e}")),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Our log on the set, replayed by the kernel and by btrkit-replay.
fn log_one(scn: &Scenario) -> Result<(), String> {
    let work = tempfile::Builder::new()
        .prefix(&format!("lset-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let theirs = kernel_side(scn, w)?;
    let _slot = kcrash::slot();
    let ours = shell_run(scn, w)?;
    let mut problems = Vec::new();
    // The kernel replays our log at a read-write mount.
    let k = copy_set(&ours, &w.join("k"), "kours")?;
    let k_ours = sets::manifest(&k, "rw")
        .map_err(|e| format!("the kernel cannot mount our crash set: {e}"))?;
    let consistent = oracle::check_set_clean(&k).map_err(|e| {
        problems.push(format!("after the kernel replayed our log: {e}"));
        e
    });
    let posts = copy_set(&k, &w.join("p"), "p")
        .and_then(|p| kcrash::run_posts_with(&p[0], &sets::device_opts(&p), scn));
    match posts {
        Ok(posts) => {
            let fails = kcrash::check_expectations(
                scn,
                &k_ours,
                &kcrash::Outcome {
                    consistent: Some(consistent),
                    posts,
                },
            );
            if !fails.is_empty() {
                problems.push(format!(
                    "the kernel's replay of our log breaks expectations: {}",
                    fails.join("; ")
                ));
            }
        }
        Err(e) => problems.push(format!("post steps: {e}")),
    }
    // The kernel's own outcome can vary between runs (a rename over a
    // file starts writeback of the new file's data, which on a set may or
    // may not complete before the next commit): ours must equal one of
    // three of its runs.
    let mut equal = k_ours == theirs;
    for run in 1..3 {
        if equal {
            break;
        }
        let again = w.join(format!("again-{run}"));
        let other = kcrash::generate(scn, &again)
            .and_then(|c| copy_set(&c.devices, &again.join("k"), "k"))
            .and_then(|k| sets::manifest(&k, "rw"));
        let _ = std::fs::remove_dir_all(&again);
        equal = other.is_ok_and(|m| m == k_ours);
    }
    // A named exception (see families::LOG_EXCEPTIONS) may differ as it
    // does on one device; its expectations still hold.
    let base = scn.name.split('@').next().unwrap_or(&scn.name);
    if !equal && !families::LOG_EXCEPTIONS.iter().any(|(n, _)| *n == base) {
        problems.push(format!(
            "the kernel recovers from our log (B) other than from its own (A):\n{}",
            theirs.short_diff(&k_ours, 12)
        ));
    }
    // btrkit-mount and btrkit-restore read our crash set as the kernel
    // replays it.
    if let Err(e) = sets::read_paths_match(&ours, &k_ours, w) {
        problems.push(e);
    }
    // btrkit-replay of our crash set, into one file per device (the
    // output file itself for one device).
    let out = w.join("replayed");
    let r: Vec<PathBuf> = if ours.len() == 1 {
        vec![w.join("replayed.img")]
    } else {
        ours.iter()
            .map(|d| out.join(d.file_name().unwrap_or_default()))
            .collect()
    };
    let o = Command::new(kcrash::replay_bin())
        .args(&ours)
        .arg("-o")
        .arg(if ours.len() == 1 { &r[0] } else { &out })
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        match sets::manifest(&r, "ro") {
            Ok(m) if m != k_ours => problems.push(format!(
                "btrkit-replay of our log (B) differs from the kernel's replay of it (A):\n{}",
                k_ours.short_diff(&m, 12)
            )),
            Ok(_) => {}
            Err(e) => problems.push(format!("mount of btrkit-replay's result: {e}")),
        }
    } else {
        problems.push(format!(
            "btrkit-replay exit {:?}: {}",
            o.status.code(),
            last_line(&String::from_utf8_lossy(&o.stderr))
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The corpus scenarios that leave the profiles to us, one share per
/// profile, on that profile's set.
fn jobs() -> Vec<Scenario> {
    let every: usize = std::env::var("BTRKIT_ENGINE_SET_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
        .max(1);
    let corpus: Vec<Scenario> = families::corpus()
        .into_iter()
        .filter(|s| {
            !s.mkfs
                .iter()
                .any(|a| matches!(a.as_str(), "-d" | "-m" | "-M" | "--mixed"))
                && s.devices == 1
        })
        .collect();
    let mut out = Vec::new();
    for (p, (n, mkfs, tag)) in PROFILES.iter().enumerate() {
        for (i, s) in corpus.iter().enumerate() {
            if i % every == p % every {
                out.extend(on_set(s, *n, mkfs, tag));
            }
        }
    }
    out
}

fn sweep(what: &str, jobs: Vec<Scenario>, f: fn(&Scenario) -> Result<(), String>) {
    let results = kcrash::parallel_map(&jobs, kcrash::max_jobs(), |_, s| {
        let r = f(s);
        eprintln!("{:<52} {}", s.name, if r.is_ok() { "pass" } else { "FAIL" });
        (s.name.clone(), r)
    });
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|(n, r)| r.err().map(|e| format!("--- {n}\n{e}")))
        .collect();
    eprintln!("{what}: {} scenarios, {} failed", jobs.len(), failed.len());
    assert!(
        failed.is_empty(),
        "{what}: {} of {} fail:\n{}",
        failed.len(),
        jobs.len(),
        failed.join("\n")
    );
}

#[test]
fn engine_on_sets_equals_the_kernel() {
    skip_unless!(require_kernel_mount());
    sweep(
        "engine on sets",
        jobs()
            .iter()
            .filter_map(shellrun::cut_before_crash)
            .collect(),
        engine_one,
    );
}

#[test]
fn kernel_replays_our_logs_on_sets() {
    skip_unless!(require_kernel_mount() && btrkit_tests::require_fuse());
    sweep("logs on sets", jobs(), log_one);
}
