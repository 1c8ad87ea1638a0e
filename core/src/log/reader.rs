//! The one reader of the fsync log. Replay, salvage, inspection (`btrkit-dump
//! log`) and the checker (fsck phase 8) all read the log through
//! [`read_log`], so they see the same blocks, the same items and the same
//! damage, and they decide with one rule which logged extents need data
//! checksums ([`LogTree::csum_needs`]).
//!
//! The log is the log root tree (one ROOT_ITEM per subvolume log) and one log
//! tree per subvolume. Every block is read with the full validation of a
//! tree block (checksum, header, parent transid, first key, item bounds and
//! bodies), walked depth-first in key order, each block once across the
//! whole log. What happens to a damaged block is the caller's choice
//! ([`OnDamage`]): replay fails on it, salvage treats it as lost, inspection
//! shows what can still be read of it. A lost block takes with it the key
//! range its parent gives it ([`LostBlock`]), which is what salvage needs to
//! decide which logged inodes are still complete.

use crate::format::consts::*;
use crate::format::file_extent::parse_file_extent;
use crate::format::inode::InodeItem;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::image::Image;
use crate::tree::node::{Expect, Node, Problem};
use crate::tree::{walk, DamageKind, Order, Place, Stop, TreeRoot, WalkEvent, WalkOptions};
use crate::CorruptKind;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use zerocopy::FromBytes;

/// What reading does with a block that is unreadable or fails validation
/// (the tree walk's policy: replay fails, salvage loses the block,
/// inspection and the checker keep what can be read).
pub use crate::tree::OnDamage;

/// How [`read_log`] reads the log.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// What to do with a block that is unreadable or fails validation.
    pub on_damage: OnDamage,
    /// Require the log root tree's root block to carry the superblock's
    /// generation + 1 (its parent transid). The checker turns this off and
    /// reports a wrong generation as a finding of its own.
    pub root_generation: bool,
}

impl ReadOptions {
    /// Options with `on_damage`, checking the log root tree's generation.
    pub fn new(on_damage: OnDamage) -> ReadOptions {
        ReadOptions {
            on_damage,
            root_generation: true,
        }
    }
}

/// Why a [`LogProblem`] was raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemClass {
    /// The block could not be read at all (no copy, or no copy at the level
    /// its parent says).
    Unreadable,
    /// The block was read but fails validation.
    Damaged,
    /// A block referenced a second time (a loop or a shared block).
    Revisit,
    /// An item of a readable leaf whose body lies outside the leaf, or a
    /// ROOT_ITEM of the log root tree that does not parse.
    Item,
}

/// One thing wrong with the log, located by block and, where it applies, key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogProblem {
    /// Logical address of the block the problem is in (or that could not be read).
    pub bytenr: u64,
    /// The item's key, or the first key the parent gives the block; `None` when unknown.
    pub key: Option<Key>,
    /// What is wrong, for people.
    pub message: String,
    /// Kind of problem.
    #[serde(skip)]
    pub class: ProblemClass,
    /// Item slot in the block, when the problem is one item's.
    #[serde(skip)]
    pub slot: Option<usize>,
}

/// A block whose items are not available, and the key range they covered:
/// `[lo, hi)`, `hi` None meaning to the end of the key space.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LostBlock {
    /// Logical address of the lost block.
    pub bytenr: u64,
    /// The block that points to it; None for a tree's root block.
    pub parent: Option<u64>,
    /// Level the parent gives it (0: a leaf).
    pub level: u8,
    /// First key of the lost range (the key the parent gives the block).
    pub lo: Key,
    /// End of the lost range, exclusive: the parent's next key; `None` for the
    /// end of the key space.
    pub hi: Option<Key>,
    /// Why the block is lost: unreadable, damaged, revisited or excluded.
    pub why: String,
}

impl LostBlock {
    /// Whether any key in `[a, b]` (inclusive) may have been in this block.
    pub fn overlaps(&self, a: Key, b: Key) -> bool {
        self.lo <= b && self.hi.is_none_or(|h| h > a)
    }
    /// Whether key `k` may have been in this block.
    pub fn contains(&self, k: Key) -> bool {
        self.overlaps(k, k)
    }
}

