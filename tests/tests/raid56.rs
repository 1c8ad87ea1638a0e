//! RAID5 and RAID6 sets against the kernel.
//!
//! - Sets made by mkfs.btrfs (raid5 on three devices, raid6 on four, and
//!   mixed parity profiles on four and five) and written by the kernel:
//!   btrkit-fsck reads every tree block and data sector and recomputes the
//!   parity of every full stripe: clean; btrkit-dump prints every tree as
//!   dump-tree does; btrkit-mount and btrkit-restore show exactly what the
//!   kernel shows. With one device (raid5) or two (raid6) removed, the same
//!   through `--degraded`, every lost stripe rebuilt from parity; with a
//!   device zeroed behind its superblock, the same from the whole set, each
//!   damaged stripe read rebuilt and reported.
//! - Parity damaged on disk: the parity scrub names P or Q, its device and
//!   physical offset, and says the data is good.
//! - Sets made by btrkit-mkfs (raid5, raid6, with `--rootdir` so the
//!   engine writes the data through the parity): btrfs check clean, the
//!   kernel mounts them, writes more, and its scrub (which verifies parity
//!   on RAID5/6) finds no error; btrkit-fsck agrees; with devices removed,
//!   btrkit-mount and btrkit-restore `--degraded` show what the kernel
//!   shows.

use btrkit_core::devices::DeviceSet;
use btrkit_core::image::OpenOptions;
use btrkit_tests::kcrash;
use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle;
use btrkit_tests::sets::{
    self, device_opts, dump, findings, fsck, progs_dump, write_files, KernelSet,
};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, require_kernel_mount, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;

/// (devices, mkfs.btrfs profile arguments, devices to lose (indexes)).
const CASES: [(usize, &[&str], &[usize]); 4] = [
    (3, &["-d", "raid5", "-m", "raid5"], &[1]),
    (4, &["-d", "raid6", "-m", "raid6"], &[0, 2]),
    (5, &["-d", "raid6", "-m", "raid5"], &[4]),
    (4, &["-d", "raid5", "-m", "raid6"], &[3]),
];

fn errors_but(r: &serde_json::Value, allowed: &[&str]) -> Vec<(String, String, String)> {
    findings(r)
        .into_iter()
        .filter(|f| f.0 == "error" && !allowed.contains(&f.1.as_str()))
        .collect()
}

#[test]
fn kernel_sets_read_whole_degraded_and_damaged() {
    skip_unless!(require_kernel_mount());
    for (n, args, lose) in CASES {
        let set = KernelSet::new(n, args);
        let work = tempfile::tempdir().unwrap();
        let all: Vec<&Path> = set.paths.iter().map(PathBuf::as_path).collect();
        let want = sets::manifest(&set.paths, "ro").unwrap();

        // Whole: clean, parity included; dumped as btrfs-progs dumps it.
        let (code, r, err) = fsck(&all, &["--check-mirrors", "--check-data-csum"]);
        assert_eq!(code, 0, "{args:?}: {err} {:?}", findings(&r));
        assert!(findings(&r).is_empty(), "{args:?}: {:?}", findings(&r));
        let full = dump(&all, &[]);
        assert_eq!(full, progs_dump(&set.paths), "{args:?}");
        sets::read_paths_match(&set.paths, &want, work.path())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));

        // Degraded: every stripe of the lost devices rebuilt from parity.
        let rest: Vec<PathBuf> = set
            .paths
            .iter()
            .enumerate()
            .filter(|(i, _)| !lose.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        let rest_refs: Vec<&Path> = rest.iter().map(PathBuf::as_path).collect();
        let (code, r, err) = fsck(&rest_refs, &["--degraded", "--check-data-csum"]);
        assert_eq!(
            code,
            0,
            "{args:?} without {lose:?}: {err} {:?}",
            findings(&r)
        );
        let f = findings(&r);
        assert!(
            f.iter().all(|f| f.0 == "warning"),
            "{args:?} without {lose:?}: {f:?}"
        );
        assert!(
            f.iter().any(|f| f.1 == "parity-rebuild"),
            "rebuilt reads are reported: {f:?}"
        );
        assert_eq!(dump(&rest_refs, &["--degraded"]), full, "{args:?}");
        sets::read_paths_match_with(&rest, &want, work.path(), &["--degraded"])
            .unwrap_or_else(|e| panic!("{args:?} without {lose:?}: {e}"));

        // Damaged: the first lost device zeroed past its first superblock
        // (the set still assembles), all devices given.
        let dmg = sets::copy_set(&set.paths, &work.path().join("dmg"), "z").unwrap();
        {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&dmg[lose[0]])
                .unwrap();
            let len = f.metadata().unwrap().len();
            use std::os::unix::fs::FileExt;
            let zero = vec![0u8; 1 << 20];
            let mut at = 1 << 20;
            while at < len {
                f.write_all_at(&zero, at).unwrap();
                at += 1 << 20;
            }
        }
        let dmg_refs: Vec<&Path> = dmg.iter().map(PathBuf::as_path).collect();
        let (code, r, err) = fsck(&dmg_refs, &["--check-mirrors", "--check-data-csum"]);
        // Data stripes that fail their checksums are errors (as a bad data
        // copy is), each rebuilt; tree blocks warnings; nothing else.
        let bad = errors_but(&r, &["data-csum", "parity"]);
        assert!(bad.is_empty(), "{args:?} zeroed: {code} {err} {bad:?}");
        let f = findings(&r);
        assert!(
            f.iter()
                .filter(|f| f.1 == "data-csum")
                .all(|f| f.2.contains("parity rebuilds it")),
            "{args:?}: {f:?}"
        );
        assert!(
            f.iter()
                .any(|f| f.1 == "parity-rebuild" && f.2.contains("is damaged")),
            "{args:?}: {f:?}"
        );
        assert_eq!(dump(&dmg_refs, &[]), full, "{args:?} zeroed");
        sets::read_paths_match(&dmg, &want, work.path())
            .unwrap_or_else(|e| panic!("{args:?} zeroed: {e}"));
    }
}

