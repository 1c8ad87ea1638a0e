//! Every btrfs-progs fsck-test image (damaged ones included) goes through
//! `btrkit-dump super`, `tree` and `log` without a panic, a signal or a hang.
//! A damaged block is reported on a line that names where it is, and the dump
//! goes on past it.

use btrkit_tests::fixtures::{
    fsck_fixture, fsck_fixture_dir, fsck_fixture_names, fsck_verdicts, not_implemented, run_dump,
    FixtureCacheGuard,
};
use std::ffi::OsStr;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// An error report must say where: a block number ("bytenr N", "block N",
/// "at N", "logical N" ...), i.e. some number of at least a sector.
fn names_a_location(line: &str) -> bool {
    line.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse::<u64>().ok())
        .any(|n| n >= 4096)
}

fn error_lines(s: &str) -> Vec<&str> {
    s.lines()
        .filter(|l| {
            let t = l.trim_start();
            t.starts_with("ERROR") || t.starts_with("error") || l.contains(": error:")
        })
        .collect()
}

#[test]
fn dump_every_fsck_fixture() {
    if fsck_fixture_dir().is_none() {
        eprintln!("SKIP: ../shared/fixtures/btrfs-progs-fsck is missing");
        return;
    }
    // The cache lives in a static, which is never dropped: removed on exit from here.
    let _cache = FixtureCacheGuard;
    let names = fsck_fixture_names();
    assert!(!names.is_empty(), "no fixture archives found");
    let verdicts = fsck_verdicts();
    let mut failures = Vec::new();
    let mut skipped_cmds = std::collections::BTreeSet::new();
    let mut reported_damage = 0;
    for name in &names {
        let img = match fsck_fixture(name) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: cannot extract: {e}"));
                continue;
            }
        };
        for sub in ["super", "tree", "log"] {
            let o = run_dump(&[OsStr::new(sub), img.as_os_str()], LIMIT);
            let what = format!("{name}: dump {sub}");
            if o.timed_out {
                failures.push(format!("{what}: still running after {LIMIT:?}"));
                continue;
            }
            if o.crashed() {
                failures.push(format!("{what}: crashed\n{}", o.describe()));
                continue;
            }
            if not_implemented(&o) {
                skipped_cmds.insert(sub);
                continue;
            }
            match o.code() {
                Some(0) => {}
                Some(1) => {
                    // A refusal is one line on stderr.
                    let lines: Vec<&str> =
                        o.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
                    if lines.len() != 1 {
                        failures.push(format!(
                            "{what}: exit 1 with {} stderr lines\n{}",
                            lines.len(),
                            o.describe()
                        ));
                    }
                }
                c => failures.push(format!("{what}: exit code {c:?}\n{}", o.describe())),
            }
            // Every damage report names the block it is about.
            let mut errs = error_lines(&o.stdout);
            errs.extend(error_lines(&o.stderr));
            for l in &errs {
                if !names_a_location(l) {
                    failures.push(format!("{what}: error line names no block: {l}"));
                }
            }
            if sub == "tree" && !errs.is_empty() {
                reported_damage += 1;
                // "Goes on": a damaged block does not end the dump; more of
                // the image is printed after the first report.
                let first = o
                    .stdout
                    .lines()
                    .position(|l| l.trim_start().starts_with("ERROR"));
                if let Some(i) = first {
                    if !o
                        .stdout
                        .lines()
                        .skip(i + 1)
                        .any(|l| !l.trim_start().starts_with("ERROR"))
                    {
                        failures.push(format!(
                            "{what}: the dump stops at the first ERROR line\n{}",
                            o.describe()
                        ));
                    }
                }
            }
            eprintln!(
                "{what}: exit {:?} in {:?}, {} error line(s){}",
                o.code(),
                o.elapsed,
                errs.len(),
                verdicts
                    .get(name.as_str())
                    .map(|v| format!(" (expected {v})"))
                    .unwrap_or_default()
            );
        }
    }
    for s in &skipped_cmds {
        eprintln!("SKIP part: `btrkit-dump {s}` is not implemented on this branch");
    }
    eprintln!(
        "{} image(s), {reported_damage} with damage reported by dump tree",
        names.len()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