/// One block that was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRead {
    /// Logical address of the block.
    pub bytenr: u64,
    /// Level in its header (0: a leaf).
    pub level: u8,
    /// Generation (transid) in its header.
    pub generation: u64,
    /// Distance from the tree's root block (0: the root).
    pub depth: usize,
    /// Items (leaf) or pointers (node).
    pub nritems: usize,
    /// Key of its first item or pointer.
    pub first_key: Option<Key>,
    /// The block has validation problems (only with [`OnDamage::Keep`]).
    pub damaged: bool,
}

/// How one tree of the log was read.
#[derive(Clone, Debug)]
pub struct TreeRead {
    /// Root of the tree as the log root tree (or, for the log root tree, the superblock) gives it.
    pub root: TreeRoot,
    /// Blocks whose contents were used, in walk order.
    pub blocks: Vec<BlockRead>,
    /// Blocks whose items are not available, with their key ranges.
    pub lost: Vec<LostBlock>,
    /// Everything found wrong while reading the tree.
    pub problems: Vec<LogProblem>,
    /// Generation in the root block's header, when it could be read.
    pub root_block_generation: Option<u64>,
    /// (index of its first item, bytenr) of every leaf whose items were
    /// taken, in item order; empty when the items had to be sorted.
    leaf_starts: Vec<(usize, u64)>,
}

impl TreeRead {
    pub(crate) fn new(root: TreeRoot) -> TreeRead {
        TreeRead {
            root,
            blocks: Vec::new(),
            lost: Vec::new(),
            problems: Vec::new(),
            root_block_generation: None,
            leaf_starts: Vec::new(),
        }
    }
    /// Number of leaves read.
    pub fn leaves(&self) -> usize {
        self.blocks.iter().filter(|b| b.level == 0).count()
    }
    /// The first lost block that may have held a key in `[a, b]`.
    pub fn lost_in(&self, a: Key, b: Key) -> Option<&LostBlock> {
        self.lost.iter().find(|l| l.overlaps(a, b))
    }
}

/// The log tree of one subvolume, its items in key order.
#[derive(Clone, Debug)]
pub struct LogTree {
    /// Subvolume (fs tree) id: the offset of the log's ROOT_ITEM key.
    pub subvol: u64,
    /// Items of the log tree in key order: (key, body).
    pub items: Vec<(Key, Vec<u8>)>,
    /// How the tree was read: blocks, lost ranges, problems.
    pub read: TreeRead,
}

/// A logged data extent whose checksums replay must find (in the log or,
/// for data committed before, in the csum tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsumNeed {
    /// Inode the extent belongs to.
    pub ino: u64,
    /// File offset of the extent item (its key offset).
    pub file_offset: u64,
    /// Start (logical bytenr) of the data range that needs checksums.
    pub start: u64,
    /// End of the data range, exclusive (see `FileExtent::csum_span`).
    pub end: u64,
}

