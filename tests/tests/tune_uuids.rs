//! `btrkit-tune` -m/-M (metadata UUID), new subvolume UUIDs, the label
//! and the seeding flag, on images the kernel wrote:
//! - two clones of one image, each given `-m`: new fsids and subvolume
//!   UUIDs (a snapshot's parent UUID following its source), UUID tree
//!   consistent, btrfs check 6.2 and 6.14 clean, both mounted by the
//!   kernel at once with the original's files, xattrs and subvolume
//!   relations; `-M` with the original fsid turns the feature off;
//! - `-m --keep-subvol-uuids` against btrfstune 6.14 `-M` on the same
//!   image: the same superblock features and flags, the same fs trees;
//! - the label and the seeding flag against `btrfs filesystem label` and
//!   `btrfstune -S` (6.14), and on a two-device RAID1 set with `-m`;
//! - `-m` cut at every write, one device and a RAID1 set (the crash
//!   device: unflushed writes kept, lost, some, torn): the filesystem is
//!   as before or after, or a rerun of `-M` with the UUID the first run
//!   chose finishes it; a sample through the kernel;
//! - refusals: a mounted image, a set with a device missing, a label too
//!   long: one line, nothing written.

use btrkit_core::check::{check_image, CheckOptions, NoProgress, Severity};
use btrkit_core::devices::{Devices, Single};
use btrkit_core::format::consts::*;
use btrkit_core::format::superblock::Superblock;
use btrkit_core::image::{read_superblock, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice, FileDevice};
use btrkit_core::tune::{tune_devices, NewUuid, Request};
use btrkit_core::util::prng::Prng;
use btrkit_core::util::uuid::uuid_str;
use btrkit_tests::kcrash::{self, Manifest};
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sets::{self, KernelSet};
use btrkit_tests::{bin_path, env, skip_unless, LoopMount};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

