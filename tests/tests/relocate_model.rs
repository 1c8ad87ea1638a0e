//! A random workload that leaves a hundred snapshots sharing extents
//! (writes, overwrites, reflinks, punches, deletions between them), then
//! the filesystem's whole life after mkfs through btrkit: shrunk to its
//! minimum, grown, devices added (one shrunk and grown by devid),
//! converted single -> raid1 -> raid10 ->
//! raid6 -> raid1c3 and back to single and dup, devices removed and
//! replaced in between. After every step every file of every snapshot is
//! as before (the engine reads them all), the checker finds the devices
//! clean and the subvolume trees keep their size (sharing kept); at the
//! end btrfs check and the kernel agree.

use btrkit_core::check::{check_image, CheckOptions, NoProgress};
use btrkit_core::devices::{Access, Devices, Single};
use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_core::util::prng::Prng;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, env, kcrash, skip_unless};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// The workload: files in a few directories changed at random, a
/// snapshot of everything after each round.
fn workload(seed: u64, rounds: usize) -> String {
    let mut g = Prng::new(seed);
    let mut s = String::from("fssize 1G\nmkdir /w\nmkdir /s\n");
    // (path, size) of the files written and not unlinked.
    let mut files: Vec<(String, u64)> = Vec::new();
    for r in 0..rounds {
        for _ in 0..6 {
            match g.below(10) {
                0..=3 => {
                    let f = format!("/w/f{}", g.below(40));
                    let off = g.below(4) * 16384 + g.below(3) * 1000;
                    let len = 1 + g.below(40_000);
                    writeln!(s, "write {f} {off} {len} random:{}", g.below(1 << 30)).unwrap();
                    match files.iter_mut().find(|(p, _)| *p == f) {
                        Some(e) => e.1 = e.1.max(off + len),
                        None => files.push((f, off + len)),
                    }
                }
                4 | 5 => {
                    // A reflink of a whole 16 KiB from a file that has it.
                    let big: Vec<&(String, u64)> = files
                        .iter()
                        .filter(|(p, n)| *n >= 16384 && p.starts_with("/w/f"))
                        .collect();
                    if big.is_empty() {
                        continue;
                    }
                    let a = big[g.below(big.len() as u64) as usize].0.clone();
                    let b = format!("/w/c{}", g.below(20));
                    let at = g.below(4) * 4096;
                    writeln!(s, "clone {a} 0 {b} {at} 16384").unwrap();
                    match files.iter_mut().find(|(p, _)| *p == b) {
                        Some(e) => e.1 = e.1.max(at + 16384),
                        None => files.push((b, at + 16384)),
                    }
                }
                6 if !files.is_empty() => {
                    let f = &files[g.below(files.len() as u64) as usize].0;
                    writeln!(
                        s,
                        "punch {f} {} {}",
                        g.below(8) * 4096,
                        4096 * (1 + g.below(8))
                    )
                    .unwrap();
                }
                7 if !files.is_empty() => {
                    let i = g.below(files.len() as u64) as usize;
                    let (f, _) = files.swap_remove(i);
                    writeln!(s, "unlink {f}").unwrap();
                }
                _ => {
                    let f = format!("/w/small{}", g.below(30));
                    writeln!(
                        s,
                        "write {f} 0 {} 0x{:02x}",
                        1 + g.below(3000),
                        g.below(256)
                    )
                    .unwrap();
                }
            }
        }
        writeln!(s, "snapshot / /s/r{r:03}").unwrap();
    }
    s.push_str("sync\n");
    s
}

/// Every file of every subvolume, data included, as the engine reads it.
fn engine_view(devs: &[PathBuf]) -> String {
    let blocks: Vec<Arc<dyn BlockDevice>> = devs
        .iter()
        .map(|p| -> Arc<dyn BlockDevice> { Arc::new(FileDevice::open(p, false).unwrap()) })
        .collect();
    let script = btrkit_core::workload::script::Script::parse("view", "").unwrap();
    let mut s = btrkit_core::workload::session::Session::on_devices(blocks, &script).unwrap();
    s.manifest().unwrap().render()
}

fn checker_clean(devs: &[PathBuf], what: &str) {
    let d = Devices::open_paths(devs, Access::default()).unwrap();
    let o = d.open(Default::default(), Single::AsSet).unwrap();
    let r = check_image(&o.img, CheckOptions::own_writes(), &NoProgress);
    assert!(
        r.is_clean(),
        "{what}: {:?}",
        r.findings.iter().take(5).collect::<Vec<_>>()
    );
}

