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

/// Scenarios whose recovered tree may differ from the kernel's own run,
/// and why. The expectations must still hold and the image be clean.
const EXCEPTIONS: &[(&str, &str)] = &[
    (
        "nodesize64k-many-files",
        "with 64 KiB nodes the kernel runs out of metadata reservation while the \
         files are written and commits the transaction to reclaim it, so its files \
         are durable with their data; btrkit reserves no metadata space ahead and \
         commits only at its dirty-metadata limit, so its log has each file as \
         created by the fsync of its directory (empty). Both are what fsync promised",
    ),
    (
        "regress-random-1900",
        "without no-holes, a write into the middle of a prealloc extent: the kernel's \
         log drops the unwritten piece [32768, 65536) that its extent-map split leaves \
         outside the logged range, and its own replay loses it; btrkit logs the \
         piece as still unwritten, which replays to the same data (zeros) with the \
         allocation kept",
    ),
    (
        "regress-random-falloc-101",
        "a 51 MiB keep-size fallocate on a 256 MiB filesystem whose data space is \
         fragmented: data extents go by size class (the kernel's find_free_extent), \
         so a large extent, with no group of its class and a new chunk too small, \
         takes the longest free piece of any group. btrkit-mkfs makes a 64 MiB first \
         data chunk (mkfs.btrfs 6.2 an 8 MiB one) which the small files claimed and \
         left almost empty: the extent fits there whole, where the kernel's run on \
         mkfs.btrfs's layout cuts it into pieces and its log cannot keep the piece \
         that crosses the size. Both are what fsync promised",
    ),
    (
        "regress-random-013",
        "an inode logged only as existing (a new name of it in a logged directory) \
         after a truncate: the kernel updates inode items through delayed inodes, so \
         whether the item is copied from a leaf changed in the transaction (size 0: \
         keep the committed size at replay) or logged from memory (the current size) \
         depends on whether its leaf was rewritten for another reason; btrkit updates \
         items in place, its leaf always counts as changed, and it logs the exists \
         form. The kernel recovers the size at the fsync, btrkit's log the committed one",
    ),
    (
        "regress-random-ns-150",
        "a punch writes back the range it punches, and the whole run of dirty pages \
         it lies in goes along as one write; the kernel waits only for the ordered \
         extent inside the punched range, the rest completes in an end-io worker, \
         and here a full commit (an fsync of the parent directory) came before it: \
         the commit has the file's new size without that extent, which lands in the \
         next transaction and goes with the crash. btrkit completes ordered extents \
         as it writes them, so its commit has the data. The file was never fsynced \
         after the write; both are what fsync promised",
    ),
    (
        "regress-random-ns-015",
        "as regress-random-013: an inode logged only as existing after a truncate (delayed inode item)",
    ),
];

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
