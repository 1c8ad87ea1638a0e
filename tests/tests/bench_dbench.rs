//! `btrkit-shell bench dbench` replays NBENCH loadfiles as dbench does:
//! 32 clients over the standard loadfile (`/usr/share/dbench/client.txt`,
//! Debian's dbench package; its first 5,000 lines by default, all of it
//! with `BTRKIT_DBENCH_LINES=0`) with no status other than the one each
//! line expects, every operation counted per client, the JSON report; a
//! bad loadfile gets one line naming the line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LOADFILE: &str = "/usr/share/dbench/client.txt";

fn shell() -> PathBuf {
    btrkit_tests::bin_path("btrkit-shell")
}

fn dbench(img: &Path, load: &Path, args: &[&str]) -> Output {
    Command::new(shell())
        .args(["bench", "dbench"])
        .arg(img)
        .arg(load)
        .args(["--size", "16G", "--json"])
        .args(args)
        .output()
        .expect("spawn btrkit-shell bench dbench")
}

#[test]
fn the_standard_loadfile_by_32_clients_as_dbench_expects() {
    if !Path::new(LOADFILE).exists() {
        btrkit_tests::skip(&format!("{LOADFILE} missing (install dbench)"));
        return;
    }
    let lines: usize = std::env::var("BTRKIT_DBENCH_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let dir = tempfile::tempdir().unwrap();
    let o = dbench(
        &dir.path().join("d.img"),
        Path::new(LOADFILE),
        &[
            "--clients",
            "32",
            "--passes",
            "1",
            "--time",
            "0",
            "--lines",
            &lines.to_string(),
        ],
    );
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("one line of JSON");
    assert_eq!(
        r["unexpected"].as_u64(),
        Some(0),
        "statuses the loadfile does not expect: {}",
        r["unexpected_examples"]
    );
    assert_eq!(r["loadfile_passes"].as_u64(), Some(32));
    assert!(r["mb_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["max_latency_ms"].as_f64().is_some());
    // Every line ran once per client: the per-operation counts are the
    // loadfile's own, times 32.
    let text = std::fs::read_to_string(LOADFILE).unwrap();
    let mut want: std::collections::BTreeMap<&str, u64> = Default::default();
    for l in text
        .lines()
        .take(if lines == 0 { usize::MAX } else { lines })
    {
        let Some(op) = l.split_whitespace().next() else {
            continue;
        };
        let name = match op {
            "QUERY_PATH_INFORMATION" => "Qpathinfo",
            "QUERY_FILE_INFORMATION" => "Qfileinfo",
            "QUERY_FS_INFORMATION" => "Qfsinfo",
            "SET_FILE_INFORMATION" => "Sfileinfo",
            "FIND_FIRST" => "Find",
            "UnlockX" => "LockX",
            o => o,
        };
        *want.entry(name).or_default() += 32;
    }
    for (name, n) in want {
        assert_eq!(
            r["ops"][name]["count"].as_u64(),
            Some(n),
            "{name}: {}",
            r["ops"]
        );
    }
    let st = &r["stats"];
    assert!(
        st["fsyncs"].as_u64().unwrap() > 0,
        "the loadfile's Flush lines are fsyncs: {st}"
    );
}

/// `--crash-check` on the standard loadfile: the power failure comes in
/// the middle of a pass (its first lines), and every file a Flush
/// acknowledged is there after the log replay, checker clean.
#[test]
fn crash_check_after_the_standard_loadfile() {
    if !Path::new(LOADFILE).exists() {
        btrkit_tests::skip(&format!("{LOADFILE} missing (install dbench)"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = dbench(
        &dir.path().join("c.img"),
        Path::new(LOADFILE),
        &[
            "--clients",
            "8",
            "--passes",
            "1",
            "--time",
            "0",
            "--lines",
            "5000",
            "--crash-check",
        ],
    );
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("one line of JSON");
    let cc = &r["crash_check"];
    assert_eq!(cc["lost"].as_u64(), Some(0), "{cc}");
    assert_eq!(cc["checker_errors"].as_u64(), Some(0), "{cc}");
    assert_eq!(cc["replayed_log"].as_bool(), Some(true), "{cc}");
    assert!(
        cc["checked_acknowledged"].as_u64().unwrap_or(0) >= 8,
        "each client has flushed files standing: {cc}"
    );
}

/// dbench's warmup: the clients run for `--warmup` seconds (a fifth of
/// `--time` unless given) before the `--time` that is counted, and what
/// they did in it is forgotten: operations, bytes, latencies and the
/// engine's counters cover only the counted run.
#[test]
fn the_warmup_runs_and_is_not_counted() {
    if !Path::new(LOADFILE).exists() {
        btrkit_tests::skip(&format!("{LOADFILE} missing (install dbench)"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["--clients", "4", "--time", "2", "--lines", "3000"];
        args.extend_from_slice(extra);
        let o = dbench(&dir.path().join("w.img"), Path::new(LOADFILE), &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("one line of JSON")
    };
    let counted = |r: &serde_json::Value| -> u64 {
        r["ops"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["count"].as_u64().unwrap())
            .sum()
    };
    for (r, warm) in [(run(&["--warmup", "1"]), 1.0), (run(&[]), 0.4)] {
        assert_eq!(r["warmup_seconds"].as_f64(), Some(warm), "{r}");
        assert!(r["warmup_ops"].as_u64().unwrap() > 0, "{r}");
        assert!(counted(&r) > 0, "{r}");
        assert!(r["seconds"].as_f64().unwrap() >= 2.0, "{r}");
        assert_eq!(r["unexpected"].as_u64(), Some(0), "{r}");
    }
    let r = run(&["--warmup", "0"]);
    assert_eq!(r["warmup_ops"].as_u64(), Some(0), "{r}");
    assert_eq!(r["warmup_seconds"].as_f64(), Some(0.0), "{r}");
    // Nothing forgotten: the engine saw every Flush the table counts.
    assert_eq!(r["ops"]["Flush"]["count"], r["stats"]["fsyncs"], "{r}");
}

#[test]
fn a_bad_loadfile_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let load = dir.path().join("bad.txt");
    std::fs::write(
        &load,
        "Mkdir \"\\clients\" NT_STATUS_OK\nFrobnicate 3 NT_STATUS_OK\n",
    )
    .unwrap();
    let o = dbench(
        &dir.path().join("b.img"),
        &load,
        &["--passes", "1", "--time", "0"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("line 2"), "{err}");
    let o = dbench(&dir.path().join("b.img"), &dir.path().join("none.txt"), &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read"));
}
