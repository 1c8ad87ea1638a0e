//! `btrkit balance start`, `btrkit filesystem resize` and `btrkit
//! inspect-internal min-dev-size` against the kernel and btrfs-progs:
//! - a full balance of a kernel-made image full of shared extents
//!   (snapshots of 12,000 files, reflinks, compressed and preallocated
//!   extents) moves every block group and keeps every file, every xattr and
//!   all sharing (the same subvolume tree bytes, the same shared bytes),
//!   btrfs check 6.2 and 6.14 clean, the kernel writes to it after;
//! - filters choose the groups the kernel's balance chooses;
//! - conversions on a device set: the profiles and used bytes the kernel's
//!   conversion gives, through single, raid1, raid10, raid6, raid1c3 and back;
//! - min-dev-size as btrfs-progs says, and a shrink to it as the kernel's;
//!   grow extends the image;
//! - a cut at every write (a sample) of a shrink and of a balance leaves
//!   the old state or a rerun finishes, and so does one of a conversion
//!   that adds copies in place.

use btrkit_core::check::{check_image, CheckOptions, NoProgress};
use btrkit_core::devices::{Access, Devices, Single};
use btrkit_core::format::consts::*;
use btrkit_core::image::OpenOptions;
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::util::prng::Prng;
use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::rich::{build_rich, RichOpts};
use btrkit_tests::sets::{device_opts, extents_of, write_files};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, env, kcrash, skip_unless, MkfsOpts};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Block groups of the filesystem on `devs`: start -> (flags, used).
fn groups(devs: &[PathBuf]) -> BTreeMap<u64, (u64, u64)> {
    let d = Devices::open_paths(devs, Access::default()).unwrap();
    let o = d.open(OpenOptions::default(), Single::AsSet).unwrap();
    let st = btrkit_core::trans::Store::from_image(o.img).unwrap();
    st.block_groups()
        .map(|g| (g.start, (g.flags, g.used)))
        .collect()
}

/// Used bytes by type and profile ("DATA|RAID1" -> bytes).
fn used_by_profile(devs: &[PathBuf]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (_, (flags, used)) in groups(devs) {
        *m.entry(btrkit_core::format::names::block_group_flags_str(flags))
            .or_insert(0) += used;
    }
    m
}

/// Used data bytes.
fn data_used(devs: &[PathBuf]) -> u64 {
    groups(devs)
        .values()
        .filter(|(f, _)| f & BTRFS_BLOCK_GROUP_DATA != 0)
        .map(|(_, u)| u)
        .sum()
}

/// `btrfs check` clean by 6.2 and, when installed, 6.14; returns 6.2's
/// "total fs tree bytes" (subvolume trees' bytes: sharing kept keeps it).
fn checked(devs: &[PathBuf], what: &str) -> u64 {
    let v = oracle::btrfs_check(devs, Progs::Distro).unwrap();
    assert!(v.clean, "{what}: btrfs check 6.2:\n{}", v.output);
    if env::require_progs_new() {
        let v = oracle::btrfs_check(devs, Progs::New).unwrap();
        assert!(v.clean, "{what}: btrfs check 6.14:\n{}", v.output);
    }
    v.output
        .lines()
        .find_map(|l| l.strip_prefix("total fs tree bytes: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{what}: no fs tree bytes in\n{}", v.output))
}

/// What the kernel shows of the set (read-only mount): every path's
/// type, mode, size, data and xattrs; and every file's extents as
/// `filefrag -v` shows them without their addresses (logical range,
/// length, flags: shared or not, encoded, unwritten). `btrfs filesystem
/// du`'s set-shared bytes depend on addresses (a compressed extent's
/// range there is its logical length), so extents are compared instead.
fn kernel_view(devs: &[PathBuf]) -> (String, Vec<String>) {
    let m = LoopMount::new(&devs[0], &format!("ro{}", device_opts(devs))).unwrap();
    let man = kcrash::manifest_of_tree(m.path()).unwrap().render();
    let frag = extents_of(m.path());
    drop(m);
    (man, frag)
}

