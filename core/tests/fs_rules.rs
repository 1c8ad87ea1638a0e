//! The rules of fs/ and trans/ that are easy to get subtly wrong, one test
//! each, on images made by core's mkfs in memory; every test ends with the
//! checker (data checksums included) finding the image clean:
//! - fs::names: the directory size rule, hash-colliding names packed in
//!   one DIR_ITEM, inode refs spilling into extrefs when the INODE_REF item
//!   is full, and removal from either;
//! - fs::extents::drop_extents: splits (the extent gains a reference),
//!   partial and compressed inline extents, the last reference dropping
//!   the extent and its checksums;
//! - trans delayed refs: dropping and re-adding an extent's reference in
//!   one transaction keeps the extent and its checksums;
//! - trans B-tree: an item over half a leaf in the middle of a full leaf.

mod common;

use btrkit_core::format::consts::*;
use btrkit_core::format::dir::{extref_hash, name_hash};
use btrkit_core::format::extent::parse_extent_item;
use btrkit_core::format::file_extent::{parse_file_extent, FileExtent};
use btrkit_core::format::key::Key;
use btrkit_core::fs::extents::{drop_extents, extent_key, insert_disk_extent};
use btrkit_core::fs::inode::*;
use btrkit_core::fs::{data, names, xattr};
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::trans::{Store, TreeId};
use common::*;
use std::collections::HashMap;
use std::sync::Arc;

const FS: u64 = BTRFS_FS_TREE_OBJECTID;
const ROOT: u64 = BTRFS_FIRST_FREE_OBJECTID;

fn store(dev: &Arc<CrashDevice>) -> Store {
    Store::open(dev.clone()).unwrap_or_else(|e| panic!("open: {e}"))
}

fn dyn_dev(dev: &Arc<CrashDevice>) -> Arc<dyn BlockDevice> {
    dev.clone()
}

/// A regular file `ino` named `name` in the root directory (the caller sets
/// size and nbytes when it adds data).
fn new_file(st: &mut Store, ino: u64, name: &str) {
    let t = st.transid();
    let it = new_inode_item(
        S_IFREG | 0o644,
        0,
        0,
        0,
        btrkit_core::mkfs::now_ts(1_700_000_000),
        t,
    );
    put_inode(st, FS, ino, &it).unwrap();
    let idx = names::next_dir_index(st, FS, ROOT).unwrap();
    names::add_name(
        st,
        FS,
        ROOT,
        inode_key(ino),
        name.as_bytes(),
        BTRFS_FT_REG_FILE,
        idx,
        t,
    )
    .unwrap();
}

fn set_size(st: &mut Store, ino: u64, size: u64, nbytes: u64) {
    let mut it = get_inode(st, FS, ino).unwrap().unwrap();
    it.size.set(size);
    it.nbytes.set(nbytes);
    put_inode(st, FS, ino, &it).unwrap();
}

fn dir_size(st: &mut Store, dir: u64) -> u64 {
    get_inode(st, FS, dir).unwrap().unwrap().size.get()
}

/// (refs, [(backref, count)]) of the extent item of data extent `bytenr`.
fn extent_refs(st: &mut Store, bytenr: u64) -> Option<(u64, Vec<String>)> {
    let (k, d) = st
        .next_item(
            BTRFS_EXTENT_TREE_OBJECTID,
            &Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0),
        )
        .unwrap()?;
    if k.objectid != bytenr || k.ty != BTRFS_EXTENT_ITEM_KEY {
        return None;
    }
    let v = parse_extent_item(&k, &d).unwrap();
    Some((
        v.item.refs.get(),
        v.refs.iter().map(|r| format!("{r:?}")).collect(),
    ))
}

/// The file extent items of inode `ino`: (file offset, disk bytenr, offset, num_bytes).
fn file_extents(st: &mut Store, ino: u64) -> Vec<(u64, u64, u64, u64)> {
    st.items_in(
        TreeId::Tree(FS),
        extent_key(ino, 0),
        extent_key(ino, u64::MAX),
    )
    .unwrap()
    .into_iter()
    .map(|(k, d)| match parse_file_extent(&d).unwrap() {
        FileExtent::Disk { item, .. } => (
            k.offset,
            item.disk_bytenr.get(),
            item.offset.get(),
            item.num_bytes.get(),
        ),
        FileExtent::Inline { head, .. } => (k.offset, 0, 0, head.ram_bytes.get()),
    })
    .collect()
}

