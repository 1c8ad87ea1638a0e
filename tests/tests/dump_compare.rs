//! `btrkit-dump tree` must list exactly the items `btrfs inspect-internal
//! dump-tree` lists (the `\titem N key (...) itemoff X itemsize Y` lines), on
//! fresh images of several checksum types and node sizes, on a rich image the
//! kernel populated, and on crash images carrying kernel log trees.
//!
//! Whole-image dumps are compared as multisets (a different order of trees is
//! reported, not failed); single-tree dumps (`--tree`) must match in order.
//! Needs root, loop devices and btrfs-progs; skips with a reason otherwise.

use btrkit_tests::dumpcmp::{assert_all, check_image, Order};
use btrkit_tests::kimage::{log_tree_levels, tree_levels};
use btrkit_tests::rich::{build_rich, fsync, random_bytes, write_file, RichOpts};
use btrkit_tests::{require_kernel_mount, skip_unless, KernelImage, MkfsOpts};
use std::path::Path;

/// Whole dump plus `--tree` for each id in `trees`.
fn compare_all(label: &str, image: &Path, trees: &[&str]) {
    let mut res = vec![check_image(label, image, None, Order::AnyTreeOrder)];
    for t in trees {
        res.push(check_image(label, image, Some(t), Order::Exact));
    }
    assert_all(res);
}

#[test]
fn fresh_default() {
    skip_unless!(require_kernel_mount());
    let k = KernelImage::mkfs(&MkfsOpts::default());
    compare_all("fresh default", k.image(), &["1", "2", "3", "5", "7"]);
}

/// mkfs with a checksum type and node size, a few files written by the
/// kernel (so the csum tree holds that checksum type), unmounted.
fn csum_case(csum: &str, nodesize: u32) {
    let mut k = KernelImage::new_mounted(&MkfsOpts::default().csum(csum).nodesize(nodesize), "");
    for i in 0..4u64 {
        write_file(
            &k.path(&format!("f{i}")),
            &random_bytes(i, (1 << 20) + i as usize * 5000),
        );
    }
    write_file(&k.path("small"), b"inline\n");
    k.umount();
    compare_all(
        &format!("{csum} nodesize {nodesize}"),
        k.image(),
        &["1", "2", "3", "5", "7"],
    );
}

#[test]
fn csum_crc32c_nodesize_65536() {
    skip_unless!(require_kernel_mount());
    csum_case("crc32c", 65536);
}

#[test]
fn csum_xxhash_nodesize_4096() {
    skip_unless!(require_kernel_mount());
    csum_case("xxhash", 4096);
}

#[test]
fn csum_sha256_nodesize_16384() {
    skip_unless!(require_kernel_mount());
    csum_case("sha256", 16384);
}

#[test]
fn csum_blake2_nodesize_65536() {
    skip_unless!(require_kernel_mount());
    csum_case("blake2", 65536);
}

fn rich_case(label: &str, opts: RichOpts, holes: bool) {
    let k = build_rich(&opts);
    // The fixture must really hold what it claims (checked in progs' words).
    let fs = btrkit_tests::dumpcmp::dump_progs(k.image(), Some("5")).expect("btrfs dump-tree -t 5");
    for want in [
        "(inline)",
        "(prealloc)",
        "compression 3 (zstd)",
        "compression 1 (zlib)",
        "XATTR_ITEM",
        "INODE_REF",
    ] {
        assert!(fs.contains(want), "{label}: fs tree lacks {want}");
    }
    let hole_items = fs.matches("extent data disk byte 0 nr 0").count();
    assert_eq!(
        hole_items > 0,
        holes,
        "{label}: {hole_items} explicit hole extents"
    );
    let levels = tree_levels(k.image());
    eprintln!("{label}: tree levels (id, offset, level): {levels:?}");
    let level = |id: u64| {
        levels
            .iter()
            .filter(|l| l.0 == id)
            .map(|l| l.2)
            .max()
            .unwrap_or(0)
    };
    assert!(
        level(5) >= 2,
        "{label}: fs tree should have level >= 2: {levels:?}"
    );
    assert!(
        level(2) >= 2,
        "{label}: extent tree should have level >= 2: {levels:?}"
    );
    // 256 is `sub`, 257 `snap`, 258 `topsnap` (created in that order).
    let subvols: Vec<u64> = levels
        .iter()
        .map(|l| l.0)
        .filter(|&id| (256..1 << 48).contains(&id))
        .collect();
    assert!(
        subvols.len() >= 3,
        "{label}: expected subvolume and snapshots: {levels:?}"
    );
    let ids: Vec<String> = subvols.iter().map(u64::to_string).collect();
    let mut trees = vec!["1", "2", "3", "5", "7"];
    trees.extend(ids.iter().map(String::as_str));
    compare_all(label, k.image(), &trees);
}

