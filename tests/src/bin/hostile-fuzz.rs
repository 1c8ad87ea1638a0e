//! hostile-fuzz: a structure-aware fuzzer of btrkit's read paths.
//!
//! Each case takes one of the base images given, picks a random tree
//! (the log trees among them), a random block of it and a random item (or
//! a node's key pointer, or the header), and sets a field (by item type,
//! the fields of the format; else a random offset and width), a name
//! (DIR_ITEM, DIR_INDEX, XATTR_ITEM, INODE_REF, INODE_EXTREF, ROOT_REF),
//! the key, or duplicates or drops the item, to a boundary value (0, 1,
//! the width's maximum, 2^k±1, a value taken from another item, a hostile
//! name); the leaf is relaid and the checksum fixed on every copy. The
//! edit lands in a memory overlay over the base image (never written),
//! and the read paths run in-process on it: `restore::open_virtual` with
//! the log replayed, salvaged and ignored, every file read, every
//! directory listed, xattrs and links, a dry-run restore; the FUSE view
//! (`ReadOnlyView`) walked; the checker (`check_device`); the dump's walk
//! (every tree, every item decoded, the log inspected).
//!
//! Cases run in worker processes (`--jobs`, default 2) under
//! `std::panic::catch_unwind`, with RLIMIT_AS (`--mem-mib`, default 2048)
//! and a per-case watchdog (`--case-timeout`, seconds): a panic is
//! reported by the worker, an abort (e.g. an allocation refused) or a hang
//! kills it, is recorded with the case's seed, and a new worker takes the
//! next case. The run prints the cases run, panics, aborts and hangs with
//! their seeds and the top frames of each panic's backtrace, and exits 1
//! if there were any.
//!
//!   hostile-fuzz --cases 2000 --seed 1 IMAGE...      a run
//!   hostile-fuzz --seed CASESEED --case IMAGE...     replay one case
//!
//! A case's seed picks the image too, so the same images, in the same
//! order, replay it.

#![allow(unsafe_code)]

use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::key::Key;
use btrkit_core::image::{tree_root_of, Image, OpenOptions};
use btrkit_core::io::{BlockDevice, FileDevice, OverlayDevice};
use btrkit_core::restore::{self, LogMode, ReadOptions, RestoreOptions};
use btrkit_core::tree::{walk_tree, TreeRoot, WalkEvent};
use btrkit_core::util::prng::Prng;
use btrkit_tests::hostile::{leaf_items, relay_leaf};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Randomness.

// Core's `Prng`: a case's own draws, and `Prng::derive` for the seed of
// case `i` of a run.

// ---------------------------------------------------------------------------
// Base images.

#[derive(Clone)]
struct Block {
    bytenr: u64,
    level: u8,
    /// Physical offsets of every copy.
    copies: Vec<u64>,
}

struct Base {
    name: String,
    dev: Arc<dyn BlockDevice>,
    csum: CsumType,
    nodesize: usize,
    /// Blocks by tree, in walk order.
    trees: Vec<(String, Vec<Block>)>,
}

fn all_trees(img: &Image) -> Vec<(String, TreeRoot)> {
    let mut v = vec![
        ("root".to_string(), img.root_tree()),
        ("chunk".to_string(), img.chunk_tree()),
    ];
    if let Ok(items) = img.root_items_in(img.root_tree()) {
        v.extend(items.iter().map(|(k, ri)| {
            (
                format!("{}", k.objectid as i64),
                tree_root_of(k.objectid, ri),
            )
        }));
    }
    if let Some(l) = img.log_root_tree() {
        v.push(("log-root".to_string(), l));
        if let Ok(items) = img.root_items_in(l) {
            v.extend(items.iter().map(|(k, ri)| {
                (
                    format!("log-of-{}", k.offset),
                    TreeRoot {
                        id: BTRFS_TREE_LOG_OBJECTID,
                        ..tree_root_of(k.objectid, ri)
                    },
                )
            }));
        }
    }
    v
}