// ---------------------------------------------------------------------------
// fs::names

/// i_size of a directory is twice the sum of its names' lengths, through
/// adds, removals and unlinks, in the root directory and a subdirectory.
#[test]
fn directory_size_rule() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut st = store(&dev);
    assert_eq!(dir_size(&mut st, ROOT), 0);
    let mut want = 0u64;
    for (i, name) in ["a", "bb", "a-longer-name", &"x".repeat(255)]
        .iter()
        .enumerate()
    {
        new_file(&mut st, 257 + i as u64, name);
        want += 2 * name.len() as u64;
        assert_eq!(dir_size(&mut st, ROOT), want, "after adding {name:?}");
    }
    // A second name of 257 in the same directory.
    let t = st.transid();
    let idx = names::next_dir_index(&mut st, FS, ROOT).unwrap();
    names::add_name(
        &mut st,
        FS,
        ROOT,
        inode_key(257),
        b"second",
        BTRFS_FT_REG_FILE,
        idx,
        t,
    )
    .unwrap();
    let mut it = get_inode(&mut st, FS, 257).unwrap().unwrap();
    it.nlink.set(2);
    put_inode(&mut st, FS, 257, &it).unwrap();
    want += 12;
    assert_eq!(dir_size(&mut st, ROOT), want);
    st.commit().unwrap();
    assert_clean(dyn_dev(&dev), "names added");

    // unlink: the entry goes, the link count drops, the size follows.
    let now = btrkit_core::mkfs::now_ts(1_700_000_001);
    let (ino, left, _) = names::unlink(&mut st, FS, ROOT, b"a", now).unwrap();
    assert_eq!((ino, left), (257, 1));
    want -= 2;
    assert_eq!(dir_size(&mut st, ROOT), want);
    assert!(names::lookup_name(&mut st, FS, ROOT, b"a")
        .unwrap()
        .is_none());
    assert!(names::lookup_name(&mut st, FS, ROOT, b"second")
        .unwrap()
        .is_some());
    // remove_name of a name that is not there changes nothing.
    let t = st.transid();
    assert!(!names::remove_name(&mut st, FS, ROOT, inode_key(257), b"nothere", 999, t).unwrap());
    assert_eq!(dir_size(&mut st, ROOT), want);
    st.commit().unwrap();
    assert_clean(dyn_dev(&dev), "a name unlinked");
    assert_eq!(names::links_of(&mut st, FS, 257).unwrap().len(), 1);
    assert_eq!(names::list_dir(&mut st, FS, ROOT).unwrap().len(), 4);
}

/// Two names with the same name hash share one DIR_ITEM; each can be
/// found, and removing one leaves the other.
#[test]
fn hash_colliding_names_share_a_dir_item() {
    let mut seen: HashMap<u64, String> = HashMap::new();
    let mut pair = None;
    for i in 0..2_000_000u64 {
        // Names differing in many bytes (crc32c never maps names of one length
        // differing in four bytes or fewer to one value).
        let n = format!("c{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if let Some(o) = seen.insert(name_hash(n.as_bytes()), n.clone()) {
            pair = Some((o, n));
            break;
        }
    }
    let (a, b) = pair.expect("two names with one crc32c hash");
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut fs = mount(dyn_dev(&dev), &[]).unwrap();
    let root = fs.root();
    let la = fs.create(root, a.as_bytes(), 0o644).unwrap();
    let lb = fs.create(root, b.as_bytes(), 0o644).unwrap();
    fs.write(la, 0, b"first").unwrap();
    fs.write(lb, 0, b"second").unwrap();
    let key = Key::new(ROOT, BTRFS_DIR_ITEM_KEY, name_hash(a.as_bytes()));
    let item = fs.store.lookup(FS, &key).unwrap().unwrap();
    assert_eq!(
        btrkit_core::format::dir::parse_dir_items(&item)
            .unwrap()
            .len(),
        2,
        "one DIR_ITEM holds both names"
    );
    fs.sync().unwrap();
    assert_clean(dyn_dev(&dev), "colliding names");
    assert_eq!(fs.lookup(root, a.as_bytes()).unwrap(), Some(la));
    assert_eq!(fs.lookup(root, b.as_bytes()).unwrap(), Some(lb));
    fs.unlink(root, a.as_bytes()).unwrap();
    assert_eq!(fs.lookup(root, a.as_bytes()).unwrap(), None);
    assert_eq!(fs.lookup(root, b.as_bytes()).unwrap(), Some(lb));
    fs.rename(root, b.as_bytes(), root, a.as_bytes()).unwrap();
    assert_eq!(fs.lookup(root, a.as_bytes()).unwrap(), Some(lb));
    assert_eq!(fs.lookup(root, b.as_bytes()).unwrap(), None);
    fs.sync().unwrap();
    assert_clean(dyn_dev(&dev), "one colliding name removed");
    assert_eq!(fs.read(lb, 0, 100).unwrap(), b"second");
}

