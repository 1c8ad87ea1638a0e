//! btrkit's fsync log writer against the kernel, scenario by scenario.
//!
//! Every scenario of the replay corpus and the seeded random families runs
//! through `btrkit-shell` up to its final crash, which leaves the image as
//! the power failure would, log and all. Then:
//! - the kernel mounts a copy of it, replaying **our** log; every
//!   expectation of the scenario must hold on what it recovers, and
//!   `btrfs check` must find the result clean;
//! - what the kernel recovers from our log must equal what it recovers from
//!   its own run of the same script (its own crash image), except for the
//!   named exceptions below, each explained, and in at least 95 % of all;
//! - `btrkit-replay` of our crash image must give the tree the kernel's
//!   replay of it gives.
//!
//! `BTRKIT_LOG_SCENARIOS=a,b*` runs only the named ones; the
//! `BTRKIT_RANDOM_*_SCENARIOS` variables set how many seeded ones of each
//! family run (16 by default); `BTRKIT_LOG_KEEP=DIR` keeps each scenario's
//! script and images in `DIR/NAME/` for a closer look.

use btrkit_tests::kcrash::{self, Scenario};
use btrkit_tests::logcheck::{self, Verdict};
use std::path::Path;
use std::time::Instant;

#[path = "common/families.rs"]
mod families;

use families::LOG_EXCEPTIONS as EXCEPTIONS;

fn scenarios() -> Vec<Scenario> {
    let mut all = families::corpus();
    all.extend(families::all_families());
    all.retain(|s| s.text.lines().any(|l| l.trim_start().starts_with("crash")));
    if let Ok(only) = std::env::var("BTRKIT_LOG_SCENARIOS") {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        all.retain(|s| {
            names.iter().any(|n| match n.strip_suffix('*') {
                Some(p) => s.name.starts_with(p),
                None => *n == s.name,
            })
        });
    }
    all
}

fn run_one(scn: &Scenario, cache: &Path) -> Verdict {
    let opts = logcheck::Options {
        cache: Some(cache.to_path_buf()),
        kernel_runs: 2,
        keep: std::env::var_os("BTRKIT_LOG_KEEP").map(|d| Path::new(&d).join(&scn.name)),
        may_differ: EXCEPTIONS.iter().any(|(n, _)| *n == scn.name),
    };
    logcheck::check(scn, &opts)
}

#[test]
fn kernel_replays_our_logs() {
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
        let verdict = if !r.problems.is_empty() {
            "FAIL"
        } else if r.kernel_own_failed {
            "kernel-own-unreplayable"
        } else if r.equal {
            "equal"
        } else {
            "differs"
        };
        eprintln!(
            "{:<40} {:<7} log {:<3} ({:.1}s)",
            s.name,
            verdict,
            if r.had_log { "yes" } else { "no" },
            t0.elapsed().as_secs_f64()
        );
        r
    });
    let failed: Vec<&Verdict> = results.iter().filter(|r| !r.problems.is_empty()).collect();
    let differing: Vec<&Verdict> = results
        .iter()
        .filter(|r| r.problems.is_empty() && !r.equal && !r.kernel_own_failed)
        .collect();
    let unexplained: Vec<&&Verdict> = differing
        .iter()
        .filter(|r| !EXCEPTIONS.iter().any(|(n, _)| *n == r.name))
        .collect();
    let n = results.len();
    let equal = results
        .iter()
        .filter(|r| (r.equal || r.kernel_own_failed) && r.problems.is_empty())
        .count();
    eprintln!(
        "{n} scenarios: {equal} equal to the kernel's own run, {} differ ({} unexplained), {} fail; {:.0}s",
        differing.len(),
        unexplained.len(),
        failed.len(),
        t.elapsed().as_secs_f64()
    );
    let mut report = Vec::new();
    for r in &failed {
        report.push(format!(
            "--- {} FAILS\n{}\n{}",
            r.name,
            r.problems.join("\n"),
            r.notes.join("\n")
        ));
    }
    for r in &unexplained {
        report.push(format!(
            "--- {} differs from the kernel's own run (not a named exception)\n{}",
            r.name,
            r.notes.join("\n")
        ));
    }
    // A sweep beyond the default seeds (BTRKIT_RANDOM_*_SCENARIOS) meets
    // differences no one has explained yet: they are listed and count
    // against the 95 %, but only the default set must have none.
    if !report.is_empty() {
        eprintln!(
            "{}",
            report
                .join("\n")
                .lines()
                .take(400)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let sweep = std::env::vars().any(|(k, v)| k.starts_with("BTRKIT_RANDOM_") && v != "16");
    assert!(
        failed.is_empty() && (sweep || unexplained.is_empty()) && equal * 100 >= n * 95,
        "{}",
        report
            .join("\n")
            .lines()
            .take(400)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
