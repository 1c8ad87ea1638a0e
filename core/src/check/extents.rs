//! Phase 4: the extent tree against reality. While the trees are walked,
//! every pointer to a tree block and every file extent becomes a "found"
//! reference; the extent tree's items become "declared" references. Both
//! lists are sorted and merged: every extent must be referenced exactly as
//! its item says.

use super::findings::{Category, ExtentRef, Phase, Repair, F};
use super::Ctx;
use crate::format::consts::*;
use crate::format::extent::{extent_data_ref_hash, InlineRef};
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::item::{decode, ItemBody};
use crate::tree::Node;
use rayon::slice::ParallelSliceMut;
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

const P: Phase = Phase::Extents;

/// A reference, in the extent tree's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum RefKey {
    Tree(u64),
    Shared(u64),
    Data { root: u64, ino: u64, offset: u64 },
    SharedData(u64),
}

impl std::fmt::Display for RefKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefKey::Tree(r) => write!(f, "tree block ref (root {})", *r as i64),
            RefKey::Shared(p) => write!(f, "shared block ref (parent {p})"),
            RefKey::Data { root, ino, offset } => write!(
                f,
                "data ref (root {} inode {ino} offset {offset})",
                *root as i64
            ),
            RefKey::SharedData(p) => write!(f, "shared data ref (parent {p})"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct RefRec {
    pub bytenr: u64,
    pub key: RefKey,
    pub count: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ExtRec {
    pub bytenr: u64,
    pub len: u64,
    pub refs: u64,
    pub generation: u64,
    pub flags: u64,
    /// Level of a tree block (METADATA_ITEM offset or tree_block_info).
    pub level: u8,
    /// Root of an owner ref (simple quotas), 0 without one.
    pub owner_root: u64,
}

/// A pointer seen in a tree: resolved into a [`RefKey`] once the extent
/// tree's flags of the parent are known.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FoundTree {
    pub bytenr: u64,
    /// 0 for a root block.
    pub parent: u64,
    /// Owner of the parent block, or the root id for a root block.
    pub owner: u64,
    pub level: u8,
    pub tree: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct FoundData {
    pub bytenr: u64,
    pub disk_len: u64,
    pub leaf: u64,
    pub owner: u64,
    pub ino: u64,
    pub offset: u64,
    /// The file extent item's key offset.
    pub key_offset: u64,
    /// Bytes of the extent the file extent uses, from its extent offset.
    pub used: u64,
    /// A regular (written) file extent, not a prealloc one.
    pub regular: bool,
    /// Its inode has the nodatasum flag (its data has no checksums), as far
    /// as the inode item read before it in the same tree says.
    pub nodatasum: bool,
}

#[derive(Default)]
pub(crate) struct Facts {
    pub recs: Vec<ExtRec>,
    pub declared: Vec<RefRec>,
    pub found_tree: Vec<FoundTree>,
    pub found_data: Vec<FoundData>,
    /// (bytenr, header owner) of every tree block read, in walk order.
    pub block_owner: Vec<(u64, u64)>,
    /// (tree, inode, nodatasum) of the last inode item the walk of a
    /// subvolume passed: its file extents come after it in key order.
    pub last_inode: (u64, u64, bool),
    /// True once the extent tree has been read and `recs` sorted.
    pub loaded: bool,
    /// Findings about one extent item that the trees' references answer
    /// (an item that cannot be read, references out of order): reported
    /// by [`check`] with the item rebuilt from those references.
    pub item_findings: Vec<(u64, Option<u64>, super::Finding)>,
    /// Per tree, the highest-level tree blocks whose first back reference
    /// names it: where its root must be (btrfs check's roots info cache).
    pub root_blocks: std::collections::HashMap<u64, RootBlock>,
}

/// The highest-level tree blocks whose extent item's first back reference
/// is a TREE_BLOCK_REF of one tree. A live tree's root is the only block
/// at its level that names the tree first (shared blocks below it name the
/// lowest tree id first; the tree's own copies are below its root).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RootBlock {
    pub bytenr: u64,
    pub level: u8,
    /// How many blocks at that level name the tree first.
    pub count: u32,
}

impl Facts {
    /// Bytes of extents starting in `[start, end)`.
    pub fn used_in(&self, start: u64, end: u64, _nodesize: u64) -> u64 {
        let i = self.recs.partition_point(|r| r.bytenr < start);
        self.recs[i..]
            .iter()
            .take_while(|r| r.bytenr < end)
            .fold(0u64, |a, r| a.saturating_add(r.len))
    }
}

/// Extent tree leaf: extent items, their keyed refs, block group items.
pub(super) fn on_extent_leaf(cx: &mut Ctx, node: &Node) {
    let skinny = cx.has_incompat(BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA);
    for (k, d) in node.items() {
        let Some(d) = d else {
            continue;
        };
        match k.ty {
            BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY => {
                on_extent_item(cx, node, k, d, skinny)
            }
            BTRFS_TREE_BLOCK_REF_KEY
            | BTRFS_SHARED_BLOCK_REF_KEY
            | BTRFS_EXTENT_DATA_REF_KEY
            | BTRFS_SHARED_DATA_REF_KEY => on_back_ref(cx, node, k, d),
            BTRFS_EXTENT_REF_V0_KEY => {
                cx.report(
                    F::err(P, Category::ExtentRef)
                        .tree(2)
                        .at(node.bytenr)
                        .key(k)
                        .msg("v0 extent back reference (unsupported ancient format)"),
                );
            }
            BTRFS_BLOCK_GROUP_ITEM_KEY => super::chunks::on_bg_item(cx, &k, d),
            _ => {}
        }
    }
}

/// An extent or metadata item: its record, its inline references (in
/// the order the kernel keeps them), the root block it may be.
fn on_extent_item(cx: &mut Ctx, node: &Node, k: crate::format::key::Key, d: &[u8], skinny: bool) {
    let ns = cx.img.nodesize as u64;
    let v = match decode(&k, d, 0).map_err(|e| e.at(node.bytenr, k)) {
        Ok(ItemBody::Extent(v)) => v,
        Ok(_) => return,
        Err(e) => {
            // Its key still claims the range; the references
            // the trees hold say what it should hold.
            let len = match k.ty {
                BTRFS_METADATA_ITEM_KEY => ns,
                _ => k.offset,
            };
            cx.ext.item_findings.push((
                k.objectid,
                Some(len),
                F::err(P, Category::ExtentItem)
                    .tree(2)
                    .at(node.bytenr)
                    .key(k)
                    .msg(format!("extent item unreadable: {e}")),
            ));
            return;
        }
    };
    if k.ty == BTRFS_METADATA_ITEM_KEY && !skinny {
        cx.report(
            F::err(P, Category::ExtentItem)
                .tree(2)
                .at(node.bytenr)
                .key(k)
                .msg("metadata item without the skinny_metadata feature"),
        );
    }
    let flags = v.item.flags.get();
    let (len, level) = if k.ty == BTRFS_METADATA_ITEM_KEY {
        (ns, k.offset.min(255) as u8)
    } else {
        (k.offset, v.tree_block_info.map(|t| t.level).unwrap_or(0))
    };
    cx.ext.recs.push(ExtRec {
        bytenr: k.objectid,
        len,
        refs: v.item.refs.get(),
        generation: v.item.generation.get(),
        flags,
        level,
        owner_root: v
            .refs
            .iter()
            .find_map(|r| match *r {
                InlineRef::Owner { root } => Some(root),
                _ => None,
            })
            .unwrap_or(0),
    });
    if flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
        let first = v
            .refs
            .iter()
            .find(|r| !matches!(r, InlineRef::Owner { .. }));
        if let Some(&InlineRef::TreeBlock { root }) = first {
            let e = cx.ext.root_blocks.entry(root).or_insert(RootBlock {
                bytenr: k.objectid,
                level,
                count: 0,
            });
            if level > e.level || e.count == 0 {
                *e = RootBlock {
                    bytenr: k.objectid,
                    level,
                    count: 1,
                };
            } else if level == e.level {
                e.count += 1;
            }
        }
    }
    on_inline_refs(cx, node, k, &v.refs);
}