impl LogTree {
    /// The body of the item with key `key`, if the log tree has it.
    pub fn find(&self, key: &Key) -> Option<&[u8]> {
        self.items
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| &self.items[i].1[..])
    }
    /// Items with keys in `[lo, hi]`.
    pub fn range(&self, lo: Key, hi: Key) -> impl Iterator<Item = &(Key, Vec<u8>)> {
        let s = self.items.partition_point(|(k, _)| *k < lo);
        self.items[s..].iter().take_while(move |(k, _)| *k <= hi)
    }
    /// The leaf item `index` of [`LogTree::items`] came from (the tree's
    /// root when that is not known).
    pub fn leaf_of(&self, index: usize) -> u64 {
        let l = &self.read.leaf_starts;
        let i = l.partition_point(|&(first, _)| first <= index);
        i.checked_sub(1)
            .and_then(|i| l.get(i))
            .map_or(self.read.root.bytenr, |&(_, b)| b)
    }
    /// The logged inode item of `ino`, when the log holds one that decodes.
    pub fn inode_item(&self, ino: u64) -> Option<InodeItem> {
        self.find(&Key::new(ino, BTRFS_INODE_ITEM_KEY, 0))
            .and_then(|d| InodeItem::read_from_bytes(d).ok())
    }

    /// Whether the data of `ino` carries checksums: not when its logged inode
    /// item says NODATASUM. An inode whose item the log lacks is taken to
    /// keep checksums (the kernel logs the inode item with every logged
    /// extent, so this only matters for damaged logs, where assuming less
    /// would let data without checksums through).
    pub fn keeps_csums(&self, ino: u64) -> bool {
        self.inode_item(ino)
            .is_none_or(|i| i.flags.get() & BTRFS_INODE_NODATASUM == 0)
    }

    /// Every logged data extent that needs checksums: the one rule replay,
    /// salvage, inspection and the checker share. Extents whose item does
    /// not decode, or breaks the format's bounds (the reader reports it),
    /// are left to whoever reports undecodable items.
    pub fn csum_needs(&self) -> Vec<CsumNeed> {
        let mut out = Vec::new();
        let mut cur: Option<(u64, bool)> = None;
        for (k, d) in &self.items {
            if k.ty != BTRFS_EXTENT_DATA_KEY || k.objectid > BTRFS_LAST_FREE_OBJECTID {
                continue;
            }
            let keeps = match cur {
                Some((ino, keeps)) if ino == k.objectid => keeps,
                _ => {
                    let keeps = self.keeps_csums(k.objectid);
                    cur = Some((k.objectid, keeps));
                    keeps
                }
            };
            if !keeps {
                continue;
            }
            let span = parse_file_extent(d)
                .ok()
                .filter(|fe| fe.check_bounds(k).is_ok())
                .and_then(|fe| fe.csum_span());
            if let Some((start, end)) = span {
                out.push(CsumNeed {
                    ino: k.objectid,
                    file_offset: k.offset,
                    start,
                    end,
                });
            }
        }
        out
    }

    /// The data ranges the log's EXTENT_CSUM items cover: sorted, merged.
    pub fn csum_ranges(&self, csum_size: usize, sectorsize: u32) -> Vec<(u64, u64)> {
        let lo = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0);
        let hi = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, u64::MAX);
        let mut v: Vec<(u64, u64)> = self
            .range(lo, hi)
            .map(|(k, d)| {
                (
                    k.offset,
                    k.offset
                        .saturating_add((d.len() / csum_size.max(1)) as u64 * sectorsize as u64),
                )
            })
            .filter(|(s, e)| s < e)
            .collect();
        merge_ranges(&mut v);
        v
    }
}

