//! One recipe per class of btrfs-progs' `tests/fsck-tests`: given an image
//! and a seed, pick a random suitable target and damage it the way that
//! class's image is damaged (the class name starts with the number of the
//! fsck-test it follows). Targets in subvolume trees are taken from blocks
//! no other tree shares (a snapshot's), so the damage is in one tree,
//! as btrfs-corrupt-block's copy-on-write edits leave it.
//!
//! A recipe that finds no target in the image says so
//! ([`RecipeError::NoTarget`]): the base lacks what the class needs (a
//! deleted subvolume, an extent with two inline references, ...).

use super::fields::{self, FieldDef};
use super::{key_str, other_than, Corruptor, KeyOrder, Loc, NameEdit, Prng, Value};
use btrkit_core::format::consts::*;
use btrkit_core::format::extent::parse_extent_item;
use btrkit_core::format::file_extent::{parse_file_extent, FileExtent};
use btrkit_core::format::inode::InodeItem;
use btrkit_core::format::key::Key;
use btrkit_core::format::root::RootItem;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

const MIB: u64 = 1 << 20;
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

/// Why a recipe did not damage the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecipeError {
    /// The image has nothing this class can damage.
    NoTarget(String),
    /// The edit failed.
    Failed(String),
}

impl std::fmt::Display for RecipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecipeError::NoTarget(s) => write!(f, "no target: {s}"),
            RecipeError::Failed(s) => write!(f, "failed: {s}"),
        }
    }
}

impl From<String> for RecipeError {
    fn from(s: String) -> Self {
        RecipeError::Failed(s)
    }
}

type R<T> = Result<T, RecipeError>;

fn none(what: &str) -> RecipeError {
    RecipeError::NoTarget(what.to_string())
}

/// A recipe: its class, what it does, and the function.
pub struct Recipe {
    /// `NNN-name`, after btrfs-progs' fsck-test NNN.
    pub class: &'static str,
    /// One line: the damage.
    pub what: &'static str,
    run: fn(&mut Corruptor, &Inventory, &mut Prng) -> R<String>,
}

/// What a recipe did.
#[derive(Clone, Debug)]
pub struct Applied {
    pub class: String,
    pub seed: u64,
    /// The target, in words.
    pub target: String,
    /// Each change made, in order.
    pub changes: Vec<String>,
}

/// Every recipe, in fsck-test order.
pub fn recipes() -> &'static [Recipe] {
    RECIPES
}

/// The recipe of class `class` (its full name, or its number when that is
/// unique).
pub fn recipe(class: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.class == class).or_else(|| {
        let m: Vec<_> = RECIPES
            .iter()
            .filter(|r| r.class.starts_with(&format!("{class}-")))
            .collect();
        (m.len() == 1).then(|| m[0])
    })
}

/// Apply recipe `class` to the image file `image` with `seed`.
pub fn apply(image: &Path, class: &str, seed: u64) -> R<Applied> {
    let r = recipe(class).ok_or_else(|| RecipeError::Failed(format!("no recipe {class:?}")))?;
    let mut c = Corruptor::open(image)?;
    let inv = Inventory::of(&mut c)?;
    let mut rng = Prng::new(seed ^ fnv(r.class));
    let target = (r.run)(&mut c, &inv, &mut rng)?;
    Ok(Applied {
        class: r.class.to_string(),
        seed,
        target,
        changes: std::mem::take(&mut c.changes),
    })
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------
// What the image holds.

/// An inode found in a subvolume tree.
#[derive(Clone, Debug)]
pub struct InodeInfo {
    pub item: InodeItem,
    pub loc: Loc,
}

impl InodeInfo {
    pub fn mode(&self) -> u32 {
        self.item.mode.get()
    }
    pub fn is(&self, fmt: u32) -> bool {
        self.mode() & S_IFMT == fmt
    }
}

/// The image as the recipes see it.
pub struct Inventory {
    /// Superblock generation, sector size.
    pub generation: u64,
    pub sectorsize: u64,
    /// Live subvolume trees (5 and every ROOT_ITEM with references).
    pub fs_trees: Vec<u64>,
    /// Subvolumes deleted and not yet dropped (ROOT_ITEM with no
    /// references).
    pub dead_roots: Vec<u64>,
    /// Blocks reachable from more than one subvolume tree.
    pub shared: HashSet<u64>,
    /// Every item of the live subvolume trees.
    pub fs_items: Vec<Loc>,
    /// (tree, inode) -> its inode item.
    pub inodes: BTreeMap<(u64, u64), InodeInfo>,
    /// The root tree's items.
    pub root_items: Vec<Loc>,
}

impl Inventory {
    pub fn of(c: &mut Corruptor) -> R<Inventory> {
        let generation = c.generation()?;
        let sectorsize = c.sectorsize()?.max(512);
        let root_items = c.items(BTRFS_ROOT_TREE_OBJECTID)?;
        let mut fs_trees = Vec::new();
        let mut dead_roots = Vec::new();
        for l in &root_items {
            let id = l.key.objectid;
            if l.key.ty != BTRFS_ROOT_ITEM_KEY
                || !(id == BTRFS_FS_TREE_OBJECTID
                    || (BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&id))
            {
                continue;
            }
            let Ok(ri) = RootItem::parse(&l.data) else {
                continue;
            };
            if ri.refs.get() == 0 && id != BTRFS_FS_TREE_OBJECTID {
                dead_roots.push(id);
            } else if !fs_trees.contains(&id) {
                fs_trees.push(id);
            }
        }
        let mut count: HashMap<u64, usize> = HashMap::new();
        for &t in fs_trees.iter().chain(dead_roots.iter()) {
            for b in c.blocks(t).unwrap_or_default() {
                *count.entry(b.bytenr).or_default() += 1;
            }
        }
        let shared = count
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(b, _)| b)
            .collect();
        let mut fs_items = Vec::new();
        for &t in &fs_trees {
            fs_items.extend(c.items(t).unwrap_or_default());
        }
        let mut inodes = BTreeMap::new();
        for l in &fs_items {
            if l.key.ty == BTRFS_INODE_ITEM_KEY && l.data.len() >= 160 {
                inodes.insert(
                    (l.tree, l.key.objectid),
                    InodeInfo {
                        item: btrkit_core::format::read_lenient::<InodeItem>(&l.data),
                        loc: l.clone(),
                    },
                );
            }
        }
        Ok(Inventory {
            generation,
            sectorsize,
            fs_trees,
            dead_roots,
            shared,
            fs_items,
            inodes,
            root_items,
        })
    }

    /// The item's leaf is no other tree's.
    pub fn own(&self, l: &Loc) -> bool {
        !self.shared.contains(&l.bytenr)
    }

    /// The inode an item of a subvolume tree belongs to.
    pub fn inode_of(&self, l: &Loc) -> Option<&InodeInfo> {
        self.inodes.get(&(l.tree, l.key.objectid))
    }

    fn items_of(&self, ty: u8) -> impl Iterator<Item = &Loc> {
        self.fs_items
            .iter()
            .filter(move |l| l.key.ty == ty && self.own(l))
    }
}

