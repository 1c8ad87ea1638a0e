//! Bad input: a missing file or a directory is exit 8 with one clear line;
//! files that are not btrfs, truncated images and garbage get an exit code
//! and never a panic, a hang or a write.

use btrkit_tests::fsck_support::*;
use std::time::Duration;

fn one_line(s: &str) -> bool {
    s.trim_end().lines().count() == 1
}

#[test]
fn fsck_missing_file_and_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = run_fsck(&tmp.path().join("nope.img"), &[], Duration::from_secs(30));
    assert_eq!(r.code, 8, "missing file: {}", r.stderr);
    assert!(
        one_line(&r.stderr) && r.stderr.contains("nope.img"),
        "stderr: {:?}",
        r.stderr
    );
    let r = run_fsck(tmp.path(), &[], Duration::from_secs(30));
    assert_eq!(r.code, 8, "directory: {}", r.stderr);
    assert!(
        one_line(&r.stderr) && r.stderr.contains("directory"),
        "stderr: {:?}",
        r.stderr
    );
}

#[test]
fn fsck_not_btrfs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("empty.img");
    std::fs::write(&empty, b"").expect("write");
    let garbage = tmp.path().join("garbage.img");
    let mut g = vec![0u8; 1 << 20];
    btrkit_core::util::prng::Prng::new(12345).fill(&mut g);
    std::fs::write(&garbage, &g).expect("write");
    for p in [&empty, &garbage] {
        let r = run_fsck(p, &[], Duration::from_secs(30));
        assert_eq!(r.code, 8, "{}: {}", p.display(), r.stderr);
        assert!(one_line(&r.stderr), "{:?}", r.stderr);
    }
}

#[test]
fn fsck_truncated_and_wiped_images() {
    let Some(()) = (if have("mkfs.btrfs") { Some(()) } else { None }) else {
        btrkit_tests::skip("mkfs.btrfs not installed");
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = tmp.path().join("base.img");
    sh(&format!(
        "truncate -s 256M '{0}' && mkfs.btrfs -q -f '{0}'",
        img.display()
    ));
    let r = run_fsck(&img, &[], Duration::from_secs(60));
    assert!(matches!(r.code, 0 | 4), "fresh mkfs image: {}", r.stderr);
    // Cut at several points, wipe the primary superblock, wipe the chunk tree area.
    for (name, cmd) in [
        ("cut-1m", "truncate -s 1M"),
        ("cut-20m", "truncate -s 20M"),
        ("cut-40m", "truncate -s 40M"),
        (
            "no-primary-sb",
            "dd if=/dev/zero bs=4096 seek=16 count=1 conv=notrunc status=none of=",
        ),
        (
            "wiped-metadata",
            "dd if=/dev/zero bs=1M seek=21 count=16 conv=notrunc status=none of=",
        ),
    ] {
        let p = tmp.path().join(format!("{name}.img"));
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            img.display(),
            p.display()
        ));
        if cmd.ends_with("of=") {
            sh(&format!("{cmd}'{}'", p.display()));
        } else {
            sh(&format!("{cmd} '{}'", p.display()));
        }
        let stamp = file_stamp(&p);
        let r = run_fsck(&p, &["--check-data-csum"], Duration::from_secs(60));
        eprintln!("{name}: exit {} {:?}", r.code, r.errors().first());
        assert!(
            matches!(r.code, 4 | 8),
            "{name}: exit {} {}",
            r.code,
            r.stderr
        );
        assert!(!r.stderr.contains("panicked"), "{name}: {}", r.stderr);
        assert_eq!(stamp, file_stamp(&p), "{name}: image modified");
    }
}