fn tune(args: &[&str], devs: &[&Path]) -> (i32, String, String) {
    let o = Command::new(bin_path("btrkit-tune"))
        .args(args)
        .arg(devs[0])
        .args(devs[1..].iter().flat_map(|d| [Path::new("--device"), d]))
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn tune_ok(args: &[&str], devs: &[&Path]) -> String {
    let (code, out, err) = tune(args, devs);
    assert_eq!(code, 0, "btrkit-tune {args:?}: {out}{err}");
    out
}

fn sb(p: &Path) -> Superblock {
    let d = FileDevice::open(p, false).unwrap();
    read_superblock(&d, 0).unwrap()
}

fn sb_copy(p: &Path, mirror: usize) -> Superblock {
    let d = FileDevice::open(p, false).unwrap();
    read_superblock(&d, mirror).unwrap()
}

fn progs_new(tool: &str) -> PathBuf {
    env::progs_new_dir().unwrap().join(tool)
}

fn run(c: &mut Command) -> String {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{c:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// An image of 320 MiB (two superblock copies) made by mkfs.btrfs and
/// written by the kernel: files and an xattr in the top subvolume, a
/// subvolume `sv` with files, xattrs and a nested subvolume, a snapshot
/// of it and a read-only snapshot.
fn kernel_image(dir: &Path) -> PathBuf {
    let img = dir.join("orig.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(320 << 20)
        .unwrap();
    // Without the free space tree: mkfs.btrfs 6.2 leaves stale entries in
    // it; the kernel builds it at the first mount.
    run(Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-R", "^free-space-tree"])
        .arg(&img));
    let m = LoopMount::mount(&img, &dir.join("mnt-orig"), "space_cache=v2").unwrap();
    let r = m.path();
    let sub = |args: &[&str]| {
        run(Command::new("btrfs").arg("subvolume").args(args));
    };
    std::fs::write(r.join("top.txt"), b"top level\n").unwrap();
    sub(&["create", &r.join("sv").to_string_lossy()]);
    sets::write_files(&r.join("sv"));
    run(Command::new("setfattr")
        .args(["-n", "user.tag", "-v", "subvol"])
        .arg(r.join("sv/dir0/f0")));
    sub(&["create", &r.join("sv/inner").to_string_lossy()]);
    std::fs::write(r.join("sv/inner/deep"), vec![7u8; 70000]).unwrap();
    sub(&[
        "snapshot",
        &r.join("sv").to_string_lossy(),
        &r.join("snap").to_string_lossy(),
    ]);
    std::fs::write(r.join("snap/only-in-snap"), b"diverged\n").unwrap();
    sub(&[
        "snapshot",
        "-r",
        &r.join("sv").to_string_lossy(),
        &r.join("ro").to_string_lossy(),
    ]);
    // Sent and received within the filesystem: the received copy's
    // received UUID names the read-only snapshot.
    std::fs::create_dir(r.join("recv")).unwrap();
    run(Command::new("sh").arg("-c").arg(format!(
        "btrfs send -q '{}' | btrfs receive -q '{}'",
        r.join("ro").display(),
        r.join("recv").display()
    )));
    m.unmount().unwrap();
    img
}

/// One subvolume as `btrfs subvolume list -u -q -R` shows it: (uuid,
/// parent uuid, received uuid).
type Listed = (String, String, String);

/// `btrfs subvolume list -u -q -R` of the mount at `mnt`, by path.
fn subvol_list(mnt: &Path) -> BTreeMap<String, Listed> {
    let out = run(Command::new("btrfs")
        .args(["subvolume", "list", "-u", "-q", "-R"])
        .arg(mnt));
    out.lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let at = |k: &str| t.iter().position(|x| *x == k).map(|i| t[i + 1].to_string());
            Some((
                at("path")?,
                (at("uuid")?, at("parent_uuid")?, at("received_uuid")?),
            ))
        })
        .collect()
}

/// Each subvolume's parent and the subvolume it was received from, by
/// path ("-" none, "?" a UUID not of this filesystem).
fn relations(l: &BTreeMap<String, Listed>) -> BTreeMap<String, (String, String)> {
    let by_uuid: BTreeMap<&str, &str> = l
        .iter()
        .map(|(p, (u, _, _))| (u.as_str(), p.as_str()))
        .collect();
    let name = |u: &str| {
        if u == "-" {
            "-".to_string()
        } else {
            by_uuid.get(u).map_or("?".into(), |s| s.to_string())
        }
    };
    l.iter()
        .map(|(p, (_, parent, recv))| (p.clone(), (name(parent), name(recv))))
        .collect()
}

/// What the kernel shows of the image (mounted read-only) and its
/// subvolume list.
fn kernel_view(devs: &[&Path], mnt: &Path) -> (Manifest, BTreeMap<String, Listed>) {
    let opts: String = std::iter::once("ro".to_string())
        .chain(devs[1..].iter().map(|d| format!("device={}", d.display())))
        .collect::<Vec<_>>()
        .join(",");
    let m = LoopMount::mount(devs[0], mnt, &opts).unwrap();
    let man = kcrash::manifest_of_tree(m.path()).unwrap();
    let l = subvol_list(m.path());
    m.unmount().unwrap();
    (man, l)
}

fn checks_clean(devs: &[&Path], what: &str) {
    if devs.len() == 1 {
        oracle::assert_btrfs_check_clean(devs, Progs::Distro, what);
        oracle::assert_btrfs_check_clean(devs, Progs::New, what);
    } else {
        oracle::check_set_clean(devs).unwrap_or_else(|e| panic!("{what}: {e}"));
        oracle::btrfs_check(devs, Progs::New)
            .unwrap()
            .require_clean_but_free_space()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let paths: Vec<PathBuf> = devs.iter().map(|d| d.to_path_buf()).collect();
    sets::fsck_clean(&paths).unwrap_or_else(|e| panic!("{what}: {e}"));
}

fn has_md(s: &Superblock) -> bool {
    s.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_METADATA_UUID != 0
}

#[test]
fn metadata_uuid_clones_mount_side_by_side() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        env::require_progs_new()
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let orig = kernel_image(d);
    let o = sb(&orig);
    let (orig_man, orig_list) = kernel_view(&[&orig], &d.join("m0"));
    assert!(orig_list.len() >= 5, "{orig_list:?}");
    let rel = relations(&orig_list);
    assert_eq!(rel["snap"].0, "sv");
    assert_eq!(rel["recv/ro"].1, "ro", "{rel:?}");
    let clones: Vec<PathBuf> = (1..=2).map(|i| d.join(format!("clone{i}.img"))).collect();
    for c in &clones {
        kcrash::copy_sparse(&orig, c).unwrap();
        let out = tune_ok(&["-m"], &[c]);
        assert!(out.contains("metadata-uuid"), "{out}");
        let s = sb(c);
        assert_ne!(s.fsid, o.fsid);
        assert!(has_md(&s));
        assert_eq!(s.metadata_uuid, o.fsid);
        assert_eq!(
            s.dev_item.fsid, o.fsid,
            "the device item keeps the tree fsid"
        );
        // One commit (the subvolume UUIDs); the fsid itself changes no
        // generation.
        assert_eq!(s.generation.get(), o.generation.get() + 1);
        assert_eq!(s.uuid_tree_generation.get(), s.generation.get());
        let m1 = sb_copy(c, 1);
        assert_eq!((m1.fsid, m1.metadata_uuid), (s.fsid, s.metadata_uuid));
        checks_clean(&[c], "a clone after -m");
    }
    assert_ne!(sb(&clones[0]).fsid, sb(&clones[1]).fsid);
    // Both clones mounted at once, beside each other.
    let m1 = LoopMount::mount(&clones[0], &d.join("m1"), "").unwrap();
    let m2 = LoopMount::mount(&clones[1], &d.join("m2"), "").unwrap();
    let mut lists = Vec::new();
    for m in [&m1, &m2] {
        let man = kcrash::manifest_of_tree(m.path()).unwrap();
        assert!(man == orig_man, "{}", orig_man.short_diff(&man, 12));
        let l = subvol_list(m.path());
        assert_eq!(relations(&l), relations(&orig_list));
        for (p, (u, _, _)) in &l {
            assert_ne!(u, &orig_list[p].0, "{p} kept its UUID");
        }
        lists.push(l);
    }
    for (p, (u, _, _)) in &lists[0] {
        assert_ne!(u, &lists[1][p].0, "{p}: the clones share a UUID");
    }
    m1.unmount().unwrap();
    m2.unmount().unwrap();
    // The kernel's writes (a read-write mount) and our UUID tree agree.
    checks_clean(&[&clones[0]], "a clone after a read-write mount");

    // -M with the original fsid: the feature off again.
    let c = &clones[0];
    let before = subvol_list_of(c, &d.join("m3"));
    tune_ok(&["-M", &uuid_str(&o.fsid)], &[c]);
    let s = sb(c);
    assert_eq!(s.fsid, o.fsid);
    assert!(!has_md(&s));
    assert_eq!(s.metadata_uuid, [0; 16]);
    assert_eq!(s.dev_item.fsid, o.fsid);
    checks_clean(&[c], "a clone after -M back");
    let (man, l) = kernel_view(&[c], &d.join("m4"));
    assert!(man == orig_man, "{}", orig_man.short_diff(&man, 12));
    assert_eq!(relations(&l), relations(&orig_list));
    for (p, (u, _, _)) in &l {
        assert_ne!(u, &before[p].0, "{p}: -M renews subvolume UUIDs too");
    }
    // Asked again: nothing to do for the fsid (the subvolume UUIDs are
    // renewed whenever asked).
    let out = tune_ok(&["-M", &uuid_str(&o.fsid), "--keep-subvol-uuids"], &[c]);
    assert!(out.contains("already"), "{out}");
}

fn subvol_list_of(img: &Path, mnt: &Path) -> BTreeMap<String, Listed> {
    kernel_view(&[img], mnt).1
}

/// `btrfs inspect-internal dump-super` of `img` by btrfs-progs 6.14, as
/// field -> value (the multi-line feature lists folded into their field).
fn dump_super(img: &Path) -> BTreeMap<String, String> {
    let out = run(Command::new(progs_new("btrfs"))
        .args(["inspect-internal", "dump-super", "-f"])
        .arg(img));
    let mut m: BTreeMap<String, String> = BTreeMap::new();
    let mut last = String::new();
    for l in out.lines() {
        if l.starts_with(['\t', ' ']) && !last.is_empty() {
            if let Some(v) = m.get_mut(&last) {
                v.push(' ');
                v.push_str(l.trim());
            }
            continue;
        }
        let mut it = l.splitn(2, char::is_whitespace);
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        last = k.to_string();
        m.insert(last.clone(), v.trim().to_string());
    }
    m
}

fn dump_tree(img: &Path, tree: &str) -> String {
    run(Command::new(progs_new("btrfs"))
        .args(["inspect-internal", "dump-tree", "-t", tree])
        .arg(img))
    .lines()
    .filter(|l| !l.starts_with("btrfs-progs"))
    .collect::<Vec<_>>()
    .join("\n")
}

#[test]
fn metadata_uuid_as_btrfstune_does() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        env::require_progs_new()
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let orig = kernel_image(d);
    let (p, q) = (d.join("progs.img"), d.join("ours.img"));
    kcrash::copy_sparse(&orig, &p).unwrap();
    kcrash::copy_sparse(&orig, &q).unwrap();
    let z = "5e1ec7ed-0000-4000-8000-00000000c10e";
    run(Command::new(progs_new("btrfstune")).args(["-M", z]).arg(&p));
    tune_ok(&["-M", z, "--keep-subvol-uuids"], &[&q]);
    let (sp, sq) = (dump_super(&p), dump_super(&q));
    for f in [
        "fsid",
        "metadata_uuid",
        "flags",
        "incompat_flags",
        "compat_flags",
        "compat_ro_flags",
        "dev_item.fsid",
        "dev_item.uuid",
        "dev_item.devid",
        "label",
        "num_devices",
        "csum_type",
        "root",
        "chunk_root",
        "log_root",
        "uuid_tree_generation",
    ] {
        if f == "root" || f == "uuid_tree_generation" {
            // btrfstune commits twice (generation + 2); we write only the
            // superblocks, the trees as they were.
            assert_eq!(sq.get(f), dump_super(&orig).get(f), "{f}");
            continue;
        }
        assert_eq!(sp.get(f), sq.get(f), "superblock field {f}");
    }
    assert_eq!(sq.get("fsid").map(String::as_str), Some(z));
    assert_eq!(sq.get("generation"), dump_super(&orig).get("generation"));
    // The fs trees, untouched by both.
    for t in ["5", "256", "257", "258", "259", "260"] {
        assert_eq!(dump_tree(&p, t), dump_tree(&q, t), "fs tree {t}");
    }
    checks_clean(&[&p], "btrfstune -M");
    checks_clean(&[&q], "btrkit-tune -M --keep-subvol-uuids");
}

#[test]
fn label_and_seeding_as_btrfs_progs() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        env::require_progs_new()
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let orig = kernel_image(d);
    let o = sb(&orig);
    let (p, q) = (d.join("progs.img"), d.join("ours.img"));
    kcrash::copy_sparse(&orig, &p).unwrap();
    kcrash::copy_sparse(&orig, &q).unwrap();

    run(Command::new(progs_new("btrfs"))
        .args(["filesystem", "label"])
        .arg(&p)
        .arg("a label"));
    tune_ok(&["-L", "a label"], &[&q]);
    assert_eq!(sb(&p).label_str(), "a label");
    for m in 0..2 {
        let s = sb_copy(&q, m);
        assert_eq!(s.label_str(), "a label", "copy {m}");
        assert_eq!(s.generation.get(), o.generation.get(), "copy {m}");
    }
    let out = tune_ok(&["-L", "a label"], &[&q]);
    assert!(out.contains("already"), "{out}");
    checks_clean(&[&q], "after -L");
    let m = LoopMount::mount(&q, &d.join("m-label"), "ro").unwrap();
    let blk = run(Command::new("blkid")
        .args(["-p", "-s", "LABEL", "-o", "value"])
        .arg(m.device()));
    assert_eq!(blk.trim(), "a label");
    m.unmount().unwrap();

    run(Command::new(progs_new("btrfstune"))
        .args(["-S", "1"])
        .arg(&p));
    tune_ok(&["-S", "1"], &[&q]);
    let (fp, fq) = (sb(&p).flags.get(), sb(&q).flags.get());
    assert_ne!(fq & BTRFS_SUPER_FLAG_SEEDING, 0);
    assert_eq!(fp, fq, "superblock flags");
    assert_eq!(sb_copy(&q, 1).flags.get(), fq);
    assert!(tune_ok(&["-S", "1"], &[&q]).contains("already"));
    // A seed mounts read-only.
    let m = LoopMount::mount(&q, &d.join("m-seed"), "ro").unwrap();
    assert!(m.path().join("top.txt").exists());
    m.unmount().unwrap();
    // The label of a seed may change (superblock fields only).
    tune_ok(&["-L", "seed"], &[&q]);
    let (code, _, err) = tune(&["-S", "0"], &[&q]);
    assert_eq!(code, 1, "clearing without -f: {err}");
    tune_ok(&["-S", "0", "-f"], &[&q]);
    assert_eq!(sb(&q).flags.get(), o.flags.get());
    assert!(tune_ok(&["-S", "0", "-f"], &[&q]).contains("already"));
    checks_clean(&[&q], "after -S 1, -S 0");

    // Refused with a metadata UUID, as btrfstune refuses it.
    tune_ok(&["-m", "--keep-subvol-uuids"], &[&q]);
    let before = std::fs::read(&q).unwrap();
    let (code, _, err) = tune(&["-S", "1"], &[&q]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("metadata UUID"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(std::fs::read(&q).unwrap() == before, "refusal wrote");
    let o2 = Command::new(progs_new("btrfstune"))
        .args(["-S", "1"])
        .arg(&q)
        .output()
        .unwrap();
    assert!(!o2.status.success(), "btrfstune -S 1 on a metadata UUID fs");
}

#[test]
fn raid1_set_label_and_metadata_uuid() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        env::require_progs_new()
    );
    let set = KernelSet::new(2, &["-d", "raid1", "-m", "raid1"]);
    let devs: Vec<&Path> = set.paths.iter().map(PathBuf::as_path).collect();
    let o = sb(devs[0]);
    let want = sets::manifest(&set.paths, "ro").unwrap();
    let out = tune_ok(&["-L", "pair", "-m"], &devs);
    assert!(
        out.contains("label") && out.contains("metadata-uuid"),
        "{out}"
    );
    let fsid = sb(devs[0]).fsid;
    assert_ne!(fsid, o.fsid);
    for dv in &devs {
        for m in 0..2 {
            let s = sb_copy(dv, m);
            assert_eq!(s.label_str(), "pair");
            assert_eq!((s.fsid, s.metadata_uuid), (fsid, o.fsid));
            assert_eq!(s.dev_item.fsid, o.fsid);
            assert_eq!(s.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID_V2, 0);
        }
    }
    checks_clean(&devs, "a raid1 set after -L -m");
    let got = sets::manifest(&set.paths, "ro").unwrap();
    assert!(got == want, "{}", want.short_diff(&got, 12));
}