/// Sort and merge overlapping or touching ranges in place.
pub fn merge_ranges(v: &mut Vec<(u64, u64)>) {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for &(s, e) in v.iter() {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    *v = out;
}

/// Bytes of `[start, end)` that the merged ranges `cover` include.
pub fn covered_bytes(cover: &[(u64, u64)], start: u64, end: u64) -> u64 {
    let i = cover.partition_point(|&(_, e)| e <= start);
    cover[i..]
        .iter()
        .take_while(|&&(s, _)| s < end)
        .map(|&(s, e)| e.min(end).saturating_sub(s.max(start)))
        .sum()
}

/// The parts of `[start, end)` that the merged ranges `cover` miss.
pub fn uncovered(cover: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = start;
    let i = cover.partition_point(|&(_, e)| e <= start);
    for &(s, e) in &cover[i..] {
        if s >= end || pos >= end {
            break;
        }
        if s > pos {
            out.push((pos, s));
        }
        pos = pos.max(e);
    }
    if pos < end {
        out.push((pos, end));
    }
    out
}

/// The whole log of an image.
#[derive(Clone, Debug)]
pub struct LogRead {
    /// Generation of the last committed transaction; the log belongs to the next one.
    pub super_generation: u64,
    /// The superblock's deprecated `log_root_transid` (0 on current kernels).
    pub log_root_transid: u64,
    /// The log root tree.
    pub root_tree: TreeRead,
    /// Every ROOT_ITEM of the log root tree that decodes, in key order.
    pub roots: Vec<(Key, RootItem)>,
    /// Items of the log root tree that are not ROOT_ITEMs (or do not
    /// decode): key and size.
    pub root_tree_other: Vec<(Key, usize, Option<String>)>,
    /// One per log tree ROOT_ITEM (objectid TREE_LOG) with a sane level, in
    /// key order.
    pub trees: Vec<LogTree>,
}

impl LogRead {
    /// Whether any block of the log was lost or damaged.
    pub fn is_damaged(&self) -> bool {
        let t = |r: &TreeRead| !r.lost.is_empty() || !r.problems.is_empty();
        t(&self.root_tree) || self.trees.iter().any(|l| t(&l.read))
    }
    /// Every block whose contents were used, across the whole log.
    pub fn block_count(&self) -> usize {
        self.root_tree.blocks.len()
            + self
                .trees
                .iter()
                .map(|t| t.read.blocks.len())
                .sum::<usize>()
    }
}

/// Read the log of `img`: Ok(None) when the superblock has no log root.
/// With [`OnDamage::Fail`] the first damaged block is the error; otherwise
/// this only fails when the superblock's log pointer itself is unusable.
pub fn read_log(img: &Image, opts: ReadOptions) -> Result<Option<LogRead>> {
    read_log_with(img, opts, &HashMap::new())
}

/// [`read_log`], treating the blocks in `excluded` as damaged for the reason
/// given (salvage uses it for blocks it cannot trust although they read).
pub fn read_log_with(
    img: &Image,
    opts: ReadOptions,
    excluded: &HashMap<u64, String>,
) -> Result<Option<LogRead>> {
    let Some(lrt) = img.log_root_tree() else {
        return Ok(None);
    };
    let mut seen = HashSet::new();
    let mut reader = Reader {
        img,
        opts,
        seen: &mut seen,
        excluded,
    };
    let mut root_tree = TreeRead::new(lrt);
    let mut root_items = Vec::new();
    reader.read_tree(
        &mut root_tree,
        opts.root_generation.then_some(lrt.generation),
        &mut root_items,
    )?;
    let mut roots = Vec::new();
    let mut root_tree_other = Vec::new();
    for (k, d) in root_items {
        if k.ty != BTRFS_ROOT_ITEM_KEY {
            root_tree_other.push((k, d.len(), None));
            continue;
        }
        match RootItem::parse(&d) {
            Ok(ri) => roots.push((k, ri)),
            Err(e) => {
                let what = error_text(&e);
                if opts.on_damage == OnDamage::Fail {
                    return Err(e.at(lrt.bytenr, k));
                }
                root_tree.problems.push(LogProblem {
                    bytenr: lrt.bytenr,
                    key: Some(k),
                    message: format!("log root item does not decode: {what}"),
                    class: ProblemClass::Item,
                    slot: None,
                });
                root_tree_other.push((k, d.len(), Some(what)));
            }
        }
    }
    let max_gen = img.sb.generation.get().saturating_add(1);
    let mut trees = Vec::new();
    for (k, ri) in &roots {
        if k.objectid != BTRFS_TREE_LOG_OBJECTID {
            continue;
        }
        let root = TreeRoot {
            id: BTRFS_TREE_LOG_OBJECTID,
            bytenr: ri.bytenr.get(),
            level: ri.level,
            generation: ri.generation.get(),
        };
        let mut read = TreeRead::new(root);
        let mut items = Vec::new();
        let whole = |why: String| LostBlock {
            bytenr: root.bytenr,
            parent: None,
            level: root.level,
            lo: Key::MIN,
            hi: None,
            why,
        };
        let bad_root = if ri.generation.get() > max_gen {
            Some(format!(
                "log tree of subvolume {} has generation {}, newer than the filesystem's {} + 1",
                k.offset,
                ri.generation.get(),
                img.sb.generation.get()
            ))
        } else if ri.level >= BTRFS_MAX_LEVEL {
            Some(format!(
                "log tree of subvolume {} has level {}",
                k.offset, ri.level
            ))
        } else {
            None
        };
        match (bad_root, opts.on_damage) {
            (Some(why), OnDamage::Fail) => {
                return Err(Error::corrupt_as(CorruptKind::LogBlock, why, root.bytenr))
            }
            (Some(why), _) if ri.level >= BTRFS_MAX_LEVEL => {
                read.problems.push(LogProblem {
                    bytenr: root.bytenr,
                    key: Some(*k),
                    message: why.clone(),
                    class: ProblemClass::Item,
                    slot: None,
                });
                read.lost.push(whole(why));
            }
            (Some(why), OnDamage::Skip) => {
                read.problems.push(LogProblem {
                    bytenr: root.bytenr,
                    key: Some(*k),
                    message: why.clone(),
                    class: ProblemClass::Item,
                    slot: None,
                });
                read.lost.push(whole(why));
            }
            _ => reader.read_tree(&mut read, Some(root.generation), &mut items)?,
        }
        trees.push(LogTree {
            subvol: k.offset,
            items,
            read,
        });
    }
    Ok(Some(LogRead {
        super_generation: img.sb.generation.get(),
        log_root_transid: img.sb.log_root_transid.get(),
        root_tree,
        roots,
        root_tree_other,
        trees,
    }))
}

/// An error's message without its location, which the problem carries.
pub(crate) fn error_text(e: &Error) -> String {
    match e {
        Error::Corrupt { what, .. } => what.clone(),
        e => e.to_string(),
    }
}

struct Reader<'a> {
    img: &'a Image,
    opts: ReadOptions,
    /// Blocks read so far across the whole log: no block may be used twice.
    seen: &'a mut HashSet<u64>,
    excluded: &'a HashMap<u64, String>,
}

