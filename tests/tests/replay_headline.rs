//! The headline: 10,000 files created and fsynced one by one on a kernel
//! mount (commit=600), then a power failure. `btrfs rescue zero-log`, all
//! btrfs-progs can do without the kernel, loses the files that only the log
//! holds; `btrkit-replay -o` must recover all 10,000 with their contents, as
//! the kernel's own replay does, and leave an image `btrfs check` passes.
//!
//! The crash image is cached under `target/<profile>/kcrash-cache` (making it
//! takes 10,000 log syncs); `BTRKIT_KCRASH_FRESH=1` regenerates it.

use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::{kcrash, LoopMount};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn count_on(img: &Path, opts: &str, work: &Path) -> (u32, u32) {
    let copy = work.join("count.img");
    kcrash::copy_sparse(img, &copy).unwrap();
    let m =
        LoopMount::mount(&copy, &work.join("count-mnt"), opts).unwrap_or_else(|e| panic!("{e}"));
    let r = kcrash::count_headline_files(m.path()).unwrap_or_else(|e| panic!("{e}"));
    m.unmount().unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_file(&copy).unwrap();
    r
}

#[test]
fn replay_recovers_10000_fsynced_files() {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let n = kcrash::HEADLINE_FILES;
    let t = Instant::now();
    let crash =
        kcrash::cached_crash_image(&kcrash::headline_scenario(), &kcrash::default_cache_dir())
            .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "crash image {} (log_root {}), {:.1}s",
        crash.path.display(),
        crash.log_root,
        t.elapsed().as_secs_f64()
    );
    assert_ne!(crash.log_root, 0, "the headline crash image has no log");
    let work = tempfile::Builder::new()
        .prefix("replay-headline-")
        .tempdir()
        .unwrap();
    let w = work.path();

    // What btrfs-progs alone recovers: the last commit, the log thrown away.
    let zl = w.join("zero-log.img");
    kcrash::copy_sparse(&crash.path, &zl).unwrap();
    let o = Command::new("btrfs")
        .args(["rescue", "zero-log"])
        .arg(&zl)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "btrfs rescue zero-log: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (zl_present, zl_right) = count_on(&zl, "ro", w);
    std::fs::remove_file(&zl).unwrap();
    eprintln!("btrfs rescue zero-log keeps {zl_present} of {n} files ({zl_right} with the right content): {} fsynced files lost", n - zl_right);

    // The kernel's replay: all of them.
    let (k_present, k_right) = count_on(&crash.path, "rw", w);
    eprintln!("kernel log replay: {k_present} present, {k_right} right");
    assert_eq!(
        (k_present, k_right),
        (n, n),
        "the kernel itself does not recover every file"
    );
    assert!(
        zl_right < n,
        "every file was already committed: the workload did not leave files only in the log"
    );

    // btrkit-replay -o.
    let bin = kcrash::replay_bin();
    let before = kcrash::image_digest(&crash.path).unwrap();
    let out = w.join("out.img");
    let t = Instant::now();
    let o = Command::new(&bin)
        .arg(&crash.path)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        o.status.success(),
        "btrkit-replay -o: exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).trim()
    );
    eprintln!("btrkit-replay -o: {secs:.2}s");
    assert_eq!(
        kcrash::image_digest(&crash.path).unwrap(),
        before,
        "btrkit-replay changed its input"
    );
    assert_eq!(
        kcrash::super_log_root(&out).unwrap().1,
        0,
        "OUT still has a log"
    );
    oracle::check_clean(&[&out], Progs::Distro).unwrap_or_else(|e| panic!("{e}"));
    let (present, right) = count_on(&out, "ro", w);
    eprintln!("btrkit-replay: {present} present, {right} right (zero-log: {zl_right})");
    assert_eq!(
        (present, right),
        (n, n),
        "btrkit-replay does not recover every file"
    );

    // And exactly the kernel's tree.
    let kernel = kcrash::manifest_of_image(&crash.path, w).unwrap();
    let mine = kcrash::manifest_via_copy(&out, &w.join("mine.img"), "ro").unwrap();
    assert!(
        kernel == mine,
        "differs from the kernel (A = kernel, B = btrkit):\n{}",
        kernel.short_diff(&mine, 20)
    );
}
