//! `btrkit-tune`'s feature conversions on images mkfs.btrfs 6.2 made with
//! the feature off and the kernel filled (files inline and not, a sparse
//! file, a subvolume and its snapshot):
//! - against btrfstune 6.14 where it has the option (-n, -r, -x,
//!   --convert-to/from-block-group-tree, --convert-to-free-space-tree,
//!   --enable/--remove-simple-quota): the same feature flags, superblock
//!   flags and cache generation in dump-super; both `btrfs check` 6.2 and
//!   6.14 clean (6.14 only where 6.2 does not know the feature); the
//!   kernel mounts ours and reads every file back equal;
//! - -x: the extent tree holds no EXTENT_ITEM of a tree block after;
//! - full quotas: the kernel's own `quota enable` + rescan on a copy gives
//!   the same qgroup counters;
//! - a cut at every write of a conversion (a sample where there are many;
//!   unflushed writes kept, lost, a random subset, torn): the image checks
//!   clean with the engine's checker in the old state or the new one,
//!   the kernel mounts a sample and reads every file;
//! - an image left by an interrupted btrfstune (CHANGING_BG_TREE, items in
//!   both trees) is finished in either direction;
//! - refusals write nothing: block group tree without free space tree, a
//!   log to replay, simple quotas over full ones and back, an empty or
//!   conflicting request.

use btrkit_core::check::findings::Severity;
use btrkit_core::check::{CheckOptions, NoProgress};
use btrkit_core::format::consts::*;
use btrkit_core::format::key::Key;
use btrkit_core::format::superblock::Superblock;
use btrkit_core::image::read_superblock;
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::trans::{Store, TreeId};
use btrkit_core::tune::{tune_devices, Outcome, QuotaChange, Request};
use btrkit_core::util::prng::Prng;
use btrkit_tests::oracle::{btrfs_check, Progs};
use btrkit_tests::{env, skip_unless, LoopMount};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

type Manifest = BTreeMap<String, Vec<u8>>;

fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn must(cmd: &mut Command) -> String {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn progs_new(tool: &str) -> PathBuf {
    env::progs_new_dir().expect("btrfs-progs 6.14").join(tool)
}

/// Deterministic bytes for file `n` of `len` bytes.
fn pattern(n: u64, len: usize) -> Vec<u8> {
    let mut p = Prng::new(0x5eed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        let x = p.next_u64().to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

/// Files through the kernel: small (inline) and larger ones in three
/// directories, a sparse file, a subvolume with files and its snapshot
/// with one more file.
fn fill(mnt: &Path, big: usize) {
    for d in 0..3 {
        std::fs::create_dir_all(mnt.join(format!("d{d}"))).unwrap();
    }
    for i in 0..60u64 {
        let len = [100usize, 3000, 70_000, 300_000][i as usize % 4];
        std::fs::write(mnt.join(format!("d{}/f{i}", i % 3)), pattern(i, len)).unwrap();
    }
    std::fs::write(mnt.join("big"), pattern(1000, big)).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(mnt.join("sparse")).unwrap();
        f.write_all_at(&pattern(1001, 8192), 0).unwrap();
        f.write_all_at(&pattern(1002, 8192), 1 << 20).unwrap();
    }
    must(Command::new("sync").arg("-f").arg(mnt));
    must(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(mnt.join("sv")),
    );
    for i in 0..10u64 {
        std::fs::write(mnt.join(format!("sv/g{i}")), pattern(2000 + i, 20_000)).unwrap();
    }
    must(
        Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(mnt.join("sv"))
            .arg(mnt.join("snap")),
    );
    std::fs::write(mnt.join("snap/new"), pattern(3000, 50_000)).unwrap();
    std::fs::write(mnt.join("sv/g0"), pattern(3001, 10_000)).unwrap();
    must(Command::new("sync").arg("-f").arg(mnt));
}

/// Every regular file under `root`, by path.
fn manifest(root: &Path) -> Manifest {
    let mut out = Manifest::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

/// An image made by mkfs.btrfs 6.2 with `mkfs` arguments on a sparse file
/// of `size` bytes, filled through a kernel mount with `opts`; with what
/// the kernel reads back from it.
struct Base {
    dir: tempfile::TempDir,
    path: PathBuf,
    files: Manifest,
}

impl Base {
    fn new(size: u64, mkfs: &[&str], opts: &str) -> Base {
        let dir = tempfile::Builder::new()
            .prefix("btrkit-tunef-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("base.img");
        btrkit_tests::fixtures::mkfs_btrfs(&path, size, mkfs).expect("mkfs.btrfs");
        let m = LoopMount::new(&path, opts).expect("mount");
        fill(m.path(), 8 << 20);
        let files = manifest(m.path());
        m.unmount().expect("unmount");
        Base { dir, path, files }
    }

    /// A copy of the image named `name`.
    fn copy(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        must(
            Command::new("cp")
                .arg("--sparse=always")
                .arg(&self.path)
                .arg(&p),
        );
        p
    }
}

fn copy_of(src: &Path, name: &str) -> PathBuf {
    let p = src.with_file_name(name);
    must(Command::new("cp").arg("--sparse=always").arg(src).arg(&p));
    p
}

/// btrkit-tune ARGS IMAGE: (exit code, stdout, stderr).
fn ours(img: &Path, args: &[&str]) -> (i32, String, String) {
    let o = run(Command::new(btrkit_tests::bin_path("btrkit-tune"))
        .args(args)
        .arg(img));
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ours_ok(img: &Path, args: &[&str]) -> String {
    let (c, out, err) = ours(img, args);
    assert_eq!(c, 0, "btrkit-tune {args:?}: {out}{err}");
    out
}

fn progs_tune(img: &Path, args: &[&str]) {
    must(Command::new(progs_new("btrfstune")).args(args).arg(img));
}

/// The superblock fields a feature change touches, as dump-super 6.14
/// prints them (flag names included).
fn super_flags(img: &Path) -> String {
    let out = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-super"])
            .arg(img),
    );
    let mut keep = Vec::new();
    let mut in_flags = false;
    for l in out.lines() {
        let head = l.split_whitespace().next().unwrap_or("");
        if matches!(
            head,
            "flags" | "compat_flags" | "compat_ro_flags" | "incompat_flags" | "cache_generation"
        ) {
            keep.push(l.to_string());
            in_flags = head != "cache_generation";
        } else if in_flags && l.starts_with(char::is_whitespace) {
            keep.push(l.to_string());
        } else {
            in_flags = false;
        }
    }
    keep.join("\n")
}

fn assert_checks(img: &Path, distro: bool, what: &str) {
    let mut which = vec![Progs::New];
    if distro {
        which.push(Progs::Distro);
    }
    for p in which {
        let v = btrfs_check(&[img], p).unwrap_or_else(|e| panic!("{what}: {e}"));
        v.require_clean()
            .unwrap_or_else(|e| panic!("{what}: {} not clean: {e}", p.name()));
    }
}

/// The errors the engine's checker finds on `dev`, one line each
/// (warnings, such as a superblock mirror one generation behind after a
/// cut between the copies, leave an image clean).
fn ours_findings(dev: Arc<dyn BlockDevice>) -> Result<Vec<String>, String> {
    let r = btrkit_core::check::check_device(dev, CheckOptions::own_writes(), &NoProgress)
        .map_err(|e| e.to_string())?;
    Ok(r.findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| format!("{:?}: {}", f.category, f.message))
        .collect())
}

/// The engine's checker finds nothing on `dev` but what `allowed` holds
/// (what it found on the image before the conversion).
fn ours_clean(dev: Arc<dyn BlockDevice>, allowed: &[String]) -> Result<(), String> {
    let new: Vec<String> = ours_findings(dev)?
        .into_iter()
        .filter(|f| !allowed.contains(f))
        .collect();
    if new.is_empty() {
        Ok(())
    } else {
        Err(format!("{new:#?}"))
    }
}

/// Mount `img` with the kernel and compare every file with `want`.
fn kernel_reads(img: &Path, want: &Manifest, what: &str) {
    let m = LoopMount::new(img, "").unwrap_or_else(|e| panic!("{what}: kernel mount: {e}"));
    let got = manifest(m.path());
    m.unmount().unwrap();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: the kernel lists other files"
    );
    for (k, v) in want {
        assert!(got[k] == *v, "{what}: {k} reads back different");
    }
}

/// The conversion by both tools on copies of `base`: same superblock
/// flags, both checked clean, ours read back by the kernel. Returns
/// (ours, btrfstune's).
fn against_btrfstune(base: &Base, args: &[&str], distro_check: bool) -> (PathBuf, PathBuf) {
    let a = base.copy("ours.img");
    let b = base.copy("progs.img");
    ours_ok(&a, args);
    progs_tune(&b, args);
    assert_eq!(
        super_flags(&a),
        super_flags(&b),
        "{args:?}: superblock flags"
    );
    assert_ne!(
        super_flags(&a),
        super_flags(&base.path),
        "{args:?}: nothing changed"
    );
    assert_checks(&a, distro_check, &format!("{args:?} ours"));
    assert_checks(&b, distro_check, &format!("{args:?} btrfstune"));
    kernel_reads(&a, &base.files, &format!("{args:?}"));
    // Asked again: nothing to do, nothing written.
    let before = std::fs::read(&a).unwrap();
    let out = ours_ok(&a, args);
    assert!(out.contains("already"), "{args:?} again: {out}");
    assert!(std::fs::read(&a).unwrap() == before, "{args:?} again wrote");
    (a, b)
}

fn oracles() -> bool {
    env::require_kernel_mount() && env::require_btrfs_progs() && env::require_progs_new()
}

#[test]
fn no_holes_like_btrfstune() {
    skip_unless!(oracles());
    let base = Base::new(512 << 20, &["-O", "^no-holes"], "");
    against_btrfstune(&base, &["-n"], true);
}

#[test]
fn extref_like_btrfstune() {
    skip_unless!(oracles());
    let base = Base::new(512 << 20, &["-O", "^extref"], "");
    against_btrfstune(&base, &["-r"], true);
}

/// Tree block extent items in the extent tree of `img`: (EXTENT_ITEM,
/// METADATA_ITEM) counts, from dump-tree 6.14.
fn tree_block_items(img: &Path) -> (usize, usize) {
    let out = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-tree", "-t", "extent"])
            .arg(img),
    );
    let lines: Vec<&str> = out.lines().collect();
    let (mut fat, mut skinny) = (0, 0);
    for (i, l) in lines.iter().enumerate() {
        if l.contains(" METADATA_ITEM ") {
            skinny += 1;
        } else if l.contains(" EXTENT_ITEM ")
            && lines.get(i + 1).is_some_and(|n| n.contains("TREE_BLOCK"))
        {
            fat += 1;
        }
    }
    (fat, skinny)
}

#[test]
fn skinny_metadata_like_btrfstune() {
    skip_unless!(oracles());
    let base = Base::new(512 << 20, &["-O", "^skinny-metadata", "-n", "4096"], "");
    let (fat, _) = tree_block_items(&base.path);
    assert!(fat > 20, "only {fat} fat tree block items to convert");
    let (a, _) = against_btrfstune(&base, &["-x"], true);
    let (fat, skinny) = tree_block_items(&a);
    assert_eq!(fat, 0, "EXTENT_ITEMs of tree blocks left");
    assert!(skinny > 20);
}

#[test]
fn free_space_tree_from_v1_cache_like_btrfstune() {
    skip_unless!(oracles());
    // 2 GiB: the kernel writes a v1 cache only for groups of 100 MiB and more.
    let base = Base::new(2 << 30, &["-R", "^free-space-tree"], "space_cache=v1");
    let root = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-tree", "-t", "root"])
            .arg(&base.path),
    );
    assert!(root.contains("(FREE_SPACE UNTYPED"), "no v1 cache to drop");
    let (a, b) = against_btrfstune(&base, &["--convert-to-free-space-tree"], true);
    for img in [&a, &b] {
        let root = must(
            Command::new(progs_new("btrfs"))
                .args(["inspect-internal", "dump-tree", "-t", "root"])
                .arg(img),
        );
        assert!(!root.contains("(FREE_SPACE UNTYPED"), "v1 cache left");
    }
}