impl Base {
    fn load(path: &std::path::Path) -> Result<Base, String> {
        let dev: Arc<dyn BlockDevice> = Arc::new(
            FileDevice::open(path, false).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        let img = Image::open(dev.clone(), OpenOptions::default())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let ns = img.nodesize as u64;
        let mut trees = Vec::new();
        let mut seen = HashSet::new();
        for (name, root) in all_trees(&img) {
            let mut blocks = Vec::new();
            let _ = walk_tree(&img, root, |ev| {
                if let WalkEvent::Block { node, .. } = ev {
                    if seen.insert(node.bytenr) {
                        if let Ok(copies) = img.chunks.map(node.bytenr, ns, img.devid) {
                            blocks.push(Block {
                                bytenr: node.bytenr,
                                level: node.level(),
                                copies,
                            });
                        }
                    }
                }
                ControlFlow::Continue(())
            });
            if !blocks.is_empty() {
                trees.push((name, blocks));
            }
        }
        Ok(Base {
            name: path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            ),
            dev,
            csum: img.csum,
            nodesize: ns as usize,
            trees,
        })
    }

    fn read(&self, b: &Block) -> Vec<u8> {
        let mut v = vec![0u8; self.nodesize];
        let _ = self.dev.read_at(b.copies[0], &mut v);
        v
    }
}

// ---------------------------------------------------------------------------
// Mutations.

fn le(b: &[u8], off: usize, n: usize) -> u64 {
    let mut v = 0u64;
    for i in (0..n).rev() {
        v = (v << 8) | u64::from(*b.get(off + i).unwrap_or(&0));
    }
    v
}

fn put_le(b: &mut [u8], off: usize, n: usize, v: u64) {
    for i in 0..n {
        if let Some(x) = b.get_mut(off + i) {
            *x = (v >> (8 * i)) as u8;
        }
    }
}

/// (offset, width) of the fields of an item's data, by key type.
fn fields(ty: u8) -> &'static [(usize, usize)] {
    match ty {
        BTRFS_INODE_ITEM_KEY => &[
            (0, 8),
            (8, 8),
            (16, 8),
            (24, 8),
            (32, 8),
            (40, 4),
            (44, 4),
            (48, 4),
            (52, 4),
            (56, 8),
            (64, 8),
            (72, 8),
            (112, 8),
            (120, 4),
            (124, 8),
            (136, 8),
            (144, 4),
            (148, 8),
        ],
        BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => {
            &[(0, 8), (8, 1), (9, 8), (17, 8), (25, 2), (27, 2), (29, 1)]
        }
        BTRFS_INODE_REF_KEY => &[(0, 8), (8, 2)],
        BTRFS_INODE_EXTREF_KEY => &[(0, 8), (8, 8), (16, 2)],
        BTRFS_EXTENT_DATA_KEY => &[
            (0, 8),
            (8, 8),
            (16, 1),
            (17, 1),
            (18, 2),
            (20, 1),
            (21, 8),
            (29, 8),
            (37, 8),
            (45, 8),
        ],
        BTRFS_ROOT_ITEM_KEY => &[
            (160, 8),
            (168, 8),
            (176, 8),
            (184, 8),
            (192, 8),
            (200, 8),
            (208, 8),
            (216, 4),
            (237, 1),
            (238, 1),
        ],
        BTRFS_ROOT_REF_KEY | BTRFS_ROOT_BACKREF_KEY => &[(0, 8), (8, 8), (16, 2)],
        BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY => {
            &[(0, 8), (8, 8), (16, 8), (24, 1), (25, 8), (33, 8)]
        }
        BTRFS_BLOCK_GROUP_ITEM_KEY => &[(0, 8), (8, 8), (16, 8)],
        BTRFS_CHUNK_ITEM_KEY => &[
            (0, 8),
            (8, 8),
            (16, 8),
            (24, 8),
            (32, 4),
            (36, 4),
            (40, 4),
            (44, 2),
            (46, 2),
            (48, 8),
            (56, 8),
        ],
        BTRFS_DEV_EXTENT_KEY => &[(0, 8), (8, 8), (16, 8), (24, 8)],
        BTRFS_DIR_LOG_ITEM_KEY | BTRFS_DIR_LOG_INDEX_KEY => &[(0, 8)],
        BTRFS_FREE_SPACE_INFO_KEY => &[(0, 4), (4, 4)],
        _ => &[],
    }
}

/// (name_len offset, name offset) of a named item's first entry.
fn name_at(ty: u8) -> Option<(usize, usize)> {
    match ty {
        BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => Some((27, 30)),
        BTRFS_INODE_REF_KEY => Some((8, 10)),
        BTRFS_INODE_EXTREF_KEY => Some((16, 18)),
        BTRFS_ROOT_REF_KEY | BTRFS_ROOT_BACKREF_KEY => Some((16, 18)),
        _ => None,
    }
}

