//! Phase 6's name matching, streamed with the walk. Every name of a
//! subvolume is recorded three times: the directory's DIR_ITEM and
//! DIR_INDEX, filed under the directory's objectid, and the named inode's
//! INODE_REF or INODE_EXTREF, filed under its own. Leaves arrive in key
//! order, so once the walk has passed both inodes a name's records are all
//! in: the name is settled then and forgotten. What is held is the names in
//! flight (about the largest directory's entries whose inodes come later)
//! and a mode and two bits per inode, not every name of the tree: at a
//! million files that is 5 MB where a list of every record was 96 MB.
//!
//! Settling costs no allocation for a clean name; a name with a problem is
//! kept and judged when the tree ends, when it is known whether its inode
//! has another name two records agree on.

use super::findings::Repair;
use crate::format::consts::*;
use crate::format::dir::ftype_of_mode;
use crate::fs::inode::{S_IFDIR, S_IFMT};
use crate::util::hash::FastMap;

/// (parent directory, named inode, name hash).
pub(super) type NameKey = (u64, u64, u32);

/// The records of one name seen so far, as held while the name is open:
/// small, as a million of them pass through the map. A second DIR_INDEX or
/// back reference of one name (a problem, or a rare hard link pattern)
/// goes to `Names::more`.
#[derive(Clone, Copy, Default)]
struct OpenName {
    /// DIR_ITEM entries (more than one is a problem), and the last one's type.
    items: u8,
    item_ftype: u8,
    /// DIR_INDEX entries: how many, and the first one's index and type.
    n_index: u8,
    index_ftype: u8,
    index: u64,
    /// Back references: how many, and the first one's index.
    n_refs: u8,
    ref_index: u64,
}

/// Every record of one name.
#[derive(Clone, Default)]
pub(super) struct NameRecords {
    /// DIR_ITEM entries, and the last one's type.
    pub items: u8,
    pub item_ftype: u8,
    /// DIR_INDEX entries: (index, type).
    pub index: Vec<(u64, u8)>,
    /// Back references' indexes.
    pub refs: Vec<u64>,
}

impl NameRecords {
    fn sources(&self) -> usize {
        (self.items > 0) as usize + !self.index.is_empty() as usize + !self.refs.is_empty() as usize
    }
}

/// Where a record of a name was found.
#[derive(Clone, Copy)]
pub(super) enum Record {
    Item { ftype: u8 },
    Index { index: u64, ftype: u8 },
    Ref { index: u64 },
}

impl Record {
    /// Order within one name: DIR_ITEM, then DIR_INDEX by index, then back references.
    fn order(&self) -> (u8, u64) {
        match *self {
            Record::Item { .. } => (0, 0),
            Record::Index { index, .. } => (1, index),
            Record::Ref { index } => (2, index),
        }
    }
}

/// Count `rec` into the open name `key`; a second DIR_INDEX or back
/// reference goes to `more`.
fn note(
    g: &mut OpenName,
    more: &mut FastMap<NameKey, (Vec<(u64, u8)>, Vec<u64>)>,
    key: NameKey,
    rec: Record,
) {
    match rec {
        Record::Item { ftype } => {
            g.items = g.items.saturating_add(1);
            g.item_ftype = ftype;
        }
        Record::Index { index, ftype } => {
            if g.n_index == 0 {
                (g.index, g.index_ftype) = (index, ftype);
            } else {
                more.entry(key).or_default().0.push((index, ftype));
            }
            g.n_index = g.n_index.saturating_add(1);
        }
        Record::Ref { index } => {
            if g.n_refs == 0 {
                g.ref_index = index;
            } else {
                more.entry(key).or_default().1.push(index);
            }
            g.n_refs = g.n_refs.saturating_add(1);
        }
    }
}

/// The inode has a name two of its three records agree on.
const CONFIRMED: u8 = 1;
/// Some record names the inode.
const NAMED: u8 = 2;

/// Mode and flag bits per inode of the tree. Inode numbers come in key
/// order and mostly dense, so they are kept as runs of consecutive
/// numbers: five bytes an inode.
#[derive(Default)]
pub(super) struct InodeTable {
    /// (first inode, its slot) of each run of consecutive inode numbers.
    runs: Vec<(u64, usize)>,
    modes: Vec<u32>,
    flags: Vec<u8>,
    /// Pushed out of order (a damaged tree): runs are rebuilt before lookups.
    unsorted: bool,
}

impl InodeTable {
    fn next_ino(&self) -> Option<u64> {
        self.runs
            .last()
            .map(|&(first, slot)| first + (self.modes.len() - slot) as u64)
    }