#[test]
fn block_group_tree_to_and_from_like_btrfstune() {
    skip_unless!(oracles());
    let base = Base::new(1 << 30, &[], "");
    let (a, b) = against_btrfstune(&base, &["--convert-to-block-group-tree"], true);
    let a2 = copy_of(&a, "ours-back.img");
    let b2 = copy_of(&b, "progs-back.img");
    ours_ok(&a2, &["--convert-from-block-group-tree"]);
    progs_tune(&b2, &["--convert-from-block-group-tree"]);
    assert_eq!(super_flags(&a2), super_flags(&b2), "back: superblock flags");
    assert_checks(&a2, true, "back, ours");
    assert_checks(&b2, true, "back, btrfstune");
    kernel_reads(&a2, &base.files, "back from the block group tree");
    let trees = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-tree", "-t", "root"])
            .arg(&a2),
    );
    assert!(
        !trees.contains("BLOCK_GROUP_TREE ROOT_ITEM"),
        "bg tree left"
    );
}

#[test]
fn simple_quota_on_and_off_like_btrfstune() {
    skip_unless!(oracles());
    let base = Base::new(1 << 30, &[], "");
    // 6.2 does not know SIMPLE_QUOTA: 6.14 checks.
    let (a, _) = against_btrfstune(&base, &["--enable-simple-quota"], false);
    // The kernel writes with simple quotas on: data extents get owner refs.
    let mut files = base.files.clone();
    {
        let m = LoopMount::new(&a, "").unwrap();
        for i in 0..20u64 {
            let d = pattern(4000 + i, 40_000);
            std::fs::write(m.path().join(format!("sq{i}")), &d).unwrap();
            files.insert(format!("sq{i}"), d);
        }
        must(Command::new("sync").arg("-f").arg(m.path()));
        m.unmount().unwrap();
    }
    let ext = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-tree", "-t", "extent"])
            .arg(&a),
    );
    assert!(
        ext.contains("extent owner root"),
        "the kernel wrote no owner ref"
    );
    assert_checks(&a, false, "simple quotas, kernel writes");
    let ours2 = copy_of(&a, "ours-off.img");
    let progs2 = copy_of(&a, "progs-off.img");
    ours_ok(&ours2, &["--remove-simple-quota"]);
    progs_tune(&progs2, &["--remove-simple-quota"]);
    assert_eq!(super_flags(&ours2), super_flags(&progs2), "off: flags");
    assert_checks(&ours2, true, "simple quotas removed");
    let ext = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-tree", "-t", "extent"])
            .arg(&ours2),
    );
    assert!(!ext.contains("extent owner root"), "owner refs left");
    kernel_reads(&ours2, &files, "simple quotas removed");
}