/// Hard links with long names to one inode from one directory: the
/// INODE_REF item fills (it must stay within a leaf) and further names go
/// to INODE_EXTREF items; unlinking from either keeps everything
/// consistent, and all names survive a remount.
#[test]
fn inode_refs_spill_into_extrefs() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    let root = fs.root();
    let dir = fs.mkdir(root, b"d", 0o755).unwrap();
    let f = fs.create(root, b"f", 0o644).unwrap();
    fs.write(f, 0, b"linked").unwrap();
    let name = |i: usize| format!("{i:03}{}", "n".repeat(252));
    let links = 30;
    for i in 0..links {
        fs.link(f, dir, name(i).as_bytes())
            .unwrap_or_else(|e| panic!("link {i}: {e}"));
    }
    let ino = f.ino;
    let r = fs
        .store
        .lookup(FS, &Key::new(ino, BTRFS_INODE_REF_KEY, dir.ino))
        .unwrap()
        .expect("an INODE_REF for d");
    assert!(
        r.len() <= 4096 - 101 - 25,
        "INODE_REF item of {} bytes does not fit a leaf",
        r.len()
    );
    let extrefs = fs
        .store
        .items_in(
            FS,
            Key::new(ino, BTRFS_INODE_EXTREF_KEY, 0),
            Key::new(ino, BTRFS_INODE_EXTREF_KEY, u64::MAX),
        )
        .unwrap();
    assert!(
        !extrefs.is_empty(),
        "names past a full INODE_REF go to extrefs"
    );
    for (k, d) in &extrefs {
        for e in btrkit_core::format::inode::parse_inode_extrefs(d).unwrap() {
            assert_eq!(e.parent, dir.ino);
            assert_eq!(
                k.offset,
                extref_hash(dir.ino, e.name),
                "extref keyed by the hash of its parent and name"
            );
        }
    }
    assert_eq!(
        names::count_links(&mut fs.store, FS, ino).unwrap(),
        links as u32 + 1
    );
    assert_eq!(fs.stat(f).unwrap().nlink, links as u32 + 1);
    fs.sync().unwrap();
    assert_clean(d.clone(), "links in refs and extrefs");
    // Unlink some in the ref, some in extrefs.
    for i in [0, 5, links - 1, links - 3] {
        fs.unlink(dir, name(i).as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    assert_clean(d.clone(), "after unlinks");
    assert_eq!(fs.stat(f).unwrap().nlink, links as u32 - 3);
    // A name moved between directories keeps the inode's refs right.
    fs.rename(dir, name(7).as_bytes(), root, b"moved").unwrap();
    fs.sync().unwrap();
    assert_clean(d.clone(), "after a rename");
    drop(fs);
    let m = seen_on_disk(d.clone());
    let names_of_f: Vec<&String> = m
        .entries
        .iter()
        .filter(|(_, e)| e.ino == ino)
        .map(|(p, _)| p)
        .collect();
    assert_eq!(names_of_f.len(), links - 3);
    assert!(m
        .entries
        .get("/moved")
        .is_some_and(|e| e.nlink == links as u64 - 3));
}

/// Without extended refs, a link that would outgrow the INODE_REF item is
/// refused with EMLINK (as the kernel's btrfs_insert_inode_ref does), and
/// the refused link leaves nothing behind: the back reference goes in
/// before the directory entries.
#[test]
fn full_inode_ref_without_extref() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096", "-O", "^extref"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644).unwrap();
    let mut refused = None;
    for i in 0..30 {
        let n = format!("{i:03}{}", "n".repeat(252));
        if let Err(e) = fs.link(f, root, n.as_bytes()) {
            refused = Some((n, e));
            break;
        }
    }
    let (n, e) = refused.expect("a full INODE_REF refuses more names");
    assert_eq!(e.as_errno(), libc::EMLINK, "{e}");
    assert_eq!(
        fs.lookup(root, n.as_bytes()).unwrap(),
        None,
        "the refused name must not exist"
    );
    fs.sync().unwrap();
    assert_clean(d, "after a refused link");
}

