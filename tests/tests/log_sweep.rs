//! The random differential sweeps of the fsync log writer (see
//! `btrkit_tests::sweep`): namespace and data scripts, each ending in a
//! crash, run on the kernel and through btrkit's engine. The kernel's
//! replay of our log and btrkit-replay must both equal the kernel's own
//! crash result (one of up to three kernel runs: its outcome can vary),
//! `btrfs check` must find it clean, and every fsync promise must hold.
//!
//! A disagreement is shrunk to a short script (every cut re-judged against
//! the kernel), written to `BTRKIT_SWEEP_SAVE` (default `tests/scenarios/`,
//! the corpus, where it stays as a regression), and fails the test.
//!
//! CI runs `BTRKIT_SWEEP_NS` / `BTRKIT_SWEEP_DATA` sequences of each family
//! (150 each by default) from seed `BTRKIT_SWEEP_SEED` (1); the long run:
//!
//!     BTRKIT_SWEEP_NS=5000 BTRKIT_SWEEP_DATA=5000 BTRKIT_SWEEP_SEED=100001 \
//!         cargo test --release -p btrkit-tests --test log_sweep -- --nocapture

use btrkit_tests::kcrash::{self, Scenario};
use btrkit_tests::logcheck::{self, Verdict};
use btrkit_tests::sweep;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn judge(name: &str, text: &str, runs: usize) -> Option<Verdict> {
    let scn = Scenario::parse(name, text).ok()?;
    Some(logcheck::check(
        &scn,
        &logcheck::Options {
            kernel_runs: runs,
            ..Default::default()
        },
    ))
}

/// A problem the harness itself had (a step the kernel refused, a tool
/// that did not start): not a disagreement to shrink.
fn harness_trouble(v: &Verdict) -> bool {
    v.problems.iter().any(|p| p.starts_with("kernel run:"))
}

/// Where shrunk disagreements go: the corpus itself (`tests/scenarios/`),
/// where `log_kernel` and `replay_kernel` run them from then on.
fn save_dir() -> PathBuf {
    std::env::var_os("BTRKIT_SWEEP_SAVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios"))
}

fn sweep(family: &str, make: fn(u64) -> String, env: &str, default: u64) {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let n = env_u64(env, default);
    let first = env_u64("BTRKIT_SWEEP_SEED", 1);
    let seeds: Vec<u64> = (first..first + n).collect();
    let t = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let results = kcrash::parallel_map(&seeds, kcrash::max_jobs(), |_, &seed| {
        let name = format!("sweep-{family}-{seed}");
        let text = make(seed);
        let v = judge(&name, &text, 3).expect("generated scripts parse");
        let k = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if !v.clean() || k.is_multiple_of(100) {
            eprintln!(
                "{family} {k}/{n} seed {seed}: {} ({:.0}s)",
                if v.clean() { "ok" } else { "DISAGREES" },
                t.elapsed().as_secs_f64()
            );
        }
        (seed, text, v)
    });
    let promises: usize = results.iter().map(|(_, _, v)| v.promises).sum();
    let kernel_broken: usize = results
        .iter()
        .map(|(_, _, v)| v.kernel_broken_promises)
        .sum();
    let kernel_failed = results
        .iter()
        .filter(|(_, _, v)| v.kernel_own_failed)
        .count();
    let logs = results.iter().filter(|(_, _, v)| v.had_log).count();
    let bad: Vec<&(u64, String, Verdict)> = results.iter().filter(|(_, _, v)| !v.clean()).collect();
    eprintln!(
        "{family}: {n} sequences from seed {first}, {logs} left a log, {promises} fsync promises checked ({kernel_broken} broken by the kernel's own run as well), {kernel_failed} the kernel could not replay itself, {} disagree; {:.0}s",
        bad.len(),
        t.elapsed().as_secs_f64()
    );
    let mut report = Vec::new();
    for (seed, text, v) in bad {
        let mut msg = format!("--- {family} seed {seed}\n{}\n{}", text, v.report());
        if !harness_trouble(v) {
            let name = format!("sweep-{family}-{seed}");
            let small = sweep::shrink(text, |t| {
                judge(&name, t, 3).is_some_and(|v| !v.clean() && !harness_trouble(&v))
            });
            let dir = save_dir();
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{name}.scn"));
            let body = format!("# Found by the {family} sweep (seed {seed}), shrunk.\n{small}");
            let _ = std::fs::write(&file, &body);
            msg.push_str(&format!("\nshrunk ({}):\n{small}", file.display()));
        }
        report.push(msg);
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

#[test]
fn namespace_sequences_replay_as_the_kernel_runs_them() {
    sweep("ns", sweep::namespace_script, "BTRKIT_SWEEP_NS", 150);
}

#[test]
fn data_sequences_replay_as_the_kernel_runs_them() {
    sweep("data", sweep::data_script, "BTRKIT_SWEEP_DATA", 150);
}

/// Print the scripts of the seeds `BTRKIT_SWEEP_SHOW` names (`ns:12,data:7`).
#[test]
#[ignore]
fn show_scripts() {
    let which = std::env::var("BTRKIT_SWEEP_SHOW").unwrap_or_default();
    for w in which.split(',').filter(|w| !w.is_empty()) {
        let (fam, seed) = w.split_once(':').unwrap_or(("ns", w));
        let seed: u64 = seed.parse().unwrap_or(1);
        let text = if fam == "data" {
            sweep::data_script(seed)
        } else {
            sweep::namespace_script(seed)
        };
        println!("# {fam} {seed}\n{text}");
    }
}

/// Judge the script files `BTRKIT_SWEEP_FILES` names (comma separated) and
/// print the verdicts; `BTRKIT_LOG_KEEP=DIR` keeps the images.
#[test]
#[ignore]
fn judge_files() {
    let files = std::env::var("BTRKIT_SWEEP_FILES").unwrap_or_default();
    for f in files.split(',').filter(|f| !f.is_empty()) {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let name = std::path::Path::new(f)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let scn = Scenario::parse(&name, &text).unwrap_or_else(|e| panic!("{f}: {e}"));
        let v = logcheck::check(
            &scn,
            &logcheck::Options {
                kernel_runs: 3,
                keep: std::env::var_os("BTRKIT_LOG_KEEP").map(|d| PathBuf::from(d).join(&name)),
                ..Default::default()
            },
        );
        println!(
            "== {name}: {}\n{}",
            if v.clean() { "clean" } else { "DISAGREES" },
            v.report()
        );
    }
}

/// Scripts whose crash image the kernel cannot replay itself
/// (`tests/scenarios/kernel-cannot-replay/`, found by the sweeps): the
/// kernel must replay btrkit's log of them, with every expectation and
/// promise kept and btrfs check clean (and, should a kernel replay its own
/// one day, to the same tree).
#[test]
fn shapes_the_kernel_cannot_replay_replay_cleanly_from_our_log() {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/kernel-cannot-replay");
    let all = kcrash::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(!all.is_empty(), "no scripts in {}", dir.display());
    let mut report = Vec::new();
    for scn in &all {
        let v = logcheck::check(
            scn,
            &logcheck::Options {
                kernel_runs: 3,
                ..Default::default()
            },
        );
        eprintln!(
            "{:<40} {}",
            scn.name,
            if !v.clean() {
                "FAIL"
            } else if v.kernel_own_failed {
                "ours replays, the kernel's own does not"
            } else {
                "equal"
            }
        );
        if !v.clean() {
            report.push(format!("--- {}\n{}", scn.name, v.report()));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}
