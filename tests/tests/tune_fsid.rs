//! `btrkit-tune -u` / `-U`: a new fsid in every tree block, device item
//! and superblock, against btrfstune 6.14 on the same image, on sets, cut
//! at every write, and refused where it must be.

use btrkit_core::check::{CheckOptions, NoProgress};
use btrkit_core::devices::{Devices, Single};
use btrkit_core::format::consts::*;
use btrkit_core::image::{first_valid_superblock, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::tune::{tune_devices, NewUuid, Request};
use btrkit_core::util::prng::Prng;
use btrkit_core::util::uuid::{parse_uuid, uuid_str};
use btrkit_tests::bins::bin_path;
use btrkit_tests::kcrash;
use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sets::{self, KernelSet};
use btrkit_tests::{env, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// `btrkit-tune ARGS`: (exit code, stdout, stderr).
fn tune(args: &[&str], devs: &[PathBuf]) -> (i32, String, String) {
    let o = Command::new(bin_path("btrkit-tune"))
        .args(args)
        .args(devs)
        .output()
        .expect("run btrkit-tune");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn fsid_of(p: &Path) -> [u8; 16] {
    let d = btrkit_core::io::FileDevice::open(p, false).unwrap();
    first_valid_superblock(&d).unwrap().fsid
}

/// A kernel-made filesystem with a subvolume, a snapshot of it, files,
/// a hard link, a symlink and an xattr.
fn kernel_image(n: usize, args: &[&str]) -> KernelSet {
    let set = KernelSet::new(n, args);
    let m = LoopMount::new(
        &set.paths[0],
        &format!("space_cache=v2{}", sets::device_opts(&set.paths)),
    )
    .unwrap();
    let sv = m.path().join("sv");
    btrkit_tests::sys::must_run(Command::new("btrfs").args(["subvolume", "create"]).arg(&sv));
    std::fs::write(sv.join("in-sv"), vec![7u8; 100_000]).unwrap();
    btrkit_tests::sys::must_run(
        Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(&sv)
            .arg(m.path().join("snap")),
    );
    drop(m);
    set
}

fn dump_tree(p: &Path, progs: Progs) -> String {
    let o = Command::new(progs.btrfs().unwrap())
        .args(["inspect-internal", "dump-tree"])
        .arg(p)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "dump-tree: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// dump-tree with what a new chunk tree UUID changes masked.
fn masked(s: &str) -> String {
    s.lines()
        .map(|l| match l.find("chunk uuid ") {
            Some(i) => l[..i].to_string(),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn two_clones_get_new_fsids_and_mount_side_by_side() {
    skip_unless!(env::require_kernel_mount());
    let set = kernel_image(1, &[]);
    let want = sets::manifest(&set.paths, "ro").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = sets::copy_set(&set.paths, dir.path(), "a").unwrap();
    let b = sets::copy_set(&set.paths, dir.path(), "b").unwrap();
    let old = fsid_of(&a[0]);
    for c in [&a, &b] {
        // The default for a clone: the subvolume UUIDs renewed too.
        let (code, _, err) = tune(&["-u"], c);
        assert_eq!(code, 0, "btrkit-tune -u: {err}");
        assert_ne!(fsid_of(&c[0]), old);
        oracle::assert_btrfs_check_clean(c, Progs::Distro, "after -u (6.2)");
        oracle::assert_btrfs_check_clean(c, Progs::New, "after -u (6.14)");
        sets::fsck_clean(c).unwrap();
    }
    assert_ne!(fsid_of(&a[0]), fsid_of(&b[0]));
    // Both at once: the kernel refuses a second filesystem with the same
    // fsid.
    let ma = LoopMount::new(&a[0], "ro").unwrap();
    let mb = LoopMount::new(&b[0], "ro").unwrap();
    for m in [&ma, &mb] {
        let got = kcrash::manifest_of_tree(m.path()).unwrap();
        assert_eq!(got, want, "files differ after -u");
    }
}

#[test]
fn same_trees_as_btrfstune_but_for_the_chunk_tree_uuid() {
    skip_unless!(env::require_kernel_mount(), env::require_progs_new());
    let set = kernel_image(1, &[]);
    let dir = tempfile::tempdir().unwrap();
    let ours = sets::copy_set(&set.paths, dir.path(), "ours").unwrap();
    let theirs = sets::copy_set(&set.paths, dir.path(), "theirs").unwrap();
    let u = "0b5e7f1c-3a2d-4c1e-9f00-123456789abc";
    let (code, _, err) = tune(&["-U", u, "--keep-subvol-uuids"], &ours);
    assert_eq!(code, 0, "{err}");
    let tune14 = btrkit_tests::env::progs_new_dir()
        .unwrap()
        .join("btrfstune");
    let o = Command::new(tune14)
        .args(["-f", "-U", u])
        .arg(&theirs[0])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "btrfstune: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(fsid_of(&ours[0]), parse_uuid(u).unwrap());
    assert_eq!(fsid_of(&ours[0]), fsid_of(&theirs[0]));
    let (a, b) = (
        dump_tree(&ours[0], Progs::New),
        dump_tree(&theirs[0], Progs::New),
    );
    assert_eq!(masked(&a), masked(&b), "trees differ from btrfstune's");
    let sup = |p: &Path| -> String {
        let o = Command::new("btrfs")
            .args(["inspect-internal", "dump-super", "-f"])
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.starts_with("superblock: "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(sup(&ours[0]), sup(&theirs[0]), "superblocks differ");
    oracle::assert_btrfs_check_clean(&ours, Progs::New, "ours");
}

#[test]
fn sets_of_every_kind_get_the_new_fsid_on_every_device() {
    skip_unless!(env::require_kernel_mount());
    for args in [
        &["-m", "raid1", "-d", "raid1"][..],
        &["-m", "raid5", "-d", "raid5"][..],
    ] {
        let n = if args[1] == "raid5" { 3 } else { 2 };
        let set = kernel_image(n, args);
        let want = sets::manifest(&set.paths, "ro").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let c = sets::copy_set(&set.paths, dir.path(), "c").unwrap();
        let (code, _, err) = tune(&["-u", "--keep-subvol-uuids"], &c);
        assert_eq!(code, 0, "{args:?}: {err}");
        let f = fsid_of(&c[0]);
        for d in &c {
            assert_eq!(fsid_of(d), f, "{args:?}: {} kept another fsid", d.display());
        }
        oracle::check_set_clean(&c).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        sets::fsck_clean(&c).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(sets::manifest(&c, "ro").unwrap(), want, "{args:?}");
    }
}

fn as_list(v: &[Arc<dyn BlockDevice>]) -> Vec<(String, Arc<dyn BlockDevice>)> {
    v.iter()
        .enumerate()
        .map(|(i, d)| (format!("dev{i}"), d.clone()))
        .collect()
}

fn opens(devs: &[Arc<dyn BlockDevice>]) -> bool {
    Devices::new(as_list(devs))
        .open(OpenOptions::default(), Single::AsSet)
        .is_ok()
}

fn clean(devs: &[Arc<dyn BlockDevice>]) -> bool {
    let opts = OpenOptions {
        lenient: true,
        ..OpenOptions::default()
    };
    Devices::new(as_list(devs))
        .open(opts, Single::AsSet)
        .is_ok_and(|o| {
            btrkit_core::check::check_image(&o.img, CheckOptions::own_writes(), &NoProgress)
                .is_clean()
        })
}

fn fsid_dev(d: &Arc<dyn BlockDevice>) -> [u8; 16] {
    first_valid_superblock(d.as_ref()).unwrap().fsid
}

#[test]
fn cut_at_every_write_old_state_or_a_rerun_finishes() {
    skip_unless!(env::require_kernel_mount());
    for n in [1usize, 2] {
        let set = if n == 1 {
            kernel_image(1, &["-m", "dup", "-d", "single"])
        } else {
            kernel_image(2, &["-m", "raid1", "-d", "raid1"])
        };
        let bases: Vec<Arc<Vec<u8>>> = set
            .paths
            .iter()
            .map(|p| Arc::new(std::fs::read(p).unwrap()))
            .collect();
        let fresh = || -> Vec<Arc<CrashDevice>> {
            bases
                .iter()
                .map(|b| Arc::new(CrashDevice::from_shared(b.clone())))
                .collect()
        };
        let new = parse_uuid("7d3c2b1a-0000-4000-8000-00000000beef").unwrap();
        let req = Request {
            fsid: Some(NewUuid::Given(new)),
            keep_subvol_uuids: true,
            ..Request::default()
        };
        let old = {
            let d: Arc<dyn BlockDevice> = fresh().remove(0);
            fsid_dev(&d)
        };
        // Writes of a whole run, per device.
        let per_dev: Vec<u64> = {
            let ds = fresh();
            let dyns: Vec<Arc<dyn BlockDevice>> = ds.iter().map(|d| d.clone() as _).collect();
            tune_devices(as_list(&dyns), &req, &NoProgress).expect("-U");
            assert!(clean(&dyns), "not clean after -U");
            ds.iter().map(|d| d.writes()).collect()
        };
        let count: u64 = per_dev.iter().sum();
        assert!(count > 8, "-U of {count} writes");
        let mut g = Prng::new(0x5eed_f51d);
        // (device, writes it completes): the run stops at that device's
        // failed write, as a crash stops every device (the writes are
        // issued one at a time).
        let mut cuts: Vec<(usize, u64)> = Vec::new();
        for (k, &w) in per_dev.iter().enumerate() {
            if w <= 60 {
                cuts.extend((0..w).map(|c| (k, c)));
            } else {
                cuts.extend((0..60).map(|_| (k, g.below(w))));
                cuts.extend([(k, 0), (k, 1), (k, w - 1)]);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut outcomes = [0u32; 3];
        for &(k, cut) in &cuts {
            let ds = fresh();
            ds[k].fail_after_writes(Some(cut));
            let dyns: Vec<Arc<dyn BlockDevice>> = ds.iter().map(|d| d.clone() as _).collect();
            let _ = tune_devices(as_list(&dyns), &req, &NoProgress);
            for variant in 0..4 {
                let s = g.next_u64();
                let crashed: Vec<Arc<dyn BlockDevice>> = ds
                    .iter()
                    .map(|d| -> Arc<dyn BlockDevice> {
                        Arc::new(match variant {
                            0 => d.crash_device(|_| false),
                            1 => d.crash_device(|_| true),
                            2 => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
                            _ => d.crash_device_torn(|i, j| (s >> ((i * 7 + j) % 64)) & 1 == 1),
                        })
                    })
                    .collect();
                let opens = opens(&crashed);
                let fsids: Vec<[u8; 16]> = crashed.iter().map(fsid_dev).collect();
                let flagged = crashed.iter().any(|d| {
                    first_valid_superblock(d.as_ref()).unwrap().flags.get()
                        & BTRFS_SUPER_FLAG_CHANGING_FSID
                        != 0
                });
                if opens && !flagged && fsids.iter().all(|f| *f == old) {
                    assert!(
                        clean(&crashed),
                        "n={n} cut {k}:{cut} variant {variant}: old state not clean"
                    );
                    outcomes[0] += 1;
                    continue;
                }
                if opens && !flagged && fsids.iter().all(|f| *f == new) {
                    assert!(
                        clean(&crashed),
                        "n={n} cut {k}:{cut} variant {variant}: new state not clean"
                    );
                    outcomes[1] += 1;
                    continue;
                }
                tune_devices(as_list(&crashed), &req, &NoProgress).unwrap_or_else(|e| {
                    panic!("n={n} cut {k}:{cut} variant {variant}: rerun: {e}")
                });
                assert!(
                    clean(&crashed),
                    "n={n} cut {k}:{cut} variant {variant}: rerun not clean"
                );
                for d in &crashed {
                    assert_eq!(fsid_dev(d), new, "n={n} cut {k}:{cut} variant {variant}");
                }
                outcomes[2] += 1;
            }
        }
        eprintln!(
            "{n} device(s): {count} writes, {} cuts: old {} new {} finished by a rerun {}",
            cuts.len(),
            outcomes[0],
            outcomes[1],
            outcomes[2]
        );
        assert!(outcomes[2] > 0, "no cut left the change half done");
    }
}

#[test]
fn refused_when_mounted_with_metadata_uuid_or_a_device_missing() {
    skip_unless!(env::require_kernel_mount());
    let set = kernel_image(2, &["-m", "raid1", "-d", "raid1"]);
    let before: Vec<Vec<u8>> = set
        .paths
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let unchanged = |why: &str| {
        for (p, b) in set.paths.iter().zip(&before) {
            assert!(
                std::fs::read(p).unwrap() == *b,
                "{why}: {} written",
                p.display()
            );
        }
    };
    // A device missing.
    let (code, _, err) = tune(&["-u"], &set.paths[..1]);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("give them all"), "{err}");
    unchanged("a device missing");
    // Mounted.
    {
        let _m = LoopMount::new(
            &set.paths[0],
            &format!("ro{}", sets::device_opts(&set.paths)),
        )
        .unwrap();
        let (code, _, err) = tune(&["-u"], &set.paths);
        assert_ne!(code, 0);
        assert!(err.contains("in use"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    unchanged("mounted");
    // A pending log, faked by pointing the log root somewhere: refused
    // before anything is read beyond the superblock.
    let dir = tempfile::tempdir().unwrap();
    let c = sets::copy_set(&set.paths, dir.path(), "c").unwrap();
    let tune14 = btrkit_tests::env::progs_new_dir().map(|d| d.join("btrfstune"));
    if let Some(t) = tune14.filter(|t| t.exists()) {
        // btrfstune -m sets the metadata UUID; -u must then be refused.
        let o = Command::new(t).args(["-m"]).args(&c[..1]).output().unwrap();
        if o.status.success() {
            let before: Vec<Vec<u8>> = c.iter().map(|p| std::fs::read(p).unwrap()).collect();
            let (code, _, err) = tune(&["-u"], &c);
            assert_ne!(code, 0);
            assert!(err.contains("metadata UUID"), "{err}");
            for (p, b) in c.iter().zip(&before) {
                assert!(
                    std::fs::read(p).unwrap() == *b,
                    "-u with metadata UUID wrote"
                );
            }
        }
    }
    let _ = uuid_str;
}