// ---------------------------------------------------------------------------
// fs::extents::drop_extents

/// Dropping the middle of an extent splits its item in two: both pieces
/// point at the extent with the right offsets, and the extent counts two
/// references from the same back reference; nbytes loses the middle.
#[test]
fn drop_extents_splits_and_counts_refs() {
    for args in [
        &["-n", "4096"][..],
        &["-n", "16384", "-O", "^no-holes,^skinny-metadata"][..],
    ] {
        let dev = new_image(IMAGE_SIZE, args);
        let mut st = store(&dev);
        new_file(&mut st, 257, "f");
        let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
        let nb = data::write_extent(&mut st, FS, 257, 0, &data, true).unwrap();
        set_size(&mut st, 257, 65536, nb);
        st.commit().unwrap();
        let bytenr = file_extents(&mut st, 257)[0].1;
        assert_eq!(extent_refs(&mut st, bytenr).unwrap().0, 1);

        let dropped = drop_extents(&mut st, FS, 257, 16384, 32768).unwrap();
        assert!(dropped.changed);
        assert_eq!(dropped.nbytes, 16384);
        assert_eq!(
            file_extents(&mut st, 257),
            vec![(0, bytenr, 0, 16384), (32768, bytenr, 32768, 32768)]
        );
        if !args.contains(&"^no-holes,^skinny-metadata") {
            set_size(&mut st, 257, 65536, nb - 16384);
        } else {
            // Without no-holes the gap needs a hole item.
            let t = st.transid();
            btrkit_core::fs::extents::fill_hole(&mut st, FS, 257, 16384, 32768, t).unwrap();
            set_size(&mut st, 257, 65536, nb - 16384);
        }
        st.commit().unwrap();
        let (refs, inline) = extent_refs(&mut st, bytenr).unwrap();
        assert_eq!(refs, 2, "two items reference the extent: {inline:?}");
        assert_eq!(
            inline.len(),
            1,
            "one back reference with count 2: {inline:?}"
        );
        drop(st);
        assert_clean(dyn_dev(&dev), &format!("split extent {args:?}"));

        // Dropping the rest removes the extent and its checksums.
        let mut st = store(&dev);
        let dropped = drop_extents(&mut st, FS, 257, 0, u64::MAX).unwrap();
        assert_eq!(dropped.nbytes, 16384 + 32768);
        let hole_items: Vec<(u64, u64, u64, u64)> = file_extents(&mut st, 257);
        assert!(
            hole_items.iter().all(|e| e.1 == 0),
            "only holes may be left: {hole_items:?}"
        );
        st.delete_item(FS, &extent_key(257, 16384)).unwrap();
        set_size(&mut st, 257, 0, 0);
        st.commit().unwrap();
        assert!(
            extent_refs(&mut st, bytenr).is_none(),
            "the extent item goes with its last reference"
        );
        assert!(
            st.csums()
                .csum_lookup(bytenr, 65536)
                .unwrap()
                .iter()
                .all(|c| c.is_none()),
            "its checksums go too"
        );
        drop(st);
        assert_clean(dyn_dev(&dev), &format!("extent dropped {args:?}"));
    }
}

