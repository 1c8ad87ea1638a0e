//! `btrkit-fsck --repair` on kernel-written images, damaged one field at a
//! time in each repairable class (checksums fixed, so only the meaning is
//! wrong):
//! - random damage, many cases: the repair never leaves an image worse
//!   (more errors, a file that read before and reads otherwise after),
//!   and every case of a repairable class ends clean; a sample is also
//!   checked by btrfs check and mounted by the kernel;
//! - a repair cut at every write (the crash device, unflushed writes kept
//!   or lost in several ways) leaves either the original findings or a
//!   clean image, and a second repair finishes the job;
//! - the binary: --dry-run writes nothing, --repair without a terminal
//!   wants --yes, exit codes 1 (repaired) and 0 (nothing to do).

use btrkit_core::check::repair::{self, RepairOptions, Target};
use btrkit_core::check::{CheckOptions, NoProgress, Report};
use btrkit_core::format::consts::*;
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::util::prng::Prng;
use btrkit_tests::fsck_support::*;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::repair_support::*;
use btrkit_tests::LoopMount;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const WORKLOAD: &str = r#"set -e
mkdir -p a/b c d/e/f
for i in $(seq 1 FILES); do echo "file $i" > a/f$i; done
for i in $(seq 1 20); do head -c 40000 /dev/urandom > a/b/data$i; done
ln a/f1 c/link1; ln a/f2 c/link2a; ln a/f2 c/link2b
ln -s ../a/f3 c/sym
truncate -s 1M d/sparse; echo tail >> d/sparse
btrfs -q subvolume snapshot . snap
echo changed > snap/a/f5
btrfs -q quota enable .
btrfs -q quota rescan -w .
sync"#;

/// One kind of damage: a field set to another value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    InodeNlink,
    DirSize,
    FileNbytes,
    BlockGroupUsed,
    SuperBytesUsed,
    SuperTotalBytes,
    FreeSpaceInfoCount,
    DevItemBytesUsed,
    PrimarySuperblock,
    QgroupInfo,
    DirIndexName,
    DirItemName,
    InodeRefName,
    ExtentRefsTotal,
    DataRefCount,
    UuidEntry,
    ItemOffset,
    FutureRoot,
    DataRefOwner,
}

const KINDS: [Kind; 19] = [
    Kind::InodeNlink,
    Kind::DirSize,
    Kind::FileNbytes,
    Kind::BlockGroupUsed,
    Kind::SuperBytesUsed,
    Kind::SuperTotalBytes,
    Kind::FreeSpaceInfoCount,
    Kind::DevItemBytesUsed,
    Kind::PrimarySuperblock,
    Kind::QgroupInfo,
    Kind::DirIndexName,
    Kind::DirItemName,
    Kind::InodeRefName,
    Kind::ExtentRefsTotal,
    Kind::DataRefCount,
    Kind::UuidEntry,
    Kind::ItemOffset,
    Kind::FutureRoot,
    Kind::DataRefOwner,
];

/// Where each kind of damage can go in the base image.
struct Targets {
    inodes: Vec<Located>,
    dirs: Vec<Located>,
    files: Vec<Located>,
    block_groups: Vec<Located>,
    fst_infos: Vec<Located>,
    dev_items: Vec<Located>,
    qgroup_infos: Vec<Located>,
    dir_indexes: Vec<Located>,
    dir_items: Vec<Located>,
    inode_refs: Vec<Located>,
    /// Data extent items whose first inline ref is an EXTENT_DATA_REF.
    data_extents: Vec<Located>,
    /// UUID tree entries naming one subvolume.
    uuid_entries: Vec<Located>,
    /// Root items of trees whose root is a leaf.
    leaf_roots: Vec<Located>,
    /// The subvolume trees.
    trees: Vec<u64>,
}

fn mode_of(d: &[u8]) -> u32 {
    u32::from_le_bytes(d[52..56].try_into().unwrap())
}

impl Targets {
    fn find(dev: Arc<dyn BlockDevice>) -> Targets {
        let mut inodes = Vec::new();
        let mut dirs = Vec::new();
        let mut files = Vec::new();
        let mut dir_indexes = Vec::new();
        let mut dir_items = Vec::new();
        let mut inode_refs = Vec::new();
        let snap = items_of(dev.clone(), BTRFS_ROOT_TREE_OBJECTID, &|k, _| {
            k.ty == BTRFS_ROOT_ITEM_KEY && k.objectid >= BTRFS_FIRST_FREE_OBJECTID
        });
        let mut trees = vec![BTRFS_FS_TREE_OBJECTID];
        trees.extend(snap.iter().map(|l| l.key.objectid));
        for &t in &trees {
            // Names of files in directories other than the root: one
            // entry of a single-entry item, so a changed name byte is one
            // name changed.
            let one_entry = |k: &btrkit_core::format::key::Key, d: &[u8], name_at: usize| {
                k.objectid > BTRFS_FIRST_FREE_OBJECTID && d.len() > name_at + 1 && {
                    let nl = u16::from_le_bytes([d[name_at - 3], d[name_at - 2]]) as usize;
                    name_at + nl == d.len()
                }
            };
            dir_indexes.extend(items_of(dev.clone(), t, &|k, d| {
                k.ty == BTRFS_DIR_INDEX_KEY && one_entry(k, d, 30)
            }));
            dir_items.extend(items_of(dev.clone(), t, &|k, d| {
                k.ty == BTRFS_DIR_ITEM_KEY && one_entry(k, d, 30)
            }));
            inode_refs.extend(items_of(dev.clone(), t, &|k, d| {
                k.ty == BTRFS_INODE_REF_KEY
                    && k.offset > BTRFS_FIRST_FREE_OBJECTID
                    && d.len() > 10
                    && 10 + u16::from_le_bytes([d[8], d[9]]) as usize == d.len()
            }));
            let all = items_of(dev.clone(), t, &|k, _| {
                k.ty == BTRFS_INODE_ITEM_KEY && k.objectid > BTRFS_FIRST_FREE_OBJECTID
            });
            let img = btrkit_core::image::Image::open(dev.clone(), Default::default()).unwrap();
            for l in all {
                let mut d = vec![0u8; l.data_len];
                let blk = img
                    .read_tree_block(l.bytenr, &Default::default(), false)
                    .unwrap();
                d.copy_from_slice(&blk.bytes()[l.data_off..l.data_off + l.data_len]);
                match mode_of(&d) & 0o170000 {
                    0o040000 => dirs.push(l.clone()),
                    0o100000 => files.push(l.clone()),
                    _ => {}
                }
                inodes.push(l);
            }
        }
        let bg_tree = if items_of(dev.clone(), BTRFS_ROOT_TREE_OBJECTID, &|k, _| {
            k.objectid == BTRFS_BLOCK_GROUP_TREE_OBJECTID
        })
        .is_empty()
        {
            BTRFS_EXTENT_TREE_OBJECTID
        } else {
            BTRFS_BLOCK_GROUP_TREE_OBJECTID
        };
        Targets {
            inodes,
            dirs,
            files,
            block_groups: items_of(dev.clone(), bg_tree, &|k, _| {
                k.ty == BTRFS_BLOCK_GROUP_ITEM_KEY
            }),
            fst_infos: items_of(dev.clone(), BTRFS_FREE_SPACE_TREE_OBJECTID, &|k, _| {
                k.ty == BTRFS_FREE_SPACE_INFO_KEY
            }),
            dev_items: items_of(dev.clone(), BTRFS_CHUNK_TREE_OBJECTID, &|k, _| {
                k.ty == BTRFS_DEV_ITEM_KEY
            }),
            qgroup_infos: items_of(dev.clone(), BTRFS_QUOTA_TREE_OBJECTID, &|k, _| {
                k.ty == BTRFS_QGROUP_INFO_KEY
            }),
            uuid_entries: items_of(dev.clone(), BTRFS_UUID_TREE_OBJECTID, &|k, d| {
                k.ty == BTRFS_UUID_KEY_SUBVOL && d.len() == 8
            }),
            trees,
            leaf_roots: items_of(dev.clone(), BTRFS_ROOT_TREE_OBJECTID, &|k, d| {
                k.ty == BTRFS_ROOT_ITEM_KEY && d.len() >= 239 && d[238] == 0
            }),
            dir_indexes,
            dir_items,
            inode_refs,
            data_extents: items_of(dev, BTRFS_EXTENT_TREE_OBJECTID, &|k, d| {
                k.ty == BTRFS_EXTENT_ITEM_KEY
                    && d.len() >= 24 + 29
                    && u64::from_le_bytes(d[16..24].try_into().unwrap()) & BTRFS_EXTENT_FLAG_DATA
                        != 0
                    && d[24] == BTRFS_EXTENT_DATA_REF_KEY
            }),
        }
    }
}

