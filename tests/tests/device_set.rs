//! Device sets made by mkfs.btrfs: every device of a RAID1C3 filesystem
//! given in any order forms one set; a device missing is counted; a
//! device of another filesystem is refused with both named. Sets of every
//! profile written by the kernel: checked clean and dumped as btrfs-progs
//! dumps them, read degraded, and a bad copy on one device reported and
//! never read.

use btrkit_core::devices::DeviceSet;
use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle;
use btrkit_tests::sets::{dump, findings, fsck, mkfs, progs_dump, KernelSet};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, require_btrfs_progs, require_kernel_mount, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

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

/// Every profile of a set: btrkit-fsck reads every copy of every tree
/// block and of all data on every device and finds the kernel's filesystem
/// clean; btrkit-dump prints every tree as dump-tree does.
#[test]
fn every_profile_checks_clean_and_dumps_as_progs() {
    skip_unless!(require_kernel_mount());
    for (n, args) in [
        (2, &["-d", "raid1", "-m", "raid1"][..]),
        (2, &["-d", "raid0", "-m", "raid1"][..]),
        (4, &["-d", "raid10", "-m", "raid10"][..]),
        (3, &["-d", "raid1c3", "-m", "raid1c3"][..]),
        (4, &["-d", "raid1c4", "-m", "raid1c4"][..]),
        (2, &["-d", "single", "-m", "dup"][..]),
        (3, &["-d", "raid0", "-m", "raid0"][..]),
    ] {
        let set = KernelSet::new(n, args);
        // Any order.
        let devs: Vec<&Path> = set.paths.iter().rev().map(PathBuf::as_path).collect();
        let (code, r, err) = fsck(&devs, &["--check-mirrors", "--check-data-csum"]);
        assert_eq!(code, 0, "{args:?}: {err} {:?}", findings(&r));
        assert!(findings(&r).is_empty(), "{args:?}: {:?}", findings(&r));
        assert!(
            r["phases"][6]["checked"].as_u64().unwrap_or(0) > 1000,
            "{args:?}: {r}"
        );
        assert_eq!(dump(&devs, &[]), progs_dump(&set.paths), "{args:?}");
        // One device alone: refused, the missing ones named.
        let (code, _, err) = fsck(&devs[..1], &[]);
        assert_eq!(code, 8, "{args:?}");
        assert!(
            err.contains(&format!("has {n} devices")) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

/// With one device of a RAID1 or RAID10 set missing, `--degraded` reads
/// everything from the copies left: the same trees, all data verified, the
/// missing device a warning; without it, a refusal naming the device.
#[test]
fn degraded_sets_read_everything() {
    skip_unless!(require_kernel_mount());
    for (n, gone, args) in [
        (2, 1, &["-d", "raid1", "-m", "raid1"][..]),
        (4, 2, &["-d", "raid10", "-m", "raid10"][..]),
        (3, 0, &["-d", "raid1c3", "-m", "raid1c3"][..]),
    ] {
        let set = KernelSet::new(n, args);
        let all: Vec<&Path> = set.paths.iter().map(PathBuf::as_path).collect();
        let full = dump(&all, &[]);
        let rest: Vec<&Path> = all
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != gone)
            .map(|(_, p)| *p)
            .collect();
        let devid = gone + 1;
        let (code, _, err) = fsck(&rest, &[]);
        assert_eq!(code, 8, "{args:?}: {err}");
        assert!(
            err.contains(&format!("devid {devid} not given")) && err.contains("degraded"),
            "{args:?}: {err}"
        );
        let (code, r, err) = fsck(&rest, &["--degraded", "--check-data-csum"]);
        assert_eq!(code, 0, "{args:?}: {err} {:?}", findings(&r));
        let f = findings(&r);
        assert!(
            f.len() == 1
                && f[0].0 == "warning"
                && f[0].2.contains(&format!("devid {devid} not given")),
            "{args:?}: {f:?}"
        );
        assert_eq!(dump(&rest, &["--degraded"]), full, "{args:?}");
    }
}

/// One copy of a tree block damaged on one device and one copy of a data
/// sector on another: reads return the good copy (dump is unchanged),
/// fsck names the device and offset of each bad copy.
#[test]
fn a_bad_copy_on_one_device_is_reported_and_never_read() {
    use btrkit_core::devices::DeviceSet;
    use btrkit_core::image::OpenOptions;
    skip_unless!(require_kernel_mount());
    let set = KernelSet::new(2, &["-d", "raid1", "-m", "raid1"]);
    let devs: Vec<&Path> = set.paths.iter().map(PathBuf::as_path).collect();
    let before = dump(&devs, &[]);
    let img = DeviceSet::open_paths(&set.paths, OpenOptions::default()).unwrap();
    let fs = img.find_root(5).unwrap().unwrap();
    let csum = img.find_root(7).unwrap().unwrap();
    // The fs tree's root: its second copy; the csum tree's root: its first.
    let (d_fs, p_fs) = img.block_copy_addrs(fs.bytenr).unwrap()[1];
    let (d_cs, p_cs) = img.block_copy_addrs(csum.bytenr).unwrap()[0];
    // A data sector: the first checksummed one.
    let node = img
        .read_tree_block(csum.bytenr, &btrkit_core::tree::Expect::root(&csum), false)
        .unwrap();
    let data_at = (0..node.nr_safe())
        .filter_map(|s| node.key(s))
        .find(|k| k.ty == 128)
        .expect("a csum item")
        .offset;
    let data_copies = img.chunks.copies(data_at, 4096).unwrap();
    let (d_data, p_data) = data_copies[1];
    drop(img);
    let spoil = |devid: u64, phys: u64| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&set.paths[devid as usize - 1])
            .unwrap();
        f.write_all_at(&[0xa5u8; 512], phys + 1024).unwrap();
    };
    spoil(d_fs, p_fs);
    spoil(d_cs, p_cs);
    spoil(d_data, p_data);

    assert_eq!(dump(&devs, &[]), before, "a read returned a bad copy");
    let (code, r, err) = fsck(&devs, &["--check-mirrors", "--check-data-csum"]);
    let f = findings(&r);
    assert_eq!(code, 4, "{err} {f:?}");
    let name = |d: u64| format!("devid {d} ({})", set.paths[d as usize - 1].display());
    for (devid, phys) in [(d_fs, p_fs), (d_cs, p_cs)] {
        assert!(
            f.iter().any(|x| x.0 == "warning"
                && x.1 == "mirror-copy"
                && x.2
                    .contains(&format!("at physical {phys} on {}", name(devid)))),
            "copy at {devid}:{phys} not reported: {f:?}"
        );
    }
    assert!(
        f.iter().any(|x| x.1 == "data-csum"
            && x.2.contains(&format!(
                "1 of 2 copies bad; physical {p_data} on {}",
                name(d_data)
            ))),
        "{f:?}"
    );
    assert_eq!(f.len(), 3, "{f:?}");
    // Without --check-mirrors: the damaged first copy is still found (it
    // was read), the second is not looked at.
    let (code, r, _) = fsck(&devs, &[]);
    let f = findings(&r);
    assert_eq!(code, 0, "{f:?}");
    assert!(f.len() == 1 && f[0].2.contains(&name(d_cs)), "{f:?}");
}