/// An uncompressed inline extent keeps its bytes before the cut; a
/// compressed one is never cut; dropping from its start removes it.
#[test]
fn drop_extents_on_inline_extents() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut st = store(&dev);
    new_file(&mut st, 257, "plain");
    let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    data::write_inline(&mut st, FS, 257, 1000, BTRFS_COMPRESS_NONE, &bytes).unwrap();
    set_size(&mut st, 257, 1000, 1000);
    new_file(&mut st, 258, "zstd");
    let text = vec![b'z'; 3000];
    let packed = btrkit_core::fs::compress::compress(
        btrkit_core::fs::compress::Method::parse("zstd").unwrap(),
        &text,
        4096,
    )
    .expect("compressible");
    data::write_inline(&mut st, FS, 258, 3000, BTRFS_COMPRESS_ZSTD, &packed).unwrap();
    set_size(&mut st, 258, 3000, 3000);
    st.commit().unwrap();
    drop(st);
    assert_clean(dyn_dev(&dev), "inline extents");

    let mut st = store(&dev);
    let d = drop_extents(&mut st, FS, 257, 600, u64::MAX).unwrap();
    assert!(d.changed);
    assert_eq!(d.nbytes, 400);
    assert_eq!(file_extents(&mut st, 257), vec![(0, 0, 0, 600)]);
    set_size(&mut st, 257, 600, 600);
    let d = drop_extents(&mut st, FS, 258, 1000, u64::MAX).unwrap();
    assert!(!d.changed, "a compressed inline extent is never cut");
    assert_eq!(d.nbytes, 0);
    assert_eq!(file_extents(&mut st, 258), vec![(0, 0, 0, 3000)]);
    st.commit().unwrap();
    let r = btrkit_core::fs::read::read_range(&mut st, FS, 257, 600, 0, 600, true).unwrap();
    assert_eq!(r, bytes[..600]);
    drop(st);
    assert_clean(dyn_dev(&dev), "inline extent cut");

    let mut st = store(&dev);
    let d = drop_extents(&mut st, FS, 258, 0, 4096).unwrap();
    assert_eq!((d.changed, d.nbytes), (true, 3000));
    assert!(file_extents(&mut st, 258).is_empty());
    set_size(&mut st, 258, 0, 0);
    st.commit().unwrap();
    drop(st);
    assert_clean(dyn_dev(&dev), "inline extent dropped");
}

/// A split of a preallocated extent and of a hole item (no no-holes):
/// the pieces keep their type and the offsets add up.
#[test]
fn drop_extents_splits_prealloc_and_holes() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096", "-O", "^no-holes"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644).unwrap();
    fs.ranges().fallocate(f, 0, 1 << 20, false).unwrap();
    fs.truncate(f, 3 << 20).unwrap();
    fs.sync().unwrap();
    assert_clean(d.clone(), "prealloc and hole");
    let before = file_extents(&mut fs.store, f.ino);
    assert!(
        before.iter().any(|e| e.1 == 0),
        "a hole item past the prealloc: {before:?}"
    );
    let r = drop_extents(&mut fs.store, FS, f.ino, 4096, 8192).unwrap();
    assert_eq!(r.nbytes, 4096);
    let r = drop_extents(&mut fs.store, FS, f.ino, (2 << 20) + 4096, (2 << 20) + 8192).unwrap();
    assert_eq!(r.nbytes, 0, "holes hold no bytes");
    let after = file_extents(&mut fs.store, f.ino);
    let pre = before[0].1;
    assert_eq!(after[0], (0, pre, 0, 4096));
    assert_eq!(after[1], (8192, pre, 8192, (1 << 20) - 8192));
    let holes: Vec<_> = after.iter().filter(|e| e.1 == 0).collect();
    assert_eq!(holes.len(), 2);
    assert_eq!(holes[0].0 + holes[0].3, (2 << 20) + 4096);
    assert_eq!(holes[1].0, (2 << 20) + 8192);
    assert_eq!(holes[1].0 + holes[1].3, 3 << 20);
    // Fill the gaps back the way the kernel leaves them and check.
    let t = fs.store.transid();
    btrkit_core::fs::extents::fill_hole(&mut fs.store, FS, f.ino, 4096, 8192, t).unwrap();
    btrkit_core::fs::extents::fill_hole(
        &mut fs.store,
        FS,
        f.ino,
        (2 << 20) + 4096,
        (2 << 20) + 8192,
        t,
    )
    .unwrap();
    let mut it = get_inode(&mut fs.store, FS, f.ino).unwrap().unwrap();
    it.nbytes.set(it.nbytes.get() - 4096);
    put_inode(&mut fs.store, FS, f.ino, &it).unwrap();
    fs.store.commit().unwrap();
    drop(fs);
    assert_clean(d, "split prealloc and hole");
}

// ---------------------------------------------------------------------------
// trans: delayed refs

