//! `btrkit-fsck rescue NAME IMAGE...`: btrfs rescue's commands on images
//! the kernel wrote (mkfs.btrfs, files written through a loop mount) and
//! on btrfs-progs' fsck-test images, each damaged the way its command is
//! for:
//! - chunk-recover: the chunk tree's root block (every copy) and the
//!   sys_chunk_array of every superblock copy zeroed, on a DUP-metadata
//!   image, a RAID1 set given in reverse order, and a RAID0-data set with
//!   every chunk tree block on the devices zeroed (the stripe order has to
//!   come from the blocks and data found); then btrfs check, btrkit-fsck
//!   (every mirror, every data checksum), the kernel's mount and
//!   btrkit-restore must all agree the filesystem is what it was, and a
//!   second run has nothing to do. btrfs rescue chunk-recover 6.14 runs
//!   on the same damage for the record;
//! - chunk-recover cut at every write (the crash device: unflushed writes
//!   kept, lost, torn): the image is as it was or recovered, and a second
//!   run finishes;
//! - chunk-recover on every fsck-test image of btrfs-progs: as it is, the
//!   chunk tree it would build is the one there; with its chunk tree
//!   destroyed the same way, no error the image did not have before;
//! - super-recover (a damaged primary), zero-log (a real kernel log),
//!   fix-device-size (fixture 028), clear-uuid-tree, clear-ino-cache
//!   (fixture 064), fix-data-checksum (DUP data: one copy bad, both bad);
//! - the command line: exit codes, -y, --dry-run, the unchanged check.

