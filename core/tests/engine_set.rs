//! The engine on a filesystem of several devices, in memory: core's mkfs
//! makes the set, files are written through the engine, every copy is
//! checked; a write that fails on one device fails the operation naming
//! that device and leaves the last commit intact on every device; crashes
//! where each device keeps a different share of its unflushed writes
//! recover every fsynced file. Nothing here needs root or the kernel
//! (tests/tests/engine_set.rs compares with the kernel).

mod common;

use btrkit_core::devices::DeviceSet;
use btrkit_core::fs::Filesystem;
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::workload::engine::{manifest, EngineRunner};
use common::*;
use std::sync::Arc;

fn named(devs: &[Arc<CrashDevice>]) -> Vec<(String, Arc<dyn BlockDevice>)> {
    devs.iter()
        .enumerate()
        .map(|(i, d)| (format!("dev{}", i + 1), d.clone() as Arc<dyn BlockDevice>))
        .collect()
}

/// A new set of `n` devices of `size` bytes made by core's mkfs with `args`.
fn new_set(n: usize, size: u64, args: &[&str]) -> Vec<Arc<CrashDevice>> {
    let devs: Vec<Arc<CrashDevice>> = (0..n)
        .map(|_| Arc::new(CrashDevice::new(vec![0u8; size as usize])))
        .collect();
    let (fs, staged, _) = btrkit_core::mkfs::make_set(named(&devs), &mkfs_options(args)).unwrap();
    btrkit_core::mkfs::finish(fs, &staged).unwrap();
    devs
}

fn mount_set(devs: &[Arc<CrashDevice>]) -> btrkit_core::Result<Filesystem> {
    btrkit_core::log::replay::mount_devices(named(devs), mount_options(&["commit=600"]), false)
}

/// The checker over the whole set: every copy of every block and of data.
fn set_clean(devs: &[Arc<CrashDevice>], what: &str) {
    let img = DeviceSet::assemble(named(devs))
        .and_then(|s| s.open(Default::default()))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let r = btrkit_core::check::check_image(
        &img,
        btrkit_core::check::CheckOptions {
            check_data_csum: true,
            check_mirrors: true,
            ..Default::default()
        },
        &btrkit_core::check::NoProgress,
    );
    assert!(
        r.is_clean() && !r.findings.iter().any(|f| f.category == "mirror-copy"),
        "{what}: {}",
        errors_of(&r)
    );
}

fn run_steps(fs: &mut Filesystem, text: &str) -> btrkit_core::Result<()> {
    let mut r = EngineRunner::new();
    for st in steps(text) {
        r.apply(fs, &st)?;
    }
    r.close_all(fs)
}

const WORK: &str = "mkdir /d\nwrite /d/a 0 3M 0x11\nwrite /d/b 0 700K random:3\n\
    write /d/c 0 100 0x22\nfsync /d/a\nsetxattr /d/b user.x v\nwrite /d/a 1M 64K 0x33\nsync\n";

#[test]
fn every_profile_writes_every_copy() {
    for (n, args) in [
        (2, &["-m", "raid1", "-d", "raid1"][..]),
        (3, &["-m", "raid1c3", "-d", "raid0"][..]),
        (4, &["-m", "raid10", "-d", "raid10"][..]),
        (4, &["-m", "raid1c4", "-d", "raid1c3"][..]),
        (2, &["-m", "dup", "-d", "single"][..]),
    ] {
        let devs = new_set(n, IMAGE_SIZE, args);
        set_clean(&devs, &format!("{args:?} after mkfs"));
        let mut fs = mount_set(&devs).unwrap();
        run_steps(&mut fs, WORK).unwrap();
        let before = manifest(&mut fs).unwrap();
        drop(fs);
        set_clean(&devs, &format!("{args:?} after writes"));
        let mut fs = mount_set(&devs).unwrap();
        assert_eq!(manifest(&mut fs).unwrap(), before, "{args:?}");
    }
}