/// A device of a set whose writes, counted over every device of the set,
/// stop after a budget: the power failing at one point of the whole
/// command.
struct Cut {
    dev: Arc<CrashDevice>,
    left: Arc<AtomicI64>,
}

impl BlockDevice for Cut {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> btrkit_core::Result<()> {
        self.dev.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> btrkit_core::Result<()> {
        if self.left.fetch_sub(1, Ordering::SeqCst) <= 0 {
            return Err(btrkit_core::Error::io(
                "simulated power failure",
                std::io::Error::other("write after the cut"),
            ));
        }
        self.dev.write_at(offset, buf)
    }
    fn flush(&self) -> btrkit_core::Result<()> {
        if self.left.load(Ordering::SeqCst) < 0 {
            return Err(btrkit_core::Error::io(
                "simulated power failure",
                std::io::Error::other("flush after the cut"),
            ));
        }
        self.dev.flush()
    }
}

type DevList = Vec<(String, Arc<dyn BlockDevice>)>;

fn list(devs: &[Arc<dyn BlockDevice>]) -> DevList {
    devs.iter()
        .enumerate()
        .map(|(i, d)| (format!("d{}", i + 1), d.clone()))
        .collect()
}

fn request(z: [u8; 16]) -> Request {
    Request {
        metadata_uuid: Some(NewUuid::Given(z)),
        ..Request::default()
    }
}

/// The error findings of our own check of the set, or the error opening it.
fn own_check(devs: &[Arc<dyn BlockDevice>]) -> Result<Vec<String>, String> {
    let img = Devices::new(list(devs))
        .open(OpenOptions::default(), Single::AsSet)
        .map_err(|e| e.to_string())?
        .img;
    let r = check_image(&img, CheckOptions::own_writes(), &NoProgress);
    Ok(r.findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| f.message.clone())
        .collect())
}

