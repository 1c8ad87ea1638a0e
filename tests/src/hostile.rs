//! Hostile images: real images (made by the kernel or by btrkit-mkfs)
//! edited one item at a time into what a malicious or broken writer could
//! leave, and a runner that holds every tool that reads images to the
//! same promises on them.
//!
//! - [`Patcher`]: locates an item by tree and key in any tree (the root,
//!   chunk and subvolume trees, the log root tree and each subvolume's
//!   fsync log tree) and edits it in the image file: a field of a given
//!   width, a name (DIR_ITEM, DIR_INDEX, XATTR_ITEM, INODE_REF,
//!   INODE_EXTREF; the leaf relaid, so a name of any length that fits),
//!   the key (the leaf kept in order, or deliberately not), a duplicate;
//!   then the checksum recomputed and every copy (DUP) written, so a read
//!   cannot heal it from the mirror. Damage that leaves the checksum wrong
//!   is [`Patcher::flip_block`]; data is [`Patcher::data_copies`].
//! - Base images: [`kernel_image`] (mkfs.btrfs, a loop mount and a shell
//!   script), [`kernel_crash_image`] (the same with an fsync log: a copy
//!   taken while mounted, as in [`crate::kimage::KernelImage::crash_copy`]),
//!   [`mkfs_rootdir_image`] (btrkit-mkfs --rootdir).
//! - [`run_tool`] / [`Spawned`]: a tool as a subprocess with a wall-time
//!   bound (killed past it), its peak RSS (wait4's ru_maxrss, and killed
//!   past [`RSS_KILL`] so a runaway cannot take the machine), death by a
//!   signal and panics (exit 101) told apart: [`ToolRun::problems`].
//! - [`Canary`]: a destination inside a tree of files (with a victim file
//!   and `outside/` directories) that must come out of a restore unchanged.
//! - [`mount_walk`]: btrkit-mount in the foreground, every path listed,
//!   stat'ed and read by a bounded walk, unmounted with `fusermount3 -u`.
//! - [`sweep`]: every tool that reads images, run the standard ways.

use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bound on a tool's peak resident memory on any of these images
/// (they are at most a few hundred MiB, and a tool needs far less).
pub const MAX_RSS: u64 = 1 << 30;
/// A tool past this much resident memory is killed at once (and reported
/// over [`MAX_RSS`]): no hostile image may take the machine's memory.
pub const RSS_KILL: u64 = 4 << 30;
/// The bound on one tool run's wall time on these small images.
pub const TOOL_TIME_LIMIT: Duration = Duration::from_secs(60);
/// The bound on the mount walk: entries visited, and directory depth.
pub const WALK_MAX_ENTRIES: usize = 20_000;
pub const WALK_MAX_DEPTH: usize = 40;
/// Most bytes read of one file through the mount.
pub const WALK_MAX_READ: u64 = 64 << 20;

// ---------------------------------------------------------------------------
// Raw blocks.

fn le(b: &[u8], off: usize, n: usize) -> u64 {
    let mut v = 0u64;
    for i in (0..n).rev() {
        v = (v << 8) | u64::from(*b.get(off + i).unwrap_or(&0));
    }
    v
}

fn put_le(b: &mut [u8], off: usize, n: usize, v: u64) {
    for i in 0..n {
        b[off + i] = (v >> (8 * i)) as u8;
    }
}

fn key_at(b: &[u8], off: usize) -> Key {
    Key::new(le(b, off, 8), b[off + 8], le(b, off + 9, 8))
}

fn put_key(b: &mut [u8], off: usize, k: &Key) {
    put_le(b, off, 8, k.objectid);
    b[off + 8] = k.ty;
    put_le(b, off + 9, 8, k.offset);
}

const NRITEMS_OFF: usize = 96;
const LEVEL_OFF: usize = 100;

fn nritems(b: &[u8]) -> usize {
    le(b, NRITEMS_OFF, 4) as usize
}

/// The items of a leaf: (key, data), in slot order. Items whose header or
/// data lie outside the block are cut off there.
pub fn leaf_items(b: &[u8]) -> Vec<(Key, Vec<u8>)> {
    let n = nritems(b).min((b.len() - HEADER_SIZE) / ITEM_SIZE);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let h = HEADER_SIZE + i * ITEM_SIZE;
        let k = key_at(b, h);
        let off = HEADER_SIZE + le(b, h + 17, 4) as usize;
        let size = le(b, h + 21, 4) as usize;
        let data = b.get(off..off.saturating_add(size)).unwrap_or(&[]).to_vec();
        out.push((k, data));
    }
    out
}

/// Lay `items` out in leaf `b` as the kernel does (data packed from the
/// end, item 0's last), keeping the header; Err when they do not fit.
pub fn relay_leaf(b: &mut [u8], items: &[(Key, Vec<u8>)]) -> Result<(), String> {
    let ns = b.len();
    let need =
        HEADER_SIZE + items.len() * ITEM_SIZE + items.iter().map(|(_, d)| d.len()).sum::<usize>();
    if need > ns {
        return Err(format!(
            "{} items of {need} bytes do not fit a {ns}-byte leaf",
            items.len()
        ));
    }
    for x in &mut b[HEADER_SIZE..] {
        *x = 0;
    }
    put_le(b, NRITEMS_OFF, 4, items.len() as u64);
    let mut end = ns - HEADER_SIZE;
    for (i, (k, d)) in items.iter().enumerate() {
        end -= d.len();
        let h = HEADER_SIZE + i * ITEM_SIZE;
        put_key(b, h, k);
        put_le(b, h + 17, 4, end as u64);
        put_le(b, h + 21, 4, d.len() as u64);
        b[HEADER_SIZE + end..HEADER_SIZE + end + d.len()].copy_from_slice(d);
    }
    Ok(())
}

/// Which tree an item is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeSel {
    /// The root tree.
    Root,
    /// The chunk tree.
    Chunk,
    /// A tree named in the root tree (5 the default subvolume, 2 the
    /// extent tree, 7 the checksum tree, a subvolume's id...).
    Tree(u64),
    /// The log root tree (the superblock's `log_root`).
    LogRoot,
    /// The fsync log tree of subvolume `id` (from the log root tree).
    Log(u64),
}

/// Where an item is: its leaf, slot, key and data.
#[derive(Clone, Debug)]
pub struct At {
    pub tree: TreeSel,
    /// Logical address of the leaf.
    pub bytenr: u64,
    pub slot: usize,
    pub key: Key,
    /// Offset of the item's data in the leaf.
    pub data_off: usize,
    /// The item's data as found.
    pub data: Vec<u8>,
}

/// Edits items of an image file in place; see the module documentation.
/// Opened anew for each batch of edits (a relaid leaf moves items).
pub struct Patcher {
    path: PathBuf,
    img: Image,
    file: std::fs::File,
    ns: usize,
}