fn boundary(r: &mut Prng, width: usize, other: u64) -> u64 {
    let bits = (width * 8) as u32;
    let max = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let k = r.below(u64::from(bits)) as u32;
    let v = match r.below(9) {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max >> 1,
        4 => (1u64 << k).wrapping_add(1),
        5 => (1u64 << k).wrapping_sub(1),
        6 => 1u64 << k,
        7 => other,
        _ => r.next_u64(),
    };
    v & max
}

fn hostile_name(r: &mut Prng, other: &[u8]) -> Vec<u8> {
    match r.below(13) {
        0 => Vec::new(),
        1 => b".".to_vec(),
        2 => b"..".to_vec(),
        3 => b"../../x".to_vec(),
        4 => b"a/b".to_vec(),
        5 => b"a\0b".to_vec(),
        6 => vec![b'n'; 255],
        7 => vec![b'l'; 256 + r.below(2000) as usize],
        8 => vec![0xff, 0xfe],
        9 => other.to_vec(),
        10 => b"/".to_vec(),
        11 => (0..1 + r.below(40)).map(|_| r.next_u64() as u8).collect(),
        _ => {
            let mut v = other.to_vec();
            v.push(b'X');
            v
        }
    }
}

/// A value from some other item of the base (8 bytes at a random offset).
fn other_value(r: &mut Prng, base: &Base) -> (u64, Vec<u8>, Key) {
    let Some((_, blocks)) = r.pick(&base.trees) else {
        return (0, Vec::new(), Key::MIN);
    };
    let leaves: Vec<&Block> = blocks.iter().filter(|b| b.level == 0).collect();
    let Some(b) = r.pick(&leaves) else {
        return (0, Vec::new(), Key::MIN);
    };
    let items = leaf_items(&base.read(b));
    let Some((k, d)) = r.pick(&items) else {
        return (0, Vec::new(), Key::MIN);
    };
    let off = r.below(d.len().saturating_sub(7).max(1) as u64) as usize;
    let name = name_at(k.ty)
        .and_then(|(lo, no)| {
            let n = le(d, lo, 2) as usize;
            d.get(no..no + n).map(<[u8]>::to_vec)
        })
        .unwrap_or_default();
    (le(d, off, 8), name, *k)
}

/// One case's edit: the block changed (all copies) and what was done.
struct Mutation {
    base: usize,
    block: Block,
    bytes: Vec<u8>,
    what: String,
}

