//! Device sets made by mkfs.btrfs: every device of a RAID1C3 filesystem
//! given in any order forms one set; a device missing is counted; a
//! device of another filesystem is refused with both named.

use btrkit_core::devices::DeviceSet;
use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_tests::kimage::run_ok;
use btrkit_tests::{require_btrfs_progs, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn mkfs(images: &[&Path], extra: &[&str]) {
    for img in images {
        std::fs::File::create(img)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
    }
    run_ok(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .args(extra)
            .args(images),
    );
}

fn open(paths: &[&PathBuf]) -> btrkit_core::Result<DeviceSet> {
    DeviceSet::assemble(
        paths
            .iter()
            .map(|p| {
                let d: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(p, false).unwrap());
                (p.display().to_string(), d)
            })
            .collect(),
    )
}

#[test]
fn raid1c3_set_from_mkfs() {
    skip_unless!(require_btrfs_progs());
    let t = tempfile::tempdir().unwrap();
    let [a, b, c, x] = ["a.img", "b.img", "c.img", "x.img"].map(|n| t.path().join(n));
    mkfs(&[&a, &b, &c], &["-d", "raid1c3", "-m", "raid1c3"]);
    mkfs(&[&x], &[]);
    let s = open(&[&c, &a, &b]).unwrap();
    assert_eq!(s.num_devices, 3);
    assert_eq!(s.missing_count(), 0);
    let ids: Vec<u64> = s.members().map(|m| m.devid()).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(s.get(1).unwrap().name, a.display().to_string());
    let s = open(&[&b]).unwrap();
    assert_eq!(s.missing_count(), 2);
    assert_eq!(s.missing_of([1, 2, 3]), [1, 3]);
    let e = open(&[&a, &x]).err().unwrap().to_string();
    assert!(
        e.contains("a.img") && e.contains("x.img") && e.contains("not one filesystem"),
        "{e}"
    );
    let e = open(&[&a, &a]).err().unwrap().to_string();
    assert!(e.contains("both device 1"), "{e}");
}

/// Until device sets are supported, btrkit-replay refuses one device of a
/// set before writing anything (it once copied the one device given to
/// `-o` and reported success).
#[test]
fn replay_refuses_one_device_of_a_set() {
    skip_unless!(require_btrfs_progs());
    let t = tempfile::tempdir().unwrap();
    let [a, b] = ["a.img", "b.img"].map(|n| t.path().join(n));
    mkfs(&[&a, &b], &["-d", "raid1", "-m", "raid1"]);
    let before = std::fs::read(&a).unwrap();
    let out = t.path().join("out.img");
    let o = Command::new(btrkit_tests::kcrash::replay_bin())
        .arg("-o")
        .arg(&out)
        .arg(&a)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("2 devices") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!out.exists());
    let o = Command::new(btrkit_tests::kcrash::replay_bin())
        .arg(&a)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&a).unwrap(), before);
}