/// Where the parity of the first sector of the first data extent lies:
/// (index of the device, physical offset) of P (and of Q).
fn parity_of_first_extent(paths: &[PathBuf]) -> Vec<(usize, u64)> {
    use btrkit_core::format::consts::*;
    use btrkit_core::format::key::Key;
    let img = DeviceSet::open_paths(paths, OpenOptions::default()).unwrap();
    let root = img.find_root(BTRFS_EXTENT_TREE_OBJECTID).unwrap().unwrap();
    let mut it = btrkit_core::tree::TreeIter::new(&img, root, Key::MIN).unwrap();
    let mut first = None;
    while let Some(item) = it.next_item() {
        let item = item.unwrap();
        let k = item.key;
        if k.ty == BTRFS_EXTENT_ITEM_KEY
            && img
                .chunks
                .lookup(k.objectid)
                .is_some_and(|m| m.type_flags & BTRFS_BLOCK_GROUP_DATA != 0)
        {
            first = Some(k.objectid);
            break;
        }
    }
    drop(it);
    let bytenr = first.expect("a data extent");
    let m = img.chunks.lookup(bytenr).unwrap().clone();
    let off = bytenr - m.logical;
    let nd = (m.stripes.len() - m.nparity()) as u64;
    let row = off / m.stripe_len / nd;
    let sector = off % m.stripe_len / img.sectorsize as u64;
    let n = m.stripes.len() as u64;
    let nd = n - m.nparity() as u64;
    (0..m.nparity() as u64)
        .map(|w| {
            let (devid, phys) = m.stripes[((row + nd + w) % n) as usize];
            (
                (devid - 1) as usize,
                phys + row * m.stripe_len + sector * img.sectorsize as u64,
            )
        })
        .collect()
}