fn set_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
fn set_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// Damage `dev` with one field of `kind` changed; the description.
fn damage(dev: &Arc<dyn BlockDevice>, t: &Targets, kind: Kind, rng: &mut Prng) -> String {
    let pick = |v: &Vec<Located>, rng: &mut Prng| v[rng.below(v.len() as u64) as usize].clone();
    let field = |dev: &Arc<dyn BlockDevice>, l: &Located, off: usize, v: u64, width: usize| {
        patch_tree_block(dev, l.bytenr, &|b| {
            let at = l.data_off + off;
            if width == 4 {
                set_u32(b, at, v as u32)
            } else {
                set_u64(b, at, v)
            }
        });
    };
    match kind {
        Kind::InodeNlink => {
            let l = pick(&t.inodes, rng);
            let v = rng.below(4) + 2;
            field(dev, &l, 40, v, 4);
            format!("nlink of {:?} in tree {} = {v}", l.key, l.tree)
        }
        Kind::DirSize => {
            let l = pick(&t.dirs, rng);
            let v = rng.below(100_000) * 2 + 1;
            field(dev, &l, 16, v, 8);
            format!("size of dir {:?} in tree {} = {v}", l.key, l.tree)
        }
        Kind::FileNbytes => {
            let l = pick(&t.files, rng);
            let v = rng.below(1 << 30) + 1;
            field(dev, &l, 24, v, 8);
            format!("nbytes of {:?} in tree {} = {v}", l.key, l.tree)
        }
        Kind::BlockGroupUsed => {
            let l = pick(&t.block_groups, rng);
            let v = rng.below(l.key.offset) / 4096 * 4096 + 4096;
            field(dev, &l, 0, v, 8);
            format!("used of block group {} = {v}", l.key.objectid)
        }
        Kind::SuperBytesUsed => {
            let v = rng.below(1 << 28) + (1 << 20);
            patch_superblock(dev.as_ref(), 0, false, &|b| set_u64(b, 0x78, v));
            format!("superblock bytes_used = {v}")
        }
        Kind::SuperTotalBytes => {
            let v = (rng.below(100) + 1) << 20;
            patch_superblock(dev.as_ref(), 0, false, &|b| set_u64(b, 0x70, v));
            format!("superblock total_bytes = {v}")
        }
        Kind::FreeSpaceInfoCount => {
            let l = pick(&t.fst_infos, rng);
            let v = rng.below(50) + 3;
            field(dev, &l, 0, v, 4);
            format!("free space info {} extent_count = {v}", l.key.objectid)
        }
        Kind::DevItemBytesUsed => {
            let l = pick(&t.dev_items, rng);
            let v = (rng.below(200) + 1) << 20;
            field(dev, &l, 16, v, 8);
            format!("dev item {} bytes_used = {v}", l.key.offset)
        }
        Kind::PrimarySuperblock => {
            let at = 0x100 + rng.below(0x800) as usize;
            patch_superblock(dev.as_ref(), 0, true, &|b| b[at] ^= 0x5a);
            format!("primary superblock byte {at} flipped (checksum left)")
        }
        Kind::DirIndexName | Kind::DirItemName | Kind::InodeRefName => {
            let (v, name_at) = match kind {
                Kind::DirIndexName => (&t.dir_indexes, 30),
                Kind::DirItemName => (&t.dir_items, 30),
                _ => (&t.inode_refs, 10),
            };
            let l = pick(v, rng);
            let i = rng.below((l.data_len - name_at) as u64) as usize;
            let c = b'a' + rng.below(26) as u8;
            patch_tree_block(dev, l.bytenr, &|b| {
                let at = l.data_off + name_at + i;
                b[at] = if b[at] == c { b'Z' } else { c };
            });
            format!("{kind:?}: name byte {i} of {:?} in tree {}", l.key, l.tree)
        }
        Kind::ExtentRefsTotal => {
            let l = pick(&t.data_extents, rng);
            let v = rng.below(5) + 2;
            field(dev, &l, 0, v, 8);
            format!("refs of extent {} = {v}", l.key.objectid)
        }
        Kind::DataRefCount => {
            let l = pick(&t.data_extents, rng);
            let v = rng.below(5) + 2;
            field(dev, &l, 49, v, 4);
            format!("inline data ref count of extent {} = {v}", l.key.objectid)
        }
        Kind::UuidEntry => {
            // The entry names a subvolume that does not exist: the real
            // one's UUID has no entry.
            let l = pick(&t.uuid_entries, rng);
            let v = rng.below(1000) + 100_000;
            field(dev, &l, 0, v, 8);
            format!("UUID tree entry {:?} names subvolume {v}", l.key)
        }
        Kind::DataRefOwner => {
            // The only reference of a data extent names another tree or
            // inode than the file extent that uses it.
            let single: Vec<Located> = t
                .data_extents
                .iter()
                .filter(|l| l.data_len == 53)
                .cloned()
                .collect();
            let l = pick(&single, rng);
            if rng.below(2) == 0 {
                let other = t
                    .trees
                    .iter()
                    .copied()
                    .filter(|&r| r != l.tree)
                    .nth(rng.below(t.trees.len() as u64 - 1) as usize)
                    .unwrap_or(BTRFS_FS_TREE_OBJECTID);
                patch_tree_block(dev, l.bytenr, &|b| {
                    let at = l.data_off + 25;
                    let root = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                    let v = if root == other {
                        BTRFS_FS_TREE_OBJECTID
                    } else {
                        other
                    };
                    set_u64(b, at, v);
                });
                format!("data ref of extent {} names another tree", l.key.objectid)
            } else {
                let v = rng.below(100_000) + 1_000_000;
                field(dev, &l, 33, v, 8);
                format!("data ref of extent {} names inode {v}", l.key.objectid)
            }
        }
        Kind::ItemOffset => {
            // One item header's data offset changed (the leaf's checksum
            // fixed): where the data lies says where it should point.
            let l = pick(&t.inodes, rng);
            let v = match rng.below(3) {
                0 => rng.below(1 << 31) as u32 + 65536,
                1 => rng.below(l.data_off as u64 - 101) as u32,
                _ => (l.data_off - 101) as u32 ^ (1 << rng.below(12)),
            };
            patch_tree_block(dev, l.bytenr, &|b| {
                let n = u32::from_le_bytes(b[0x60..0x64].try_into().unwrap()) as usize;
                for i in 0..n {
                    let at = 101 + i * 25 + 17;
                    if u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
                        == l.data_off - 101
                    {
                        set_u32(b, at, v);
                        break;
                    }
                }
            });
            format!("data offset of {:?} in tree {} = {v}", l.key, l.tree)
        }
        Kind::FutureRoot => {
            // A tree's root leaf and its root item from a transaction far
            // ahead of the superblock's (btrfs-progs' fixture 041).
            let l = pick(&t.leaf_roots, rng);
            let sb_gen = {
                let mut b = vec![0u8; 4096];
                dev.read_at(65536, &mut b).unwrap();
                u64::from_le_bytes(b[0x48..0x50].try_into().unwrap())
            };
            let g = sb_gen + 2 + rng.below(1000);
            let root = {
                let img = btrkit_core::image::Image::open(dev.clone(), Default::default()).unwrap();
                let blk = img
                    .read_tree_block(l.bytenr, &Default::default(), false)
                    .unwrap();
                u64::from_le_bytes(
                    blk.bytes()[l.data_off + 176..l.data_off + 184]
                        .try_into()
                        .unwrap(),
                )
            };
            patch_tree_block(dev, root, &|b| set_u64(b, 0x50, g));
            patch_tree_block(dev, l.bytenr, &|b| {
                set_u64(b, l.data_off + 160, g);
                set_u64(b, l.data_off + 239, g);
            });
            format!(
                "root of tree {} and its item at generation {g}",
                l.key.objectid as i64
            )
        }
        Kind::QgroupInfo => {
            let l = pick(&t.qgroup_infos, rng);
            let v = rng.below(1 << 30) / 4096 * 4096;
            let off = [8, 24][rng.below(2) as usize];
            field(dev, &l, off, v, 8);
            format!("qgroup info {:?} field {off} = {v}", l.key)
        }
    }
}