/// Deleting the item leaves its leaf with items (or it is the root).
fn deletable(l: &Loc) -> bool {
    l.leaf_items > 1 || l.leaf_is_root
}

fn field(l: &Loc, name: &str) -> R<FieldDef> {
    fields::item_field(&l.key, &l.data, name).map_err(RecipeError::Failed)
}

fn value(l: &Loc, name: &str) -> R<u64> {
    let f = field(l, name)?;
    super::read_field(&l.data, &f).ok_or_else(|| RecipeError::Failed(format!("{name} unreadable")))
}

fn set(c: &mut Corruptor, l: &Loc, name: &str, v: u64) -> R<()> {
    let f = field(l, name)?;
    c.set_at(l, &f, &Value::Set(v))?;
    Ok(())
}

fn pick<'a>(rng: &mut Prng, v: &'a [&'a Loc], what: &str) -> R<&'a Loc> {
    rng.pick(v).copied().ok_or_else(|| none(what))
}

/// (disk_bytenr, disk_num_bytes, type) of a regular or prealloc extent.
fn disk_extent(l: &Loc) -> Option<(u64, u64, u8)> {
    match parse_file_extent(&l.data).ok()? {
        FileExtent::Disk { item, .. } => Some((
            item.disk_bytenr.get(),
            item.disk_num_bytes.get(),
            item.type_,
        )),
        FileExtent::Inline { .. } => None,
    }
}

/// A directory entry's (name, location key) when the item holds exactly
/// one entry.
fn single_entry(l: &Loc) -> Option<(Vec<u8>, Key)> {
    let d = &l.data;
    let loc = Key::new(super::get_le(d, 0, 8)?, *d.get(8)?, super::get_le(d, 9, 8)?);
    let data_len = super::get_le(d, 25, 2)? as usize;
    let name_len = super::get_le(d, 27, 2)? as usize;
    (30 + name_len + data_len == d.len()).then(|| (d[30..30 + name_len].to_vec(), loc))
}

fn loc_desc(l: &Loc) -> String {
    format!(
        "tree {} item {} (leaf {})",
        l.tree,
        key_str(&l.key),
        l.bytenr
    )
}

/// The end of the highest chunk: addresses from here on are in none.
fn chunks_end(c: &mut Corruptor) -> R<u64> {
    let img = c.image()?;
    Ok(img
        .chunks
        .iter()
        .map(|m| m.logical.saturating_add(m.length))
        .max()
        .unwrap_or(0))
}

fn dev_item(c: &mut Corruptor) -> R<Loc> {
    let devid = c.image()?.devid;
    Ok(c.find(
        BTRFS_CHUNK_TREE_OBJECTID,
        Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid),
    )?)
}

fn extent_items(c: &mut Corruptor) -> R<Vec<Loc>> {
    Ok(c.items(BTRFS_EXTENT_TREE_OBJECTID)?
        .into_iter()
        .filter(|l| matches!(l.key.ty, BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY))
        .collect())
}

// ---------------------------------------------------------------------------
// The recipes.

