//! A corruption generator for Btrfs image files, after btrfs-progs'
//! `btrfs-corrupt-block`: find a thing through the trees (btrkit-core's
//! superblock, chunk map and tree reading: [`Image`], [`TreeIter`],
//! [`walk_tree`]), change it in its tree block, recompute the block's
//! checksum (unless asked to leave it bad) and write the block to every
//! copy (DUP, mirrors), so that no copy can heal the damage.
//!
//! - [`Corruptor`]: the operations. By tree (an id: 1 the root tree, 3 the
//!   chunk tree, else a ROOT_ITEM's objectid) and key: set a named field
//!   of an item ([`fields`]; inode, file extent, extent item with its
//!   inline refs, block group, dev extent, dev item, chunk, root item,
//!   dir item, ... and raw offsets), delete an item, change its key (in
//!   place, leaving the leaf unsorted if it so falls, or moved to its
//!   sorted place), insert one, change a directory entry's name, change
//!   an item header's offset or size; by block: a header field
//!   (generation, level, owner, bytenr, nritems, ...), shift the item data
//!   of a leaf (btrfs-corrupt-block's `shift_items`), swap two keys; the
//!   superblock's fields on every copy.
//! - [`recipes`]: one recipe per class of btrfs-progs' `tests/fsck-tests`:
//!   given an image and a seed, a random suitable target damaged the way
//!   that class's image is.
//! - [`base`]: the base images the recipes damage, made by mkfs.btrfs and
//!   filled by the kernel.
//!
//! Every image may be hostile: nothing here panics on what it reads (a
//! damaged leaf is refused by the operations that move items), and every
//! loop is bounded by the block's size or the tree's depth.
//!
//! Leaves are edited in place, as btrfs-corrupt-block's `-m`/`-k` do, not
//! copied on write: a block that several trees share (a snapshot's) is
//! damaged in all of them. The recipes pick targets in blocks no other
//! tree shares unless the class is about shared blocks.

pub mod base;
pub mod fields;
pub mod recipes;

use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::tree::{edit, walk_tree, TreeIter, TreeRoot, WalkEvent};
pub use btrkit_core::util::prng::Prng;
use fields::FieldDef;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Most items [`Corruptor::items`] collects from one tree.
pub const MAX_ITEMS: usize = 4_000_000;
/// Most blocks [`Corruptor::blocks`] collects from one tree.
pub const MAX_BLOCKS: usize = 1_000_000;

// ---------------------------------------------------------------------------
// Randomness (deterministic from a seed).

/// A value of `width` bytes other than `old`, drawn from `rng`
/// (btrfs-corrupt-block's `generate_u64` and friends).
pub fn other_than(rng: &mut Prng, old: u64, width: usize) -> u64 {
    let mask = width_mask(width);
    for _ in 0..64 {
        let v = rng.next_u64() & mask;
        if v != old & mask {
            return v;
        }
    }
    (old ^ 1) & mask
}

fn width_mask(width: usize) -> u64 {
    if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    }
}

// ---------------------------------------------------------------------------
// Values.

/// A new value for a field, from the command line or a recipe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// This value.
    Set(u64),
    /// The old value plus this (wrapping at the field's width).
    Add(u64),
    /// The old value minus this (wrapping).
    Sub(u64),
    /// The old value with these bits flipped.
    Xor(u64),
    /// A random value other than the old one (seeded).
    Random(u64),
    /// Bytes, for a byte-array field (uuids) or a raw range.
    Bytes(Vec<u8>),
}

impl Value {
    /// `123`, `0x7b`, `+4096`, `-1`, `^0x8` (flip), `random` or
    /// `random:SEED`, `hex:00ff..` (bytes).
    pub fn parse(s: &str) -> Result<Value, String> {
        let num = |t: &str| -> Result<u64, String> {
            let t = t.trim().replace('_', "");
            if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                u64::from_str_radix(h, 16).map_err(|e| format!("{s:?}: {e}"))
            } else if let Some(neg) = t.strip_prefix('-') {
                neg.parse::<u64>()
                    .map(|v| v.wrapping_neg())
                    .map_err(|e| format!("{s:?}: {e}"))
            } else {
                t.parse::<u64>().map_err(|e| format!("{s:?}: {e}"))
            }
        };
        if s == "random" {
            return Ok(Value::Random(0x5eed));
        }
        if let Some(r) = s.strip_prefix("random:") {
            return Ok(Value::Random(num(r)?));
        }
        if let Some(h) = s.strip_prefix("hex:") {
            let h: String = h.chars().filter(|c| !c.is_whitespace()).collect();
            if !h.len().is_multiple_of(2) {
                return Err(format!("{s:?}: odd number of hex digits"));
            }
            return (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).map_err(|e| format!("{s:?}: {e}")))
                .collect::<Result<Vec<u8>, String>>()
                .map(Value::Bytes);
        }
        if let Some(r) = s.strip_prefix('+') {
            return Ok(Value::Add(num(r)?));
        }
        if let Some(r) = s.strip_prefix('^') {
            return Ok(Value::Xor(num(r)?));
        }
        if let Some(r) = s.strip_prefix('-') {
            return Ok(Value::Sub(num(r)?));
        }
        Ok(Value::Set(num(s)?))
    }

    /// The new integer value of a field of `width` bytes holding `old`.
    pub fn apply(&self, old: u64, width: usize) -> Result<u64, String> {
        let m = width_mask(width);
        Ok(match self {
            Value::Set(v) => {
                if v & !m != 0 {
                    return Err(format!("{v} does not fit {width} bytes"));
                }
                *v
            }
            Value::Add(v) => old.wrapping_add(*v) & m,
            Value::Sub(v) => old.wrapping_sub(*v) & m,
            Value::Xor(v) => (old ^ v) & m,
            Value::Random(seed) => other_than(&mut Prng::new(*seed ^ old), old, width),
            Value::Bytes(_) => return Err("bytes given for an integer field".into()),
        })
    }
}

// ---------------------------------------------------------------------------
// Little-endian access that never panics.