fn check(dev: &Arc<dyn BlockDevice>) -> Option<Report> {
    btrkit_core::check::check_device(dev.clone(), CheckOptions::default(), &NoProgress).ok()
}

fn error_set(r: &Report) -> BTreeSet<String> {
    r.findings
        .iter()
        .filter(|f| f.severity == btrkit_core::check::Severity::Error)
        .map(|f| format!("{}: {}", f.category, f.message))
        .collect()
}

/// Small files in the base image's `a/` (at least 300): more on demand
/// (`BTRKIT_REPAIR_FILES`) make taller trees, whose repairs copy longer
/// paths and whose leaves the damage lands in anywhere.
fn small_files() -> u64 {
    std::env::var("BTRKIT_REPAIR_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
        .max(300)
}

/// A kernel-written image with quotas, read into memory.
fn base_image(dir: &Path) -> Option<Arc<Vec<u8>>> {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return None;
    }
    let script = WORKLOAD.replace("FILES", &small_files().to_string());
    let img = kernel_image(dir, "base.img", "", "", &script);
    Some(Arc::new(std::fs::read(&img).expect("read image")))
}

/// The distribution's btrfs-progs, and 6.14 when it is there.
fn all_progs() -> Vec<Progs> {
    let mut progs = vec![Progs::Distro];
    if btrkit_tests::env::progs_new_dir().is_some() {
        progs.push(Progs::New);
    }
    progs
}

