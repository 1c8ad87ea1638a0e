//! The test harness itself: cleanup on panic, crash copies, binary lookup,
//! the shared fixture directory.

use btrkit_tests::rich::{fsync, write_file};
use btrkit_tests::{
    bin_path, require_kernel_mount, require_shared, skip_unless, KernelImage, MkfsOpts,
};
use std::path::{Path, PathBuf};

fn mounted_at(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = p.to_string_lossy().to_string();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

fn backing_file(dev: &Path) -> Option<PathBuf> {
    let name = dev.file_name()?.to_string_lossy().to_string();
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(s.trim()))
}

/// A test that panics with its image mounted leaves no mount, no loop device
/// bound to its image, and no temporary directory.
#[test]
fn drop_cleans_up_after_panic() {
    skip_unless!(require_kernel_mount());
    let k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    let (mnt, image, dev) = (
        k.mnt().to_path_buf(),
        k.image().to_path_buf(),
        k.loop_device().unwrap().to_path_buf(),
    );
    assert!(mounted_at(&mnt));
    assert_eq!(backing_file(&dev).as_deref(), Some(image.as_path()));
    let r = std::panic::catch_unwind(move || {
        let _k = k;
        panic!("deliberate");
    });
    assert!(r.is_err());
    assert!(!mounted_at(&mnt), "{} still mounted", mnt.display());
    assert_ne!(
        backing_file(&dev).as_deref(),
        Some(image.as_path()),
        "{} still bound",
        dev.display()
    );
    assert!(!image.exists(), "temporary directory left behind");
}

/// A copy taken right after a commit has no log; after an fsync it has one.
#[test]
fn crash_copy_captures_log() {
    skip_unless!(require_kernel_mount());
    let k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    write_file(&k.path("a"), b"committed\n");
    k.sync();
    let before = k.crash_copy_unchecked("before.img");
    assert_eq!(before.log_root, 0);
    write_file(&k.path("b"), b"fsynced\n");
    fsync(&k.path("b"));
    let after = k.crash_copy("after.img");
    assert_ne!(after.log_root, 0);
    assert_eq!(
        after.generation, before.generation,
        "no commit between the copies"
    );
    drop(k);
    assert!(after.path.exists(), "a crash copy outlives its live image");
}

#[test]
fn bin_path_finds_dump() {
    let p = bin_path("btrkit-dump");
    let out = std::process::Command::new(&p)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{} --help failed", p.display());
    assert_eq!(bin_path("btrkit-dump"), p, "second lookup is cached");
}

#[test]
fn shared_fixtures_resolve_relative_to_repo() {
    let Some(shared) = require_shared() else {
        return;
    };
    assert!(
        shared.join("DESIGN.md").is_file(),
        "{} has no DESIGN.md",
        shared.display()
    );
}