/// Whether two extent lists agree; the first differences otherwise.
fn same_extents(a: &[String], b: &[String]) -> Result<(), String> {
    if a == b {
        return Ok(());
    }
    let mut out = vec![format!("{} lines against {}", a.len(), b.len())];
    let mut file = String::new();
    for (x, y) in a.iter().zip(b) {
        if x.starts_with("File size") {
            file = x.clone();
        }
        if x != y {
            out.push(format!("{file}\n  - {x}\n  + {y}"));
            if out.len() >= 6 {
                break;
            }
        }
    }
    Err(out.join("\n"))
}

/// mkfs.btrfs `extra` over image files of `size` bytes each.
fn mkfs_sized(images: &[&Path], size: u64, extra: &[&str]) {
    for img in images {
        std::fs::File::create(img).unwrap().set_len(size).unwrap();
    }
    must_run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .args(extra)
            .args(images),
    );
}

fn btrkit(args: &[&str], devs: &[PathBuf]) -> String {
    let o = must_run(Command::new(bin_path("btrkit")).args(args).args(devs));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn btrkit_fails(args: &[&str], devs: &[PathBuf]) -> String {
    let o = Command::new(bin_path("btrkit"))
        .args(args)
        .args(devs)
        .output()
        .unwrap();
    assert!(!o.status.success(), "btrkit {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The kernel runs `btrfs ARGS MOUNTPOINT` on a read-write mount of the set.
fn kernel_btrfs(devs: &[PathBuf], args: &[&str]) {
    let m = LoopMount::new(&devs[0], device_opts(devs).trim_start_matches(',')).unwrap();
    must_run(Command::new("btrfs").args(args).arg(m.path()));
    drop(m);
}

fn copy(devs: &[PathBuf], dir: &Path, prefix: &str) -> Vec<PathBuf> {
    btrkit_tests::sets::copy_set(devs, dir, prefix).unwrap()
}

/// The kernel mounts the set read-write, writes and removes files, and
/// btrfs check finds it clean after.
fn kernel_writes(devs: &[PathBuf], what: &str) {
    let m = LoopMount::new(&devs[0], device_opts(devs).trim_start_matches(',')).unwrap();
    std::fs::create_dir(m.path().join("after")).unwrap();
    write_files(&m.path().join("after"));
    must_run(&mut Command::new("sync"));
    drop(m);
    checked(devs, &format!("{what}, then written by the kernel"));
}

#[test]
fn full_balance_keeps_every_file_and_all_sharing() {
    skip_unless!(env::require_kernel_mount());
    let k = build_rich(&RichOpts::default());
    let t = tempfile::tempdir().unwrap();
    let ours = copy(&[k.image().to_path_buf()], t.path(), "ours");
    let theirs = copy(&[k.image().to_path_buf()], t.path(), "kernel");
    let before_groups = groups(&ours);
    let tree_bytes = checked(&ours, "before");
    let (man, du) = kernel_view(&ours);
    let data = data_used(&ours);

    let out = btrkit(&["balance", "start", "--json"], &ours);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        r["relocated"].as_u64(),
        Some(before_groups.len() as u64),
        "{out}"
    );
    assert!(r["data_extents"].as_u64().unwrap() > 1000, "{out}");
    let after = groups(&ours);
    assert!(
        after.keys().all(|s| !before_groups.contains_key(s)),
        "a block group stayed where it was: {before_groups:?} -> {after:?}"
    );
    assert_eq!(
        checked(&ours, "after btrkit's balance"),
        tree_bytes,
        "subvolume trees lost sharing"
    );
    let (man2, du2) = kernel_view(&ours);
    assert!(man == man2, "files differ after the balance");
    same_extents(&du, &du2).unwrap_or_else(|e| panic!("extents after the balance: {e}"));
    assert_eq!(data_used(&ours), data);

    // The kernel's own full balance of the same image: the same profiles
    // and data bytes.
    kernel_btrfs(&theirs, &["balance", "start", "--full-balance"]);
    let kp: Vec<String> = used_by_profile(&theirs).into_keys().collect();
    let op: Vec<String> = used_by_profile(&ours).into_keys().collect();
    assert_eq!(op, kp);
    assert_eq!(data_used(&theirs), data_used(&ours));
    kernel_writes(&ours, "after btrkit's balance");
}

/// An image whose groups are used unevenly: files written, half deleted.
fn fragmented(dir: &Path) -> Vec<PathBuf> {
    let img = dir.join("frag.img");
    mkfs_sized(&[&img], 2 << 30, &["-d", "single", "-m", "dup"]);
    let m = LoopMount::new(&img, "").unwrap();
    let mut g = Prng::new(77);
    for i in 0..300u64 {
        let len = 64 * 1024 + g.below(3 << 20) as usize;
        let mut d = vec![0u8; len];
        g.fill(&mut d);
        std::fs::write(m.path().join(format!("f{i}")), d).unwrap();
        if i % 50 == 49 {
            must_run(&mut Command::new("sync"));
        }
    }
    must_run(&mut Command::new("sync"));
    for i in 0..300u64 {
        if g.below(3) != 0 && i < 200 {
            std::fs::remove_file(m.path().join(format!("f{i}"))).unwrap();
        }
    }
    drop(m);
    vec![img]
}

#[test]
fn filters_choose_the_groups_the_kernel_chooses() {
    skip_unless!(env::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let base = fragmented(t.path());
    let orig = groups(&base);
    let data_groups: Vec<u64> = orig
        .iter()
        .filter(|(_, (f, _))| f & BTRFS_BLOCK_GROUP_DATA != 0)
        .map(|(s, _)| *s)
        .collect();
    assert!(data_groups.len() >= 4, "{orig:?}");
    let mid = data_groups[data_groups.len() / 2];
    // A group's usage when the balance reaches it depends on where the
    // groups before it moved to, which btrkit places as the kernel does
    // only in part: the cases are ones where that cannot change a choice
    // (a usage range limited to the first group it takes, for one).
    let cases: Vec<Vec<String>> = vec![
        vec!["-dusage=50".into()],
        vec!["-dusage=20..80,limit=1".into()],
        vec!["-dlimit=2".into()],
        vec!["-dusage=90,limit=3".into()],
        vec![format!("-dvrange={mid}..{}", mid + 1)],
        vec!["-ddevid=1,drange=0..600000000".into()],
        vec!["-musage=90".into()],
        vec!["-dprofiles=single,usage=60".into()],
    ];
    for (i, args) in cases.iter().enumerate() {
        let ours = copy(&base, t.path(), &format!("o{i}-"));
        let theirs = copy(&base, t.path(), &format!("k{i}-"));
        let mut a: Vec<&str> = vec!["balance", "start"];
        a.extend(args.iter().map(String::as_str));
        btrkit(&a, &ours);
        let mut ka: Vec<&str> = vec!["balance", "start"];
        ka.extend(args.iter().map(String::as_str));
        kernel_btrfs(&theirs, &ka);
        // The original groups that are gone: those the balance relocated.
        let gone = |d: &[PathBuf]| -> Vec<u64> {
            let now = groups(d);
            orig.keys()
                .filter(|s| !now.contains_key(s))
                .copied()
                .collect()
        };
        assert_eq!(
            gone(&ours),
            gone(&theirs),
            "balance {args:?}: groups relocated"
        );
        assert_eq!(data_used(&ours), data_used(&theirs), "balance {args:?}");
        checked(&ours, &format!("balance {args:?}"));
        for p in ours.iter().chain(&theirs) {
            std::fs::remove_file(p).unwrap();
        }
    }
    let err = btrkit_fails(&["balance", "start", "-dsoft"], &base);
    assert!(err.contains("soft"), "{err}");
    let err = btrkit_fails(&["balance", "start", "-s"], &base);
    assert!(err.contains("--force"), "{err}");
    let err = btrkit_fails(&["balance", "start", "-dconvert=raid1"], &base);
    assert!(err.contains("devices"), "{err}");
    let err = btrkit_fails(&["balance", "start", "-mconvert=single"], &base);
    assert!(err.contains("--force"), "{err}");
    assert_eq!(groups(&base), orig, "a refusal changed the image");
}

#[test]
fn conversions_on_a_set_as_the_kernel() {
    skip_unless!(env::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (1..=4)
        .map(|i| t.path().join(format!("d{i}.img")))
        .collect();
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    mkfs_sized(&refs, 2 << 30, &["-d", "single", "-m", "raid1"]);
    {
        let m = LoopMount::new(&paths[0], device_opts(&paths).trim_start_matches(',')).unwrap();
        write_files(m.path());
        must_run(
            Command::new("btrfs")
                .args(["subvolume", "snapshot"])
                .arg(m.path())
                .arg(m.path().join("snap")),
        );
        std::fs::write(m.path().join("dir0/f0"), b"changed after the snapshot").unwrap();
        must_run(
            Command::new("cp")
                .arg("--reflink=always")
                .arg(m.path().join("dir1/f3"))
                .arg(m.path().join("clone")),
        );
    }
    let (man, du) = kernel_view(&paths);
    let steps: [&[&str]; 5] = [
        &["-dconvert=raid1", "-mconvert=raid10"],
        &["-dconvert=raid10", "-mconvert=raid1c3"],
        &["-dconvert=raid6", "-mconvert=raid6"],
        &["-dconvert=raid5,soft", "-mconvert=raid1"],
        &["-dconvert=single", "-mconvert=raid1c4"],
    ];
    let mut ours = paths.clone();
    for (i, step) in steps.iter().enumerate() {
        let theirs = copy(&ours, t.path(), &format!("k{i}-"));
        let mut a = vec!["balance", "start"];
        a.extend_from_slice(step);
        btrkit(&a, &ours);
        kernel_btrfs(&theirs, &a);
        let (o, k) = (used_by_profile(&ours), used_by_profile(&theirs));
        assert_eq!(
            o.keys().collect::<Vec<_>>(),
            k.keys().collect::<Vec<_>>(),
            "step {step:?}: profiles"
        );
        assert_eq!(data_used(&ours), data_used(&theirs), "step {step:?}");
        checked(&ours, &format!("after {step:?}"));
        let (m2, du2) = kernel_view(&ours);
        assert!(man == m2, "step {step:?}: files differ");
        same_extents(&du, &du2).unwrap_or_else(|e| panic!("step {step:?}: extents: {e}"));
        for p in &theirs {
            std::fs::remove_file(p).unwrap();
        }
        let next = copy(&ours, t.path(), &format!("o{i}-"));
        ours = next;
    }
    kernel_writes(&ours, "after the conversions");
}

#[test]
fn shrink_to_the_minimum_and_grow_as_the_kernel() {
    skip_unless!(env::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let k = build_rich(&RichOpts {
        mkfs: MkfsOpts::default().size(2 << 30).nodesize(4096),
        many_files: 4000,
        ..Default::default()
    });
    // Spread: data past the middle of the device.
    let img = copy(&[k.image().to_path_buf()], t.path(), "base");
    {
        let m = LoopMount::new(&img[0], "").unwrap();
        let mut g = Prng::new(5);
        for i in 0..40 {
            let mut d = vec![0u8; 8 << 20];
            g.fill(&mut d);
            std::fs::write(m.path().join(format!("big{i}")), d).unwrap();
        }
        must_run(&mut Command::new("sync"));
        for i in 0..30 {
            std::fs::remove_file(m.path().join(format!("big{i}"))).unwrap();
        }
    }
    let ours = copy(&img, t.path(), "ours");
    let theirs = copy(&img, t.path(), "kernel");
    let (man, du) = kernel_view(&ours);
    let tree_bytes = checked(&ours, "before");

    // min-dev-size as btrfs-progs says on the kernel's mount.
    let want = {
        let m = LoopMount::new(&theirs[0], "ro").unwrap();
        let o = must_run(
            Command::new("btrfs")
                .args(["inspect-internal", "min-dev-size"])
                .arg(m.path()),
        );
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let got: serde_json::Value = serde_json::from_str(&btrkit(
        &["inspect-internal", "min-dev-size", "--json"],
        &ours,
    ))
    .unwrap();
    assert_eq!(got["min_size"].as_u64(), Some(want));

    let size = want.div_ceil(1 << 20) << 20;
    let spec = format!("{}", size);
    btrkit(&["filesystem", "resize", &spec], &ours);
    kernel_btrfs(&theirs, &["filesystem", "resize", &spec]);
    assert_eq!(
        std::fs::metadata(&ours[0]).unwrap().len(),
        size,
        "the image file is cut"
    );
    let sb = btrkit_tests::kimage::superblock_of(&ours[0]);
    let ksb = btrkit_tests::kimage::superblock_of(&theirs[0]);
    assert_eq!(sb.total_bytes.get(), ksb.total_bytes.get());
    assert_eq!(
        sb.dev_item.total_bytes.get(),
        ksb.dev_item.total_bytes.get()
    );
    assert_eq!(
        checked(&ours, "shrunk"),
        tree_bytes,
        "subvolume trees lost sharing"
    );
    assert_eq!(data_used(&ours), data_used(&theirs));
    let (m2, du2) = kernel_view(&ours);
    assert!(man == m2, "files differ after the shrink");
    same_extents(&du, &du2).unwrap_or_else(|e| panic!("extents after the shrink: {e}"));
    // Below the minimum of what is there: refused or NoSpace, the image
    // consistent either way.
    let tiny = btrkit_fails(&["filesystem", "resize", "100m"], &ours);
    assert!(tiny.contains("smallest"), "{tiny}");

    btrkit(&["filesystem", "resize", "+1g"], &ours);
    kernel_btrfs(&theirs, &["filesystem", "resize", "+1g"]);
    assert_eq!(std::fs::metadata(&ours[0]).unwrap().len(), size + (1 << 30));
    let sb = btrkit_tests::kimage::superblock_of(&ours[0]);
    let ksb = btrkit_tests::kimage::superblock_of(&theirs[0]);
    assert_eq!(sb.total_bytes.get(), ksb.total_bytes.get());
    assert_eq!(
        sb.dev_item.total_bytes.get(),
        ksb.dev_item.total_bytes.get()
    );
    checked(&ours, "grown");
    kernel_writes(&ours, "shrunk and grown");
    // A mounted image is refused.
    let m = LoopMount::new(&ours[0], "ro").unwrap();
    let err = btrkit_fails(&["filesystem", "resize", "-10m"], &ours);
    assert!(err.contains("in use"), "{err}");
    drop(m);
}

/// The engine's view of a filesystem on a device (every path, data
/// included), for the cut tests.
fn engine_manifest(dev: Arc<dyn BlockDevice>) -> Option<String> {
    let script = btrkit_core::workload::script::Script::parse("cut", "").ok()?;
    let mut s = btrkit_core::workload::session::Session::on_device(dev, &script).ok()?;
    s.manifest().ok().map(|m| m.render())
}

fn clean(dev: &Arc<dyn BlockDevice>) -> bool {
    let opts = OpenOptions {
        lenient: true,
        ..OpenOptions::default()
    };
    Devices::new(vec![("d".into(), dev.clone())])
        .open(opts, Single::AsSet)
        .is_ok_and(|o| check_image(&o.img, CheckOptions::own_writes(), &NoProgress).is_clean())
}

/// Run `op` on a fresh mount of `dev`.
fn run_op(dev: Arc<dyn BlockDevice>, op: &str) -> btrkit_core::Result<()> {
    let mut fs = btrkit_core::log::replay::mount_devices(
        vec![("d".into(), dev)],
        btrkit_core::fs::MountOptions::default(),
        false,
    )?;
    if let Some(size) = op.strip_prefix("shrink ") {
        let n: u64 = size.parse().unwrap();
        btrkit_core::resize::resize(&mut fs.store, 1, n, &mut |_, _| {})?;
    } else {
        let req = btrkit_core::balance::parse_args(&[op])?.normalize()?;
        btrkit_core::balance::on_filesystem(&mut fs, &req)?;
    }
    fs.sync()
}

#[test]
fn a_cut_at_any_write_leaves_the_old_state_or_a_rerun_finishes() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("cut.img");
    let script = t.path().join("s.scn");
    std::fs::write(
        &script,
        "fssize 512M\nmkdir /d\nwritefiles /d 400 100-40000\nwrite /big 0 6M random:3\nsync\n\
         snapshot / /snap\nwrite /d/f00007 0 9000 random:4\nclone /big 0 /rl 0 1M\n\
         fallocate /pre 0 256K\nsetxattr /big user.k v\nwrite /late 0 30M random:5\nsync\nunlink /late\nsync\n",
    )
    .unwrap();
    must_run(
        Command::new(bin_path("btrkit-shell"))
            .arg("-q")
            .arg(&img)
            .arg(&script),
    );
    let base = Arc::new(std::fs::read(&img).unwrap());
    let want = engine_manifest(Arc::new(CrashDevice::from_shared(base.clone()))).unwrap();
    for op in ["shrink 268435456", "-d", "-dconvert=dup"] {
        let whole = Arc::new(CrashDevice::from_shared(base.clone()));
        run_op(whole.clone(), op).unwrap_or_else(|e| panic!("{op}: {e}"));
        let writes = whole.writes();
        assert!(writes > 8, "{op}: {writes} writes");
        let done: Arc<dyn BlockDevice> = whole.clone();
        assert!(clean(&done), "{op}: not clean");
        assert_eq!(
            engine_manifest(done).as_deref(),
            Some(want.as_str()),
            "{op}"
        );
        let mut g = Prng::new(0xc07);
        let mut cuts: Vec<u64> = (0..10).map(|_| g.below(writes)).collect();
        cuts.extend([0, 1, writes - 1]);
        cuts.sort_unstable();
        cuts.dedup();
        for cut in cuts {
            let d = Arc::new(CrashDevice::from_shared(base.clone()));
            d.fail_after_writes(Some(cut));
            assert!(
                run_op(d.clone(), op).is_err(),
                "{op}: cut at {cut} went unnoticed"
            );
            for variant in 0..3 {
                let s = g.next_u64();
                let crashed: Arc<dyn BlockDevice> = Arc::new(match variant {
                    0 => d.crash_device(|_| false),
                    1 => d.crash_device(|_| true),
                    _ => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
                });
                assert!(
                    clean(&crashed),
                    "{op}: cut at write {cut} (variant {variant}): not clean"
                );
                assert_eq!(
                    engine_manifest(crashed.clone()).as_deref(),
                    Some(want.as_str()),
                    "{op}: cut at write {cut} (variant {variant}): files differ"
                );
                if variant == 2 {
                    run_op(crashed.clone(), op)
                        .unwrap_or_else(|e| panic!("{op}: rerun after cut {cut}: {e}"));
                    assert!(clean(&crashed), "{op}: rerun after cut {cut}: not clean");
                    assert_eq!(engine_manifest(crashed).as_deref(), Some(want.as_str()));
                }
            }
        }
    }
}