fn progs_clean(img: &Path) -> Result<(), String> {
    for p in all_progs() {
        let v = oracle::btrfs_check(&[img], p)?;
        if !v.clean {
            return Err(format!(
                "{}: {}",
                p.name(),
                v.stderr
                    .lines()
                    .filter(|l| l.contains("ERROR") || l.contains("error"))
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
    }
    Ok(())
}

#[test]
fn random_damage_never_makes_an_image_worse() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(base) = base_image(tmp.path()) else {
        return;
    };
    let clean: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    let r = check(&clean).expect("check base");
    assert!(r.is_clean(), "base image not clean: {:?}", error_set(&r));
    let targets = Targets::find(clean.clone());
    let base_files = read_all(clean.clone()).expect("read base");
    assert!(!targets.dirs.is_empty() && !targets.files.is_empty());
    assert!(
        !targets.qgroup_infos.is_empty(),
        "no quota groups in the base image"
    );
    assert!(
        targets.uuid_entries.len() >= 2,
        "no UUID tree entries for the subvolume and its snapshot"
    );
    let cases: u64 = std::env::var("BTRKIT_REPAIR_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    // Every so many cases, btrfs check and the kernel look at the result.
    let sample = (cases / 20).max(1);
    // Another seed draws other fields and values (on-demand sweeps).
    let seed: u64 = std::env::var("BTRKIT_REPAIR_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x2545f4914f6cdd1d);
    let mut rng = Prng::new(seed);
    let mut failures = Vec::new();
    let mut per_kind = std::collections::BTreeMap::<Kind, (u64, u64)>::new();
    for case in 0..cases {
        let kind = KINDS[(case % KINDS.len() as u64) as usize];
        let dev: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
        let what = damage(&dev, &targets, kind, &mut rng);
        let files_before = read_all(dev.clone()).unwrap_or_default();
        let target = Target::Device(dev.clone());
        let planned = match repair::plan(
            &target,
            CheckOptions::default(),
            RepairOptions::default(),
            &NoProgress,
        ) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("case {case} ({what}): cannot check: {e}"));
                continue;
            }
        };
        let before_errors = planned.before.errors;
        if before_errors == 0 {
            // Some damage is invisible (a value equal to the right one).
            continue;
        }
        let actions: Vec<String> = planned
            .plan
            .actions
            .iter()
            .map(|a| a.description.clone())
            .collect();
        let done = match repair::carry_out(&target, CheckOptions::default(), planned, &NoProgress) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!(
                    "case {case} ({what}): repair failed: {e} (plan: {actions:?})"
                ));
                continue;
            }
        };
        let e = per_kind.entry(kind).or_default();
        e.0 += 1;
        let Some(after) = done.after.as_ref() else {
            failures.push(format!(
                "case {case} ({what}): nothing repaired: {:?} / {:?}",
                done.plan.refused,
                done.plan
                    .not_repairable
                    .iter()
                    .map(|u| &u.finding.message)
                    .collect::<Vec<_>>()
            ));
            continue;
        };
        if after.errors > before_errors {
            failures.push(format!(
                "case {case} ({what}): {} errors after, {before_errors} before: {:?}",
                after.errors,
                error_set(after)
            ));
        }
        if !after.is_clean() {
            failures.push(format!(
                "case {case} ({what}): not clean after the repair: {:?}",
                error_set(after)
            ));
        } else {
            e.1 += 1;
        }
        let files_after = read_all(dev.clone()).unwrap_or_default();
        let lost = lost_files(&files_before, &files_after);
        if !lost.is_empty() {
            failures.push(format!(
                "case {case} ({what}): files lost or changed: {lost:?}"
            ));
        }
        // One field changed, the rest of the image right: the repair must
        // give back exactly the files of the undamaged image.
        if files_after != base_files {
            let diff: Vec<_> = base_files
                .iter()
                .filter(|(p, r)| files_after.get(*p) != Some(r))
                .map(|(p, _)| p.clone())
                .chain(
                    files_after
                        .keys()
                        .filter(|p| !base_files.contains_key(*p))
                        .cloned(),
                )
                .take(5)
                .collect();
            failures.push(format!(
                "case {case} ({what}): files differ from the undamaged image: {diff:?}"
            ));
        }
        if case % sample == 0 {
            let p = tmp.path().join("sample.img");
            write_image(&dev, &p);
            if let Err(m) = progs_clean(&p) {
                failures.push(format!("case {case} ({what}): {m}"));
            }
            match LoopMount::new(&p, "ro") {
                Ok(m) => {
                    let n = std::fs::read_dir(m.path().join("a"))
                        .map(|d| d.count())
                        .unwrap_or(0);
                    if (n as u64) < small_files() {
                        failures.push(format!(
                            "case {case} ({what}): kernel lists {n} entries in a/"
                        ));
                    }
                }
                Err(e) => failures.push(format!("case {case} ({what}): kernel mount: {e}")),
            }
            let _ = std::fs::remove_file(&p);
        }
    }
    eprintln!("cases per kind (repaired, clean after): {per_kind:?}");
    for k in KINDS {
        assert!(
            per_kind.get(&k).is_some_and(|(n, _)| *n > 0),
            "no case of {k:?} was visible to the checker"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A copy of the base image held in memory with one damage of `kind`
/// (drawn from `seed`), and what the damage was.
fn damaged_once(base: &Arc<Vec<u8>>, kind: Kind, seed: u64) -> (Arc<dyn BlockDevice>, String) {
    let dev: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    let targets = Targets::find(dev.clone());
    let what = damage(&dev, &targets, kind, &mut Prng::new(seed));
    (dev, what)
}

/// The base image with one damage of each kind at once.
fn damaged_everywhere(base: &Arc<Vec<u8>>) -> Arc<Vec<u8>> {
    let dev = Arc::new(CrashDevice::from_shared(base.clone()));
    let d: Arc<dyn BlockDevice> = dev.clone();
    let targets = Targets::find(d.clone());
    let mut rng = Prng::new(0x9e3779b97f4a7c15);
    for kind in KINDS {
        if kind == Kind::PrimarySuperblock {
            continue;
        }
        damage(&d, &targets, kind, &mut rng);
    }
    Arc::new(dev.crash_image(|_| true))
}

#[test]
fn repair_cut_at_every_write() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(base) = base_image(tmp.path()) else {
        return;
    };
    let damaged = damaged_everywhere(&base);
    let fresh = || -> Arc<CrashDevice> { Arc::new(CrashDevice::from_shared(damaged.clone())) };
    let d0: Arc<dyn BlockDevice> = fresh();
    let original = error_set(&check(&d0).expect("check damaged"));
    assert!(original.len() >= 5, "too little damage: {original:?}");
    let files = read_all(d0.clone()).expect("read damaged");
    // How many writes a whole repair makes.
    let count = {
        let d = fresh();
        let t = Target::Device(d.clone());
        let p = repair::plan(
            &t,
            CheckOptions::default(),
            RepairOptions::default(),
            &NoProgress,
        )
        .unwrap();
        let before = d.writes();
        let o = repair::carry_out(&t, CheckOptions::default(), p, &NoProgress).unwrap();
        assert!(
            o.after.as_ref().is_some_and(|a| a.is_clean()),
            "{:?}",
            o.after.map(|a| error_set(&a))
        );
        d.writes() - before
    };
    assert!(count >= 4, "a repair of {count} writes");
    let mut subsets = Prng::new(0x853c49e6748fea9b);
    let mut outcomes = [0u32; 2];
    for cut in 0..count {
        let d = fresh();
        let t = Target::Device(d.clone());
        let p = repair::plan(
            &t,
            CheckOptions::default(),
            RepairOptions::default(),
            &NoProgress,
        )
        .unwrap();
        d.fail_after_writes(Some(cut));
        let img = t_open_writable(&d);
        assert!(
            repair::apply(img, &p.plan, &NoProgress).is_err(),
            "cut {cut} of {count} should fail"
        );
        for variant in 0..4 {
            let s = subsets.next_u64();
            let c: Arc<dyn BlockDevice> = Arc::new(match variant {
                0 => d.crash_device(|_| false),
                1 => d.crash_device(|_| true),
                2 => d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
                _ => d.crash_device_torn(|i, j| (s >> ((i * 7 + j) % 64)) & 1 == 1),
            });
            let r = check(&c).unwrap_or_else(|| panic!("cut {cut} variant {variant}: unreadable"));
            let got = error_set(&r);
            if got.is_empty() {
                outcomes[1] += 1;
            } else {
                assert_eq!(
                    got, original,
                    "cut {cut} variant {variant}: neither the original findings nor clean"
                );
                outcomes[0] += 1;
                // The interrupted repair can simply be run again.
                let t2 = Target::Device(c.clone());
                let p2 = repair::plan(
                    &t2,
                    CheckOptions::default(),
                    RepairOptions::default(),
                    &NoProgress,
                )
                .unwrap();
                let o2 = repair::carry_out(&t2, CheckOptions::default(), p2, &NoProgress).unwrap();
                assert!(
                    o2.after.is_some_and(|a| a.is_clean()),
                    "cut {cut}: second repair"
                );
            }
            assert!(
                lost_files(&files, &read_all(c.clone()).unwrap_or_default()).is_empty(),
                "cut {cut} variant {variant}: files changed"
            );
        }
    }
    eprintln!(
        "{count} cut points: {} original, {} clean",
        outcomes[0], outcomes[1]
    );
    assert!(outcomes[0] > 0 && outcomes[1] > 0);
}

fn t_open_writable(d: &Arc<CrashDevice>) -> btrkit_core::image::Image {
    btrkit_core::image::Image::open(
        d.clone(),
        btrkit_core::image::OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn binary_dry_run_yes_and_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(base) = base_image(tmp.path()) else {
        return;
    };
    let damaged = damaged_everywhere(&base);
    let img = tmp.path().join("d.img");
    std::fs::write(&img, damaged.as_slice()).unwrap();
    let digest = || sha(&img);
    let d0 = digest();
    // --dry-run: the plan, nothing written, exit 4 (errors found).
    let r = run_fsck(&img, &["--repair", "--dry-run"], Duration::from_secs(120));
    assert_eq!(r.code, 4, "{}", r.stderr);
    let v = r.json();
    assert!(v["actions"].as_array().is_some_and(|a| a.len() >= 5), "{v}");
    assert_eq!(v["committed"], false);
    assert_eq!(digest(), d0, "--dry-run wrote to the image");
    // No terminal and no --yes: refused, nothing written.
    let r = run_fsck(&img, &["--repair"], Duration::from_secs(120));
    assert_eq!(r.code, 16, "{}", r.stderr);
    assert!(r.stderr.contains("--yes"), "{}", r.stderr);
    assert_eq!(digest(), d0);
    // --yes: repaired, exit 1, then clean (exit 0) to btrkit and btrfs check.
    let r = run_fsck(&img, &["--repair", "--yes"], Duration::from_secs(120));
    assert_eq!(r.code, 1, "{} {}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["committed"], true);
    assert_eq!(v["clean_after"], true);
    assert!(v["changes"].as_array().is_some_and(|c| !c.is_empty()));
    assert_eq!(run_fsck(&img, &[], Duration::from_secs(60)).code, 0);
    progs_clean(&img).unwrap();
    // Nothing left to do: exit 0, nothing written.
    let d1 = digest();
    let r = run_fsck(&img, &["--repair", "--yes"], Duration::from_secs(60));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(digest(), d1);
    let m = LoopMount::new(&img, "").expect("mount repaired");
    assert!(m.path().join("a/f300").exists());
    drop(m);
    // A bad option value is a usage error.
    let r = run_fsck(
        &img,
        &["--repair", "--clear-space-cache", "v3"],
        Duration::from_secs(60),
    );
    assert_eq!(r.code, 16);
    let r = run_fsck(&img, &["--dry-run"], Duration::from_secs(60));
    assert_eq!(r.code, 16, "--dry-run without --repair");
}

fn sha(p: &Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split(' ')
        .next()
        .unwrap_or("")
        .to_string()
}

/// Orphan items are what the kernel's orphan cleanup acts on at the next
/// read-write mount: warnings, and --repair does the same now (an item
/// naming no inode dropped, a linked inode's item dropped after cutting it
/// to its size, an unlinked inode deleted with its data).
#[test]
fn orphan_items_cleaned_up_as_the_kernel_does() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(base) = base_image(tmp.path()) else {
        return;
    };
    let dev: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    let files = read_all(dev.clone()).expect("read base");
    let targets = Targets::find(dev.clone());
    // A linked regular file of the subvolume.
    let linked = targets
        .files
        .iter()
        .find(|l| l.tree == BTRFS_FS_TREE_OBJECTID)
        .expect("a file")
        .key
        .objectid;
    {
        let mut st = btrkit_core::trans::Store::open(dev.clone()).unwrap();
        for ino in [linked, 888_888] {
            let k = btrkit_core::format::key::Key::new(
                BTRFS_ORPHAN_OBJECTID,
                BTRFS_ORPHAN_ITEM_KEY,
                ino,
            );
            st.insert_item(BTRFS_FS_TREE_OBJECTID, &k, &[]).unwrap();
        }
        st.commit().unwrap();
    }
    let r = check(&dev).expect("check");
    assert!(
        r.is_clean(),
        "orphan items are not errors: {:?}",
        error_set(&r)
    );
    let orphans = r
        .findings
        .iter()
        .filter(|f| f.category == "orphan" && f.repair.is_some())
        .count();
    assert_eq!(orphans, 2, "{:?}", r.findings);
    let target = Target::Device(dev.clone());
    let planned = repair::plan(
        &target,
        CheckOptions::default(),
        RepairOptions::default(),
        &NoProgress,
    )
    .unwrap();
    let done = repair::carry_out(&target, CheckOptions::default(), planned, &NoProgress).unwrap();
    assert!(done.committed, "{:?}", done.plan);
    let after = done.after.expect("checked after");
    assert!(
        after.is_clean() && !after.findings.iter().any(|f| f.category == "orphan"),
        "{:?}",
        after.findings
    );
    assert_eq!(read_all(dev.clone()).expect("read after"), files);
    let p = tmp.path().join("orphans.img");
    write_image(&dev, &p);
    progs_clean(&p).unwrap();
    let m = LoopMount::new(&p, "ro").expect("kernel mount");
    assert!(m.path().join("a/f300").exists());
}

/// `--clear-space-cache v2` on its own (as btrfs check runs it): the free
/// space tree rebuilt from the extent tree in one commit, nothing checked;
/// a damaged free space tree is then gone, the files are the same, and
/// btrfs check and the kernel agree.
#[test]
fn clear_space_cache_v2_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(base) = base_image(tmp.path()) else {
        return;
    };
    let (dev, what) = damaged_once(&base, Kind::FreeSpaceInfoCount, 0x1234_5678_9abc_def1);
    let files = read_all(dev.clone()).expect("read damaged image");
    let img = tmp.path().join("fst.img");
    write_image(&dev, &img);
    assert_eq!(
        run_fsck(&img, &[], Duration::from_secs(120)).code,
        4,
        "{what}: not seen"
    );
    let r = run_fsck(
        &img,
        &["--repair", "--yes", "--clear-space-cache", "v2"],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 0, "{what}: {} {}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["committed"], true);
    assert_eq!(v["checked"], false);
    assert_eq!(v["clear_space_cache"], "v2");
    let after = run_fsck(&img, &[], Duration::from_secs(120));
    assert_eq!(after.code, 0, "{what}: not clean after: {}", after.stdout);
    progs_clean(&img).unwrap();
    let dev_after: Arc<dyn BlockDevice> =
        Arc::new(btrkit_core::io::FileDevice::open(&img, false).unwrap());
    assert_eq!(read_all(dev_after).expect("read repaired image"), files);
    let m = LoopMount::new(&img, "ro").expect("kernel mount");
    assert!(m.path().join("a/f300").exists());
}

/// The two repairs only asked for by option: `--clear-space-cache v1` on
/// a kernel-written v1 cache, and `--init-csum-tree` after the checksum
/// tree lost items (checksums fixed, so only the coverage is wrong).
#[test]
fn clear_v1_cache_and_init_csum_tree() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A v1 cache: no free space tree, mounted with space_cache=v1; 4 GiB
    // (sparse), as the kernel writes no cache for block groups under
    // 100 MiB.
    let img = tmp.path().join("v1.img");
    sh(&format!(
        "truncate -s 4G '{0}' && mkfs.btrfs -q -f -R ^free-space-tree '{0}'",
        img.display()
    ));
    {
        let m = LoopMount::new(&img, "space_cache=v1").expect("mount v1");
        sh(&format!(
            "cd '{}' && mkdir d && for i in $(seq 1 50); do head -c 30000 /dev/urandom > d/f$i; done && rm d/f1* && sync",
            m.path().display()
        ));
    }
    let headers = |img: &Path| {
        items_of(
            Arc::new(btrkit_core::io::FileDevice::open(img, false).unwrap()),
            BTRFS_ROOT_TREE_OBJECTID,
            &|k, _| k.objectid == BTRFS_FREE_SPACE_OBJECTID,
        )
        .len()
    };
    assert!(headers(&img) > 0, "the kernel wrote no v1 cache");
    let files = read_all(Arc::new(
        btrkit_core::io::FileDevice::open(&img, false).unwrap(),
    ));
    let r = run_fsck(
        &img,
        &["--repair", "--yes", "--clear-space-cache", "v1"],
        Duration::from_secs(120),
    );
    assert_eq!(
        r.code, 0,
        "clean before and after: {} {}",
        r.stdout, r.stderr
    );
    assert_eq!(r.json()["committed"], true);
    assert_eq!(headers(&img), 0, "v1 cache headers left");
    progs_clean(&img).unwrap();
    let after = read_all(Arc::new(
        btrkit_core::io::FileDevice::open(&img, false).unwrap(),
    ));
    assert_eq!(files, after);
    {
        let m = LoopMount::new(&img, "").expect("mount after clearing v1");
        assert!(m.path().join("d/f50").exists());
    }

    // Checksums lost: every EXTENT_CSUM item of one leaf gone is beyond a
    // field change, so the csum tree's first item is shortened instead:
    // the data it covered has no checksums any more.
    let csums = items_of(
        Arc::new(btrkit_core::io::FileDevice::open(&img, false).unwrap()),
        BTRFS_CSUM_TREE_OBJECTID,
        &|k, _| k.ty == BTRFS_EXTENT_CSUM_KEY,
    );
    assert!(!csums.is_empty());
    let l = csums[0].clone();
    {
        let dev: Arc<dyn BlockDevice> =
            Arc::new(btrkit_core::io::FileDevice::open(&img, true).unwrap());
        // Zero the checksums themselves: every data sector they cover
        // now fails its checksum, which --check-data-csum reports.
        patch_tree_block(&dev, l.bytenr, &|b| {
            for x in &mut b[l.data_off..l.data_off + l.data_len] {
                *x = 0;
            }
        });
    }
    let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 4, "zeroed checksums not found: {}", r.stdout);
    // Without --init-csum-tree they are not repaired.
    let r = run_fsck(
        &img,
        &["--repair", "--yes", "--check-data-csum"],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 4);
    let r = run_fsck(
        &img,
        &["--repair", "--yes", "--check-data-csum", "--init-csum-tree"],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 1, "{} {}", r.stdout, r.stderr);
    assert_eq!(
        run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120)).code,
        0
    );
    progs_clean(&img).unwrap();
    let v = oracle::btrfs_check_with(&[&img], Progs::Distro, &["--check-data-csum"], None).unwrap();
    assert!(v.clean, "{}", v.stderr);
    let after = read_all(Arc::new(
        btrkit_core::io::FileDevice::open(&img, false).unwrap(),
    ));
    assert_eq!(files, after);
}