    /// Returns false when `ino` is not above every inode pushed before.
    pub fn push(&mut self, ino: u64, mode: u32) -> bool {
        let next = self.next_ino();
        if next != Some(ino) {
            if next.is_some_and(|n| ino < n) {
                self.unsorted = true;
            }
            self.runs.push((ino, self.modes.len()));
        }
        self.modes.push(mode);
        self.flags.push(0);
        !self.unsorted
    }

    /// Sort a table pushed out of order (the first entry of a repeated
    /// inode wins, as the walk's first inode item did).
    fn normalize(&mut self) {
        if !self.unsorted {
            return;
        }
        let mut all: Vec<(u64, usize)> = Vec::with_capacity(self.modes.len());
        for (r, &(first, slot)) in self.runs.iter().enumerate() {
            let end = self.runs.get(r + 1).map_or(self.modes.len(), |n| n.1);
            all.extend((slot..end).map(|s| (first + (s - slot) as u64, s)));
        }
        all.sort_by_key(|&(ino, s)| (ino, s));
        all.dedup_by_key(|e| e.0);
        let (modes, flags) = (
            std::mem::take(&mut self.modes),
            std::mem::take(&mut self.flags),
        );
        *self = InodeTable::default();
        for (ino, s) in all {
            self.push(ino, modes[s]);
            if let Some(f) = self.flags.last_mut() {
                *f = flags[s];
            }
        }
    }

    fn slot(&self, ino: u64) -> Option<usize> {
        let r = self.runs.partition_point(|r| r.0 <= ino).checked_sub(1)?;
        let (first, slot) = self.runs[r];
        let end = self.runs.get(r + 1).map_or(self.modes.len(), |n| n.1);
        let s = slot + usize::try_from(ino - first).ok()?;
        (s < end).then_some(s)
    }

    pub fn mode(&self, ino: u64) -> Option<u32> {
        self.slot(ino).map(|s| self.modes[s])
    }

    fn mark(&mut self, ino: u64, bit: u8) {
        if let Some(s) = self.slot(ino) {
            self.flags[s] |= bit;
        }
    }

    fn has(&self, ino: u64, bit: u8) -> bool {
        self.slot(ino).is_some_and(|s| self.flags[s] & bit != 0)
    }
}

/// A directory entry record (DIR_ITEM or DIR_INDEX) gathered while the
/// directory's items are read.
#[derive(Clone, Copy)]
struct DirRecord {
    child: u64,
    hash: u32,
    rec: Record,
}

