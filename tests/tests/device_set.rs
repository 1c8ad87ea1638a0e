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