/// Every quota group's counts in `btrfs check --qgroup-report` output:
/// id -> (our referenced, our exclusive, disk referenced, disk exclusive).
fn progs_qgroup_report(out: &str) -> BTreeMap<String, [u64; 4]> {
    let mut m = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("Counts for qgroup id: ") {
            cur = rest.split_whitespace().next().map(str::to_string);
            continue;
        }
        let Some(id) = &cur else { continue };
        let mut w = line.split_whitespace();
        let (Some(who), Some(what), Some(n)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        let slot = match (who, what) {
            ("our:", "referenced") => 0,
            ("our:", "exclusive") => 1,
            ("disk:", "referenced") => 2,
            ("disk:", "exclusive") => 3,
            _ => continue,
        };
        m.entry(id.clone()).or_insert([0u64; 4])[slot] = n;
    }
    m
}

/// The quota groups of a `--qgroup-report --json` report, as
/// [`progs_qgroup_report`] gives btrfs check's.
fn qgroups_of(v: &serde_json::Value) -> BTreeMap<String, [u64; 4]> {
    v["qgroups"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            let n = |k: &str| g[k].as_u64().expect("count");
            (
                g["name"].as_str().expect("name").to_string(),
                [
                    n("referenced"),
                    n("exclusive"),
                    n("disk_referenced"),
                    n("disk_exclusive"),
                ],
            )
        })
        .collect()
}