/// An extent item's inline references: declared, and in the order the
/// kernel keeps them.
fn on_inline_refs(cx: &mut Ctx, node: &Node, k: crate::format::key::Key, refs: &[InlineRef]) {
    let mut last: Option<(u8, u64)> = None;
    for r in refs {
        let (rk, count) = match *r {
            InlineRef::TreeBlock { root } => (RefKey::Tree(root), 1),
            InlineRef::SharedBlock { parent } => (RefKey::Shared(parent), 1),
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                count,
            } => (
                RefKey::Data {
                    root,
                    ino: objectid,
                    offset,
                },
                count as u64,
            ),
            InlineRef::SharedData { parent, count } => (RefKey::SharedData(parent), count as u64),
            InlineRef::Owner { .. } => continue,
        };
        let seq = match *r {
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                ..
            } => extent_data_ref_hash(root, objectid, offset),
            InlineRef::TreeBlock { root: v }
            | InlineRef::SharedBlock { parent: v }
            | InlineRef::SharedData { parent: v, .. } => v,
            InlineRef::Owner { root } => root,
        };
        let t = r.type_key();
        // Types ascend; within a type the kernel keeps offsets/hashes descending.
        if let Some(l) = last {
            if t < l.0 || (t == l.0 && seq > l.1) {
                let what = if t == l.0 {
                    format!("type {t} reference {seq:#x} after {:#x} (the kernel keeps them descending)", l.1)
                } else {
                    format!("type {t} after type {}", l.0)
                };
                cx.ext.item_findings.push((
                    k.objectid,
                    None,
                    F::err(P, Category::ExtentItem)
                        .tree(2)
                        .at(node.bytenr)
                        .key(k)
                        .msg(format!("inline refs out of order: {what}")),
                ));
            }
        }
        last = Some((t, seq));
        cx.ext.declared.push(RefRec {
            bytenr: k.objectid,
            key: rk,
            count,
        });
    }
}