/// A directory's entry records in name order: (child, hash), then
/// DIR_ITEM before DIR_INDEX by index (`Record::order`). A directory's
/// children are mostly inodes made one after another, so their numbers
/// fill a range not much wider than the directory: the records are counted
/// into place by child (linear in the entries, where comparison sorts of
/// a directory of 10,000 entries were a tenth of a subvolume's checks),
/// and only a child with records out of name order among themselves (one
/// named twice in the directory, or a damaged tree) is sorted after. A
/// run whose children are spread wide is sorted by comparison.
fn sort_dir_run(run: &mut Vec<DirRecord>, scratch: &mut SortScratch) {
    const SMALL: usize = 32;
    let by_name = |r: &DirRecord| (r.child, r.hash, r.rec.order());
    let (Some(lo), Some(hi)) = (
        run.iter().map(|r| r.child).min(),
        run.iter().map(|r| r.child).max(),
    ) else {
        return;
    };
    let span = hi - lo;
    if run.len() < SMALL || span >= 4 * run.len() as u64 {
        run.sort_unstable_by_key(by_name);
        return;
    }
    // span < 4 * len: the counts are bounded by the records held.
    let starts = &mut scratch.starts;
    starts.clear();
    starts.resize(span as usize + 2, 0);
    for r in run.iter() {
        starts[(r.child - lo) as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let out = &mut scratch.out;
    out.clear();
    out.extend_from_slice(run);
    for r in run.iter() {
        let at = &mut starts[(r.child - lo) as usize];
        out[*at as usize] = *r;
        *at += 1;
    }
    let mut i = 0;
    while i < out.len() {
        let mut j = i + 1;
        while j < out.len() && out[j].child == out[i].child {
            j += 1;
        }
        if j - i > 1 && !out[i..j].is_sorted_by_key(by_name) {
            out[i..j].sort_unstable_by_key(by_name);
        }
        i = j;
    }
    std::mem::swap(run, out);
}

/// Buffers [`sort_dir_run`] reuses from one directory to the next (fresh
/// ones cost a page fault per 4 KiB).
#[derive(Default)]
pub(super) struct SortScratch {
    starts: Vec<u32>,
    out: Vec<DirRecord>,
}

/// The entries of one directory read already that name inodes still to
/// come, in inode order: the inodes' back references find them at `pos`
/// or just after, as the walk reaches the inodes in the same order.
struct Batch {
    names: Vec<(u64, u32, OpenName)>,
    pos: usize,
}

/// The name matching of one subvolume. The usual name (a directory's entry
/// for an inode created after it) goes through a batch of the directory's
/// entries, read in order; any other (an inode older than the directory it
/// is in, a record missing or repeated) through a map keyed by the name.
#[derive(Default)]
pub(super) struct Names {
    pub table: InodeTable,
    pending: FastMap<NameKey, OpenName>,
    /// Second and later DIR_INDEX entries and back references of open names.
    more: FastMap<NameKey, (Vec<(u64, u8)>, Vec<u64>)>,
    /// Names in `pending` whose second inode is the one being read:
    /// settled when it ends.
    ready: Vec<NameKey>,
    /// Entries of the directory being read (`dir_parent`) naming later inodes.
    dir_run: Vec<DirRecord>,
    dir_parent: u64,
    sort_scratch: SortScratch,
    /// A settled batch's buffer, for the next directory's.
    spare_batch: Option<Vec<(u64, u32, OpenName)>>,
    /// Directories' batches by parent, and (first open inode, parent) of
    /// each, smallest first.
    batches: FastMap<u64, Batch>,
    heads: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64)>>,
    /// Names with a problem, judged at the end.
    bad: Vec<(NameKey, NameRecords)>,
    /// Every entry naming a directory from a directory: (name, its first
    /// DIR_INDEX index, how many of its three records there are). The one
    /// name rule and cycles are judged on them at the end; a directory
    /// entry is 24 bytes here, files cost nothing.
    dir_names: Vec<(NameKey, Option<u64>, u8)>,
    /// Keys came out of order (a damaged tree): nothing is settled before
    /// the end, everything goes through the map.
    disordered: bool,
}

impl Names {
    pub fn push_inode(&mut self, ino: u64, mode: u32) {
        if !self.table.push(ino, mode) {
            self.set_disordered();
        }
    }

    /// Items went backwards: the walk's order cannot be trusted to close
    /// names. What the batches hold moves to the map.
    pub fn set_disordered(&mut self) {
        if self.disordered {
            return;
        }
        self.disordered = true;
        self.ready.clear();
        self.heads.clear();
        for (parent, b) in std::mem::take(&mut self.batches) {
            for &(child, hash, g) in &b.names[b.pos..] {
                self.merge((parent, child, hash), g);
            }
        }
        self.flush_dir_run(false);
    }

    /// A record of name `key` found among the items of inode `cur`.
    pub fn add(&mut self, cur: u64, key: NameKey, rec: Record) {
        let (p, ch, hash) = key;
        if !self.disordered {
            match rec {
                Record::Item { .. } | Record::Index { .. } if p == cur && ch > cur => {
                    self.dir_parent = p;
                    self.dir_run.push(DirRecord {
                        child: ch,
                        hash,
                        rec,
                    });
                    return;
                }
                Record::Ref { .. } if ch == cur && p < cur => {
                    if let Some(b) = self.batches.get_mut(&p) {
                        let found = b.names[b.pos..]
                            .iter_mut()
                            .skip_while(|n| n.0 < ch)
                            .take_while(|n| n.0 == ch)
                            .find(|n| n.1 == hash);
                        if let Some(n) = found {
                            note(&mut n.2, &mut self.more, key, rec);
                            return;
                        }
                    }
                }
                _ => {}
            }
        }
        let g = self.pending.entry(key).or_default();
        note(g, &mut self.more, key, rec);
        let other = if p == cur { ch } else { p };
        if other <= cur && !self.disordered {
            self.ready.push(key);
        }
    }

    /// Fold the records of `g` into the map's entry for `key`.
    fn merge(&mut self, key: NameKey, g: OpenName) {
        let e = self.pending.entry(key).or_default();
        if e.n_index == 0 && e.n_refs == 0 && e.items == 0 {
            *e = g;
            return;
        }
        e.items = e.items.saturating_add(g.items);
        if g.items > 0 {
            e.item_ftype = g.item_ftype;
        }
        if g.n_index > 0 {
            if e.n_index == 0 {
                (e.index, e.index_ftype) = (g.index, g.index_ftype);
            } else {
                self.more
                    .entry(key)
                    .or_default()
                    .0
                    .push((g.index, g.index_ftype));
            }
            e.n_index = e.n_index.saturating_add(g.n_index);
        }
        if g.n_refs > 0 {
            if e.n_refs == 0 {
                e.ref_index = g.ref_index;
            } else {
                self.more.entry(key).or_default().1.push(g.ref_index);
            }
            e.n_refs = e.n_refs.saturating_add(g.n_refs);
        }
    }

    /// The directory's items ended: its entries naming later inodes
    /// become a batch in inode order (or go to the map: the walk's order
    /// is not trusted).
    fn flush_dir_run(&mut self, to_batch: bool) {
        if self.dir_run.is_empty() {
            return;
        }
        let p = self.dir_parent;
        let mut run = std::mem::take(&mut self.dir_run);
        sort_dir_run(&mut run, &mut self.sort_scratch);
        let mut names = self.spare_batch.take().unwrap_or_default();
        names.clear();
        names.reserve(run.len() / 2 + 1);
        for r in &run {
            match names.last_mut() {
                Some(n) if (n.0, n.1) == (r.child, r.hash) => {
                    note(&mut n.2, &mut self.more, (p, r.child, r.hash), r.rec)
                }
                _ => {
                    let mut g = OpenName::default();
                    note(&mut g, &mut self.more, (p, r.child, r.hash), r.rec);
                    names.push((r.child, r.hash, g));
                }
            }
        }
        run.clear();
        self.dir_run = run;
        if to_batch {
            if let Some(first) = names.first() {
                self.heads.push(std::cmp::Reverse((first.0, p)));
                self.batches.insert(p, Batch { names, pos: 0 });
            }
        } else {
            for (child, hash, g) in names {
                self.merge((p, child, hash), g);
            }
        }
    }

    /// The walk is past inode `cur`: settle the names it closed.
    pub fn end_of_inode(&mut self, cur: u64) {
        if self.disordered {
            self.ready.clear();
            return;
        }
        self.flush_dir_run(true);
        for key in std::mem::take(&mut self.ready) {
            if let Some(g) = self.pending.remove(&key) {
                self.settle(key, g);
            }
        }
        self.settle_batches(cur);
    }

    /// Settle the batches' names of inodes up to `upto`.
    fn settle_batches(&mut self, upto: u64) {
        while let Some(&std::cmp::Reverse((head, p))) = self.heads.peek() {
            if head > upto {
                break;
            }
            self.heads.pop();
            let Some(b) = self.batches.get_mut(&p) else {
                continue;
            };
            let start = b.pos;
            while b.names.get(b.pos).is_some_and(|n| n.0 <= upto) {
                b.pos += 1;
            }
            let end = b.pos;
            let next = b.names.get(end).map(|n| n.0);
            // Taken out while settling (settle needs the whole of self).
            let names = std::mem::take(&mut b.names);
            for &(child, hash, g) in &names[start..end] {
                self.settle((p, child, hash), g);
            }
            match next {
                Some(n) => {
                    self.heads.push(std::cmp::Reverse((n, p)));
                    if let Some(b) = self.batches.get_mut(&p) {
                        b.names = names;
                    }
                }
                None => {
                    self.batches.remove(&p);
                    // Its memory serves the next directory's batch.
                    self.spare_batch = Some(names);
                }
            }
        }
    }

    fn settle(&mut self, key: NameKey, g: OpenName) {
        let (p, ch, _) = key;
        let (child, parent) = (self.table.mode(ch), self.table.mode(p));
        let is_dir = |m: Option<u32>| m.is_some_and(|m| m & S_IFMT == S_IFDIR);
        if is_dir(child) && is_dir(parent) && (g.items > 0 || g.n_index > 0) {
            let sources = (g.items > 0) as u8 + (g.n_index > 0) as u8 + (g.n_refs > 0) as u8;
            self.dir_names
                .push((key, (g.n_index > 0).then_some(g.index), sources));
        }
        if g.items == 1 && g.n_index == 1 && g.n_refs == 1 {
            // The common case, judged without building the records.
            let want = child.and_then(ftype_of_mode);
            if g.index == g.ref_index
                && parent.is_some_and(|m| m & S_IFMT == S_IFDIR)
                && child.is_some()
                && want.is_none_or(|t| t == g.item_ftype && t == g.index_ftype)
            {
                self.table.mark(ch, CONFIRMED | NAMED);
                return;
            }
        }
        let (more_index, more_refs) = if g.n_index > 1 || g.n_refs > 1 {
            self.more.remove(&key).unwrap_or_default()
        } else {
            Default::default()
        };
        let mut r = NameRecords {
            items: g.items,
            item_ftype: g.item_ftype,
            index: Vec::new(),
            refs: Vec::new(),
        };
        if g.n_index > 0 {
            r.index.push((g.index, g.index_ftype));
            r.index.extend(more_index);
        }
        if g.n_refs > 0 {
            r.refs.push(g.ref_index);
            r.refs.extend(more_refs);
        }
        let bit = if r.sources() >= 2 {
            CONFIRMED | NAMED
        } else {
            NAMED
        };
        self.table.mark(ch, bit);
        if !name_errors(&r, child, parent).is_empty() {
            self.bad.push((key, r));
        }
    }

    /// The tree is complete: settle what is left (names missing a record
    /// in a later inode, or naming inodes that do not exist).
    /// (After the last inode's `end_of_inode`.)
    pub fn end_of_tree(&mut self) {
        self.flush_dir_run(!self.disordered);
        self.settle_batches(u64::MAX);
        self.table.normalize();
        let mut rest: Vec<(NameKey, OpenName)> =
            std::mem::take(&mut self.pending).into_iter().collect();
        rest.sort_unstable_by_key(|e| e.0);
        for (key, g) in rest {
            self.settle(key, g);
        }
        self.bad.sort_by_key(|e| e.0);
    }

    /// What is wrong with the links between directories (after
    /// `end_of_tree`), as (name, its DIR_INDEX index, what), in name
    /// order: a directory has one name (a second one is a hard-linked
    /// directory; the one most records agree on is its name), the root
    /// directory `root` none in its own tree, and following entries from
    /// a directory never leads back to it (a cycle: the entry closing it
    /// is reported, found by a walk from the root in inode order).
    pub fn dir_link_problems(&mut self, root: u64) -> Vec<(NameKey, Option<u64>, String)> {
        let mut names = std::mem::take(&mut self.dir_names);
        // By directory, the best confirmed name first.
        names.sort_unstable_by_key(|&((p, ch, h), _, n)| (ch, std::cmp::Reverse(n), p, h));
        let mut found: std::collections::BTreeMap<NameKey, (Option<u64>, Vec<String>)> =
            Default::default();
        let mut edges: Vec<(u64, u64, NameKey, Option<u64>)> = Vec::new();
        let mut i = 0;
        while i < names.len() {
            let ch = names[i].0 .1;
            let n = names[i..].iter().take_while(|x| x.0 .1 == ch).count();
            let group = &names[i..i + n];
            for (j, &(key, index, _)) in group.iter().enumerate() {
                let (p, _, _) = key;
                if ch == root {
                    found.entry(key).or_insert((index, Vec::new())).1.push(
                        "names the subvolume's root directory, which has no name in its own tree (a directory cycle)"
                            .to_string(),
                    );
                    continue;
                }
                edges.push((p, ch, key, index));
                if j > 0 {
                    let first = group[0].0 .0;
                    found.entry(key).or_insert((index, Vec::new())).1.push(format!(
                        "is a second name of it ({n} names; it is also named in directory {first}): a directory has one name"
                    ));
                }
            }
            i += n;
        }
        drop(names);
        edges.sort_unstable_by_key(|e| (e.0, e.1, e.2));
        let children = |p: u64| {
            let s = edges.partition_point(|e| e.0 < p);
            let e = edges[s..].partition_point(|e| e.0 == p) + s;
            s..e
        };
        // Iterative depth-first walk; 1: on the path, 2: done.
        let mut color: FastMap<u64, u8> = FastMap::default();
        let mut starts: Vec<u64> = vec![root];
        starts.extend(edges.iter().map(|e| e.0));
        for start in starts {
            if color.contains_key(&start) {
                continue;
            }
            color.insert(start, 1);
            let mut stack: Vec<(u64, usize)> = vec![(start, children(start).start)];
            while let Some(top) = stack.last_mut() {
                let (node, next) = *top;
                if next >= children(node).end {
                    color.insert(node, 2);
                    stack.pop();
                    continue;
                }
                top.1 += 1;
                let (p, ch, key, index) = edges[next];
                match color.get(&ch).copied() {
                    None => {
                        color.insert(ch, 1);
                        stack.push((ch, children(ch).start));
                    }
                    Some(1) => {
                        let what = if p == ch {
                            "names the directory itself (a directory cycle)".to_string()
                        } else {
                            format!(
                                "names one of the directory's own ancestors (a directory cycle: {ch} is reachable from itself)"
                            )
                        };
                        found.entry(key).or_insert((index, Vec::new())).1.push(what);
                    }
                    _ => {}
                }
            }
        }
        found
            .into_iter()
            .map(|(k, (index, msgs))| (k, index, msgs.join("; ")))
            .collect()
    }

    pub fn named(&self, ino: u64) -> bool {
        self.table.has(ino, NAMED)
    }

    /// The tree has an inode item for `ino`.
    pub fn exists(&self, ino: u64) -> bool {
        self.table.mode(ino).is_some()
    }

    pub fn confirmed(&self, ino: u64) -> bool {
        self.table.has(ino, CONFIRMED)
    }

    /// Names with a problem, in (parent, inode, hash) order (after `end_of_tree`).
    pub fn take_bad(&mut self) -> Vec<(NameKey, NameRecords)> {
        std::mem::take(&mut self.bad)
    }
}

/// What is wrong with one name, given the modes of the inode it names and
/// of its directory (None: no inode item). Empty for a good name; allocates
/// nothing then.
pub(super) fn name_errors(g: &NameRecords, child: Option<u32>, parent: Option<u32>) -> Vec<String> {
    let index = &g.index[..];
    let iref = &g.refs[..];
    let mut errs = Vec::<String>::new();
    if child.is_none() {
        errs.push("points to an inode that does not exist".into());
    }
    match parent {
        None => errs.push("is in a directory that does not exist".into()),
        Some(m) if m & S_IFMT != S_IFDIR => {
            errs.push("is in an inode that is not a directory".into())
        }
        _ => {}
    }
    if g.items == 0 {
        errs.push("has no DIR_ITEM".into());
    }
    if index.is_empty() {
        errs.push("has no DIR_INDEX".into());
    }
    if iref.is_empty() && child.is_some() {
        errs.push("has no INODE_REF".into());
    }
    if g.items > 1 || index.len() > iref.len().max(1) {
        errs.push("is recorded more than once".into());
    }
    for x in index {
        if !iref.is_empty() && !iref.contains(&x.0) {
            errs.push(format!(
                "DIR_INDEX {} does not match the INODE_REF index {}",
                x.0, iref[0]
            ));
        }
    }
    if let Some(m) = child {
        if let Some(want) = ftype_of_mode(m) {
            let item = (g.items > 0).then_some(g.item_ftype);
            if let Some(t) = item
                .into_iter()
                .chain(index.iter().map(|x| x.1))
                .find(|&t| t != want)
            {
                errs.push(format!("type {t} does not match the inode's mode 0{m:o}"));
            }
        }
    }
    errs
}

/// What on disk determines about one name that its three records
/// (DIR_ITEM, DIR_INDEX, the inode's back reference) disagree on, two
/// agreeing records outvoting the third:
/// - a DIR_ITEM and DIR_INDEX without a back reference get it back;
/// - a back reference with one of the entries gets the other back;
/// - entries naming an inode that does not exist are removed;
/// - one lone record goes when the inode has a name two records
///   confirm (a corrupted copy of a name); a lone back reference or
///   DIR_INDEX that is the inode's only name is completed instead, so
///   the inode stays reachable.
///
/// Anything else (several back references for one entry, an index
/// that disagrees, a directory that is not one) is left alone.
pub(super) fn name_fixes(
    tree: u64,
    key: NameKey,
    g: &NameRecords,
    child: Option<u32>,
    parent: Option<u32>,
    confirmed_elsewhere: bool,
) -> Vec<Repair> {
    let (p, ch, hash) = key;
    let index = &g.index[..];
    let iref = &g.refs[..];
    let mut out = Vec::new();
    let parent_is_dir = parent.is_some_and(|m| m & S_IFMT == S_IFDIR);
    let remove_entries = |out: &mut Vec<Repair>| {
        if g.items > 0 {
            out.push(Repair::RemoveDirEntry {
                tree,
                dir: p,
                ino: ch,
                key_type: BTRFS_DIR_ITEM_KEY,
                offset: hash as u64,
            });
        }
        for x in index {
            out.push(Repair::RemoveDirEntry {
                tree,
                dir: p,
                ino: ch,
                key_type: BTRFS_DIR_INDEX_KEY,
                offset: x.0,
            });
        }
    };
    if child.is_none() {
        if iref.is_empty() {
            remove_entries(&mut out);
        }
        return out;
    }
    if !parent_is_dir || index.len() > 1 || iref.len() > 1 {
        return out;
    }
    let idx = index.first().map(|x| x.0);
    let name = |index| (tree, p, ch, index);
    match (g.items > 0, idx, iref.first().copied()) {
        // Both entries, no back reference.
        (true, Some(i), None) => out.push(add_inode_ref(name(i))),
        // A back reference and one entry that agrees with it.
        (true, None, Some(r)) => out.push(add_dir_index(name(r))),
        (false, Some(i), Some(r)) if i == r => out.push(add_dir_item(name(r))),
        // One record alone.
        (false, None, Some(r)) if !confirmed_elsewhere => {
            out.push(add_dir_item(name(r)));
            out.push(add_dir_index(name(r)));
        }
        (false, None, Some(r)) => out.push(Repair::RemoveInodeRef {
            tree,
            dir: p,
            ino: ch,
            index: r,
        }),
        (false, Some(i), None) if !confirmed_elsewhere => {
            out.push(add_inode_ref(name(i)));
            out.push(add_dir_item(name(i)));
        }
        (_, _, None) if confirmed_elsewhere => remove_entries(&mut out),
        _ => {}
    }
    out
}

fn add_inode_ref((tree, dir, ino, index): (u64, u64, u64, u64)) -> Repair {
    Repair::AddInodeRef {
        tree,
        dir,
        ino,
        index,
    }
}

fn add_dir_index((tree, dir, ino, index): (u64, u64, u64, u64)) -> Repair {
    Repair::AddDirIndex {
        tree,
        dir,
        ino,
        index,
    }
}

fn add_dir_item((tree, dir, ino, index): (u64, u64, u64, u64)) -> Repair {
    Repair::AddDirItem {
        tree,
        dir,
        ino,
        index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_run_sorted_as_a_whole_sort_would() {
        let mut rng = crate::util::prng::Prng::new(7);
        let mut scratch = SortScratch::default();
        for case in 0..400 {
            // Small runs are sorted by comparison, larger ones counted.
            let n = rng.below(if case % 2 == 0 { 40 } else { 200 }) as usize;
            let rec = |rng: &mut crate::util::prng::Prng, item: bool| DirRecord {
                child: 256
                    + rng.below(if case % 4 == 3 {
                        100_000
                    } else {
                        12 + n as u64
                    }),
                hash: rng.below(3) as u32,
                rec: if item {
                    Record::Item { ftype: 1 }
                } else {
                    Record::Index {
                        index: rng.below(6),
                        ftype: 1,
                    }
                },
            };
            // Items then indexes (key order), or any order (damage).
            let mut run: Vec<DirRecord> = (0..n)
                .map(|i| {
                    let item = if case % 3 == 0 {
                        rng.below(2) == 0
                    } else {
                        i < n / 2
                    };
                    rec(&mut rng, item)
                })
                .collect();
            if case % 3 == 1 {
                run[n / 2..].sort_unstable_by_key(|r| (r.child, r.hash, r.rec.order()));
            }
            let key = |r: &DirRecord| (r.child, r.hash, r.rec.order());
            let mut want: Vec<_> = run.iter().map(key).collect();
            want.sort_unstable();
            sort_dir_run(&mut run, &mut scratch);
            assert_eq!(run.iter().map(key).collect::<Vec<_>>(), want, "case {case}");
        }
    }

    #[test]
    fn inode_table_runs_and_disorder() {
        let mut t = InodeTable::default();
        for ino in [256u64, 257, 258, 300, 301, 1000] {
            assert!(t.push(ino, 0o100644 + ino as u32));
        }
        assert_eq!(t.runs.len(), 3);
        assert_eq!(t.mode(257), Some(0o100644 + 257));
        assert_eq!(t.mode(259), None);
        assert_eq!(t.mode(255), None);
        assert_eq!(t.mode(1000), Some(0o100644 + 1000));
        t.mark(300, NAMED);
        assert!(t.has(300, NAMED) && !t.has(300, CONFIRMED) && !t.has(301, NAMED));
        // Out of order: found once normalized, the first of a repeat kept.
        assert!(!t.push(257, 1));
        assert!(!t.push(299, 2));
        t.normalize();
        assert_eq!(t.mode(257), Some(0o100644 + 257));
        assert_eq!(t.mode(299), Some(2));
        assert!(t.has(300, NAMED));
    }

    #[test]
    fn names_settle_when_both_inodes_are_past() {
        let mut n = Names::default();
        n.push_inode(256, 0o40755);
        let key = (256, 300, 7);
        n.add(
            256,
            key,
            Record::Item {
                ftype: BTRFS_FT_REG_FILE,
            },
        );
        n.add(
            256,
            key,
            Record::Index {
                index: 2,
                ftype: BTRFS_FT_REG_FILE,
            },
        );
        // An inode older than its directory: through the map.
        n.add(256, (256, 200, 8), Record::Index { index: 3, ftype: 1 });
        n.end_of_inode(256);
        assert_eq!(n.batches.len(), 1, "the inode named comes later");
        n.push_inode(300, 0o100644);
        n.add(300, key, Record::Ref { index: 2 });
        n.end_of_inode(300);
        assert!(n.batches.is_empty() && n.pending.is_empty());
        // A lone DIR_INDEX of another inode, never matched.
        n.add(256, (256, 400, 9), Record::Index { index: 3, ftype: 1 });
        n.end_of_tree();
        assert!(n.confirmed(300) && n.named(300));
        let bad = n.take_bad();
        assert_eq!(
            bad.iter().map(|b| b.0).collect::<Vec<_>>(),
            [(256, 200, 8), (256, 400, 9)]
        );
        let errs = name_errors(&bad[1].1, n.table.mode(400), n.table.mode(256));
        assert!(errs.iter().any(|e| e.contains("does not exist")));
    }

    /// A tree as the walk gives it: per inode in order, its back
    /// references, then its directory entries (DIR_ITEM, DIR_INDEX).
    /// `names` are (parent, child, hash, index, records: "iRe" for item,
    /// index, ref).
    fn walk(dirs: &[u64], files: &[u64], names: &[(u64, u64, u32, u64, &str)]) -> Names {
        let mut n = Names::default();
        let mut inos: Vec<u64> = dirs.iter().chain(files).copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let mode = if dirs.contains(&ino) {
                0o40755
            } else {
                0o100644
            };
            n.push_inode(ino, mode);
            for &(p, ch, h, index, recs) in names {
                if ch == ino && recs.contains('R') {
                    n.add(ino, (p, ch, h), Record::Ref { index });
                }
            }
            for &(p, ch, h, index, recs) in names {
                let ftype = if dirs.contains(&ch) {
                    BTRFS_FT_DIR
                } else {
                    BTRFS_FT_REG_FILE
                };
                if p == ino && recs.contains('i') {
                    n.add(ino, (p, ch, h), Record::Item { ftype });
                }
                if p == ino && recs.contains('I') {
                    n.add(ino, (p, ch, h), Record::Index { index, ftype });
                }
            }
            n.end_of_inode(ino);
        }
        n.end_of_tree();
        n
    }

    #[test]
    fn directory_links_one_name_and_no_cycle() {
        // A clean tree: nothing.
        let clean = [
            (256, 257, 1, 2, "iIR"),
            (257, 258, 2, 2, "iIR"),
            (258, 260, 3, 2, "iIR"),
            (256, 261, 4, 3, "iIR"),
            // A file with two names is fine.
            (257, 261, 5, 3, "iIR"),
        ];
        let mut n = walk(&[256, 257, 258], &[260, 261], &clean);
        assert!(n.dir_link_problems(256).is_empty());

        let mut names = clean.to_vec();
        // 258 names 257, its parent (a DIR_INDEX patched to point there).
        names.push((258, 257, 9, 7, "I"));
        // 259 is a directory with two names.
        names.push((256, 259, 10, 4, "iIR"));
        names.push((257, 259, 11, 5, "iIR"));
        // 258 names itself; 257 names the root.
        names.push((258, 258, 12, 8, "iI"));
        names.push((257, 256, 13, 6, "iI"));
        let mut n = walk(&[256, 257, 258, 259], &[260, 261], &names);
        let got = n.dir_link_problems(256);
        let find = |k: NameKey| {
            got.iter()
                .find(|x| x.0 == k)
                .map(|x| x.2.clone())
                .unwrap_or_else(|| panic!("{k:?} not reported: {got:?}"))
        };
        let w = find((258, 257, 9));
        assert!(w.contains("second name") && w.contains("ancestors"), "{w}");
        assert_eq!(
            got.iter().find(|x| x.0 == (258, 257, 9)).unwrap().1,
            Some(7)
        );
        assert!(find((257, 259, 11)).contains("second name of it (2 names"));
        assert!(find((258, 258, 12)).contains("names the directory itself"));
        assert!(find((257, 256, 13)).contains("root directory"));
        assert_eq!(got.len(), 4, "{got:?}");
    }

    /// Items out of order move everything open to the map, and the names
    /// come out as when the order held.
    #[test]
    fn disorder_falls_back_to_the_map() {
        for disorder_at in 0..4 {
            let mut n = Names::default();
            n.push_inode(256, 0o40755);
            for c in 300..310u64 {
                n.add(
                    256,
                    (256, c, c as u32),
                    Record::Item {
                        ftype: BTRFS_FT_REG_FILE,
                    },
                );
                n.add(
                    256,
                    (256, c, c as u32),
                    Record::Index {
                        index: c,
                        ftype: BTRFS_FT_REG_FILE,
                    },
                );
                if disorder_at == 0 && c == 305 {
                    n.set_disordered();
                }
            }
            n.end_of_inode(256);
            for c in 300..310u64 {
                if disorder_at == 1 && c == 303 {
                    n.set_disordered();
                }
                n.push_inode(c, 0o100644);
                if c != 307 {
                    n.add(c, (256, c, c as u32), Record::Ref { index: c });
                }
                n.end_of_inode(c);
            }
            if disorder_at == 2 {
                n.set_disordered();
            }
            n.end_of_tree();
            let bad = n.take_bad();
            assert_eq!(bad.len(), 1, "disorder at {disorder_at}");
            assert_eq!(bad[0].0, (256, 307, 307));
            assert!((300..310).all(|c| n.named(c)));
            assert!((300..310).all(|c| n.confirmed(c)));
        }
    }
}