#[test]
fn rich_no_holes() {
    skip_unless!(require_kernel_mount());
    rich_case("rich (no-holes)", RichOpts::default(), false);
}

#[test]
fn rich_with_holes() {
    skip_unless!(require_kernel_mount());
    let mut o = RichOpts::default();
    o.mkfs = o.mkfs.features("^no-holes");
    rich_case("rich (^no-holes)", o, true);
}

/// A crash image whose log tree comes from fsyncs after the last commit.
#[test]
fn crash_fsync_log() {
    skip_unless!(require_kernel_mount());
    let k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    std::fs::create_dir(k.path("d")).unwrap();
    write_file(&k.path("d/old"), &random_bytes(1, 100_000));
    write_file(&k.path("d/keep"), b"committed\n");
    k.sync();
    // After the commit: new file, overwrite, rename, xattr, all fsynced.
    write_file(&k.path("d/new"), &random_bytes(2, 64 << 10));
    fsync(&k.path("d/new"));
    btrkit_tests::rich::write_at(&k.path("d/old"), 8192, &random_bytes(3, 4096));
    std::fs::rename(k.path("d/old"), k.path("d/renamed")).unwrap();
    btrkit_tests::rich::setxattr(&k.path("d/renamed"), "user.k", b"v");
    fsync(&k.path("d/renamed"));
    write_file(&k.path("inline"), b"small\n");
    fsync(&k.path("inline"));
    let c = k.crash_copy("crash.img");
    drop(k);
    eprintln!(
        "crash image: log_root {} level {} generation {}",
        c.log_root, c.log_root_level, c.generation
    );
    compare_all("crash fsync log", &c.path, &["1", "5"]);
}

/// Thousands of fsynced files: the subvolume's log tree gets several levels.
#[test]
fn crash_log_multilevel() {
    skip_unless!(require_kernel_mount());
    // A commit during the fsyncs (a `sync` anywhere on the machine commits
    // every filesystem) cuts the log short: try again with a fresh image.
    let mut attempt = 0;
    let c = loop {
        attempt += 1;
        // 2 GiB: on a 512 MiB image metadata space pressure makes the kernel
        // commit part-way, and the log then holds only the later fsyncs.
        let k = KernelImage::new_mounted(&MkfsOpts::default().nodesize(4096).size(2 << 30), "");
        std::fs::create_dir(k.path("logged")).unwrap();
        k.sync();
        let committed = k.committed_generation();
        for i in 0..3000usize {
            let p = k.path(&format!("logged/f{i:05}"));
            // ~1 KiB inline each: a handful per 4 KiB log leaf, hundreds of leaves.
            write_file(
                &p,
                format!("fsynced file {i} {}\n", "z".repeat(900 + i % 100)).as_bytes(),
            );
            fsync(&p);
        }
        let c = k.crash_copy("crash.img");
        if c.generation == committed {
            break c;
        }
        eprintln!(
            "attempt {attempt}: a commit happened during the fsyncs (generation {committed} -> {})",
            c.generation
        );
        assert!(
            attempt < 4,
            "a transaction commit intervened in every attempt"
        );
    };
    let (lrt, logs) = log_tree_levels(&c.path);
    eprintln!("log root tree level {lrt:?}, log trees (subvol, level): {logs:?}");
    assert!(
        logs.iter().any(|&(id, lvl)| id == 5 && lvl >= 2),
        "fs tree log should reach level 2: {logs:?}"
    );
    compare_all("crash multi-level log", &c.path, &["1", "5"]);
}