impl Patcher {
    /// Open the image file (its superblock and chunk map; damaged blocks
    /// are tolerated, as far as the chunk tree is readable).
    pub fn open(path: &Path) -> Result<Patcher, String> {
        let img = Image::open_path(
            path,
            OpenOptions {
                lenient: true,
                trust_bad_csum: true,
                ..Default::default()
            },
        )
        .map_err(|e| format!("open {}: {e}", path.display()))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("open {} rw: {e}", path.display()))?;
        let ns = img.nodesize as usize;
        Ok(Patcher {
            path: path.to_path_buf(),
            img,
            file,
            ns,
        })
    }

    /// The image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The opened image (superblock, chunk map, checksum type).
    pub fn image(&self) -> &Image {
        &self.img
    }

    /// Physical offsets of every copy of the `len` bytes at `logical`.
    pub fn data_copies(&self, logical: u64, len: u64) -> Vec<u64> {
        self.img
            .chunks
            .map(logical, len, self.img.devid)
            .unwrap_or_default()
    }

    fn copies(&self, bytenr: u64) -> Vec<u64> {
        self.data_copies(bytenr, self.ns as u64)
    }

    /// The bytes of tree block `bytenr`, copy 0 as it is on disk.
    pub fn read_block(&self, bytenr: u64) -> Option<Vec<u8>> {
        let p = *self.copies(bytenr).first()?;
        let mut b = vec![0u8; self.ns];
        self.file.read_exact_at(&mut b, p).ok()?;
        Some(b)
    }

    /// Write `b` as tree block `bytenr` on every copy, its checksum
    /// recomputed first when `fix_csum`.
    pub fn write_block(&self, bytenr: u64, b: &mut [u8], fix_csum: bool) -> Result<(), String> {
        if fix_csum {
            let c = block_csum(self.img.csum, b);
            b[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        }
        let copies = self.copies(bytenr);
        if copies.is_empty() {
            return Err(format!("block {bytenr} is not mapped"));
        }
        for p in copies {
            self.file
                .write_all_at(b, p)
                .map_err(|e| format!("write block {bytenr}: {e}"))?;
        }
        self.file.sync_all().map_err(|e| e.to_string())
    }

    /// The checksum type of the image (crc32c unless mkfs chose another).
    pub fn csum(&self) -> CsumType {
        self.img.csum
    }

    fn root_item_in(&self, tree_root: u64, id: u64, owner_key: Option<u64>) -> Option<(u64, u8)> {
        let mut found = None;
        for (k, d) in self
            .all_items_raw(tree_root)
            .into_iter()
            .map(|a| (a.key, a.data))
        {
            let matches = match owner_key {
                None => k.objectid == id && k.ty == BTRFS_ROOT_ITEM_KEY,
                Some(o) => k.objectid == o && k.ty == BTRFS_ROOT_ITEM_KEY && k.offset == id,
            };
            if matches {
                if let Ok(ri) = btrkit_core::format::root::RootItem::parse(&d) {
                    found = Some((ri.bytenr.get(), ri.level));
                }
            }
        }
        found
    }

    /// The root block of a tree.
    pub fn tree_root(&self, sel: TreeSel) -> Option<u64> {
        let sb = &self.img.sb;
        match sel {
            TreeSel::Root => Some(sb.root.get()),
            TreeSel::Chunk => Some(sb.chunk_root.get()),
            TreeSel::Tree(id) => self.root_item_in(sb.root.get(), id, None).map(|x| x.0),
            TreeSel::LogRoot => Some(sb.log_root.get()).filter(|&b| b != 0),
            TreeSel::Log(id) => {
                let lr = sb.log_root.get();
                if lr == 0 {
                    return None;
                }
                self.root_item_in(lr, id, Some(BTRFS_TREE_LOG_OBJECTID))
                    .map(|x| x.0)
            }
        }
    }

    /// Subvolume ids that have a log tree.
    pub fn logged_subvols(&self) -> Vec<u64> {
        let lr = self.img.sb.log_root.get();
        if lr == 0 {
            return Vec::new();
        }
        self.all_items_raw(lr)
            .into_iter()
            .filter(|a| {
                a.key.objectid == BTRFS_TREE_LOG_OBJECTID && a.key.ty == BTRFS_ROOT_ITEM_KEY
            })
            .map(|a| a.key.offset)
            .collect()
    }

    /// Leaves under `root`, left to right (raw reads of copy 0; blocks
    /// that cannot be read, or loop, are skipped).
    pub fn leaves(&self, root: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        self.leaves_into(root, 0, &mut seen, &mut out);
        out
    }

    fn leaves_into(&self, b: u64, depth: u32, seen: &mut BTreeSet<u64>, out: &mut Vec<u64>) {
        if depth > 8 || !seen.insert(b) {
            return;
        }
        let Some(blk) = self.read_block(b) else {
            return;
        };
        if blk[LEVEL_OFF] == 0 {
            out.push(b);
            return;
        }
        let n = nritems(&blk).min((self.ns - HEADER_SIZE) / KEY_PTR_SIZE);
        for i in 0..n {
            let child = le(&blk, HEADER_SIZE + i * KEY_PTR_SIZE + 17, 8);
            self.leaves_into(child, depth + 1, seen, out);
        }
    }

    fn all_items_raw(&self, root: u64) -> Vec<At> {
        let mut out = Vec::new();
        for leaf in self.leaves(root) {
            let Some(b) = self.read_block(leaf) else {
                continue;
            };
            let n = nritems(&b).min((self.ns - HEADER_SIZE) / ITEM_SIZE);
            for (slot, (key, data)) in leaf_items(&b).into_iter().enumerate().take(n) {
                let h = HEADER_SIZE + slot * ITEM_SIZE;
                out.push(At {
                    tree: TreeSel::Root,
                    bytenr: leaf,
                    slot,
                    key,
                    data_off: HEADER_SIZE + le(&b, h + 17, 4) as usize,
                    data,
                });
            }
        }
        out
    }

    /// Every item of a tree, in order.
    pub fn items(&self, sel: TreeSel) -> Vec<At> {
        let Some(root) = self.tree_root(sel) else {
            return Vec::new();
        };
        let mut v = self.all_items_raw(root);
        for a in &mut v {
            a.tree = sel;
        }
        v
    }

    /// The first item of `sel` for which `pred(key, data)` holds.
    pub fn find(&self, sel: TreeSel, pred: impl Fn(&Key, &[u8]) -> bool) -> Option<At> {
        self.items(sel).into_iter().find(|a| pred(&a.key, &a.data))
    }

    /// The item of `sel` with key `key`.
    pub fn find_key(&self, sel: TreeSel, key: Key) -> Option<At> {
        self.find(sel, |k, _| *k == key)
    }

    /// Set `width` bytes (1, 2, 4 or 8, little-endian) at `off` within
    /// the item's data to `value`; checksum fixed, every copy.
    pub fn set_field(&self, at: &At, off: usize, width: usize, value: u64) -> Result<(), String> {
        if off + width > at.data.len() {
            return Err(format!(
                "field {off}+{width} past the item's {} bytes",
                at.data.len()
            ));
        }
        let mut b = self
            .read_block(at.bytenr)
            .ok_or_else(|| format!("cannot read block {}", at.bytenr))?;
        put_le(&mut b, at.data_off + off, width, value);
        self.write_block(at.bytenr, &mut b, true)
    }

    /// Overwrite bytes at `off` within the item's data (same length).
    pub fn set_bytes(&self, at: &At, off: usize, bytes: &[u8]) -> Result<(), String> {
        if off + bytes.len() > at.data.len() {
            return Err("bytes past the item's end".into());
        }
        let mut b = self
            .read_block(at.bytenr)
            .ok_or_else(|| format!("cannot read block {}", at.bytenr))?;
        b[at.data_off + off..at.data_off + off + bytes.len()].copy_from_slice(bytes);
        self.write_block(at.bytenr, &mut b, true)
    }

    /// Edit the leaf holding `at` as a list of (key, data); the leaf is
    /// relaid, and when its first key changed and `fix_parents`, the key
    /// pointers above it follow.
    pub fn edit_leaf(
        &self,
        at: &At,
        fix_parents: bool,
        f: impl FnOnce(&mut Vec<(Key, Vec<u8>)>),
    ) -> Result<(), String> {
        let mut b = self
            .read_block(at.bytenr)
            .ok_or_else(|| format!("cannot read block {}", at.bytenr))?;
        if b[LEVEL_OFF] != 0 {
            return Err(format!("block {} is not a leaf", at.bytenr));
        }
        let mut items = leaf_items(&b);
        let old_first = items.first().map(|x| x.0);
        f(&mut items);
        relay_leaf(&mut b, &items)?;
        self.write_block(at.bytenr, &mut b, true)?;
        let new_first = items.first().map(|x| x.0);
        if fix_parents && old_first != new_first {
            if let (Some(nk), Some(root)) = (new_first, self.tree_root(at.tree)) {
                self.fix_parent_keys(root, at.bytenr, &nk)?;
            }
        }
        Ok(())
    }

    /// Point the key of every pointer to `target` (and, where it is slot
    /// 0, the pointers above) at `key`.
    fn fix_parent_keys(&self, root: u64, target: u64, key: &Key) -> Result<(), String> {
        let Some(path) = self.path_to(root, target, 0) else {
            return Ok(());
        };
        // path: (node, slot) from the root down to the leaf's parent.
        for (node, slot) in path.iter().rev() {
            let mut b = self
                .read_block(*node)
                .ok_or_else(|| format!("cannot read block {node}"))?;
            put_key(&mut b, HEADER_SIZE + slot * KEY_PTR_SIZE, key);
            self.write_block(*node, &mut b, true)?;
            if *slot != 0 {
                break;
            }
        }
        Ok(())
    }

    fn path_to(&self, node: u64, target: u64, depth: u32) -> Option<Vec<(u64, usize)>> {
        if depth > 8 {
            return None;
        }
        let b = self.read_block(node)?;
        if b[LEVEL_OFF] == 0 {
            return None;
        }
        let n = nritems(&b).min((self.ns - HEADER_SIZE) / KEY_PTR_SIZE);
        for i in 0..n {
            let child = le(&b, HEADER_SIZE + i * KEY_PTR_SIZE + 17, 8);
            if child == target {
                return Some(vec![(node, i)]);
            }
        }
        for i in 0..n {
            let child = le(&b, HEADER_SIZE + i * KEY_PTR_SIZE + 17, 8);
            if let Some(mut p) = self.path_to(child, target, depth + 1) {
                p.insert(0, (node, i));
                return Some(p);
            }
        }
        None
    }

    /// Replace the name of the first entry of a DIR_ITEM, DIR_INDEX,
    /// XATTR_ITEM, INODE_REF or INODE_EXTREF item with `name` (any length
    /// that fits the leaf; its name_len and the item's size follow, and
    /// the leaf is relaid).
    pub fn set_name(&self, at: &At, name: &[u8]) -> Result<(), String> {
        let d = &at.data;
        let (len_off, name_off, old_len, tail) = match at.key.ty {
            BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => {
                let data_len = le(d, 25, 2) as usize;
                let name_len = le(d, 27, 2) as usize;
                (27, 30, name_len, data_len)
            }
            BTRFS_INODE_REF_KEY => (8, 10, le(d, 8, 2) as usize, 0),
            BTRFS_INODE_EXTREF_KEY => (16, 18, le(d, 16, 2) as usize, 0),
            t => return Err(format!("item type {t} has no name")),
        };
        if name_off + old_len + tail > d.len() {
            return Err("the item's name runs past its end".into());
        }
        let mut nd = d[..name_off].to_vec();
        put_le(&mut nd, len_off, 2, name.len() as u64);
        nd.extend_from_slice(name);
        nd.extend_from_slice(&d[name_off + old_len..]);
        let slot = at.slot;
        self.edit_leaf(at, true, move |items| {
            if let Some(it) = items.get_mut(slot) {
                it.1 = nd;
            }
        })
    }

    /// Give the item key `key`. With `keep_order` the leaf is sorted
    /// again (the item moves to its place within the leaf); without it,
    /// the leaf may be out of order, deliberately.
    pub fn set_key(&self, at: &At, key: Key, keep_order: bool) -> Result<(), String> {
        let slot = at.slot;
        self.edit_leaf(at, true, move |items| {
            if let Some(it) = items.get_mut(slot) {
                it.0 = key;
            }
            if keep_order {
                items.sort_by_key(|a| a.0);
            }
        })
    }

    /// Insert a copy of the item with key `key` (its own key again when
    /// None: two items with one key), in key order after equal keys.
    pub fn duplicate(&self, at: &At, key: Option<Key>) -> Result<(), String> {
        let slot = at.slot;
        self.edit_leaf(at, true, move |items| {
            if let Some(it) = items.get(slot).cloned() {
                let k = key.unwrap_or(it.0);
                let pos = items.partition_point(|x| x.0 <= k);
                items.insert(pos, (k, it.1));
            }
        })
    }

    /// XOR `mask` into the bytes at `off..off+len` of tree block `bytenr`
    /// on every copy, the checksum recomputed only when `fix_csum`.
    pub fn flip_block(
        &self,
        bytenr: u64,
        off: usize,
        len: usize,
        mask: u8,
        fix_csum: bool,
    ) -> Result<(), String> {
        let mut b = self
            .read_block(bytenr)
            .ok_or_else(|| format!("cannot read block {bytenr}"))?;
        for x in &mut b[off..off + len] {
            *x ^= mask;
        }
        self.write_block(bytenr, &mut b, fix_csum)
    }

    /// XOR `mask` into `len` bytes of file data at logical `logical`, on
    /// every copy (data checksums left as they are).
    pub fn flip_data(&self, logical: u64, len: usize, mask: u8) -> Result<(), String> {
        let copies = self.data_copies(logical, len as u64);
        if copies.is_empty() {
            return Err(format!("data at {logical} is not mapped"));
        }
        for p in copies {
            let mut b = vec![0u8; len];
            self.file
                .read_exact_at(&mut b, p)
                .map_err(|e| e.to_string())?;
            for x in &mut b {
                *x ^= mask;
            }
            self.file.write_all_at(&b, p).map_err(|e| e.to_string())?;
        }
        self.file.sync_all().map_err(|e| e.to_string())
    }

    /// The inode number of `name` in directory `dir` of subvolume tree
    /// `sel` (by its DIR_INDEX items).
    pub fn lookup(&self, sel: TreeSel, dir: u64, name: &[u8]) -> Option<u64> {
        self.dir_index(sel, dir, name).map(|a| le(&a.data, 0, 8))
    }

    /// The DIR_INDEX item of `name` in directory `dir`.
    pub fn dir_index(&self, sel: TreeSel, dir: u64, name: &[u8]) -> Option<At> {
        self.find(sel, |k, d| {
            k.objectid == dir && k.ty == BTRFS_DIR_INDEX_KEY && dir_entry_name(d) == Some(name)
        })
    }

    /// The inode of path `path` ("a/b/c") from the subvolume root (256).
    pub fn resolve(&self, sel: TreeSel, path: &str) -> Option<u64> {
        let mut ino = BTRFS_FIRST_FREE_OBJECTID;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            ino = self.lookup(sel, ino, c.as_bytes())?;
        }
        Some(ino)
    }
}

