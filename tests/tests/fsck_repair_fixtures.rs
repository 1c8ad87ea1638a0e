//! `btrkit-fsck --repair` on every corrupt image of btrfs-progs'
//! fsck-tests. Each is either repaired (exit 1: btrfs check 6.2 and 6.14
//! and btrkit-fsck clean after, the kernel mounts it, every file that read
//! before reads the same) or left (not repairable: nothing written when
//! refused, never more errors). Which is which is the table below, kept in
//! step with fsck/README.md; a change either way fails until both are
//! updated.

use btrkit_tests::fsck_support::*;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::LoopMount;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Every corrupt fixture and whether btrkit-fsck --repair makes it clean.
const EXPECTED: &[(&str, bool)] = &[
    ("005-bad-item-offset--default_case", true),
    ("006-bad-root-items--test.img", true),
    ("007-bad-offset-snapshots--default_case", true),
    ("008-bad-dir-index-name--default_case", true),
    ("011-no-inode-item--default_case", true),
    ("016-wrong-inode-nbytes--default_case", true),
    ("017-missing-all-file-extent--default_case", true),
    ("018-leaf-crossing-stripes--default_case", false),
    ("026-bad-dir-item-name--default_case", true),
    (
        "028-unaligned-super-dev-sizes--dev_and_super_mismatch_unaligned",
        true,
    ),
    ("035-inline-bad-ram-bytes--offset_by_one", true),
    (
        "040-compressed-nodatasum--compressed_extent_without_csum",
        false,
    ),
    ("041-invalid-root-generation--default_case", true),
    ("043-bad-inode-generation--bad_inode_geneartion", true),
    ("043-bad-inode-generation--bad_inode_transid", true),
    (
        "044-invalid-extent-item-generation--bad_extent_item_gen_for_data",
        true,
    ),
    (
        "044-invalid-extent-item-generation--bad_extent_item_gen_for_tree_block",
        true,
    ),
    ("049-dir-hard-link--default", false),
    ("051-invalid-super-bytes-used--default", true),
    ("055-super-num-devs-mismatch--default", true),
    (
        "058-bad-free-space-tree-entry--corrupt-free-space-tree",
        true,
    ),
    (
        "058-bad-free-space-tree-entry--corrupt-free-space-tree2",
        true,
    ),
    ("063-log-missing-csum--default", false),
    ("064-deprecated-inode-cache--4k_nodesize", true),
    ("067-dupe-filename--default", false),
    ("069-unknown-fs-tree-key--unknown_key_empty", false),
];

/// Every file under a read-only kernel mount of `img` (no log replay: a
/// read-only mount still replays a log, which writes), path -> a digest of
/// its contents, or the read error. None when the kernel refuses it.
fn kernel_files(img: &Path) -> Option<BTreeMap<String, Result<u64, String>>> {
    let m = LoopMount::new(img, "ro,rescue=nologreplay").ok()?;
    let mut out = BTreeMap::new();
    let mut stack = vec![m.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(m.path()).unwrap().display().to_string();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                // The first 16 MiB and the size: some fixtures hold
                // huge sparse files.
                let r = std::fs::File::open(&p)
                    .and_then(|f| {
                        use std::io::Read;
                        let len = f.metadata()?.len();
                        let mut d = Vec::new();
                        f.take(16 << 20).read_to_end(&mut d)?;
                        Ok(d.iter().fold(0xcbf29ce484222325u64, |h, &b| {
                            (h ^ b as u64).wrapping_mul(0x100000001b3)
                        }) ^ len)
                    })
                    .map_err(|e| e.to_string());
                out.insert(rel, r);
            }
        }
    }
    Some(out)
}

fn progs_check(progs: Progs, img: &Path) -> bool {
    oracle::btrfs_check(&[img], progs).is_ok_and(|v| v.clean)
}

#[test]
fn repair_progs_fixtures() {
    let dir = fixtures_dir();
    let Ok(tsv) = std::fs::read_to_string(dir.join("verdicts.tsv")) else {
        btrkit_tests::skip(&format!("{} not found", dir.display()));
        return;
    };
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    if btrkit_tests::env::progs_new_dir().is_none() {
        btrkit_tests::skip("btrfs-progs 6.14 not available");
        return;
    }
    let corrupt: Vec<&str> = tsv
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, v)| *v == "corrupt")
        .map(|(n, _)| n)
        .collect();
    let expected: BTreeMap<&str, bool> = EXPECTED.iter().copied().collect();
    assert_eq!(
        corrupt.len(),
        expected.len(),
        "verdicts.tsv lists other corrupt images than the table: {corrupt:?}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    let mut repaired = 0;
    for name in corrupt {
        let Some(&want) = expected.get(name) else {
            wrong.push(format!("{name}: not in the table"));
            continue;
        };
        sh(&format!(
            "tar -xJf '{}' -C '{}'",
            dir.join(format!("{name}.tar.xz")).display(),
            tmp.path().display()
        ));
        let img = tmp.path().join(format!("{name}.raw"));
        let before_stamp = file_stamp(&img);
        let before_files = kernel_files(&img);
        let before_errors = run_fsck(&img, &[], Duration::from_secs(120)).json()["errors"]
            .as_u64()
            .unwrap_or(0);
        let r = run_fsck(&img, &["--repair", "--yes"], Duration::from_secs(300));
        let v = r.json();
        let got = r.code == 1 && v["clean_after"] == true;
        if r.stderr.contains("panicked") || !matches!(r.code, 1 | 4) {
            wrong.push(format!("{name}: exit {} {}", r.code, r.stderr));
        }
        if got != want {
            wrong.push(format!(
                "{name}: expected {}, got exit {} (refused: {}, left: {})",
                if want { "repaired" } else { "left" },
                r.code,
                v["refused"],
                v["not_repairable"]
            ));
        }
        if got {
            repaired += 1;
            if !progs_check(Progs::Distro, &img) {
                wrong.push(format!(
                    "{name}: btrfs check 6.2 not clean after the repair"
                ));
            }
            if !progs_check(Progs::New, &img) {
                wrong.push(format!(
                    "{name}: btrfs check 6.14 not clean after the repair"
                ));
            }
            if run_fsck(&img, &[], Duration::from_secs(120)).code != 0 {
                wrong.push(format!("{name}: btrkit-fsck not clean after the repair"));
            }
            match kernel_files(&img) {
                None => wrong.push(format!(
                    "{name}: the kernel does not mount the repaired image"
                )),
                Some(after) => {
                    for (p, r) in before_files.iter().flatten() {
                        if r.is_ok() && after.get(p) != Some(r) {
                            wrong.push(format!("{name}: {p} read before and not the same after"));
                        }
                    }
                }
            }
        } else if v["committed"] == true {
            // Part repaired: never more errors than before.
            let after = v["errors_after"].as_u64().unwrap_or(u64::MAX);
            if after > before_errors {
                wrong.push(format!(
                    "{name}: {after} errors after, {before_errors} before"
                ));
            }
        } else if file_stamp(&img) != before_stamp {
            wrong.push(format!("{name}: nothing committed but the image changed"));
        }
        let _ = std::fs::remove_file(&img);
    }
    eprintln!("{repaired} corrupt fixtures repaired to clean");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