impl Reader<'_> {
    /// Walk one tree in key order, appending its items to `items` (sorted on
    /// return) and recording blocks, damage and lost ranges in `read`.
    fn read_tree(
        &mut self,
        read: &mut TreeRead,
        generation: Option<u64>,
        items: &mut Vec<(Key, Vec<u8>)>,
    ) -> Result<()> {
        let root = read.root;
        // The log root's generation is checked only when the caller knows
        // it (a log root item's, not a damaged one's guess).
        let start = Place::start(
            root.bytenr,
            Expect {
                generation,
                ..Expect::root(&root)
            },
        );
        let walk_opts = WalkOptions {
            order: Order::Depth,
            on_damage: self.opts.on_damage,
            log: true,
            check_range: true,
            excluded: Some(self.excluded),
            ..Default::default()
        };
        let opts = self.opts;
        let lost = |at: &Place, why: String| LostBlock {
            bytenr: at.bytenr,
            parent: at.parent,
            level: at.expect.level.unwrap_or(0),
            lo: at.lo,
            hi: at.hi,
            why,
        };
        let walked = walk(self.img, start, &walk_opts, self.seen, |ev| {
            match ev {
                WalkEvent::Revisit { bytenr, parent, at } => {
                    let message = format!(
                        "block {bytenr} is referenced again by block {parent} (a loop or shared block in the log)"
                    );
                    read.problems.push(LogProblem {
                        bytenr,
                        key: None,
                        message: message.clone(),
                        class: ProblemClass::Revisit,
                        slot: None,
                    });
                    read.lost.push(lost(at, message));
                }
                WalkEvent::Excluded { why, at } => {
                    read.problems.push(LogProblem {
                        bytenr: at.bytenr,
                        key: at.expect.first_key,
                        message: why.to_string(),
                        class: ProblemClass::Damaged,
                        slot: None,
                    });
                    read.lost.push(lost(at, why.to_string()));
                }
                WalkEvent::Unreadable {
                    bytenr,
                    parent,
                    key,
                    error,
                    at,
                } => {
                    let from = match parent {
                        Some(b) => format!(" (referenced by block {b})"),
                        None => " (tree root)".to_string(),
                    };
                    read.problems.push(LogProblem {
                        bytenr,
                        key,
                        message: format!("unreadable block{from}: {error}"),
                        class: ProblemClass::Unreadable,
                        slot: None,
                    });
                    read.lost
                        .push(lost(at, format!("unreadable: {}", error_text(error))));
                }
                WalkEvent::Block {
                    node,
                    problems,
                    depth,
                    at,
                } => {
                    if depth == 0 {
                        read.root_block_generation = Some(node.generation());
                    }
                    if let Some(first) = problems.first() {
                        read.problems.extend(problems.iter().map(block_problem));
                        if opts.on_damage == OnDamage::Skip {
                            read.lost
                                .push(lost(at, format!("damaged: {}", first.message)));
                            return ControlFlow::Continue(false);
                        }
                    }
                    read.blocks.push(BlockRead {
                        bytenr: node.bytenr,
                        level: node.level(),
                        generation: node.generation(),
                        depth,
                        nritems: node.nr_safe(),
                        first_key: node.key(0),
                        damaged: !problems.is_empty(),
                    });
                    if node.is_leaf() {
                        if let Err(e) = take_items(opts, node, problems, read, items) {
                            return ControlFlow::Break(e);
                        }
                    }
                }
            }
            ControlFlow::Continue(true)
        });
        match walked {
            ControlFlow::Continue(()) => {}
            ControlFlow::Break(Stop::Visitor(e)) => return Err(e),
            ControlFlow::Break(Stop::Damage(d)) => {
                let d = *d;
                let what = match d.what {
                    DamageKind::Revisit => "log tree block referenced twice".to_string(),
                    DamageKind::Excluded(why) => format!("log tree block {why}"),
                    DamageKind::Unreadable(e) => format!("log tree block unreadable: {e}"),
                    DamageKind::Invalid(p) => format!("log tree block: {}", p.message),
                };
                return Err(Error::corrupt_as(
                    crate::CorruptKind::LogBlock,
                    what,
                    d.at.bytenr,
                ));
            }
        }
        if !items.is_sorted_by(|a, b| a.0 <= b.0) {
            // Only a damaged tree read leniently gets here.
            items.sort_by_key(|a| a.0);
            read.leaf_starts.clear();
        }
        Ok(())
    }
}

