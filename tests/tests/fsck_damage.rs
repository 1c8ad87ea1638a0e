//! Damage one thing at a time in a clean kernel-made image: each must be
//! reported as an error in the phase that owns it, and no damage may make
//! btrkit-fsck panic, hang or write to the image.

use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE};
use btrkit_core::format::key::Key;
use btrkit_tests::fsck_support::*;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::LoopMount;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WORKLOAD: &str = r#"set -e
mkdir -p a/b
for i in $(seq 1 400); do echo "file $i" > a/f$i; done
for i in $(seq 1 30); do head -c 20000 /dev/urandom > a/b/data$i; done
yes compress | head -c 300000 > a/comp
cp --reflink=always a/b/data1 a/clone
btrfs -q subvolume snapshot . snap
echo more >> a/f7
sync"#;

fn u64_at(d: &[u8], o: usize) -> u64 {
    d.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

struct Case {
    name: &'static str,
    phase: u64,
    extra: &'static [&'static str],
    apply: fn(&Path),
}

fn item(img: &Path, tree: u64, nth: usize, pred: &dyn Fn(&Key, &[u8]) -> bool) -> ItemAt {
    find_item(img, tree, nth, pred).expect("item to damage not found")
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "checksum of every copy of an fs tree leaf",
            phase: 3,
            extra: &[],
            apply: |img| {
                let it = item(img, 5, 0, &|k, _| {
                    k.ty == BTRFS_INODE_ITEM_KEY && k.objectid > 300
                });
                patch_block(img, it.bytenr, true, false, &|b| {
                    b[it.data_off + 40] ^= 0x55
                });
            },
        },
        Case {
            name: "key order inside a leaf",
            phase: 3,
            extra: &[],
            apply: |img| {
                let it = item(img, 5, 0, &|k, _| {
                    k.ty == BTRFS_INODE_ITEM_KEY && k.objectid > 300
                });
                // Push the key of the next slot's objectid below this one.
                let slot = it.slot + 1;
                patch_block(img, it.bytenr, true, true, &|b| {
                    let o = HEADER_SIZE + slot * ITEM_SIZE;
                    put_u64(b, o, 257);
                });
            },
        },
        Case {
            name: "ref count of a data extent",
            phase: 4,
            extra: &[],
            apply: |img| {
                let it = item(img, 2, 3, &|k, d| {
                    k.ty == BTRFS_EXTENT_ITEM_KEY && u64_at(d, 16) & BTRFS_EXTENT_FLAG_DATA != 0
                });
                patch_block(img, it.bytenr, true, true, &|b| {
                    let r = u64_at(b, it.data_off);
                    put_u64(b, it.data_off, r + 1);
                });
            },
        },
        Case {
            name: "link count of a file",
            phase: 6,
            extra: &[],
            apply: |img| {
                let it = item(img, 5, 20, &|k, d| {
                    k.ty == BTRFS_INODE_ITEM_KEY
                        && u32::from_le_bytes([d[52], d[53], d[54], d[55]]) & 0o170000 == 0o100000
                });
                // nlink is at byte 40 of the inode item.
                patch_block(img, it.bytenr, true, true, &|b| {
                    put_u32(b, it.data_off + 40, 2)
                });
            },
        },
        Case {
            name: "target of a dir index",
            phase: 6,
            extra: &[],
            apply: |img| {
                let it = item(img, 5, 10, &|k, _| k.ty == BTRFS_DIR_INDEX_KEY);
                patch_block(img, it.bytenr, true, true, &|b| {
                    let o = it.data_off;
                    let v = u64_at(b, o);
                    put_u64(b, o, v + 100_000);
                });
            },
        },
        Case {
            name: "length of a free space entry",
            phase: 5,
            extra: &[],
            apply: |img| {
                let it = item(img, 10, 1, &|k, _| k.ty == BTRFS_FREE_SPACE_EXTENT_KEY);
                let slot = it.slot;
                patch_block(img, it.bytenr, true, true, &|b| {
                    let o = HEADER_SIZE + slot * ITEM_SIZE + 9;
                    let v = u64_at(b, o);
                    put_u64(b, o, v - 4096);
                });
            },
        },
        Case {
            name: "a data checksum in a csum item",
            phase: 7,
            extra: &["--check-data-csum"],
            apply: |img| {
                let it = item(img, 7, 0, &|k, _| k.ty == BTRFS_EXTENT_CSUM_KEY);
                patch_block(img, it.bytenr, true, true, &|b| b[it.data_off] ^= 0xff);
            },
        },
        Case {
            name: "start of a csum item",
            phase: 7,
            extra: &[],
            apply: |img| {
                let it = item(img, 7, 0, &|k, _| k.ty == BTRFS_EXTENT_CSUM_KEY);
                let slot = it.slot;
                patch_block(img, it.bytenr, true, true, &|b| {
                    let o = HEADER_SIZE + slot * ITEM_SIZE + 9;
                    let v = u64_at(b, o);
                    put_u64(b, o, v + 4096 * 1024);
                });
            },
        },
        Case {
            name: "used bytes of a block group",
            phase: 2,
            extra: &[],
            apply: |img| {
                let it = item(img, 2, 0, &|k, d| {
                    k.ty == BTRFS_BLOCK_GROUP_ITEM_KEY
                        && u64_at(d, 16) & BTRFS_BLOCK_GROUP_DATA != 0
                });
                patch_block(img, it.bytenr, true, true, &|b| {
                    let v = u64_at(b, it.data_off);
                    put_u64(b, it.data_off, v + 4096);
                });
            },
        },
    ]
}

