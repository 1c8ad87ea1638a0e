//! Parity with `btrfs check`, class by class: a clean kernel-made image is
//! damaged in one place, the way one of btrfs check's error classes
//! describes, and both checkers run on the same damaged image. btrkit-fsck
//! must report an error of the category fsck/README.md names for that
//! class, and `btrfs check --readonly` must call the image damaged too
//! (unless the installed btrfs-progs predates the check; the case says
//! which release added it, and then only ours is required).
//!
//! Every base image is first required clean by both checkers, quotas
//! included: an image with snapshots, relations between qgroups, reflinks
//! and a deleted subvolume, rescanned, must have the same counts here as
//! in the kernel.

use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE};
use btrkit_core::format::key::Key;
use btrkit_tests::fsck_support::*;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::LoopMount;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn u64_at(d: &[u8], o: usize) -> u64 {
    d.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}
fn u32_at(d: &[u8], o: usize) -> u32 {
    d.get(o..o + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .unwrap_or(0)
}
fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}

// Byte offsets inside a btrfs_inode_item.
const II_GENERATION: usize = 0;
const II_SIZE: usize = 16;
const II_NBYTES: usize = 24;
const II_NLINK: usize = 40;
const II_MODE: usize = 52;
const II_FLAGS: usize = 64;

fn mode_of(d: &[u8]) -> u32 {
    u32_at(d, II_MODE)
}
fn is_reg(d: &[u8]) -> bool {
    mode_of(d) & 0o170000 == 0o100000
}

/// The `nth` item of `tree` matching `pred`, which must exist.
fn item(img: &Path, tree: u64, nth: usize, pred: &dyn Fn(&Key, &[u8]) -> bool) -> ItemAt {
    find_item(img, tree, nth, pred).expect("item to damage not found")
}

/// Change an item's data in place (every copy, checksum recomputed).
fn patch_item(img: &Path, it: ItemAt, f: &dyn Fn(&mut [u8])) {
    let (off, len) = (it.data_off, it.data_len);
    patch_block(img, it.bytenr, true, true, &|b| f(&mut b[off..off + len]));
}

/// Change an item's key offset in place.
fn patch_key_offset(img: &Path, it: ItemAt, v: u64) {
    let o = HEADER_SIZE + it.slot * ITEM_SIZE + 9;
    patch_block(img, it.bytenr, true, true, &|b| put_u64(b, o, v));
}

/// Inode number of the regular file named `name` in the top-level tree.
fn ino_of(img: &Path, name: &[u8]) -> u64 {
    let it = item(img, 5, 0, &|k, d| {
        k.ty == BTRFS_DIR_INDEX_KEY && d.len() >= 30 && &d[30..] == name
    });
    let d = read_item(img, 5, it);
    u64_at(&d, 0)
}

/// The data of the item `it` names.
fn read_item(img: &Path, tree: u64, it: ItemAt) -> Vec<u8> {
    let got = std::cell::RefCell::new(Vec::new());
    find_item(img, tree, 0, &|k, d| {
        let hit = *k == it.key;
        if hit {
            *got.borrow_mut() = d.to_vec();
        }
        hit
    })
    .expect("item");
    got.into_inner()
}

/// Change one tree through core's writer (a real commit: CoW, extent and
/// free space trees kept right): `f` gets the tree and does its edits.
fn with_writer(img: &Path, f: &dyn Fn(&mut btrkit_core::trans::Store)) {
    let dev = std::sync::Arc::new(btrkit_core::io::FileDevice::open(img, true).expect("open rw"));
    let mut fs = btrkit_core::trans::Store::open(dev).expect("open for writing");
    f(&mut fs);
    fs.commit().expect("commit");
}

/// The first item of `tree` with key type `ty` and objectid >= `min`.
fn first_key(img: &Path, tree: u64, ty: u8, min: u64) -> Key {
    item(img, tree, 0, &|k, _| k.ty == ty && k.objectid >= min).key
}

/// The superblock, changed by `f`, checksum recomputed (primary copy).
fn patch_super(img: &Path, f: &dyn Fn(&mut [u8])) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .expect("open");
    let mut sb = vec![0u8; 4096];
    file.read_exact_at(&mut sb, 65536).expect("read sb");
    f(&mut sb);
    let c = btrkit_core::csum::block_csum(btrkit_core::csum::CsumType::Crc32c, &sb);
    sb[..32].copy_from_slice(&c);
    file.write_all_at(&sb, 65536).expect("write sb");
}

/// What the installed `btrfs check --readonly` says: (damaged, output).
fn progs_check(img: &Path) -> (bool, String) {
    let v = oracle::btrfs_check(&[img], Progs::Distro).expect("btrfs check");
    (!v.clean, v.output)
}