/// `btrfs qgroup show --raw` of `img`, mounted read-only: (qgroupid,
/// rfer, excl) lines.
fn qgroups_of(img: &Path) -> Vec<String> {
    let m = LoopMount::new(img, "ro").unwrap();
    let out = must(
        Command::new("btrfs")
            .args(["qgroup", "show", "--raw"])
            .arg(m.path()),
    );
    m.unmount().unwrap();
    out.lines()
        .filter(|l| l.starts_with("0/"))
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn full_quota_on_and_off_counts_like_the_kernel() {
    skip_unless!(oracles());
    let base = Base::new(1 << 30, &[], "");
    let a = base.copy("ours.img");
    ours_ok(&a, &["--enable-quota"]);
    assert_checks(&a, true, "quotas on");
    let k = base.copy("kernel.img");
    {
        let m = LoopMount::new(&k, "").unwrap();
        must(
            Command::new("btrfs")
                .args(["quota", "enable"])
                .arg(m.path()),
        );
        must(
            Command::new("btrfs")
                .args(["quota", "rescan", "-w"])
                .arg(m.path()),
        );
        m.unmount().unwrap();
    }
    let (q_ours, q_kernel) = (qgroups_of(&a), qgroups_of(&k));
    assert_eq!(q_ours.len(), 3, "{q_ours:?}");
    assert_eq!(q_ours, q_kernel, "qgroup counters");
    kernel_reads(&a, &base.files, "quotas on");
    assert!(ours_ok(&a, &["--enable-quota"]).contains("already"));
    ours_ok(&a, &["--disable-quota"]);
    assert_checks(&a, true, "quotas off");
    let trees = must(
        Command::new(progs_new("btrfs"))
            .args(["inspect-internal", "dump-tree", "-t", "root"])
            .arg(&a),
    );
    assert!(!trees.contains("QUOTA_TREE ROOT_ITEM"), "quota tree left");
    kernel_reads(&a, &base.files, "quotas off");
}

/// Write an in-memory image to a sparse file (only its non-zero pages).
fn write_sparse(bytes: &[u8], path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(bytes.len() as u64).unwrap();
    for (i, c) in bytes.chunks(1 << 16).enumerate() {
        if c.iter().any(|&b| b != 0) {
            f.write_all_at(c, (i as u64) << 16).unwrap();
        }
    }
}

fn sb_of(d: &Arc<dyn BlockDevice>) -> Superblock {
    read_superblock(d.as_ref(), 0).expect("superblock")
}

/// Cut the conversion `req` of `base` at every write (at most about
/// `points` of them, the last commit's writes always): each crash state
/// is the old state or the new one (`is_new` of its superblock agrees
/// with its generation) and checks clean; the kernel mounts `kernel`
/// of them and reads every file.
fn cut_at_every_write(
    base: &Base,
    req: &Request,
    is_new: impl Fn(&Superblock) -> bool,
    points: u64,
    kernel: usize,
) {
    let bytes = Arc::new(std::fs::read(&base.path).unwrap());
    let fresh = || Arc::new(CrashDevice::from_shared(bytes.clone()));
    let run = |d: Arc<CrashDevice>| {
        let d: Arc<dyn BlockDevice> = d;
        tune_devices(vec![("image".into(), d)], req, &NoProgress)
    };
    let base_dev: Arc<dyn BlockDevice> = fresh();
    let base_gen = sb_of(&base_dev).generation.get();
    assert!(!is_new(&sb_of(&base_dev)));
    // mkfs.btrfs 6.2 leaves free space info of its temporary chunks (the
    // kernel ignores them): allowed, and nothing else.
    let allowed = ours_findings(base_dev).expect("the base image checks");
    assert!(
        allowed.iter().all(|f| f.starts_with("FreeSpaceStale")),
        "the base image: {allowed:#?}"
    );
    let count = {
        let d = fresh();
        let r = run(d.clone()).expect("conversion");
        assert_eq!(r.steps[0].outcome, Outcome::Done);
        let n = d.writes();
        let d: Arc<dyn BlockDevice> = d;
        assert!(is_new(&sb_of(&d)));
        ours_clean(d, &allowed).expect("converted image clean");
        n
    };
    assert!(count >= 4, "{count} writes");
    let mut cuts: Vec<u64> = (0..count)
        .step_by((count / points).max(1) as usize)
        .collect();
    cuts.extend(count.saturating_sub(8)..count);
    cuts.sort_unstable();
    cuts.dedup();
    let mut prng = Prng::new(0x7e57_0001);
    let (mut old, mut new, mut mounted) = (0, 0, 0);
    let tmp = tempfile::Builder::new()
        .prefix("btrkit-tcut-")
        .tempdir()
        .unwrap();
    for (n, &cut) in cuts.iter().enumerate() {
        let d = fresh();
        d.fail_after_writes(Some(cut));
        assert!(run(d.clone()).is_err(), "cut {cut} of {count} should fail");
        // Kept, lost, a random subset, and torn writes of several random
        // page subsets (a commit's blocks go out as a few long runs).
        for variant in 0..10 {
            let s = prng.next_u64();
            let c = match variant {
                0 => d.crash_device(|_| false),
                1 => d.crash_device(|_| true),
                2 => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
                _ => d.crash_device_torn(|i, j| (s >> ((i * 7 + j) % 64)) & 1 == 1),
            };
            let c = Arc::new(c);
            let dyn_c: Arc<dyn BlockDevice> = c.clone();
            let sb = sb_of(&dyn_c);
            let converted = is_new(&sb);
            assert_eq!(
                converted,
                sb.generation.get() > base_gen,
                "cut {cut} variant {variant}: feature flags and generation disagree"
            );
            if converted {
                new += 1;
            } else {
                old += 1;
            }
            ours_clean(dyn_c, &allowed).unwrap_or_else(|e| {
                panic!("cut {cut}/{count} variant {variant} (converted {converted}): {e}")
            });
            if variant == 9 && mounted < kernel && n % (cuts.len() / kernel).max(1) == 0 {
                let p = tmp.path().join("cut.img");
                write_sparse(&c.current_image(), &p);
                kernel_reads(&p, &base.files, &format!("cut {cut} variant {variant}"));
                mounted += 1;
            }
        }
    }
    eprintln!(
        "{count} writes, {} cuts: {old} crash states old, {new} new, {mounted} mounted",
        cuts.len()
    );
    assert!(old > 0 && new > 0);
}

#[test]
fn skinny_metadata_cut_at_every_write() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let base = Base::new(512 << 20, &["-O", "^skinny-metadata", "-n", "4096"], "");
    let req = Request {
        skinny_metadata: true,
        ..Default::default()
    };
    cut_at_every_write(
        &base,
        &req,
        |sb| sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA != 0,
        40,
        3,
    );
}