const RECIPES: &[Recipe] = &[
    Recipe {
        class: "001-bad-file-extent-bytenr",
        what: "a regular file extent's disk_bytenr set to an unaligned value outside every chunk",
        run: bad_bytenr_garbage,
    },
    Recipe {
        class: "001-bad-file-extent-bytenr-free",
        what: "a regular file extent's disk_bytenr moved to free space in a data block group (an extent nothing references)",
        run: bad_bytenr_free,
    },
    Recipe {
        class: "002-bad-transid",
        what: "a subvolume tree block (not a root) given a garbage header generation, checksum recomputed",
        run: bad_transid,
    },
    Recipe {
        class: "003-shift-offsets",
        what: "the item data of a leaf's second half shifted down by half its free space (btrfs-corrupt-block shift_items)",
        run: shift_offsets,
    },
    Recipe {
        class: "004-no-dir-index",
        what: "a directory entry's DIR_INDEX deleted",
        run: no_dir_index,
    },
    Recipe {
        class: "005-bad-item-offset",
        what: "a subvolume tree item's header offset set to garbage or moved a few bytes",
        run: bad_item_offset,
    },
    Recipe {
        class: "008-bad-dir-index-name",
        what: "a DIR_INDEX name's first byte changed",
        run: bad_dir_index_name,
    },
    Recipe {
        class: "009-no-dir-item-or-index",
        what: "a directory entry's DIR_ITEM and DIR_INDEX deleted (its INODE_REF left)",
        run: no_dir_item_or_index,
    },
    Recipe {
        class: "010-no-rootdir-inode-item",
        what: "a subvolume's root directory INODE_ITEM deleted",
        run: no_rootdir_inode_item,
    },
    Recipe {
        class: "011-no-inode-item",
        what: "a file's or directory's INODE_ITEM deleted",
        run: no_inode_item,
    },
    Recipe {
        class: "016-wrong-inode-nbytes",
        what: "a regular file's nbytes off by whole sectors",
        run: wrong_inode_nbytes,
    },
    Recipe {
        class: "017-missing-all-file-extent",
        what: "every EXTENT_DATA of a regular file deleted",
        run: missing_all_file_extents,
    },
    Recipe {
        class: "026-bad-dir-item-name",
        what: "a DIR_ITEM name's first byte changed (the name no longer hashes to its key)",
        run: bad_dir_item_name,
    },
    Recipe {
        class: "027-bad-extent-inline-ref-type",
        what: "an extent item's inline reference given an unknown type",
        run: bad_inline_ref_type,
    },
    Recipe {
        class: "034-bad-inode-flags",
        what: "a symlink given the immutable flag",
        run: bad_inode_flags,
    },
    Recipe {
        class: "035-inline-bad-ram-bytes",
        what: "an uncompressed inline extent's ram_bytes one more than its data",
        run: inline_ram_bytes,
    },
    Recipe {
        class: "036-bad-dev-extents",
        what: "a dev extent past the device's end (its length grown, or the device's size cut below it)",
        run: dev_extent_past_end,
    },
    Recipe {
        class: "038-missing-one-file-extent",
        what: "one EXTENT_DATA (not the last) of a file with several deleted",
        run: missing_one_file_extent,
    },
    Recipe {
        class: "039-bad-inode-mode",
        what: "a subvolume tree inode's mode given a file type that does not exist",
        run: bad_inode_mode,
    },
    Recipe {
        class: "041-invalid-root-generation",
        what: "a subvolume's root item and root block given a generation ahead of the superblock's",
        run: root_generation_ahead,
    },
    Recipe {
        class: "043-bad-inode-generation",
        what: "an inode's generation or transid ahead of the superblock's",
        run: inode_generation_ahead,
    },
    Recipe {
        class: "044-invalid-extent-item-generation",
        what: "a data or tree block extent item's generation ahead of the superblock's",
        run: extent_generation_ahead,
    },
    Recipe {
        class: "045-overlap-csum-item",
        what: "a checksum item inserted over the last sectors of another (same checksums)",
        run: overlapping_csum,
    },
    Recipe {
        class: "047-dev-bytes-used",
        what: "the device item's bytes_used (chunk tree and superblock copy) off by whole MiB",
        run: dev_bytes_used,
    },
    Recipe {
        class: "050-invalid-block-group-used",
        what: "a block group item's used bytes off by whole sectors, or more than its length",
        run: block_group_used,
    },
    Recipe {
        class: "051-invalid-super-bytes-used",
        what: "the superblock's bytes_used off by whole sectors (every copy)",
        run: super_bytes_used,
    },
    Recipe {
        class: "053-bad-metadata-level",
        what: "a leaf's extent item given level 255",
        run: bad_metadata_level,
    },
    Recipe {
        class: "055-super-num-devs-mismatch",
        what: "the superblock's num_devices wrong (every copy)",
        run: super_num_devices,
    },
    Recipe {
        class: "058-bad-free-space-tree-entry",
        what: "a free space tree extent shortened, lengthened or deleted",
        run: free_space_entry,
    },
    Recipe {
        class: "061-out-of-order-inline-backref",
        what: "an extent item's inline references (two or more) put in reverse order",
        run: inline_refs_out_of_order,
    },
    Recipe {
        class: "066-missing-root-orphan-item",
        what: "the orphan item of a deleted, not yet dropped subvolume deleted",
        run: missing_root_orphan,
    },
    Recipe {
        class: "068-orphan-dev-extent",
        what: "a dev extent of no chunk added in free device space (device bytes_used counting it)",
        run: orphan_dev_extent,
    },
    Recipe {
        class: "070-missing-inode-ref",
        what: "a regular file's only INODE_REF deleted",
        run: missing_inode_ref,
    },
];

