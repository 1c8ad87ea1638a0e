//! The fsync log when metadata space runs short.
//!
//! - A log must not depend on a chunk allocated in its transaction: the
//!   chunk's item reaches the chunk tree only at the commit, so after a
//!   crash the kernel cannot map a log block (or a logged extent) in it and
//!   refuses the mount ("unable to find chunk map"). The kernel's rule is
//!   btrfs_make_block_group's full commit, checked by btrfs_sync_log after
//!   the log is written, not only when logging starts. The test fills the
//!   first metadata chunk until the free space left after a commit is
//!   smaller than what logging one file needs (every extent item of a file
//!   of 32,768 extents, after a truncate asks for a full sync) but larger
//!   than the truncate's own copy-on-write. The log's own blocks then
//!   allocate the second metadata chunk in the middle of the fsync: the
//!   fsync must commit instead of syncing the log, and the crash image must
//!   mount, with the file as the fsync left it, and be clean.
//! - A logging that fails half-way (here: no space for the log's blocks on
//!   a device with no room for another chunk) leaves a log that holds part
//!   of what it was writing. btrfs_log_inode_parent marks the transaction
//!   for full commits and commits: the fsync succeeds through the commit,
//!   and no later log sync of the transaction writes the partial log.

use btrkit_core::format::consts::BTRFS_BLOCK_GROUP_METADATA;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_tests::kcrash;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::{require_kernel_mount, skip_unless};
use std::path::Path;
use std::process::Command;

/// Size of the file whose full-sync logging outgrows the free space, and
/// what the truncate leaves of it.
const FILE: &str = "128M";
const TRUNCATED: u64 = (128 << 20) - 4096;

/// `fill` small files (inline: metadata only), the big file in 4 KiB
/// direct writes (one extent each), a commit; then, with `fsync`, the
/// truncate and the fsync that logs every extent item, and the crash.
fn script(fill: u32, fsync: bool) -> String {
    let mut s = format!(
        "mkfs -n 4096\nmount commit=600\nmkdir /a\nwritefiles /a {fill} 1000-2000 none\n\
         dwrite /f 0 {FILE} 0x5a 4096\nsync\n"
    );
    if fsync {
        s += &format!(
            "truncate /f {TRUNCATED}\nfsync /f\nstats --json\ncrash\nexpect size /f {TRUNCATED}\n"
        );
    } else {
        s += "crash\n";
    }
    s
}

fn shell(img: &Path, script: &str) -> String {
    let (ok, out) = shell_may_fail(img, script);
    assert!(ok, "btrkit-shell {}: {out}", img.display());
    out
}