/// The name of the first entry of a DIR_ITEM/DIR_INDEX item's data.
pub fn dir_entry_name(d: &[u8]) -> Option<&[u8]> {
    if d.len() < 30 {
        return None;
    }
    let n = le(d, 27, 2) as usize;
    d.get(30..30 + n)
}

/// Offsets in btrfs_file_extent_item.
pub mod fe {
    pub const GENERATION: usize = 0;
    pub const RAM_BYTES: usize = 8;
    pub const COMPRESSION: usize = 16;
    pub const TYPE: usize = 20;
    pub const DISK_BYTENR: usize = 21;
    pub const DISK_NUM_BYTES: usize = 29;
    pub const OFFSET: usize = 37;
    pub const NUM_BYTES: usize = 45;
}

/// Read a little-endian field of an item's data.
pub fn field(d: &[u8], off: usize, width: usize) -> u64 {
    le(d, off, width)
}

// ---------------------------------------------------------------------------
// Base images.

/// Run `sh -c cmd`; Err with its output unless it exits 0.
pub fn sh(cmd: &str) -> Result<(), String> {
    let o = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`{cmd}`: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{cmd}` failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

/// A kernel-made image `dir/name` (256 MiB, `mkfs.btrfs -f -q MKFS`,
/// mounted with `OPTS`): `setup(mountpoint)` populates it, then it is
/// unmounted. Panics on failure (a test cannot go on without it).
pub fn kernel_image(
    dir: &Path,
    name: &str,
    mkfs_args: &[&str],
    mount_opts: &str,
    setup: &dyn Fn(&Path),
) -> PathBuf {
    let img = dir.join(name);
    let f = std::fs::File::create(&img).expect("create image");
    f.set_len(256 << 20).expect("size image");
    drop(f);
    let o = Command::new("mkfs.btrfs")
        .args(["-f", "-q"])
        .args(mkfs_args)
        .arg(&img)
        .output()
        .expect("mkfs.btrfs");
    assert!(
        o.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m = crate::LoopMount::new(&img, mount_opts).unwrap_or_else(|e| panic!("mount: {e}"));
    setup(m.path());
    sh("sync").ok();
    m.unmount().unwrap_or_else(|e| panic!("unmount: {e}"));
    img
}

/// A kernel-made crash image with an fsync log: mounted with
/// `commit=600` (plus `mount_opts`), `setup(mnt)` then a commit, then
/// `logged(mnt)` (which must fsync something), then the image copied as a
/// power cut leaves it. Retried when a commit elsewhere emptied the log.
pub fn kernel_crash_image(
    dir: &Path,
    name: &str,
    mount_opts: &str,
    setup: &dyn Fn(&Path),
    logged: &dyn Fn(&Path),
) -> PathBuf {
    let out = dir.join(name);
    let mut last = String::new();
    for _ in 0..5 {
        let mut k = crate::KernelImage::new_mounted(
            &crate::MkfsOpts::default().size(256 << 20),
            mount_opts,
        );
        setup(k.mnt());
        k.sync();
        logged(k.mnt());
        let c = k.crash_copy_unchecked(name);
        k.umount();
        if c.log_root != 0 {
            crate::kcrash::copy_sparse(&c.path, &out).expect("copy crash image");
            return out;
        }
        last = "the crash copy has no log (a commit intervened)".into();
    }
    panic!("no crash image with a log after 5 tries: {last}");
}

/// An image made by `btrkit-mkfs --rootdir SRC` (`size` bytes).
pub fn mkfs_rootdir_image(src: &Path, img: &Path, size: &str) -> Result<(), String> {
    let o = Command::new(crate::bin_path("btrkit-mkfs"))
        .arg("-q")
        .args(["-b", size, "-r"])
        .arg(src)
        .arg(img)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "btrkit-mkfs: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Write `data` to `path` and fsync it (with `xfs_io` semantics: the file
/// is logged by the kernel's fsync).
pub fn write_fsync(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(data).expect("write");
    f.sync_all().expect("fsync");
}

/// Deterministic pseudo-random bytes (core's `Prng`), for file contents.
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    btrkit_core::util::prng::Prng::new(seed).fill(&mut v);
    v
}

// ---------------------------------------------------------------------------
// Running a tool.

/// How one tool run ended.
#[derive(Debug, Default)]
pub struct ToolRun {
    /// What ran (for messages).
    pub what: String,
    pub code: Option<i32>,
    /// The signal that killed it (not one we sent for a timeout).
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Killed for passing [`RSS_KILL`].
    pub over_memory: bool,
    /// Peak resident set (VmHWM, polled while it runs), bytes.
    pub peak_rss: u64,
    pub elapsed: Duration,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl ToolRun {
    /// What is wrong with how it ended, whatever it printed: a panic,
    /// death by a signal (an abort is SIGABRT), the time or memory bound.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let tail = || {
            let l: Vec<&str> = self.stderr.lines().collect();
            // What it said first about dying (an allocation refused, a
            // panic's message and place), else its last lines.
            match l.iter().position(|x| {
                x.contains("memory allocation") || x.contains("panicked") || x.contains("error:")
            }) {
                Some(i) => l[i..(i + 2).min(l.len())].join(" | "),
                None => l[l.len().saturating_sub(4)..].join(" | "),
            }
        };
        if self.timed_out {
            p.push(format!(
                "{}: still running after {:?} (killed)",
                self.what, TOOL_TIME_LIMIT
            ));
        }
        if self.over_memory {
            p.push(format!(
                "{}: resident memory past {} MiB (killed)",
                self.what,
                RSS_KILL >> 20
            ));
        }
        if let Some(s) = self.signal {
            let name = match s {
                libc::SIGABRT => "SIGABRT (abort)",
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGBUS => "SIGBUS",
                libc::SIGKILL => "SIGKILL (the OOM killer?)",
                libc::SIGILL => "SIGILL",
                _ => "a signal",
            };
            p.push(format!(
                "{}: killed by signal {s}, {name}: {}",
                self.what,
                tail()
            ));
        }
        if self.code == Some(101) {
            p.push(format!("{}: panicked (exit 101): {}", self.what, tail()));
        } else if self.stderr.contains("panicked") {
            // A thread of it panicked and it went on (or exited otherwise).
            let at = self
                .stderr
                .lines()
                .position(|l| l.contains("panicked"))
                .map(|i| {
                    let l: Vec<&str> = self.stderr.lines().collect();
                    l[i..(i + 2).min(l.len())].join(" ")
                })
                .unwrap_or_default();
            p.push(format!(
                "{}: a thread panicked (exit {:?}): {at}",
                self.what, self.code
            ));
        }
        if self.peak_rss > MAX_RSS && !self.over_memory {
            p.push(format!(
                "{}: peak RSS {} MiB, over the {} MiB bound",
                self.what,
                self.peak_rss >> 20,
                MAX_RSS >> 20
            ));
        }
        p
    }

    /// The stdout parsed as JSON (Null when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Standard output as text.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// One line for a report.
    pub fn summary(&self) -> String {
        format!(
            "{}: exit {:?} signal {:?}{} in {:.1?}, peak RSS {} MiB; stderr: {}",
            self.what,
            self.code,
            self.signal,
            if self.timed_out { " TIMED OUT" } else { "" },
            self.elapsed,
            self.peak_rss >> 20,
            self.stderr
                .lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect::<String>()
        )
    }
}

/// A started tool: its pid, its output drained on threads.
pub struct Spawned {
    what: String,
    pid: libc::pid_t,
    start: Instant,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
    reaped: bool,
}

fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut v);
        }
        v
    })
}

/// (VmRSS, VmHWM) of a live process, bytes (0 once it is gone).
fn rss_of(pid: libc::pid_t) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kib| kib << 10)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

impl Spawned {
    /// Start `cmd` (stdin closed, stdout and stderr captured).
    pub fn start(mut cmd: Command, what: &str) -> Result<Spawned, String> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{what}: cannot start: {e}"))?;
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        let pid = child.id() as libc::pid_t;
        // Reaped by wait4 below, never by Child.
        std::mem::forget(child);
        Ok(Spawned {
            what: what.to_string(),
            pid,
            start: Instant::now(),
            out: Some(out),
            err: Some(err),
            reaped: false,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether it has exited (without reaping it).
    pub fn running(&self) -> bool {
        if self.reaped {
            return false;
        }
        // /proc/PID/stat's state: Z once it exited.
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let state = s
            .rsplit_once(')')
            .and_then(|(_, r)| r.trim().chars().next());
        !matches!(state, None | Some('Z') | Some('X'))
    }

    /// Send `sig` to it (only while it is not reaped).
    pub fn signal(&self, sig: i32) {
        if !self.reaped {
            // SAFETY: kill(2) on our own unreaped child's pid.
            unsafe {
                libc::kill(self.pid, sig);
            }
        }
    }

    /// Wait for it until `limit` from its start (then kill it), watching
    /// its memory; how it ended.
    pub fn finish(mut self, limit: Duration) -> ToolRun {
        let mut r = ToolRun {
            what: self.what.clone(),
            ..Default::default()
        };
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of the plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut killed = false;
        loop {
            // SAFETY: our own child, not reaped yet; pointers to live locals.
            let w = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut ru) };
            if w == self.pid {
                break;
            }
            if w < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                r.stderr = format!("wait4: {e}");
                self.reaped = true;
                return r;
            }
            // The high-water mark of the program's own memory (after its
            // exec): wait4's ru_maxrss also counts the test process's
            // memory the child shared before its exec.
            let (rss, hwm) = rss_of(self.pid);
            r.peak_rss = r.peak_rss.max(hwm);
            if !killed {
                if self.start.elapsed() > limit {
                    r.timed_out = true;
                    killed = true;
                    self.signal(libc::SIGKILL);
                } else if rss > RSS_KILL {
                    r.over_memory = true;
                    killed = true;
                    self.signal(libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.reaped = true;
        r.elapsed = self.start.elapsed();
        // ru_maxrss is an upper bound (see above); the polled mark is
        // the program's own, missing at most the last few milliseconds.
        let _ = ru.ru_maxrss;
        if libc::WIFEXITED(status) {
            r.code = Some(libc::WEXITSTATUS(status));
        } else if libc::WIFSIGNALED(status) && !killed {
            r.signal = Some(libc::WTERMSIG(status));
        }
        r.stdout = self
            .out
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        r.stderr = String::from_utf8_lossy(
            &self
                .err
                .take()
                .and_then(|t| t.join().ok())
                .unwrap_or_default(),
        )
        .into_owned();
        r
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(libc::SIGKILL);
            let mut status = 0;
            // SAFETY: our own child, not reaped; status is a live local.
            unsafe {
                libc::waitpid(self.pid, &mut status, 0);
            }
        }
    }
}

/// Run `cmd` to its end within [`TOOL_TIME_LIMIT`].
pub fn run_tool(cmd: Command, what: &str) -> ToolRun {
    match Spawned::start(cmd, what) {
        Ok(s) => s.finish(TOOL_TIME_LIMIT),
        Err(e) => ToolRun {
            what: what.into(),
            stderr: e,
            code: Some(-1),
            ..Default::default()
        },
    }
}

/// A digest of an image file's contents (holes and zeros alike).
pub fn image_hash(p: &Path) -> String {
    crate::kcrash::image_digest(p).unwrap_or_else(|e| format!("unreadable: {e}"))
}

// ---------------------------------------------------------------------------
// The canary tree around a restore's destination.

/// What a path outside the destination looked like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    pub size: u64,
    /// Contents digest (files) or link target (symlinks).
    pub content: Vec<u8>,
    pub rdev: u64,
}

fn stamp(p: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(p).ok()?;
    let content = if m.file_type().is_symlink() {
        std::fs::read_link(p).ok()?.as_os_str().as_bytes().to_vec()
    } else if m.is_file() {
        let d = std::fs::read(p).ok()?;
        CsumType::Sha256.compute(&d).to_vec()
    } else {
        Vec::new()
    };
    Some(Stamp {
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        size: if m.is_dir() { 0 } else { m.size() },
        content,
        rdev: m.rdev(),
    })
}

/// A destination inside a tree that must stay as it is:
///
/// ```text
/// <tmp>/p/q/                (padding: a name climbing out stays in <tmp>)
///     canary/               files, a subdirectory, `victim`
///         dest/             DEST
///         outside/
///     outside/              what `../../outside` from DEST reaches
/// ```
pub struct Canary {
    _tmp: tempfile::TempDir,
    /// `<tmp>` (everything watched but `dest`).
    pub top: PathBuf,
    /// `<tmp>/p/q`.
    pub base: PathBuf,
    pub canary: PathBuf,
    pub dest: PathBuf,
    /// `<base>/outside`.
    pub outside: PathBuf,
    /// `<canary>/outside`.
    pub inner_outside: PathBuf,
    pub victim: PathBuf,
    /// Further trees watched (e.g. a victim elsewhere that an image's
    /// absolute symlink names).
    watched: Vec<PathBuf>,
    before: BTreeMap<PathBuf, Stamp>,
}

/// The victim's contents.
pub const VICTIM: &[u8] = b"victim: must never be written by a restore\n";

impl Canary {
    pub fn new() -> Canary {
        let tmp = tempfile::Builder::new()
            .prefix("btrkit-canary-")
            .tempdir()
            .expect("tempdir");
        let top = tmp.path().to_path_buf();
        let base = top.join("p/q");
        let canary = base.join("canary");
        let dest = canary.join("dest");
        let outside = base.join("outside");
        let inner_outside = canary.join("outside");
        let victim = canary.join("victim");
        for d in [&dest, &outside, &inner_outside, &canary.join("sub")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(&victim, VICTIM).expect("victim");
        std::fs::write(canary.join("a.txt"), b"a\n").expect("write");
        std::fs::write(canary.join("sub/b.txt"), b"b\n").expect("write");
        std::fs::write(outside.join("o.txt"), b"o\n").expect("write");
        std::fs::write(inner_outside.join("i.txt"), b"i\n").expect("write");
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644));
        // Times in the past, so a touch shows.
        let old = "200001010000";
        let _ = sh(&format!(
            "find '{}' -exec touch -h -t {old} {{}} +",
            top.display()
        ));
        let mut c = Canary {
            _tmp: tmp,
            top,
            base,
            canary,
            dest,
            outside,
            inner_outside,
            victim,
            watched: Vec::new(),
            before: BTreeMap::new(),
        };
        c.before = c.snapshot();
        c
    }

    /// Every path under `top` but `dest` (and what is under it), stamped.
    fn snapshot(&self) -> BTreeMap<PathBuf, Stamp> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.top.clone()];
        stack.extend(self.watched.iter().cloned());
        while let Some(d) = stack.pop() {
            if let Some(s) = stamp(&d) {
                out.insert(d.clone(), s);
            }
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p == self.dest {
                    // DEST itself: only that it is still a directory of ours.
                    continue;
                }
                match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.is_dir() => stack.push(p),
                    Ok(_) => {
                        if let Some(s) = stamp(&p) {
                            out.insert(p, s);
                        }
                    }
                    Err(_) => {}
                }
            }
        }
        // The top directory's own times change when DEST's do not matter.
        out
    }

    /// Watch the tree at `p` too (from now on).
    pub fn watch(&mut self, p: &Path) {
        self.watched.push(p.to_path_buf());
        self.before = self.snapshot();
    }

    /// Re-take the picture (after the test set DEST up, e.g. a symlink in it).
    pub fn retake(&mut self) {
        self.before = self.snapshot();
    }

    /// What changed outside DEST: paths created, gone, or with another
    /// mode, owner, mtime, size or contents.
    pub fn changes(&self) -> Vec<String> {
        let after = self.snapshot();
        let mut out = Vec::new();
        let rel = |p: &Path| p.strip_prefix(&self.top).unwrap_or(p).display().to_string();
        for (p, s) in &after {
            match self.before.get(p) {
                None => out.push(format!("created outside DEST: {}", rel(p))),
                Some(b) if b != s => out.push(format!(
                    "changed outside DEST: {} (before {b:?}, after {s:?})",
                    rel(p)
                )),
                _ => {}
            }
        }
        for p in self.before.keys() {
            if !after.contains_key(p) {
                out.push(format!("removed outside DEST: {}", rel(p)));
            }
        }
        match std::fs::symlink_metadata(&self.dest) {
            Ok(m) if m.is_dir() => {}
            _ => out.push("DEST is no longer a directory".into()),
        }
        out
    }
}