#[test]
fn free_space_tree_cut_at_every_write() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let base = Base::new(2 << 30, &["-R", "^free-space-tree"], "space_cache=v1");
    let req = Request {
        free_space_tree: true,
        ..Default::default()
    };
    cut_at_every_write(
        &base,
        &req,
        |sb| sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID != 0,
        30,
        2,
    );
}

#[test]
fn block_group_tree_cut_at_every_write() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let base = Base::new(512 << 20, &[], "");
    let bgt =
        |sb: &Superblock| sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0;
    let to = Request {
        block_group_tree: Some(true),
        ..Default::default()
    };
    cut_at_every_write(&base, &to, bgt, 30, 2);
    // And back, from an image converted.
    let conv = base.copy("bgt.img");
    ours_ok(&conv, &["--convert-to-block-group-tree"]);
    let back = Base {
        files: base.files.clone(),
        path: conv,
        dir: tempfile::tempdir().unwrap(),
    };
    let from = Request {
        block_group_tree: Some(false),
        ..Default::default()
    };
    cut_at_every_write(&back, &from, |sb| !bgt(sb), 30, 1);
}

#[test]
fn quota_cut_at_every_write() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let base = Base::new(512 << 20, &[], "");
    let req = Request {
        quota: Some(QuotaChange::Enable),
        ..Default::default()
    };
    // No superblock flag: the new state is the committed generation.
    let gen = btrkit_tests::kimage::superblock_of(&base.path)
        .generation
        .get();
    cut_at_every_write(&base, &req, move |sb| sb.generation.get() > gen, 30, 1);
}

