//! Every btrfs-progs fsck-test image (damaged ones included) goes through
//! `btrkit-dump super`, `tree` and `log` without a panic, a signal or a hang.
//! A damaged block is reported on a line that names where it is, and the dump
//! goes on past it.
//!
//! "Reported" is asserted, not counted: every tree block that btrkit-fsck
//! finds damaged in itself (checksum, header, keys, item bounds) must appear
//! on an ERROR line of `btrkit-dump tree`, and an image whose verdict is
//! clean must dump without any ERROR line.

use btrkit_tests::fixtures::{
    fsck_fixture, fsck_fixture_dir, fsck_fixture_names, fsck_verdicts, run_dump, FixtureCacheGuard,
};
use btrkit_tests::fsck_support::run_fsck;
use std::collections::BTreeSet;
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
        btrkit_tests::skip("../shared/fixtures/btrfs-progs-fsck is missing");
        return;
    }
    // The cache lives in a static, which is never dropped: removed on exit from here.
    let _cache = FixtureCacheGuard;
    let names = fsck_fixture_names();
    assert!(!names.is_empty(), "no fixture archives found");
    let verdicts = fsck_verdicts();
    let mut failures = Vec::new();
    let mut reported_damage = 0;
    let mut damaged_blocks_seen = 0;
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
            if sub == "tree" {
                let damaged = damaged_blocks(&img);
                for b in &damaged {
                    let needle = b.to_string();
                    if !errs
                        .iter()
                        .any(|l| l.split(|c: char| !c.is_ascii_digit()).any(|w| w == needle))
                    {
                        failures.push(format!("{what}: btrkit-fsck finds tree block {b} damaged but no ERROR line names it"));
                    }
                }
                damaged_blocks_seen += damaged.len();
                if verdicts.get(name.as_str()).is_some_and(|v| v == "clean") && !errs.is_empty() {
                    failures.push(format!(
                        "{what}: a clean image dumps with ERROR lines: {:?}",
                        &errs[..errs.len().min(3)]
                    ));
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
    eprintln!(
        "{} image(s), {reported_damage} with damage reported by dump tree, \
         {damaged_blocks_seen} damaged block(s) named by btrkit-fsck and by the dump",
        names.len()
    );
    // The fixtures hold block-level damage (bad item offsets, transids,
    // levels): a dump that reported none would have stopped checking.
    assert!(
        damaged_blocks_seen > 0 && reported_damage > 0,
        "no damaged block reported at all"
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Tree blocks that btrkit-fsck finds damaged in themselves (phase 3, not a
/// bad mirror copy and not a root item): what a dump must report too.
fn damaged_blocks(img: &std::path::Path) -> BTreeSet<u64> {
    let r = run_fsck(img, &[], LIMIT);
    let v = r.json();
    let mut out = BTreeSet::new();
    for f in v["findings"].as_array().into_iter().flatten() {
        let cat = f["category"].as_str().unwrap_or("");
        let msg = f["message"].as_str().unwrap_or("");
        let block_level = matches!(
            cat,
            "checksum"
                | "header"
                | "parent-transid"
                | "key-order"
                | "item-bounds"
                | "item"
                | "unreadable"
        );
        if f["phase"] == 3 && f["severity"] == "error" && block_level && !msg.starts_with("copy ") {
            if let Some(b) = f["bytenr"].as_u64() {
                out.insert(b);
            }
        }
    }
    out
}