/// btrfs check 6.2 (and 6.14 when installed) `--qgroup-report` on `img`
/// lists the same quota groups with the same counts, computed and on disk.
fn same_as_btrfs_check(img: &Path, ours: &BTreeMap<String, [u64; 4]>, what: &str) {
    for p in all_progs() {
        let v = oracle::btrfs_check_with(&[img], p, &["--qgroup-report"], None)
            .expect("run btrfs check");
        let theirs = progs_qgroup_report(&v.stdout);
        assert!(!theirs.is_empty(), "{}: no report", p.name());
        for (id, t) in &theirs {
            assert_eq!(
                ours.get(id),
                Some(t),
                "{what}: qgroup {id}: btrkit {:?}, {} {t:?}",
                ours.get(id),
                p.name()
            );
        }
        for id in ours.keys() {
            assert!(theirs.contains_key(id), "{}: no qgroup {id}", p.name());
        }
    }
}

/// `--qgroup-report`: every quota group's counts on disk and recomputed,
/// the same numbers `btrfs check --qgroup-report` computes (6.2 and 6.14),
/// a damaged count shown as different (exit 4) and gone after `--repair`;
/// an image without quotas says so (exit 0); with `--repair` a usage error.
#[test]
fn qgroup_report_matches_btrfs_check() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(base) = base_image(tmp.path()) else {
        return;
    };
    let (dev, what) = damaged_once(&base, Kind::QgroupInfo, 0x5151_7a7a_0b0b_3c3d);
    let img = tmp.path().join("q.img");
    write_image(&dev, &img);
    let r = run_fsck(&img, &["--qgroup-report"], Duration::from_secs(120));
    assert_eq!(r.code, 4, "{what}: {} {}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["quotas"], true, "{v}");
    let ours = qgroups_of(&v);
    assert!(ours.len() >= 2, "{v}");
    assert!(
        v["different"].as_u64().is_some_and(|d| d >= 1),
        "{what}: {v}"
    );
    same_as_btrfs_check(&img, &ours, &what);
    // The table for people names the group that differs.
    let mut c = std::process::Command::new(fsck_bin());
    c.args(["--qgroup-report"]).arg(&img);
    let h = run_with_limit(c, Duration::from_secs(120));
    assert_eq!(h.code, 4);
    assert!(
        h.stdout.contains("different") && h.stdout.contains("--repair recounts"),
        "{}",
        h.stdout
    );
    // With --repair: a usage error, nothing written.
    let r = run_fsck(
        &img,
        &["--qgroup-report", "--repair", "--yes"],
        Duration::from_secs(60),
    );
    assert_eq!(r.code, 16, "{}", r.stderr);
    // Recounted by the repair: no difference left.
    let r = run_fsck(&img, &["--repair", "--yes"], Duration::from_secs(120));
    assert_eq!(r.code, 1, "{} {}", r.stdout, r.stderr);
    let r = run_fsck(&img, &["--qgroup-report"], Duration::from_secs(120));
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(r.json()["different"], 0, "{}", r.stdout);
    // Groups above the subvolumes (one holding the top level and the
    // snapshot, shared extents counted once, exclusive only when every
    // holder is a member): counts as btrfs check computes them.
    // The rescan `quota enable` starts is waited for before the groups are
    // assigned: a `rescan -w` issued while it runs only waits for it, and
    // that rescan, begun before the assignments, leaves the upper groups'
    // counts at zero with the status saying consistent.
    let nested = kernel_image(
        tmp.path(),
        "nested.img",
        "",
        "",
        "set -e\n\
         mkdir a; for i in $(seq 1 50); do head -c 9000 /dev/urandom > a/f$i; done\n\
         btrfs -q subvolume create s; cp -r a s/\n\
         btrfs -q subvolume snapshot s t; echo new > t/a/f1\n\
         btrfs -q quota enable .\n\
         btrfs -q quota rescan -w .\n\
         btrfs -q qgroup create 1/100 .; btrfs -q qgroup create 2/7 .\n\
         btrfs -q qgroup assign --no-rescan 0/256 1/100 .; btrfs -q qgroup assign --no-rescan 0/257 1/100 .\n\
         btrfs -q qgroup assign --no-rescan 1/100 2/7 .; btrfs -q qgroup assign --no-rescan 0/5 2/7 .\n\
         btrfs -q quota rescan -w .\n\
         sync",
    );
    let r = run_fsck(&nested, &["--qgroup-report"], Duration::from_secs(120));
    let v = r.json();
    assert_eq!(r.code, 0, "{v}");
    assert_eq!(v["different"], 0, "{v}");
    let ours = qgroups_of(&v);
    for id in ["0/5", "0/256", "0/257", "1/100", "2/7"] {
        assert!(ours.contains_key(id), "no qgroup {id}: {v}");
    }
    same_as_btrfs_check(&nested, &ours, "nested groups");
    // A status item of a version the kernel does not know: no counts,
    // and the report says why rather than that quotas are off.
    let st = items_of(dev.clone(), BTRFS_QUOTA_TREE_OBJECTID, &|k, _| {
        k.ty == BTRFS_QGROUP_STATUS_KEY
    });
    assert_eq!(st.len(), 1);
    patch_tree_block(&dev, st[0].bytenr, &|b| set_u64(b, st[0].data_off, 2));
    let unknown = tmp.path().join("v2.img");
    write_image(&dev, &unknown);
    let r = run_fsck(&unknown, &["--qgroup-report"], Duration::from_secs(60));
    let v = r.json();
    assert_eq!(v["quotas"], true, "{v}");
    assert!(v["qgroups"]["not_computed"].is_string(), "{v}");
    let mut c = std::process::Command::new(fsck_bin());
    c.args(["--qgroup-report"]).arg(&unknown);
    let h = run_with_limit(c, Duration::from_secs(60));
    assert!(h.stdout.contains("no counts were computed"), "{}", h.stdout);
    // No quotas: said, exit 0.
    let plain = tmp.path().join("plain.img");
    std::fs::File::create(&plain)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let o = std::process::Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(&plain)
        .output()
        .expect("mkfs.btrfs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = run_fsck(&plain, &["--qgroup-report"], Duration::from_secs(60));
    assert!(r.code == 0 || r.code == 4, "{}", r.stderr);
    assert_eq!(r.json()["quotas"], false, "{}", r.stdout);
    let mut c = std::process::Command::new(fsck_bin());
    c.args(["--qgroup-report"]).arg(&plain);
    let h = run_with_limit(c, Duration::from_secs(60));
    assert!(h.stdout.contains("quotas are not enabled"), "{}", h.stdout);
}

/// The check after a repair takes the subvolume trees the repair left
/// alone from the check before it (`check::reuse`): its report must be the
/// one a fresh check of the repaired image gives, finding for finding and
/// count for count, whether the damage was in a subvolume tree (walked
/// again) or elsewhere (taken as it was). An image without snapshots, so
/// that no tree shares blocks (the condition for taking a tree).
#[test]
fn check_after_repair_equals_a_fresh_check() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = WORKLOAD.replace("FILES", "300").replace(
        "btrfs -q subvolume snapshot . snap\necho changed > snap/a/f5\n",
        "",
    );
    let img = kernel_image(tmp.path(), "flat.img", "", "", &script);
    let base = Arc::new(std::fs::read(&img).expect("read image"));
    let clean: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    let targets = Targets::find(clean.clone());
    let mut rng = Prng::new(0x9e3779b97f4a7c15);
    let mut reused = 0;
    for kind in [
        Kind::BlockGroupUsed,
        Kind::SuperBytesUsed,
        Kind::DevItemBytesUsed,
        Kind::InodeNlink,
        Kind::DirSize,
        Kind::FileNbytes,
    ] {
        for _ in 0..3 {
            let dev: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
            let what = damage(&dev, &targets, kind, &mut rng);
            let target = Target::Device(dev.clone());
            let planned = repair::plan(
                &target,
                CheckOptions::default(),
                RepairOptions::default(),
                &NoProgress,
            )
            .unwrap();
            if planned.before.errors == 0 {
                continue;
            }
            assert!(
                planned
                    .before
                    .prior
                    .as_ref()
                    .is_some_and(|p| p.trees() >= 1),
                "{what}: the check before the repair kept no tree"
            );
            let done =
                repair::carry_out(&target, CheckOptions::default(), planned, &NoProgress).unwrap();
            let after = done.after.expect("repaired");
            reused += after.reused_trees;
            let fresh = check(&dev).expect("fresh check");
            assert_eq!(error_set(&after), error_set(&fresh), "{what}");
            assert_eq!(
                (after.errors, after.warnings),
                (fresh.errors, fresh.warnings),
                "{what}"
            );
            let counts = |r: &Report| {
                r.phases
                    .iter()
                    .map(|p| (p.phase, p.checked))
                    .collect::<Vec<_>>()
            };
            assert_eq!(counts(&after), counts(&fresh), "{what}: phase counts");
            if !matches!(kind, Kind::InodeNlink | Kind::DirSize | Kind::FileNbytes) {
                assert!(after.reused_trees >= 1, "{what}: no tree taken");
            }
        }
    }
    assert!(reused > 0);
}

