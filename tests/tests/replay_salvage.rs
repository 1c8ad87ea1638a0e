//! `btrkit-replay --salvage` on kernel crash images whose log is damaged.
//!
//! For each crash image below, every block of its log (the log root tree's
//! and every log tree's, interior nodes and leaves) is made unreadable in
//! turn, in all its copies, and `btrkit-replay --salvage -o OUT` must:
//! - exit 0 and leave the damaged image as it was;
//! - write an OUT without a log that `btrfs check --readonly` passes and the
//!   kernel mounts;
//! - be never worse than zero-log: every inode OUT shows holds what the
//!   kernel's replay of the undamaged log gives it or what the last commit
//!   holds (contents, size, mode, owner, xattrs, extent map, symlink
//!   target), and every inode the kernel and zero-log both keep is still
//!   there;
//! - report truthfully per inode: an inode reported recovered shows the
//!   kernel's state, one reported not recovered the last commit's;
//! - for a damaged log root tree, give the zero-log result and say so.
//!
//! `BTRKIT_SALVAGE_SCENARIOS=a,b` limits the scenarios. An image whose log
//! has more than `BTRKIT_SALVAGE_MAX_BLOCKS` blocks (default 48) has every
//! interior node and log root tree block damaged, and leaves spread evenly
//! over the log up to that number (the multi-level logs have hundreds of
//! leaves, each run mounts and checks an image); `BTRKIT_SALVAGE_MAX_BLOCKS=0`
//! damages every block of every image. The headline test (10,000 fsynced
//! files, one leaf lost) is below.

use btrkit_tests::kcrash::{self, Manifest, Scenario};
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::salvage::{by_inode, damage_block, log_blocks, same_content, LogBlock};
use btrkit_tests::LoopMount;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Scenarios of the corpus whose logs exercise salvage: names moving
/// between directories, links, deletions, several subvolume logs,
/// checksums, and multi-level logs of thousands of inodes.
const CORPUS: &[&str] = &[
    "new-file-fsync",
    "new-ancestors",
    "rename-across-dirs",
    "rename-across-dirs-fsync-new-dir",
    "rename-over-existing",
    "rename-then-new-name",
    "rename-dir",
    "hardlink-many",
    "hardlink-remove",
    "unlink-fsync-dir",
    "rmdir-fsync-parent",
    "dir-fsync-new-subdirs",
    "xattr-remove",
    "truncate-down",
    "punch-hole",
    "compress-zstd",
    "subvol-two-logs",
    "snapshot-fsync",
    "many-files-fsync-each-nodesize4k",
    "many-files-one-dir-fsync",
];

/// Thousands of files fsynced one by one in two directories, with renames,
/// links, a logged directory deletion and xattrs on top, on 4 KiB nodes: a
/// log of three levels whose inodes spread over many leaves.
const SALVAGE_MULTI: &str = "\
# Two directories of files fsynced one by one, then (all in the log) a file
# renamed across directories, a link added, data overwritten, an xattr set,
# a file unlinked with its directory fsynced, and a new file. The 4 KiB
# nodes and the roomy image keep the kernel from committing on its way.
mkfs -n 4096
fssize 8G
mkdir /a
mkdir /b
mkdir /c
mkdir /c/sub
write /a/old1 0 8K 0x11
write /b/old2 0 8K 0x22
write /c/old3 0 3000 0x33
write /c/sub/x 0 5000 0x44
write /a/keep 0 20000 0x55
sync
writefiles /a 1000 100-6000 fsync
writefiles /b 1000 100-6000 fsync
write /a/old1 8K 4K 0x12
fsync /a/old1
rename /a/old1 /b/moved1
fsync /b/moved1
write /b/old2 8K 4K 0x23
link /b/old2 /c/link2
fsync /b/old2
write /a/keep 4096 8192 0x66
fsync /a/keep
setxattr /b/f00010 user.a blue
fsync /b/f00010
unlink /a/f00003
fsync /a
write /c/new 0 9000 0x77
fsync /c/new
crash
";

