//! Speed and memory against `btrfs check --readonly` on a 100,000-file
//! image (4 GiB sparse, 100 directories of 1000 files, 1.2 GB of data: the
//! `--data` image of tests/scripts/make-bench-image.sh).
//! A measurement, not a test of pass or fail: it prints both tools' figures,
//! and those of btrfsutils' Rust `btrfs check` when `BTRFSUTILS_BTRFS` names
//! its binary (`cargo install btrfs-cli --no-default-features --root DIR`
//! installs it as DIR/bin/btrfs).
//! Ignored by default (it takes a minute and wants a quiet machine); run:
//!
//!     cargo test --release -p btrkit-tests --test fsck_speed -- --ignored --nocapture

use btrkit_tests::fsck_support::*;
use std::path::Path;
use std::process::Command;

/// Drop the image from the page cache: btrfs-progs does so itself when it
/// opens a device, so both tools are measured cold.
fn drop_cache(img: &str) {
    let _ = Command::new("python3")
        .arg("-c")
        .arg(format!("import os;f=os.open('{img}',os.O_RDONLY);os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)"))
        .status();
}

/// Best wall time (s) and peak RSS (KiB) of five cold runs under /usr/bin/time -v.
fn measure(cmd: &[&str], img: &str) -> (f64, u64) {
    let mut best = (f64::MAX, u64::MAX);
    for _ in 0..5 {
        drop_cache(img);
        let o = Command::new("/usr/bin/time")
            .arg("-v")
            .args(cmd)
            .output()
            .expect("run /usr/bin/time");
        let err = String::from_utf8_lossy(&o.stderr);
        let mut wall = f64::MAX;
        let mut rss = u64::MAX;
        for l in err.lines() {
            let l = l.trim();
            if let Some(v) = l.strip_prefix("Elapsed (wall clock) time (h:mm:ss or m:ss): ") {
                wall = v
                    .split(':')
                    .fold(0.0, |a, x| a * 60.0 + x.parse::<f64>().unwrap_or(0.0));
            }
            if let Some(v) = l.strip_prefix("Maximum resident set size (kbytes): ") {
                rss = v.parse().unwrap_or(u64::MAX);
            }
        }
        best = (best.0.min(wall), best.1.min(rss));
    }
    best
}

/// The `--data` image of tests/scripts/make-bench-image.sh, as BENCHMARKS.md uses.
fn make_image(img: &Path) {
    let script = repo_root().join("tests/scripts/make-bench-image.sh");
    let st = Command::new("bash")
        .arg(script)
        .arg("--data")
        .arg(img)
        .env("MKFS_OPTS", "-R ^free-space-tree")
        .status()
        .expect("make-bench-image.sh");
    assert!(st.success());
}

#[test]
#[ignore]
fn fsck_speed_vs_btrfs_check() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    if !have("python3") || !Path::new("/usr/bin/time").exists() {
        btrkit_tests::skip("python3 or /usr/bin/time missing");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = tmp.path().join("100k.img");
    make_image(&img);
    let bin = fsck_bin();
    let (i, b) = (
        img.to_str().unwrap_or_default(),
        bin.to_str().unwrap_or_default(),
    );
    let theirs = measure(&["btrfs", "check", "--readonly", i], i);
    let ours = measure(&[b, i], i);
    let theirs_c = measure(&["btrfs", "check", "--readonly", "--check-data-csum", i], i);
    let ours_c = measure(&[b, "--check-data-csum", i], i);
    eprintln!(
        "btrfs check --readonly:                    {:.2} s, {} KiB",
        theirs.0, theirs.1
    );
    eprintln!(
        "btrkit-fsck:                               {:.2} s, {} KiB",
        ours.0, ours.1
    );
    eprintln!(
        "btrfs check --readonly --check-data-csum:  {:.2} s, {} KiB",
        theirs_c.0, theirs_c.1
    );
    eprintln!(
        "btrkit-fsck --check-data-csum:             {:.2} s, {} KiB",
        ours_c.0, ours_c.1
    );
    // Figures for BENCHMARKS.md; no timing threshold here (timings vary
    // with the machine's load, and tests must not depend on them).
    eprintln!(
        "speed ratio: {:.2}x, data csum {:.2}x",
        theirs.0 / ours.0,
        theirs_c.0 / ours_c.0
    );
    if let Some(rust) = std::env::var_os("BTRFSUTILS_BTRFS") {
        let r = rust.to_string_lossy().into_owned();
        let utils = measure(&[&r, "check", "--readonly", i], i);
        eprintln!(
            "btrfsutils btrfs check --readonly:         {:.2} s, {} KiB",
            utils.0, utils.1
        );
        eprintln!("speed ratio against btrfsutils: {:.2}x", utils.0 / ours.0);
    }
}