fn bad_bytenr_garbage(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_EXTENT_DATA_KEY)
        .filter(|l| disk_extent(l).is_some_and(|(b, _, _)| b != 0))
        .collect();
    let t = pick(rng, &cands, "no regular file extent")?;
    let end = chunks_end(c)?;
    let ss = inv.sectorsize.max(2);
    let v = end.saturating_add(rng.between(1, 1 << 40)) & !(ss - 1) | rng.between(1, ss - 1);
    set(c, t, "disk_bytenr", v)?;
    Ok(format!("{}: disk_bytenr {v}", loc_desc(t)))
}

fn bad_bytenr_free(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_EXTENT_DATA_KEY)
        .filter(|l| disk_extent(l).is_some_and(|(b, _, _)| b != 0))
        .collect();
    let t = pick(rng, &cands, "no regular file extent")?;
    let (old, len, _) = disk_extent(t).ok_or_else(|| none("not a disk extent"))?;
    let ss = inv.sectorsize;
    let data: Vec<(u64, u64)> = c
        .image()?
        .chunks
        .iter()
        .filter(|m| m.type_flags & BTRFS_BLOCK_GROUP_DATA != 0)
        .map(|m| (m.logical, m.logical.saturating_add(m.length)))
        .collect();
    let mut used: Vec<(u64, u64)> = extent_items(c)?
        .iter()
        .filter(|l| l.key.ty == BTRFS_EXTENT_ITEM_KEY)
        .map(|l| (l.key.objectid, l.key.objectid.saturating_add(l.key.offset)))
        .collect();
    used.sort();
    // Gaps of at least `len` in the data chunks, none overlapping the
    // target's own extent.
    let mut gaps = Vec::new();
    for (s, e) in data {
        let mut cur = s;
        for &(us, ue) in used.iter().filter(|(us, ue)| *ue > s && *us < e) {
            if us > cur {
                gaps.push((cur, us));
            }
            cur = cur.max(ue);
        }
        if e > cur {
            gaps.push((cur, e));
        }
    }
    gaps.retain(|(s, e)| e.saturating_sub(*s) >= len && (*e <= old || *s >= old + len));
    let &(gs, ge) = rng
        .pick(&gaps)
        .ok_or_else(|| none("no free range in a data block group"))?;
    let slots = (ge - gs - len) / ss;
    let v = gs + rng.between(0, slots) * ss;
    set(c, t, "disk_bytenr", v)?;
    Ok(format!(
        "{}: disk_bytenr {old} -> free {v}+{len}",
        loc_desc(t)
    ))
}

fn bad_transid(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let mut cands = Vec::new();
    for &t in &inv.fs_trees {
        cands.extend(
            c.blocks(t)?
                .into_iter()
                .filter(|b| b.depth > 0 && !inv.shared.contains(&b.bytenr)),
        );
    }
    let b = rng
        .pick(&cands)
        .cloned()
        .ok_or_else(|| none("no subvolume tree with more than one level"))?;
    let v = other_than(rng, b.generation, 8);
    c.set_header(b.bytenr, "generation", &Value::Set(v))?;
    Ok(format!(
        "tree {} block {} (level {}): generation {} -> {v}",
        b.tree, b.bytenr, b.level, b.generation
    ))
}

fn shift_offsets(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let mut cands = Vec::new();
    for &t in &inv.fs_trees {
        cands.extend(c.blocks(t)?.into_iter().filter(|b| {
            b.level == 0 && b.nritems >= 2 && b.free >= 2 && !inv.shared.contains(&b.bytenr)
        }));
    }
    let b = rng
        .pick(&cands)
        .cloned()
        .ok_or_else(|| none("no leaf with free space"))?;
    let n = c.shift_items(b.bytenr)?;
    Ok(format!(
        "tree {} leaf {}: shifted {n} bytes",
        b.tree, b.bytenr
    ))
}

fn entry_targets(inv: &Inventory, ty: u8) -> Vec<&Loc> {
    inv.items_of(ty)
        .filter(|l| single_entry(l).is_some_and(|(_, k)| k.ty == BTRFS_INODE_ITEM_KEY))
        .collect()
}

fn no_dir_index(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = entry_targets(inv, BTRFS_DIR_INDEX_KEY)
        .into_iter()
        .filter(|l| deletable(l))
        .collect();
    let t = pick(rng, &cands, "no directory entry")?;
    c.delete(t.tree, t.key)?;
    Ok(loc_desc(t))
}

fn bad_item_offset(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv.fs_items.iter().filter(|l| inv.own(l)).collect();
    let t = pick(rng, &cands, "no item")?;
    let v = if rng.chance(1, 2) {
        Value::Random(rng.next_u64())
    } else if rng.chance(1, 2) {
        Value::Add(rng.between(1, 64))
    } else {
        Value::Sub(rng.between(1, 64))
    };
    let (o, n) = c.set_item_header(t.bytenr, t.slot, "offset", &v)?;
    Ok(format!("{}: item offset {o} -> {n}", loc_desc(t)))
}

fn bad_dir_index_name(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands = entry_targets(inv, BTRFS_DIR_INDEX_KEY);
    let t = pick(rng, &cands, "no directory entry")?;
    c.set_name(t.tree, t.key, &NameEdit::Bump)?;
    Ok(loc_desc(t))
}

fn bad_dir_item_name(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands = entry_targets(inv, BTRFS_DIR_ITEM_KEY);
    let t = pick(rng, &cands, "no directory entry")?;
    c.set_name(t.tree, t.key, &NameEdit::Bump)?;
    Ok(loc_desc(t))
}

