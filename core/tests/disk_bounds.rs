//! No allocation sized by a field from disk without a bound the format
//! gives: crafted items (a logged file extent of 2^45 bytes over 64 KiB
//! of data, compressed extents claiming 2 GiB, a symlink of 2^40 bytes)
//! are typed `Corrupt` errors naming the item, or, for salvage, an inode
//! left out; never an abort on a failed allocation.
//!
//! The test binary's allocator refuses any single allocation above
//! [`CAP`], so a read path that sizes a buffer by such a field fails the
//! test (with an allocation error) instead of passing on a machine with
//! the memory to spare.

// The capped allocator is the one unsafe part: it forwards to the system
// allocator.
#![allow(unsafe_code)]

mod common;

use btrkit_core::format::consts::*;
use btrkit_core::format::header::HEADER_SIZE;
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::BlockDevice;
use btrkit_core::log::reader::{read_log, OnDamage, ReadOptions};
use btrkit_core::log::replay::{replay, ReplayOptions};
use btrkit_core::mount_view::{ReadOnlyView, ROOT_NODE};
use btrkit_core::restore::{LogMode, ReadOptions as ViewOptions};
use btrkit_core::trans::Store;
use btrkit_core::tree::TreeIter;
use btrkit_core::{CorruptKind, Error};
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;

/// The largest single allocation the test binary allows: the images are
/// 256 MiB and held in memory (one allocation each), nothing else needs
/// more than a few MiB.
const CAP: usize = 300 << 20;

struct Capped;

// SAFETY: every call forwards to the system allocator with the caller's
// layout; a request above the cap gets null, which the caller must handle
// (the standard collections report it as an allocation error).
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as given.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as given.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as given.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

#[test]
fn the_cap_holds() {
    // What the other tests rely on: an allocation above the cap fails.
    let mut v: Vec<u8> = Vec::new();
    assert!(v.try_reserve(CAP + 1).is_err());
    assert!(v.try_reserve(1 << 20).is_ok());
}

/// Change the tree block at `bytenr` with `f` on every copy, its
/// checksum recomputed (the damage is in the item, not the block).
fn patch_block(dev: &Arc<dyn BlockDevice>, bytenr: u64, f: &dyn Fn(&mut [u8])) {
    let img = Image::open(dev.clone(), OpenOptions::default()).unwrap();
    let ns = img.nodesize as usize;
    let csum = img.csum;
    for (devid, phys) in img.chunks.copies(bytenr, ns as u64).unwrap() {
        assert_eq!(devid, 1);
        let mut b = vec![0u8; ns];
        dev.read_at(phys, &mut b).unwrap();
        f(&mut b);
        let c = btrkit_core::csum::block_csum(csum, &b);
        b[..32].copy_from_slice(&c);
        dev.write_at(phys, &b).unwrap();
    }
    dev.flush().unwrap();
}

/// (block, offset of the item's data in it, key) of the first item of
/// tree `root` (a log tree's root when `log`) for which `pred` holds.
fn find(
    dev: &Arc<dyn BlockDevice>,
    log: bool,
    tree: u64,
    pred: &dyn Fn(&Key, &[u8]) -> bool,
) -> (u64, usize, Key) {
    let img = Image::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = if log {
        let read = read_log(&img, ReadOptions::new(OnDamage::Fail))
            .unwrap()
            .unwrap();
        read.trees
            .iter()
            .find(|t| t.subvol == tree)
            .unwrap()
            .read
            .root
    } else {
        img.find_root(tree).unwrap().unwrap()
    };
    let mut it = TreeIter::new(&img, root, Key::MIN).unwrap();
    while let Some(item) = it.next_item() {
        let item = item.unwrap();
        let d = item.data().unwrap();
        if pred(&item.key, d) {
            let h = item.node.item(item.slot).unwrap();
            return (
                item.node.bytenr,
                HEADER_SIZE + h.offset.get() as usize,
                item.key,
            );
        }
    }
    panic!("no such item");
}

fn le64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offsets in a file extent item.
const RAM_BYTES: usize = 8;
const DISK_NUM_BYTES: usize = 29;
const NUM_BYTES: usize = 45;

