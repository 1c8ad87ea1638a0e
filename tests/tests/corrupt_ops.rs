//! The corruption generator (`btrkit_tests::corrupt`) on images made by
//! `mkfs.btrfs --rootdir` (no root needed): each operation changes what
//! it says, where it says, on every copy of the block (DUP metadata) with
//! the checksum recomputed, or on one copy / with the checksum left bad
//! when asked; every recipe runs on an image, and again on the image it
//! damaged, without a panic.

use btrkit_core::csum::verify_block;
use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE};
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_tests::corrupt::recipes::{self, RecipeError};
use btrkit_tests::corrupt::{leaf_layout_ok, Corruptor, KeyOrder, NameEdit, Value};
use btrkit_tests::oracle::{self, Progs};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An image of `mkfs.btrfs -n 4096 --rootdir` over a few hundred files
/// (a subvolume tree of several leaves), or None (skipped) without
/// mkfs.btrfs.
fn image(dir: &Path) -> Option<PathBuf> {
    if !btrkit_tests::require_btrfs_progs() {
        return None;
    }
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    for i in 0..300u32 {
        let len = [0usize, 50, 1500, 5000, 70000][i as usize % 5];
        let data: Vec<u8> = (0..len)
            .map(|j| (j as u32 ^ i).wrapping_mul(2654435761) as u8)
            .collect();
        let sub = if i % 2 == 0 { "a" } else { "a/b" };
        std::fs::write(src.join(format!("{sub}/file-{i:04}")), data).unwrap();
    }
    std::os::unix::fs::symlink("a/file-0002", src.join("link")).unwrap();
    std::fs::hard_link(src.join("a/file-0004"), src.join("hard")).unwrap();
    let img = dir.join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(320 << 20).unwrap();
    drop(f);
    let o = Command::new("mkfs.btrfs")
        .args(["-f", "-q", "-n", "4096", "-m", "dup", "--rootdir"])
        .arg(&src)
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(img)
}