/// Run a script that may fail; whether it ran to its end, and its output.
fn shell_may_fail(img: &Path, script: &str) -> (bool, String) {
    let p = img.with_extension("scn");
    std::fs::write(&p, script).expect("write script");
    let _ = std::fs::remove_file(img);
    let o = Command::new(btrkit_tests::bin_path("btrkit-shell"))
        .arg(img)
        .arg(&p)
        .arg("-q")
        .output()
        .expect("btrkit-shell");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

fn metadata_chunks(img: &Path) -> usize {
    let image = Image::open_path(img, OpenOptions::default()).expect("open the image");
    image
        .chunks
        .iter()
        .filter(|c| c.type_flags & BTRFS_BLOCK_GROUP_METADATA != 0)
        .count()
}

fn full_commit_reasons(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no stats line in {out}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
    v["full_commit_reasons"].clone()
}

#[test]
fn fsync_that_allocates_a_chunk_while_logging_commits() {
    skip_unless!(require_kernel_mount());
    let d = tempfile::tempdir().expect("tempdir");
    let probe = d.path().join("probe.img");
    // The fewest small files whose commit needs a second metadata chunk.
    let (mut lo, mut hi) = (0u32, 40_000u32);
    shell(&probe, &script(hi, false));
    assert!(metadata_chunks(&probe) >= 2, "{hi} files fit one chunk");
    while hi - lo > 20 {
        let mid = (lo + hi) / 2;
        shell(&probe, &script(mid, false));
        if metadata_chunks(&probe) == 1 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Fewer files than that, by about half of what the log needs (some
    // 2.6 MiB; a file costs some 2.4 KiB of metadata): the truncate fits,
    // the log does not.
    let img = d.path().join("crash.img");
    let mut hit = None;
    for back in [500u32, 300, 700, 150, 900] {
        let fill = lo.saturating_sub(back);
        let out = shell(&img, &script(fill, true));
        let reasons = full_commit_reasons(&out);
        if reasons.get("new chunk in this transaction").is_some() {
            hit = Some(fill);
            break;
        }
    }
    let fill = hit.unwrap_or_else(|| {
        panic!("no fill below {lo} files made the log allocate a chunk while the fsync logged")
    });
    let copy = d.path().join("kernel.img");
    let m = kcrash::manifest_via_copy(&img, &copy, "rw")
        .unwrap_or_else(|e| panic!("{fill} files: the kernel cannot mount the crash image: {e}"));
    assert_eq!(
        m.entries.get("/f").map(|e| e.size),
        Some(TRUNCATED),
        "{fill} files"
    );
    assert_eq!(
        m.entries.keys().filter(|p| p.starts_with("/a/")).count(),
        fill as usize,
        "the committed files"
    );
    oracle::check_clean(&[&img], Progs::Distro).expect("btrfs check of the crash image");
    oracle::check_clean(&[&copy], Progs::Distro).expect("btrfs check after the kernel mount");
}

/// A 160 MiB device: its chunks (8 MiB system, 32 MiB metadata, both
/// DUP, and data) take all of it once the data is written, so metadata
/// cannot grow. `fill` small files, a file of 16,384 extents and a small
/// one, a commit; with `fsync`, the truncate whose fsync logs every extent
/// item, then a second fsync in the same transaction (of the small file,
/// grown), and the crash.
fn full_device_script(fill: u32, fsync: bool) -> String {
    let mut s = format!(
        "fssize 160M\nmkfs -n 4096\nmount commit=600\nmkdir /a\nwritefiles /a {fill} 1000-2000 none\n\
         dwrite /f 0 64M 0x5a 4096\nwrite /g 0 4K 0x33\nsync\n"
    );
    if fsync {
        s += &format!(
            "truncate /f {SMALL_TRUNCATED}\nfsync /f\nwrite /g 0 8K 0x44\nfsync /g\nstats --json\ncrash\n\
             expect size /f {SMALL_TRUNCATED}\nexpect size /g 8192\n"
        );
    } else {
        s += "crash\n";
    }
    s
}

const SMALL_TRUNCATED: u64 = (64 << 20) - 4096;

#[test]
fn fsync_whose_logging_runs_out_of_space_commits() {
    skip_unless!(require_kernel_mount());
    let d = tempfile::tempdir().expect("tempdir");
    let probe = d.path().join("probe.img");
    // The most small files whose commit still finds metadata space.
    let (mut lo, mut hi) = (0u32, 30_000u32);
    assert!(shell_may_fail(&probe, &full_device_script(lo, false)).0);
    assert!(
        !shell_may_fail(&probe, &full_device_script(hi, false)).0,
        "{hi} files fit"
    );
    while hi - lo > 10 {
        let mid = (lo + hi) / 2;
        if shell_may_fail(&probe, &full_device_script(mid, false)).0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // A little fewer: the truncate and the commit find room, the log of
    // 16,384 extent items (some 1.3 MiB) does not.
    let img = d.path().join("crash.img");
    let mut hit = None;
    for back in [150u32, 80, 250, 350, 40] {
        let fill = lo.saturating_sub(back);
        let (ok, out) = shell_may_fail(&img, &full_device_script(fill, true));
        assert!(ok, "{fill} files: {out}");
        if full_commit_reasons(&out)
            .get("no space for the log")
            .is_some()
        {
            hit = Some(fill);
            break;
        }
    }
    let fill = hit.unwrap_or_else(|| {
        panic!("no fill below {lo} files left the log without space while the fsync logged")
    });
    let copy = d.path().join("kernel.img");
    let m = kcrash::manifest_via_copy(&img, &copy, "rw")
        .unwrap_or_else(|e| panic!("{fill} files: the kernel cannot mount the crash image: {e}"));
    assert_eq!(m.entries.get("/f").map(|e| e.size), Some(SMALL_TRUNCATED));
    assert_eq!(m.entries.get("/g").map(|e| e.size), Some(8192));
    oracle::check_clean(&[&img], Progs::Distro).expect("btrfs check of the crash image");
    oracle::check_clean(&[&copy], Progs::Distro).expect("btrfs check after the kernel mount");
}