/// An extent's only reference dropped and taken again in one transaction
/// (by the same item, and moved to another inode): the extent is never
/// freed on the way, so it keeps its checksums.
#[test]
fn drop_and_readd_of_a_reference_keeps_checksums() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut st = store(&dev);
    new_file(&mut st, 257, "f");
    new_file(&mut st, 258, "g");
    let data: Vec<u8> = (0..32768u32).map(|i| (i % 253) as u8).collect();
    let nb = data::write_extent(&mut st, FS, 257, 0, &data, true).unwrap();
    set_size(&mut st, 257, 32768, nb);
    st.commit().unwrap();
    let bytenr = file_extents(&mut st, 257)[0].1;
    let sums = st.csums().csum_lookup(bytenr, 32768).unwrap();
    assert!(sums.iter().all(|c| c.is_some()));

    // Same item out and back in.
    let item = st.lookup(FS, &extent_key(257, 0)).unwrap().unwrap();
    let fe = match parse_file_extent(&item).unwrap() {
        FileExtent::Disk { item, .. } => *item,
        _ => unreachable!(),
    };
    drop_extents(&mut st, FS, 257, 0, 32768).unwrap();
    insert_disk_extent(&mut st, FS, 257, 0, &fe).unwrap();
    st.commit().unwrap();
    assert_eq!(extent_refs(&mut st, bytenr).map(|r| r.0), Some(1));
    assert_eq!(
        st.csums().csum_lookup(bytenr, 32768).unwrap(),
        sums,
        "checksums kept"
    );
    drop(st);
    assert_clean(dyn_dev(&dev), "reference dropped and re-added");

    // Moved to another inode in one transaction.
    let mut st = store(&dev);
    drop_extents(&mut st, FS, 257, 0, 32768).unwrap();
    set_size(&mut st, 257, 0, 0);
    insert_disk_extent(&mut st, FS, 258, 0, &fe).unwrap();
    set_size(&mut st, 258, 32768, 32768);
    st.commit().unwrap();
    let (refs, r) = extent_refs(&mut st, bytenr).unwrap();
    assert_eq!(refs, 1);
    assert!(r[0].contains("objectid: 258"), "{r:?}");
    assert_eq!(
        st.csums().csum_lookup(bytenr, 32768).unwrap(),
        sums,
        "checksums kept"
    );
    let back = btrkit_core::fs::read::read_range(&mut st, FS, 258, 32768, 0, 32768, true).unwrap();
    assert_eq!(back, data);
    drop(st);
    assert_clean(dyn_dev(&dev), "reference moved");
}

/// The same through the filesystem: a clone onto itself (the destination's
/// reference to the extent is dropped and re-added in one transaction),
/// then the source unlinked, in one transaction.
#[test]
fn clone_over_itself_then_unlink_the_source() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    let mut r = btrkit_core::workload::engine::EngineRunner::new();
    for st in steps("write /a 0 65536 random:4\nsync\nclone /a 0 /b 0 0\nclone /a 0 /b 0 0\nclone /b 0 /a 0 0\nunlink /a\nsync\n") {
        apply(&mut fs, &mut r, &d, &[], &st).unwrap_or_else(|e| panic!("{st:?}: {e}"));
    }
    assert_clean(d.clone(), "clones and unlink");
    let b = fs.resolve("/b", true).unwrap();
    assert_eq!(
        fs.read(b, 0, 65536).unwrap(),
        btrkit_core::workload::content::fill_bytes(&btrkit_core::workload::Fill::Random(4), 65536)
    );
}

// ---------------------------------------------------------------------------
// trans: B-tree edits

/// Xattrs on one inode, sorted by name hash, then one of 3000 bytes whose
/// hash falls in the middle: the leaf has more than the free space on
/// each side of it, so it only fits in a leaf of its own.
#[test]
fn big_item_in_the_middle_of_a_leaf() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut st = store(&dev);
    let mut names: Vec<(u64, String)> = (0..8)
        .map(|i| format!("user.small{i}"))
        .map(|n| (name_hash(n.as_bytes()), n))
        .collect();
    names.sort();
    let (lo, hi) = (names[3].0, names[4].0);
    let big = (0..100_000)
        .map(|i| format!("user.big{i}"))
        .find(|n| (lo..hi).contains(&name_hash(n.as_bytes())))
        .expect("a name hashing between");
    let t = st.transid();
    for (_, n) in &names {
        xattr::set_xattr(&mut st, FS, ROOT, n.as_bytes(), &[b's'; 330], t).unwrap();
    }
    xattr::set_xattr(&mut st, FS, ROOT, big.as_bytes(), &[b'b'; 3000], t)
        .unwrap_or_else(|e| panic!("the big xattr: {e}"));
    st.commit().unwrap();
    assert_eq!(
        xattr::get_xattr(&mut st, FS, ROOT, big.as_bytes())
            .unwrap()
            .map(|v| v.len()),
        Some(3000)
    );
    drop(st);
    assert_clean(dyn_dev(&dev), "big item");
}