/// Move the block group items of every other group of `img` into tree
/// `to` and set CHANGING_BG_TREE, as an interrupted btrfstune leaves it.
fn half_moved(img: &Path, to: u64) {
    let dev: Arc<dyn BlockDevice> = Arc::new(btrkit_core::io::FileDevice::open(img, true).unwrap());
    let mut st = Store::open(dev).unwrap();
    let from = st.block_group_tree();
    if !st.tree_exists(to).unwrap() {
        let ri = btrkit_core::format::root::new_root_item(0, st.transid(), 0, None);
        st.create_tree(to, ri).unwrap();
    }
    let items = st
        .items_in(
            from,
            Key::new(0, BTRFS_BLOCK_GROUP_ITEM_KEY, 0),
            Key::new(u64::MAX, BTRFS_BLOCK_GROUP_ITEM_KEY, u64::MAX),
        )
        .unwrap();
    let items: Vec<_> = items
        .into_iter()
        .filter(|(k, _)| k.ty == BTRFS_BLOCK_GROUP_ITEM_KEY)
        .collect();
    assert!(items.len() >= 3);
    for (k, d) in items.iter().step_by(2) {
        st.delete_item(from, k).unwrap();
        st.insert_item(TreeId::Tree(to), k, d).unwrap();
    }
    st.update_superblock(|sb| {
        sb.flags
            .set(sb.flags.get() | BTRFS_SUPER_FLAG_CHANGING_BG_TREE)
    });
    st.commit().unwrap();
}