fn get_le(b: &[u8], off: usize, width: usize) -> Option<u64> {
    let s = b.get(off..off.checked_add(width)?)?;
    let mut v = 0u64;
    for (i, x) in s.iter().enumerate().take(8) {
        v |= u64::from(*x) << (8 * i);
    }
    Some(v)
}

fn put_le(b: &mut [u8], off: usize, width: usize, v: u64) -> Option<()> {
    let s = b.get_mut(off..off.checked_add(width)?)?;
    for (i, x) in s.iter_mut().enumerate() {
        *x = if i < 8 { (v >> (8 * i)) as u8 } else { 0 };
    }
    Some(())
}

/// Read field `f` of `body`.
pub fn read_field(body: &[u8], f: &FieldDef) -> Option<u64> {
    if f.is_int() {
        get_le(body, f.off, f.width)
    } else {
        None
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------
// Where things are.

/// One item and where it is.
#[derive(Clone, Debug)]
pub struct Loc {
    /// The tree it was found in.
    pub tree: u64,
    pub key: Key,
    /// Logical address of its leaf.
    pub bytenr: u64,
    pub slot: usize,
    /// Its body as found.
    pub data: Vec<u8>,
    /// Items in its leaf.
    pub leaf_items: usize,
    /// The leaf is the tree's root block.
    pub leaf_is_root: bool,
}

/// One tree block and where it sits.
#[derive(Clone, Debug)]
pub struct BlockInfo {
    pub tree: u64,
    pub bytenr: u64,
    pub level: u8,
    pub nritems: usize,
    pub generation: u64,
    pub owner: u64,
    /// Pointers from the tree's root (0 for the root block).
    pub depth: usize,
    /// The node pointing at it.
    pub parent: Option<u64>,
    /// Free bytes of a leaf (0 for a node or a leaf whose layout is bad).
    pub free: usize,
}

/// How a write goes out.
#[derive(Clone, Copy, Debug)]
pub struct WriteOpts {
    /// Recompute the block's (or superblock's) checksum.
    pub fix_csum: bool,
    /// Write only this copy (0 the first) instead of every copy.
    pub copy: Option<usize>,
}

impl Default for WriteOpts {
    fn default() -> Self {
        WriteOpts {
            fix_csum: true,
            copy: None,
        }
    }
}

/// How [`Corruptor::set_key`] leaves the leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOrder {
    /// The key set in place (as btrfs-corrupt-block's `-K`): the leaf may
    /// be out of order.
    InPlace,
    /// The item moved to the slot its new key sorts to, in its leaf;
    /// refused when the key belongs in another leaf.
    Sorted,
}

/// A directory entry or back reference name change.
#[derive(Clone, Debug)]
pub enum NameEdit {
    /// Its first byte plus one (btrfs-corrupt-block's `-D -f name`),
    /// skipping `/` and NUL.
    Bump,
    /// This name (any length that fits the leaf).
    Set(Vec<u8>),
}

/// Whether a leaf's item headers and data are laid out as the kernel lays
/// them out: every operation that moves items needs that.
pub fn leaf_layout_ok(b: &[u8]) -> Result<(), String> {
    if b.len() <= HEADER_SIZE + ITEM_SIZE {
        return Err("block too small".into());
    }
    if edit::level(b) != 0 {
        return Err("not a leaf".into());
    }
    let n = edit::nritems(b);
    let data_size = b.len() - HEADER_SIZE;
    if n.checked_mul(ITEM_SIZE).is_none_or(|h| h > data_size) {
        return Err(format!("nritems {n} does not fit the leaf"));
    }
    let mut end = data_size;
    for i in 0..n {
        let h = HEADER_SIZE + i * ITEM_SIZE;
        let off = get_le(b, h + 17, 4).unwrap_or(u64::MAX) as usize;
        let size = get_le(b, h + 21, 4).unwrap_or(u64::MAX) as usize;
        if off.checked_add(size) != Some(end) || off < n * ITEM_SIZE {
            return Err(format!(
                "item {i}: data at {off}+{size}, the layout expects it to end at {end}"
            ));
        }
        end = off;
    }
    Ok(())
}

/// Offset of item `slot`'s data in its leaf, and its size, when the
/// header says it lies inside the block.
fn item_span(b: &[u8], slot: usize) -> Option<(usize, usize)> {
    let n = edit::nritems(b).min((b.len().saturating_sub(HEADER_SIZE)) / ITEM_SIZE);
    if slot >= n {
        return None;
    }
    let h = HEADER_SIZE + slot * ITEM_SIZE;
    let off = HEADER_SIZE + get_le(b, h + 17, 4)? as usize;
    let size = get_le(b, h + 21, 4)? as usize;
    (off.checked_add(size)? <= b.len()).then_some((off, size))
}

fn key_of(b: &[u8], slot: usize) -> Option<Key> {
    let stride = if edit::level(b) == 0 {
        ITEM_SIZE
    } else {
        KEY_PTR_SIZE
    };
    let o = HEADER_SIZE + slot * stride;
    Some(Key::new(
        get_le(b, o, 8)?,
        *b.get(o + 8)?,
        get_le(b, o + 9, 8)?,
    ))
}

fn ptr_of(b: &[u8], slot: usize) -> Option<u64> {
    get_le(b, HEADER_SIZE + slot * KEY_PTR_SIZE + 17, 8)
}

fn nr_safe(b: &[u8]) -> usize {
    let stride = if edit::level(b) == 0 {
        ITEM_SIZE
    } else {
        KEY_PTR_SIZE
    };
    edit::nritems(b).min(b.len().saturating_sub(HEADER_SIZE) / stride)
}

// ---------------------------------------------------------------------------
// The corruptor.

/// Edits one image file; see the module documentation.
pub struct Corruptor {
    path: PathBuf,
    file: std::fs::File,
    /// The image as last read (opened again after every write).
    img: Option<Image>,
    /// How writes go out.
    pub opts: WriteOpts,
    /// What was changed, one line each.
    pub changes: Vec<String>,
}

impl Corruptor {
    /// Open an image file read-write.
    pub fn open(path: &Path) -> Result<Corruptor, String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        let mut c = Corruptor {
            path: path.to_path_buf(),
            file,
            img: None,
            opts: WriteOpts::default(),
            changes: Vec::new(),
        };
        c.image()?;
        Ok(c)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The image as it is now: superblock, chunk map and a lenient reader
    /// (damaged blocks are read with their problems).
    pub fn image(&mut self) -> Result<&Image, String> {
        if self.img.is_none() {
            let img = Image::open_path(
                &self.path,
                OpenOptions {
                    lenient: true,
                    trust_bad_csum: true,
                    ..Default::default()
                },
            )
            .map_err(|e| format!("open {}: {e}", self.path.display()))?;
            self.img = Some(img);
        }
        self.img.as_ref().ok_or_else(|| "no image".to_string())
    }

    fn note(&mut self, s: String) {
        self.changes.push(s);
    }

    pub fn nodesize(&mut self) -> Result<usize, String> {
        Ok(self.image()?.nodesize as usize)
    }
    pub fn sectorsize(&mut self) -> Result<u64, String> {
        Ok(self.image()?.sectorsize as u64)
    }
    pub fn csum_type(&mut self) -> Result<CsumType, String> {
        Ok(self.image()?.csum)
    }
    /// The superblock's generation (the last committed transaction).
    pub fn generation(&mut self) -> Result<u64, String> {
        Ok(self.image()?.sb.generation.get())
    }

    /// The root block of tree `tree` (1 the root tree, 3 the chunk tree,
    /// else the newest ROOT_ITEM with that objectid).
    pub fn tree_root(&mut self, tree: u64) -> Result<TreeRoot, String> {
        let img = self.image()?;
        match tree {
            BTRFS_ROOT_TREE_OBJECTID => Ok(img.root_tree()),
            BTRFS_CHUNK_TREE_OBJECTID => Ok(img.chunk_tree()),
            id => img
                .find_root(id)
                .map_err(|e| format!("root item of tree {id}: {e}"))?
                .ok_or_else(|| format!("no tree {id} in the root tree")),
        }
    }

    /// Every item of `tree`, in order, as far as the tree can be read
    /// (an unreadable block ends the list there).
    pub fn items(&mut self, tree: u64) -> Result<Vec<Loc>, String> {
        let root = self.tree_root(tree)?;
        let img = self.image()?;
        let mut it = TreeIter::new(img, root, Key::MIN).map_err(|e| format!("tree {tree}: {e}"))?;
        let mut out = Vec::new();
        while let Some(Ok(item)) = it.next_item() {
            if out.len() >= MAX_ITEMS {
                break;
            }
            let Ok(d) = item.data() else { continue };
            out.push(Loc {
                tree,
                key: item.key,
                bytenr: item.node.bytenr,
                slot: item.slot,
                data: d.to_vec(),
                leaf_items: item.node.nritems(),
                leaf_is_root: item.node.bytenr == root.bytenr,
            });
        }
        Ok(out)
    }

    /// The item of `tree` with exactly `key`.
    pub fn find(&mut self, tree: u64, key: Key) -> Result<Loc, String> {
        let root = self.tree_root(tree)?;
        let img = self.image()?;
        let found = btrkit_core::tree::search::lookup(img, root, key)
            .map_err(|e| format!("tree {tree}: {e}"))?;
        let Some(item) = found else {
            // A search misses a key out of order (a leaf left unsorted by
            // an edit in place): walk the tree for it.
            return self
                .items(tree)?
                .into_iter()
                .find(|l| l.key == key)
                .ok_or_else(|| format!("no item {} in tree {tree}", key_str(&key)));
        };
        let d = item
            .data()
            .map_err(|e| format!("item {}: {e}", key_str(&key)))?;
        Ok(Loc {
            tree,
            key,
            bytenr: item.node.bytenr,
            slot: item.slot,
            data: d.to_vec(),
            leaf_items: item.node.nritems(),
            leaf_is_root: item.node.bytenr == root.bytenr,
        })
    }

    /// Every block of `tree` (depth first), as far as it can be read.
    pub fn blocks(&mut self, tree: u64) -> Result<Vec<BlockInfo>, String> {
        let root = self.tree_root(tree)?;
        let img = self.image()?;
        let mut out = Vec::new();
        let _ = walk_tree(img, root, |ev| {
            if let WalkEvent::Block {
                node, depth, at, ..
            } = ev
            {
                let b = node.bytes();
                out.push(BlockInfo {
                    tree,
                    bytenr: node.bytenr,
                    level: node.level(),
                    nritems: node.nritems(),
                    generation: node.generation(),
                    owner: node.owner(),
                    depth,
                    parent: at.parent,
                    free: if leaf_layout_ok(b).is_ok() {
                        edit::leaf_free(b)
                    } else {
                        0
                    },
                });
                if out.len() >= MAX_BLOCKS {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        });
        Ok(out)
    }

    /// Every copy of tree block `bytenr`: (devid, physical offset).
    fn copies(&mut self, bytenr: u64) -> Result<Vec<(u64, u64)>, String> {
        let img = self.image()?;
        img.block_copy_addrs(bytenr)
            .map_err(|e| format!("block {bytenr}: {e}"))
    }

    /// The raw bytes of tree block `bytenr` (its first copy).
    pub fn read_block(&mut self, bytenr: u64) -> Result<Vec<u8>, String> {
        let ns = self.nodesize()?;
        let img_devid = self.image()?.devid;
        let copies = self.copies(bytenr)?;
        let (devid, phys) = *copies
            .first()
            .ok_or_else(|| format!("block {bytenr} has no copy"))?;
        if devid != img_devid {
            return Err(format!(
                "block {bytenr} is on device {devid}, not this image's"
            ));
        }
        let mut b = vec![0u8; ns];
        self.file
            .read_exact_at(&mut b, phys)
            .map_err(|e| format!("read block {bytenr}: {e}"))?;
        Ok(b)
    }

    /// Write `b` as tree block `bytenr`: checksum recomputed unless the
    /// options say to leave it, on every copy (or the one asked for).
    /// Returns how many copies were written.
    pub fn write_block(&mut self, bytenr: u64, b: &mut [u8]) -> Result<usize, String> {
        let (csum, devid) = {
            let img = self.image()?;
            (img.csum, img.devid)
        };
        if b.len() != self.nodesize()? {
            return Err("block of the wrong size".into());
        }
        if self.opts.fix_csum {
            let c = block_csum(csum, b);
            b[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        }
        let copies = self.copies(bytenr)?;
        let mut n = 0;
        for (i, (d, phys)) in copies.iter().enumerate() {
            if self.opts.copy.is_some_and(|c| c != i) {
                continue;
            }
            if *d != devid {
                return Err(format!(
                    "copy {i} of block {bytenr} is on device {d}: only a single-device image can be written"
                ));
            }
            self.file
                .write_all_at(b, *phys)
                .map_err(|e| format!("write block {bytenr}: {e}"))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("block {bytenr}: no copy written"));
        }
        let _ = self.file.sync_data();
        self.img = None;
        Ok(n)
    }

    /// Read block `bytenr`, change it with `f`, write it back.
    pub fn edit_block<R>(
        &mut self,
        bytenr: u64,
        f: impl FnOnce(&mut Vec<u8>) -> Result<R, String>,
    ) -> Result<R, String> {
        let mut b = self.read_block(bytenr)?;
        let r = f(&mut b)?;
        self.write_block(bytenr, &mut b)?;
        Ok(r)
    }

    /// The path from `tree`'s root to block `target` that a search for
    /// `key` takes: (node, slot) per level above `target`.
    fn path_to(&mut self, tree: u64, target: u64, key: &Key) -> Result<Vec<(u64, usize)>, String> {
        let root = self.tree_root(tree)?;
        let mut cur = root.bytenr;
        let mut path = Vec::new();
        for _ in 0..=BTRFS_MAX_LEVEL {
            if cur == target {
                return Ok(path);
            }
            let b = self.read_block(cur)?;
            if edit::level(&b) == 0 {
                break;
            }
            let n = nr_safe(&b);
            let slot = (0..n)
                .find(|&i| ptr_of(&b, i) == Some(target))
                .or_else(|| {
                    (0..n)
                        .rev()
                        .find(|&i| key_of(&b, i).is_some_and(|k| k <= *key))
                })
                .unwrap_or(0);
            path.push((cur, slot));
            cur = ptr_of(&b, slot).ok_or("node pointer past the block")?;
        }
        Err(format!(
            "block {target} not found on the path to {}",
            key_str(key)
        ))
    }

    /// After slot 0 of block `bytenr` got key `new_first`: the key pointers
    /// above it that name its first key follow.
    fn fix_parent_keys(
        &mut self,
        tree: u64,
        bytenr: u64,
        old_first: &Key,
        new_first: &Key,
    ) -> Result<(), String> {
        let path = self.path_to(tree, bytenr, old_first)?;
        for (node, slot) in path.into_iter().rev() {
            self.edit_block(node, |b| {
                if slot >= nr_safe(b) {
                    return Err("pointer slot past the node".into());
                }
                edit::set_key(b, slot, new_first);
                Ok(())
            })?;
            if slot != 0 {
                break;
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------
    // Item operations.

    /// Set field `name` of the item `key` of `tree` to `v`. Returns the
    /// old and new values as text.
    pub fn set_field(
        &mut self,
        tree: u64,
        key: Key,
        name: &str,
        v: &Value,
    ) -> Result<(String, String), String> {
        let loc = self.find(tree, key)?;
        let f = fields::item_field(&key, &loc.data, name)?;
        self.set_at(&loc, &f, v)
    }

    /// Set `width` bytes at `off` in the item's body (raw, like
    /// btrfs-corrupt-block's `-I --offset --value`).
    pub fn set_raw(
        &mut self,
        tree: u64,
        key: Key,
        off: usize,
        width: usize,
        v: &Value,
    ) -> Result<(String, String), String> {
        let loc = self.find(tree, key)?;
        let f = FieldDef::new(format!("bytes {off}+{width}"), off, width);
        self.set_at(&loc, &f, v)
    }

    /// Set field `f` of the item at `loc`.
    pub fn set_at(
        &mut self,
        loc: &Loc,
        f: &FieldDef,
        v: &Value,
    ) -> Result<(String, String), String> {
        if f.off
            .checked_add(f.width)
            .is_none_or(|e| e > loc.data.len())
        {
            return Err(format!(
                "{} at {}+{} lies past the item's {} bytes",
                f.name,
                f.off,
                f.width,
                loc.data.len()
            ));
        }
        let (slot, key) = (loc.slot, loc.key);
        let res = self.edit_block(loc.bytenr, |b| {
            let (off, size) = item_span(b, slot).ok_or("item lies outside its leaf")?;
            if key_of(b, slot) != Some(key) || f.off + f.width > size {
                return Err("the leaf changed under the edit".to_string());
            }
            let at = off + f.off;
            match v {
                Value::Bytes(bytes) => {
                    if bytes.len() != f.width && f.is_int() {
                        return Err(format!(
                            "{} bytes for a {}-byte field",
                            bytes.len(),
                            f.width
                        ));
                    }
                    let n = bytes.len().min(f.width);
                    let old = hex(&b[at..at + f.width]);
                    b[at..at + n].copy_from_slice(&bytes[..n]);
                    Ok((old, hex(&b[at..at + f.width])))
                }
                _ if !f.is_int() => Err(format!(
                    "{} is {} bytes: give hex:.. bytes",
                    f.name, f.width
                )),
                _ => {
                    let old = get_le(b, at, f.width).ok_or("field outside the block")?;
                    let new = v.apply(old, f.width)?;
                    put_le(b, at, f.width, new).ok_or("field outside the block")?;
                    Ok((old.to_string(), new.to_string()))
                }
            }
        })?;
        self.note(format!(
            "tree {} item {} {}: {} -> {}",
            loc.tree,
            key_str(&loc.key),
            f.name,
            res.0,
            res.1
        ));
        Ok(res)
    }

    /// Fill `len` bytes at `off` of the item's body with `byte`
    /// (btrfs-corrupt-block's `-I --offset --bytes --value`).
    pub fn fill(
        &mut self,
        tree: u64,
        key: Key,
        off: usize,
        len: usize,
        byte: u8,
    ) -> Result<(), String> {
        let loc = self.find(tree, key)?;
        if off.checked_add(len).is_none_or(|e| e > loc.data.len()) {
            return Err(format!(
                "{off}+{len} past the item's {} bytes",
                loc.data.len()
            ));
        }
        self.edit_block(loc.bytenr, |b| {
            let (o, s) = item_span(b, loc.slot).ok_or("item lies outside its leaf")?;
            if off + len > s {
                return Err("the leaf changed under the edit".to_string());
            }
            b[o + off..o + off + len].fill(byte);
            Ok(())
        })?;
        self.note(format!(
            "tree {tree} item {}: bytes {off}+{len} set to {byte:#x}",
            key_str(&key)
        ));
        Ok(())
    }

    /// Delete the item `key` of `tree` from its leaf (the key pointers
    /// above follow when it was the leaf's first). Refused when it would
    /// leave a leaf other than the root empty, or the leaf is damaged.
    pub fn delete(&mut self, tree: u64, key: Key) -> Result<(), String> {
        let loc = self.find(tree, key)?;
        if loc.leaf_items <= 1 && !loc.leaf_is_root {
            return Err(format!(
                "item {} is the only one of leaf {}: deleting it would leave an empty leaf",
                key_str(&key),
                loc.bytenr
            ));
        }
        let slot = loc.slot;
        let new_first = self.edit_block(loc.bytenr, |b| {
            leaf_layout_ok(b).map_err(|e| format!("leaf {}: {e}", loc.bytenr))?;
            if key_of(b, slot) != Some(key) {
                return Err("the leaf changed under the edit".into());
            }
            edit::leaf_delete(b, slot, 1);
            Ok(if slot == 0 && edit::nritems(b) > 0 {
                key_of(b, 0)
            } else {
                None
            })
        })?;
        self.note(format!(
            "tree {tree} item {} deleted (leaf {} slot {slot})",
            key_str(&key),
            loc.bytenr
        ));
        if let Some(nk) = new_first {
            if !loc.leaf_is_root {
                self.fix_parent_keys(tree, loc.bytenr, &key, &nk)?;
            }
        }
        Ok(())
    }

    /// Give the item `key` of `tree` the key `new`: set in place
    /// ([`KeyOrder::InPlace`], the leaf may end up unsorted) or moved to
    /// its sorted slot in the leaf ([`KeyOrder::Sorted`]). The key
    /// pointers above follow a change of the leaf's first key.
    pub fn set_key(
        &mut self,
        tree: u64,
        key: Key,
        new: Key,
        order: KeyOrder,
    ) -> Result<(), String> {
        let loc = self.find(tree, key)?;
        if order == KeyOrder::Sorted {
            // The new key must sort between the neighbours outside the leaf.
            let all = self.items(tree)?;
            let i = all
                .iter()
                .position(|l| l.key == key && l.bytenr == loc.bytenr)
                .ok_or("item not found in the tree walk")?;
            let first = all[..i]
                .iter()
                .rposition(|l| l.bytenr != loc.bytenr)
                .map(|p| &all[p]);
            let next = all[i..].iter().find(|l| l.bytenr != loc.bytenr);
            if first.is_some_and(|p| p.key >= new) || next.is_some_and(|n| n.key <= new) {
                return Err(format!(
                    "key {} belongs in another leaf than {}; set it in place instead",
                    key_str(&new),
                    loc.bytenr
                ));
            }
        }
        let slot = loc.slot;
        let (old_first, new_first) = self.edit_block(loc.bytenr, |b| {
            if key_of(b, slot) != Some(key) {
                return Err("the leaf changed under the edit".to_string());
            }
            let old_first = key_of(b, 0);
            match order {
                KeyOrder::InPlace => edit::set_key(b, slot, &new),
                KeyOrder::Sorted => {
                    leaf_layout_ok(b)?;
                    let (o, s) = item_span(b, slot).ok_or("item outside its leaf")?;
                    let data = b[o..o + s].to_vec();
                    edit::leaf_delete(b, slot, 1);
                    let to = match edit::search(b, &new) {
                        Ok(_) => {
                            return Err(format!("key {} is in the leaf already", key_str(&new)))
                        }
                        Err(s) => s,
                    };
                    edit::leaf_insert(b, to, &new, &data).map_err(|e| e.to_string())?;
                }
            }
            Ok((old_first, key_of(b, 0)))
        })?;
        self.note(format!(
            "tree {tree} item {} key set to {} ({})",
            key_str(&key),
            key_str(&new),
            match order {
                KeyOrder::InPlace => "in place",
                KeyOrder::Sorted => "sorted",
            }
        ));
        if let (Some(o), Some(n)) = (old_first, new_first) {
            if o != n && !loc.leaf_is_root {
                self.fix_parent_keys(tree, loc.bytenr, &o, &n)?;
            }
        }
        Ok(())
    }

    /// Insert an item `key` with body `data` into `tree`, in the leaf and
    /// slot its key sorts to (the following leaf's first slot when the
    /// leaf before is full). Refused when neither has room.
    pub fn insert(&mut self, tree: u64, key: Key, data: &[u8]) -> Result<(), String> {
        let all = self.items(tree)?;
        let pos = all.partition_point(|l| l.key < key);
        if all.get(pos).is_some_and(|l| l.key == key) {
            return Err(format!("tree {tree} has an item {} already", key_str(&key)));
        }
        let mut tries: Vec<(u64, bool)> = Vec::new();
        if pos > 0 {
            tries.push((all[pos - 1].bytenr, false));
        }
        if let Some(n) = all.get(pos) {
            if tries.first().is_none_or(|t| t.0 != n.bytenr) {
                tries.push((n.bytenr, true));
            }
        }
        if all.is_empty() {
            tries.push((self.tree_root(tree)?.bytenr, true));
        }
        let mut last = String::from("no leaf to insert into");
        for (leaf, at_front) in tries {
            let r = self.edit_block(leaf, |b| {
                leaf_layout_ok(b)?;
                let old_first = key_of(b, 0).filter(|_| edit::nritems(b) > 0);
                let slot = match edit::search(b, &key) {
                    Ok(_) => return Err("key present".to_string()),
                    Err(s) => s,
                };
                edit::leaf_insert(b, slot, &key, data).map_err(|e| e.to_string())?;
                Ok((slot, old_first))
            });
            match r {
                Ok((slot, old_first)) => {
                    self.note(format!(
                        "tree {tree} item {} inserted ({} bytes, leaf {leaf} slot {slot})",
                        key_str(&key),
                        data.len()
                    ));
                    if slot == 0 && at_front {
                        if let Some(o) = old_first {
                            let root = self.tree_root(tree)?.bytenr;
                            if root != leaf {
                                self.fix_parent_keys(tree, leaf, &o, &key)?;
                            }
                        }
                    }
                    return Ok(());
                }
                Err(e) => last = format!("leaf {leaf}: {e}"),
            }
        }
        Err(last)
    }

    /// Change the name of the first entry of a DIR_ITEM, DIR_INDEX,
    /// XATTR_ITEM, INODE_REF or INODE_EXTREF item.
    pub fn set_name(&mut self, tree: u64, key: Key, edit_: &NameEdit) -> Result<(), String> {
        let loc = self.find(tree, key)?;
        let d = &loc.data;
        let (len_off, name_off) = match key.ty {
            BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => (27, 30),
            BTRFS_INODE_REF_KEY => (8, 10),
            BTRFS_INODE_EXTREF_KEY => (16, 18),
            BTRFS_ROOT_REF_KEY | BTRFS_ROOT_BACKREF_KEY => (16, 18),
            t => return Err(format!("key type {t} has no name")),
        };
        let old_len = get_le(d, len_off, 2).ok_or("item too short")? as usize;
        let name = d
            .get(name_off..name_off + old_len)
            .ok_or("the name runs past the item")?
            .to_vec();
        let new = match edit_ {
            NameEdit::Bump => {
                let mut n = name.clone();
                let first = n.first_mut().ok_or("empty name")?;
                let mut c = first.wrapping_add(1);
                while c == b'/' || c == 0 {
                    c = c.wrapping_add(1);
                }
                *first = c;
                n
            }
            NameEdit::Set(n) => n.clone(),
        };
        if new.len() > u16::MAX as usize {
            return Err("name too long".into());
        }
        let slot = loc.slot;
        let grow = new.len() as isize - old_len as isize;
        self.edit_block(loc.bytenr, |b| {
            if key_of(b, slot) != Some(key) {
                return Err("the leaf changed under the edit".to_string());
            }
            if grow != 0 {
                leaf_layout_ok(b)?;
                let (o, s) = item_span(b, slot).ok_or("item outside its leaf")?;
                if s < name_off + old_len {
                    return Err("the leaf changed under the edit".to_string());
                }
                let mut body = b[o..o + s].to_vec();
                body.splice(name_off..name_off + old_len, new.iter().copied());
                put_le(&mut body, len_off, 2, new.len() as u64);
                edit::leaf_resize(b, slot, body.len()).map_err(|e| e.to_string())?;
                let (o, s) = item_span(b, slot).ok_or("item outside its leaf")?;
                b[o..o + s].copy_from_slice(&body);
            } else {
                let (o, s) = item_span(b, slot).ok_or("item outside its leaf")?;
                if s < name_off + new.len() {
                    return Err("the leaf changed under the edit".to_string());
                }
                b[o + name_off..o + name_off + new.len()].copy_from_slice(&new);
            }
            Ok(())
        })?;
        self.note(format!(
            "tree {tree} item {} name {:?} -> {:?}",
            key_str(&key),
            String::from_utf8_lossy(&name),
            String::from_utf8_lossy(&new)
        ));
        Ok(())
    }

    /// Reorder an extent item's inline references: `order[i]` is the index
    /// (in item order) of the ref that goes to place i.
    pub fn reorder_inline_refs(&mut self, key: Key, order: &[usize]) -> Result<(), String> {
        use btrkit_core::format::extent::{parse_extent_item, write_inline_refs};
        let tree = BTRFS_EXTENT_TREE_OBJECTID;
        let loc = self.find(tree, key)?;
        let view = parse_extent_item(&key, &loc.data).map_err(|e| e.to_string())?;
        let refs = view.refs.clone();
        let mut seen = vec![false; refs.len()];
        if order.len() != refs.len()
            || order
                .iter()
                .any(|&i| i >= refs.len() || std::mem::replace(&mut seen[i], true))
        {
            return Err(format!("{order:?} is not an order of {} refs", refs.len()));
        }
        let head: usize = loc.data.len() - refs.iter().map(|r| r.inline_size()).sum::<usize>();
        let mut body = loc.data[..head].to_vec();
        let reordered: Vec<_> = order.iter().map(|&i| refs[i]).collect();
        write_inline_refs(&mut body, &reordered);
        if body.len() != loc.data.len() {
            return Err("inline refs re-encoded to another size".into());
        }
        let slot = loc.slot;
        self.edit_block(loc.bytenr, |b| {
            let (o, s) = item_span(b, slot).ok_or("item outside its leaf")?;
            if s != body.len() || key_of(b, slot) != Some(key) {
                return Err("the leaf changed under the edit".to_string());
            }
            b[o..o + s].copy_from_slice(&body);
            Ok(())
        })?;
        self.note(format!(
            "extent item {} inline refs reordered {order:?}",
            key_str(&key)
        ));
        Ok(())
    }

    /// Set an item header's `offset` or `size` (btrfs-corrupt-block's
    /// `-I -f offset`), of the item in `slot` of leaf `bytenr`.
    pub fn set_item_header(
        &mut self,
        bytenr: u64,
        slot: usize,
        field: &str,
        v: &Value,
    ) -> Result<(String, String), String> {
        let f = fields::by_name(&fields::item_header_fields(), field, "item header")?;
        let res = self.edit_block(bytenr, |b| {
            if edit::level(b) != 0 || slot >= nr_safe(b) {
                return Err(format!("block {bytenr} has no item in slot {slot}"));
            }
            let at = HEADER_SIZE + slot * ITEM_SIZE + f.off;
            let old = get_le(b, at, f.width).ok_or("outside the block")?;
            let new = v.apply(old, f.width)?;
            put_le(b, at, f.width, new).ok_or("outside the block")?;
            Ok((old.to_string(), new.to_string()))
        })?;
        self.note(format!(
            "leaf {bytenr} slot {slot} item {field}: {} -> {}",
            res.0, res.1
        ));
        Ok(res)
    }

    /// Set a tree block header field (generation, level, owner, bytenr,
    /// nritems, flags, ...).
    pub fn set_header(
        &mut self,
        bytenr: u64,
        field: &str,
        v: &Value,
    ) -> Result<(String, String), String> {
        let f = fields::by_name(&fields::header_fields(), field, "header")?;
        let res = self.edit_block(bytenr, |b| match v {
            Value::Bytes(bytes) if !f.is_int() => {
                let n = bytes.len().min(f.width);
                let old = hex(&b[f.off..f.off + f.width]);
                b[f.off..f.off + n].copy_from_slice(&bytes[..n]);
                Ok((old, hex(&b[f.off..f.off + f.width])))
            }
            _ => {
                let old = get_le(b, f.off, f.width).ok_or("outside the block")?;
                let new = v.apply(old, f.width)?;
                put_le(b, f.off, f.width, new).ok_or("outside the block")?;
                Ok((old.to_string(), new.to_string()))
            }
        })?;
        self.note(format!(
            "block {bytenr} header {field}: {} -> {}",
            res.0, res.1
        ));
        Ok(res)
    }

    /// btrfs-corrupt-block's `shift_items`: the data of the second half of
    /// a leaf's items moved down by half the leaf's free space, their
    /// offsets following, so a gap opens between the halves.
    pub fn shift_items(&mut self, bytenr: u64) -> Result<usize, String> {
        let shift = self.edit_block(bytenr, |b| {
            leaf_layout_ok(b)?;
            let n = edit::nritems(b);
            let free = edit::leaf_free(b);
            let shift = free / 2;
            if n < 2 || shift == 0 {
                return Err(format!(
                    "leaf {bytenr}: {n} items, {free} bytes free: nothing to shift"
                ));
            }
            let slot = n / 2;
            let off = |b: &[u8], i: usize| {
                get_le(b, HEADER_SIZE + i * ITEM_SIZE + 17, 4).unwrap_or(0) as usize
            };
            let data_end = off(b, n - 1);
            let upto = off(b, slot - 1);
            b.copy_within(
                HEADER_SIZE + data_end..HEADER_SIZE + upto,
                HEADER_SIZE + data_end - shift,
            );
            for i in slot..n {
                let o = off(b, i) - shift;
                put_le(b, HEADER_SIZE + i * ITEM_SIZE + 17, 4, o as u64);
            }
            Ok(shift)
        })?;
        self.note(format!(
            "leaf {bytenr}: items' data from the middle on shifted down {shift} bytes"
        ));
        Ok(shift)
    }

    /// Swap the keys of two slots of a block (btrfs-corrupt-block's `-k`
    /// copies one over the other; a swap keeps both keys present).
    pub fn swap_keys(&mut self, bytenr: u64, a: usize, b_: usize) -> Result<(), String> {
        self.edit_block(bytenr, |b| {
            let n = nr_safe(b);
            if a >= n || b_ >= n {
                return Err(format!("block {bytenr} has {n} slots"));
            }
            let ka = key_of(b, a).ok_or("slot outside the block")?;
            let kb = key_of(b, b_).ok_or("slot outside the block")?;
            edit::set_key(b, a, &kb);
            edit::set_key(b, b_, &ka);
            Ok(())
        })?;
        self.note(format!(
            "block {bytenr}: keys of slots {a} and {b_} swapped"
        ));
        Ok(())
    }

    /// Overwrite `len` bytes of data at `logical` with random bytes on
    /// every copy (or the one asked for); data checksums left as they are.
    pub fn corrupt_data(&mut self, logical: u64, len: u64, seed: u64) -> Result<(), String> {
        if len == 0 || len > 64 << 20 {
            return Err("length must be 1 byte to 64 MiB".into());
        }
        let (pieces, devid) = {
            let img = self.image()?;
            (
                img.chunks
                    .pieces(logical, len)
                    .map_err(|e| format!("data at {logical}: {e}"))?,
                img.devid,
            )
        };
        let mut rng = Prng::new(seed);
        for p in pieces {
            for (i, (d, phys)) in p.copies.iter().enumerate() {
                if self.opts.copy.is_some_and(|c| c != i) || *d != devid {
                    continue;
                }
                let bytes: Vec<u8> = (0..p.len).map(|_| rng.next_u64() as u8).collect();
                self.file
                    .write_all_at(&bytes, *phys)
                    .map_err(|e| format!("write data: {e}"))?;
            }
        }
        let _ = self.file.sync_data();
        self.img = None;
        self.note(format!("data {logical}+{len} overwritten"));
        Ok(())
    }

    /// Set a superblock field on every copy the device holds (or the one
    /// asked for with `copy`), checksum recomputed unless asked not to.
    pub fn set_super(&mut self, field: &str, v: &Value) -> Result<(String, String), String> {
        let f = fields::by_name(&fields::super_fields(), field, "superblock")?;
        let size = self.file.metadata().map_err(|e| e.to_string())?.len();
        let mut res = None;
        for m in 0..BTRFS_SUPER_MIRROR_MAX {
            if self.opts.copy.is_some_and(|c| c != m) {
                continue;
            }
            let off = btrfs_sb_offset(m);
            if off + BTRFS_SUPER_INFO_SIZE as u64 > size {
                break;
            }
            let mut b = vec![0u8; BTRFS_SUPER_INFO_SIZE];
            self.file
                .read_exact_at(&mut b, off)
                .map_err(|e| format!("read superblock {m}: {e}"))?;
            if get_le(&b, 0x40, 8) != Some(BTRFS_MAGIC) {
                continue;
            }
            let r = match v {
                Value::Bytes(bytes) if !f.is_int() => {
                    let n = bytes.len().min(f.width);
                    let old = hex(&b[f.off..f.off + f.width]);
                    b[f.off..f.off + n].copy_from_slice(&bytes[..n]);
                    (old, hex(&b[f.off..f.off + f.width]))
                }
                _ => {
                    let old = get_le(&b, f.off, f.width).ok_or("outside the superblock")?;
                    let new = v.apply(old, f.width)?;
                    put_le(&mut b, f.off, f.width, new).ok_or("outside the superblock")?;
                    (old.to_string(), new.to_string())
                }
            };
            if self.opts.fix_csum {
                let t = get_le(&b, 0xc4, 2).unwrap_or(0) as u16;
                let ty = CsumType::from_disk(t).map_err(|e| e.to_string())?;
                let c = ty.compute(&b[BTRFS_CSUM_SIZE..]);
                b[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
            }
            self.file
                .write_all_at(&b, off)
                .map_err(|e| format!("write superblock {m}: {e}"))?;
            res.get_or_insert(r);
        }
        let _ = self.file.sync_data();
        self.img = None;
        let r = res.ok_or("no superblock copy written")?;
        self.note(format!("superblock {field}: {} -> {}", r.0, r.1));
        Ok(r)
    }

    /// A superblock field's value (copy 0).
    pub fn super_field(&mut self, field: &str) -> Result<u64, String> {
        let f = fields::by_name(&fields::super_fields(), field, "superblock")?;
        let mut b = vec![0u8; BTRFS_SUPER_INFO_SIZE];
        self.file
            .read_exact_at(&mut b, BTRFS_SUPER_INFO_OFFSET)
            .map_err(|e| format!("read superblock: {e}"))?;
        read_field(&b, &f).ok_or_else(|| format!("{field} is not an integer"))
    }
}

/// A key as `(objectid TYPE offset)`, as btrfs-progs prints it.
pub fn key_str(k: &Key) -> String {
    btrkit_core::format::names::key_string(k)
}

/// Parse a key: `OBJECTID,TYPE,OFFSET` (or spaces, or parentheses), with
/// TYPE a number or a name (`INODE_ITEM`, `EXTENT_DATA`, ...) and
/// OBJECTID/OFFSET numbers (`0x`, negative for the -N objectids, `-1`
/// for u64::MAX).
pub fn parse_key(s: &str) -> Result<Key, String> {
    let parts: Vec<&str> = s
        .trim_matches(|c| c == '(' || c == ')')
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .collect();
    if parts.len() != 3 {
        return Err(format!("{s:?}: a key is OBJECTID,TYPE,OFFSET"));
    }
    let num = |t: &str| -> Result<u64, String> {
        match Value::parse(t)? {
            Value::Set(v) => Ok(v),
            Value::Sub(v) => Ok(v.wrapping_neg()),
            _ => Err(format!("{t:?} is not a number")),
        }
    };
    let ty = match num(parts[1]) {
        Ok(v) if v <= 255 => v as u8,
        Ok(v) => return Err(format!("key type {v} is more than 255")),
        Err(_) => {
            let want = parts[1].to_ascii_uppercase();
            let want = want.trim_end_matches("_KEY");
            (0..=255u8)
                .find(|&t| btrkit_core::format::names::key_type_name(0, t) == Some(want))
                .ok_or_else(|| format!("unknown key type {:?}", parts[1]))?
        }
    };
    Ok(Key::new(num(parts[0])?, ty, num(parts[2])?))
}

/// Parse a tree: a number or a name as `btrkit-dump --tree` takes it
/// (`root`, `extent`, `chunk`, `dev`, `fs`, `csum`, `free-space`, ...).
pub fn parse_tree(s: &str) -> Result<u64, String> {
    btrkit_core::format::names::parse_tree_name(s).ok_or_else(|| format!("unknown tree {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(Value::parse("12").unwrap().apply(5, 8).unwrap(), 12);
        assert_eq!(Value::parse("+1").unwrap().apply(5, 8).unwrap(), 6);
        assert_eq!(Value::parse("-1").unwrap().apply(0, 1).unwrap(), 255);
        assert_eq!(Value::parse("^0x40").unwrap().apply(1, 8).unwrap(), 0x41);
        assert!(Value::parse("256").unwrap().apply(0, 1).is_err());
        let r = Value::parse("random:3").unwrap();
        assert_ne!(r.apply(7, 4).unwrap(), 7);
        assert!(r.apply(7, 4).unwrap() <= u32::MAX as u64);
        assert_eq!(
            Value::parse("hex:00ff").unwrap(),
            Value::Bytes(vec![0, 255])
        );
    }

    #[test]
    fn keys() {
        assert_eq!(
            parse_key("257,INODE_ITEM,0").unwrap(),
            Key::new(257, BTRFS_INODE_ITEM_KEY, 0)
        );
        assert_eq!(
            parse_key("(-5 ORPHAN_ITEM 258)").unwrap(),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 258)
        );
        assert_eq!(
            parse_key("256,108,0x1000").unwrap(),
            Key::new(256, BTRFS_EXTENT_DATA_KEY, 4096)
        );
        assert!(parse_key("1,NOPE,0").is_err());
        assert!(parse_key("1,2").is_err());
    }

    #[test]
    fn layout_check_refuses_garbage() {
        let mut b = vec![0u8; 4096];
        assert!(leaf_layout_ok(&b).is_ok());
        put_le(&mut b, 96, 4, 1_000_000);
        assert!(leaf_layout_ok(&b).is_err());
        put_le(&mut b, 96, 4, 1);
        put_le(&mut b, HEADER_SIZE + 17, 4, 4096 - HEADER_SIZE as u64 - 10);
        put_le(&mut b, HEADER_SIZE + 21, 4, 10);
        assert!(leaf_layout_ok(&b).is_ok());
        put_le(&mut b, HEADER_SIZE + 21, 4, 11);
        assert!(leaf_layout_ok(&b).is_err());
        assert!(item_span(&b, 5).is_none());
    }
}