fn btrkit(args: &[&str], devs: &[PathBuf]) {
    must_run(Command::new(bin_path("btrkit")).args(args).args(devs));
}

fn file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

#[test]
fn a_hundred_snapshots_through_shrink_conversions_and_device_changes() {
    let t = tempfile::tempdir().unwrap();
    let d1 = t.path().join("d1.img");
    let script = t.path().join("w.scn");
    std::fs::write(&script, workload(0x5eed_0049, 100)).unwrap();
    must_run(
        Command::new(bin_path("btrkit-shell"))
            .arg("-q")
            .arg(&d1)
            .arg(&script),
    );
    let want = engine_view(std::slice::from_ref(&d1));
    assert!(
        want.matches("/s/r0").count() > 100,
        "the snapshots are there"
    );
    let g = 1u64 << 30;
    let mut devs = vec![d1.clone()];
    let step = |devs: &[PathBuf], what: &str| {
        checker_clean(devs, what);
        assert!(engine_view(devs) == want, "{what}: files differ");
    };

    let min = {
        let o = must_run(
            Command::new(bin_path("btrkit"))
                .args(["inspect-internal", "min-dev-size", "--json"])
                .arg(&d1),
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["min_size"].as_u64().unwrap()
    };
    let min = min.div_ceil(1 << 20) << 20;
    btrkit(
        &["filesystem", "resize", &min.max(256 << 20).to_string()],
        &devs,
    );
    assert!(std::fs::metadata(&d1).unwrap().len() <= min.max(256 << 20));
    step(&devs, "shrunk to the minimum");
    btrkit(&["filesystem", "resize", "1g"], &devs);
    step(&devs, "grown to 1 GiB");

    for (i, name) in ["d2.img", "d3.img", "d4.img"].iter().enumerate() {
        let d = file(t.path(), name, g);
        btrkit(&["device", "add", d.to_str().unwrap()], &devs);
        devs.push(d);
        step(&devs, &format!("device {} added", i + 2));
        if i == 0 {
            btrkit(
                &["balance", "start", "-dconvert=raid1", "-mconvert=raid1"],
                &devs,
            );
            step(&devs, "raid1");
        }
    }
    btrkit(
        &["balance", "start", "-dconvert=raid10", "-mconvert=raid10"],
        &devs,
    );
    step(&devs, "raid10");
    // A device of the set shrunk and grown by devid.
    btrkit(&["filesystem", "resize", "2:-300m"], &devs);
    assert_eq!(std::fs::metadata(&devs[1]).unwrap().len(), g - (300 << 20));
    step(&devs, "device 2 shrunk");
    btrkit(&["filesystem", "resize", "2:+300m"], &devs);
    assert_eq!(std::fs::metadata(&devs[1]).unwrap().len(), g);
    step(&devs, "device 2 grown");
    let d5 = file(t.path(), "d5.img", g);
    btrkit(
        &["device", "replace", "start", "3", d5.to_str().unwrap()],
        &devs,
    );
    devs[2] = d5;
    step(&devs, "device 3 replaced");
    btrkit(
        &["balance", "start", "-dconvert=raid6", "-mconvert=raid1c3"],
        &devs,
    );
    step(&devs, "raid6 data, raid1c3 metadata");
    btrkit(&["device", "remove", "4"], &devs);
    devs.remove(3);
    step(&devs, "device 4 removed");
    btrkit(
        &[
            "balance",
            "start",
            "-dconvert=single",
            "-mconvert=dup",
            "-f",
        ],
        &devs,
    );
    step(&devs, "single and dup");
    btrkit(&["device", "remove", "2"], &devs);
    devs.remove(1);
    btrkit(&["device", "remove", "3"], &devs);
    devs.remove(1);
    step(&devs, "back to one device");

    if env::require_kernel_mount() {
        let v = oracle::btrfs_check(&devs, Progs::Distro).unwrap();
        assert!(v.clean, "btrfs check: {}", v.output);
        let k = kcrash::manifest_in_place(&devs[0], "ro").unwrap();
        assert!(k.entries.len() > 1000, "the kernel sees the snapshots");
    } else {
        skip_unless!(env::require_kernel_mount());
    }
}