fn no_dir_item_or_index(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let items: HashMap<(u64, u64, Vec<u8>), &Loc> = entry_targets(inv, BTRFS_DIR_ITEM_KEY)
        .into_iter()
        .filter_map(|l| Some(((l.tree, l.key.objectid, single_entry(l)?.0), l)))
        .collect();
    let mut pairs = Vec::new();
    for idx in entry_targets(inv, BTRFS_DIR_INDEX_KEY) {
        let Some((name, _)) = single_entry(idx) else {
            continue;
        };
        let Some(item) = items.get(&(idx.tree, idx.key.objectid, name)) else {
            continue;
        };
        let ok = if item.bytenr == idx.bytenr {
            idx.leaf_items > 2 || idx.leaf_is_root
        } else {
            deletable(idx) && deletable(item)
        };
        if ok {
            pairs.push((idx, *item));
        }
    }
    let &(idx, item) = rng.pick(&pairs).ok_or_else(|| none("no directory entry"))?;
    c.delete(item.tree, item.key)?;
    c.delete(idx.tree, idx.key)?;
    Ok(format!("{} and {}", loc_desc(item), loc_desc(idx)))
}

fn no_rootdir_inode_item(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_INODE_ITEM_KEY)
        .filter(|l| l.key.objectid == BTRFS_FIRST_FREE_OBJECTID && deletable(l))
        .collect();
    let t = pick(
        rng,
        &cands,
        "no subvolume root directory in an unshared leaf",
    )?;
    c.delete(t.tree, t.key)?;
    Ok(loc_desc(t))
}

fn no_inode_item(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_INODE_ITEM_KEY)
        .filter(|l| {
            l.key.objectid > BTRFS_FIRST_FREE_OBJECTID
                && deletable(l)
                && inv
                    .inode_of(l)
                    .is_some_and(|i| i.is(S_IFREG) || i.is(S_IFDIR))
        })
        .collect();
    let t = pick(rng, &cands, "no inode")?;
    c.delete(t.tree, t.key)?;
    Ok(loc_desc(t))
}

fn wrong_inode_nbytes(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_INODE_ITEM_KEY)
        .filter(|l| {
            inv.inode_of(l)
                .is_some_and(|i| i.is(S_IFREG) && i.item.nbytes.get() > 0)
        })
        .collect();
    let t = pick(rng, &cands, "no regular file with data")?;
    let old = value(t, "nbytes")?;
    let k = rng.between(1, 64) * inv.sectorsize;
    let v = if old > k && rng.chance(1, 2) {
        old - k
    } else {
        old + k
    };
    set(c, t, "nbytes", v)?;
    Ok(format!("{}: nbytes {old} -> {v}", loc_desc(t)))
}

/// Regular files' EXTENT_DATA items, by (tree, inode), in key order.
fn file_extents(inv: &Inventory) -> BTreeMap<(u64, u64), Vec<&Loc>> {
    let mut m: BTreeMap<(u64, u64), Vec<&Loc>> = BTreeMap::new();
    for l in inv
        .fs_items
        .iter()
        .filter(|l| l.key.ty == BTRFS_EXTENT_DATA_KEY)
    {
        if inv.inode_of(l).is_some_and(|i| i.is(S_IFREG)) {
            m.entry((l.tree, l.key.objectid)).or_default().push(l);
        }
    }
    m
}

fn missing_all_file_extents(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let files = file_extents(inv);
    let cands: Vec<&Vec<&Loc>> = files
        .values()
        .filter(|v| {
            let mut per_leaf: HashMap<u64, (usize, usize, bool)> = HashMap::new();
            for l in v.iter() {
                let e = per_leaf
                    .entry(l.bytenr)
                    .or_insert((0, l.leaf_items, l.leaf_is_root));
                e.0 += 1;
            }
            v.iter().all(|l| inv.own(l))
                && per_leaf.values().all(|(n, total, root)| n < total || *root)
        })
        .collect();
    let v = *rng
        .pick(&cands)
        .ok_or_else(|| none("no regular file with extents"))?;
    for l in v.iter().rev() {
        c.delete(l.tree, l.key)?;
    }
    Ok(format!(
        "tree {} inode {}: {} extents",
        v[0].tree,
        v[0].key.objectid,
        v.len()
    ))
}

fn missing_one_file_extent(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let files = file_extents(inv);
    let cands: Vec<&Loc> = files
        .values()
        .filter(|v| v.len() >= 2)
        .flat_map(|v| v[..v.len() - 1].iter().copied())
        .filter(|l| inv.own(l) && deletable(l))
        .collect();
    let t = pick(rng, &cands, "no file with two extents or more")?;
    c.delete(t.tree, t.key)?;
    Ok(loc_desc(t))
}

fn bad_inline_ref_type(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    let all = extent_items(c)?;
    let cands: Vec<(&Loc, usize)> = all
        .iter()
        .filter_map(|l| Some((l, parse_extent_item(&l.key, &l.data).ok()?.refs.len())))
        .filter(|(_, n)| *n > 0)
        .collect();
    let &(t, n) = rng
        .pick(&cands)
        .ok_or_else(|| none("no extent item with inline refs"))?;
    let i = rng.below(n as u64) as usize;
    let valid = [
        BTRFS_EXTENT_OWNER_REF_KEY,
        BTRFS_TREE_BLOCK_REF_KEY,
        BTRFS_EXTENT_DATA_REF_KEY,
        BTRFS_EXTENT_REF_V0_KEY,
        BTRFS_SHARED_BLOCK_REF_KEY,
        BTRFS_SHARED_DATA_REF_KEY,
    ];
    let mut v = rng.next_u64() as u8;
    for _ in 0..64 {
        if !valid.contains(&v) {
            break;
        }
        v = rng.next_u64() as u8;
    }
    if valid.contains(&v) {
        v = 0;
    }
    let name = format!("ref[{i}].type");
    set(c, t, &name, v as u64)?;
    Ok(format!("{}: {name} -> {v}", loc_desc(t)))
}

