//! `btrkit-shell explore`: seeded random workloads of every family and the
//! README's example, each crashed at every flush point and with random
//! subsets of the unflushed writes (some torn): every recovery replays,
//! the checker finds nothing and no fsync's promise is broken. Bad input
//! gets one line and a non-zero exit, and the starting image is never
//! changed. `BTRKIT_EXPLORE_SCENARIOS` sets how many of each family run
//! (8 by default: 32 random workloads).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/families.rs"]
mod families;

fn shell() -> PathBuf {
    btrkit_tests::bin_path("btrkit-shell")
}

fn explore(img: &Path, script: &Path, extra: &[&str]) -> Output {
    Command::new(shell())
        .arg("explore")
        .arg(img)
        .arg(script)
        .args(extra)
        .output()
        .expect("spawn btrkit-shell explore")
}

fn report(o: &Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON line ({e}): {out}\nstderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[test]
fn random_workloads_keep_every_promise_at_every_flush_point() {
    let n: u64 = std::env::var("BTRKIT_EXPLORE_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let makers: [(&str, fn(u64) -> String); 4] = [
        ("random", families::random_scenario),
        ("random-ns", families::random_ns_scenario),
        ("random-clone", families::random_clone_scenario),
        ("random-quota", families::random_quota_scenario),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut scripts: Vec<(String, PathBuf)> = Vec::new();
    for (prefix, make) in makers {
        for seed in 1..=n {
            let name = format!("{prefix}-{seed:03}");
            let p = dir.path().join(format!("{name}.scn"));
            std::fs::write(&p, make(seed)).unwrap();
            scripts.push((name, p));
        }
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workload.scn");
    scripts.push(("example-workload".into(), example));
    let (mut points, mut states, mut promises) = (0u64, 0u64, 0u64);
    let mut bad = Vec::new();
    for (name, script) in &scripts {
        let img = dir.path().join(format!("{name}.img"));
        let o = explore(&img, script, &["--random", "2", "--json"]);
        let r = report(&o);
        let v = r["violations"].as_array().map_or(0, Vec::len);
        if !o.status.success() || v > 0 {
            bad.push(format!(
                "{name}: exit {:?}, {v} violation(s): {}",
                o.status.code(),
                r["violations"]
            ));
        }
        let fp = r["flush_points"].as_u64().unwrap_or(0);
        assert!(fp >= 2, "{name}: only {fp} flush point(s): {r}");
        assert!(
            r["states_checked"].as_u64().unwrap_or(0) >= fp,
            "{name}: fewer states than flush points: {r}"
        );
        points += fp;
        states += r["states_checked"].as_u64().unwrap_or(0);
        promises += r["promises"].as_u64().unwrap_or(0);
        let _ = std::fs::remove_file(&img);
    }
    eprintln!("explore: {} workloads, {points} flush points, {states} crash states, {promises} fsync promises checked", scripts.len());
    assert!(scripts.len() >= 30);
    assert!(promises > 0, "no fsync promise was ever checked");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_starting_image_is_not_changed() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("start.img");
    let script = dir.path().join("s.scn");
    std::fs::write(&script, "fssize 256M\nmkdir /d\nwrite /d/f 0 64K 0x61\nfsync /d/f\nwrite /d/f 64K 4K 0x62\nsync\ncrash\n").unwrap();
    // The image is made when missing, then explored twice: its bytes stay.
    let o = explore(&img, &script, &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before = std::fs::read(&img).unwrap();
    let o = explore(&img, &script, &["--random", "3", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(report(&o)["violations"].as_array().map(Vec::len), Some(0));
    assert!(
        std::fs::read(&img).unwrap() == before,
        "explore wrote to the starting image"
    );
}

#[test]
fn the_table_names_what_was_checked() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.scn");
    std::fs::write(&script, "fssize 256M\nwrite /f 0 8K 0x61\nfsync /f\n").unwrap();
    let o = explore(&dir.path().join("t.img"), &script, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    for col in ["flush points", "states checked", "violations"] {
        assert!(out.contains(col), "no {col:?} column: {out}");
    }
}

#[test]
fn bad_input_gets_one_line_and_a_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("b.img");
    let cases: [(&str, &str); 3] = [
        ("unknown verb", "fssize 256M\nfrobnicate /x\n"),
        ("missing path", "fssize 256M\nfsync /nope\n"),
        ("unknown switch", "fssize 256M\nset warp-speed on\n"),
    ];
    for (what, text) in cases {
        let s = dir.path().join("bad.scn");
        std::fs::write(&s, text).unwrap();
        let o = explore(&img, &s, &["--json"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what}: exit 0");
        assert_eq!(err.trim().lines().count(), 1, "{what}: not one line: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
    let o = explore(&img, &dir.path().join("no-such.scn"), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read"));
}

/// Seeded random workloads on sets of devices (raid1 on two, raid10 on
/// four, raid1c3 with raid0 data on three): each device keeps its own
/// unflushed writes at a crash, so there are crash points between one
/// device's flush and the next device's, and random subsets keep or tear
/// each device's writes on their own; no promise is broken, every
/// recovery replays and checks clean.
#[test]
fn sets_keep_every_promise_when_devices_lose_different_writes() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = [
        (2, "-m raid1 -d raid1"),
        (4, "-m raid10 -d raid10"),
        (3, "-m raid1c3 -d raid0"),
    ];
    let mut bad = Vec::new();
    for (p, (n, mkfs)) in profiles.iter().enumerate() {
        for seed in 1..=3u64 {
            let body = families::random_scenario(seed + 100 * p as u64);
            let name = format!("set{p}-{seed}");
            let one = dir.path().join(format!("{name}-one.scn"));
            std::fs::write(&one, &body).unwrap();
            let set = dir.path().join(format!("{name}.scn"));
            std::fs::write(&set, format!("devices {n}\nmkfs {mkfs}\n{body}")).unwrap();
            let r1 = report(&explore(
                &dir.path().join(format!("{name}-one.img")),
                &one,
                &["--json"],
            ));
            let img = dir.path().join(format!("{name}.img"));
            let o = explore(&img, &set, &["--random", "2", "--json"]);
            let r = report(&o);
            let v = r["violations"].as_array().map_or(0, Vec::len);
            if !o.status.success() || v > 0 {
                bad.push(format!("{name}: {v} violation(s): {}", r["violations"]));
            }
            // Every device flushes on its own: more crash points than the
            // same workload on one device.
            let (fp, fp1) = (
                r["flush_points"].as_u64().unwrap_or(0),
                r1["flush_points"].as_u64().unwrap_or(0),
            );
            assert!(
                fp > fp1,
                "{name}: {fp} flush points on {n} devices, {fp1} on one"
            );
            for i in 2..=*n {
                assert!(dir.path().join(format!("{name}-{i}.img")).exists());
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