impl Default for Canary {
    fn default() -> Self {
        Canary::new()
    }
}

// ---------------------------------------------------------------------------
// The tools.

/// One tool run on an image and what it left to look at.
pub struct Outcome {
    /// e.g. "btrkit-restore -m".
    pub tool: String,
    pub run: ToolRun,
    /// Bounds, signals, the image or the canary changed.
    pub problems: Vec<String>,
    /// A restore's canary (its DEST holds what was restored).
    pub canary: Option<Canary>,
    /// A mount's walk.
    pub walk: Option<MountWalk>,
    /// Scratch space the outcome's files live in.
    pub scratch: Option<tempfile::TempDir>,
}

impl Outcome {
    /// The report a `--json` run printed.
    pub fn json(&self) -> serde_json::Value {
        self.run.json()
    }
    /// DEST of a restore.
    pub fn dest(&self) -> Option<&Path> {
        self.canary.as_ref().map(|c| c.dest.as_path())
    }
}

fn bin(name: &str) -> PathBuf {
    crate::bin_path(name)
}

/// `btrkit-restore IMG DEST --json EXTRA...` into a fresh [`Canary`] (or
/// the one given, e.g. with something planted in DEST first).
pub fn restore(img: &Path, extra: &[&str], canary: Option<Canary>) -> Outcome {
    let canary = canary.unwrap_or_default();
    let hash = image_hash(img);
    let mut c = Command::new(bin("btrkit-restore"));
    c.arg(img).arg(&canary.dest).arg("--json").args(extra);
    let what = format!("btrkit-restore {}", extra.join(" "));
    let run = run_tool(c, what.trim());
    let mut problems = run.problems();
    if image_hash(img) != hash {
        problems.push(format!("{}: changed the image", run.what));
    }
    for ch in canary.changes() {
        problems.push(format!("{}: {ch}", run.what));
    }
    Outcome {
        tool: run.what.clone(),
        run,
        problems,
        canary: Some(canary),
        walk: None,
        scratch: None,
    }
}