fn primaries(devs: &[Arc<dyn BlockDevice>]) -> Vec<Superblock> {
    devs.iter()
        .map(|d| read_superblock(d.as_ref(), 0).unwrap())
        .collect()
}

/// How a crash state was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Clean at the old fsid.
    Before,
    /// Clean at the new fsid.
    After,
    /// Unfinished, finished by a rerun.
    Rerun,
}

/// Judge one crash state of `-M z` on a filesystem whose fsid was `old`.
fn judge(devs: &[Arc<dyn BlockDevice>], old: [u8; 16], z: [u8; 16], what: &str) -> Found {
    let p = primaries(devs);
    let flagged = p
        .iter()
        .any(|s| s.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID_V2 != 0);
    let found = if flagged {
        // Our own open accepts the set mid-change (the devices may
        // disagree on the fsid) and the check names the change.
        let errors = own_check(devs).unwrap_or_else(|e| panic!("{what}: does not open: {e}"));
        assert!(
            errors.iter().any(|e| e.contains("metadata_uuid change")),
            "{what}: {errors:?}"
        );
        Found::Rerun
    } else {
        assert!(
            p.iter().all(|s| s.fsid == p[0].fsid) && (p[0].fsid == old || p[0].fsid == z),
            "{what}: fsids {:?} without the flag",
            p.iter().map(|s| uuid_str(&s.fsid)).collect::<Vec<_>>()
        );
        let errors = own_check(devs).unwrap_or_else(|e| panic!("{what}: does not open: {e}"));
        if errors.is_empty() {
            if p[0].fsid == z {
                Found::After
            } else {
                Found::Before
            }
        } else {
            // Only superblock mirrors may lag behind the primary.
            assert!(
                errors.iter().all(|e| e.contains("superblock mirror")),
                "{what}: {errors:?}"
            );
            Found::Rerun
        }
    };
    if found == Found::Rerun {
        tune_devices(list(devs), &request(z), &NoProgress)
            .unwrap_or_else(|e| panic!("{what}: rerun: {e}"));
        assert!(primaries(devs).iter().all(|s| s.fsid == z), "{what}: rerun");
        let errors = own_check(devs).unwrap_or_else(|e| panic!("{what}: rerun: {e}"));
        assert!(errors.is_empty(), "{what}: after the rerun: {errors:?}");
    }
    found
}