/// The chunk items of a set, as (logical, length, flags, stripes).
fn chunks_of(devs: &[&Path]) -> Vec<(u64, u64, u64, Vec<(u64, u64)>)> {
    use btrkit_core::image::OpenOptions;
    let paths: Vec<PathBuf> = devs.iter().map(|p| p.to_path_buf()).collect();
    let img = DeviceSet::open_paths(&paths, OpenOptions::default()).unwrap();
    img.chunks
        .iter()
        .map(|m| (m.logical, m.length, m.type_flags, m.stripes.clone()))
        .collect()
}

/// A new chunk on a set goes where the kernel puts it: the same devices
/// (most unallocated room first), offsets and length. The kernel's choice
/// is seen by filling the data chunks of a set of devices of different
/// sizes through a mount; ours by allocating a data chunk on a copy of the
/// same set. The copy with our chunk is clean and mounts. RAID1 on three
/// devices, RAID10 on four, RAID0 on three.
#[test]
fn a_new_chunk_on_a_set_goes_where_the_kernel_puts_it() {
    skip_unless!(require_kernel_mount());
    const G: u64 = 1 << 30;
    new_chunk_as_the_kernel(&[2 * G, G, 3 * G], &["-d", "raid1", "-m", "raid1"]);
    new_chunk_as_the_kernel(
        &[2 * G, G, 2 * G, 3 * G / 2],
        &["-d", "raid10", "-m", "raid1"],
    );
    new_chunk_as_the_kernel(&[G, 2 * G, 3 * G / 2], &["-d", "raid0", "-m", "raid1"]);
}