fn mutate(seed: u64, bases: &[Base]) -> Option<Mutation> {
    let mut r = Prng::new(seed);
    let bi = r.below(bases.len() as u64) as usize;
    let base = &bases[bi];
    // Half the cases in a subvolume tree or a log tree (where names,
    // inodes and extents are), the others in any tree.
    let fsish: Vec<&(String, Vec<Block>)> = base
        .trees
        .iter()
        .filter(|(n, _)| {
            n == "5" || n.starts_with("log") || n.parse::<i64>().is_ok_and(|id| id >= 256)
        })
        .collect();
    let (tree, blocks) = if !fsish.is_empty() && r.chance(50, 100) {
        *r.pick(&fsish)?
    } else {
        r.pick(&base.trees)?
    };
    let leaves: Vec<&Block> = blocks.iter().filter(|b| b.level == 0).collect();
    let nodes: Vec<&Block> = blocks.iter().filter(|b| b.level > 0).collect();
    let node_case = !nodes.is_empty() && r.chance(10, 100);
    let block = if node_case {
        *r.pick(&nodes)?
    } else {
        *r.pick(&leaves)?
    }
    .clone();
    let mut b = base.read(&block);
    let (ov, oname, okey) = other_value(&mut r, base);
    let mut what = format!("{} tree {tree} block {} ", base.name, block.bytenr);
    let ns = base.nodesize;
    if node_case || r.chance(3, 100) {
        // Header or key pointer fields.
        let n = le(&b, 96, 4) as usize;
        let choice = r.below(4);
        if choice == 0 || n == 0 {
            let (off, w, name) = *r.pick(&[
                (96usize, 4usize, "nritems"),
                (100, 1, "level"),
                (80, 8, "generation"),
                (88, 8, "owner"),
                (48, 8, "bytenr"),
            ])?;
            let v = boundary(&mut r, w, ov);
            put_le(&mut b, off, w, v);
            what += &format!("header {name} = {v:#x}");
        } else if block.level > 0 {
            let slot = r.below(n.min((ns - HEADER_SIZE) / KEY_PTR_SIZE) as u64) as usize;
            let base_off = HEADER_SIZE + slot * KEY_PTR_SIZE;
            let (off, w, name) = *r.pick(&[
                (0usize, 8usize, "key.objectid"),
                (8, 1, "key.type"),
                (9, 8, "key.offset"),
                (17, 8, "blockptr"),
                (25, 8, "generation"),
            ])?;
            let v = boundary(&mut r, w, ov);
            put_le(&mut b, base_off + off, w, v);
            what += &format!("ptr {slot} {name} = {v:#x}");
        } else {
            let slot = r.below(n.min((ns - HEADER_SIZE) / ITEM_SIZE) as u64) as usize;
            let base_off = HEADER_SIZE + slot * ITEM_SIZE;
            let (off, w, name) = *r.pick(&[(17usize, 4usize, "offset"), (21, 4, "size")])?;
            let v = boundary(&mut r, w, ov);
            put_le(&mut b, base_off + off, w, v);
            what += &format!("item header {slot} {name} = {v:#x}");
        }
    } else {
        let mut items = leaf_items(&b);
        if items.is_empty() {
            return None;
        }
        let slot = r.below(items.len() as u64) as usize;
        let (key, data) = items[slot].clone();
        what += &format!(
            "slot {slot} key ({} {} {}) ",
            key.objectid as i64, key.ty, key.offset
        );
        let kind = r.below(100);
        if kind < 45 {
            // A field.
            let known = fields(key.ty);
            let (off, w) = if !known.is_empty() && r.chance(80, 100) {
                *r.pick(known)?
            } else {
                let w = *r.pick(&[1usize, 2, 4, 8])?;
                (
                    r.below(data.len().saturating_sub(w - 1).max(1) as u64) as usize,
                    w,
                )
            };
            let v = boundary(&mut r, w, ov);
            let mut d = data;
            put_le(&mut d, off, w, v);
            items[slot].1 = d;
            what += &format!("field @{off} w{w} = {v:#x}");
        } else if kind < 65 && name_at(key.ty).is_some() {
            let (lo, no) = name_at(key.ty)?;
            let old = le(&data, lo, 2) as usize;
            if no + old > data.len() {
                return None;
            }
            let name = hostile_name(&mut r, &oname);
            let mut d = data[..no].to_vec();
            put_le(&mut d, lo, 2, name.len() as u64);
            d.extend_from_slice(&name);
            d.extend_from_slice(&data[no + old..]);
            items[slot].1 = d;
            what += &format!("name = {:?}", name.escape_ascii().to_string());
        } else if kind < 80 {
            let mut k = key;
            match r.below(4) {
                0 => k.objectid = boundary(&mut r, 8, okey.objectid),
                1 => k.ty = boundary(&mut r, 1, u64::from(okey.ty)) as u8,
                2 => k.offset = boundary(&mut r, 8, okey.offset),
                _ => k = okey,
            }
            items[slot].0 = k;
            let sorted = r.chance(50, 100);
            if sorted {
                items.sort_by_key(|a| a.0);
            }
            what += &format!(
                "key = ({} {} {}){}",
                k.objectid as i64,
                k.ty,
                k.offset,
                if sorted { " sorted" } else { " in place" }
            );
        } else if kind < 90 {
            let dup = items[slot].clone();
            items.insert(slot + 1, dup);
            what += "duplicated";
        } else if kind < 95 {
            items.remove(slot);
            what += "dropped";
        } else {
            // Data cut or grown.
            let mut d = data;
            let n = r.below(d.len() as u64 + 64) as usize;
            d.resize(n, 0);
            items[slot].1 = d;
            what += &format!("data resized to {n}");
        }
        if relay_leaf(&mut b, &items).is_err() {
            return None;
        }
    }
    let fix = !r.chance(5, 100);
    if fix {
        let c = block_csum(base.csum, &b);
        b[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
    } else {
        what += " (checksum left wrong)";
    }
    Some(Mutation {
        base: bi,
        block,
        bytes: b,
        what,
    })
}

// ---------------------------------------------------------------------------
// The read paths.

const MAX_ENTRIES: usize = 3000;
const MAX_READ: u64 = 4 << 20;

fn fs_walk(fs: &mut btrkit_core::fs::Filesystem) -> usize {
    let mut stack = vec![(fs.root(), 0u32)];
    let mut n = 0usize;
    while let Some((l, depth)) = stack.pop() {
        if depth > 64 {
            continue;
        }
        let Ok(entries) = fs.readdir(l) else { continue };
        for (_, child, _) in entries {
            n += 1;
            if n > MAX_ENTRIES {
                return n;
            }
            let Ok(st) = fs.stat(child) else { continue };
            let _ = fs.xattrs().list_xattrs(child);
            match st.mode & libc::S_IFMT {
                libc::S_IFDIR => stack.push((child, depth + 1)),
                libc::S_IFREG => {
                    let len = st.size.min(MAX_READ);
                    let _ = fs.read_untracked(child, 0, len);
                    if st.size > 4096 {
                        let _ = fs.read_untracked(child, st.size - 4096, 4096);
                    }
                }
                libc::S_IFLNK => {
                    let _ = fs.read_link(child);
                }
                _ => {}
            }
        }
    }
    n
}

fn view_walk(v: &mut btrkit_core::mount_view::ReadOnlyView) -> usize {
    let mut stack = vec![(1u64, 0u32)];
    let mut n = 0usize;
    while let Some((node, depth)) = stack.pop() {
        if depth > 64 {
            continue;
        }
        let Ok(h) = v.opendir(node) else { continue };
        let entries = v.dir_entries(h);
        v.releasedir(h);
        let Ok(entries) = entries else { continue };
        for e in entries.iter() {
            n += 1;
            if n > MAX_ENTRIES {
                return n;
            }
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let _ = v.lookup(node, &e.name);
            let Ok(st) = v.getattr(e.node) else { continue };
            if let Ok(list) = v.listxattr(e.node) {
                for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()).take(8) {
                    let _ = v.getxattr(e.node, name);
                }
            }
            match st.mode & libc::S_IFMT {
                libc::S_IFDIR => stack.push((e.node, depth + 1)),
                libc::S_IFREG => {
                    let _ = v.read(e.node, 0, st.size.min(MAX_READ));
                }
                libc::S_IFLNK => {
                    let _ = v.readlink(e.node);
                }
                _ => {}
            }
        }
    }
    n
}