#[test]
fn damaged_parity_is_named() {
    skip_unless!(require_kernel_mount());
    for (n, args) in [
        (3, &["-d", "raid5", "-m", "raid5"][..]),
        (4, &["-d", "raid6", "-m", "raid6"][..]),
    ] {
        let set = KernelSet::new(n, args);
        let all: Vec<&Path> = set.paths.iter().map(PathBuf::as_path).collect();
        // The data chunk's first rows hold the first files written.
        let at = parity_of_first_extent(&set.paths);
        for (w, &(dev, phys)) in at.iter().enumerate() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&set.paths[dev])
                .unwrap();
            use std::os::unix::fs::FileExt;
            f.write_all_at(b"damaged parity", phys + 100 + w as u64 * 4096)
                .unwrap();
        }
        let (code, r, err) = fsck(&all, &["--check-mirrors", "--check-data-csum"]);
        assert_eq!(code, 4, "{args:?}: {err}");
        let f = findings(&r);
        let parity: Vec<&(String, String, String)> = f.iter().filter(|f| f.1 == "parity").collect();
        assert_eq!(parity.len(), at.len(), "{args:?}: {f:?}");
        for (w, (p, &(dev, phys))) in parity.iter().zip(&at).enumerate() {
            let name = if w == 0 { "P" } else { "Q" };
            let want = format!(
                "{name} at physical {} on devid {}",
                phys + w as u64 * 4096,
                dev + 1
            );
            assert!(
                p.2.contains(&want) && p.2.contains("the parity is wrong"),
                "{args:?}: {} lacks {want}",
                p.2
            );
        }
        assert_eq!(f.len(), parity.len(), "only the parity is reported: {f:?}");
    }
}

#[test]
fn btrkit_mkfs_sets_pass_the_kernels_scrub() {
    skip_unless!(require_kernel_mount());
    let src = tempfile::tempdir().unwrap();
    write_files(src.path());
    for (n, args, lose) in [
        (3, &["-d", "raid5", "-m", "raid5"][..], &[0usize][..]),
        (4, &["-d", "raid6", "-m", "raid6"][..], &[1, 3][..]),
        (6, &["-d", "raid6", "-m", "raid5"][..], &[5][..]),
    ] {
        let t = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (1..=n)
            .map(|i| t.path().join(format!("m{i}.img")))
            .collect();
        for p in &paths {
            std::fs::File::create(p)
                .unwrap()
                .set_len(256 << 20)
                .unwrap();
        }
        must_run(
            Command::new(bin_path("btrkit-mkfs"))
                .arg("-q")
                .args(args)
                .arg("--rootdir")
                .arg(src.path())
                .args(&paths),
        );
        // The RAID56 feature, as mkfs.btrfs sets it.
        let img = DeviceSet::open_paths(&paths, OpenOptions::default()).unwrap();
        assert!(
            img.sb
                .has_incompat(btrkit_core::format::consts::BTRFS_FEATURE_INCOMPAT_RAID56),
            "{args:?}"
        );
        drop(img);
        oracle::check_set_clean(&paths).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let (code, r, err) = fsck(&refs, &["--check-mirrors", "--check-data-csum"]);
        assert_eq!(code, 0, "{args:?}: {err} {:?}", findings(&r));
        assert!(findings(&r).is_empty(), "{args:?}: {:?}", findings(&r));
        // The kernel reads what we wrote, writes more, and scrubs.
        let want = kcrash::manifest_of_tree(src.path()).unwrap();
        let m = LoopMount::new(&paths[0], &device_opts(&paths)).unwrap();
        let got = kcrash::manifest_of_tree(m.path()).unwrap();
        let strip = |x: &kcrash::Manifest| sets::without_host_fields(x, true);
        assert!(
            strip(&got) == strip(&want),
            "{args:?}: {}",
            strip(&want).short_diff(&strip(&got), 8)
        );
        std::fs::create_dir(m.path().join("more")).unwrap();
        write_files(&m.path().join("more"));
        must_run(&mut Command::new("sync"));
        let o = Command::new("btrfs")
            .args(["scrub", "start", "-B"])
            .arg(m.path())
            .output()
            .unwrap();
        let text =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && text.contains("no errors found"),
            "{args:?}: kernel scrub: {text}"
        );
        drop(m);
        let (code, r, err) = fsck(&refs, &["--check-mirrors", "--check-data-csum"]);
        assert_eq!(
            code,
            0,
            "{args:?} after the kernel: {err} {:?}",
            findings(&r)
        );
        assert!(findings(&r).is_empty(), "{args:?}: {:?}", findings(&r));
        oracle::check_set_clean(&paths)
            .unwrap_or_else(|e| panic!("{args:?} after the kernel: {e}"));
        // Devices lost: every file the kernel shows, rebuilt from parity.
        let want = sets::manifest(&paths, "ro").unwrap();
        let rest: Vec<PathBuf> = paths
            .iter()
            .enumerate()
            .filter(|(i, _)| !lose.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        sets::read_paths_match_with(&rest, &want, t.path(), &["--degraded"])
            .unwrap_or_else(|e| panic!("{args:?} without {lose:?}: {e}"));
    }
}