fn new_chunk_as_the_kernel(sizes: &[u64], profile: &[&str]) {
    use btrkit_core::format::consts::BTRFS_BLOCK_GROUP_DATA;
    use btrkit_core::image::OpenOptions;
    use btrkit_core::trans::Store;
    let t = tempfile::tempdir().unwrap();
    let kern: Vec<PathBuf> = (0..sizes.len())
        .map(|i| t.path().join(format!("k{i}.img")))
        .collect();
    let ours: Vec<PathBuf> = (0..sizes.len())
        .map(|i| t.path().join(format!("o{i}.img")))
        .collect();
    for (p, &s) in kern.iter().zip(sizes) {
        std::fs::File::create(p).unwrap().set_len(s).unwrap();
    }
    must_run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .args(profile)
            .args(&kern),
    );
    for (k, o) in kern.iter().zip(&ours) {
        btrkit_tests::kcrash::copy_sparse(k, o).unwrap();
    }
    let kref: Vec<&Path> = kern.iter().map(PathBuf::as_path).collect();
    let oref: Vec<&Path> = ours.iter().map(PathBuf::as_path).collect();
    let device_opts = |devs: &[PathBuf]| -> String {
        devs[1..]
            .iter()
            .map(|d| format!("device={}", d.display()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let before = chunks_of(&kref);
    let data_len: u64 = before
        .iter()
        .filter(|c| c.2 & BTRFS_BLOCK_GROUP_DATA != 0)
        .map(|c| c.1)
        .sum();

    // The kernel: more data than the data chunks hold.
    {
        let m = LoopMount::new(&kern[0], &device_opts(&kern)).unwrap();
        let n = (data_len + (64 << 20)) as usize;
        let data: Vec<u8> = (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(m.path().join("big"), data).unwrap();
        drop(m);
    }
    let after = chunks_of(&kref);
    let mut kernel_new: Vec<_> = after
        .iter()
        .filter(|c| !before.contains(c))
        .cloned()
        .collect();
    // The kernel may allocate a second chunk ahead when the first fills
    // (its timing decides): the first is the one to compare.
    kernel_new.sort_by_key(|c| c.0);
    assert!(
        !kernel_new.is_empty(),
        "{profile:?}: the kernel added no chunk"
    );
    kernel_new.truncate(1);

    // Ours: one data chunk on the untouched copy.
    let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
    for p in &ours {
        let d: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(p, true).unwrap());
        devs.push((p.display().to_string(), d));
    }
    let img = DeviceSet::assemble(devs)
        .unwrap()
        .open(OpenOptions {
            writable: true,
            ..Default::default()
        })
        .unwrap();
    let mut st = Store::from_image_for_replay(img).unwrap();
    st.chunks().alloc_chunk(BTRFS_BLOCK_GROUP_DATA).unwrap();
    st.commit().unwrap();
    drop(st);
    let mine = chunks_of(&oref);
    let our_new: Vec<_> = mine
        .iter()
        .filter(|c| !before.contains(c))
        .cloned()
        .collect();
    assert_eq!(our_new, kernel_new, "{profile:?}");

    // mkfs.btrfs 6.2 leaves stale free space entries for its temporary
    // chunks: the only findings allowed, on both sides.
    let others = |r: &serde_json::Value| -> Vec<(String, String, String)> {
        findings(r)
            .into_iter()
            .filter(|f| f.1 != "free-space-stale")
            .collect()
    };
    let (code, r, err) = fsck(&oref, &["--check-mirrors"]);
    assert!(code == 0 || code == 4, "{profile:?}: {err}");
    assert!(others(&r).is_empty(), "{profile:?}: {:?}", others(&r));
    let m = LoopMount::new(&ours[0], &device_opts(&ours)).unwrap();
    std::fs::write(m.path().join("after"), b"written by the kernel").unwrap();
    drop(m);
    let (_, r, err) = fsck(&oref, &["--check-mirrors", "--check-data-csum"]);
    assert!(others(&r).is_empty(), "{profile:?}: {err} {:?}", others(&r));
    let (_, r, _) = fsck(&kref, &["--check-mirrors"]);
    assert!(
        others(&r).is_empty(),
        "{profile:?}: the kernel's: {:?}",
        others(&r)
    );
}

/// The kernel's profiles of a mounted filesystem (`btrfs filesystem df`).
fn kernel_df(mnt: &Path) -> String {
    let o = Command::new("btrfs")
        .args(["filesystem", "df"])
        .arg(mnt)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Writing to a RAID1 set with a device gone: refused unless degraded,
/// with nothing written; degraded, the engine writes what the kernel's
/// degraded mount writes — a file that outgrows the RAID1 data chunk gets
/// a new chunk as single on the device left — and the kernel, mounting
/// the device alone degraded, reads it back; btrkit-fsck --degraded finds
/// the device clean. The kernel's own degraded writes are checked first,
/// as the oracle of what "single" means here.
#[test]
fn degraded_writes_take_the_profile_the_devices_left_allow() {
    skip_unless!(require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..160u32 << 20).map(|x| (x / 4096) as u8 ^ 0x5a).collect();

    // The kernel, on its own set.
    let set = KernelSet::new(2, &["-d", "raid1", "-m", "raid1"]);
    {
        let m = LoopMount::mount(&set.paths[0], &t.path().join("k"), "degraded").unwrap();
        std::fs::write(m.path().join("big"), &data).unwrap();
        let df = kernel_df(m.path());
        assert!(
            df.contains("Data, single"),
            "the kernel's degraded writes: {df}"
        );
        m.unmount().unwrap();
    }

    // btrkit, on a set btrkit-mkfs made.
    let imgs: Vec<PathBuf> = (1..=2)
        .map(|i| t.path().join(format!("o{i}.img")))
        .collect();
    let o = Command::new(bin_path("btrkit-mkfs"))
        .args(["-q", "-b", "512M", "-m", "raid1", "-d", "raid1"])
        .args(&imgs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let open = || -> Vec<(String, Arc<dyn BlockDevice>)> {
        let d: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&imgs[0], true).unwrap());
        vec![(imgs[0].display().to_string(), d)]
    };
    let before = std::fs::read(&imgs[0]).unwrap();
    let opts = btrkit_core::fs::MountOptions::parse(&["commit=600"]).unwrap();
    match btrkit_core::log::replay::mount_devices(open(), opts.clone(), false) {
        Err(btrkit_core::Error::MissingDevice { devids, .. }) => assert_eq!(devids, vec![2]),
        Err(e) => panic!("not degraded: {e}"),
        Ok(_) => panic!("one device of two mounted without degraded"),
    }
    assert!(
        std::fs::read(&imgs[0]).unwrap() == before,
        "a refused mount wrote"
    );
    {
        let mut fs = btrkit_core::log::replay::mount_devices(open(), opts, true).unwrap();
        let script =
            btrkit_core::workload::Script::parse("w", "write /big 0 160M 0\nsync\n").unwrap();
        let mut r = btrkit_core::workload::engine::EngineRunner::new();
        for (_, st) in &script.steps {
            match st {
                btrkit_core::workload::Step::Write { path, off, .. } => {
                    let st = btrkit_core::workload::Step::Write {
                        path: path.clone(),
                        off: *off,
                        len: data.len() as u64,
                        fill: btrkit_core::workload::script::Fill::Text(data.clone()),
                        enospc_ok: false,
                    };
                    r.apply(&mut fs, &st).unwrap();
                }
                st => {
                    r.apply(&mut fs, st).unwrap();
                }
            }
        }
        r.close_all(&mut fs).unwrap();
        fs.sync().unwrap();
    }
    let (code, rep, err) = fsck(&[&imgs[0]], &["--degraded", "--check-data-csum"]);
    let f = findings(&rep);
    assert!(
        code == 0
            && f.iter()
                .all(|x| x.0 == "warning" && x.2.contains("devid 2 not given")),
        "{err} {f:?}"
    );
    let m = LoopMount::mount(&imgs[0], &t.path().join("o"), "degraded,ro").unwrap();
    let df = kernel_df(m.path());
    assert!(
        df.contains("Data, single") && df.contains("Data, RAID1"),
        "btrkit's degraded writes: {df}"
    );
    assert!(
        std::fs::read(m.path().join("big")).unwrap() == data,
        "data read back differs"
    );
}

/// `--repair` on a filesystem on two devices: a file's link count changed
/// in both copies of its leaf (one on each device, checksums made right)
/// is found, repaired in one commit written to both devices, and the set
/// is then clean to btrkit-fsck and btrfs check, and the kernel shows the
/// same files as before the damage.
#[test]
fn repair_on_a_device_set() {
    use btrkit_core::devices::DeviceSet;
    use btrkit_core::image::OpenOptions;
    use btrkit_core::tree::search::TreeIter;
    use btrkit_tests::sets::manifest;
    skip_unless!(require_kernel_mount());
    skip_unless!(require_btrfs_progs());
    let set = KernelSet::new(2, &["-d", "raid1", "-m", "raid1"]);
    let devs: Vec<&Path> = set.paths.iter().map(PathBuf::as_path).collect();
    let before = manifest(&set.paths, "ro").unwrap();
    let img = DeviceSet::open_paths(&set.paths, OpenOptions::default()).unwrap();
    let fs = img.find_root(5).unwrap().unwrap();
    let mut it = TreeIter::new(&img, fs, btrkit_core::format::key::Key::new(257, 0, 0)).unwrap();
    // btrfs_inode_item: nlink at 40, mode at 52.
    let (leaf, at, ino) = loop {
        let item = it.next_item().expect("a regular file").unwrap();
        if item.key.ty != 1 {
            continue;
        }
        let d = item.data().unwrap();
        let mode = u32::from_le_bytes(d[52..56].try_into().unwrap());
        let nlink = u32::from_le_bytes(d[40..44].try_into().unwrap());
        if mode & 0o170000 == 0o100000 && nlink == 1 {
            let off = d.as_ptr() as usize - item.node.bytes().as_ptr() as usize;
            break (item.node.bytenr, off + 40, item.key.objectid);
        }
    };
    let copies = img.block_copy_addrs(leaf).unwrap();
    assert_eq!(copies.len(), 2);
    assert_ne!(
        copies[0].0, copies[1].0,
        "RAID1 puts the copies on both devices"
    );
    let ns = img.nodesize as usize;
    let csum = img.csum;
    drop(img);
    for (devid, phys) in copies {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&set.paths[devid as usize - 1])
            .unwrap();
        let mut b = vec![0u8; ns];
        f.read_exact_at(&mut b, phys).unwrap();
        b[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
        let c = btrkit_core::csum::block_csum(csum, &b);
        b[..32].copy_from_slice(&c);
        f.write_all_at(&b, phys).unwrap();
    }
    let (code, r, err) = fsck(&devs, &[]);
    let f = findings(&r);
    assert_eq!(code, 4, "{err} {f:?}");
    assert!(
        f.iter().any(|x| x
            .2
            .contains(&format!("inode {ino}: link count 7 but 1 names"))),
        "{f:?}"
    );
    let (code, _, err) = fsck(&devs, &["--repair", "--yes"]);
    assert_eq!(code, 1, "repair: {err}");
    let (code, r, err) = fsck(&devs, &[]);
    assert_eq!(code, 0, "after the repair: {err} {:?}", findings(&r));
    oracle::check_set_clean(&set.paths).unwrap();
    assert_eq!(manifest(&set.paths, "ro").unwrap(), before);
}