/// A keyed back reference: it must follow its extent item.
fn on_back_ref(cx: &mut Ctx, node: &Node, k: crate::format::key::Key, d: &[u8]) {
    let rk = match decode(&k, d, 0) {
        Ok(ItemBody::TreeBlockRef) => (RefKey::Tree(k.offset), 1),
        Ok(ItemBody::SharedBlockRef) => (RefKey::Shared(k.offset), 1),
        Ok(ItemBody::ExtentDataRef(r)) => {
            let (root, ino, off) = (r.root.get(), r.objectid.get(), r.offset.get());
            if extent_data_ref_hash(root, ino, off) != k.offset {
                cx.report(
                    F::err(P, Category::ExtentRef)
                        .tree(2)
                        .at(node.bytenr)
                        .key(k)
                        .msg("extent data ref key offset is not the hash of its contents"),
                );
            }
            (
                RefKey::Data {
                    root,
                    ino,
                    offset: off,
                },
                r.count.get() as u64,
            )
        }
        Ok(ItemBody::SharedDataRef(r)) => (RefKey::SharedData(k.offset), r.count.get() as u64),
        _ => return,
    };
    if cx.ext.recs.last().is_none_or(|r| r.bytenr != k.objectid) {
        cx.report(
            F::err(P, Category::ExtentRef)
                .tree(2)
                .at(node.bytenr)
                .key(k)
                .msg("back reference without an extent item"),
        );
    }
    cx.ext.declared.push(RefRec {
        bytenr: k.objectid,
        key: rk.0,
        count: rk.1,
    });
}

/// File extents of a leaf of an fs or reloc tree, as data references.
pub(super) fn on_fs_leaf(cx: &mut Ctx, node: &Node) {
    let owner = node.owner();
    for (k, d) in node.items() {
        if k.ty == BTRFS_INODE_ITEM_KEY {
            if let Some(Ok(ItemBody::InodeItem(ii))) = d.map(|d| decode(&k, d, 0)) {
                cx.ext.last_inode = (
                    owner,
                    k.objectid,
                    ii.flags.get() & BTRFS_INODE_NODATASUM != 0,
                );
            }
            continue;
        }
        if k.ty != BTRFS_EXTENT_DATA_KEY {
            continue;
        }
        let Some(d) = d else {
            continue;
        };
        let Ok(FileExtent::Disk { head, item }) = parse_file_extent(d) else {
            continue;
        };
        let bytenr = item.disk_bytenr.get();
        if bytenr == 0 {
            continue;
        }
        cx.ext.found_data.push(FoundData {
            bytenr,
            disk_len: item.disk_num_bytes.get(),
            leaf: node.bytenr,
            owner,
            ino: k.objectid,
            offset: k.offset.wrapping_sub(item.offset.get()),
            key_offset: k.offset,
            used: item.offset.get().saturating_add(item.num_bytes.get()),
            regular: head.type_ == BTRFS_FILE_EXTENT_REG,
            nodatasum: cx.ext.last_inode == (owner, k.objectid, true),
        });
    }
}

pub(super) fn check(cx: &mut Ctx) {
    let recs = std::mem::take(&mut cx.ext.recs);
    let mut declared = std::mem::take(&mut cx.ext.declared);
    cx.sink.checked(P, recs.len() as u64);
    let found_tree = std::mem::take(&mut cx.ext.found_tree);
    let found_data = std::mem::take(&mut cx.ext.found_data);
    if cx.opts.for_repair {
        let ns = cx.img.nodesize as u64;
        let ranges = found_tree
            .iter()
            .map(|t| (t.bytenr, ns))
            .chain(found_data.iter().map(|d| (d.bytenr, d.disk_len)))
            .collect();
        cx.sink.in_use = super::csums::union_of(ranges);
    }
    let found = resolve_found(cx, &recs, &found_tree, &found_data);
    declared.par_sort_unstable_by(|a, b| (a.bytenr, a.key).cmp(&(b.bytenr, b.key)));
    let mut m = Merge {
        level_of: found_tree.iter().map(|t| (t.bytenr, t.level)).collect(),
        tree_of: found_tree.iter().map(|t| (t.bytenr, t.tree)).collect(),
        // Items that cannot be read or hold their references out of order.
        unreadable: cx
            .ext
            .item_findings
            .iter()
            .filter_map(|(b, len, _)| Some((*b, (*len)?)))
            .collect(),
        recs,
        declared,
        found,
        pending: Vec::new(),
        unfixable: HashSet::new(),
        other_owners: HashSet::new(),
        rebuild: HashMap::new(),
        matched: HashMap::new(),
        bad_fixes: HashMap::new(),
        missing_item_reported: None,
        rec_cursor: 0,
    };
    m.check_items(cx);
    m.rebuild_unreadable_items(cx);
    m.match_bad_file_extents(cx, &found_data);
    // The checksum and quota phases use the references too.
    cx.ext.found_tree = found_tree;
    cx.ext.found_data = found_data;
    m.merge_refs(cx);
    m.report_pending(cx);
    cx.ext.recs = m.recs;
}