/// A read-only tool on `img`: `prog ARGS` (the image among them); the
/// image must be unchanged.
pub fn read_only(img: &Path, prog: &str, args: &[&OsStr]) -> Outcome {
    read_only_named(img, prog, args, &[])
}

/// [`read_only`], arguments shown by the names given (`OUT`).
pub fn read_only_named(
    img: &Path,
    prog: &str,
    args: &[&OsStr],
    names: &[(&Path, &str)],
) -> Outcome {
    let hash = image_hash(img);
    let mut c = Command::new(bin(prog));
    c.args(args);
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a == &img.as_os_str() {
                "IMG".to_string()
            } else if let Some((_, n)) = names.iter().find(|(p, _)| p.as_os_str() == *a) {
                n.to_string()
            } else {
                a.to_string_lossy().into_owned()
            }
        })
        .collect();
    let run = run_tool(c, &format!("{prog} {}", shown.join(" ")));
    let mut problems = run.problems();
    if image_hash(img) != hash {
        problems.push(format!("{}: changed the image", run.what));
    }
    Outcome {
        tool: run.what.clone(),
        run,
        problems,
        canary: None,
        walk: None,
        scratch: None,
    }
}

/// `btrkit-replay IMG -o OUT [--salvage] --json`: IMG unchanged.
pub fn replay(img: &Path, salvage: bool) -> Outcome {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("replayed.img");
    let mut args: Vec<&OsStr> = vec![img.as_os_str(), OsStr::new("-o"), out.as_os_str()];
    if salvage {
        args.push(OsStr::new("--salvage"));
    }
    args.push(OsStr::new("--json"));
    let mut o = read_only_named(img, "btrkit-replay", &args, &[(&out, "OUT")]);
    o.scratch = Some(t);
    o
}