/// Installed btrfs-progs version as (major, minor).
fn progs_version() -> (u32, u32) {
    let o = Command::new("btrfs")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let v = o
        .split_whitespace()
        .find(|w| w.starts_with('v'))
        .unwrap_or("v0.0");
    let mut it = v
        .trim_start_matches('v')
        .split('.')
        .map(|x| x.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// `progs_since` of a class no btrfs check release reports.
const NEVER: (u32, u32) = (u32::MAX, 0);

struct Case {
    /// btrfs check's class (original-mode flag, lowmem bit or check).
    class: &'static str,
    /// btrkit-fsck category that must carry an error.
    category: &'static str,
    /// Which base image.
    base: Base,
    /// btrfs-progs release whose `btrfs check` first reports this class.
    progs_since: (u32, u32),
    apply: fn(&Path),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Base {
    /// Files of every kind, holes without no-holes, subvolume, snapshot.
    Fs,
    /// Quotas with snapshots, a level-1 qgroup, reflinks, a deleted subvolume.
    Quota,
    /// The v1 free space cache.
    SpaceCacheV1,
}

const FS_WORKLOAD: &str = r#"set -e
mkdir -p d/sub
for i in $(seq 1 60); do echo "file $i" > d/f$i; done
for i in $(seq 1 20); do head -c 40000 /dev/urandom > d/sub/big$i; done
xfs_io -f -c "pwrite 0 64k" -c "pwrite 256k 64k" holey >/dev/null
xfs_io -f -c "falloc 0 1m" prealloc >/dev/null
touch nocow && chattr +C nocow && head -c 50000 /dev/urandom > nocow
ln -s d/f1 link
ln d/f2 hard
mkfifo fifo
btrfs -q subvolume create sv
echo hi > sv/x
btrfs -q subvolume snapshot sv snap
sync"#;

const QUOTA_WORKLOAD: &str = r#"set -e
btrfs -q quota enable .
btrfs -q subvolume create a
btrfs -q subvolume create b
for i in $(seq 1 150); do head -c $((i*700)) /dev/urandom > a/f$i; done
head -c 3000000 /dev/urandom > b/big
btrfs -q qgroup create 1/100 .
btrfs -q qgroup assign 0/256 1/100 .
btrfs -q qgroup assign 0/257 1/100 .
btrfs -q subvolume snapshot a snapa
btrfs -q subvolume snapshot -r b snapb
for i in $(seq 1 50); do echo x >> a/f$i; done
rm -f a/f1[0-4][0-9]
cp --reflink=always b/big a/big-clone
mkdir a/d; for i in $(seq 1 400); do touch a/d/empty$i; done
btrfs -q subvolume create c
head -c 1000000 /dev/urandom > c/x
btrfs -q qgroup limit 100m 0/256 .
btrfs -q subvolume delete c
sync
btrfs quota rescan -w . >/dev/null
sync"#;

const V1_WORKLOAD: &str = r#"set -e
for i in $(seq 1 300); do head -c $((i*977)) /dev/urandom > f$i; done
rm -f f1[0-9]*
sync"#;

fn build_base(dir: &Path, base: Base) -> PathBuf {
    match base {
        // Without no-holes, holes are explicit extents (I_ERR_FILE_EXTENT_DISCOUNT).
        Base::Fs => kernel_image(dir, "fs.img", "-O ^no-holes", "", FS_WORKLOAD),
        Base::Quota => kernel_image(dir, "quota.img", "", "", QUOTA_WORKLOAD),
        Base::SpaceCacheV1 => {
            let img = dir.join("v1.img");
            // The kernel keeps no v1 cache for block groups under 100 MiB.
            sh(&format!(
                "truncate -s 1G '{0}' && mkfs.btrfs -q -f -R ^free-space-tree '{0}'",
                img.display()
            ));
            {
                let m = LoopMount::new(&img, "space_cache=v1").expect("mount");
                sh(&format!("cd '{}' && {V1_WORKLOAD}", m.path().display()));
            }
            img
        }
    }
}

fn cases() -> Vec<Case> {
    use Base::*;
    vec![
        Case {
            class: "I_ERR_INVALID_IMODE / INODE_MODE_ERROR",
            category: "inode-mode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 3, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| put_u32(d, II_MODE, 0o170644));
            },
        },
        Case {
            class: "I_ERR_INVALID_GEN / INVALID_GENERATION",
            category: "inode-generation",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 4, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| {
                    let g = u64_at(d, II_GENERATION);
                    put_u64(d, II_GENERATION, g + 1000)
                });
            },
        },
        Case {
            class: "I_ERR_INVALID_NLINK (directory hard link)",
            category: "inode-nlink",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 1, &|k, d| {
                    k.ty == BTRFS_INODE_ITEM_KEY && mode_of(d) & 0o170000 == 0o040000
                });
                patch_item(img, it, &|d| put_u32(d, II_NLINK, 2));
            },
        },
        Case {
            class: "I_ERR_ODD_INODE_FLAGS / INODE_FLAGS_ERROR",
            category: "inode-flags",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 0, &|k, d| {
                    k.ty == BTRFS_INODE_ITEM_KEY && mode_of(d) & 0o170000 == 0o120000
                });
                patch_item(img, it, &|d| {
                    let f = u64_at(d, II_FLAGS);
                    put_u64(d, II_FLAGS, f | BTRFS_INODE_IMMUTABLE)
                });
            },
        },
        // No btrfs check release looks for this (the kernel never writes it): ours only.
        Case {
            class: "inode flags contradictory (compress + nocompress)",
            category: "inode-flags",
            base: Fs,
            progs_since: NEVER,
            apply: |img| {
                let it = item(img, 5, 5, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| {
                    let f = u64_at(d, II_FLAGS);
                    put_u64(
                        d,
                        II_FLAGS,
                        f | BTRFS_INODE_COMPRESS | BTRFS_INODE_NOCOMPRESS,
                    )
                });
            },
        },
        Case {
            class: "I_ERR_LINK_COUNT_WRONG / LINK_COUNT_ERROR",
            category: "inode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 6, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| put_u32(d, II_NLINK, 3));
            },
        },
        Case {
            class: "I_ERR_NO_ORPHAN_ITEM / ORPHAN_ITEM",
            category: "orphan",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 7, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| put_u32(d, II_NLINK, 0));
            },
        },
        Case {
            class: "I_ERR_FILE_NBYTES_WRONG / NBYTES_ERROR",
            category: "inode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 8, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| {
                    let n = u64_at(d, II_NBYTES);
                    put_u64(d, II_NBYTES, n + 4096)
                });
            },
        },
        Case {
            class: "I_ERR_DIR_ISIZE_WRONG / ISIZE_ERROR",
            category: "inode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 1, &|k, d| {
                    k.ty == BTRFS_INODE_ITEM_KEY && mode_of(d) & 0o170000 == 0o040000
                });
                patch_item(img, it, &|d| {
                    let n = u64_at(d, II_SIZE);
                    put_u64(d, II_SIZE, n + 2)
                });
            },
        },
        Case {
            class: "I_ERR_MISMATCH_DIR_HASH / DIR_ITEM_HASH_MISMATCH",
            category: "name",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 10, &|k, _| k.ty == BTRFS_DIR_ITEM_KEY);
                patch_item(img, it, &|d| d[30] ^= 0x20);
            },
        },
        Case {
            class: "REF_ERR_FILETYPE_UNMATCH / DIR_ITEM_MISMATCH",
            category: "name",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 12, &|k, d| {
                    k.ty == BTRFS_DIR_INDEX_KEY && d[29] == BTRFS_FT_REG_FILE
                });
                patch_item(img, it, &|d| d[29] = BTRFS_FT_FIFO);
            },
        },
        Case {
            class: "REF_ERR_INDEX_UNMATCH / DIR_INDEX_MISMATCH",
            category: "name",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 20, &|k, _| k.ty == BTRFS_INODE_REF_KEY);
                patch_item(img, it, &|d| {
                    let i = u64_at(d, 0);
                    put_u64(d, 0, i + 7777)
                });
            },
        },
        Case {
            class: "REF_ERR_NO_DIR_ITEM + NO_DIR_INDEX (entry points nowhere)",
            category: "name",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 14, &|k, _| k.ty == BTRFS_DIR_INDEX_KEY);
                patch_item(img, it, &|d| {
                    let o = u64_at(d, 0);
                    put_u64(d, 0, o + 100_000)
                });
            },
        },
        Case {
            class: "REF_ERR_NAME_TOO_LONG",
            category: "item",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 3, &|k, _| k.ty == BTRFS_DIR_ITEM_KEY);
                patch_item(img, it, &|d| put_u16(d, 27, 300));
            },
        },
        Case {
            class: "I_ERR_FILE_EXTENT_OVERLAP",
            category: "file-extent",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                // The first extent of "holey" (64 KiB) made to reach into the hole extent after it.
                let ino = ino_of(img, b"holey");
                let it = item(img, 5, 0, &|k, _| {
                    k.objectid == ino && k.ty == BTRFS_EXTENT_DATA_KEY
                });
                patch_item(img, it, &|d| {
                    let n = u64_at(d, 45);
                    put_u64(d, 45, n + 8192);
                    put_u64(d, 8, u64_at(d, 8) + 8192)
                });
            },
        },
        Case {
            class: "I_ERR_BAD_FILE_EXTENT / FILE_EXTENT_ERROR (unaligned)",
            category: "file-extent",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 3, &|k, d| {
                    k.ty == BTRFS_EXTENT_DATA_KEY && d.len() == 53 && d[20] == 1
                });
                patch_item(img, it, &|d| {
                    let n = u64_at(d, 45);
                    put_u64(d, 45, n - 1)
                });
            },
        },
        Case {
            class: "I_ERR_INLINE_RAM_BYTES_WRONG",
            category: "file-extent",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 5, &|k, d| {
                    k.ty == BTRFS_EXTENT_DATA_KEY && d.len() > 21 && d[20] == 0 && d[16] == 0
                });
                patch_item(img, it, &|d| {
                    let n = u64_at(d, 8);
                    put_u64(d, 8, n + 1)
                });
            },
        },
        Case {
            class: "I_ERR_FILE_EXTENT_DISCOUNT (missing hole, no no-holes)",
            category: "inode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                // Drop the hole extent after the first 64 KiB of "holey" by making it a zero-length gap.
                let ino = ino_of(img, b"holey");
                let it = item(img, 5, 0, &|k, _| {
                    k.objectid == ino && k.ty == BTRFS_EXTENT_DATA_KEY
                });
                patch_key_offset(img, it, 4096);
            },
        },
        Case {
            class: "I_ERR_SOME_CSUM_MISSING / CSUM_ITEM_MISSING",
            category: "csum-missing",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 7, 0, &|k, _| k.ty == BTRFS_EXTENT_CSUM_KEY);
                patch_key_offset(img, it, it.key.offset + (64 << 20));
            },
        },
        Case {
            class: "I_ERR_ODD_CSUM_ITEM / ODD_CSUM_ITEM (nodatasum with csums)",
            category: "csum-odd",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 0, &|k, d| {
                    k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d) && u64_at(d, II_SIZE) == 40000
                });
                patch_item(img, it, &|d| {
                    let f = u64_at(d, II_FLAGS);
                    put_u64(d, II_FLAGS, f | BTRFS_INODE_NODATASUM)
                });
            },
        },
        Case {
            class: "REF_ERR_NO_ROOT_BACKREF / ROOT_REF_MISSING",
            category: "root-ref",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 1, 0, &|k, _| k.ty == BTRFS_ROOT_BACKREF_KEY);
                patch_key_offset(img, it, 7);
            },
        },
        Case {
            class: "fs tree missing orphan item (deleted subvolume)",
            category: "root-orphan",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 1, 0, &|k, _| {
                    k.ty == BTRFS_ROOT_ITEM_KEY && k.objectid == 257
                });
                // root_item.refs follows the inode item and seven u64 fields.
                patch_item(img, it, &|d| put_u32(d, 216, 0));
            },
        },
        Case {
            class: "extent backref count (REF_ERR / BACKREF_MISMATCH)",
            category: "extent-refs",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 2, 3, &|k, d| {
                    k.ty == BTRFS_EXTENT_ITEM_KEY && u64_at(d, 16) & BTRFS_EXTENT_FLAG_DATA != 0
                });
                patch_item(img, it, &|d| {
                    let r = u64_at(d, 0);
                    put_u64(d, 0, r + 1)
                });
            },
        },
        Case {
            class: "BG_ACCOUNTING_ERROR (block group used)",
            category: "block-group",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 2, 0, &|k, d| {
                    k.ty == BTRFS_BLOCK_GROUP_ITEM_KEY
                        && u64_at(d, 16) & BTRFS_BLOCK_GROUP_DATA != 0
                });
                patch_item(img, it, &|d| {
                    let u = u64_at(d, 0);
                    put_u64(d, 0, u + 4096)
                });
            },
        },
        Case {
            class: "CHUNK_TYPE_MISMATCH (block group flags against chunk)",
            category: "block-group",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 2, 0, &|k, d| {
                    k.ty == BTRFS_BLOCK_GROUP_ITEM_KEY
                        && u64_at(d, 16) & BTRFS_BLOCK_GROUP_DATA != 0
                });
                patch_item(img, it, &|d| {
                    let f = u64_at(d, 16);
                    put_u64(
                        d,
                        16,
                        (f & !BTRFS_BLOCK_GROUP_DATA) | BTRFS_BLOCK_GROUP_METADATA,
                    )
                });
            },
        },
        Case {
            class: "SUPER_BYTES_USED_ERROR",
            category: "superblock",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                patch_super(img, &|sb| {
                    let u = u64_at(sb, 0x78);
                    put_u64(sb, 0x78, u + 4096)
                });
            },
        },
        Case {
            class: "device item bytes_used against dev extents",
            category: "dev-item",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 3, 0, &|k, _| k.ty == BTRFS_DEV_ITEM_KEY);
                patch_item(img, it, &|d| {
                    let u = u64_at(d, 16);
                    put_u64(d, 16, u + (1 << 20))
                });
            },
        },
        Case {
            class: "block device smaller than the device item's total_bytes",
            category: "dev-item",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(img)
                    .expect("open");
                let len = f.metadata().expect("stat").len();
                f.set_len(len - (1 << 20)).expect("truncate");
            },
        },
        Case {
            class: "invalid chunk (stripe_len), chunk tree and sys_chunk_array",
            category: "chunk",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 3, 0, &|k, d| {
                    k.ty == BTRFS_CHUNK_ITEM_KEY && u64_at(d, 24) & BTRFS_BLOCK_GROUP_DATA != 0
                });
                patch_item(img, it, &|d| put_u64(d, 16, 1 << 45));
            },
        },
        Case {
            class: "superblock members (invalid stripesize)",
            category: "superblock",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                patch_super(img, &|sb| put_u32(sb, 0x9c, 593920));
            },
        },
        Case {
            class: "v1 free space cache inode mode",
            category: "space-cache",
            base: SpaceCacheV1,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 1, 0, &|k, _| {
                    k.ty == BTRFS_INODE_ITEM_KEY && k.objectid >= 256
                });
                patch_item(img, it, &|d| put_u32(d, II_MODE, 0));
            },
        },
        Case {
            class: "v1 free space cache with more free space than the group",
            category: "space-cache",
            base: SpaceCacheV1,
            progs_since: (0, 0),
            apply: grow_v1_cache_entry,
        },
        Case {
            class: "unknown inode flags (tree checker)",
            category: "inode-flags",
            base: Fs,
            progs_since: (6, 4),
            apply: |img| {
                let it = item(img, 5, 9, &|k, d| k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d));
                patch_item(img, it, &|d| {
                    let f = u64_at(d, II_FLAGS);
                    put_u64(d, II_FLAGS, f | (1 << 20))
                });
            },
        },
        Case {
            class: "unknown inode mode bits (tree checker)",
            category: "inode-mode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 5, 10, &|k, d| {
                    k.ty == BTRFS_INODE_ITEM_KEY && is_reg(d)
                });
                patch_item(img, it, &|d| {
                    let m = mode_of(d);
                    put_u32(d, II_MODE, m | (1 << 20))
                });
            },
        },
        Case {
            class: "REF_ERR_NO_INODE_REF / INODE_REF_MISSING",
            category: "name",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                // A file with one name: its INODE_REF now names another parent.
                let ino = ino_of(img, b"holey");
                let it = item(img, 5, 0, &|k, _| {
                    k.objectid == ino && k.ty == BTRFS_INODE_REF_KEY
                });
                patch_key_offset(img, it, it.key.offset + 1);
            },
        },
        Case {
            class: "BACKREF_OUT_OF_ORDER (inline refs)",
            category: "extent-item",
            base: Quota,
            progs_since: (6, 6),
            apply: |img| {
                // A data extent of a file in a snapshotted leaf that was then
                // changed: an inline data ref, then an inline shared data ref.
                let it = item(img, 2, 0, &|k, d| {
                    k.ty == BTRFS_EXTENT_ITEM_KEY
                        && d.len() == 24 + 29 + 13
                        && d[24] == BTRFS_EXTENT_DATA_REF_KEY
                        && d[53] == BTRFS_SHARED_DATA_REF_KEY
                });
                patch_item(img, it, &|d| {
                    let data_ref = d[24..53].to_vec();
                    let shared_ref = d[53..66].to_vec();
                    d[24..37].copy_from_slice(&shared_ref);
                    d[37..66].copy_from_slice(&data_ref);
                });
            },
        },
        Case {
            class: "metadata backref level out of range (053)",
            category: "extent-item",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 2, 2, &|k, _| {
                    k.ty == BTRFS_METADATA_ITEM_KEY && k.offset == 0
                });
                patch_key_offset(img, it, 256);
            },
        },
        // btrfs check compares only the level's range; ours the block's real level.
        Case {
            class: "metadata backref level differs from the block's",
            category: "extent-item",
            base: Fs,
            progs_since: NEVER,
            apply: |img| {
                let it = item(img, 2, 2, &|k, _| {
                    k.ty == BTRFS_METADATA_ITEM_KEY && k.offset == 0
                });
                patch_key_offset(img, it, 1);
            },
        },
        Case {
            class: "overlapping csum items (045, core's writer)",
            category: "csum-overlap",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                // A second csum item starting one sector into the first.
                let first = item(img, 7, 0, &|k, d| {
                    k.ty == BTRFS_EXTENT_CSUM_KEY && d.len() >= 8
                });
                let data = read_item(img, 7, first);
                let k = Key {
                    objectid: BTRFS_EXTENT_CSUM_OBJECTID,
                    ty: BTRFS_EXTENT_CSUM_KEY,
                    offset: first.key.offset + 4096,
                };
                with_writer(img, &|fs| {
                    fs.insert_item(7, &k, &data[4..8]).expect("insert")
                });
            },
        },
        Case {
            class: "dev extent past the device (036, 068)",
            category: "dev-extent",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 4, 0, &|k, _| k.ty == BTRFS_DEV_EXTENT_KEY);
                // btrfs_dev_extent: chunk_tree, chunk_objectid, chunk_offset, length.
                patch_item(img, it, &|d| put_u64(d, 24, 1 << 40));
            },
        },
        Case {
            class: "qgroup relation without its reverse or parent",
            category: "qgroup-relation",
            base: Quota,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 8, 0, &|k, _| {
                    k.ty == BTRFS_QGROUP_RELATION_KEY && k.objectid == 256
                });
                patch_key_offset(img, it, it.key.offset + 1);
            },
        },
        Case {
            class: "qgroup limit item without its qgroup",
            category: "qgroup-limit",
            base: Quota,
            progs_since: NEVER,
            apply: |img| {
                let it = item(img, 8, 0, &|k, _| {
                    k.ty == BTRFS_QGROUP_LIMIT_KEY && k.offset == 256
                });
                patch_key_offset(img, it, 255);
            },
        },
        Case {
            class: "I_ERR_NO_INODE_ITEM / INODE_ITEM_MISSING (core's writer)",
            category: "inode",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let ino = ino_of(img, b"holey");
                with_writer(img, &|fs| {
                    fs.delete_item(
                        5,
                        &Key {
                            objectid: ino,
                            ty: BTRFS_INODE_ITEM_KEY,
                            offset: 0,
                        },
                    )
                    .expect("delete");
                });
            },
        },
        Case {
            class: "I_ERR_DUP_DIR_INDEX (two entries in one DIR_INDEX, core's writer)",
            category: "item",
            base: Fs,
            progs_since: (0, 0),
            apply: |img| {
                let k = first_key(img, 5, BTRFS_DIR_INDEX_KEY, 256);
                with_writer(img, &|fs| {
                    let d = fs.lookup(5, &k).expect("lookup").expect("dir index");
                    let mut two = d.clone();
                    two.extend_from_slice(&d);
                    fs.update_item(5, &k, &two).expect("update");
                });
            },
        },
        Case {
            class: "I_ERR_DUP_FILENAME / DUP_FILENAME_ERROR (core's writer)",
            category: "name",
            base: Fs,
            progs_since: (6, 16),
            apply: |img| {
                let k = first_key(img, 5, BTRFS_DIR_ITEM_KEY, 256);
                with_writer(img, &|fs| {
                    let d = fs.lookup(5, &k).expect("lookup").expect("dir item");
                    let mut two = d.clone();
                    two.extend_from_slice(&d);
                    fs.update_item(5, &k, &two).expect("update");
                });
            },
        },
        Case {
            class: "UNKNOWN_KEY in a subvolume tree (core's writer)",
            category: "unknown-key",
            base: Fs,
            progs_since: (6, 19),
            apply: |img| {
                let ino = ino_of(img, b"holey");
                with_writer(img, &|fs| {
                    fs.insert_item(
                        5,
                        &Key {
                            objectid: ino,
                            ty: 100,
                            offset: 0,
                        },
                        &[],
                    )
                    .expect("insert")
                });
            },
        },
        Case {
            class: "I_ERR_DEPRECATED_FREE_INO (inode cache item, core's writer)",
            category: "inode-cache",
            base: Fs,
            progs_since: (6, 11),
            apply: |img| {
                with_writer(img, &|fs| {
                    fs.insert_item(
                        5,
                        &Key {
                            objectid: BTRFS_FREE_INO_OBJECTID,
                            ty: BTRFS_INODE_ITEM_KEY,
                            offset: 0,
                        },
                        &[0u8; 160],
                    )
                    .expect("insert")
                });
            },
        },
        Case {
            class: "qgroup counts (level 0): referenced",
            category: "qgroup-count",
            base: Quota,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 8, 0, &|k, _| {
                    k.ty == BTRFS_QGROUP_INFO_KEY && k.offset == 256
                });
                patch_item(img, it, &|d| {
                    let r = u64_at(d, 8);
                    put_u64(d, 8, r + 4096);
                    put_u64(d, 16, r + 4096)
                });
            },
        },
        Case {
            class: "qgroup counts (level 0, snapshot): exclusive",
            category: "qgroup-count",
            base: Quota,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 8, 0, &|k, _| {
                    k.ty == BTRFS_QGROUP_INFO_KEY && k.offset == 258
                });
                patch_item(img, it, &|d| {
                    let e = u64_at(d, 24);
                    put_u64(d, 24, e + 16384);
                    put_u64(d, 32, e + 16384)
                });
            },
        },
        Case {
            class: "qgroup counts (level 1 through relations)",
            category: "qgroup-count",
            base: Quota,
            progs_since: (0, 0),
            apply: |img| {
                let it = item(img, 8, 0, &|k, _| {
                    k.ty == BTRFS_QGROUP_INFO_KEY && k.offset == (1 << 48) | 100
                });
                patch_item(img, it, &|d| {
                    let e = u64_at(d, 24);
                    put_u64(d, 24, e.saturating_sub(16384));
                    put_u64(d, 32, e.saturating_sub(16384))
                });
            },
        },
    ]
}