/// What the trees reference, in extent-tree terms: one record per
/// (extent, reference) with its count and the length the referrers give
/// it (`u64::MAX` when they disagree), sorted.
fn resolve_found(
    cx: &Ctx,
    recs: &[ExtRec],
    found_tree: &[FoundTree],
    found_data: &[FoundData],
) -> Vec<(RefRec, u64)> {
    let ns = cx.img.nodesize as u64;
    // Asked once per reference found (hundreds of thousands): a search of
    // the few blocks with the flag, not of every extent item.
    let full: Vec<u64> = recs
        .iter()
        .filter(|r| r.flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0)
        .map(|r| r.bytenr)
        .collect();
    let full_backref = |parent: u64| full.binary_search(&parent).is_ok();

    let mut found: Vec<(RefRec, u64)> = Vec::with_capacity(found_tree.len() + found_data.len());
    for t in found_tree {
        let key = if t.parent == 0 {
            RefKey::Tree(t.owner)
        } else if t.parent == t.bytenr {
            RefKey::Shared(t.bytenr)
        } else if full_backref(t.parent) {
            RefKey::Shared(t.parent)
        } else {
            RefKey::Tree(t.owner)
        };
        found.push((
            RefRec {
                bytenr: t.bytenr,
                key,
                count: 1,
            },
            ns,
        ));
    }
    for d in found_data {
        let key = if full_backref(d.leaf) {
            RefKey::SharedData(d.leaf)
        } else {
            RefKey::Data {
                root: d.owner,
                ino: d.ino,
                offset: d.offset,
            }
        };
        found.push((
            RefRec {
                bytenr: d.bytenr,
                key,
                count: 1,
            },
            d.disk_len,
        ));
    }
    // Both lists run to hundreds of thousands of entries: sorted on every core.
    found.par_sort_unstable_by(|a, b| (a.0.bytenr, a.0.key).cmp(&(b.0.bytenr, b.0.key)));
    // Several file extents may share one reference (a split extent).
    let mut agg: Vec<(RefRec, u64)> = Vec::with_capacity(found.len());
    for (r, len) in found {
        match agg.last_mut() {
            Some((l, llen)) if l.bytenr == r.bytenr && l.key == r.key => {
                l.count += r.count;
                if *llen != len {
                    *llen = u64::MAX;
                }
            }
            _ => agg.push((r, len)),
        }
    }
    agg
}

/// The extent tree's findings, merged with the trees' references: what
/// one extent's findings wait for (its item rebuilt, a bad file extent
/// pointed at it) is known only once all are seen.
struct Merge {
    recs: Vec<ExtRec>,
    declared: Vec<RefRec>,
    found: Vec<(RefRec, u64)>,
    /// Level of each tree block the trees point at.
    level_of: HashMap<u64, u8>,
    /// Tree of each tree block the trees point at.
    tree_of: HashMap<u64, u64>,
    /// Extent items that cannot be read, with their length.
    unreadable: HashMap<u64, u64>,
    /// Reference findings wait for the merge: an extent whose item exists
    /// and whose only problem is the counts of its references (the same
    /// references as the trees hold, counted wrong) gets them rewritten.
    pending: Vec<(u64, super::Finding)>,
    unfixable: HashSet<u64>,
    /// Extents whose references the trees hold under other owners or kinds
    /// than the item declares (not only with other counts).
    other_owners: HashSet<u64>,
    /// Extent items to write again from the trees' references, by start:
    /// every other finding about the same extent takes that repair.
    rebuild: HashMap<u64, Repair>,
    /// Extents a bad file extent is pointed at.
    matched: HashMap<u64, Repair>,
    /// Bad file extents by disk address, with their repair and whether the
    /// address itself is bad.
    bad_fixes: HashMap<u64, Vec<(FoundData, Repair, bool)>>,
    missing_item_reported: Option<u64>,
    /// Where the last [`Merge::rec_of`] found its extent: the merge asks in
    /// address order, so the next is at or after it.
    rec_cursor: usize,
}

impl Merge {
    /// The extent item of extent `b`. Asked in increasing order (the
    /// merge of the sorted reference lists), it is found by walking on
    /// from the last one, not by a search per reference.
    fn rec_of(&mut self, b: u64) -> Option<ExtRec> {
        let recs = &self.recs;
        let mut i = self.rec_cursor.min(recs.len());
        if i > 0 && recs[i - 1].bytenr >= b {
            i = recs.partition_point(|r| r.bytenr < b);
        }
        while i < recs.len() && recs[i].bytenr < b {
            i += 1;
        }
        self.rec_cursor = i;
        recs.get(i).filter(|r| r.bytenr == b).copied()
    }

    /// The references the trees hold to extent `b`.
    fn refs_at(&self, b: u64) -> Vec<ExtentRef> {
        let lo = self.found.partition_point(|(r, _)| r.bytenr < b);
        let hi = self.found.partition_point(|(r, _)| r.bytenr <= b);
        self.found[lo..hi]
            .iter()
            .map(|(r, _)| extent_ref(r))
            .collect()
    }

    /// The repair writing extent item `b` again (the same one for every
    /// finding about it).
    fn rebuild_of(&mut self, b: u64, len: u64, level: Option<u8>) -> Repair {
        if let Some(r) = self.rebuild.get(&b) {
            return r.clone();
        }
        let r = Repair::RebuildExtentItem {
            bytenr: b,
            len,
            level,
            refs: self.refs_at(b),
        };
        self.rebuild.insert(b, r.clone());
        r
    }