use btrkit_core::check::{CheckOptions, NoProgress};
use btrkit_core::format::consts::*;
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::rescue::chunk_recover::{chunk_recover_devices, Options};
use btrkit_core::tree::TreeIter;
use btrkit_core::util::prng::Prng;
use btrkit_tests::fsck_support::fsck_bin;
use btrkit_tests::kcrash::{self, Manifest};
use btrkit_tests::oracle;
use btrkit_tests::sets::{self, KernelSet};
use btrkit_tests::{env, skip_unless};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// `btrkit-fsck ARGS`: (exit code, stdout, stderr).
fn fsck(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let o = Command::new(fsck_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run btrkit-fsck");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `btrkit-fsck rescue CMD FLAGS DEVS... --json`: (exit code, report).
fn rescue(cmd: &str, flags: &[&str], devs: &[PathBuf]) -> (i32, serde_json::Value, String) {
    let mut a: Vec<&std::ffi::OsStr> = vec!["rescue".as_ref(), cmd.as_ref(), "--json".as_ref()];
    a.extend(flags.iter().map(|f| std::ffi::OsStr::new(*f)));
    a.extend(devs.iter().map(|d| d.as_os_str()));
    let (code, out, err) = fsck(&a);
    let v = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    (code, v, err)
}

/// The filesystem on `devs` is clean to btrfs check and to btrkit-fsck
/// (every mirror, every data checksum).
fn all_clean(devs: &[PathBuf], what: &str) {
    if let Err(e) = oracle::check_set_clean(devs) {
        panic!("{what}: {e}");
    }
    if let Err(e) = sets::fsck_clean(devs) {
        panic!("{what}: {e}");
    }
}

/// The kernel's view of the set, mounted read-only.
fn kernel_manifest(devs: &[PathBuf]) -> Manifest {
    sets::manifest(devs, "ro").unwrap_or_else(|e| panic!("kernel mount: {e}"))
}

/// btrkit-restore of `devs` into `work` gives `want`, byte for byte.
fn restore_matches(devs: &[PathBuf], want: &Manifest, work: &Path) {
    let out = work.join("restored");
    let o = Command::new(btrkit_tests::bin_path("btrkit-restore"))
        .args(devs)
        .arg(&out)
        .args(["-m", "--snapshots", "--json"])
        .output()
        .expect("run btrkit-restore");
    assert!(
        o.status.success(),
        "btrkit-restore exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    let mut got =
        sets::without_host_fields(&kcrash::manifest_of_tree(&out).expect("manifest"), true);
    let mut want = sets::without_host_fields(want, true);
    // The host directory may refuse an xattr: the report names the file.
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    for w in report["warnings"].as_array().into_iter().flatten() {
        if let Some((path, _)) = w.as_str().unwrap_or("").split_once(": xattr") {
            for m in [&mut got, &mut want] {
                if let Some(e) = m.entries.get_mut(path) {
                    e.xattrs.clear();
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        got == want,
        "btrkit-restore differs from the original:\n{}",
        want.short_diff(&got, 12)
    );
    assert!(
        got.entries.values().filter(|e| e.kind == 'f').count() >= 200,
        "too few files restored"
    );
}

/// Zero the chunk tree's root block (every copy on every device) or, with
/// `whole`, every block of the chunk tree found on the devices (old copies
/// too); and, with `sys_array`, the sys_chunk_array of every superblock
/// copy of every device, each copy's checksum made right again. Returns
/// the chunk root's address.
fn destroy_chunk_tree(devs: &[PathBuf], whole: bool, sys_array: bool) -> u64 {
    let set = btrkit_core::devices::DeviceSet::open_files(devs, false).expect("open set");
    let img = set.open(OpenOptions::default()).expect("open image");
    let ns = img.nodesize as usize;
    let root = img.sb.chunk_root.get();
    let fsid = img.sb.tree_fsid();
    let path_of =
        |devid: u64| -> PathBuf { PathBuf::from(&set.get(devid).expect("device of the set").name) };
    let zero = vec![0u8; ns];
    for (devid, phys) in img
        .chunks
        .copies(root, ns as u64)
        .expect("chunk root copies")
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path_of(devid))
            .unwrap();
        f.write_all_at(&zero, phys).unwrap();
    }
    drop(img);
    for p in devs {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        let size = f.metadata().unwrap().len();
        if whole {
            let mut buf = vec![0u8; 8 << 20];
            let mut at = 1u64 << 20;
            while at + ns as u64 <= size {
                let len = (buf.len() as u64).min(size - at) as usize;
                f.read_exact_at(&mut buf[..len], at).unwrap();
                let mut off = 0usize;
                while off + ns <= len {
                    let b = &buf[off..off + ns];
                    if b[0x20..0x30] == fsid
                        && u64::from_le_bytes(b[0x58..0x60].try_into().unwrap())
                            == BTRFS_CHUNK_TREE_OBJECTID
                    {
                        f.write_all_at(&zero, at + off as u64).unwrap();
                        off += ns;
                    } else {
                        off += 4096;
                    }
                }
                at += off as u64;
            }
        }
        for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
            let off = btrfs_sb_offset(mirror);
            if !sys_array || off + BTRFS_SUPER_INFO_SIZE as u64 > size {
                break;
            }
            let mut b = vec![0u8; BTRFS_SUPER_INFO_SIZE];
            f.read_exact_at(&mut b, off).unwrap();
            // sys_chunk_array_size at 0xa0, the array at 0x32b.
            b[0xa0..0xa4].fill(0);
            b[0x32b..0x32b + BTRFS_SYSTEM_CHUNK_ARRAY_SIZE].fill(0);
            let t = u16::from_le_bytes([b[0xc4], b[0xc5]]);
            let c = btrkit_core::csum::CsumType::from_disk(t)
                .unwrap()
                .compute(&b[32..]);
            b[..32].copy_from_slice(&c);
            f.write_all_at(&b, off).unwrap();
        }
        f.sync_all().unwrap();
    }
    root
}

/// Copies of `devs` in `dir` named `PREFIXn.img`.
fn copies(devs: &[PathBuf], dir: &Path, prefix: &str) -> Vec<PathBuf> {
    sets::copy_set(devs, dir, prefix).expect("copy set")
}

/// btrfs rescue chunk-recover of btrfs-progs 6.14 on a copy of the
/// damaged set: what it says, and whether btrfs check finds the result
/// clean (for the record; not asserted).
fn progs_chunk_recover(devs: &[PathBuf], work: &Path) -> String {
    let Some(dir) = env::progs_new_dir() else {
        return "btrfs-progs 6.14 not available".into();
    };
    let c = copies(devs, &work.join("progs"), "p");
    let loops: Vec<PathBuf> = c
        .iter()
        .map(|d| btrkit_tests::mount::attach_loop(d).expect("loop"))
        .collect();
    let o = Command::new(dir.join("btrfs"))
        .args(["rescue", "chunk-recover", "-y"])
        .arg(&loops[0])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run btrfs rescue");
    let said: String = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(str::trim)
    .collect::<Vec<_>>()
    .join(" | ");
    for l in &loops {
        let _ = btrkit_tests::mount::detach_loop(l);
    }
    let check = match oracle::check_set_clean(&c) {
        Ok(()) => "btrfs check clean after".to_string(),
        Err(e) => format!("after: {e}"),
    };
    let _ = std::fs::remove_dir_all(work.join("progs"));
    format!("exit {:?}: {said}; {check}", o.status.code())
}

/// The whole chunk-recover story on the set `devs` (any order).
fn chunk_recover_case(set: &KernelSet, order: &[usize], whole: bool, work: &Path) {
    let before = kernel_manifest(&set.paths);
    // The chunk tree lost but the sys_chunk_array kept: the damage btrfs
    // rescue chunk-recover is made for.
    let kept = copies(&set.paths, &work.join("kept"), "k");
    destroy_chunk_tree(&kept, whole, false);
    eprintln!(
        "btrfs rescue chunk-recover 6.14, sys_chunk_array kept: {}",
        progs_chunk_recover(&kept, work)
    );
    let (code, r, err) = rescue("chunk-recover", &["-y"], &kept);
    assert_eq!(code, 1, "chunk-recover, sys_chunk_array kept: {err} {r}");
    all_clean(&kept, "after chunk-recover, sys_chunk_array kept");
    let _ = std::fs::remove_dir_all(work.join("kept"));
    // And the sys_chunk_array lost too.
    let devs: Vec<PathBuf> = order.iter().map(|&i| set.paths[i].clone()).collect();
    destroy_chunk_tree(&set.paths, whole, true);
    // Nothing opens it now: the check fails outright.
    let (code, _, err) = fsck(&[devs[0].as_os_str()]);
    assert!(
        code == 8 || code == 4,
        "damaged image checked: {code} {err}"
    );
    eprintln!(
        "btrfs rescue chunk-recover 6.14, sys_chunk_array lost too: {}",
        progs_chunk_recover(&set.paths, work)
    );
    // A dry run writes nothing and says what it would do.
    let digests: Vec<String> = devs
        .iter()
        .map(|d| kcrash::image_digest(d).unwrap())
        .collect();
    let (code, r, err) = rescue("chunk-recover", &["--dry-run"], &devs);
    assert_eq!(code, 4, "dry run: {err} {r}");
    assert_eq!(r["status"], "would-change", "{r}");
    for (d, dg) in devs.iter().zip(&digests) {
        assert_eq!(&kcrash::image_digest(d).unwrap(), dg, "dry run wrote");
    }
    let (code, r, err) = rescue("chunk-recover", &["-y"], &devs);
    assert_eq!(code, 1, "chunk-recover: {err} {r}");
    assert_eq!(r["committed"], true, "{r}");
    assert!(
        r["chunk_tree_before"]
            .as_str()
            .is_some_and(|s| s.starts_with("unreadable")),
        "{r}"
    );
    let chunks = r["chunks"].as_array().expect("chunks");
    assert!(chunks.len() >= 3, "{r}");
    for c in chunks {
        let kind = c["kind"].as_str().unwrap_or("");
        if kind.starts_with("METADATA") {
            assert!(c["blocks_confirmed"].as_u64().unwrap_or(0) > 0, "{c}");
        }
        if kind.starts_with("DATA") && c["data_checked"].as_u64().unwrap_or(0) > 0 {
            assert_eq!(c["data_checked"], c["data_matched"], "{c}");
        }
    }
    eprintln!(
        "chunk-recover: {}",
        chunks
            .iter()
            .map(|c| format!("{} {} ({})", c["logical"], c["kind"], c["order"]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    all_clean(&set.paths, "after chunk-recover");
    let after = kernel_manifest(&set.paths);
    assert!(
        after == before,
        "the kernel reads otherwise after chunk-recover:\n{}",
        before.short_diff(&after, 12)
    );
    restore_matches(&devs, &before, work);
    // Recovered: a second run finds the chunk tree as it would build it.
    let (code, r, err) = rescue("chunk-recover", &["-y"], &devs);
    assert_eq!(code, 0, "second chunk-recover: {err} {r}");
    assert_eq!(r["unchanged"], true, "{r}");
}

#[test]
fn chunk_recover_dup_metadata_single_device() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(1, &["-m", "dup", "-d", "single"]);
    let work = tempfile::tempdir().unwrap();
    chunk_recover_case(&set, &[0], false, work.path());
}

#[test]
fn chunk_recover_raid1_set_given_in_reverse() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(2, &["-m", "raid1", "-d", "raid1"]);
    let work = tempfile::tempdir().unwrap();
    chunk_recover_case(&set, &[1, 0], false, work.path());
}

/// Every chunk tree block on the devices gone, old ones too: the RAID0
/// data chunks' stripe order comes from where their checksummed sectors
/// are found, the SYSTEM chunk's is free.
#[test]
fn chunk_recover_whole_chunk_tree_raid0_data() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(2, &["-m", "raid1", "-d", "raid0"]);
    let work = tempfile::tempdir().unwrap();
    chunk_recover_case(&set, &[0, 1], true, work.path());
}

/// The chunk tree lost and the primary superblock damaged too: the first
/// valid copy is used, and the commit writes every copy again.
#[test]
fn chunk_recover_with_a_damaged_primary_superblock() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(1, &[]);
    let before = kernel_manifest(&set.paths);
    destroy_chunk_tree(&set.paths, false, true);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&set.paths[0])
        .unwrap();
    f.write_all_at(b"damage", BTRFS_SUPER_INFO_OFFSET + 0x200)
        .unwrap();
    drop(f);
    let (code, r, err) = rescue("chunk-recover", &["-y"], &set.paths);
    assert_eq!(code, 1, "{err} {r}");
    all_clean(&set.paths, "after chunk-recover");
    let after = kernel_manifest(&set.paths);
    assert!(after == before, "{}", before.short_diff(&after, 12));
}

/// Errors of btrkit-fsck's report by category, each once.
fn error_categories(devs: &[PathBuf]) -> std::collections::BTreeSet<String> {
    let mut a: Vec<&std::ffi::OsStr> = vec!["--json".as_ref()];
    a.extend(devs.iter().map(|d| d.as_os_str()));
    let (_, out, _) = fsck(&a);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    v["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "error")
        .map(|f| f["category"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Every single-device image of btrfs-progs' fsck tests (their own damage
/// and all): the chunk tree's root and the sys_chunk_array destroyed,
/// chunk-recover gives back a filesystem the checker finds no new error
/// in. One with an fsync log is refused (zero-log first); one of a set
/// given alone is refused.
#[test]
fn chunk_recover_every_fsck_fixture() {
    skip_unless!(env::require_btrfs_progs());
    let Some(_) = env::require_shared() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (mut recovered, mut refused) = (0, 0);
    for name in btrkit_tests::fixtures::fsck_fixture_names() {
        let fx = btrkit_tests::fixtures::fsck_fixture(&name).expect("fixture");
        let img = work.path().join("x.img");
        kcrash::copy_sparse(&fx, &img).unwrap();
        let devs = vec![img.clone()];
        if btrkit_tests::kimage::superblock_of(&img).num_devices.get() != 1 {
            // The superblock counts devices not given (055's damage):
            // refused, every device is needed.
            let (code, _, err) = rescue("chunk-recover", &["-y"], &devs);
            assert_eq!(code, 8, "{name}: {err}");
            assert!(err.contains("needs every device"), "{name}: {err}");
            refused += 1;
            continue;
        }
        // As it is, the chunk tree rebuilt is the one it holds.
        let (code, r, err) = rescue("chunk-recover", &["--dry-run"], &devs);
        assert_eq!(code, 0, "{name}: {err} {r}");
        assert_eq!(r["unchanged"], true, "{name}: {r}");
        let log = kcrash::super_log_root(&img).unwrap().1 != 0;
        let before = error_categories(&devs);
        destroy_chunk_tree(&devs, false, true);
        let (code, r, err) = rescue("chunk-recover", &["-y"], &devs);
        if log {
            assert_eq!(code, 8, "{name}: {err} {r}");
            assert!(err.contains("zero-log"), "{name}: {err}");
            refused += 1;
            continue;
        }
        assert_eq!(code, 1, "{name}: {err} {r}");
        let after = error_categories(&devs);
        // The commit may put right what a commit recomputes (the
        // superblock's bytes_used); nothing new.
        assert!(
            after.is_subset(&before),
            "{name}: errors before {before:?}, after {after:?}"
        );
        recovered += 1;
        let _ = std::fs::remove_file(&img);
    }
    eprintln!("{recovered} fsck-test images recovered, {refused} refused");
    assert!(recovered >= 40, "{recovered} recovered");
}

/// The image as the damage left it, and its error on opening.
fn open_error(dev: &Arc<dyn BlockDevice>) -> Option<String> {
    Image::open(dev.clone(), OpenOptions::default())
        .err()
        .map(|e| e.to_string())
}

fn clean(dev: &Arc<dyn BlockDevice>) -> bool {
    btrkit_core::check::check_device(dev.clone(), CheckOptions::own_writes(), &NoProgress)
        .is_ok_and(|r| r.is_clean())
}

#[test]
fn chunk_recover_cut_at_every_write() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(1, &["-m", "dup", "-d", "single"]);
    destroy_chunk_tree(&set.paths, false, true);
    let base = Arc::new(std::fs::read(&set.paths[0]).unwrap());
    let fresh = || Arc::new(CrashDevice::from_shared(base.clone()));
    let d0: Arc<dyn BlockDevice> = fresh();
    let damaged = open_error(&d0).expect("the damaged image opens");
    let run = |d: Arc<dyn BlockDevice>| {
        chunk_recover_devices(vec![("image".into(), d)], Options::default(), &NoProgress)
    };
    let count = {
        let d = fresh();
        let before = d.writes();
        let r = run(d.clone()).expect("chunk-recover");
        assert!(r.committed);
        let n = d.writes() - before;
        let d: Arc<dyn BlockDevice> = d;
        assert!(clean(&d), "not clean after chunk-recover");
        n
    };
    assert!(count >= 4, "chunk-recover of {count} writes");
    let mut subsets = Prng::new(0x9e3779b97f4a7c15);
    let mut outcomes = [0u32; 2];
    for cut in 0..count {
        let d = fresh();
        d.fail_after_writes(Some(cut));
        assert!(run(d.clone()).is_err(), "cut {cut} of {count} should fail");
        for variant in 0..4 {
            let s = subsets.next_u64();
            let c: Arc<dyn BlockDevice> = Arc::new(match variant {
                0 => d.crash_device(|_| false),
                1 => d.crash_device(|_| true),
                2 => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
                _ => d.crash_device_torn(|i, j| (s >> ((i * 7 + j) % 64)) & 1 == 1),
            });
            match open_error(&c) {
                None => {
                    assert!(
                        clean(&c),
                        "cut {cut} variant {variant}: opens but not clean"
                    );
                    outcomes[1] += 1;
                }
                Some(e) => {
                    assert_eq!(
                        e, damaged,
                        "cut {cut} variant {variant}: neither as it was nor recovered"
                    );
                    outcomes[0] += 1;
                    let r = run(c.clone())
                        .unwrap_or_else(|e| panic!("cut {cut} variant {variant}: rerun: {e}"));
                    assert!(r.committed);
                    assert!(clean(&c), "cut {cut} variant {variant}: rerun not clean");
                }
            }
        }
    }
    eprintln!(
        "{count} cut points: {} as it was, {} recovered",
        outcomes[0], outcomes[1]
    );
    assert!(outcomes[0] > 0 && outcomes[1] > 0);
}

#[test]
fn super_recover_damaged_primary() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(1, &[]);
    let img = set.paths[0].clone();
    // Nothing to do on a good image.
    let (code, r, err) = rescue("super-recover", &["-y"], std::slice::from_ref(&img));
    assert_eq!(code, 0, "{err} {r}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, BTRFS_SUPER_INFO_OFFSET + 0x200)
        .unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, BTRFS_SUPER_INFO_OFFSET + 0x200).unwrap();
    drop(f);
    assert!(oracle::check_set_clean(std::slice::from_ref(&img)).is_err());
    // Without -y and without a terminal: a usage error, nothing written.
    let digest = kcrash::image_digest(&img).unwrap();
    let (code, _, _) = fsck(&["rescue".as_ref(), "super-recover".as_ref(), img.as_os_str()]);
    assert_eq!(code, 16);
    let (code, r, _) = rescue("super-recover", &["--dry-run"], std::slice::from_ref(&img));
    assert_eq!(code, 4, "{r}");
    assert_eq!(kcrash::image_digest(&img).unwrap(), digest, "dry run wrote");
    let (code, r, err) = rescue("super-recover", &["-y"], std::slice::from_ref(&img));
    assert_eq!(code, 1, "{err} {r}");
    assert_eq!(r["chosen"]["mirror"], 1, "{r}");
    let written: Vec<u64> = r["copies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["written"] == true)
        .map(|c| c["mirror"].as_u64().unwrap())
        .collect();
    assert_eq!(written, [0], "{r}");
    all_clean(std::slice::from_ref(&img), "after super-recover");
    let (code, r, _) = rescue("super-recover", &["-y"], std::slice::from_ref(&img));
    assert_eq!(code, 0, "{r}");
}

#[test]
fn zero_log_of_a_kernel_log() {
    skip_unless!(env::require_btrfs_progs());
    let Some(_) = env::require_shared() else {
        return;
    };
    let fx = btrkit_tests::fixtures::fsck_fixture("065-valid-log-tree--already-present")
        .expect("fixture 065");
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("log.img");
    kcrash::copy_sparse(&fx, &img).unwrap();
    assert_ne!(kcrash::super_log_root(&img).unwrap().1, 0, "no log");
    let (code, r, err) = rescue("zero-log", &["--dry-run"], std::slice::from_ref(&img));
    assert_eq!(code, 4, "{err} {r}");
    assert_ne!(kcrash::super_log_root(&img).unwrap().1, 0, "dry run wrote");
    let (code, out, err) = fsck(&["rescue".as_ref(), "zero-log".as_ref(), img.as_os_str()]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        out.contains("btrkit-replay"),
        "no word of btrkit-replay: {out}"
    );
    assert_eq!(kcrash::super_log_root(&img).unwrap().1, 0);
    // Every valid copy: no log, the generation kept.
    let (_, r, _) = rescue("zero-log", &[], std::slice::from_ref(&img));
    assert_eq!(r["status"], "nothing-to-do", "{r}");
    assert!(oracle::check_set_clean(std::slice::from_ref(&img)).is_ok());
    let (code, _, err) = fsck(&[img.as_os_str()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn fix_device_size_fixture_028() {
    skip_unless!(env::require_btrfs_progs());
    let Some(_) = env::require_shared() else {
        return;
    };
    let fx = btrkit_tests::fixtures::fsck_fixture(
        "028-unaligned-super-dev-sizes--dev_and_super_mismatch_unaligned",
    )
    .expect("fixture 028");
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("028.img");
    kcrash::copy_sparse(&fx, &img).unwrap();
    let (code, _, _) = fsck(&["--json".as_ref(), img.as_os_str()]);
    assert_eq!(code, 4, "fixture 028 is not damaged");
    let (code, r, err) = rescue("fix-device-size", &[], std::slice::from_ref(&img));
    assert_eq!(code, 1, "{err} {r}");
    assert!(
        r["changes"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c.as_str().unwrap_or("").contains("total_bytes"))),
        "{r}"
    );
    assert!(oracle::check_set_clean(std::slice::from_ref(&img)).is_ok());
    let (code, _, err) = fsck(&[img.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    let (code, r, _) = rescue("fix-device-size", &[], std::slice::from_ref(&img));
    assert_eq!(code, 0, "{r}");
}

#[test]
fn clear_uuid_tree_kernel_rebuilds_it() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(2, &["-m", "raid1", "-d", "single"]);
    let has_uuid_tree = |devs: &[PathBuf]| {
        let img = btrkit_core::devices::DeviceSet::open_paths(devs, OpenOptions::default())
            .expect("open");
        img.find_root(BTRFS_UUID_TREE_OBJECTID).unwrap().is_some()
    };
    assert!(has_uuid_tree(&set.paths));
    let (code, r, err) = rescue("clear-uuid-tree", &[], &set.paths);
    assert_eq!(code, 1, "{err} {r}");
    assert!(!has_uuid_tree(&set.paths));
    all_clean(&set.paths, "after clear-uuid-tree");
    let (code, r, _) = rescue("clear-uuid-tree", &[], &set.paths);
    assert_eq!(code, 0, "{r}");
    // The kernel builds it again at a read-write mount.
    let m = btrkit_tests::LoopMount::new(&set.paths[0], &sets::device_opts(&set.paths)[1..])
        .expect("mount");
    std::thread::sleep(std::time::Duration::from_millis(500));
    m.unmount().expect("unmount");
    assert!(has_uuid_tree(&set.paths), "the kernel did not rebuild it");
    all_clean(&set.paths, "after the kernel's rebuild");
}

#[test]
fn clear_ino_cache_fixture_064() {
    skip_unless!(env::require_btrfs_progs());
    let Some(_) = env::require_shared() else {
        return;
    };
    let fx = btrkit_tests::fixtures::fsck_fixture("064-deprecated-inode-cache--4k_nodesize")
        .expect("fixture 064");
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("064.img");
    kcrash::copy_sparse(&fx, &img).unwrap();
    let categories = |img: &Path| -> Vec<String> {
        let (_, out, _) = fsck(&["--json".as_ref(), img.as_os_str()]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["severity"] == "error")
            .map(|f| f["category"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert!(categories(&img).iter().any(|c| c == "inode-cache"));
    let (code, r, err) = rescue("clear-ino-cache", &[], std::slice::from_ref(&img));
    assert_eq!(code, 1, "{err} {r}");
    // What is left is what mkfs.btrfs before 6.3 left in its free space
    // tree, which this image was made with.
    let left = categories(&img);
    assert!(
        left.iter().all(|c| c == "free-space-stale"),
        "left after clear-ino-cache: {left:?}"
    );
    assert!(oracle::check_set_clean(std::slice::from_ref(&img)).is_ok());
    let (code, r, _) = rescue("clear-ino-cache", &[], std::slice::from_ref(&img));
    assert_eq!(code, 0, "{r}");
}

/// The first two checksummed data sectors: (logical, every copy).
fn checksummed_sectors(img: &Path) -> Vec<(u64, Vec<(u64, u64)>)> {
    let img = Image::open_path(img, OpenOptions::default()).expect("open");
    let root = img
        .find_root(BTRFS_CSUM_TREE_OBJECTID)
        .unwrap()
        .expect("csum tree");
    let mut it = TreeIter::new(
        &img,
        root,
        Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0),
    )
    .unwrap();
    let ss = img.sectorsize as u64;
    while let Some(item) = it.next_item() {
        let item = item.unwrap();
        if item.data().unwrap().len() >= 2 * img.csum.size() {
            return (0..2)
                .map(|i| {
                    let l = item.key.offset + i * ss;
                    (l, img.chunks.copies(l, ss).unwrap())
                })
                .collect();
        }
    }
    panic!("no checksum item of two sectors");
}

#[test]
fn fix_data_checksum_dup_data() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(1, &["-m", "dup", "-d", "dup"]);
    let img = set.paths[0].clone();
    let before = kernel_manifest(&set.paths);
    let sectors = checksummed_sectors(&img);
    assert_eq!(sectors[0].1.len(), 2, "DUP data has two copies");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    // Sector 0: its first copy bad. Sector 1: both copies bad, each
    // otherwise.
    f.write_all_at(b"bad copy", sectors[0].1[0].1).unwrap();
    f.write_all_at(b"bad one", sectors[1].1[0].1).unwrap();
    f.write_all_at(b"bad two", sectors[1].1[1].1).unwrap();
    drop(f);
    let digest = kcrash::image_digest(&img).unwrap();
    let (code, r, err) = rescue(
        "fix-data-checksum",
        &["--readonly"],
        std::slice::from_ref(&img),
    );
    assert_eq!(code, 4, "{err} {r}");
    assert_eq!(
        kcrash::image_digest(&img).unwrap(),
        digest,
        "--readonly wrote"
    );
    let bad = r["bad_sectors"].as_array().expect("bad sectors");
    assert_eq!(bad.len(), 2, "{r}");
    assert_eq!(bad[0]["logical"], sectors[0].0);
    assert_eq!(bad[0]["action"]["action"], "would-rewrite", "{r}");
    assert_eq!(bad[0]["good_mirror"], 2, "{r}");
    assert_eq!(bad[1]["action"]["action"], "left", "{r}");
    // The good copy is written over the bad one; the other sector is left.
    let (code, r, err) = rescue("fix-data-checksum", &[], std::slice::from_ref(&img));
    assert_eq!(code, 4, "{err} {r}");
    assert_eq!(r["bad_sectors"][0]["action"]["action"], "rewritten", "{r}");
    assert_eq!(r["bad_sectors"][1]["action"]["action"], "left", "{r}");
    let (_, out, _) = fsck(&[
        "--json".as_ref(),
        "--check-data-csum".as_ref(),
        img.as_os_str(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let bad: Vec<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["category"] == "data-csum")
        .map(|f| f["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains(&sectors[1].0.to_string()), "{bad:?}");
    // Only on request: copy 1's checksum recorded, copy 2 made equal to it.
    let (code, r, err) = rescue(
        "fix-data-checksum",
        &["--mirror", "1"],
        std::slice::from_ref(&img),
    );
    assert_eq!(code, 1, "{err} {r}");
    assert_eq!(r["committed"], true, "{r}");
    assert_eq!(r["bad_sectors"][0]["action"]["action"], "checksum-recorded");
    all_clean(&set.paths, "after fix-data-checksum");
    let (code, r, _) = rescue("fix-data-checksum", &[], std::slice::from_ref(&img));
    assert_eq!(code, 0, "{r}");
    // Every file reads as before but the one whose sector took copy 1.
    let after = kernel_manifest(&set.paths);
    let changed = before.diff(&after);
    assert!(
        changed.len() <= 1,
        "more than one file changed: {changed:?}"
    );
}

/// On a RAID1 set (given in reverse order): the copy on the second device
/// bad, rewritten from the first; the report names the device.
#[test]
fn fix_data_checksum_raid1_set() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(2, &["-m", "raid1", "-d", "raid1"]);
    let img = btrkit_core::devices::DeviceSet::open_paths(&set.paths, OpenOptions::default())
        .expect("open set");
    let ss = img.sectorsize as u64;
    let sectors = {
        let root = img.find_root(BTRFS_CSUM_TREE_OBJECTID).unwrap().unwrap();
        let mut it = TreeIter::new(
            &img,
            root,
            Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0),
        )
        .unwrap();
        let item = it.next_item().unwrap().unwrap();
        let l = item.key.offset;
        (l, img.chunks.copies(l, ss).unwrap())
    };
    drop(img);
    let (logical, copies) = sectors;
    let (devid, phys) = *copies.iter().find(|c| c.0 == 2).expect("a copy on devid 2");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&set.paths[1])
        .unwrap();
    f.write_all_at(b"bad copy on device 2", phys).unwrap();
    drop(f);
    let devs = vec![set.paths[1].clone(), set.paths[0].clone()];
    let (code, r, err) = rescue("fix-data-checksum", &[], &devs);
    assert_eq!(code, 1, "{err} {r}");
    let bad = &r["bad_sectors"][0];
    assert_eq!(bad["logical"], logical, "{r}");
    assert_eq!(bad["bad"][0]["devid"], devid, "{r}");
    assert_eq!(bad["bad"][0]["physical"], phys, "{r}");
    assert!(
        bad["bad"][0]["device"]
            .as_str()
            .is_some_and(|d| d.contains(&*set.paths[1].to_string_lossy())),
        "{r}"
    );
    assert_eq!(bad["action"]["action"], "rewritten", "{r}");
    all_clean(&set.paths, "after fix-data-checksum");
}

#[test]
fn command_line() {
    skip_unless!(env::require_kernel_mount());
    let set = KernelSet::new(1, &[]);
    let img = set.paths[0].clone();
    // The check is what it was.
    let (code, out, err) = fsck(&[img.as_os_str()]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("clean"), "{out}");
    // A writing command without -y and without a terminal.
    let (code, _, err) = fsck(&["rescue".as_ref(), "chunk-recover".as_ref(), img.as_os_str()]);
    assert_eq!(code, 16, "{err}");
    assert!(err.contains("-y"), "{err}");
    // No image, an unknown command, a check flag before `rescue`.
    let (code, _, _) = fsck(&["rescue".as_ref(), "zero-log".as_ref()]);
    assert_eq!(code, 16);
    let (code, _, _) = fsck(&["rescue".as_ref(), "no-such".as_ref(), img.as_os_str()]);
    assert_eq!(code, 16);
    let (code, _, err) = fsck(&[
        "--json".as_ref(),
        "rescue".as_ref(),
        "zero-log".as_ref(),
        img.as_os_str(),
    ]);
    assert_eq!(code, 16, "{err}");
    // Commands with nothing to do exit 0 and write nothing.
    let digest = kcrash::image_digest(&img).unwrap();
    for cmd in [
        "zero-log",
        "fix-device-size",
        "clear-ino-cache",
        "fix-data-checksum",
    ] {
        let (code, r, err) = rescue(cmd, &[], std::slice::from_ref(&img));
        assert_eq!(code, 0, "{cmd}: {err} {r}");
        assert_eq!(r["status"], "nothing-to-do", "{cmd}: {r}");
        assert_eq!(r["command"], cmd);
    }
    assert_eq!(kcrash::image_digest(&img).unwrap(), digest, "a no-op wrote");
    // A failure is one line and exit 8.
    let missing = set.paths[0].with_extension("none");
    let (code, _, err) = fsck(&["rescue".as_ref(), "zero-log".as_ref(), missing.as_os_str()]);
    assert_eq!(code, 8, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