/// An image whose fsync log holds inode 257 (`/f`, 64 KiB written and
/// fsynced after the last commit), as a power failure leaves it.
fn crashed_with_log() -> Arc<dyn BlockDevice> {
    let dev = new_image(IMAGE_SIZE, &[]);
    let base: Arc<dyn BlockDevice> = dev.clone();
    let mut fs = mount(base, &[]).unwrap();
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644).unwrap();
    fs.sync().unwrap();
    fs.write(f, 0, &vec![0x61; 65536]).unwrap();
    fs.fsync(f, false, None).unwrap();
    let crashed: Arc<dyn BlockDevice> = Arc::new(dev.crash_device(|_| false));
    drop(fs);
    let img = Image::open(crashed.clone(), OpenOptions::default()).unwrap();
    assert_ne!(img.sb.log_root.get(), 0, "the fsync left a log");
    crashed
}

/// `e` is a Corrupt error naming the item (257, EXTENT_DATA, 0).
fn names_the_extent(e: &Error) {
    match e {
        Error::Corrupt { key: Some(k), .. } => {
            assert_eq!(
                (k.objectid, k.ty, k.offset),
                (257, BTRFS_EXTENT_DATA_KEY, 0),
                "{e}"
            );
        }
        e => panic!("want a Corrupt error naming the extent, got {e}"),
    }
}

#[test]
fn logged_extent_of_2_45_bytes_is_refused_without_allocating() {
    let dev = crashed_with_log();
    let (bytenr, at, _) = find(&dev, true, BTRFS_FS_TREE_OBJECTID, &|k, _| {
        k.objectid == 257 && k.ty == BTRFS_EXTENT_DATA_KEY
    });
    patch_block(&dev, bytenr, &|b| le64(b, at + NUM_BYTES, 1 << 45));
    let copy = |d: &Arc<dyn BlockDevice>| -> Arc<dyn BlockDevice> {
        let mut v = vec![0u8; d.size() as usize];
        d.read_at(0, &mut v).unwrap();
        Arc::new(btrkit_core::io::MemDevice::new(v))
    };

    // Replay: a typed error naming the item, of the kind the tools answer
    // with "--salvage".
    let mut st = Store::open_for_replay(copy(&dev)).unwrap();
    let e = replay(&mut st, ReplayOptions::default()).unwrap_err();
    names_the_extent(&e);
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::LogBlock), "{e}");
    assert!(e.to_string().contains("exceeds ram_bytes 65536"), "{e}");

    // Salvage: the inode is left out, the rest replays.
    let mut st = Store::open_for_replay(copy(&dev)).unwrap();
    let sum = replay(
        &mut st,
        ReplayOptions {
            salvage: true,
            ..Default::default()
        },
    )
    .unwrap();
    let rep = sum.salvage.unwrap();
    let f = rep.inodes.iter().find(|i| i.ino == 257).unwrap();
    assert!(
        f.reason
            .as_deref()
            .is_some_and(|r| r.contains("exceeds ram_bytes")),
        "{f:?}"
    );

    // Inspection and the checker see the item and say what is wrong.
    let img = Image::open(copy(&dev), OpenOptions::default()).unwrap();
    let read = read_log(&img, ReadOptions::new(OnDamage::Keep))
        .unwrap()
        .unwrap();
    let p = &read.trees[0].read.problems;
    assert!(
        p.iter().any(|p| p.key.is_some_and(|k| k.objectid == 257)
            && p.message.contains("num_bytes 35184372088832")),
        "{p:?}"
    );
    assert!(
        read.trees[0].csum_needs().iter().all(|n| n.ino != 257),
        "no checksums are looked up for the range"
    );
    let r = check(copy(&dev));
    assert!(
        errors_of(&r).contains("log-extent"),
        "the checker reports the logged extent: {}",
        errors_of(&r)
    );

    // The read-only view (restore, the mount): the replay's error, or with
    // salvage the committed state of the file (empty).
    let open = |log| {
        ReadOnlyView::open(
            vec![("img".into(), copy(&dev))],
            &ViewOptions {
                log,
                ..Default::default()
            },
            None,
            false,
        )
    };
    match open(LogMode::Replay) {
        Err(e) => names_the_extent(&e),
        Ok(_) => panic!("the view replayed an impossible log"),
    }
    let mut v = open(LogMode::Salvage).unwrap();
    let (n, st) = v.lookup(ROOT_NODE, b"f").unwrap();
    assert_eq!(st.size, 0);
    assert!(v.read(n, 0, 1 << 20).unwrap().is_empty());
}