    /// Per extent item: counts, flags, generation, placement.
    fn check_items(&mut self, cx: &mut Ctx) {
        let gen = cx.gen;
        let mut prev_end = 0u64;
        let mut prev_start = None::<u64>;
        let mut di = 0usize;
        for idx in 0..self.recs.len() {
            let r = self.recs[idx];
            let b = r.bytenr;
            let declared = &self.declared;
            while di < declared.len() && declared[di].bytenr < b {
                di += 1;
            }
            let mut sum = 0u64;
            let mut j = di;
            while j < declared.len() && declared[j].bytenr == b {
                sum = sum.saturating_add(declared[j].count);
                j += 1;
            }
            if prev_start == Some(b) {
                cx.report(
                    F::err(P, Category::ExtentItem)
                        .tree(2)
                        .at(b)
                        .msg(format!("extent {b} has more than one extent item")),
                );
            } else if b < prev_end {
                cx.report(
                    F::err(P, Category::ExtentOverlap)
                        .tree(2)
                        .at(b)
                        .msg(format!(
                            "extent {b}+{} overlaps the previous extent ending at {prev_end}",
                            r.len
                        )),
                );
            }
            prev_start = Some(b);
            prev_end = prev_end.max(b.saturating_add(r.len));
            if sum != r.refs {
                self.pending.push((
                    b,
                    F::err(P, Category::ExtentRefs).tree(2).at(b).msg(format!(
                        "extent {b}+{} item says {} refs but holds {sum}",
                        r.len, r.refs
                    )),
                ));
            }
            if r.refs == 0 {
                self.pending.push((
                    b,
                    F::err(P, Category::ExtentRefs)
                        .tree(2)
                        .at(b)
                        .msg(format!("extent {b} has zero refs")),
                ));
            }
            if r.generation > gen.saturating_add(1) {
                cx.report(
                    F::err(P, Category::ExtentGeneration)
                        .tree(2)
                        .at(b)
                        .fix(Repair::ExtentGeneration { bytenr: b })
                        .msg(format!(
                            "invalid generation {} for extent {b}, expected (0, {}]",
                            r.generation,
                            gen.saturating_add(1)
                        )),
                );
            }
            check_item_shape(cx, &r);
            check_item_placement(cx, &r, &self.declared[di..j]);
            check_tree_block_length(cx, &r);
        }
    }
}

/// An extent item's alignment and flags.
fn check_item_shape(cx: &mut Ctx, r: &ExtRec) {
    let ss = cx.img.sectorsize as u64;
    let b = r.bytenr;
    let is_tree = r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0;
    let is_data = r.flags & BTRFS_EXTENT_FLAG_DATA != 0;
    if !b.is_multiple_of(ss) || r.len == 0 || !r.len.is_multiple_of(ss) {
        cx.report(F::err(P, Category::ExtentItem).tree(2).at(b).msg(format!(
            "extent {b}+{} is not aligned to the sector size {ss}",
            r.len
        )));
    }
    if is_tree == is_data {
        cx.report(F::err(P, Category::ExtentItem).tree(2).at(b).msg(format!(
            "extent {b} flags 0x{:x} are neither data nor tree block",
            r.flags
        )));
    }
    if is_data && r.flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0 {
        cx.report(
            F::err(P, Category::ExtentItem)
                .tree(2)
                .at(b)
                .msg(format!("data extent {b} has the full backref flag")),
        );
    }
}

/// Whether an extent item lies inside a block group of its kind (and a
/// tree block inside one stripe).
fn check_item_placement(cx: &mut Ctx, r: &ExtRec, declared: &[RefRec]) {
    let ns = cx.img.nodesize as u64;
    let b = r.bytenr;
    let is_tree = r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0;
    let is_data = r.flags & BTRFS_EXTENT_FLAG_DATA != 0;
    match cx.chunks.bg_of(b).copied() {
        None => cx.report(
            F::err(P, Category::ExtentPlacement)
                .tree(2)
                .at(b)
                .msg(format!("extent {b}+{} is outside every block group", r.len)),
        ),
        Some(bg) => {
            if b.saturating_add(r.len) > bg.end() {
                cx.report(
                    F::err(P, Category::ExtentPlacement)
                        .tree(2)
                        .at(b)
                        .msg(format!(
                            "extent {b}+{} crosses the end of block group {}",
                            r.len, bg.start
                        )),
                );
            }
            let want = if is_data {
                BTRFS_BLOCK_GROUP_DATA
            } else if declared
                .iter()
                .any(|d| d.key == RefKey::Tree(BTRFS_CHUNK_TREE_OBJECTID))
            {
                BTRFS_BLOCK_GROUP_SYSTEM
            } else {
                BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_SYSTEM
            };
            if bg.flags & want == 0 {
                cx.report(
                    F::err(P, Category::ExtentPlacement)
                        .tree(2)
                        .at(b)
                        .msg(format!(
                            "extent {b}+{} ({}) lies in a {} block group",
                            r.len,
                            if is_data { "data" } else { "tree block" },
                            crate::format::names::block_group_flags_str(bg.flags)
                        )),
                );
            }
            if is_tree {
                let off = b - bg.start;
                if off / BTRFS_STRIPE_LEN != off.saturating_add(ns.max(1) - 1) / BTRFS_STRIPE_LEN {
                    cx.report(
                        F::err(P, Category::ExtentPlacement)
                            .tree(2)
                            .at(b)
                            .msg(format!(
                                "tree block [{b}, {}) crosses a 64KiB stripe boundary",
                                b.saturating_add(ns)
                            )),
                    );
                }
                if !b.is_multiple_of(ns) {
                    cx.report(
                        F::warn(P, Category::ExtentPlacement)
                            .tree(2)
                            .at(b)
                            .msg(format!("tree block {b} is not nodesize aligned")),
                    );
                }
            }
        }
    }
}