// ---------------------------------------------------------------------------
// fs: data space

/// A file larger than any block group's free space on a small filesystem
/// with room for it: no group, nor a new chunk (capped at a tenth of the
/// filesystem), has the whole dirty run in one piece, so writeback takes
/// smaller extents (btrfs_reserve_extent halves the request after ENOSPC)
/// instead of failing the sync.
#[test]
fn large_file_on_a_small_filesystem() {
    let dev = new_image(IMAGE_SIZE, &["-n", "16384"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    run(&mut fs, &d, &[], "write /a 0 80M random:1\nsync\n");
    assert_clean(d.clone(), "an 80 MiB file");
    let a = fs.resolve("/a", true).unwrap();
    assert_eq!(
        fs.read(a, 79 << 20, 1 << 20).unwrap(),
        btrkit_core::workload::content::fill_bytes(
            &btrkit_core::workload::Fill::Random(1),
            80 << 20
        )[79 << 20..]
    );
}

/// Buffered writes past the free data space: data space is reserved at
/// write time, as the kernel does, so write(2) fails with ENOSPC and a
/// later sync succeeds with everything the writes were told they wrote.
#[test]
fn buffered_writes_past_free_space_fail_at_write() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    let mut script = String::new();
    for i in 0..14 {
        script += &format!("write /f{i} 0 20M random:{i} enospc-ok\n");
    }
    run(&mut fs, &d, &[], &script);
    fs.sync()
        .unwrap_or_else(|e| panic!("sync after writes that were accepted: {e}"));
    let live = seen(&mut fs);
    drop(fs);
    assert_clean(d.clone(), "a full filesystem");
    assert_eq!(
        seen_on_disk(d).diff(&live),
        Vec::<String>::new(),
        "what the writes were told was written is what is on disk"
    );
}

/// Checksum lookups over ranges that start and end inside items, span
/// several items (4 KiB nodes keep them short) and cross holes agree with
/// a sector-by-sector model.
#[test]
fn csum_lookup_matches_a_sector_model() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut st = store(&dev);
    let ss = st.sectorsize() as u64;
    let cs = st.image().csum.size();
    let base = 1u64 << 30;
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    // Runs of sums with gaps between them; the longest needs many items.
    for (first, count) in [(0u64, 3u64), (5, 1), (7, 900), (910, 40), (2000, 2)] {
        let mut sums = Vec::new();
        for s in first..first + count {
            let c: Vec<u8> = (0..cs).map(|b| (s as usize * 7 + b) as u8).collect();
            sums.extend_from_slice(&c);
            model.insert(s, c);
        }
        st.csums().csum_insert(base + first * ss, &sums).unwrap();
    }
    // A hole punched in the middle of the long run.
    st.csums().csum_delete(base + 300 * ss, 20 * ss).unwrap();
    for s in 300..320 {
        model.remove(&s);
    }
    for (from, n) in [
        (0u64, 1u64),
        (1, 2),
        (2, 6),
        (4, 10),
        (8, 3),
        (290, 40),
        (0, 2010),
        (905, 10),
        (1999, 5),
        (3000, 4),
    ] {
        let got = st.csums().csum_lookup(base + from * ss, n * ss).unwrap();
        assert_eq!(got.len() as u64, n);
        for i in 0..n {
            assert_eq!(
                got.get(i as usize),
                model.get(&(from + i)).map(|v| v.as_slice()),
                "sector {} of lookup at {from}+{n}",
                from + i
            );
        }
        let present = (from..from + n).filter(|s| model.contains_key(s)).count() as u64;
        assert_eq!(got.any_present(), present > 0);
        assert_eq!(got.any_missing(), present < n);
    }
}