/// A file of `len` bytes of compressible data written with compression
/// and committed; (device, the file's extent item location).
fn compressed_file(len: usize) -> (Arc<dyn BlockDevice>, u64, usize) {
    let dev = new_image(IMAGE_SIZE, &[]);
    let base: Arc<dyn BlockDevice> = dev.clone();
    let mut fs = mount(base.clone(), &["compress=zlib"]).unwrap();
    let root = fs.root();
    let f = fs.create(root, b"c", 0o644).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i / 100 % 8) as u8).collect();
    fs.write(f, 0, &data).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let (bytenr, at, _) = find(&base, false, BTRFS_FS_TREE_OBJECTID, &|k, d| {
        k.objectid == 257 && k.ty == BTRFS_EXTENT_DATA_KEY && d[16] == BTRFS_COMPRESS_ZLIB
    });
    (base, bytenr, at)
}

fn read_c(dev: &Arc<dyn BlockDevice>) -> btrkit_core::Result<Vec<u8>> {
    let mut v = ReadOnlyView::open(
        vec![("img".into(), dev.clone())],
        &ViewOptions::default(),
        None,
        false,
    )?;
    let (n, _) = v.lookup(ROOT_NODE, b"c")?;
    v.read(n, 0, 1 << 20)
}

#[test]
fn compressed_extent_claiming_2_gib_is_corrupt() {
    // A regular compressed extent.
    let (dev, bytenr, at) = compressed_file(128 << 10);
    assert_eq!(read_c(&dev).unwrap().len(), 128 << 10, "it reads before");
    patch_block(&dev, bytenr, &|b| le64(b, at + RAM_BYTES, 2 << 30));
    let e = read_c(&dev).unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { key: Some(k), .. } if k.ty == BTRFS_EXTENT_DATA_KEY),
        "{e}"
    );
    assert!(e.to_string().contains("ram_bytes 2147483648"), "{e}");
    // And its compressed size.
    let (dev, bytenr, at) = compressed_file(128 << 10);
    patch_block(&dev, bytenr, &|b| le64(b, at + DISK_NUM_BYTES, 2 << 30));
    let e = read_c(&dev).unwrap_err();
    assert!(e.to_string().contains("disk_num_bytes 2147483648"), "{e}");

    // A compressed inline extent.
    let (dev, bytenr, at) = compressed_file(2000);
    assert_eq!(read_c(&dev).unwrap().len(), 2000);
    patch_block(&dev, bytenr, &|b| {
        assert_eq!(b[at + 20], BTRFS_FILE_EXTENT_INLINE);
        le64(b, at + RAM_BYTES, 2 << 30)
    });
    let e = read_c(&dev).unwrap_err();
    assert!(e.to_string().contains("ram_bytes 2147483648"), "{e}");
}

#[test]
fn symlink_of_2_40_bytes_is_corrupt() {
    let dev = new_image(IMAGE_SIZE, &[]);
    let base: Arc<dyn BlockDevice> = dev.clone();
    let mut fs = mount(base.clone(), &[]).unwrap();
    let root = fs.root();
    fs.symlink(root, b"s", b"target").unwrap();
    fs.sync().unwrap();
    drop(fs);
    let (bytenr, at, _) = find(&base, false, BTRFS_FS_TREE_OBJECTID, &|k, _| {
        k.objectid == 257 && k.ty == BTRFS_INODE_ITEM_KEY
    });
    // InodeItem: generation, transid, then size.
    patch_block(&base, bytenr, &|b| le64(b, at + 16, 1 << 40));
    let mut v = ReadOnlyView::open(
        vec![("img".into(), base.clone())],
        &ViewOptions::default(),
        None,
        false,
    )
    .unwrap();
    let (n, _) = v.lookup(ROOT_NODE, b"s").unwrap();
    let e = v.readlink(n).unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { key: Some(k), .. } if k.objectid == 257),
        "{e}"
    );
}