/// Runs every read path; what each got to (entries seen, or why not),
/// for `--case`.
fn exercise(dev: Arc<dyn BlockDevice>) -> Vec<String> {
    let mut seen = Vec::new();
    let devs = || vec![("image".to_string(), dev.clone())];
    for log in [LogMode::Replay, LogMode::Salvage, LogMode::Ignore] {
        let o = ReadOptions {
            log,
            ..Default::default()
        };
        let fs = restore::open_virtual(devs(), &o);
        if let Err(e) = &fs {
            seen.push(format!("open_virtual {log:?}: {e}"));
        }
        if let Ok(mut fs) = fs {
            seen.push(format!(
                "open_virtual {log:?}: {} entries",
                fs_walk(&mut fs)
            ));
            if log == LogMode::Replay {
                let start = fs.root();
                let t = std::env::temp_dir().join("hostile-fuzz-dry-run-never-made");
                let _ = restore::restore(
                    &mut fs,
                    start,
                    &t,
                    &RestoreOptions {
                        dry_run: true,
                        metadata: true,
                        snapshots: true,
                        ..Default::default()
                    },
                    &mut |_, _| {},
                );
            }
        }
    }
    match btrkit_core::mount_view::ReadOnlyView::open(devs(), &ReadOptions::default(), None, true) {
        Ok(mut v) => seen.push(format!("view: {} entries", view_walk(&mut v))),
        Err(e) => seen.push(format!("view: {e}")),
    }
    match btrkit_core::check::check_device(
        dev.clone(),
        btrkit_core::check::CheckOptions::default(),
        &btrkit_core::check::NoProgress,
    ) {
        Ok(r) => seen.push(format!("check: {} findings", r.findings.len())),
        Err(e) => seen.push(format!("check: {e}")),
    }
    // The dump's walk.
    if let Ok(img) = Image::open(
        dev.clone(),
        OpenOptions {
            lenient: true,
            ..Default::default()
        },
    ) {
        let cs = img.csum.size();
        for (_, root) in all_trees(&img) {
            let _ = walk_tree(&img, root, |ev| {
                if let WalkEvent::Block { node, .. } = ev {
                    if node.is_leaf() {
                        for slot in 0..node.nr_safe() {
                            let _ = node.decode_item(slot, cs);
                        }
                    }
                }
                ControlFlow::Continue(())
            });
        }
        let _ = btrkit_core::log::inspect::inspect_log(&img);
    }
    seen
}