/// Write crash devices to image files in `dir`.
fn to_files(devs: &[Arc<CrashDevice>], dir: &Path, tag: &str) -> Vec<PathBuf> {
    devs.iter()
        .enumerate()
        .map(|(i, d)| {
            let p = dir.join(format!("{tag}-{}.img", i + 1));
            std::fs::write(&p, d.current_image()).unwrap();
            p
        })
        .collect()
}

fn cut_at_every_write(paths: &[PathBuf]) {
    let dir = tempfile::tempdir().unwrap();
    let bases: Vec<Arc<Vec<u8>>> = paths
        .iter()
        .map(|p| Arc::new(std::fs::read(p).unwrap()))
        .collect();
    let old = sb(&paths[0]).fsid;
    let z = btrkit_core::util::uuid::random_uuid();
    let fresh = || -> Vec<Arc<CrashDevice>> {
        bases
            .iter()
            .map(|b| Arc::new(CrashDevice::from_shared(b.clone())))
            .collect()
    };
    let cut_list =
        |devs: &[Arc<CrashDevice>], left: &Arc<AtomicI64>| -> Vec<Arc<dyn BlockDevice>> {
            devs.iter()
                .map(|d| {
                    Arc::new(Cut {
                        dev: d.clone(),
                        left: left.clone(),
                    }) as Arc<dyn BlockDevice>
                })
                .collect()
        };
    let count = {
        let devs = fresh();
        let left = Arc::new(AtomicI64::new(i64::MAX));
        let r = tune_devices(list(&cut_list(&devs, &left)), &request(z), &NoProgress).unwrap();
        assert_eq!(r.steps.len(), 2, "{r:?}");
        let as_dyn: Vec<Arc<dyn BlockDevice>> = devs
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        assert!(primaries(&as_dyn).iter().all(|s| s.fsid == z));
        assert!(own_check(&as_dyn).unwrap().is_empty());
        i64::MAX - left.load(Ordering::SeqCst)
    };
    assert!(count >= 4, "{count} writes");
    let mut g = Prng::new(0x005e_ed0f_7e57);
    let mut tally: BTreeMap<String, u32> = BTreeMap::new();
    let mut kernel_samples = 0;
    for cut in 0..count {
        let devs = fresh();
        let left = Arc::new(AtomicI64::new(cut));
        assert!(
            tune_devices(list(&cut_list(&devs, &left)), &request(z), &NoProgress).is_err(),
            "cut {cut} of {count} should fail"
        );
        for variant in 0..4 {
            let crashed: Vec<Arc<CrashDevice>> = devs
                .iter()
                .map(|d| {
                    let s = g.next_u64();
                    Arc::new(match variant {
                        0 => d.crash_device(|_| false),
                        1 => d.crash_device(|_| true),
                        2 => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
                        _ => d.crash_device_torn(|i, j| (s >> ((i * 7 + j) % 64)) & 1 == 1),
                    })
                })
                .collect();
            let what = format!("cut {cut} of {count}, variant {variant}");
            // A sample through the kernel: every fifth cut, all its
            // writes kept.
            let sample = variant == 1 && cut % 5 == 2;
            let files = sample.then(|| to_files(&crashed, dir.path(), &format!("c{cut}")));
            let as_dyn: Vec<Arc<dyn BlockDevice>> = crashed
                .iter()
                .map(|d| d.clone() as Arc<dyn BlockDevice>)
                .collect();
            let found = judge(&as_dyn, old, z, &what);
            *tally.entry(format!("{found:?}")).or_default() += 1;
            if let Some(files) = files {
                kernel_samples += 1;
                kernel_sample(&files, found, z, &what, dir.path());
                for f in files {
                    let _ = std::fs::remove_file(f);
                }
            }
        }
    }
    eprintln!(
        "{count} cut points on {} device(s): {tally:?}, {kernel_samples} through the kernel",
        paths.len()
    );
    // The last write completes the change: every cut before it leaves
    // the old state or one a rerun finishes (the whole run was checked
    // above).
    assert!(tally.contains_key("Before") && tally.contains_key("Rerun"));
}