fn bad_inode_flags(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_INODE_ITEM_KEY)
        .filter(|l| inv.inode_of(l).is_some_and(|i| i.is(S_IFLNK)))
        .collect();
    let t = pick(rng, &cands, "no symlink")?;
    let old = value(t, "flags")?;
    set(c, t, "flags", old | BTRFS_INODE_IMMUTABLE)?;
    Ok(loc_desc(t))
}

fn inline_ram_bytes(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_EXTENT_DATA_KEY)
        .filter(|l| {
            matches!(parse_file_extent(&l.data), Ok(FileExtent::Inline { head, .. }) if head.compression == 0)
        })
        .collect();
    let t = pick(rng, &cands, "no uncompressed inline extent")?;
    let old = value(t, "ram_bytes")?;
    set(c, t, "ram_bytes", old + 1)?;
    Ok(format!("{}: ram_bytes {old} -> {}", loc_desc(t), old + 1))
}

fn dev_extents(c: &mut Corruptor) -> R<Vec<Loc>> {
    let devid = c.image()?.devid;
    Ok(c.items(BTRFS_DEV_TREE_OBJECTID)?
        .into_iter()
        .filter(|l| l.key.ty == BTRFS_DEV_EXTENT_KEY && l.key.objectid == devid)
        .collect())
}

fn dev_extent_past_end(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    let exts = dev_extents(c)?;
    let last = exts.last().ok_or_else(|| none("no dev extent"))?.clone();
    let dev = dev_item(c)?;
    let total = value(&dev, "total_bytes")?;
    let len = value(&last, "length")?;
    let start = last.key.offset;
    if rng.chance(1, 2) || len < 2 * MIB {
        let v = total.saturating_sub(start) + rng.between(1, 64) * MIB;
        set(c, &last, "length", v)?;
        Ok(format!(
            "{}: length {len} -> {v} (device {total} bytes)",
            loc_desc(&last)
        ))
    } else {
        // The device made smaller than the extent's end.
        let end = start + len;
        let v = end - rng.between(1, len / MIB - 1) * MIB;
        set(c, &dev, "total_bytes", v)?;
        c.set_super("dev_item.total_bytes", &Value::Set(v))?;
        let sb_total = c.super_field("total_bytes")?;
        c.set_super("total_bytes", &Value::Set(sb_total.min(v)))?;
        Ok(format!(
            "device total_bytes {total} -> {v}, below the end {end} of {}",
            loc_desc(&last)
        ))
    }
}

fn bad_inode_mode(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv.items_of(BTRFS_INODE_ITEM_KEY).collect();
    let t = pick(rng, &cands, "no inode")?;
    let bad = [
        0o000000u32,
        0o030000,
        0o050000,
        0o070000,
        0o110000,
        0o130000,
        0o150000,
        0o160000,
        0o170000,
    ];
    let ty = *rng.pick(&bad).unwrap_or(&0o170000);
    let old = value(t, "mode")? as u32;
    let v = (old & 0o7777) | ty;
    set(c, t, "mode", v as u64)?;
    Ok(format!("{}: mode {old:o} -> {v:o}", loc_desc(t)))
}

fn root_generation_ahead(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .root_items
        .iter()
        .filter(|l| l.key.ty == BTRFS_ROOT_ITEM_KEY && inv.fs_trees.contains(&l.key.objectid))
        .collect();
    let t = pick(rng, &cands, "no subvolume")?;
    let ri = RootItem::parse(&t.data).map_err(|e| RecipeError::Failed(e.to_string()))?;
    let v = inv.generation + rng.between(1, 1000);
    let root = ri.bytenr.get();
    c.set_header(root, "generation", &Value::Set(v))?;
    let t = c.find(BTRFS_ROOT_TREE_OBJECTID, t.key)?;
    set(c, &t, "generation", v)?;
    if ri.has_v2() {
        let t = c.find(BTRFS_ROOT_TREE_OBJECTID, t.key)?;
        set(c, &t, "generation_v2", v)?;
    }
    Ok(format!(
        "subvolume {} (root block {root}): generation {} -> {v}",
        t.key.objectid,
        ri.generation.get()
    ))
}

fn inode_generation_ahead(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv.items_of(BTRFS_INODE_ITEM_KEY).collect();
    let t = pick(rng, &cands, "no inode")?;
    let name = if rng.chance(1, 2) {
        "generation"
    } else {
        "transid"
    };
    let v = inv.generation + rng.between(2, 1000);
    set(c, t, name, v)?;
    Ok(format!("{}: {name} -> {v}", loc_desc(t)))
}