/// Two subvolume logs of several levels, each with hundreds of fsynced
/// files, and on top: a logged directory deletion (rmdir and unlink with the
/// directory fsynced), a directory moved to another parent, a hard link, a
/// symlink, and a rename over an existing file.
const SALVAGE_MULTI_NS: &str = "\
mkfs -n 4096
fssize 8G
subvol-create /s
mkdir /a
mkdir /b
mkdir /a/d1
write /a/d1/x 0 6000 0x31
write /a/gone 0 5000 0x32
write /b/victim 0 7000 0x33
write /s/old 0 9000 0x34
mkdir /a/empty
sync
writefiles /a 300 100-6000 fsync
rmdir /a/empty
unlink /a/gone
fsync /a
write /a/d1/x 6000 3000 0x35
fsync /a/d1/x
rename /a/d1 /b/d1
fsync /b/d1/x
writefiles /s 300 100-6000 fsync
write /s/old 0 4096 0x36
fsync /s/old
link /s/f00005 /s/again
fsync /s/f00005
symlink /b/victim /b/link
fsync /b
writefiles /b 300 100-6000 fsync
rename /b/f00002 /b/victim
fsync /b/victim
crash
";

fn scenarios() -> Vec<Scenario> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut v: Vec<Scenario> = CORPUS
        .iter()
        .map(|n| {
            kcrash::load_scenario(&dir.join(format!("{n}.scn")))
                .unwrap_or_else(|e| panic!("{n}: {e}"))
        })
        .collect();
    v.push(Scenario::parse("salvage-multi", SALVAGE_MULTI).expect("salvage-multi parses"));
    v.push(Scenario::parse("salvage-multi-ns", SALVAGE_MULTI_NS).expect("salvage-multi-ns parses"));
    if let Ok(only) = std::env::var("BTRKIT_SALVAGE_SCENARIOS") {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        v.retain(|s| names.contains(&s.name.as_str()));
    }
    v
}

/// The blocks to damage: all of them, or for a large log every interior
/// node and log root tree block plus leaves spread evenly up to `max`.
fn pick(blocks: &[LogBlock]) -> Vec<&LogBlock> {
    let max: usize = std::env::var("BTRKIT_SALVAGE_MAX_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    if max == 0 || blocks.len() <= max {
        return blocks.iter().collect();
    }
    let (inner, leaves): (Vec<&LogBlock>, Vec<&LogBlock>) =
        blocks.iter().partition(|b| b.level > 0 || b.in_root_tree());
    let want = max.saturating_sub(inner.len()).max(2);
    let mut out = inner;
    let step = (leaves.len() - 1) as f64 / (want - 1) as f64;
    let mut idx: Vec<usize> = (0..want)
        .map(|i| (i as f64 * step).round() as usize)
        .collect();
    idx.dedup();
    out.extend(idx.into_iter().filter_map(|i| leaves.get(i).copied()));
    out
}

/// `btrfs rescue zero-log` on a copy of `crash`, then its manifest and the
/// subvolume id of every subvolume root path in it.
fn zero_log_manifest(
    crash: &Path,
    work: &Path,
) -> Result<(Manifest, BTreeMap<String, u64>), String> {
    let zl = work.join("zero-log.img");
    kcrash::copy_sparse(crash, &zl)?;
    let o = Command::new("btrfs")
        .args(["rescue", "zero-log"])
        .arg(&zl)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "btrfs rescue zero-log: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let mnt = LoopMount::mount(&zl, &work.join("zl-mnt"), "ro")?;
    let r = kcrash::manifest_of_tree(mnt.path()).and_then(|m| {
        let mut ids = BTreeMap::new();
        for (p, e) in &m.entries {
            if e.kind == 'd' && e.ino == 256 {
                let full = mnt.path().join(p.trim_start_matches('/'));
                let o = Command::new("btrfs")
                    .args(["inspect-internal", "rootid"])
                    .arg(&full)
                    .output()
                    .map_err(|e| e.to_string())?;
                let id = String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| format!("rootid of {p}: {e}"))?;
                ids.insert(p.clone(), id);
            }
        }
        Ok((m, ids))
    });
    mnt.unmount()?;
    let _ = std::fs::remove_file(&zl);
    r
}