/// The kernel's view of one crash state (files as the crash left them):
/// it mounts a state found before or after; a state found unfinished it
/// mounts after `btrkit-tune -M z` (and, when the flag is on a primary,
/// not before).
fn kernel_sample(files: &[PathBuf], found: Found, z: [u8; 16], what: &str, work: &Path) {
    let devs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let flagged = devs
        .iter()
        .any(|d| sb(d).flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID_V2 != 0);
    let opts = |extra: &str| -> String {
        std::iter::once(extra.to_string())
            .chain(devs[1..].iter().map(|d| format!("device={}", d.display())))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mnt = work.join("kmnt");
    if found == Found::Rerun {
        if flagged {
            assert!(
                LoopMount::mount(devs[0], &mnt, &opts("ro")).is_err(),
                "{what}: the kernel mounted a set with CHANGING_FSID_V2"
            );
        }
        tune_ok(&["-M", &uuid_str(&z)], &devs);
    }
    let m = LoopMount::mount(devs[0], &mnt, &opts("ro"))
        .unwrap_or_else(|e| panic!("{what} ({found:?}): the kernel does not mount it: {e}"));
    assert!(m.path().join("top.txt").exists() || m.path().join("dir0").exists());
    m.unmount().unwrap();
}

#[test]
fn metadata_uuid_cut_at_every_write_one_device() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let dir = tempfile::tempdir().unwrap();
    let img = kernel_image(dir.path());
    cut_at_every_write(&[img]);
}