/// A tree block's extent is one node long.
fn check_tree_block_length(cx: &mut Ctx, r: &ExtRec) {
    let ns = cx.img.nodesize as u64;
    let b = r.bytenr;
    let is_tree = r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0;
    if is_tree && r.len != ns {
        cx.report(F::err(P, Category::ExtentItem).tree(2).at(b).msg(format!(
            "tree block extent {b} has length {} not nodesize {ns}",
            r.len
        )));
    }
}

impl Merge {
    /// Extent items that cannot be read (or hold their references out of
    /// order) are written again from the trees' references.
    fn rebuild_unreadable_items(&mut self, cx: &mut Ctx) {
        for (b, len, mut f) in std::mem::take(&mut cx.ext.item_findings) {
            let rec = self
                .recs
                .binary_search_by_key(&b, |r| r.bytenr)
                .ok()
                .map(|i| self.recs[i]);
            let Some(len) = len.or(rec.map(|r| r.len)) else {
                cx.report(f);
                continue;
            };
            let tree_block = self.level_of.contains_key(&b)
                || rec.is_some_and(|r| r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0)
                || f.key.is_some_and(|k| k.ty == BTRFS_METADATA_ITEM_KEY);
            let level = tree_block.then(|| {
                self.level_of
                    .get(&b)
                    .copied()
                    .or(rec.map(|r| r.level))
                    .unwrap_or(0)
            });
            // A tree block only the trees can name the level of.
            if tree_block && !self.level_of.contains_key(&b) && !self.refs_at(b).is_empty() {
                cx.report(f);
                continue;
            }
            f.repair = Some(self.rebuild_of(b, len, level));
            cx.report(f);
        }
    }

    /// File extents whose disk address is no extent's: off the sector
    /// size, inside no data block group, or across its end.
    fn match_bad_file_extents(&mut self, cx: &Ctx, found_data: &[FoundData]) {
        let ss = cx.img.sectorsize as u64;
        let recs = &self.recs;
        let declared = &self.declared;
        let found = &self.found;
        let unreadable = &self.unreadable;
        // File extents whose disk address is no extent's: off the sector size,
        // inside no data block group, or across its end. Each is matched with
        // the extent item whose back reference names it and that no file
        // extent uses (btrfs check's repair of a bad file extent bytenr), or
        // made a hole.
        let bad_disk = |b: u64, len: u64| {
            !b.is_multiple_of(ss)
                || len == 0
                || !len.is_multiple_of(ss)
                || cx.chunks.bg_of(b).is_none_or(|bg| {
                    bg.flags & BTRFS_BLOCK_GROUP_DATA == 0 || b.saturating_add(len) > bg.end()
                })
        };
        // File extents whose disk address has no extent item: matched as
        // well when the address itself is sound (pointed into free space),
        // but made holes only when it is not (an address that merely lost
        // its item gets the item back).
        // Addresses referenced without an item: both lists are sorted, so
        // one pass finds them (usually none, and then no file extent is
        // looked at again).
        let mut no_item: HashSet<u64> = HashSet::new();
        let mut ri = 0usize;
        for (r, _) in found {
            while ri < recs.len() && recs[ri].bytenr < r.bytenr {
                ri += 1;
            }
            if recs.get(ri).is_none_or(|x| x.bytenr != r.bytenr) {
                no_item.insert(r.bytenr);
            }
        }
        let bad_data: Vec<(FoundData, bool)> = if no_item.is_empty() {
            Vec::new()
        } else {
            found_data
                .iter()
                .filter(|d| no_item.contains(&d.bytenr) && !unreadable.contains_key(&d.bytenr))
                .map(|d| (*d, bad_disk(d.bytenr, d.disk_len)))
                .collect()
        };
        let csum_items = &cx.csum.items;
        let csum_covered = |s: u64, len: u64| {
            let e = s.saturating_add(len);
            let i = csum_items.partition_point(|it| it.0 < e);
            i.checked_sub(1)
                .is_some_and(|p| csum_items[p].0.saturating_add(csum_items[p].1) > s)
        };
        if !bad_data.is_empty() {
            let referenced: std::collections::HashSet<u64> =
                found.iter().map(|(r, _)| r.bytenr).collect();
            for (d, bad) in &bad_data {
                let want = RefKey::Data {
                    root: d.owner,
                    ino: d.ino,
                    offset: d.offset,
                };
                let candidates: Vec<&ExtRec> = declared
                    .iter()
                    .filter(|r| r.key == want && !referenced.contains(&r.bytenr))
                    .filter_map(|r| {
                        let i = recs.binary_search_by_key(&r.bytenr, |x| x.bytenr).ok()?;
                        Some(&recs[i])
                    })
                    .filter(|r| r.flags & BTRFS_EXTENT_FLAG_DATA != 0 && d.used <= r.len)
                    .collect();
                let to = match candidates.as_slice() {
                    [one] => Some((one.bytenr, one.len)),
                    _ => None,
                };
                // No extent item names it and the address is sound: an extent
                // whose item was lost has its checksums still (the item comes
                // back), an address that points into space never written
                // has none (garbage: a hole). Without checksums to tell
                // (nodatasum, prealloc), the item comes back.
                let never_written =
                    d.regular && !d.nodatasum && !csum_covered(d.bytenr, d.disk_len);
                if to.is_none() && !*bad && !never_written {
                    continue;
                }
                let fix = Repair::FileExtentDisk {
                    tree: d.owner,
                    ino: d.ino,
                    offset: d.key_offset,
                    from: d.bytenr,
                    to,
                };
                if let Some((b, _)) = to {
                    self.matched.insert(b, fix.clone());
                }
                self.bad_fixes
                    .entry(d.bytenr)
                    .or_default()
                    .push((*d, fix, *bad));
            }
        }
    }