fn open(img: &Path) -> Image {
    Image::open_path(
        img,
        OpenOptions {
            lenient: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Every copy of block `bytenr`: (bytes, checksum good).
fn copies(img: &Path, bytenr: u64) -> Vec<(Vec<u8>, bool)> {
    let i = open(img);
    i.read_block_copies(bytenr)
        .unwrap()
        .into_iter()
        .map(|c| {
            let b = c.unwrap();
            let ok = verify_block(i.csum, &b);
            (b, ok)
        })
        .collect()
}

fn le(b: &[u8], off: usize, n: usize) -> u64 {
    (0..n).fold(0, |v, i| v | (b[off + i] as u64) << (8 * i))
}

fn first(c: &mut Corruptor, tree: u64, pred: impl Fn(&Key) -> bool) -> btrkit_tests::corrupt::Loc {
    c.items(tree)
        .unwrap()
        .into_iter()
        .find(|l| pred(&l.key))
        .expect("an item")
}

#[test]
fn corrupt_ops_write_every_copy() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let fs = BTRFS_FS_TREE_OBJECTID;
    let mut c = Corruptor::open(&img).unwrap();

    // A field: every copy the same, checksum good, the value there.
    let ino = first(&mut c, fs, |k| {
        k.ty == BTRFS_INODE_ITEM_KEY && k.objectid > 256
    });
    let (old, new) = c
        .set_field(fs, ino.key, "nbytes", &Value::Add(4096))
        .unwrap();
    assert_eq!(
        new.parse::<u64>().unwrap(),
        old.parse::<u64>().unwrap() + 4096
    );
    let cs = copies(&img, ino.bytenr);
    assert_eq!(cs.len(), 2, "DUP metadata has two copies");
    assert!(cs.iter().all(|(b, ok)| *ok && *b == cs[0].0));
    let l = c.find(fs, ino.key).unwrap();
    assert_eq!(le(&l.data, 24, 8), new.parse::<u64>().unwrap());
    assert!(c
        .set_field(fs, ino.key, "no_such_field", &Value::Set(1))
        .is_err());

    // An item header's offset, at its slot.
    c.set_item_header(l.bytenr, l.slot, "offset", &Value::Add(3))
        .unwrap();
    let b = &copies(&img, l.bytenr)[0].0;
    let h = HEADER_SIZE + l.slot * ITEM_SIZE;
    assert_eq!(
        Key::new(le(b, h, 8), b[h + 8], le(b, h + 9, 8)),
        l.key,
        "the key is untouched"
    );
    assert!(leaf_layout_ok(b).is_err());
    c.set_item_header(l.bytenr, l.slot, "offset", &Value::Sub(3))
        .unwrap();
    assert!(leaf_layout_ok(&copies(&img, l.bytenr)[0].0).is_ok());

    // Delete, then put back sorted; a key set in place.
    let idx = first(&mut c, fs, |k| {
        k.ty == BTRFS_DIR_INDEX_KEY && k.objectid > 256
    });
    c.delete(fs, idx.key).unwrap();
    assert!(c.find(fs, idx.key).is_err());
    c.insert(fs, idx.key, &idx.data).unwrap();
    assert_eq!(c.find(fs, idx.key).unwrap().data, idx.data);
    let moved = Key::new(idx.key.objectid, idx.key.ty, idx.key.offset + 100_000);
    c.set_key(fs, idx.key, moved, KeyOrder::InPlace).unwrap();
    let b = copies(&img, idx.bytenr);
    assert!(b.iter().all(|(_, ok)| *ok));
    c.set_key(fs, moved, idx.key, KeyOrder::InPlace).unwrap();

    // The first item of a leaf deleted: the node above follows.
    let leaves: Vec<_> = c
        .blocks(fs)
        .unwrap()
        .into_iter()
        .filter(|b| b.level == 0 && b.depth > 0)
        .collect();
    assert!(leaves.len() > 2, "the tree has several leaves");
    let leaf = &leaves[1];
    let items = c.items(fs).unwrap();
    let head = items
        .iter()
        .find(|l| l.bytenr == leaf.bytenr && l.slot == 0)
        .unwrap()
        .clone();
    c.delete(fs, head.key).unwrap();
    let after = c.items(fs).unwrap();
    assert_eq!(after.len(), items.len() - 1, "the whole tree still reads");
    let r = oracle::btrfs_check(&[&img], Progs::Distro).unwrap();
    let text = r.stderr;
    assert!(
        !text.contains("bad key ordering") && !text.contains("key mismatch"),
        "{text}"
    );
    c.insert(fs, head.key, &head.data).unwrap();

    // A name: same length, first byte changed.
    let di = first(&mut c, fs, |k| {
        k.ty == BTRFS_DIR_ITEM_KEY && k.objectid > 256
    });
    c.set_name(fs, di.key, &NameEdit::Bump).unwrap();
    let d = c.find(fs, di.key).unwrap().data;
    assert_eq!(d.len(), di.data.len());
    assert_eq!(d[30], di.data[30].wrapping_add(1));
    c.set_name(
        fs,
        di.key,
        &NameEdit::Set(b"a-much-longer-name-than-before".to_vec()),
    )
    .unwrap();
    assert_eq!(c.find(fs, di.key).unwrap().data.len(), 30 + 30);

    // Header: one copy only, then the checksum left bad.
    let leaf = leaves[0].bytenr;
    c.opts.copy = Some(0);
    c.set_header(leaf, "generation", &Value::Add(1000)).unwrap();
    let cs = copies(&img, leaf);
    assert!(cs[0].1 && cs[1].1);
    assert_ne!(le(&cs[0].0, 80, 8), le(&cs[1].0, 80, 8));
    c.opts.copy = None;
    c.opts.fix_csum = false;
    c.set_header(leaf, "nritems", &Value::Add(1)).unwrap();
    assert!(copies(&img, leaf).iter().all(|(_, ok)| !ok));
    c.opts.fix_csum = true;

    // shift_items leaves a gap, keys in place.
    let leaf = leaves.iter().skip(2).find(|b| b.free > 100).unwrap().bytenr;
    let before = copies(&img, leaf)[0].0.clone();
    c.shift_items(leaf).unwrap();
    let after = copies(&img, leaf)[0].0.clone();
    assert!(leaf_layout_ok(&before).is_ok() && leaf_layout_ok(&after).is_err());
    assert_eq!(
        before[HEADER_SIZE..HEADER_SIZE + 17],
        after[HEADER_SIZE..HEADER_SIZE + 17]
    );

    // The superblock: every copy the device holds, checksums good.
    c.set_super("num_devices", &Value::Set(3)).unwrap();
    let f = std::fs::read(&img).unwrap();
    let sbs: Vec<usize> = [BTRFS_SUPER_INFO_OFFSET, 64 << 20]
        .iter()
        .map(|&o| o as usize)
        .collect();
    for o in sbs {
        let s = &f[o..o + BTRFS_SUPER_INFO_SIZE];
        assert_eq!(le(s, 0x88, 8), 3, "superblock at {o}");
        let t = btrkit_core::csum::CsumType::from_disk(le(s, 0xc4, 2) as u16).unwrap();
        assert!(t.verify(&s[32..], &s[..32]), "superblock at {o} checksum");
    }
    assert_eq!(c.super_field("num_devices").unwrap(), 3);
}

#[test]
fn corrupt_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let fs = BTRFS_FS_TREE_OBJECTID;
    let mut c = Corruptor::open(&img).unwrap();
    assert!(c.find(fs, Key::new(1 << 40, 1, 0)).is_err());
    assert!(c.delete(fs, Key::new(1 << 40, 1, 0)).is_err());
    let ino = first(&mut c, fs, |k| k.ty == BTRFS_INODE_ITEM_KEY);
    assert!(
        c.insert(fs, ino.key, &ino.data).is_err(),
        "a key present already"
    );
    assert!(
        c.set_raw(fs, ino.key, 159, 8, &Value::Set(1)).is_err(),
        "past the item"
    );
    assert!(
        c.set_field(fs, ino.key, "mode", &Value::Set(1 << 40))
            .is_err(),
        "too wide"
    );
    assert!(c
        .set_item_header(ino.bytenr, 100_000, "offset", &Value::Set(1))
        .is_err());
    assert!(c.set_header(ino.bytenr, "nope", &Value::Set(1)).is_err());
    // A leaf whose layout is broken is not relaid.
    let l = c
        .items(fs)
        .unwrap()
        .into_iter()
        .find(|l| l.leaf_items > 3 && !l.leaf_is_root)
        .unwrap();
    c.set_item_header(l.bytenr, 1, "size", &Value::Add(1))
        .unwrap();
    let other = c
        .items(fs)
        .unwrap()
        .into_iter()
        .find(|x| x.bytenr == l.bytenr && x.slot == 2);
    if let Some(o) = other {
        assert!(c.delete(fs, o.key).is_err(), "delete in a damaged leaf");
    }
    // Not an image at all.
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    assert!(Corruptor::open(&junk).is_err());
    assert!(recipes::apply(&junk, "016", 1).is_err());
}

fn cp(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "cp {}", from.display());
}

/// Every recipe on an image, then four others (in turn) on each damaged
/// image: an edit or a reason, never a panic.
#[test]
fn corrupt_every_recipe_twice() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let mut applied = 0;
    let all = recipes::recipes();
    for (i, r) in all.iter().enumerate() {
        let one = dir.path().join("one.img");
        cp(&img, &one);
        match recipes::apply(&one, r.class, 7) {
            Ok(a) => {
                applied += 1;
                assert!(!a.changes.is_empty(), "{}: no change recorded", r.class);
            }
            Err(RecipeError::NoTarget(_)) => {}
            Err(RecipeError::Failed(e)) => panic!("{}: {e}", r.class),
        }
        for j in 1..=4 {
            let r2 = &all[(i + j * 7) % all.len()];
            let two = dir.path().join("two.img");
            cp(&one, &two);
            let _ = recipes::apply(&two, r2.class, 11);
        }
    }
    // mkfs.btrfs --rootdir makes no snapshot, reflink, deleted subvolume
    // or free space tree entries of every kind; most classes still apply.
    assert!(applied >= 25, "only {applied} recipes applied");
}