/// `btrkit-fsck --repair -y --json COPY` on a copy of the image: bounds
/// and signals only (it writes the copy).
pub fn fsck_repair(img: &Path) -> Outcome {
    let t = tempfile::tempdir().expect("tempdir");
    let copy = t.path().join("copy.img");
    crate::kcrash::copy_sparse(img, &copy).expect("copy image");
    let mut c = Command::new(bin("btrkit-fsck"));
    c.args(["--repair", "-y", "--json"]).arg(&copy);
    let run = run_tool(c, "btrkit-fsck --repair -y --json COPY");
    Outcome {
        tool: run.what.clone(),
        problems: run.problems(),
        run,
        canary: None,
        walk: None,
        scratch: Some(t),
    }
}

/// Quote `b` as a btrkit-shell string ("..." with \xHH escapes).
pub fn shell_quote(b: &[u8]) -> String {
    let mut s = String::from("\"");
    for &c in b {
        if c.is_ascii_alphanumeric() || b"._-/ ".contains(&c) {
            s.push(c as char);
        } else {
            s.push_str(&format!("\\x{c:02x}"));
        }
    }
    s.push('"');
    s
}

/// `btrkit-shell COPY SCRIPT -q` on a copy of the image, the script
/// listing every directory of `dirs` and reading and stat'ing every file
/// of `files` (paths from the root): bounds and signals only (a mount of
/// the copy replays its log and writes it).
pub fn shell(img: &Path, dirs: &[&[u8]], files: &[&[u8]]) -> Outcome {
    let t = tempfile::tempdir().expect("tempdir");
    let copy = t.path().join("copy.img");
    crate::kcrash::copy_sparse(img, &copy).expect("copy image");
    let mut script = String::from("ls /\n");
    for d in dirs {
        script.push_str(&format!("ls {}\n", shell_quote(d)));
    }
    for f in files {
        script.push_str(&format!("stat {q}\nread {q}\n", q = shell_quote(f)));
    }
    let sp = t.path().join("walk.scn");
    std::fs::write(&sp, &script).expect("write script");
    let mut c = Command::new(bin("btrkit-shell"));
    c.arg(&copy).arg(&sp).arg("-q");
    let run = run_tool(c, "btrkit-shell COPY SCRIPT -q");
    Outcome {
        tool: run.what.clone(),
        problems: run.problems(),
        run,
        canary: None,
        walk: None,
        scratch: Some(t),
    }
}