/// Make the first extent entry of a v1 cache one sector longer (page
/// checksum recomputed): a cache the kernel would load, claiming space that
/// is in use.
fn grow_v1_cache_entry(img: &Path) {
    use btrkit_core::image::{Image, OpenOptions};
    use std::os::unix::fs::FileExt;
    let hdr = item(img, 1, 0, &|k, d| {
        k.objectid == BTRFS_FREE_SPACE_OBJECTID && u64_at(d, 25) > 0
    });
    let hd = read_item(img, 1, hdr);
    let ino = u64_at(&hd, 0);
    let ext = item(img, 1, 0, &|k, _| {
        k.objectid == ino && k.ty == BTRFS_EXTENT_DATA_KEY
    });
    let ed = read_item(img, 1, ext);
    let disk = u64_at(&ed, 21) + u64_at(&ed, 37);
    let phys = {
        let i = Image::open_path(img, OpenOptions::default()).expect("open");
        i.chunks.map(disk, 4096, i.devid).expect("map")[0]
    };
    let isize = {
        let it = item(img, 1, 0, &|k, _| {
            k.objectid == ino && k.ty == BTRFS_INODE_ITEM_KEY
        });
        u64_at(&read_item(img, 1, it), II_SIZE)
    };
    let pages = isize.div_ceil(4096) as usize;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .expect("open");
    let mut page = vec![0u8; 4096];
    f.read_exact_at(&mut page, phys).expect("read");
    let e = 4 * pages + 8;
    let bytes = u64_at(&page, e + 8);
    put_u64(&mut page, e + 8, bytes + 4096);
    let c = btrkit_core::csum::CsumType::Crc32c.compute(&page[4 * pages..]);
    page[..4].copy_from_slice(&c[..4]);
    f.write_all_at(&page, phys).expect("write");
}