/// Apply case `seed` to an overlay over its base; None when the case
/// makes no edit (an empty tree, a leaf that cannot hold the change).
fn prepare(seed: u64, bases: &[Base]) -> Option<(Arc<dyn BlockDevice>, String)> {
    let m = mutate(seed, bases)?;
    let base = &bases[m.base];
    let ov: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(base.dev.clone()));
    for p in &m.block.copies {
        ov.write_at(*p, &m.bytes).ok()?;
    }
    Some((ov, m.what))
}

// ---------------------------------------------------------------------------
// Worker.

static PANIC_INFO: Mutex<Option<String>> = Mutex::new(None);

fn top_frames(bt: &str) -> String {
    // Frames of the project (btrkit_core and the tools), skipping the
    // panic machinery; the first few.
    let mut out = Vec::new();
    let lines: Vec<&str> = bt.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        let Some((_, f)) = t.split_once(": ") else {
            continue;
        };
        if !f.contains("btrkit") || f.contains("hostile_fuzz") {
            continue;
        }
        let at = lines
            .get(i + 1)
            .map(|n| n.trim())
            .filter(|n| n.starts_with("at "))
            .map(|n| {
                n.trim_start_matches("at ")
                    .rsplit("/src/")
                    .next()
                    .unwrap_or(n)
                    .to_string()
            })
            .unwrap_or_default();
        out.push(format!("{f} ({at})"));
        if out.len() >= 4 {
            break;
        }
    }
    out.join(" <- ")
}

fn set_rlimit_as(mib: u64) {
    let lim = libc::rlimit {
        rlim_cur: mib << 20,
        rlim_max: mib << 20,
    };
    // SAFETY: setrlimit on this process with a valid struct.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &lim);
    }
}

fn worker(images: &[PathBuf], mem_mib: u64) -> i32 {
    set_rlimit_as(mem_mib);
    let bases: Vec<Base> = match images.iter().map(|p| Base::load(p)).collect() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("hostile-fuzz worker: {e}");
            return 2;
        }
    };
    std::panic::set_hook(Box::new(|info| {
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        let msg = format!("{info}").replace('\n', " ");
        if let Ok(mut p) = PANIC_INFO.lock() {
            *p = Some(format!("{msg} || {}", top_frames(&bt)));
        }
    }));
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY");
    let _ = out.flush();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(seed) = line.trim().parse::<u64>() else {
            continue;
        };
        let _ = writeln!(out, "S {seed}");
        let _ = out.flush();
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some((dev, _)) = prepare(seed, &bases) {
                let _ = exercise(dev);
                true
            } else {
                false
            }
        }));
        let ms = t.elapsed().as_millis();
        let msg = match r {
            Ok(true) => format!("D {seed} ok {ms}"),
            Ok(false) => format!("D {seed} skip {ms}"),
            Err(_) => {
                let info = PANIC_INFO
                    .lock()
                    .ok()
                    .and_then(|mut p| p.take())
                    .unwrap_or_else(|| "panic".into());
                format!("D {seed} panic {ms} {info}")
            }
        };
        let _ = writeln!(out, "{msg}");
        let _ = out.flush();
    }
    0
}

// ---------------------------------------------------------------------------
// Master.

#[derive(Default)]
struct Tally {
    run: u64,
    skipped: u64,
    panics: Vec<(u64, String)>,
    aborts: Vec<(u64, String)>,
    hangs: Vec<(u64, String)>,
    slowest: (u128, u64),
}

struct Worker {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: PathBuf,
}

fn spawn_worker(images: &[PathBuf], mem_mib: u64, errfile: &PathBuf) -> Result<Worker, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let err = std::fs::File::create(errfile).map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .arg("--worker")
        .arg("--mem-mib")
        .arg(mem_mib.to_string())
        .args(images)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // Loading the bases takes a moment.
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(l) if l == "READY" => {}
        other => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "worker did not start: {other:?}: {}",
                std::fs::read_to_string(errfile).unwrap_or_default()
            ));
        }
    }
    Ok(Worker {
        child,
        stdin,
        lines: rx,
        stderr: errfile.clone(),
    })
}

/// Why a worker died, from its stderr: the line saying so (an allocation
/// refused, a panic while panicking) and the top frames of the backtrace.
fn stderr_tail(p: &PathBuf) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let l: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    let why = l
        .iter()
        .rev()
        .find(|x| x.contains("memory allocation") || x.contains("panicked") || x.contains("abort"))
        .map_or_else(
            || l[l.len().saturating_sub(2)..].join(" | "),
            |x| x.trim().to_string(),
        );
    // The last backtrace in the file is this death's.
    let bt = s.rsplit("stack backtrace:").next().unwrap_or("");
    format!("{why} || {}", top_frames(bt))
}

