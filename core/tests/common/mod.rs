//! What the engine tests share: images made by core's own mkfs in memory,
//! mounting (with log replay when a log is left), the checker's verdict,
//! and scripts run through the engine's step runner; and the one call of
//! btrfs-progs' `btrfs check --readonly` the tests that use it share
//! (nothing else here needs btrfs-progs, root or loop devices).
#![allow(dead_code)]

use btrkit_core::check::{check_image, CheckOptions, NoProgress, Report};
use btrkit_core::fs::{Filesystem, MountOptions};
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::mkfs::{self, MkfsOptions};
use btrkit_core::workload::engine::{manifest, EngineRunner};
use btrkit_core::workload::{Manifest, Script, Step};
use std::sync::Arc;

pub const MIB: u64 = 1 << 20;

/// Default image size: room for the first chunks mkfs makes and a few
/// more, small enough that many images fit in memory at once (untouched
/// pages of the zeroed buffer are never materialised).
pub const IMAGE_SIZE: u64 = 256 * MIB;

/// mkfs options from mkfs.btrfs-style arguments, with a fixed fsid and
/// time so runs are reproducible.
pub fn mkfs_options(args: &[&str]) -> MkfsOptions {
    let mut o = MkfsOptions::from_mkfs_args(args)
        .unwrap_or_else(|e| panic!("mkfs arguments {args:?}: {e}"));
    o.fsid = Some(*b"btrkit-enginetst");
    o.now = 1_700_000_000;
    o
}

/// Make a filesystem with core's mkfs on `dev`.
pub fn mkfs_on(dev: Arc<dyn BlockDevice>, o: &MkfsOptions) {
    let (fs, staged, _) = mkfs::make(dev, o).unwrap_or_else(|e| panic!("mkfs {o:?}: {e}"));
    mkfs::finish(fs, &staged).unwrap_or_else(|e| panic!("mkfs finish: {e}"));
}

/// A fresh image of `size` bytes in memory, made by core's mkfs, on a
/// crash-capable device with everything flushed.
pub fn new_image(size: u64, args: &[&str]) -> Arc<CrashDevice> {
    let dev = Arc::new(CrashDevice::new(vec![0u8; size as usize]));
    mkfs_on(dev.clone(), &mkfs_options(args));
    dev
}

/// The device as it stands after every write so far reached the disk (a
/// fresh base to start runs from without running mkfs again).
pub fn settled(dev: &CrashDevice) -> Arc<CrashDevice> {
    Arc::new(dev.crash_device(|_| true))
}

pub fn mount_options(opts: &[&str]) -> MountOptions {
    MountOptions::parse(opts).unwrap_or_else(|e| panic!("mount options {opts:?}: {e}"))
}

/// Mount as the kernel does: a log left in the superblock is replayed
/// first.
pub fn mount(dev: Arc<dyn BlockDevice>, opts: &[&str]) -> btrkit_core::Result<Filesystem> {
    btrkit_core::log::replay::mount(dev, mount_options(opts))
}

/// The checker's report on the image as the device holds it now, data
/// checksums verified too.
pub fn check(dev: Arc<dyn BlockDevice>) -> Report {
    let img = Image::open(dev, OpenOptions::default())
        .unwrap_or_else(|e| panic!("image does not open for the checker: {e}"));
    check_image(
        &img,
        CheckOptions {
            check_data_csum: true,
            check_mirrors: true,
            ..Default::default()
        },
        &NoProgress,
    )
}

/// The first errors of a report, one a line.
pub fn errors_of(r: &Report) -> String {
    let v: Vec<String> = r
        .findings
        .iter()
        .filter(|f| {
            f.severity == btrkit_core::check::Severity::Error || f.category == "mirror-copy"
        })
        .take(12)
        .map(|f| format!("phase {} {}: {}", f.phase, f.category, f.message))
        .collect();
    format!("{} error(s):\n  {}", r.errors, v.join("\n  "))
}

/// Ok when the checker finds the image clean; the errors otherwise.
pub fn check_clean(dev: Arc<dyn BlockDevice>) -> Result<Report, String> {
    let r = check(dev);
    // A damaged DUP copy is only a warning to a user; in what we wrote it
    // is a bug.
    if r.is_clean() && !r.findings.iter().any(|f| f.category == "mirror-copy") {
        Ok(r)
    } else {
        Err(errors_of(&r))
    }
}

#[track_caller]
pub fn assert_clean(dev: Arc<dyn BlockDevice>, what: &str) -> Report {
    check_clean(dev).unwrap_or_else(|e| panic!("{what}: checker: {e}"))
}

/// Steps of a script text (no directives or expectations).
pub fn steps(text: &str) -> Vec<Step> {
    Script::parse("test", text)
        .unwrap_or_else(|e| panic!("script: {e}\n{text}"))
        .steps
        .into_iter()
        .map(|(_, s)| s)
        .collect()
}

/// Run script text on a mounted filesystem; `remount` is a real unmount
/// and mount from the device. Panics naming the step that failed.
pub fn run(fs: &mut Filesystem, dev: &Arc<dyn BlockDevice>, opts: &[&str], text: &str) {
    let mut r = EngineRunner::new();
    for st in steps(text) {
        apply(fs, &mut r, dev, opts, &st).unwrap_or_else(|e| panic!("step {st:?}: {e}"));
    }
    r.close_all(fs).unwrap();
}

/// One step through the runner; `Remount` unmounts (closing everything and
/// committing) and mounts again from the device.
pub fn apply(
    fs: &mut Filesystem,
    r: &mut EngineRunner,
    dev: &Arc<dyn BlockDevice>,
    opts: &[&str],
    st: &Step,
) -> btrkit_core::Result<()> {
    match st {
        Step::Remount => {
            r.close_all(fs)?;
            fs.close_all()?;
            fs.sync()?;
            *fs = mount(dev.clone(), opts)?;
            Ok(())
        }
        _ => r.apply(fs, st).map(drop),
    }
}

/// What a user sees, through the engine.
pub fn seen(fs: &mut Filesystem) -> Manifest {
    manifest(fs).unwrap_or_else(|e| panic!("manifest: {e}"))
}

/// What a fresh mount of the device shows (the durable state).
pub fn seen_on_disk(dev: Arc<dyn BlockDevice>) -> Manifest {
    let mut fs = mount(dev, &[]).unwrap_or_else(|e| panic!("mount for the manifest: {e}"));
    seen(&mut fs)
}

/// A number from the environment, or the default.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// btrfs-progs' `btrfs` (on PATH) runs; the tests calling
/// [`btrfs_check`] skip without it (see `skip.rs`).
pub fn have_btrfs_progs() -> bool {
    std::process::Command::new("btrfs")
        .arg("--version")
        .output()
        .is_ok()
}

/// `btrfs check --readonly` of the image file `img`: whether it exited 0,
/// and its stdout then stderr.
pub fn btrfs_check(img: &std::path::Path) -> (bool, String) {
    let o = std::process::Command::new("btrfs")
        .args(["check", "--readonly"])
        .arg(img)
        .output()
        .unwrap_or_else(|e| panic!("btrfs check: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

/// Panics with its report unless `btrfs check --readonly` of `img` exits 0
/// and says "no error found".
#[track_caller]
pub fn assert_btrfs_check_clean(img: &std::path::Path) {
    let (ok, text) = btrfs_check(img);
    assert!(ok && text.contains("no error found"), "{text}");
}