/// One path seen through a mount.
#[derive(Clone, Debug)]
pub struct Seen {
    /// From the mount's root, as bytes ("/a/b").
    pub path: Vec<u8>,
    /// lstat: mode, size, mtime (s, ns), rdev; None when it failed.
    pub stat: Option<(u32, u64, (i64, i64), u64)>,
    /// Contents digest of a regular file, or why it could not be read.
    pub read: Option<Result<Vec<u8>, String>>,
    /// Why lstat or readdir failed.
    pub error: Option<String>,
}

/// What a bounded walk of a btrkit-mount saw.
#[derive(Debug, Default)]
pub struct MountWalk {
    /// Whether the mount came up.
    pub mounted: bool,
    pub entries: Vec<Seen>,
    /// The walk hit [`WALK_MAX_ENTRIES`] or [`WALK_MAX_DEPTH`].
    pub truncated: bool,
    /// The walk passed the time bound (the server was killed to end it).
    pub stuck: bool,
}

impl MountWalk {
    /// The entry at `path` (bytes from the root, "/x").
    pub fn get(&self, path: &[u8]) -> Option<&Seen> {
        self.entries.iter().find(|e| e.path == path)
    }
}

fn walk_tree(root: &Path, deadline: Instant) -> (Vec<Seen>, bool) {
    use std::io::Read;
    let mut out = Vec::new();
    let mut truncated = false;
    let mut stack: Vec<(PathBuf, Vec<u8>, usize)> = vec![(root.to_path_buf(), Vec::new(), 0)];
    while let Some((dir, rel, depth)) = stack.pop() {
        if Instant::now() > deadline {
            truncated = true;
            break;
        }
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                out.push(Seen {
                    path: rel.clone(),
                    stat: None,
                    read: None,
                    error: Some(format!("readdir: {e}")),
                });
                continue;
            }
        };
        for e in rd {
            if out.len() >= WALK_MAX_ENTRIES || Instant::now() > deadline {
                truncated = true;
                break;
            }
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    out.push(Seen {
                        path: rel.clone(),
                        stat: None,
                        read: None,
                        error: Some(format!("readdir entry: {err}")),
                    });
                    break;
                }
            };
            let mut path = rel.clone();
            path.push(b'/');
            path.extend_from_slice(e.file_name().as_bytes());
            let p = e.path();
            let mut seen = Seen {
                path: path.clone(),
                stat: None,
                read: None,
                error: None,
            };
            match std::fs::symlink_metadata(&p) {
                Ok(m) => {
                    seen.stat = Some((m.mode(), m.size(), (m.mtime(), m.mtime_nsec()), m.rdev()));
                    if m.is_dir() {
                        if depth + 1 >= WALK_MAX_DEPTH {
                            truncated = true;
                        } else {
                            stack.push((p.clone(), path.clone(), depth + 1));
                        }
                    } else if m.is_file() {
                        seen.read = Some(
                            std::fs::File::open(&p)
                                .and_then(|f| {
                                    let mut v = Vec::new();
                                    f.take(WALK_MAX_READ).read_to_end(&mut v)?;
                                    Ok(v)
                                })
                                .map(|v| CsumType::Sha256.compute(&v).to_vec())
                                .map_err(|e| e.to_string()),
                        );
                    } else if m.file_type().is_symlink() {
                        let _ = std::fs::read_link(&p);
                    }
                    let _ = xattr_names(&p);
                }
                Err(err) => seen.error = Some(format!("lstat: {err}")),
            }
            out.push(seen);
        }
    }
    (out, truncated)
}