/// Where a stuck worker is: the top project frames of its main thread's
/// stack, by gdb where it is installed (else nothing).
fn where_stuck(pid: u32) -> String {
    let o = Command::new("timeout")
        .args([
            "30",
            "gdb",
            "-batch",
            "-p",
            &pid.to_string(),
            "-ex",
            "bt 40",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let Ok(o) = o else { return String::new() };
    let frames: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| {
            // "#N  0xADDR in NAME (ARGS) at FILE:LINE" or, inlined,
            // "#N  NAME (ARGS) at FILE:LINE".
            let f = l.split_once(" in ").map_or_else(
                || l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
                |(_, r)| r.to_string(),
            );
            let name = f.split(' ').next().unwrap_or("").to_string();
            if !name.starts_with("btrkit") {
                return None;
            }
            let at = f.rsplit(" at ").next().unwrap_or("");
            let at = at.rsplit("/src/").next().unwrap_or(at).to_string();
            Some(format!("{name} ({at})"))
        })
        .take(4)
        .collect();
    if frames.is_empty() {
        String::new()
    } else {
        format!(" || {}", frames.join(" <- "))
    }
}

fn run_jobs(
    images: &[PathBuf],
    seed: u64,
    cases: u64,
    jobs: usize,
    timeout: Duration,
    mem_mib: u64,
) -> Tally {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let dir = tempfile::Builder::new()
        .prefix("hostile-fuzz-")
        .tempdir()
        .expect("tempdir");
    let started = Instant::now();
    std::thread::scope(|s| {
        for j in 0..jobs.max(1) {
            let (next, tally) = (next.clone(), tally.clone());
            let errfile = dir.path().join(format!("worker-{j}.stderr"));
            s.spawn(move || {
                let mut w: Option<Worker> = None;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= cases {
                        break;
                    }
                    let cs = Prng::derive(seed, i);
                    if w.is_none() {
                        match spawn_worker(images, mem_mib, &errfile) {
                            Ok(x) => w = Some(x),
                            Err(e) => {
                                eprintln!("hostile-fuzz: {e}");
                                return;
                            }
                        }
                    }
                    let Some(wk) = w.as_mut() else { return };
                    if writeln!(wk.stdin, "{cs}")
                        .and_then(|_| wk.stdin.flush())
                        .is_err()
                    {
                        // Died between cases: count it as this case's abort.
                    }
                    let t = Instant::now();
                    let mut outcome: Option<String> = None;
                    let mut died = false;
                    loop {
                        let left = timeout.saturating_sub(t.elapsed());
                        match wk.lines.recv_timeout(left) {
                            Ok(l) if l.starts_with(&format!("D {cs} ")) => {
                                outcome = Some(l);
                                break;
                            }
                            Ok(_) => continue,
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
                            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                                died = true;
                                break;
                            }
                        }
                    }
                    let mut tl = tally.lock().unwrap_or_else(|e| e.into_inner());
                    tl.run += 1;
                    match outcome {
                        Some(l) => {
                            let mut parts = l.splitn(5, ' ');
                            let (_, _, kind, ms) =
                                (parts.next(), parts.next(), parts.next(), parts.next());
                            let rest = parts.next().unwrap_or("").to_string();
                            let ms: u128 = ms.and_then(|m| m.parse().ok()).unwrap_or(0);
                            if ms > tl.slowest.0 {
                                tl.slowest = (ms, cs);
                            }
                            match kind {
                                Some("panic") => tl.panics.push((cs, rest)),
                                Some("skip") => tl.skipped += 1,
                                _ => {}
                            }
                        }
                        None => {
                            let mut wk = w.take().expect("worker");
                            let stuck_in = if died {
                                String::new()
                            } else {
                                let at = where_stuck(wk.child.id());
                                let _ = wk.child.kill();
                                at
                            };
                            let st = wk.child.wait();
                            let tail = stderr_tail(&wk.stderr);
                            if died {
                                let sig = st.ok().and_then(|s| {
                                    std::os::unix::process::ExitStatusExt::signal(&s)
                                });
                                tl.aborts.push((cs, format!("signal {sig:?}: {tail}")));
                            } else {
                                tl.hangs
                                    .push((cs, format!("no answer in {timeout:?}{stuck_in}")));
                            }
                        }
                    }
                    let done = tl.run;
                    drop(tl);
                    if done % 250 == 0 {
                        eprintln!(
                            "hostile-fuzz: {done}/{cases} cases, {:.0?}",
                            started.elapsed()
                        );
                    }
                }
                if let Some(mut wk) = w {
                    drop(wk.stdin);
                    let _ = wk.child.wait();
                }
            });
        }
    });
    Arc::try_unwrap(tally)
        .ok()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .unwrap_or_default()
}

