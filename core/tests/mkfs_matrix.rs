//! core's mkfs without btrfs-progs: every checksum type x node size (4, 16
//! and 64 KiB) x feature set makes an image the checker finds clean, with
//! the superblock saying what was asked; the engine then writes files on
//! it and it stays clean. Bad options are refused before anything is
//! written, and a mkfs cut at any write (power failure) leaves the image
//! either as it was, clearly not a filesystem, or complete and clean.

mod common;

use btrkit_core::check::{check_image, CheckOptions, NoProgress, Severity};
use btrkit_core::format::consts::*;
use btrkit_core::image::{read_superblock, Image, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::mkfs::{self, MkfsOptions};
use common::*;
use std::sync::Arc;

const CSUMS: [(&str, u16); 4] = [
    ("crc32c", BTRFS_CSUM_TYPE_CRC32),
    ("xxhash", BTRFS_CSUM_TYPE_XXHASH),
    ("sha256", BTRFS_CSUM_TYPE_SHA256),
    ("blake2", BTRFS_CSUM_TYPE_BLAKE2),
];
const NODESIZES: [u32; 3] = [4096, 16384, 65536];
const FEATURES: [&str; 8] = [
    "",
    "^no-holes",
    "^skinny-metadata",
    "block-group-tree",
    "^block-group-tree",
    "^free-space-tree",
    "^extref",
    "^no-holes,^skinny-metadata,^extref",
];

/// What a workload leaves, through the engine: inline, regular, compressed
/// and preallocated data, holes, links, xattrs.
const FILES: &str = "\
mkdir /d
write /d/inline 0 300 1
write /d/data 0 200000 random:1
write /d/sparse 1M 4096 2
create /d/pre
fallocate /d/pre 0 64K
link /d/data /d/link
setxattr /d/data user.x \"value\"
symlink ../d/data /d/sym
sync
";

fn mkfs_matrix_for(csum: &str, ty: u16) {
    for ns in NODESIZES {
        for feat in FEATURES {
            let mut args = vec![
                "-n".to_string(),
                ns.to_string(),
                "--csum".into(),
                csum.into(),
            ];
            if !feat.is_empty() {
                args.extend(["-O".to_string(), feat.to_string()]);
            }
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let what = format!("mkfs {}", a.join(" "));
            let dev = new_image(IMAGE_SIZE, &a);
            let d: Arc<dyn BlockDevice> = dev.clone();
            let sb = read_superblock(d.as_ref(), 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(sb.nodesize.get(), ns, "{what}");
            assert_eq!(sb.csum_type.get(), ty, "{what}");
            let incompat = sb.incompat_flags.get();
            let compat_ro = sb.compat_ro_flags.get();
            assert_eq!(
                incompat & BTRFS_FEATURE_INCOMPAT_NO_HOLES != 0,
                !feat.contains("^no-holes"),
                "{what}"
            );
            assert_eq!(
                incompat & BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA != 0,
                !feat.contains("^skinny-metadata"),
                "{what}"
            );
            assert_eq!(
                incompat & BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF != 0,
                !feat.contains("^extref"),
                "{what}"
            );
            assert_eq!(
                incompat & BTRFS_FEATURE_INCOMPAT_BIG_METADATA != 0,
                ns > 4096,
                "{what}"
            );
            assert_eq!(
                compat_ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0,
                !feat.contains("^free-space-tree"),
                "{what}"
            );
            // The block group tree is a default (mkfs.btrfs 6.19) that
            // gives way to a feature it needs being turned off.
            assert_eq!(
                compat_ro & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0,
                !["^block-group-tree", "^no-holes", "^free-space-tree"]
                    .iter()
                    .any(|f| feat.contains(f)),
                "{what}"
            );
            assert_clean(d.clone(), &what);
            let mut fs = mount(d.clone(), &[]).unwrap_or_else(|e| panic!("{what}: mount: {e}"));
            run(&mut fs, &d, &[], FILES);
            run(
                &mut fs,
                &d,
                &["compress-force=zstd"],
                "write /z 0 100000 0\nsync\n",
            );
            let live = seen(&mut fs);
            drop(fs);
            assert_clean(d.clone(), &format!("{what}, files written"));
            assert_eq!(seen_on_disk(d).diff(&live), Vec::<String>::new(), "{what}");
        }
    }
}

#[test]
fn crc32c_every_nodesize_and_feature_set() {
    mkfs_matrix_for(CSUMS[0].0, CSUMS[0].1);
}

#[test]
fn xxhash_every_nodesize_and_feature_set() {
    mkfs_matrix_for(CSUMS[1].0, CSUMS[1].1);
}

#[test]
fn sha256_every_nodesize_and_feature_set() {
    mkfs_matrix_for(CSUMS[2].0, CSUMS[2].1);
}

#[test]
fn blake2_every_nodesize_and_feature_set() {
    mkfs_matrix_for(CSUMS[3].0, CSUMS[3].1);
}

/// A filesystem smaller than its device (`-b`), and a label.
#[test]
fn size_and_label() {
    let dev = Arc::new(CrashDevice::new(vec![0u8; IMAGE_SIZE as usize]));
    let mut o = mkfs_options(&["-b", "200M", "-L", "a-label"]);
    o.fsid = Some(*b"btrkit-sizelabel");
    mkfs_on(dev.clone(), &o);
    let sb = read_superblock(dev.as_ref(), 0).unwrap();
    assert_eq!(sb.total_bytes.get(), 200 << 20);
    assert_eq!(&sb.label[..8], b"a-label\0");
    assert_clean(dev, "-b 200M -L a-label");
}

/// Options mkfs must refuse, before it writes anything.
#[test]
fn bad_options_write_nothing() {
    let bad: &[&[&str]] = &[
        &["-n", "2048"],
        &["-n", "131072"],
        &["-n", "12288"],
        &["-s", "8192"],
        &["-b", "100M"],
        &["-b", "1G"],
        &["-L", &"x".repeat(256)],
        &["-O", "mixed-bg", "-n", "16384"],
        &["-M", "-m", "dup", "-d", "single"],
        &["-m", "raid1"],
        &["-d", "raid1c3"],
        &["-O", "^free-space-tree,block-group-tree"],
        &["-O", "no-such-feature"],
        &["-d", "raid1"],
        &["--csum", "md5"],
    ];
    for args in bad {
        let o = match MkfsOptions::from_mkfs_args(args) {
            Err(_) => continue,
            Ok(o) => o,
        };
        let dev = Arc::new(CrashDevice::new(vec![0u8; IMAGE_SIZE as usize]));
        assert!(
            mkfs::make(dev.clone(), &o).is_err(),
            "mkfs {args:?} must be refused"
        );
        assert_eq!(
            dev.writes(),
            0,
            "mkfs {args:?} was refused but wrote to the device"
        );
    }
}

/// Every superblock copy that parses must be a clean filesystem; an image
/// with none is clearly not a filesystem.
fn usable_copies_are_clean(dev: Arc<CrashDevice>, what: &str) -> usize {
    let mut usable = 0;
    for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
        if btrfs_sb_offset(mirror) + BTRFS_SUPER_INFO_SIZE as u64 > dev.size() {
            break;
        }
        let Ok(img) = Image::open(
            dev.clone(),
            OpenOptions {
                mirror,
                ..Default::default()
            },
        ) else {
            continue;
        };
        usable += 1;
        let r = check_image(
            &img,
            CheckOptions {
                check_data_csum: true,
                check_mirrors: true,
                ..Default::default()
            },
            &NoProgress,
        );
        // Checked through a mirror, the other copies' state is phase 1's
        // business (a zeroed primary is what mkfs leaves on purpose).
        let damage: Vec<_> = r
            .findings
            .iter()
            .filter(|f| {
                (f.severity == Severity::Error || f.category == "mirror-copy")
                    && !(mirror > 0 && f.phase == 1)
            })
            .collect();
        assert!(
            damage.is_empty() && r.suppressed == 0,
            "{what}: superblock copy {mirror} names a damaged filesystem: {}",
            errors_of(&r)
        );
    }
    usable
}

/// mkfs over an old filesystem, cut at every write, with none, all and
/// some of the unflushed writes kept: each copy of the superblock that is
/// valid names a clean filesystem (the old one, or the new one complete).
#[test]
fn mkfs_cut_at_every_write() {
    let old = new_image(IMAGE_SIZE, &["-n", "16384"]);
    {
        let d: Arc<dyn BlockDevice> = old.clone();
        let mut fs = mount(d.clone(), &[]).unwrap();
        run(&mut fs, &d, &[], "write /old 0 50000 random:3\nsync\n");
    }
    let base = || Arc::new(old.crash_device(|_| false));
    let mut o = mkfs_options(&["-n", "4096"]);
    o.fsid = Some(*b"btrkit-new-fs-id");
    let total = {
        let d = base();
        mkfs_on(d.clone(), &o);
        d.writes()
    };
    assert!(total > 5, "mkfs made only {total} writes");
    let mut seed = 0x5eed_u64;
    let mut complete = 0;
    for cut in 0..total {
        let d = base();
        d.fail_after_writes(Some(cut));
        assert!(
            mkfs::make(d.clone(), &o)
                .and_then(|(fs, staged, _)| mkfs::finish(fs, &staged))
                .is_err(),
            "cut {cut} of {total}: mkfs did not notice"
        );
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let s = seed;
        for (v, img) in [
            d.crash_device(|_| false),
            d.crash_device(|_| true),
            d.crash_device(|i| (s >> (i % 64)) & 1 == 1),
            d.crash_device_torn(|i, j| (s >> ((i + j) % 64)) & 1 == 0),
        ]
        .into_iter()
        .enumerate()
        {
            let img = Arc::new(img);
            let usable =
                usable_copies_are_clean(img.clone(), &format!("cut {cut} of {total}, variant {v}"));
            if usable > 0
                && read_superblock(img.as_ref(), 0).is_ok_and(|sb| sb.fsid == *b"btrkit-new-fs-id")
            {
                complete += 1;
            }
        }
    }
    // The uncut run, for the record: complete and clean.
    let d = base();
    mkfs_on(d.clone(), &o);
    assert_eq!(usable_copies_are_clean(d, "uncut"), 2);
    eprintln!("{total} writes; {complete} cut images already held the complete new filesystem");
}