fn xattr_names(p: &Path) -> Vec<u8> {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return Vec::new();
    };
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: a NUL-terminated path and a buffer of the length passed.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Vec::new();
    }
    buf.truncate(n as usize);
    buf
}

/// `btrkit-mount IMG MNT -f EXTRA...` (in the foreground, our child, so
/// its peak memory and signals are seen); every path walked (bounded),
/// then `fusermount3 -u`. A walk stuck past the time bound kills the
/// server (which ends every pending request), and is a problem.
pub fn mount_walk(img: &Path, extra: &[&str]) -> Outcome {
    let t = tempfile::tempdir().expect("tempdir");
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let hash = image_hash(img);
    let what = format!("btrkit-mount -f {}", extra.join(" "));
    let what = what.trim().to_string();
    let mut c = Command::new(bin("btrkit-mount"));
    c.arg(img).arg(&mnt).arg("-f").args(extra);
    let sp = match Spawned::start(c, &what) {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                tool: what.clone(),
                run: ToolRun {
                    what,
                    stderr: e.clone(),
                    ..Default::default()
                },
                problems: vec![e],
                canary: None,
                walk: None,
                scratch: Some(t),
            }
        }
    };
    let start = Instant::now();
    let mut walk = MountWalk::default();
    while start.elapsed() < TOOL_TIME_LIMIT {
        if crate::mount::is_mount_point(&mnt) {
            walk.mounted = true;
            break;
        }
        if !sp.running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut problems = Vec::new();
    if walk.mounted {
        let deadline = start + TOOL_TIME_LIMIT;
        let root = mnt.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let walker = std::thread::spawn(move || {
            let r = walk_tree(&root, deadline);
            let _ = tx.send(());
            r
        });
        let left = deadline.saturating_duration_since(Instant::now());
        if rx.recv_timeout(left + Duration::from_secs(1)).is_err() {
            // Stuck in a request: end the server, which fails them all.
            walk.stuck = true;
            sp.signal(libc::SIGKILL);
            let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).status();
        }
        let (entries, truncated) = walker.join().unwrap_or_default();
        walk.entries = entries;
        walk.truncated = truncated;
        if walk.stuck {
            problems.push(format!(
                "{what}: the walk was still waiting on the mount after {TOOL_TIME_LIMIT:?}"
            ));
        }
        let mut tries = 0;
        loop {
            let o = Command::new("fusermount3")
                .arg("-u")
                .arg(&mnt)
                .stdin(Stdio::null())
                .output();
            tries += 1;
            let ok = o.as_ref().is_ok_and(|o| o.status.success());
            if ok || walk.stuck || tries > 50 || !crate::mount::is_mount_point(&mnt) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if crate::mount::is_mount_point(&mnt) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).status();
        }
    }
    let run = sp.finish(TOOL_TIME_LIMIT + Duration::from_secs(15));
    if walk.stuck {
        // Killed by us: not a crash of its own.
    } else {
        problems.extend(run.problems());
    }
    if image_hash(img) != hash {
        problems.push(format!("{what}: changed the image"));
    }
    Outcome {
        tool: what,
        run,
        problems,
        canary: None,
        walk: Some(walk),
        scratch: Some(t),
    }
}

/// Every tool that reads images, run the standard ways on `img`:
/// restore (plain, `-m`, `--dry-run`), mount (walked), replay (and
/// `--salvage`), dump (super, tree, log), fsck (and `--repair` on a
/// copy), shell (listing `dirs`, reading `files`). Each outcome's
/// `problems` hold the generic failures; the caller checks the rest.
pub fn sweep(img: &Path, dirs: &[&[u8]], files: &[&[u8]]) -> Vec<Outcome> {
    sweep_with(img, dirs, files, &|_| {})
}

/// [`sweep`], each restore's canary set up by `prepare` first (e.g. a
/// victim elsewhere put back and watched).
pub fn sweep_with(
    img: &Path,
    dirs: &[&[u8]],
    files: &[&[u8]],
    prepare: &dyn Fn(&mut Canary),
) -> Vec<Outcome> {
    let i = img.as_os_str();
    let canary = || {
        let mut c = Canary::new();
        prepare(&mut c);
        Some(c)
    };
    let mut v = vec![
        restore(img, &[], canary()),
        restore(img, &["-m"], canary()),
        restore(img, &["--dry-run"], canary()),
    ];
    if crate::mount::fuse_probe().is_ok() {
        v.push(mount_walk(img, &[]));
    } else {
        crate::skip_part("btrkit-mount", "/dev/fuse or fusermount3 missing");
    }
    v.push(replay(img, false));
    v.push(replay(img, true));
    for sub in ["super", "tree", "log"] {
        v.push(read_only(img, "btrkit-dump", &[OsStr::new(sub), i]));
    }
    v.push(read_only(img, "btrkit-fsck", &[OsStr::new("--json"), i]));
    v.push(fsck_repair(img));
    v.push(shell(img, dirs, files));
    v
}

/// Print one line per outcome (visible with --nocapture) and return
/// every generic problem.
pub fn problems_of(label: &str, outs: &[Outcome]) -> Vec<String> {
    let mut p = Vec::new();
    for o in outs {
        eprintln!("[{label}] {}", o.run.summary());
        for x in &o.problems {
            p.push(format!("[{label}] {x}"));
        }
    }
    p
}

/// Entries of a restore report's `lost` as (path, what).
pub fn lost_of(report: &serde_json::Value) -> Vec<(String, String)> {
    report["lost"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| {
                    (
                        l["path"].as_str().unwrap_or("").to_string(),
                        l["what"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every path under `root` (relative, as bytes, "/x"), bounded.
pub fn tree_paths(root: &Path) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    let mut stack = vec![(root.to_path_buf(), Vec::new(), 0usize)];
    while let Some((d, rel, depth)) = stack.pop() {
        if out.len() > WALK_MAX_ENTRIES || depth > WALK_MAX_DEPTH {
            break;
        }
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let mut p: Vec<u8> = rel.clone();
            p.push(b'/');
            p.extend_from_slice(e.file_name().as_bytes());
            if std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir()) {
                stack.push((e.path(), p.clone(), depth + 1));
            }
            out.insert(p);
        }
    }
    out
}

/// Extended attribute names of `p` (not following a symlink).
pub fn xattrs_of(p: &Path) -> Vec<String> {
    xattr_names(p)
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}