#[test]
fn fsck_parity_with_btrfs_check() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let progs = progs_version();
    let mut failures = Vec::new();
    let mut bases = std::collections::HashMap::new();
    for base in [Base::Fs, Base::Quota, Base::SpaceCacheV1] {
        let img = build_base(tmp.path(), base);
        let (pd, pout) = progs_check(&img);
        let r = run_fsck(&img, &["--check-data-csum"], LIMIT);
        assert!(
            !pd,
            "{base:?} base image: btrfs check finds damage:\n{pout}"
        );
        assert_eq!(
            r.code,
            0,
            "{base:?} base image not clean for btrkit-fsck: {:?}",
            r.errors()
        );
        if base == Base::Quota {
            let v = r.json();
            let phase9 = v["phases"]
                .as_array()
                .and_then(|a| a.iter().find(|p| p["phase"] == 9).cloned())
                .unwrap_or_default();
            assert!(
                phase9["ran"] == true && phase9["checked"].as_u64().unwrap_or(0) >= 6,
                "quota phase did not check the qgroups: {phase9}"
            );
        }
        bases.insert(base, img);
    }
    for c in cases() {
        let img = tmp.path().join("damaged.img");
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            bases[&c.base].display(),
            img.display()
        ));
        (c.apply)(&img);
        let stamp = file_stamp(&img);
        let r = run_fsck(&img, &[], LIMIT);
        let errs = r.errors();
        let ours = r.code == 4 && errs.iter().any(|e| e.1 == c.category);
        let (theirs, pout) = progs_check(&img);
        let progs_knows = progs >= c.progs_since;
        eprintln!(
            "{}: btrkit-fsck exit {} categories {:?}; btrfs check {}",
            c.class,
            r.code,
            errs.iter()
                .map(|e| e.1.as_str())
                .collect::<std::collections::BTreeSet<_>>(),
            if theirs { "damaged" } else { "clean" }
        );
        if !ours {
            failures.push(format!(
                "{}: wanted an error in category {}: exit {} {:?} {}",
                c.class, c.category, r.code, errs, r.stderr
            ));
        }
        if progs_knows && !theirs {
            failures.push(format!(
                "{}: btrfs check {}.{} calls the damaged image clean:\n{pout}",
                c.class, progs.0, progs.1
            ));
        }
        assert!(
            !r.stderr.contains("panicked"),
            "{}: panic: {}",
            c.class,
            r.stderr
        );
        assert_eq!(
            stamp,
            file_stamp(&img),
            "{}: the image was modified",
            c.class
        );
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Orphans both ways: an inode with no links and an orphan item is valid
/// (a file and a directory deleted while still open, committed, captured
/// before the last close), and both checkers call it clean; the same inode
/// without its orphan item is damage (the case list above).
#[test]
fn open_unlinked_file_and_directory_are_valid_orphans() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = tmp.path().join("live.img");
    let snap = tmp.path().join("orphans.img");
    sh(&format!(
        "truncate -s 256M '{0}' && mkfs.btrfs -q -f -R ^free-space-tree '{0}'",
        img.display()
    ));
    {
        let m = LoopMount::new(&img, "space_cache=v2,commit=600").expect("mount");
        let p = m.path().display().to_string();
        sh(&format!("mkdir -p '{p}/dir/sub' && for i in 1 2 3; do echo $i > '{p}/dir/f'$i; done && head -c 100000 /dev/urandom > '{p}/file' && sync"));
        // Hold the file and the directory open, delete both, commit.
        let mut holder = Command::new("sh")
            .arg("-c")
            // One process (exec), so killing it closes both; it says so
            // once both are open.
            .arg(format!(
                "cd '{p}/dir/sub' && exec 3<'{p}/file' && echo open && exec sleep 600"
            ))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("holder");
        let mut said = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.as_mut().expect("holder's stdout")),
            &mut said,
        )
        .expect("holder's word");
        assert_eq!(said, "open\n", "the holder did not open its files");
        sh(&format!(
            "rm -f '{p}/file' && rm -rf '{p}/dir' && sync && cp --sparse=always '{}' '{}'",
            img.display(),
            snap.display()
        ));
        let _ = holder.kill();
        let _ = holder.wait();
    }
    let orphans = (0..4)
        .filter_map(|n| find_item(&snap, 5, n, &|k, _| k.ty == BTRFS_ORPHAN_ITEM_KEY))
        .count();
    assert!(
        orphans >= 2,
        "the kernel left {orphans} orphan items, wanted the file's and the directory's"
    );
    let (theirs, pout) = progs_check(&snap);
    assert!(!theirs, "btrfs check finds the orphans damaged:\n{pout}");
    let r = run_fsck(&snap, &[], LIMIT);
    assert_eq!(
        r.code,
        0,
        "btrkit-fsck finds the orphans damaged: {:?}",
        r.errors()
    );
}

/// Long findings wrap inside the table instead of widening it.
#[test]
fn findings_table_fits_the_width() {
    let Some(dir) = btrkit_tests::fixtures::fsck_fixture_dir() else {
        btrkit_tests::skip("../shared/fixtures/btrfs-progs-fsck is missing");
        return;
    };
    let _ = dir;
    let _cache = btrkit_tests::fixtures::FixtureCacheGuard;
    let img = btrkit_tests::fixtures::fsck_fixture(
        "058-bad-free-space-tree-entry--corrupt-free-space-tree2",
    )
    .expect("fixture");
    let o = Command::new(fsck_bin())
        .arg(&img)
        .env("COLUMNS", "100")
        .output()
        .expect("run");
    let out = String::from_utf8_lossy(&o.stdout);
    // Table lines (the verdict line names the image path, which may be long).
    let widest = out
        .lines()
        .filter(|l| l.starts_with(['│', '┌', '└', '╞', '├']))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    assert!(out.contains("stale entry"), "{out}");
    assert!(widest <= 110, "a line of {widest} columns:\n{out}");
}