/// The reference results of one crash image.
struct Reference {
    kernel: Manifest,
    zero_log: Manifest,
    /// Subvolume root path -> subvolume id.
    subvols: BTreeMap<String, u64>,
}

fn salvage(img: &Path, out: &Path) -> Result<Value, String> {
    salvage_run(img, &[Path::new("-o"), out])
}

fn salvage_run(img: &Path, more: &[&Path]) -> Result<Value, String> {
    let o = Command::new(kcrash::replay_bin())
        .args(["--salvage", "--json"])
        .arg(img)
        .args(more)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "btrkit-replay --salvage: exit {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("--json output: {e}"))
}

/// Every property of one salvaged image; Err lists what fails.
fn check_salvaged(
    b: &LogBlock,
    out: &Path,
    report: &Value,
    r: &Reference,
) -> Result<(usize, usize), String> {
    let mut problems = Vec::new();
    let s = &report["summary"]["salvage"];
    if s.is_null() {
        return Err("no salvage report in --json".into());
    }
    match kcrash::super_log_root(out) {
        Ok((_, 0)) => {}
        Ok((_, l)) => problems.push(format!("log_root is {l}, not 0")),
        Err(e) => return Err(e),
    }
    if let Err(e) = oracle::check_clean(&[out], Progs::Distro) {
        problems.push(e);
    }
    let mine = kcrash::manifest_in_place(out, "ro").map_err(|e| format!("mount: {e}"))?;
    if b.in_root_tree() {
        if s["zero_log"].is_null() {
            problems.push(
                "the log root tree is damaged but the report does not say the result is zero-log"
                    .into(),
            );
        }
        if mine != r.zero_log {
            problems.push(format!(
                "damaged log root tree, but not the zero-log result:\n{}",
                r.zero_log.short_diff(&mine, 10)
            ));
        }
    }
    let (k, z, m) = (by_inode(&r.kernel), by_inode(&r.zero_log), by_inode(&mine));
    // How the report calls each inode: (subvol id, ino) -> recovered.
    let mut said: BTreeMap<(u64, u64), bool> = BTreeMap::new();
    for i in s["inodes"].as_array().into_iter().flatten() {
        let (sv, ino) = (
            i["subvol"].as_u64().unwrap_or(0),
            i["ino"].as_u64().unwrap_or(0),
        );
        said.insert((sv, ino), i["outcome"] == "recovered");
    }
    for (key, (path, e)) in &m {
        let kk = k.get(key).map(|x| &x.1);
        let zz = z.get(key).map(|x| &x.1);
        let as_kernel = kk.is_some_and(|x| same_content(x, e));
        let as_commit = zz.is_some_and(|x| same_content(x, e));
        if !as_kernel && !as_commit {
            problems.push(format!(
                "{path} (inode {}) is neither the kernel's nor the last commit's: {:?}; kernel {:?}; commit {:?}",
                key.1,
                e,
                kk,
                zz
            ));
            continue;
        }
        // The report's word on it.
        let subvol = r.subvols.get(&key.0).copied().unwrap_or(0);
        if let Some(&recovered) = said.get(&(subvol, key.1)) {
            if recovered && !as_kernel {
                problems.push(format!(
                    "{path} (inode {}) is reported recovered but is not the kernel's",
                    key.1
                ));
            }
            if !recovered && !as_commit && !b.in_root_tree() {
                problems.push(format!(
                    "{path} (inode {}) is reported not recovered but is not the last commit's",
                    key.1
                ));
            }
        }
    }
    // An inode reported recovered that the kernel's replay keeps is there.
    for (&(sv, ino), &recovered) in &said {
        let Some(root) = r
            .subvols
            .iter()
            .find(|(_, &id)| id == sv)
            .map(|(p, _)| p.clone())
        else {
            continue;
        };
        let key = (root, ino);
        if recovered && k.contains_key(&key) && !m.contains_key(&key) {
            problems.push(format!("inode {ino} of subvolume {sv} is reported recovered, but it is missing (the kernel keeps it at {})", k[&key].0));
        }
    }
    for (key, (path, _)) in &z {
        if k.contains_key(key) && !m.contains_key(key) {
            problems.push(format!(
                "{path} (inode {}) is kept by the kernel and by zero-log, but lost",
                key.1
            ));
        }
    }
    let recovered = s["recovered"].as_u64().unwrap_or(0) as usize;
    let not = s["not_recovered"].as_u64().unwrap_or(0) as usize;
    if problems.is_empty() {
        Ok((recovered, not))
    } else {
        Err(problems.join("\n"))
    }
}