fn base_image(dir: &Path) -> PathBuf {
    kernel_image(dir, "base.img", "", "compress=zstd", WORKLOAD)
}

#[test]
fn fsck_damage_one_thing_at_a_time() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = base_image(tmp.path());
    let r = run_fsck(&base, &["--check-data-csum"], Duration::from_secs(120));
    assert_eq!(r.code, 0, "base image not clean: {:?}", r.errors());
    let mut failures = Vec::new();
    for c in cases() {
        let img = tmp.path().join("damaged.img");
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            base.display(),
            img.display()
        ));
        (c.apply)(&img);
        let stamp = file_stamp(&img);
        let r = run_fsck(&img, c.extra, Duration::from_secs(120));
        let errs = r.errors();
        let ok = r.code == 4 && errs.iter().any(|e| e.0 == c.phase);
        eprintln!(
            "{}: exit {} phases {:?}",
            c.name,
            r.code,
            errs.iter()
                .map(|e| e.0)
                .collect::<std::collections::BTreeSet<_>>()
        );
        if !ok {
            failures.push(format!(
                "{}: exit {}, wanted an error in phase {}: {:?} {}",
                c.name, r.code, c.phase, errs, r.stderr
            ));
        }
        assert!(
            !r.stderr.contains("panicked"),
            "{}: panic: {}",
            c.name,
            r.stderr
        );
        assert_eq!(
            stamp,
            file_stamp(&img),
            "{}: the image was modified",
            c.name
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One bad copy of a DUP tree block, the other good: btrfs check reads the
/// good one and calls the image clean, and so does btrkit-fsck, with a
/// warning naming the copy: always for copy 0 (read first, so its damage is
/// seen), for copy 1 only with `--check-mirrors` (btrfs check never reads
/// it).
#[test]
fn fsck_damage_one_copy_of_a_dup_block_is_a_warning() {
    use std::os::unix::fs::FileExt;
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = base_image(tmp.path());
    let it = item(&base, 5, 0, &|k, _| {
        k.ty == BTRFS_INODE_ITEM_KEY && k.objectid > 300
    });
    let phys = {
        let i =
            btrkit_core::image::Image::open_path(&base, btrkit_core::image::OpenOptions::default())
                .expect("open");
        i.chunks
            .map(it.bytenr, i.nodesize as u64, i.devid)
            .expect("map")
    };
    assert!(phys.len() == 2, "metadata is not DUP");
    let warned = |r: &FsckRun, copy: usize| {
        r.json()["findings"].as_array().is_some_and(|a| {
            a.iter().any(|f| {
                f["category"] == "mirror-copy"
                    && f["severity"] == "warning"
                    && f["bytenr"].as_u64() == Some(it.bytenr)
                    && f["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(&format!("copy {copy} ")))
            })
        })
    };
    for copy in [0usize, 1] {
        let img = tmp.path().join(format!("copy{copy}.img"));
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            base.display(),
            img.display()
        ));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .expect("open");
        f.write_all_at(&[0x5a; 64], phys[copy] + 2000)
            .expect("write");
        drop(f);
        let progs = oracle::btrfs_check(&[&img], Progs::Distro).expect("btrfs check");
        assert!(
            progs.clean,
            "copy {copy}: btrfs check calls the image damaged: {}",
            progs.stdout
        );
        let plain = run_fsck(&img, &[], Duration::from_secs(120));
        let all = run_fsck(&img, &["--check-mirrors"], Duration::from_secs(120));
        for (what, r) in [("default", &plain), ("--check-mirrors", &all)] {
            let errors: Vec<_> = r
                .errors()
                .into_iter()
                .filter(|e| e.1 != "mirror-copy")
                .collect();
            assert!(
                r.code == 0 && errors.is_empty(),
                "copy {copy}, {what}: exit {} (btrfs check: clean): {errors:?}",
                r.code
            );
        }
        assert!(
            warned(&all, copy),
            "copy {copy}: --check-mirrors names no damaged copy: {}",
            all.stdout
        );
        assert_eq!(
            warned(&plain, copy),
            copy == 0,
            "copy {copy}: default mode: {}",
            plain.stdout
        );
    }
}