    /// Declared references against found ones, per (bytenr, reference).
    fn merge_refs(&mut self, cx: &mut Ctx) {
        let (mut i, mut j) = (0usize, 0usize);
        while i < self.declared.len() || j < self.found.len() {
            let ord = match (self.declared.get(i), self.found.get(j)) {
                (Some(d), Some((f, _))) => (d.bytenr, d.key).cmp(&(f.bytenr, f.key)),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match ord {
                Ordering::Less => {
                    self.declared_not_found(self.declared[i]);
                    i += 1;
                }
                Ordering::Greater => {
                    self.found_not_declared(cx, self.found[j]);
                    j += 1;
                }
                Ordering::Equal => {
                    self.compare_counts(cx, self.declared[i], self.found[j]);
                    i += 1;
                    j += 1;
                }
            }
        }
    }

    /// A reference the extent item declares and no tree holds.
    fn declared_not_found(&mut self, d: RefRec) {
        let tree = match d.key {
            RefKey::Tree(r) => Some(r),
            RefKey::Data { root, .. } => Some(root),
            _ => None,
        };
        let mut f = F::err(P, Category::ExtentRef).at(d.bytenr);
        if let Some(t) = tree {
            f = f.tree(t);
        }
        // A reference of another kind or owner than the trees
        // show: the trees are what reads the data, so theirs are
        // written, unless the subvolume links are damaged (a
        // damaged root item can make a tree look like another:
        // the plan then leaves these alone).
        self.other_owners.insert(d.bytenr);
        self.pending.push((
            d.bytenr,
            f.msg(format!(
                "extent {} declares {} (count {}) that no tree holds",
                d.bytenr, d.key, d.count
            )),
        ));
    }

    /// A reference a tree holds and the extent item does not declare.
    fn found_not_declared(&mut self, cx: &mut Ctx, (f, len): (RefRec, u64)) {
        match self.recs.binary_search_by_key(&f.bytenr, |r| r.bytenr) {
            Err(_) if self.bad_fixes.contains_key(&f.bytenr) => {
                if self.missing_item_reported != Some(f.bytenr) {
                    self.missing_item_reported = Some(f.bytenr);
                    for (d, fix, bad) in self.bad_fixes.remove(&f.bytenr).unwrap_or_default() {
                        let why = match (bad, &fix) {
                            (true, _) => "not aligned or inside no data block group",
                            (false, Repair::FileExtentDisk { to: Some(_), .. }) => {
                                "an extent item elsewhere names it"
                            }
                            _ => "free space no checksum covers: never written",
                        };
                        cx.report(
                                    F::err(P, Category::ExtentMissing)
                                        .tree(d.owner)
                                        .at(d.bytenr)
                                        .key(crate::format::key::Key::new(
                                            d.ino,
                                            BTRFS_EXTENT_DATA_KEY,
                                            d.key_offset,
                                        ))
                                        .fix(fix)
                                        .msg(format!(
                                            "inode {} file extent at {} points at {}+{}, where no extent item is ({})",
                                            d.ino,
                                            d.key_offset,
                                            d.bytenr,
                                            d.disk_len,
                                            why
                                        )),
                                );
                    }
                }
            }
            Err(_) if self.unreadable.contains_key(&f.bytenr) => {
                // Its item exists but cannot be read: rebuilt above.
                if self.missing_item_reported != Some(f.bytenr) {
                    self.missing_item_reported = Some(f.bytenr);
                    let len = self.unreadable[&f.bytenr];
                    let tree_block = matches!(f.key, RefKey::Tree(_) | RefKey::Shared(_));
                    let level = if tree_block {
                        self.level_of.get(&f.bytenr).copied()
                    } else {
                        None
                    };
                    let mut fi = F::err(P, Category::ExtentMissing).at(f.bytenr);
                    if tree_block == level.is_some() {
                        fi = fi.fix(self.rebuild_of(f.bytenr, len, level));
                    }
                    cx.report(fi.msg(format!(
                        "extent {}+{len} referenced by {} has no readable extent item",
                        f.bytenr, f.key
                    )));
                }
            }
            Err(_) => {
                if self.missing_item_reported != Some(f.bytenr) {
                    self.missing_item_reported = Some(f.bytenr);
                    let what = if matches!(f.key, RefKey::Tree(_) | RefKey::Shared(_)) {
                        "tree block"
                    } else {
                        "data extent"
                    };
                    let mut fi = F::err(P, Category::ExtentMissing).at(f.bytenr);
                    if let Some(t) = self.tree_of.get(&f.bytenr) {
                        fi = fi.tree(*t);
                    }
                    // The range must be free of every extent item
                    // to be given back to the extent.
                    let tree_block = matches!(f.key, RefKey::Tree(_) | RefKey::Shared(_));
                    let at = self.recs.partition_point(|r| r.bytenr < f.bytenr);
                    let clear = len != u64::MAX
                        && len > 0
                        && at.checked_sub(1).is_none_or(|p| {
                            self.recs[p].bytenr.saturating_add(self.recs[p].len) <= f.bytenr
                        })
                        && self
                            .recs
                            .get(at)
                            .is_none_or(|n| n.bytenr >= f.bytenr.saturating_add(len));
                    if clear {
                        let lo = self.found.partition_point(|(r, _)| r.bytenr < f.bytenr);
                        let hi = self.found.partition_point(|(r, _)| r.bytenr <= f.bytenr);
                        let same_len = self.found[lo..hi].iter().all(|(_, l)| *l == len);
                        if same_len {
                            fi = fi.fix(Repair::AddExtentItem {
                                bytenr: f.bytenr,
                                len,
                                level: if tree_block {
                                    self.level_of.get(&f.bytenr).copied()
                                } else {
                                    None
                                },
                                refs: self.found[lo..hi]
                                    .iter()
                                    .map(|(r, _)| extent_ref(r))
                                    .collect(),
                            });
                        }
                    }
                    cx.report(fi.msg(format!(
                        "{what} {}+{len} referenced by {} has no extent item",
                        f.bytenr, f.key
                    )));
                }
            }
            Ok(_) => self.pending.push((
                {
                    self.other_owners.insert(f.bytenr);
                    f.bytenr
                },
                F::err(P, Category::ExtentRef).at(f.bytenr).msg(format!(
                    "extent {} is referenced by {} (count {}) but its item lacks that ref",
                    f.bytenr, f.key, f.count
                )),
            )),
        }
    }

    /// A reference both hold: its counts, and the lengths and levels the
    /// trees give the extent.
    fn compare_counts(&mut self, cx: &mut Ctx, d: RefRec, (f, len): (RefRec, u64)) {
        if d.count != f.count {
            self.pending.push((
                d.bytenr,
                F::err(P, Category::ExtentRef).at(d.bytenr).msg(format!(
                    "extent {} {}: item says count {} but {} found",
                    d.bytenr, d.key, d.count, f.count
                )),
            ));
        }
        if let Some(r) = self.rec_of(d.bytenr) {
            match d.key {
                RefKey::Data { .. } | RefKey::SharedData(_) => {
                    if len != r.len {
                        self.unfixable.insert(d.bytenr);
                        cx.report(F::err(P, Category::ExtentRef).at(d.bytenr).msg(format!(
                                    "file extents reference data extent {} with length {} but the extent is {} bytes",
                                    d.bytenr,
                                    if len == u64::MAX { "varying".to_string() } else { len.to_string() },
                                    r.len
                                )));
                    }
                }
                _ => {
                    if let Some(&l) = self.level_of.get(&d.bytenr) {
                        if l != r.level && r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
                            let fix = self.rebuild_of(d.bytenr, r.len, Some(l));
                            cx.report(
                                F::err(P, Category::ExtentItem)
                                    .tree(2)
                                    .at(d.bytenr)
                                    .fix(fix)
                                    .msg(format!(
                                        "tree block {} is level {l} but its extent item says {}",
                                        d.bytenr, r.level
                                    )),
                            );
                        }
                    }
                }
            }
        }
    }