#[test]
fn interrupted_btrfstune_block_group_conversion_is_finished() {
    skip_unless!(oracles());
    let base = Base::new(512 << 20, &[], "");
    // Interrupted on the way to the block group tree.
    let a = base.copy("to.img");
    half_moved(&a, BTRFS_BLOCK_GROUP_TREE_OBJECTID);
    // Nothing else is allowed meanwhile.
    let (c, _, err) = ours(&a, &["-x"]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("CHANGING_BG_TREE"), "{err}");
    let out = ours_ok(&a, &["--convert-to-block-group-tree"]);
    assert!(out.contains("interrupted"), "{out}");
    let sb = btrkit_tests::kimage::superblock_of(&a);
    assert_eq!(sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_BG_TREE, 0);
    assert_ne!(
        sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE,
        0
    );
    assert_checks(&a, true, "finished to the block group tree");
    kernel_reads(&a, &base.files, "finished to the block group tree");
    // Interrupted on the way back, finished the other way round.
    let b = copy_of(&a, "from.img");
    half_moved(&b, BTRFS_EXTENT_TREE_OBJECTID);
    ours_ok(&b, &["--convert-to-block-group-tree"]);
    assert_checks(&b, true, "finished back into the block group tree");
    half_moved(&b, BTRFS_EXTENT_TREE_OBJECTID);
    ours_ok(&b, &["--convert-from-block-group-tree"]);
    let sb = btrkit_tests::kimage::superblock_of(&b);
    assert_eq!(
        sb.compat_ro_flags.get() & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE,
        0
    );
    assert_checks(&b, true, "finished into the extent tree");
    kernel_reads(&b, &base.files, "finished into the extent tree");
}

/// Run btrkit-tune expecting a refusal (exit `code`): the image is byte
/// for byte as it was. Returns stderr.
fn refused(img: &Path, args: &[&str], code: i32) -> String {
    let before = std::fs::read(img).unwrap();
    let (c, out, err) = ours(img, args);
    assert_eq!(c, code, "{args:?}: {out}{err}");
    assert!(std::fs::read(img).unwrap() == before, "{args:?} wrote");
    err
}

#[test]
fn refusals_write_nothing() {
    skip_unless!(oracles());
    // The block group tree needs the free space tree (as btrfstune).
    let v1 = Base::new(512 << 20, &["-R", "^free-space-tree"], "space_cache=v1");
    let img = v1.copy("v1.img");
    let err = refused(&img, &["--convert-to-block-group-tree"], 1);
    assert!(err.contains("free space tree"), "{err}");
    // Conflicting options: a usage error.
    refused(
        &img,
        &[
            "--convert-to-block-group-tree",
            "--convert-from-block-group-tree",
        ],
        2,
    );
    // Simple quotas over full ones, and the other way round.
    let q = v1.copy("q.img");
    ours_ok(&q, &["--enable-quota"]);
    let err = refused(&q, &["--enable-simple-quota"], 1);
    assert!(err.contains("disable"), "{err}");
    let err = refused(&q, &["--remove-simple-quota"], 1);
    assert!(err.contains("--disable-quota"), "{err}");
    let s = v1.copy("s.img");
    ours_ok(&s, &["--enable-simple-quota"]);
    let err = refused(&s, &["--enable-quota"], 1);
    assert!(err.contains("remove"), "{err}");
    // An empty request.
    let d: Arc<dyn BlockDevice> = Arc::new(btrkit_core::io::FileDevice::open(&img, false).unwrap());
    assert!(tune_devices(vec![("x".into(), d)], &Request::default(), &NoProgress).is_err());
}