/// Random damage to random tree blocks, with and without a valid checksum:
/// always a report and an exit code, never a panic or a hang.
#[test]
fn fsck_damage_random_never_panics() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = base_image(tmp.path());
    let blocks: Vec<u64> = {
        let mut v = Vec::new();
        for tree in [1u64, 2, 3, 4, 5, 7, 10] {
            let mut n = 0;
            while let Some(it) = find_item(&base, tree, n, &|_, _| true) {
                if v.last() != Some(&it.bytenr) {
                    v.push(it.bytenr);
                }
                n += 40;
            }
        }
        v
    };
    assert!(!blocks.is_empty());
    let mut g = btrkit_core::util::prng::Prng::new(0x9e3779b97f4a7c15);
    let mut rnd = move || g.next_u64();
    for round in 0..30 {
        let img = tmp.path().join("fuzz.img");
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            base.display(),
            img.display()
        ));
        let b = blocks[(rnd() % blocks.len() as u64) as usize];
        let fix = round % 3 != 0;
        let hits: Vec<(usize, u8)> = (0..1 + rnd() % 16)
            .map(|_| (32 + (rnd() % 4000) as usize, rnd() as u8))
            .collect();
        patch_block(&img, b, true, fix, &|blk| {
            for &(o, v) in &hits {
                if o < blk.len() {
                    blk[o] = v;
                }
            }
        });
        let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
        assert!(
            matches!(r.code, 0 | 4 | 8),
            "round {round} block {b}: exit {} {}",
            r.code,
            r.stderr
        );
        assert!(
            !r.stderr.contains("panicked"),
            "round {round} block {b}: {}",
            r.stderr
        );
    }
}