    /// The reference findings, each with the repair that answers it.
    fn report_pending(&mut self, cx: &mut Ctx) {
        for (b, mut f) in std::mem::take(&mut self.pending) {
            let has_item = self.recs.binary_search_by_key(&b, |r| r.bytenr).is_ok();
            if let Some(fix) = self.matched.get(&b).or(self.rebuild.get(&b)) {
                // A bad file extent is pointed here, or the item is written
                // again: either answers its references.
                f.repair = Some(fix.clone());
            } else if has_item && !self.unfixable.contains(&b) {
                let lo = self.found.partition_point(|(r, _)| r.bytenr < b);
                let hi = self.found.partition_point(|(r, _)| r.bytenr <= b);
                let refs = self.found[lo..hi]
                    .iter()
                    .map(|(r, _)| extent_ref(r))
                    .collect();
                f.repair = Some(Repair::ExtentRefs {
                    bytenr: b,
                    refs,
                    other_owners: self.other_owners.contains(&b),
                });
            }
            cx.report(f);
        }
    }
}

/// A found reference as a repair writes it.
fn extent_ref(r: &RefRec) -> ExtentRef {
    match r.key {
        RefKey::Tree(root) => ExtentRef::Tree { root },
        RefKey::Shared(parent) => ExtentRef::SharedBlock { parent },
        RefKey::Data { root, ino, offset } => ExtentRef::Data {
            root,
            ino,
            offset,
            count: r.count,
        },
        RefKey::SharedData(parent) => ExtentRef::SharedData {
            parent,
            count: r.count,
        },
    }
}