fn usage() -> ! {
    eprintln!(
        "usage: hostile-fuzz [--cases N] [--seed S] [--jobs J] [--case-timeout SECS] \
         [--mem-mib MIB] IMAGE...\n       hostile-fuzz --seed CASESEED --case IMAGE...   \
         (replay one case in-process)"
    );
    std::process::exit(16)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut cases, mut seed, mut jobs, mut timeout, mut mem) =
        (2000u64, 1u64, 2usize, 20u64, 2048u64);
    let (mut one, mut is_worker) = (false, false);
    let mut images = Vec::new();
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                eprintln!("hostile-fuzz: {what} needs a number");
                usage()
            })
        };
        match a.as_str() {
            "--cases" => cases = num("--cases"),
            "--seed" => seed = num("--seed"),
            "--jobs" => jobs = num("--jobs") as usize,
            "--case-timeout" => timeout = num("--case-timeout"),
            "--mem-mib" => mem = num("--mem-mib"),
            "--case" => one = true,
            "--worker" => is_worker = true,
            "-h" | "--help" => usage(),
            s if s.starts_with('-') => usage(),
            s => images.push(PathBuf::from(s)),
        }
    }
    if images.is_empty() {
        usage();
    }
    if is_worker {
        std::process::exit(worker(&images, mem));
    }
    if one {
        set_rlimit_as(mem);
        let bases: Vec<Base> = images
            .iter()
            .map(|p| Base::load(p).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        match prepare(seed, &bases) {
            None => println!("case {seed}: no edit (nothing to change)"),
            Some((dev, what)) => {
                println!("case {seed}: {what}");
                let t = Instant::now();
                for s in exercise(dev) {
                    println!("  {s}");
                }
                println!("case {seed}: no panic, {:.1?}", t.elapsed());
            }
        }
        return;
    }
    let t = Instant::now();
    let tally = run_jobs(
        &images,
        seed,
        cases,
        jobs,
        Duration::from_secs(timeout),
        mem,
    );
    // The edits, for the report (in-process, no read paths run).
    let bases: Vec<Base> = images.iter().filter_map(|p| Base::load(p).ok()).collect();
    let describe = |cs: u64| mutate(cs, &bases).map_or_else(|| "-".into(), |m| m.what);
    println!(
        "hostile-fuzz: seed {seed}: {} cases in {:.0?} ({} without an edit), {} panics, {} aborts, {} hangs; slowest case {} ms (seed {})",
        tally.run,
        t.elapsed(),
        tally.skipped,
        tally.panics.len(),
        tally.aborts.len(),
        tally.hangs.len(),
        tally.slowest.0,
        tally.slowest.1
    );
    // Group panics by message and place, one example seed each.
    let mut groups: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (cs, info) in &tally.panics {
        let key = info
            .split_once("panicked at ")
            .map_or(info.as_str(), |x| x.1)
            .to_string();
        groups.entry(key).or_default().push(*cs);
    }
    for (info, seeds) in &groups {
        println!(
            "PANIC x{}: {info}\n  seeds {:?}\n  e.g. {}",
            seeds.len(),
            &seeds[..seeds.len().min(8)],
            describe(seeds[0])
        );
    }
    for (cs, info) in &tally.aborts {
        println!("ABORT seed {cs}: {info}\n  {}", describe(*cs));
    }
    for (cs, info) in &tally.hangs {
        println!("HANG seed {cs}: {info}\n  {}", describe(*cs));
    }
    let bad = tally.panics.len() + tally.aborts.len() + tally.hangs.len();
    if tally.run < cases {
        println!(
            "hostile-fuzz: only {} of {cases} cases ran (a worker could not start)",
            tally.run
        );
        std::process::exit(2);
    }
    if bad > 0 {
        println!(
            "replay one: hostile-fuzz --seed SEED --case {}",
            images
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        std::process::exit(1);
    }
}
