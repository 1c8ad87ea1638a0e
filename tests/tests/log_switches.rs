//! The fsync optimizations' switches and counters, in both positions:
//! - fast-fsync-skip (2015): create, write, fsync, sync, fsync, fsync is
//!   one log sync with it on, three with it off;
//! - log-conflicting-inodes (2016): rename /d/a to /e/a, create a new /d/a,
//!   fsync it: no full commit with it on (the old inode's new name is
//!   logged), one with it off; after the crash the kernel recovers both
//!   files either way;
//! - sync-io-first (2009): the same data reaches the disk either way; with
//!   it on, an fsync writes its own data ahead of queued background data;
//!   off, it waits for the queued batch (core/tests/fsync_batch.rs).
//!
//! Bad input (unknown switch or verb, missing path) is one line and a
//! non-zero exit, with what was durable kept.

use btrkit_tests::kcrash;
use btrkit_tests::oracle::{self, Progs};
use std::path::Path;
use std::process::Command;

fn shell(img: &Path, script: &str) -> (i32, String, String) {
    let dir = img.parent().expect("image dir");
    let p = dir.join(format!("s{}.scn", script.len()));
    std::fs::write(&p, script).expect("write script");
    let o = Command::new(btrkit_tests::bin_path("btrkit-shell"))
        .arg(img)
        .arg(&p)
        .arg("-q")
        .output()
        .expect("btrkit-shell");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn stats(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no stats line in {out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn fast_fsync_skip_counts() {
    for (on, syncs, skipped) in [("on", 1, 2), ("off", 3, 0)] {
        let d = tempfile::tempdir().expect("tempdir");
        let img = d.path().join("a.img");
        let (code, out, err) = shell(&img, &format!("set fast-fsync-skip {on}\ncreate /f\nwrite /f 0 4K 0x41\nfsync /f\nsync\nfsync /f\nfsync /f\nstats --json\n"));
        assert_eq!(code, 0, "{err}");
        let v = stats(&out);
        assert_eq!(v["fsyncs"], 3, "{on}: {v}");
        assert_eq!(v["log_syncs"], syncs, "{on}: {v}");
        assert_eq!(v["log_syncs_skipped"], skipped, "{on}: {v}");
        assert_eq!(v["full_commits"], 0, "{on}: {v}");
        assert_eq!(v["switches"]["fast_fsync_skip"], on == "on", "{v}");
    }
}

const CONFLICT: &str = "mkdir /d\nmkdir /e\nwrite /d/a 0 4K 0x41\nsync\nrename /d/a /e/a\nwrite /d/a 0 8K 0x42\nfsync /d/a\nstats --json\ncrash\nexpect size /e/a 4K\nexpect size /d/a 8K\n";

#[test]
fn log_conflicting_inodes_counts() {
    for (on, commits, logged) in [("on", 0, 1), ("off", 1, 0)] {
        let d = tempfile::tempdir().expect("tempdir");
        let img = d.path().join("c.img");
        let (code, out, err) = shell(
            &img,
            &format!("set log-conflicting-inodes {on}\n{CONFLICT}"),
        );
        assert_eq!(code, 0, "{on}: {err}");
        let v = stats(&out);
        assert_eq!(v["full_commits"], commits, "{on}: {v}");
        assert_eq!(v["conflicting_inodes_logged"], logged, "{on}: {v}");
        if on == "off" {
            assert_eq!(
                v["full_commit_reasons"]["name taken from a renamed or unlinked inode"], 1,
                "{v}"
            );
        } else {
            assert_eq!(v["log_syncs"], 1, "{v}");
        }
        // The kernel recovers both files from the crash image.
        if let Err(why) = kcrash::can_run() {
            btrkit_tests::skip(&why);
            continue;
        }
        let m =
            kcrash::manifest_via_copy(&img, &d.path().join("k.img"), "rw").expect("kernel mount");
        assert_eq!(
            m.entries.get("/e/a").map(|e| e.size),
            Some(4096),
            "{on}: {m:?}"
        );
        assert_eq!(
            m.entries.get("/d/a").map(|e| e.size),
            Some(8192),
            "{on}: {m:?}"
        );
        oracle::check_clean(&[&d.path().join("k.img")], Progs::Distro)
            .expect("btrfs check after the kernel's replay");
    }
}

#[test]
fn sync_io_first_same_result() {
    let mut images = Vec::new();
    let d = tempfile::tempdir().expect("tempdir");
    for on in ["on", "off"] {
        let img = d.path().join(format!("{on}.img"));
        let script = format!(
            // The flusher writes /bg back after 30 s (no commit before 600 s);
            // the warm-up gives small and medium extents their block groups,
            // so no fsync meets a new chunk (which would commit).
            "mount commit=600\nwarmup yes\nset sync-io-first {on}\nwrite /bg 0 2M 0x11\nsleep 31\nwrite /f 0 4K 0x22\nfsync /f\nwrite /f 4K 4K 0x33\nfsync /f\nstats --json\ncrash\nexpect size /f 8K\nexpect absent /bg\n"
        );
        let (code, out, err) = shell(&img, &script);
        assert_eq!(code, 0, "{on}: {err}");
        images.push((on, stats(&out)));
    }
    let data = |v: &serde_json::Value| v["bytes_written"]["data"].as_u64().unwrap_or(0);
    // On: the fsyncs write only their own data, the background file stays
    // queued; off: it goes to disk ahead of them.
    assert!(data(&images[0].1) < data(&images[1].1), "{:?}", images);
}

#[test]
fn bad_input_is_one_line_and_keeps_what_was_durable() {
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("b.img");
    let (code, _, err) = shell(
        &img,
        "write /kept 0 4K 0x41\nfsync /kept\nset fast-fsync-never on\n",
    );
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(":3: set:"), "{err}");
    let (code, _, err) = shell(&img, "fsync /missing\n");
    assert_ne!(code, 0);
    assert!(
        err.contains("ENOENT") && err.trim().lines().count() == 1,
        "{err}"
    );
    let (code, _, err) = shell(&img, "fsnyc /kept\n");
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = shell(&img, "expect size /kept 4K\n");
    assert_eq!(code, 0, "{err}");
}
