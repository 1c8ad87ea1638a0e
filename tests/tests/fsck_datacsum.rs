//! `btrkit-fsck --check-data-csum` finds exactly the damaged data sectors:
//! one copy or both copies of a DUP sector, sectors on both sides of the
//! verifier's read windows, the last checksummed sector, and sectors that
//! cannot be read at all (an image cut short inside its data). Data damage
//! is invisible without the flag.

use btrkit_core::format::consts::*;
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::tree::TreeIter;
use btrkit_tests::bins::bin_path;
use btrkit_tests::env::{require_btrfs_progs, skip};
use btrkit_tests::fsck_support::*;
use btrkit_tests::rich::random_bytes;
use btrkit_tests::skip_unless;
use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Every checksummed sector: (logical, physical offset of each copy).
fn csum_sectors(image: &Path) -> Vec<(u64, Vec<u64>)> {
    let img = Image::open_path(image, OpenOptions::default()).expect("open image");
    let root = img
        .find_root(BTRFS_CSUM_TREE_OBJECTID)
        .expect("csum root")
        .expect("csum tree");
    let mut it = TreeIter::new(
        &img,
        root,
        Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0),
    )
    .expect("iter");
    let ss = img.sectorsize as u64;
    let mut out = Vec::new();
    while let Some(item) = it.next_item() {
        let item = item.expect("csum leaf");
        if item.key.ty != BTRFS_EXTENT_CSUM_KEY {
            continue;
        }
        let n = item.data().expect("csum item").len() / img.csum.size();
        for i in 0..n as u64 {
            let l = item.key.offset + i * ss;
            out.push((l, img.chunks.map(l, ss, img.devid).expect("map sector")));
        }
    }
    out
}

fn flip(image: &Path, phys: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .expect("open for damage");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, phys + 100).expect("read byte");
    b[0] ^= 0x5a;
    f.write_all_at(&b, phys + 100).expect("write byte");
}

/// The data-csum findings as (bytenr, message).
fn data_findings(r: &FsckRun) -> Vec<(u64, String)> {
    r.json()["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| f["category"] == "data-csum" && f["severity"] == "error")
                .map(|f| {
                    (
                        f["bytenr"].as_u64().unwrap_or(0),
                        f["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn source_tree(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    // 40 MB in one file spans more than one read window; many small files
    // make many short csum runs with gaps between them.
    std::fs::write(dir.join("big"), random_bytes(1, 40_000_000)).unwrap();
    for i in 1..=60 {
        std::fs::write(
            dir.join(format!("f{i}")),
            random_bytes(100 + i as u64, 4096 * (i % 7 + 1) + 123 * i),
        )
        .unwrap();
    }
}

#[test]
fn data_damage_in_dup_copies_is_found_exactly() {
    skip_unless!(require_btrfs_progs());
    let td = tempfile::tempdir().unwrap();
    let src = td.path().join("src");
    source_tree(&src);
    let img = td.path().join("dup.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let ok = Command::new("mkfs.btrfs")
        .args([
            "-q",
            "-f",
            "-d",
            "dup",
            "-m",
            "dup",
            "-R",
            "^free-space-tree",
            "--rootdir",
        ])
        .arg(&src)
        .arg(&img)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        skip("mkfs.btrfs cannot make a DUP-data image from a directory here");
        return;
    }
    let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 0, "fresh image: {:?}", r.errors());

    let sectors = csum_sectors(&img);
    assert!(
        sectors.len() > 10_000,
        "{} checksummed sectors",
        sectors.len()
    );
    assert!(
        sectors.iter().all(|s| s.1.len() == 2),
        "DUP data has two copies of every sector"
    );
    let first = &sectors[0];
    // 35 MB into the data: past the first 32 MiB read window.
    let middle = &sectors[35_000_000 / 4096];
    let last = &sectors[sectors.len() - 1];
    flip(&img, first.1[0]);
    flip(&img, middle.1[0]);
    flip(&img, middle.1[1]);
    flip(&img, last.1[1]);

    let r = run_fsck(&img, &[], Duration::from_secs(120));
    assert_eq!(
        r.code,
        0,
        "without --check-data-csum data is not read: {:?}",
        r.errors()
    );

    let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 4, "{}", r.stderr);
    let found = data_findings(&r);
    let want = [
        (first.0, "1 of 2"),
        (middle.0, "2 of 2"),
        (last.0, "1 of 2"),
    ];
    assert_eq!(found.len(), want.len(), "{found:?}");
    for ((at, msg), (w_at, w_msg)) in found.iter().zip(want) {
        assert_eq!(*at, w_at, "{msg}");
        assert!(msg.contains(w_msg), "{msg}: expected {w_msg} copies bad");
    }
    assert_eq!(
        r.errors().len(),
        want.len(),
        "only the data is damaged: {:?}",
        r.errors()
    );
}

#[test]
fn unreadable_data_is_reported_sector_by_sector() {
    let td = tempfile::tempdir().unwrap();
    let src = td.path().join("src");
    source_tree(&src);
    let img = td.path().join("single.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let out = Command::new(bin_path("btrkit-mkfs"))
        .args(["-q", "-r"])
        .arg(&src)
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 0, "fresh image: {:?}", r.errors());

    let sectors = csum_sectors(&img);
    assert!(sectors.iter().all(|s| s.1.len() == 1));
    // One bad sector in the middle of the big file.
    let bad = &sectors[20_000_000 / 4096];
    flip(&img, bad.1[0]);
    let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 4);
    let found = data_findings(&r);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, bad.0);
    assert!(found[0].1.contains("1 of 1"), "{}", found[0].1);

    // Cut the image inside its data, a little past a 4 MiB request start:
    // every sector past the end is unreadable, and only those are reported
    // (beside the damaged one).
    let mut phys: Vec<u64> = sectors.iter().map(|s| s.1[0]).collect();
    phys.sort_unstable();
    let cut = phys[phys.len() - 1500] + 4096 * 3 + 4096 / 2;
    let cut = cut - cut % 4096;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let past: BTreeSet<u64> = sectors
        .iter()
        .filter(|s| s.1[0] + 4096 > cut)
        .map(|s| s.0)
        .collect();
    assert!(past.len() > 1000);
    let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 4, "{}", r.stderr);
    let found: BTreeSet<u64> = data_findings(&r).into_iter().map(|f| f.0).collect();
    let mut want = past.clone();
    want.insert(bad.0);
    // The report is capped per category; what is listed must be exactly the
    // first of the expected sectors, and the count must be right.
    let listed: Vec<u64> = found.iter().copied().collect();
    let expected: Vec<u64> = want.iter().copied().take(listed.len()).collect();
    assert!(!listed.is_empty());
    assert_eq!(listed, expected);
    let phase7 = r.json()["phases"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["phase"] == 7).cloned())
        .unwrap();
    assert_eq!(
        phase7["errors"].as_u64(),
        Some(want.len() as u64),
        "{phase7}"
    );
}
