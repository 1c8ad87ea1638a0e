//! `btrkit-replay -o OUT` makes OUT a reflink copy of the image (FICLONE)
//! where the filesystem under the image supports one, and a sparse copy
//! elsewhere; either way OUT is the replayed image and the input stays as
//! it was.

use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sys::must_run;
use btrkit_tests::{kcrash, sys, LoopMount};
use std::path::Path;
use std::process::Command;

/// (bytes mapped, bytes shared with another file) of `p`, from FIEMAP.
fn shared_bytes(p: &Path) -> (u64, u64) {
    let f = std::fs::File::open(p).unwrap();
    let extents = sys::fiemap(&f).unwrap_or_else(|e| panic!("fiemap {}: {e}", p.display()));
    let mapped = extents.iter().map(|e| e.1).sum();
    let shared = extents
        .iter()
        .filter(|e| e.2 & sys::FIEMAP_EXTENT_SHARED != 0)
        .map(|e| e.1)
        .sum();
    (mapped, shared)
}

fn replay_o(img: &Path, out: &Path) -> serde_json::Value {
    let o = must_run(
        Command::new(kcrash::replay_bin())
            .arg("--json")
            .arg(img)
            .arg("-o")
            .arg(out),
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn output_is_a_reflink_where_the_filesystem_allows_one() {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let scn = kcrash::load_scenario(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/many-files-fsync-each.scn"),
    )
    .unwrap();
    let crash = kcrash::cached_crash_image(&scn, &kcrash::default_cache_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::Builder::new()
        .prefix("replay-copy-")
        .tempdir()
        .unwrap();
    let w = work.path();
    let kernel = kcrash::manifest_of_image(&crash.path, w).unwrap();

    // A btrfs filesystem to hold the image: it can share extents.
    let host = w.join("host.img");
    std::fs::File::create(&host)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let o = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(&host)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _slot = kcrash::slot();
    let m = LoopMount::mount(&host, &w.join("host"), "").unwrap_or_else(|e| panic!("{e}"));
    let img = m.path().join("crash.img");
    kcrash::copy_sparse(&crash.path, &img).unwrap();
    let before = kcrash::image_digest(&img).unwrap();
    let out = m.path().join("out.img");
    let v = replay_o(&img, &out);
    assert_eq!(
        v["copy"], "reflink",
        "on btrfs the output is a reflink copy: {v}"
    );
    let (mapped, shared) = shared_bytes(&out);
    eprintln!("OUT: {mapped} bytes mapped, {shared} shared with the image");
    // Replay rewrites a few blocks (copied on write); the rest stays shared.
    assert!(
        shared * 2 > mapped,
        "only {shared} of {mapped} bytes of OUT are shared with the image"
    );
    assert_eq!(
        kcrash::image_digest(&img).unwrap(),
        before,
        "the input image changed"
    );
    oracle::check_clean(&[&out], Progs::Distro).unwrap_or_else(|e| panic!("{e}"));
    let mine = kcrash::manifest_via_copy(&out, &w.join("mine.img"), "ro").unwrap();
    assert!(
        kernel == mine,
        "reflinked output differs from the kernel's replay:\n{}",
        kernel.short_diff(&mine, 10)
    );
    drop(m);

    // On the scratch directory's filesystem: whatever it supports, the
    // output is right.
    let out2 = w.join("out2.img");
    let v = replay_o(&crash.path, &out2);
    eprintln!("scratch filesystem: {} copy", v["copy"]);
    assert!(v["copy"] == "reflink" || v["copy"] == "sparse", "{v}");
    oracle::check_clean(&[&out2], Progs::Distro).unwrap_or_else(|e| panic!("{e}"));
    let mine = kcrash::manifest_via_copy(&out2, &w.join("mine2.img"), "ro").unwrap();
    assert!(
        kernel == mine,
        "copied output differs from the kernel's replay:\n{}",
        kernel.short_diff(&mine, 10)
    );
}