/// A write failing on device 2 of a RAID1 set: the commit (or the data
/// write) fails naming the device, and after a power failure the set holds
/// a whole commit, the one before or (when only a superblock write after
/// the others failed) the new one, and checks clean.
#[test]
fn a_failed_write_on_one_device_fails_naming_it() {
    const MORE: &str = "mkdir /d\nwrite /d/a 0 3M 0x11\nwrite /d/b 0 700K random:3\n\
        setxattr /d/b user.x v\nwrite /d/a 1M 64K 0x33\nsync\n";
    let healthy = new_set(2, IMAGE_SIZE, &["-m", "raid1", "-d", "raid1"]);
    let mut fs = mount_set(&healthy).unwrap();
    run_steps(&mut fs, "mkdir /keep\nwrite /keep/f 0 64K 0x44\nsync\n").unwrap();
    let kept = manifest(&mut fs).unwrap();
    drop(fs);
    let base: Vec<Arc<CrashDevice>> = healthy
        .iter()
        .map(|d| Arc::new(d.crash_device(|_| true)))
        .collect();
    let w0 = healthy[1].writes();
    let mut fs = mount_set(&healthy).unwrap();
    run_steps(&mut fs, MORE).unwrap();
    let full = manifest(&mut fs).unwrap();
    drop(fs);
    // Every write device 2 takes in the run, in turn, is the one that fails.
    let writes = healthy[1].writes() - w0;
    assert!(writes >= 4, "only {writes} writes on device 2");
    for fail_at in 0..writes {
        let devs: Vec<Arc<CrashDevice>> = base
            .iter()
            .map(|d| Arc::new(d.crash_device(|_| true)))
            .collect();
        let mut fs = mount_set(&devs).unwrap();
        devs[1].fail_after_writes(Some(fail_at));
        let e = match run_steps(&mut fs, MORE).and_then(|_| fs.sync()) {
            Ok(()) => panic!("fail_at {fail_at}: the failed device went unnoticed"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("dev2"),
            "fail_at {fail_at}: the error names no device: {e}"
        );
        drop(fs);
        devs[1].fail_after_writes(None);
        let after: Vec<Arc<CrashDevice>> = devs
            .iter()
            .map(|d| Arc::new(d.crash_device(|_| false)))
            .collect();
        set_clean(&after, &format!("fail_at {fail_at}"));
        let mut fs = mount_set(&after).unwrap();
        let m = manifest(&mut fs).unwrap();
        assert!(
            m == kept || m == full,
            "fail_at {fail_at}: a half-done commit"
        );
    }
}

/// Power failures where each device keeps a different share of what was
/// not flushed: every file fsynced before the crash is there, whole, and
/// the set checks clean after the log replays.
#[test]
fn crashes_where_devices_keep_different_writes_recover_every_fsync() {
    let base = new_set(3, IMAGE_SIZE, &["-m", "raid1c3", "-d", "raid1"]);
    for seed in 0..6u64 {
        let devs: Vec<Arc<CrashDevice>> = base
            .iter()
            .map(|d| Arc::new(d.crash_device(|_| true)))
            .collect();
        let mut fs = mount_set(&devs).unwrap();
        run_steps(
            &mut fs,
            "mkdir /d\nwrite /d/a 0 200K 0x55\nfsync /d/a\nwrite /d/b 0 1M random:9\n\
             fsync /d/b\nwrite /d/a 200K 50K 0x66\nwrite /d/c 0 4K 0x77\n",
        )
        .unwrap();
        drop(fs);
        let after: Vec<Arc<CrashDevice>> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let s = seed * 7 + i as u64;
                Arc::new(d.crash_device(move |w| (w as u64 * 2654435761 + s).is_multiple_of(3)))
            })
            .collect();
        let mut fs = mount_set(&after).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let m = manifest(&mut fs).unwrap();
        let a = m
            .entries
            .get("/d/a")
            .unwrap_or_else(|| panic!("seed {seed}: /d/a lost"));
        let b = m
            .entries
            .get("/d/b")
            .unwrap_or_else(|| panic!("seed {seed}: /d/b lost"));
        assert!(
            a.size == 200 << 10 || a.size == 250 << 10,
            "seed {seed}: {a:?}"
        );
        assert_eq!(b.size, 1 << 20, "seed {seed}");
        fs.sync().unwrap();
        drop(fs);
        set_clean(&after, &format!("seed {seed}"));
    }
}
