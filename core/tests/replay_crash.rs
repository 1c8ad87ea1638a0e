//! A crash during replay: cut the replay's own writes at every point (and
//! keep random subsets of the unflushed ones); the image left behind must
//! either still hold the log, so replay can run again, or be fully
//! replayed; both paths must end with the same trees.

mod skip;

use btrkit_core::format::consts::*;
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::log::replay::{replay, ReplayOptions};
use btrkit_core::trans::Store;
use btrkit_core::tree::TreeIter;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

fn fixture(name: &str) -> Option<Vec<u8>> {
    let shared =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/btrfs-progs-fsck");
    let tar = shared.join(format!("{name}.tar.xz"));
    if !tar.exists() {
        return None;
    }
    let dir = tempfile::tempdir().ok()?;
    let ok = Command::new("tar")
        .arg("-xJf")
        .arg(&tar)
        .arg("-C")
        .arg(dir.path())
        .status()
        .ok()?
        .success();
    if !ok {
        return None;
    }
    std::fs::read(dir.path().join(format!("{name}.raw"))).ok()
}

/// Every item of the fs tree and the extent tree, and whether a log is left.
fn state(dev: Arc<dyn BlockDevice>) -> (bool, Vec<(Key, Vec<u8>)>) {
    let image = Image::open(dev, OpenOptions::default()).expect("image opens after a crash");
    let mut items = Vec::new();
    for id in [
        BTRFS_FS_TREE_OBJECTID,
        BTRFS_EXTENT_TREE_OBJECTID,
        BTRFS_CSUM_TREE_OBJECTID,
    ] {
        let root = image.find_root(id).unwrap().unwrap();
        for it in TreeIter::new(&image, root, Key::MIN).unwrap() {
            let it = it.unwrap();
            items.push((it.key, it.data().unwrap().to_vec()));
        }
    }
    (image.sb.log_root.get() != 0, items)
}

fn replay_all(dev: Arc<CrashDevice>) -> Arc<CrashDevice> {
    let mut fs = Store::open_for_replay(dev.clone()).unwrap();
    replay(&mut fs, ReplayOptions::default()).unwrap();
    drop(fs);
    Arc::new(dev.crash_device(|_| true))
}

#[test]
fn replay_cut_at_every_write_can_restart() {
    // The fixture is 1 GiB sparse; it is held in memory for the test.
    let Some(base) = fixture("065-valid-log-tree--compressed") else {
        skip::skip("../shared fixtures or tar missing");
        return;
    };
    let base = Arc::new(base);
    let done = replay_all(Arc::new(CrashDevice::from_shared(base.clone())));
    let (log_left, want) = state(done);
    assert!(!log_left);
    // How many writes a full replay makes.
    let count = {
        let d = Arc::new(CrashDevice::from_shared(base.clone()));
        let mut fs = Store::open_for_replay(d.clone()).unwrap();
        replay(&mut fs, ReplayOptions::default()).unwrap();
        d.writes()
    };
    assert!(count >= 3);
    let mut seed = 0x9e3779b97f4a7c15u64;
    for cut in 0..count {
        let d = Arc::new(CrashDevice::from_shared(base.clone()));
        let mut fs = Store::open_for_replay(d.clone()).unwrap();
        d.fail_after_writes(Some(cut));
        assert!(
            replay(&mut fs, ReplayOptions::default()).is_err(),
            "cut {cut} of {count} should fail"
        );
        drop(fs);
        for variant in 0..3 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let s = seed;
            let img = Arc::new(match variant {
                0 => d.crash_device(|_| false),
                1 => d.crash_device(|_| true),
                _ => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
            });
            let (log_left, _) = state(img.clone());
            let fin = if log_left { replay_all(img) } else { img };
            let (left, got) = state(fin);
            assert!(
                !left,
                "cut {cut} variant {variant}: log still present after re-replay"
            );
            assert!(
                got == want,
                "cut {cut} variant {variant}: result differs from an uninterrupted replay"
            );
        }
    }
}