#[test]
fn a_log_to_replay_is_refused() {
    skip_unless!(oracles());
    let mut k =
        btrkit_tests::KernelImage::new_mounted(&btrkit_tests::MkfsOpts::default(), "commit=600");
    k.sync();
    {
        let f = std::fs::File::create(k.path("logged")).unwrap();
        use std::io::Write;
        let mut f = f;
        f.write_all(&pattern(9, 10_000)).unwrap();
        f.sync_all().unwrap();
    }
    let c = k.crash_copy("log.img");
    k.umount();
    for args in [
        &["-x"][..],
        &["-n"],
        &["--convert-to-block-group-tree"],
        &["--enable-quota"],
    ] {
        let err = refused(&c.path, args, 1);
        assert!(err.contains("log"), "{args:?}: {err}");
    }
}

/// The conversions on a two-device raid1 set and a three-device raid5
/// set: every device named, every one changed, the set checked clean by
/// both checkers and its files read back by the kernel.
#[test]
fn conversions_on_sets() {
    skip_unless!(oracles());
    use btrkit_tests::sets::{self, KernelSet};
    for args in [
        &[
            "-m",
            "raid1",
            "-d",
            "raid1",
            "-O",
            "^skinny-metadata,^no-holes",
        ][..],
        &[
            "-m",
            "raid5",
            "-d",
            "raid5",
            "-O",
            "^skinny-metadata,^no-holes",
        ][..],
    ] {
        let n = if args[1] == "raid5" { 3 } else { 2 };
        let set = KernelSet::new(n, args);
        let want = sets::manifest(&set.paths, "ro").unwrap();
        for step in [
            &["-x", "-n"][..],
            &["--convert-to-block-group-tree"][..],
            &["--enable-quota"][..],
            &["--disable-quota"][..],
            &["--convert-from-block-group-tree"][..],
        ] {
            let o = Command::new(btrkit_tests::bins::bin_path("btrkit-tune"))
                .args(step)
                .args(&set.paths)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{args:?} {step:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            for d in &set.paths[1..] {
                assert_eq!(
                    super_flags(d),
                    super_flags(&set.paths[0]),
                    "{args:?} {step:?}: devices disagree"
                );
            }
            btrkit_tests::oracle::check_set_clean(&set.paths)
                .unwrap_or_else(|e| panic!("{args:?} {step:?}: {e}"));
            sets::fsck_clean(&set.paths).unwrap_or_else(|e| panic!("{args:?} {step:?}: {e}"));
            assert_eq!(
                sets::manifest(&set.paths, "ro").unwrap(),
                want,
                "{args:?} {step:?}"
            );
        }
        // The whole dump (btrfs-progs finds the other devices by scanning
        // their loop devices): no tree block left with a fat extent item.
        let dump = sets::progs_dump(&set.paths);
        let lines: Vec<&str> = dump.lines().collect();
        let fat = lines
            .windows(2)
            .filter(|w| w[0].contains(" EXTENT_ITEM ") && w[1].contains("TREE_BLOCK"))
            .count();
        let skinny = lines
            .iter()
            .filter(|l| l.contains(" METADATA_ITEM "))
            .count();
        assert_eq!(
            fat, 0,
            "{args:?}: {fat} EXTENT_ITEMs of tree blocks left ({skinny} skinny)"
        );
        assert!(skinny > 0, "{args:?}");
    }
}
