//! `btrkit-shell bench fileio` does what sysbench's fileio test does (not
//! how fast): the file layout, the request mix of each mode, the number of
//! events, fsync passes every `--file-fsync-freq` writes (every file,
//! one request each), `--file-fsync-all`, O_SYNC writes, the JSON report
//! and its engine counters; bad options get one line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shell() -> PathBuf {
    btrkit_tests::bin_path("btrkit-shell")
}

fn fileio(img: &Path, args: &[&str]) -> Output {
    Command::new(shell())
        .args(["bench", "fileio"])
        .arg(img)
        .args(["--size", "1G", "--json"])
        .args(args)
        .output()
        .expect("spawn btrkit-shell bench")
}

fn report(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("one line of JSON")
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

#[test]
fn rndwr_events_and_fsync_passes_as_sysbench_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    // 4 files, fsync pass every 10 writes: each pass is 4 fsync requests.
    let r = report(&fileio(
        &img,
        &[
            "--file-num=4",
            "--file-block-size=4096",
            "--file-total-size=4M",
            "--file-test-mode=rndwr",
            "--file-fsync-freq=10",
            "--threads=3",
            "--events=700",
            "--time=0",
        ],
    ));
    assert_eq!(n(&r, "events"), 700, "{r}");
    let (w, f) = (n(&r, "writes"), n(&r, "fsyncs"));
    assert_eq!(w + f, 700);
    assert_eq!(n(&r, "reads"), 0);
    // Passes start at every 10th write and take 4 requests: 14 requests
    // per 10 writes, give or take the pass cut by the end.
    assert!(
        (f as i64 - (w as i64 / 10) * 4).abs() <= 4,
        "{w} writes, {f} fsyncs"
    );
    let per: Vec<u64> = r["events_per_thread"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(per.len(), 3);
    assert_eq!(per.iter().sum::<u64>(), 700);
    for k in ["writes_per_s", "fsyncs_per_s"] {
        assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
    }
    for k in ["avg", "p95", "max"] {
        assert!(r["latency_ms"][k].as_f64().is_some(), "latency {k}: {r}");
    }
    // The engine's counters of the run: every fsync accounted for.
    let st = &r["stats"];
    assert!(n(st, "fsyncs") >= f, "{st}");
    assert_eq!(
        n(st, "log_syncs")
            + n(st, "log_syncs_skipped")
            + n(st, "log_syncs_joined")
            + n(st, "full_commits"),
        n(st, "fsyncs"),
        "{st}"
    );

    // The layout sysbench's prepare makes: test_file.0..3 of 1 MiB each.
    let o = Command::new(shell())
        .arg(&img)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut o = o;
    use std::io::Write;
    o.stdin
        .take()
        .unwrap()
        .write_all(b"ls /\nstat /test_file.3\n")
        .unwrap();
    let out = o.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for i in 0..4 {
        assert!(
            text.contains(&format!("test_file.{i}")),
            "no test_file.{i}: {text}"
        );
    }
    assert!(text.contains("1048576"), "test_file.3 is not 1 MiB: {text}");
}

#[test]
fn fsync_all_and_rw_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let r = report(&fileio(
        &dir.path().join("b.img"),
        &[
            "--file-num=2",
            "--file-block-size=4096",
            "--file-total-size=2M",
            "--file-fsync-all=on",
            "--events=300",
            "--time=0",
        ],
    ));
    assert_eq!(
        n(&r, "writes"),
        n(&r, "fsyncs"),
        "fsync after every write: {r}"
    );
    let r = report(&fileio(
        &dir.path().join("c.img"),
        &[
            "--file-num=2",
            "--file-block-size=4096",
            "--file-total-size=2M",
            "--file-test-mode=rndrw",
            "--file-fsync-freq=0",
            "--events=2000",
            "--time=0",
        ],
    ));
    let (rd, wr) = (n(&r, "reads") as f64, n(&r, "writes") as f64);
    assert!(
        (rd / wr - 1.5).abs() < 0.3,
        "reads/writes {rd}/{wr}, want 1.5"
    );
    assert_eq!(n(&r, "fsyncs"), 0);
}

#[test]
fn sequential_write_covers_every_block_once() {
    let dir = tempfile::tempdir().unwrap();
    // 2 files of 64 blocks: seqwr ends after 128 writes.
    let r = report(&fileio(
        &dir.path().join("d.img"),
        &[
            "--file-num=2",
            "--file-block-size=4096",
            "--file-total-size=512K",
            "--file-test-mode=seqwr",
            "--file-fsync-freq=0",
            "--time=30",
            "--threads=2",
        ],
    ));
    assert_eq!(n(&r, "writes"), 128, "{r}");
}

#[test]
fn osync_writes_need_no_fsync_and_sync_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let r = report(&fileio(
        &dir.path().join("e.img"),
        &[
            "--file-num=1",
            "--file-block-size=4096",
            "--file-total-size=1M",
            "--file-extra-flags=sync",
            "--file-fsync-freq=0",
            "--events=100",
            "--time=0",
        ],
    ));
    assert_eq!(n(&r, "fsyncs"), 0);
    let st = &r["stats"];
    assert!(n(st, "fsyncs") >= 100, "each O_SYNC write syncs: {st}");
    assert!(n(st, "log_syncs") > 0, "{st}");
}

/// `--crash-check`: the run ends with a power failure, the log replay and
/// the checker, and every write acknowledged by an fsync or O_SYNC is read
/// back (core's workload::durable tests that a loss would be reported).
#[test]
fn crash_check_finds_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "--file-num=4",
        "--file-block-size=4096",
        "--file-total-size=8M",
        "--events=2000",
        "--time=0",
        "--file-fsync-end=off",
        "--crash-check",
    ];
    for (i, extra) in [
        &["--threads=4", "--file-fsync-freq=7"][..],
        &[
            "--threads=3",
            "--file-extra-flags=sync",
            "--file-fsync-freq=0",
        ],
        &["--threads=2", "--prealloc", "--file-test-mode=rndrw"],
        &["--threads=2", "--file-fsync-all"],
        &["--file-test-mode=seqwr", "--file-fsync-freq=13"],
    ]
    .into_iter()
    .enumerate()
    {
        let img = dir.path().join(format!("cc{i}.img"));
        let r = report(&fileio(&img, &[&common[..], extra].concat()));
        let cc = &r["crash_check"];
        assert_eq!(cc["lost"].as_u64(), Some(0), "{extra:?}: {cc}");
        assert_eq!(cc["garbage"].as_u64(), Some(0), "{extra:?}: {cc}");
        assert_eq!(cc["checker_errors"].as_u64(), Some(0), "{extra:?}: {cc}");
        assert_eq!(
            cc["replayed_log"].as_bool(),
            Some(true),
            "{extra:?}: acknowledged writes since the last commit need the log: {cc}"
        );
        assert!(
            n(cc, "acknowledged") > 0 && n(cc, "checked_acknowledged") > 0,
            "{extra:?}: {cc}"
        );
        assert_eq!(
            n(cc, "checked"),
            2048,
            "{extra:?}: every block of the four files: {cc}"
        );
        std::fs::remove_file(&img).unwrap();
    }
}

#[test]
fn bad_options_get_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("f.img");
    for args in [
        &["--file-test-mode=sideways"][..],
        &["--file-extra-flags=fast"],
        &["--set", "warp=on"],
        &["--file-num=0"],
        &["--file-io-mode=async"],
        &["--time=0", "--events=0"],
    ] {
        let o = fileio(&img, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}: exit 0");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