/// A crash image with a log tree, then damage in the log only: phase 8
/// must report what replay would choke on.
#[test]
fn fsck_damage_log_tree() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = tmp.path().join("live.img");
    sh(&format!(
        "truncate -s 256M '{0}' && mkfs.btrfs -q -f -R ^free-space-tree '{0}'",
        img.display()
    ));
    let crash = tmp.path().join("crash.img");
    // The kernel commits instead of logging when an fsync's transaction had
    // to allocate a chunk (a new data size class): write files of the same
    // sizes before the sync, and try again if the log still holds no extent.
    for attempt in 0..4 {
        let _ = std::fs::remove_file(&crash);
        if attempt > 0 {
            sh(&format!(
                "mkfs.btrfs -q -f -R ^free-space-tree '{0}'",
                img.display()
            ));
        }
        let m = LoopMount::new(&img, "space_cache=v2,commit=600").expect("mount");
        let p = m.path().display().to_string();
        sh(&format!("cd '{p}' && mkdir d && xfs_io -f -c 'pwrite 0 64k' w1 >/dev/null && xfs_io -f -c 'pwrite 0 20k' w2 >/dev/null && sync && xfs_io -f -c 'pwrite 0 64k' -c fsync d/a >/dev/null && xfs_io -f -c 'pwrite 0 20k' -c fsync d/b >/dev/null"));
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            img.display(),
            crash.display()
        ));
        drop(m);
        let logged = find_log_item(&crash, 0, &|k, d| {
            k.ty == BTRFS_EXTENT_DATA_KEY && d.len() == 53
        })
        .is_some()
            && find_log_item(&crash, 0, &|k, _| k.ty == BTRFS_EXTENT_CSUM_KEY).is_some();
        if logged {
            break;
        }
        eprintln!("attempt {attempt}: the kernel committed instead of logging; trying again");
    }
    let r = run_fsck(&crash, &[], Duration::from_secs(60));
    assert_eq!(r.code, 0, "crash image not clean: {:?}", r.errors());
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 3] = [
        ("logged extent moved outside data", |p: &Path| {
            let it = find_log_item(p, 0, &|k, d| k.ty == BTRFS_EXTENT_DATA_KEY && d.len() == 53)
                .expect("logged extent");
            patch_block(p, it.bytenr, true, true, &|b| {
                put_u64(b, it.data_off + 21, 4096)
            });
        }),
        ("log csum item removed from coverage", |p: &Path| {
            let it = find_log_item(p, 0, &|k, _| k.ty == BTRFS_EXTENT_CSUM_KEY).expect("log csum");
            let slot = it.slot;
            patch_block(p, it.bytenr, true, true, &|b| {
                let o = HEADER_SIZE + slot * ITEM_SIZE + 9;
                let v = u64_at(b, o);
                put_u64(b, o, v + (64 << 20));
            });
        }),
        ("log leaf checksum", |p: &Path| {
            let it =
                find_log_item(p, 0, &|k, _| k.ty == BTRFS_INODE_ITEM_KEY).expect("logged inode");
            patch_block(p, it.bytenr, true, false, &|b| b[it.data_off + 8] ^= 1);
        }),
    ];
    for (name, f) in damages {
        let p = tmp.path().join("damaged.img");
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            crash.display(),
            p.display()
        ));
        f(&p);
        let r = run_fsck(&p, &[], Duration::from_secs(60));
        let errs = r.errors();
        eprintln!("{name}: exit {} {:?}", r.code, errs);
        assert!(
            r.code == 4 && errs.iter().any(|e| e.0 == 8),
            "{name}: exit {} {:?} {}",
            r.code,
            errs,
            r.stderr
        );
    }
}

/// Random damage to the primary superblock with a valid checksum: every
/// field is disk data the checker must survive.
#[test]
fn fsck_damage_superblock_fields_never_panic() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = base_image(tmp.path());
    let mut g = btrkit_core::util::prng::Prng::new(0x2545F4914F6CDD1D);
    let mut rnd = move || g.next_u64();
    for round in 0..40 {
        let img = tmp.path().join("sb.img");
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            base.display(),
            img.display()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .expect("open");
        let mut sb = vec![0u8; 4096];
        f.read_exact_at(&mut sb, 65536).expect("read sb");
        // Mostly the fixed fields (up to the system chunk array), sometimes the array.
        let span = if round % 4 == 0 { 0xb2b } else { 0x32b };
        for _ in 0..1 + rnd() % 6 {
            let o = 0x20 + (rnd() % (span - 0x20)) as usize;
            if (0x40..0x48).contains(&o) {
                continue; // keep the magic, or there is nothing to check
            }
            sb[o] = rnd() as u8;
        }
        let c = btrkit_core::csum::block_csum(btrkit_core::csum::CsumType::Crc32c, &sb);
        sb[..32].copy_from_slice(&c);
        f.write_all_at(&sb, 65536).expect("write sb");
        drop(f);
        let r = run_fsck(&img, &["--check-data-csum"], Duration::from_secs(120));
        assert!(
            matches!(r.code, 0 | 4 | 8),
            "round {round}: exit {} {}",
            r.code,
            r.stderr
        );
        assert!(
            !r.stderr.contains("panicked"),
            "round {round}: {}",
            r.stderr
        );
    }
}