#[test]
fn metadata_uuid_cut_at_every_write_raid1_set() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let set = KernelSet::new(2, &["-d", "raid1", "-m", "raid1"]);
    cut_at_every_write(&set.paths);
}

fn digest(p: &Path) -> String {
    kcrash::image_digest(p).unwrap()
}

#[test]
fn refusals_write_nothing() {
    skip_unless!(env::require_kernel_mount(), env::require_btrfs_progs());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = kernel_image(d);

    // Mounted by the kernel.
    let m = LoopMount::mount(&img, &d.join("m"), "ro").unwrap();
    let before = digest(&img);
    for args in [
        &["-m"][..],
        &["-L", "x"],
        &["-S", "1"],
        &["--new-subvol-uuids"],
    ] {
        let (code, out, err) = tune(args, &[&img]);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("in use"), "{args:?}: {err}");
    }
    m.unmount().unwrap();
    assert_eq!(digest(&img), before, "a refusal wrote to a mounted image");

    // A label too long.
    let long = "x".repeat(BTRFS_LABEL_SIZE);
    let (code, _, err) = tune(&["-L", &long], &[&img]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(digest(&img), before);

    // A set with a device missing.
    let set = KernelSet::new(2, &["-d", "raid1", "-m", "raid1"]);
    let one = digest(&set.paths[0]);
    for args in [&["-m"][..], &["-L", "x"], &["--new-subvol-uuids"]] {
        let (code, out, err) = tune(args, &[&set.paths[0]]);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("2 devices"), "{args:?}: {err}");
    }
    assert_eq!(
        digest(&set.paths[0]),
        one,
        "a refusal wrote to a device of a set"
    );
}