fn extent_generation_ahead(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let all = extent_items(c)?;
    let data = rng.chance(1, 2);
    let cands: Vec<&Loc> = all
        .iter()
        .filter(|l| {
            let flags = parse_extent_item(&l.key, &l.data)
                .map(|v| v.item.flags.get())
                .unwrap_or(0);
            if data {
                flags & BTRFS_EXTENT_FLAG_DATA != 0
            } else {
                flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0
            }
        })
        .collect();
    let t = pick(rng, &cands, "no extent item")?;
    let v = inv.generation + rng.between(1, 1000);
    set(c, t, "generation", v)?;
    Ok(format!("{}: generation -> {v}", loc_desc(t)))
}

fn overlapping_csum(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cs = c.csum_type()?.size();
    let ss = inv.sectorsize;
    let items = c.items(BTRFS_CSUM_TREE_OBJECTID)?;
    let mut cands: Vec<&Loc> = items
        .iter()
        .filter(|l| {
            l.key.objectid == BTRFS_EXTENT_CSUM_OBJECTID
                && l.key.ty == BTRFS_EXTENT_CSUM_KEY
                && l.data.len() / cs >= 2
        })
        .collect();
    // Insertion may find no room: try a few.
    for _ in 0..16 {
        if cands.is_empty() {
            break;
        }
        let i = rng.below(cands.len() as u64) as usize;
        let t = cands.swap_remove(i);
        let n = (t.data.len() / cs) as u64;
        let skip = rng.between(1, n - 1);
        let take = rng.between(1, n - skip);
        let key = Key::new(t.key.objectid, t.key.ty, t.key.offset + skip * ss);
        let body = t.data[(skip as usize) * cs..((skip + take) as usize) * cs].to_vec();
        match c.insert(BTRFS_CSUM_TREE_OBJECTID, key, &body) {
            Ok(()) => {
                return Ok(format!(
                    "csum item {} ({n} sectors): {} inserted over {take} of them",
                    key_str(&t.key),
                    key_str(&key)
                ))
            }
            Err(_) => continue,
        }
    }
    Err(none(
        "no checksum item of two sectors or more with room beside it",
    ))
}

fn dev_bytes_used(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    let dev = dev_item(c)?;
    let old = value(&dev, "bytes_used")?;
    let total = value(&dev, "total_bytes")?;
    let k = rng.between(1, 64) * MIB;
    let v = if old > k && (rng.chance(1, 2) || old + k > total) {
        old - k
    } else {
        old + k
    };
    set(c, &dev, "bytes_used", v)?;
    c.set_super("dev_item.bytes_used", &Value::Set(v))?;
    Ok(format!("device bytes_used {old} -> {v}"))
}

fn block_groups(c: &mut Corruptor) -> R<Vec<Loc>> {
    let tree = if c.tree_root(BTRFS_BLOCK_GROUP_TREE_OBJECTID).is_ok() {
        BTRFS_BLOCK_GROUP_TREE_OBJECTID
    } else {
        BTRFS_EXTENT_TREE_OBJECTID
    };
    Ok(c.items(tree)?
        .into_iter()
        .filter(|l| l.key.ty == BTRFS_BLOCK_GROUP_ITEM_KEY)
        .collect())
}

fn block_group_used(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let bgs = block_groups(c)?;
    let cands: Vec<&Loc> = bgs.iter().collect();
    let t = pick(rng, &cands, "no block group")?;
    let old = value(t, "used")?;
    let len = t.key.offset;
    let ss = inv.sectorsize;
    let v = if rng.chance(1, 3) {
        len + rng.between(1, 64) * ss
    } else {
        let k = rng.between(1, 64) * ss;
        if old >= k && (rng.chance(1, 2) || old + k > len) {
            old - k
        } else {
            old + k
        }
    };
    set(c, t, "used", v)?;
    Ok(format!("{}: used {old} -> {v} (length {len})", loc_desc(t)))
}

fn super_bytes_used(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let old = c.super_field("bytes_used")?;
    let k = rng.between(1, 256) * inv.sectorsize;
    let v = if old > k && rng.chance(1, 2) {
        old - k
    } else {
        old + k
    };
    c.set_super("bytes_used", &Value::Set(v))?;
    Ok(format!("superblock bytes_used {old} -> {v}"))
}

fn bad_metadata_level(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    let all = extent_items(c)?;
    let cands: Vec<&Loc> = all
        .iter()
        .filter(|l| match l.key.ty {
            BTRFS_METADATA_ITEM_KEY => l.key.offset == 0,
            _ => {
                parse_extent_item(&l.key, &l.data)
                    .ok()
                    .and_then(|v| v.tree_block_info.map(|i| i.level))
                    == Some(0)
            }
        })
        .collect();
    let t = pick(rng, &cands, "no extent item of a leaf")?;
    if t.key.ty == BTRFS_METADATA_ITEM_KEY {
        let new = Key::new(t.key.objectid, t.key.ty, 255);
        c.set_key(BTRFS_EXTENT_TREE_OBJECTID, t.key, new, KeyOrder::InPlace)?;
    } else {
        set(c, t, "level", 255)?;
    }
    Ok(format!("{}: level 0 -> 255", loc_desc(t)))
}

fn super_num_devices(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    let old = c.super_field("num_devices")?;
    let mut v = *rng.pick(&[2u64, 3, 4, 8]).unwrap_or(&2);
    if v == old {
        v = old + 1;
    }
    c.set_super("num_devices", &Value::Set(v))?;
    Ok(format!("superblock num_devices {old} -> {v}"))
}