struct ImageOutcome {
    name: String,
    blocks: usize,
    tried: usize,
    failures: Vec<String>,
    recovered_min: usize,
    logged_max: usize,
    secs: f64,
}

fn run_image(scn: &Scenario, cache: &Path) -> Result<ImageOutcome, String> {
    let t = Instant::now();
    let c = kcrash::cached_crash_image(scn, cache)?;
    if c.log_root == 0 {
        return Err("the crash image has no log".into());
    }
    let work = tempfile::Builder::new()
        .prefix(&format!("salvage-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let r = {
        let _slot = kcrash::slot();
        let (zero_log, subvols) = zero_log_manifest(&c.path, w)?;
        Reference {
            kernel: kcrash::manifest_of_image(&c.path, w)?,
            zero_log,
            subvols,
        }
    };
    let blocks = log_blocks(&c.path)?;
    let mut o = ImageOutcome {
        name: scn.name.clone(),
        blocks: blocks.len(),
        tried: 0,
        failures: Vec::new(),
        recovered_min: usize::MAX,
        logged_max: 0,
        secs: 0.0,
    };
    let dmg = w.join("damaged.img");
    let out = w.join("out.img");
    // An undamaged log: salvage replays all of it, exactly as the kernel.
    {
        let _slot = kcrash::slot();
        let report = salvage(&c.path, &out)?;
        let s = &report["summary"]["salvage"];
        if s["not_recovered"] != 0
            || !s["zero_log"].is_null()
            || !s["lost_blocks"].as_array().is_some_and(|v| v.is_empty())
        {
            let not: Vec<String> = s["inodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|i| i["outcome"] != "recovered")
                .take(5)
                .map(|i| format!("inode {} {}: {}", i["ino"], i["path"], i["reason"]))
                .collect();
            o.failures.push(format!(
                "undamaged log: salvage does not recover everything ({} not recovered, zero_log {}): {}",
                s["not_recovered"],
                s["zero_log"],
                not.join("; ")
            ));
        }
        oracle::check_clean(&[&out], Progs::Distro)?;
        let mine = kcrash::manifest_in_place(&out, "ro")?;
        if mine != r.kernel {
            o.failures.push(format!(
                "undamaged log: salvage differs from the kernel's replay:\n{}",
                r.kernel.short_diff(&mine, 10)
            ));
        }
        let _ = std::fs::remove_file(&out);
    }
    for (n, b) in pick(&blocks).into_iter().enumerate() {
        o.tried += 1;
        let _ = std::fs::remove_file(&out);
        kcrash::copy_sparse(&c.path, &dmg)?;
        damage_block(&dmg, b)?;
        let before = (n % 8 == 0)
            .then(|| kcrash::image_digest(&dmg))
            .transpose()?;
        let _slot = kcrash::slot();
        // Now and then a dry run first: it writes nothing and reports what
        // the real run then does.
        let dry = match &before {
            Some(d) => {
                let v = salvage_run(&dmg, &[Path::new("--dry-run")])?;
                if &kcrash::image_digest(&dmg)? != d {
                    return Err(format!(
                        "{}: --salvage --dry-run changed the image",
                        b.describe()
                    ));
                }
                Some(v)
            }
            None => None,
        };
        let res = salvage(&dmg, &out).and_then(|report| {
            if let Some(d) = &before {
                if &kcrash::image_digest(&dmg)? != d {
                    return Err("btrkit-replay --salvage -o changed its input".into());
                }
            }
            if let Some(v) = &dry {
                let (a, b) = (&v["summary"]["salvage"], &report["summary"]["salvage"]);
                if a["inodes"] != b["inodes"] || a["zero_log"] != b["zero_log"] {
                    return Err(format!(
                        "the dry run reports otherwise than the run: {} vs {}",
                        a["recovered"], b["recovered"]
                    ));
                }
            }
            check_salvaged(b, &out, &report, &r)
        });
        match res {
            Ok((rec, not)) => {
                if b.level == 0 && !b.in_root_tree() {
                    o.recovered_min = o.recovered_min.min(rec);
                }
                o.logged_max = o.logged_max.max(rec + not);
            }
            Err(e) => o.failures.push(format!("{}: {e}", b.describe())),
        }
    }
    o.secs = t.elapsed().as_secs_f64();
    Ok(o)
}

#[test]
fn salvage_every_log_block_of_kernel_crash_images() {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let cache = kcrash::default_cache_dir();
    let all = scenarios();
    let outcomes = kcrash::parallel_map(&all, kcrash::max_jobs(), |_, s| {
        let o = run_image(s, &cache);
        match &o {
            Ok(o) => eprintln!(
                "{:<36} {:>5} blocks, {:>5} damaged, {} failing ({:.0}s)",
                o.name,
                o.blocks,
                o.tried,
                o.failures.len(),
                o.secs
            ),
            Err(e) => eprintln!("{:<36} ERROR {e}", s.name),
        }
        (s.name.clone(), o)
    });
    let mut failed = Vec::new();
    let mut table = String::from("\nscenario                             blocks damaged  inodes recovered (fewest, one leaf lost) of logged\n");
    for (name, o) in &outcomes {
        match o {
            Ok(o) => {
                let fewest = if o.recovered_min == usize::MAX {
                    "-".to_string()
                } else {
                    o.recovered_min.to_string()
                };
                table += &format!(
                    "{:<36} {:>6} {:>7}  {fewest} of {}\n",
                    name, o.blocks, o.tried, o.logged_max
                );
                for f in o.failures.iter().take(3) {
                    failed.push(format!("--- {name}: {f}"));
                }
                if o.failures.len() > 3 {
                    failed.push(format!(
                        "--- {name}: and {} more failing blocks",
                        o.failures.len() - 3
                    ));
                }
            }
            Err(e) => failed.push(format!("--- {name}: {e}")),
        }
    }
    eprintln!("{table}");
    let detail: String = failed
        .join("\n")
        .lines()
        .take(300)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(failed.is_empty(), "salvage fails:\n{detail}");
}

/// The headline image (10,000 files created and fsynced one by one, over
/// half of them only in the log) with one leaf of its log lost: salvage must
/// recover at least 80 % of the files zero-log loses, with the right
/// contents, for every leaf tried (`BTRKIT_SALVAGE_HEADLINE_LEAVES=N` leaves
/// spread over the log, default 6; 0 means every leaf).
#[test]
fn salvage_headline_one_leaf_lost() {
    let want: usize = std::env::var("BTRKIT_SALVAGE_HEADLINE_LEAVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    headline_leaves_lost(|leaves| {
        if want == 0 || want >= leaves.len() {
            return leaves.to_vec();
        }
        // Spread over the log: first, last, and evenly between.
        let mut idx: Vec<usize> = (0..want)
            .map(|i| i * (leaves.len() - 1) / (want - 1).max(1))
            .collect();
        idx.dedup();
        idx.into_iter().map(|i| leaves[i]).collect()
    });
}

/// The same with each leaf of the headline log's data checksums lost (the
/// leaves whose loss costs the most files: about 137 each; 22 leaves, worst
/// 97.7 % recovered). Ignored in the default run for its length (about 8
/// minutes in a debug build): `cargo test -p btrkit-tests --test
/// replay_salvage -- --ignored`. It needs the B-tree's double leaf split (a
/// 2 KiB inline extent in the middle of a full 4 KiB leaf).
#[test]
#[ignore]
fn salvage_headline_checksum_leaf_lost() {
    headline_leaves_lost(|leaves| {
        leaves
            .iter()
            .copied()
            .filter(|b| b.is_csum_leaf())
            .collect()
    });
}

/// Lose each leaf `pick` chooses of the headline log in turn, salvage, and
/// require 80 % of what zero-log loses back with the right contents.
fn headline_leaves_lost(pick: impl for<'a> Fn(&[&'a LogBlock]) -> Vec<&'a LogBlock>) {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let n = kcrash::HEADLINE_FILES;
    let crash =
        kcrash::cached_crash_image(&kcrash::headline_scenario(), &kcrash::default_cache_dir())
            .unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::Builder::new()
        .prefix("salvage-headline-")
        .tempdir()
        .unwrap();
    let w = work.path();
    let count = |img: &Path| -> (u32, u32) {
        let m = LoopMount::mount(img, &w.join("mnt"), "ro").unwrap_or_else(|e| panic!("{e}"));
        let r = kcrash::count_headline_files(m.path()).unwrap_or_else(|e| panic!("{e}"));
        m.unmount().unwrap_or_else(|e| panic!("{e}"));
        r
    };
    let zl = w.join("zero-log.img");
    kcrash::copy_sparse(&crash.path, &zl).unwrap();
    let o = Command::new("btrfs")
        .args(["rescue", "zero-log"])
        .arg(&zl)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "btrfs rescue zero-log: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (_, zl_right) = count(&zl);
    std::fs::remove_file(&zl).unwrap();
    let lost_by_zero_log = n - zl_right;
    assert!(
        lost_by_zero_log > 0,
        "every file was committed: nothing to recover"
    );

    let blocks = log_blocks(&crash.path).unwrap();
    let leaves: Vec<&LogBlock> = blocks
        .iter()
        .filter(|b| b.level == 0 && !b.in_root_tree())
        .collect();
    let levels = blocks.iter().map(|b| b.level).max().unwrap_or(0);
    let picked = pick(&leaves);
    eprintln!(
        "headline log: {} blocks, {} leaves, {} levels; zero-log keeps {zl_right} of {n} files; damaging {} leaves",
        blocks.len(),
        leaves.len(),
        levels + 1,
        picked.len()
    );
    assert!(levels >= 1, "the headline log has one level only");
    assert!(!picked.is_empty(), "no leaf to damage");
    let dmg = w.join("damaged.img");
    let out = w.join("out.img");
    let mut worst = (f64::MAX, 0u64);
    let mut seen = HashSet::new();
    for b in picked {
        if !seen.insert(b.bytenr) {
            continue;
        }
        let _ = std::fs::remove_file(&out);
        kcrash::copy_sparse(&crash.path, &dmg).unwrap();
        damage_block(&dmg, b).unwrap();
        if seen.len() == 1 {
            // A plain replay refuses the damaged log, says so by the
            // error's kind (a damaged log block), and points at --salvage.
            let o = Command::new(kcrash::replay_bin())
                .arg(&dmg)
                .arg("-o")
                .arg(&out)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{}: {err}", b.describe());
            assert!(
                err.contains("--salvage replays what the rest of it still proves"),
                "{}: no hint of --salvage: {err}",
                b.describe()
            );
            let _ = std::fs::remove_file(&out);
        }
        let t = Instant::now();
        let report = salvage(&dmg, &out).unwrap_or_else(|e| panic!("{}: {e}", b.describe()));
        let secs = t.elapsed().as_secs_f64();
        oracle::check_clean(&[&out], Progs::Distro)
            .unwrap_or_else(|e| panic!("{}: {e}", b.describe()));
        let (present, right) = count(&out);
        let recovered = right.saturating_sub(zl_right);
        let share = recovered as f64 / lost_by_zero_log as f64;
        let s = &report["summary"]["salvage"];
        eprintln!(
            "{}: {right} of {n} files right ({present} present), {recovered} of the {lost_by_zero_log} zero-log loses ({:.1} %); report: {} recovered, {} not; {secs:.2}s",
            b.describe(),
            share * 100.0,
            s["recovered"],
            s["not_recovered"]
        );
        assert_eq!(
            present,
            right,
            "{}: a file with the wrong contents",
            b.describe()
        );
        if share < worst.0 {
            worst = (share, b.bytenr);
        }
    }
    eprintln!(
        "worst leaf: {} ({:.1} % of what zero-log loses recovered)",
        worst.1,
        worst.0 * 100.0
    );
    assert!(
        worst.0 >= 0.8,
        "with leaf {} lost only {:.1} % of the files zero-log loses are recovered",
        worst.1,
        worst.0 * 100.0
    );
}