/// The item cache (inode and dir items by key) stays what a search from
/// the root finds, through inserts, resizing updates, in-place changes,
/// deletes, leaf splits and merges, and commits.
#[test]
fn item_cache_matches_the_tree() {
    let dev = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let mut st = store(&dev);
    let t = TreeId::Tree(FS);
    let keys: Vec<Key> = (0..400u64)
        .flat_map(|i| {
            [
                Key::new(1000 + i, BTRFS_INODE_ITEM_KEY, 0),
                Key::new(1000 + i / 4, BTRFS_DIR_ITEM_KEY, i * 7919),
                // Not cached, but shares the leaves.
                Key::new(1000 + i, BTRFS_XATTR_ITEM_KEY, i),
            ]
        })
        .collect();
    let searched = |st: &mut Store, k: &Key| -> Option<Vec<u8>> {
        match st.next_item(t, k).unwrap() {
            Some((found, d)) if found == *k => Some(d),
            _ => None,
        }
    };
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for step in 0..6000u64 {
        let k = keys[rnd(keys.len() as u64) as usize];
        let len = 20 + rnd(300) as usize;
        let fill = (step % 251) as u8;
        match rnd(5) {
            0 => {
                if searched(&mut st, &k).is_none() {
                    st.insert_item(t, &k, &vec![fill; len]).unwrap();
                }
            }
            1 => st.update_item(t, &k, &vec![fill; len]).unwrap(),
            2 => {
                st.delete_item(t, &k).unwrap();
            }
            3 => {
                st.modify_item(t, &k, |d| d.fill(fill)).unwrap();
            }
            _ => {
                // A read first, so the next change meets a cached entry.
                st.lookup(t, &k).unwrap();
            }
        }
        if step % 1500 == 1499 {
            st.commit().unwrap();
        }
        for _ in 0..3 {
            let q = keys[rnd(keys.len() as u64) as usize];
            assert_eq!(
                st.lookup(t, &q).unwrap(),
                searched(&mut st, &q),
                "step {step}"
            );
        }
    }
    for k in &keys {
        assert_eq!(st.lookup(t, k).unwrap(), searched(&mut st, k));
        assert_eq!(
            st.with_item(t, k, |d| d.len()).unwrap(),
            searched(&mut st, k).map(|d| d.len())
        );
    }
}

/// fallocate of a range larger than any data block group (a tenth of the
/// filesystem) and than the longest free piece: preallocated in pieces
/// (__btrfs_prealloc_file_range takes what btrfs_reserve_extent finds,
/// down to a sector) while new data chunks are made, with and without
/// keep-size, also over free space cut into 1 MiB pieces; a range larger
/// than all the free space fails with ENOSPC before anything of it is
/// preallocated.
#[test]
fn fallocate_larger_than_a_block_group() {
    for keep in [false, true] {
        let dev = new_image(512 * MIB, &["-n", "16384"]);
        let d = dyn_dev(&dev);
        let mut fs = mount(d.clone(), &[]).unwrap();
        let k = if keep { " keep" } else { "" };
        run(
            &mut fs,
            &d,
            &[],
            &format!("write /f 0 4M 1\nfsync /f\nfallocate /f 4202496 104857600{k}\nfsync /f\n"),
        );
        let f = fs.resolve("/f", true).unwrap();
        let want = if keep { 4 << 20 } else { 4202496 + 104857600 };
        assert_eq!(fs.stat(f).unwrap().size, want, "keep {keep}");
        drop(fs);
        assert_clean(d, "a 100 MiB fallocate");
    }

    // Fragmented: 1 MiB files, every other one deleted.
    let dev = new_image(256 * MIB, &["-n", "4096"]);
    let d = dyn_dev(&dev);
    let mut fs = mount(d.clone(), &[]).unwrap();
    let mut s = String::new();
    for i in 0..120 {
        s += &format!("write /g{i} 0 1M {}\n", 1 + i % 200);
    }
    s += "sync\n";
    for i in (0..120).step_by(2) {
        s += &format!("unlink /g{i}\n");
    }
    s += "sync\nfallocate /f 0 80M\nfsync /f\n";
    run(&mut fs, &d, &[], &s);
    let f = fs.resolve("/f", true).unwrap();
    assert_eq!(fs.stat(f).unwrap().size, 80 << 20);
    // More than is free: ENOSPC, and the file is as it was.
    let before = seen(&mut fs);
    let e = fs
        .ranges()
        .fallocate(f, 80 << 20, 1 << 30, false)
        .unwrap_err();
    assert_eq!(e.as_errno(), libc::ENOSPC, "{e}");
    assert_eq!(seen(&mut fs).diff(&before), Vec::<String>::new());
    fs.sync().unwrap();
    drop(fs);
    assert_clean(d, "fallocate over fragmented free space");
}
