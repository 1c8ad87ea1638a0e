//! btrkit's engine against the kernel, workload by workload.
//!
//! Every scenario of the replay corpus (`tests/scenarios/*.scn`) and the
//! seeded random families of `replay_kernel.rs`, cut before their first
//! crash and ended with `sync`, runs twice:
//! - through the kernel on a loop mount of a mkfs.btrfs image (the oracle);
//! - through `btrkit-shell` on an image btrkit makes from the same `mkfs`
//!   and `fssize` directives.
//!
//! Then the kernel mounts our image and must see exactly the tree its own
//! run left (names, types, modes, sizes, contents, xattrs, link counts,
//! symlink targets, data/unwritten/hole ranges, inode numbers), and both
//! `btrfs check --readonly` and `btrkit-fsck --check-data-csum` must find
//! our image clean.
//!
//! `BTRKIT_ENGINE_SCENARIOS=a,b*` runs only the named ones; the
//! `BTRKIT_RANDOM_*_SCENARIOS` variables set how many seeded ones of each
//! family run (16 by default).

use btrkit_tests::kcrash::{self, Scenario};
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::shellrun;
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "common/families.rs"]
mod families;

fn scenarios() -> Vec<Scenario> {
    let mut all = families::corpus();
    all.extend(families::all_families());
    let mut out: Vec<Scenario> = all.iter().filter_map(shellrun::cut_before_crash).collect();
    if let Ok(only) = std::env::var("BTRKIT_ENGINE_SCENARIOS") {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        out.retain(|s| {
            let base = s.name.trim_end_matches("-cut");
            names.iter().any(|n| match n.strip_suffix('*') {
                Some(p) => base.starts_with(p),
                None => *n == base,
            })
        });
    }
    out
}

/// Run a scenario through btrkit-shell on a fresh image; Ok(image).
fn engine_run(scn: &Scenario, work: &Path) -> Result<std::path::PathBuf, String> {
    let r = shellrun::run(scn, work, "engine")?;
    if !r.ok {
        return Err(r.failure());
    }
    Ok(r.devices[0].clone())
}

fn fsck_clean(img: &Path) -> Result<(), String> {
    let r = btrkit_tests::fsck_support::run_fsck(
        img,
        &["--check-data-csum", "--check-mirrors"],
        Duration::from_secs(300),
    );
    let errors: Vec<String> = r
        .errors()
        .into_iter()
        .map(|(phase, cat, msg)| format!("phase {phase} {cat}: {msg}"))
        .collect();
    if r.code == 0 && errors.is_empty() {
        return Ok(());
    }
    Err(format!(
        "btrkit-fsck exit {}: {}",
        r.code,
        errors
            .iter()
            .take(4)
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    ))
}

fn run_one(scn: &Scenario, cache: &Path) -> Result<(), String> {
    let kernel_img =
        kcrash::cached_crash_image(scn, cache).map_err(|e| format!("kernel run: {e}"))?;
    let _slot = kcrash::slot();
    let work = tempfile::Builder::new()
        .prefix(&format!("engine-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let kernel = kcrash::manifest_of_image(&kernel_img.path, w)
        .map_err(|e| format!("kernel manifest: {e}"))?;
    let ours = engine_run(scn, w)?;
    let mut problems = Vec::new();
    match kcrash::manifest_via_copy(&ours, &w.join("ours-copy.img"), "ro") {
        Ok(m) if m != kernel => problems.push(format!(
            "the kernel sees our image differently (A = kernel run, B = btrkit run):\n{}",
            kernel.short_diff(&m, 12)
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("kernel mount of our image: {e}")),
    }
    if let Err(e) = oracle::check_clean(&[&ours], Progs::Distro) {
        problems.push(e);
    }
    if let Err(e) = fsck_clean(&ours) {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[test]
fn engine_equals_kernel_on_every_workload() {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let t = Instant::now();
    let cache = kcrash::default_cache_dir();
    let all = scenarios();
    assert!(!all.is_empty(), "no scenarios");
    let results = kcrash::parallel_map(&all, kcrash::max_jobs(), |_, s| {
        let t0 = Instant::now();
        let r = run_one(s, &cache);
        eprintln!(
            "{:<44} {} ({:.1}s)",
            s.name,
            if r.is_ok() { "pass" } else { "FAIL" },
            t0.elapsed().as_secs_f64()
        );
        (s.name.clone(), r)
    });
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(n, r)| r.as_ref().err().map(|e| format!("--- {n}\n{e}")))
        .collect();
    eprintln!(
        "{}/{} workloads pass, {:.0}s",
        results.len() - failed.len(),
        results.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {} workloads differ:\n{}",
        failed.len(),
        results.len(),
        failed
            .join("\n")
            .lines()
            .take(300)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