/// A repair writes nothing only where a tree cannot be walked whole (what
/// it references is unknown), and says which tree and block; damage in
/// derived records (a block group's used bytes beyond its length) beside
/// it does not matter, and alone is repaired.
#[test]
fn refused_only_where_a_tree_cannot_be_walked() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = WORKLOAD.replace("FILES", "300").replace(
        "btrfs -q subvolume snapshot . snap\necho changed > snap/a/f5\n",
        "",
    );
    let img = kernel_image(tmp.path(), "walk.img", "", "", &script);
    let base = Arc::new(std::fs::read(&img).expect("read image"));
    let clean: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    let targets = Targets::find(clean.clone());
    let bg = targets.block_groups[0].clone();
    let over = |dev: &Arc<dyn BlockDevice>| {
        // used far beyond the group's length: derived, recounted.
        patch_tree_block(dev, bg.bytenr, &|b| {
            set_u64(b, bg.data_off, bg.key.offset * 7 + 4096)
        });
    };
    // The derived damage alone: repaired, clean.
    let dev: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    over(&dev);
    let t = Target::Device(dev.clone());
    let p = repair::plan(
        &t,
        CheckOptions::default(),
        RepairOptions::default(),
        &NoProgress,
    )
    .unwrap();
    assert!(p.plan.refused.is_none(), "{:?}", p.plan.refused);
    let done = repair::carry_out(&t, CheckOptions::default(), p, &NoProgress).unwrap();
    assert!(done.after.as_ref().is_some_and(|a| a.is_clean()));
    // With a leaf of tree 5 whose every copy fails its checksum: refused,
    // naming the tree and the block, nothing written.
    let leaf = targets
        .files
        .iter()
        .find(|l| l.tree == 5)
        .expect("a file in tree 5");
    let dev: Arc<dyn BlockDevice> = Arc::new(CrashDevice::from_shared(base.clone()));
    over(&dev);
    {
        let img = btrkit_core::image::Image::open(dev.clone(), Default::default()).unwrap();
        let ns = img.nodesize as u64;
        for phys in img.chunks.map(leaf.bytenr, ns, img.devid).unwrap() {
            let mut b = [0u8; 1];
            dev.read_at(phys, &mut b).unwrap();
            b[0] ^= 0xff;
            dev.write_at(phys, &b).unwrap();
        }
        dev.flush().unwrap();
    }
    let before: Vec<u8> = {
        let mut v = vec![0u8; dev.size() as usize];
        dev.read_at(0, &mut v).unwrap();
        v
    };
    let t = Target::Device(dev.clone());
    let p = repair::plan(
        &t,
        CheckOptions::default(),
        RepairOptions::default(),
        &NoProgress,
    )
    .unwrap();
    let why = p.plan.refused.clone().expect("refused");
    assert!(
        why.contains("tree 5") && why.contains(&leaf.bytenr.to_string()),
        "{why}"
    );
    let done = repair::carry_out(&t, CheckOptions::default(), p, &NoProgress).unwrap();
    assert!(!done.committed);
    let mut after = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut after).unwrap();
    assert!(before == after, "a refused repair wrote");
}
