//! The test harness itself: cleanup on panic, crash copies, binary lookup,
//! the shared fixture directory.

use btrkit_tests::mount::{is_mount_point, loop_backing_file, loop_devices_of};
use btrkit_tests::rich::{fsync, write_file};
use btrkit_tests::sys::must_run;
use btrkit_tests::{
    bin_path, require_kernel_mount, require_shared, skip_unless, KernelImage, LoopMount, MkfsOpts,
};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh btrfs over `images` (one file each, made sparse here), with
/// `extra` mkfs arguments.
fn mkfs_files(images: &[&Path], size: u64, extra: &[&str]) {
    for img in images {
        std::fs::File::create(img).unwrap().set_len(size).unwrap();
    }
    must_run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .args(extra)
            .args(images),
    );
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
    assert!(is_mount_point(&mnt));
    assert_eq!(loop_backing_file(&dev).as_deref(), Some(image.as_path()));
    let r = std::panic::catch_unwind(move || {
        let _k = k;
        panic!("deliberate");
    });
    assert!(r.is_err());
    assert!(!is_mount_point(&mnt), "{} still mounted", mnt.display());
    assert_ne!(
        loop_backing_file(&dev).as_deref(),
        Some(image.as_path()),
        "{} still bound",
        dev.display()
    );
    assert!(!image.exists(), "temporary directory left behind");
}

/// A guard on a temporary mount point: options reach the kernel, remount
/// changes them, an explicit unmount detaches and removes the mount point,
/// and a panic does the same.
#[test]
fn loop_mount_remount_unmount_and_panic() {
    skip_unless!(require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("one.img");
    mkfs_files(&[&img], 256 << 20, &[]);

    let mut m = LoopMount::new(&img, "commit=600,noatime").unwrap();
    let (mnt, dev) = (m.path().to_path_buf(), m.device().to_path_buf());
    assert!(m.is_mounted() && is_mount_point(&mnt));
    assert!(!m.is_read_only());
    assert_eq!(loop_backing_file(&dev).as_deref(), Some(img.as_path()));
    assert_eq!(loop_devices_of(&img), vec![dev.clone()]);
    std::fs::write(mnt.join("f"), b"data").unwrap();
    m.remount("ro").unwrap();
    assert!(m.is_read_only());
    assert!(std::fs::write(mnt.join("g"), b"x").is_err(), "read-only");
    m.remount("rw").unwrap();
    assert!(!m.is_read_only());
    m.unmount().unwrap();
    assert!(!is_mount_point(&mnt));
    assert!(
        loop_devices_of(&img).is_empty(),
        "loop device left attached"
    );
    assert!(!mnt.exists(), "temporary mount point left behind");

    // A read-only mount sees what the first one wrote; a panic with it
    // mounted leaves nothing behind.
    let r = std::thread::spawn({
        let img = img.clone();
        move || {
            let m = LoopMount::new(&img, "ro").unwrap();
            assert!(m.is_read_only());
            assert_eq!(std::fs::read(m.path().join("f")).unwrap(), b"data");
            let mnt = m.path().to_path_buf();
            std::panic::panic_any(mnt);
        }
    })
    .join();
    let mnt = *r
        .expect_err("meant to panic")
        .downcast::<PathBuf>()
        .unwrap();
    assert!(!is_mount_point(&mnt), "{} still mounted", mnt.display());
    assert!(!mnt.exists(), "temporary mount point left behind");
    assert!(
        loop_devices_of(&img).is_empty(),
        "loop device left attached"
    );

    // A refused mount fails with the reason and leaves nothing attached.
    let junk = t.path().join("junk.img");
    std::fs::File::create(&junk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let at = t.path().join("junk-mnt");
    let e = LoopMount::mount(&junk, &at, "").unwrap_err();
    assert!(e.contains("mount"), "{e}");
    assert!(
        loop_devices_of(&junk).is_empty(),
        "loop device left attached"
    );
    assert!(
        !at.exists(),
        "mount point made for a failed mount left behind"
    );
}

/// Two image files as one raid1 filesystem: the second is given as
/// `device=FILE`, attached by the guard and detached again with the first.
#[test]
fn loop_mount_multi_device() {
    skip_unless!(require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a.img"), t.path().join("b.img"));
    mkfs_files(&[&a, &b], 256 << 20, &["-d", "raid1", "-m", "raid1"]);
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = LoopMount::mount(&a, &mnt, &format!("device={},commit=600", b.display())).unwrap();
    assert_eq!(m.devices().len(), 2);
    let devs = m.devices().to_vec();
    assert_eq!(loop_backing_file(&devs[0]).as_deref(), Some(a.as_path()));
    assert_eq!(loop_backing_file(&devs[1]).as_deref(), Some(b.as_path()));
    assert!(
        m.options()
            .starts_with(&format!("device={},", devs[1].display())),
        "{}",
        m.options()
    );
    std::fs::write(m.path().join("f"), vec![5u8; 100_000]).unwrap();
    let o = Command::new("btrfs")
        .args(["filesystem", "show"])
        .arg(m.path())
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&o.stdout);
    assert!(show.contains("Total devices 2"), "{show}");
    m.unmount().unwrap();
    assert!(!is_mount_point(&mnt));
    assert!(mnt.is_dir(), "a mount point the guard did not make stays");
    // A detach completes when the last opener (udev's probe, under load)
    // lets go of the device.
    let gone = (0..50).any(|_| {
        let g = loop_devices_of(&a).is_empty() && loop_devices_of(&b).is_empty();
        if !g {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        g
    });
    assert!(gone, "loop devices still attached after unmount");
    // Either device alone, with the other named, mounts again.
    let m = LoopMount::new(&b, &format!("device={},ro", a.display())).unwrap();
    assert_eq!(
        std::fs::read(m.path().join("f")).unwrap(),
        vec![5u8; 100_000]
    );
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