fn take_items(
    opts: ReadOptions,
    node: &Node,
    problems: &[Problem],
    read: &mut TreeRead,
    items: &mut Vec<(Key, Vec<u8>)>,
) -> Result<()> {
    read.leaf_starts.push((items.len(), node.bytenr));
    for slot in 0..node.nr_safe() {
        let Some(key) = node.key(slot) else { continue };
        match node.item_data(slot) {
            Ok(d) => {
                // A logged file extent beyond the bounds the format gives
                // (a range of 2^45 bytes over 64 KiB of data) is damage:
                // replay fails on it before anything is sized by it,
                // salvage leaves its inode out, inspection shows it with
                // the problem.
                if let Some(e) = extent_out_of_bounds(&key, d) {
                    if opts.on_damage == OnDamage::Fail {
                        return Err(Error::Corrupt {
                            kind: crate::CorruptKind::LogBlock,
                            what: format!("logged {}", error_text(&e)),
                            bytenr: node.bytenr,
                            key: Some(key),
                        });
                    }
                    read.problems.push(LogProblem {
                        bytenr: node.bytenr,
                        key: Some(key),
                        message: error_text(&e),
                        class: ProblemClass::Item,
                        slot: Some(slot),
                    });
                }
                items.push((key, d.to_vec()))
            }
            Err(e) => {
                if opts.on_damage == OnDamage::Fail {
                    return Err(e);
                }
                if !problems.iter().any(|p| p.slot == Some(slot)) {
                    read.problems.push(LogProblem {
                        bytenr: node.bytenr,
                        key: Some(key),
                        message: error_text(&e),
                        class: ProblemClass::Item,
                        slot: Some(slot),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The bounds error of a file extent item that parses but breaks the
/// bounds the format gives ([`FileExtent::check_bounds`]); None for every
/// other item (one that does not parse is the block checks' to report).
///
/// [`FileExtent::check_bounds`]: crate::format::file_extent::FileExtent::check_bounds
pub fn extent_out_of_bounds(key: &Key, d: &[u8]) -> Option<Error> {
    if key.ty != BTRFS_EXTENT_DATA_KEY {
        return None;
    }
    parse_file_extent(d).ok()?.check_bounds(key).err()
}

fn block_problem(p: &Problem) -> LogProblem {
    LogProblem {
        bytenr: p.bytenr,
        key: p.key,
        message: p.message.clone(),
        class: ProblemClass::Damaged,
        slot: p.slot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage() {
        let mut v = vec![(10, 20), (30, 40), (18, 25), (40, 45)];
        merge_ranges(&mut v);
        assert_eq!(v, vec![(10, 25), (30, 45)]);
        assert_eq!(covered_bytes(&v, 0, 100), 30);
        assert_eq!(covered_bytes(&v, 20, 35), 10);
        assert_eq!(uncovered(&v, 0, 100), vec![(0, 10), (25, 30), (45, 100)]);
        assert_eq!(uncovered(&v, 12, 24), vec![]);
        assert_eq!(uncovered(&v, 24, 31), vec![(25, 30)]);
        assert_eq!(uncovered(&[], 5, 6), vec![(5, 6)]);
    }

    #[test]
    fn lost_ranges() {
        let k = |o| Key::new(o, BTRFS_INODE_ITEM_KEY, 0);
        let l = LostBlock {
            bytenr: 1,
            parent: None,
            level: 0,
            lo: k(260),
            hi: Some(k(300)),
            why: String::new(),
        };
        assert!(l.contains(k(260)));
        assert!(!l.contains(k(300)));
        assert!(!l.overlaps(Key::new(259, 0, 0), Key::new(259, 255, u64::MAX)));
        assert!(l.overlaps(Key::new(259, 0, 0), Key::new(260, 255, 0)));
        assert!(!l.overlaps(Key::new(259, 0, 0), Key::new(260, 0, 0)));
        let open = LostBlock { hi: None, ..l };
        assert!(open.contains(Key::new(u64::MAX, 255, u64::MAX)));
    }
}