fn free_space_entry(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let items = c
        .items(BTRFS_FREE_SPACE_TREE_OBJECTID)
        .map_err(|_| none("no free space tree"))?;
    let cands: Vec<&Loc> = items
        .iter()
        .filter(|l| l.key.ty == BTRFS_FREE_SPACE_EXTENT_KEY)
        .collect();
    let t = pick(rng, &cands, "no free space extent")?;
    let ss = inv.sectorsize;
    let len = t.key.offset;
    let tree = BTRFS_FREE_SPACE_TREE_OBJECTID;
    match rng.below(3) {
        0 if len >= 2 * ss => {
            let v = len - rng.between(1, len / ss - 1) * ss;
            c.set_key(
                tree,
                t.key,
                Key::new(t.key.objectid, t.key.ty, v),
                KeyOrder::InPlace,
            )?;
            Ok(format!("{}: length {len} -> {v}", loc_desc(t)))
        }
        1 if deletable(t) => {
            c.delete(tree, t.key)?;
            Ok(format!("{}: deleted", loc_desc(t)))
        }
        _ => {
            let v = len + rng.between(1, 16) * ss;
            c.set_key(
                tree,
                t.key,
                Key::new(t.key.objectid, t.key.ty, v),
                KeyOrder::InPlace,
            )?;
            Ok(format!("{}: length {len} -> {v}", loc_desc(t)))
        }
    }
}

fn inline_refs_out_of_order(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    let all = extent_items(c)?;
    let cands: Vec<(&Loc, usize)> = all
        .iter()
        .filter_map(|l| {
            let v = parse_extent_item(&l.key, &l.data).ok()?;
            let n = v.refs.len();
            let rev: Vec<_> = v.refs.iter().rev().copied().collect();
            (n >= 2 && rev != v.refs).then_some((l, n))
        })
        .collect();
    let &(t, n) = rng
        .pick(&cands)
        .ok_or_else(|| none("no extent item with two inline refs"))?;
    let order: Vec<usize> = (0..n).rev().collect();
    c.reorder_inline_refs(t.key, &order)?;
    Ok(format!("{}: {n} inline refs reversed", loc_desc(t)))
}

fn missing_root_orphan(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .root_items
        .iter()
        .filter(|l| {
            l.key.objectid == BTRFS_ORPHAN_OBJECTID
                && l.key.ty == BTRFS_ORPHAN_ITEM_KEY
                && inv.dead_roots.contains(&l.key.offset)
                && deletable(l)
        })
        .collect();
    let t = pick(rng, &cands, "no deleted subvolume waiting to be dropped")?;
    c.delete(BTRFS_ROOT_TREE_OBJECTID, t.key)?;
    Ok(format!("orphan item of subvolume {}", t.key.offset))
}

fn orphan_dev_extent(c: &mut Corruptor, _inv: &Inventory, rng: &mut Prng) -> R<String> {
    use btrkit_core::format::dev::DevExtent;
    let exts = dev_extents(c)?;
    let last = exts.last().ok_or_else(|| none("no dev extent"))?.clone();
    let dev = dev_item(c)?;
    let total = value(&dev, "total_bytes")?;
    let end = last.key.offset + value(&last, "length")?;
    let start = end.div_ceil(MIB) * MIB + rng.between(0, 16) * MIB;
    let len = rng.between(1, 8) * MIB;
    if start + len > total {
        return Err(none("no free device space past the last dev extent"));
    }
    let chunk = chunks_end(c)?.div_ceil(1 << 30) * (1 << 30) + rng.between(1, 64) * (1 << 30);
    let mut body = last.data.clone();
    let f = |n: &str| fields::item_field(&last.key, &last.data, n).map_err(RecipeError::Failed);
    for (n, v) in [
        ("chunk_tree", BTRFS_CHUNK_TREE_OBJECTID),
        ("chunk_objectid", BTRFS_FIRST_CHUNK_TREE_OBJECTID),
        ("chunk_offset", chunk),
        ("length", len),
    ] {
        let fd = f(n)?;
        super::put_le(&mut body, fd.off, fd.width, v).ok_or_else(|| none("short dev extent"))?;
    }
    debug_assert_eq!(body.len(), core::mem::size_of::<DevExtent>());
    let key = Key::new(last.key.objectid, BTRFS_DEV_EXTENT_KEY, start);
    c.insert(BTRFS_DEV_TREE_OBJECTID, key, &body)?;
    let used = value(&dev, "bytes_used")?;
    let dev = dev_item(c)?;
    set(c, &dev, "bytes_used", used + len)?;
    c.set_super("dev_item.bytes_used", &Value::Set(used + len))?;
    Ok(format!(
        "dev extent {} of {len} bytes for chunk {chunk} (none there)",
        key_str(&key)
    ))
}

fn missing_inode_ref(c: &mut Corruptor, inv: &Inventory, rng: &mut Prng) -> R<String> {
    let cands: Vec<&Loc> = inv
        .items_of(BTRFS_INODE_REF_KEY)
        .filter(|l| {
            let name_len = super::get_le(&l.data, 8, 2).unwrap_or(0) as usize;
            l.data.len() == 10 + name_len
                && deletable(l)
                && inv
                    .inode_of(l)
                    .is_some_and(|i| i.is(S_IFREG) && i.item.nlink.get() == 1)
        })
        .collect();
    let t = pick(rng, &cands, "no file with one name")?;
    c.delete(t.tree, t.key)?;
    Ok(loc_desc(t))
}
