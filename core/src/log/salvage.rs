//! Salvage: replay what a damaged log still proves, never ending worse than
//! throwing the log away (`btrfs rescue zero-log`).
//!
//! The log is read with the shared reader in its salvage mode: a block that
//! cannot be read (no good copy) or fails validation is lost, and with it the
//! key range its parent gives it. Then, per subvolume log:
//!
//! - an inode is *complete* when no lost block may have held any of its items
//!   (its whole key range `(ino, *, *)` is readable) and every logged data
//!   extent of it that needs checksums finds them in the readable log or in
//!   the csum tree; only complete inodes are replayed, the others keep their
//!   committed state;
//! - a directory entry that only a lost block could confirm or delete keeps
//!   its committed state: a complete inode whose replay would add, move or
//!   remove a name of an inode that is not replayed (the log of a directory
//!   deleting or adding an entry of such an inode, a name that collides with
//!   one) is not replayed either, and neither is an inode whose names would
//!   all go while the directory it moved to is not recovered, nor a
//!   directory whose old name only a directory that is not replayed could
//!   remove (a directory has one name);
//! - these rules are applied until nothing changes (each step only takes
//!   inodes out), then replay runs as usual on the items of the inodes left.
//!
//! So every inode ends either exactly as the kernel's replay would leave it
//! or as the last commit has it; the names between them are the committed
//! ones plus those complete inodes add. A damaged log root tree hides which
//! logs exist at all: the result is then the last commit, which salvage says.
//!
//! On an undamaged log the selection keeps every inode whose checksums are
//! there, so salvage replays exactly what replay does.
//!
//! Should replaying an inode that looked complete still fail (an item that
//! reads but does not make sense), nothing has been written yet: salvage
//! starts over from the image with that inode left out as well.

use super::inspect::{
    committed_name, escape_bytes, mode_kind, resolve_paths, LoggedInode, LoggedName, NameKind,
};
use super::reader::{read_log_with, uncovered, LogTree, LostBlock, OnDamage, ReadOptions};
use crate::format::consts::*;
use crate::format::dir::parse_dir_items;
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::inode::{parse_inode_extrefs, parse_inode_refs, InodeItem};
use crate::format::key::Key;
use crate::trans::Store;
use crate::Result;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use zerocopy::FromBytes;

/// What salvage found and decided.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SalvageReport {
    /// Set when nothing could be replayed because the log root tree is
    /// damaged: why. The result is the last commit (zero-log).
    pub zero_log: Option<String>,
    /// Log blocks whose items were not available.
    pub lost_blocks: Vec<LostBlockReport>,
    /// Every inode the readable log names, recovered or not, by subvolume
    /// and inode number.
    pub inodes: Vec<InodeOutcome>,
    /// Inodes in `inodes` replayed ([`Outcome::Recovered`]).
    pub recovered: usize,
    /// Inodes in `inodes` left in their committed state.
    pub not_recovered: usize,
}

/// A log block salvage could not use, with the key range lost with it.
#[derive(Clone, Debug, Serialize)]
pub struct LostBlockReport {
    /// Subvolume whose log tree held the block; the log root tree's own id
    /// (TREE_LOG, 18446744073709551610) for a block of the log root tree.
    pub subvol: u64,
    /// Logical address of the block.
    pub bytenr: u64,
    /// Level its parent gives it (0: a leaf).
    pub level: u8,
    /// First key the block may have held.
    pub first_key: Key,
    /// Keys at and after this one were not in it (None: to the end).
    pub end_key: Option<Key>,
    /// Why it is lost: unreadable (no good copy) or failed validation.
    pub why: String,
}

/// Whether salvage replayed an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// All of its logged items were replayed.
    Recovered,
    /// Not replayed: it keeps its committed state (or stays absent).
    NotRecovered,
}

/// Salvage's decision on one inode the readable log names.
#[derive(Clone, Debug, Serialize)]
pub struct InodeOutcome {
    /// Subvolume (root objectid) of the inode.
    pub subvol: u64,
    /// Inode number.
    pub ino: u64,
    /// A path for orientation (from the log's names, else the committed ones).
    pub path: Option<String>,
    /// file, dir, symlink...; None when its inode item was not readable.
    pub kind: Option<&'static str>,
    /// Replayed or left as committed.
    pub outcome: Outcome,
    /// Why it was not recovered.
    pub reason: Option<String>,
}

/// The logs as salvage leaves them for replay.
pub(crate) struct Prepared {
    /// Each log tree with only the items of the inodes to replay (and every
    /// readable checksum item).
    pub logs: Vec<LogTree>,
    /// Every log block read (all pinned).
    pub blocks: Vec<u64>,
    pub report: SalvageReport,
}

/// Read the log, pin it, decide what can be replayed. Inodes in `refused`
/// are not replayed, for the reason given (an earlier attempt could not
/// replay their items).
pub(crate) fn prepare(fs: &mut Store, refused: &BTreeMap<u64, String>) -> Result<Prepared> {
    let mut report = SalvageReport::default();
    let ns = fs.nodesize() as u64;
    // First read: which blocks are usable. A readable block that cannot be
    // pinned (it overlaps committed metadata) is not trusted either: the
    // log is read again with those blocks counted as lost.
    let mut excluded: HashMap<u64, String> = HashMap::new();
    let mut read = None;
    for _ in 0..2 {
        let r = read_log_with(fs.image(), ReadOptions::new(OnDamage::Skip), &excluded)?
            .ok_or_else(|| crate::Error::Invalid("no log to replay".into()))?;
        let mut more = false;
        for b in r
            .root_tree
            .blocks
            .iter()
            .chain(r.trees.iter().flat_map(|t| t.read.blocks.iter()))
        {
            if let Err(e) = fs.chunks().pin_range(b.bytenr, ns) {
                excluded.insert(
                    b.bytenr,
                    format!(
                        "cannot be kept out of allocation: {}",
                        super::reader::error_text(&e)
                    ),
                );
                more = true;
            }
        }
        read = Some(r);
        if !more {
            break;
        }
    }
    let Some(read) = read else {
        return Err(crate::Error::Invalid("no log to replay".into()));
    };
    let mut blocks: Vec<u64> = Vec::new();
    for t in std::iter::once(&read.root_tree).chain(read.trees.iter().map(|t| &t.read)) {
        blocks.extend(
            t.blocks
                .iter()
                .map(|b| b.bytenr)
                .filter(|b| !excluded.contains_key(b)),
        );
        // Lost blocks are kept out of allocation too where possible, so a
        // replay cut short and run again finds the log as it was.
        for l in &t.lost {
            let _ = fs.chunks().pin_range(l.bytenr, ns);
        }
    }
    let lost_report = |subvol: u64, l: &LostBlock| LostBlockReport {
        subvol,
        bytenr: l.bytenr,
        level: l.level,
        first_key: l.lo,
        end_key: l.hi,
        why: l.why.clone(),
    };
    report.lost_blocks.extend(
        read.root_tree
            .lost
            .iter()
            .map(|l| lost_report(BTRFS_TREE_LOG_OBJECTID, l)),
    );
    let root_damage = read
        .root_tree
        .lost
        .first()
        .map(|l| format!("block {} {}", l.bytenr, l.why))
        .or_else(|| {
            read.root_tree
                .problems
                .first()
                .map(|p| format!("block {}: {}", p.bytenr, p.message))
        });
    if let Some(why) = root_damage {
        report.zero_log = Some(format!(
            "the log root tree is damaged ({why}): which subvolume logs exist cannot be known, so none is replayed and the result is the last commit, as btrfs rescue zero-log gives"
        ));
        return Ok(Prepared {
            logs: Vec::new(),
            blocks,
            report,
        });
    }
    let mut logs = Vec::new();
    for tree in read.trees {
        report
            .lost_blocks
            .extend(tree.read.lost.iter().map(|l| lost_report(tree.subvol, l)));
        // A log of a subvolume deleted before the crash has nothing to
        // replay into (replay skips it as the kernel does).
        if !fs.tree_exists(tree.subvol)? {
            continue;
        }
        let mut sel = Selection::new(fs, &tree)?;
        for (ino, why) in refused {
            if sel.logged.contains_key(ino) {
                sel.not.entry(*ino).or_insert_with(|| why.clone());
            }
        }
        let sel = sel.settle(fs, &tree)?;
        report.inodes.extend(sel.outcomes(fs, &tree));
        logs.push(sel.filter(tree));
    }
    report.recovered = report
        .inodes
        .iter()
        .filter(|i| i.outcome == Outcome::Recovered)
        .count();
    report.not_recovered = report.inodes.len() - report.recovered;
    Ok(Prepared {
        logs,
        blocks,
        report,
    })
}

/// What the log says of one inode (readable items only).
#[derive(Default)]
struct Logged {
    inode: Option<InodeItem>,
    /// (directory, index, name) of its INODE_REF / INODE_EXTREF entries.
    refs: Vec<(u64, u64, Vec<u8>)>,
    /// (index, name, target, target key type) of its DIR_INDEX items.
    dir_index: Vec<(u64, Vec<u8>, u64, u8)>,
    /// DIR_LOG_INDEX ranges `[start, end]`.
    dir_log: Vec<(u64, u64)>,
}

impl Logged {
    /// The replayer skips an inode logged with no links (an O_TMPFILE or an
    /// unlinked inode kept open).
    fn linkless(&self) -> bool {
        self.inode.as_ref().is_some_and(|i| i.nlink.get() == 0)
    }
    fn is_dir(&self) -> bool {
        self.inode
            .as_ref()
            .is_some_and(|i| i.mode.get() & 0o170000 == 0o040000)
    }
}

/// The inodes of one subvolume log and which of them may be replayed.
struct Selection {
    subvol: u64,
    logged: BTreeMap<u64, Logged>,
    /// Inodes that are not replayed, and why. An inode absent from here is
    /// replayed (when logged) and may be touched by replay.
    not: HashMap<u64, String>,
    /// Memo of which inodes a lost block may have held items of.
    lost_memo: HashMap<u64, Option<String>>,
}

fn is_inode(objectid: u64) -> bool {
    objectid <= BTRFS_LAST_FREE_OBJECTID
}

impl Selection {
    fn new(fs: &mut Store, tree: &LogTree) -> Result<Selection> {
        let mut logged: BTreeMap<u64, Logged> = BTreeMap::new();
        for (k, d) in &tree.items {
            if !is_inode(k.objectid) {
                continue;
            }
            let l = logged.entry(k.objectid).or_default();
            match k.ty {
                BTRFS_INODE_ITEM_KEY => l.inode = InodeItem::read_from_bytes(d).ok(),
                BTRFS_INODE_REF_KEY => {
                    if let Ok(v) = parse_inode_refs(d) {
                        l.refs
                            .extend(v.iter().map(|r| (k.offset, r.index, r.name.to_vec())));
                    }
                }
                BTRFS_INODE_EXTREF_KEY => {
                    if let Ok(v) = parse_inode_extrefs(d) {
                        l.refs
                            .extend(v.iter().map(|r| (r.parent, r.index, r.name.to_vec())));
                    }
                }
                BTRFS_DIR_INDEX_KEY => {
                    if let Some(e) = parse_dir_items(d).ok().and_then(|v| v.into_iter().next()) {
                        let loc = Key::from(&e.item.location);
                        l.dir_index
                            .push((k.offset, e.name.to_vec(), loc.objectid, loc.ty));
                    }
                }
                BTRFS_DIR_LOG_INDEX_KEY => {
                    let end = d
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes)
                        .unwrap_or(k.offset);
                    l.dir_log.push((k.offset, end));
                }
                _ => {}
            }
        }
        let mut sel = Selection {
            subvol: tree.subvol,
            logged,
            not: HashMap::new(),
            lost_memo: HashMap::new(),
        };
        // Items the reader found impossible (a file extent beyond the
        // format's bounds): their inode is not replayed.
        for p in &tree.read.problems {
            if p.class != super::reader::ProblemClass::Item {
                continue;
            }
            if let Some(k) = p.key.filter(|k| is_inode(k.objectid)) {
                sel.not.entry(k.objectid).or_insert_with(|| {
                    format!(
                        "its log item {} is damaged: {}",
                        crate::format::names::key_string(&k),
                        p.message
                    )
                });
            }
        }
        // Data the inode needs checksums for that neither the readable log
        // nor the csum tree has (the shared rule of csum_needs).
        let have = tree.csum_ranges(fs.image().csum.size(), fs.sectorsize());
        for n in tree.csum_needs() {
            if sel.not.contains_key(&n.ino) {
                continue;
            }
            for (a, b) in uncovered(&have, n.start, n.end) {
                if fs.csums().csums_missing(a, b)? {
                    // A checksum item starting before `a` may cover it: one
                    // item covers far less than 64 MiB of data.
                    let why = match tree.read.lost_in(csum_key(a.saturating_sub(64 << 20)), csum_key(b)) {
                        Some(l) => format!("checksums of its data at file offset {} may have been in lost log block {}", n.file_offset, l.bytenr),
                        None => format!("the log lacks checksums of its data at file offset {} (disk bytes {}..{})", n.file_offset, n.start, n.end),
                    };
                    sel.not.insert(n.ino, why);
                    break;
                }
            }
        }
        // Logged data extents that are neither known to the extent tree nor
        // free space cannot be replayed: the inodes using them are not.
        let mut bad_extents: HashSet<(u64, u64)> = HashSet::new();
        let mut checked: HashSet<u64> = HashSet::new();
        for (k, d) in &tree.items {
            if k.ty != BTRFS_EXTENT_DATA_KEY || !is_inode(k.objectid) {
                continue;
            }
            let Ok(FileExtent::Disk { item, .. }) = parse_file_extent(d) else {
                continue;
            };
            let (b, l) = (item.disk_bytenr.get(), item.disk_num_bytes.get());
            if b == 0 {
                continue;
            }
            if checked.insert(b) {
                let known = fs
                    .lookup(
                        BTRFS_EXTENT_TREE_OBJECTID,
                        &Key::new(b, BTRFS_EXTENT_ITEM_KEY, l),
                    )?
                    .is_some();
                if !known && fs.chunks().pin_range(b, l).is_err() {
                    bad_extents.insert((b, l));
                }
            }
            if bad_extents.contains(&(b, l)) {
                sel.not.entry(k.objectid).or_insert_with(|| {
                    format!("its data extent {b}+{l} overlaps space the filesystem uses")
                });
            }
        }
        let inos: Vec<u64> = sel.logged.keys().copied().collect();
        for ino in inos {
            if let Some(why) = sel.lost(tree, ino) {
                sel.not.insert(ino, why);
            }
        }
        Ok(sel)
    }

    /// Why `ino` may have items in a lost block, if it may.
    fn lost(&mut self, tree: &LogTree, ino: u64) -> Option<String> {
        self.lost_memo
            .entry(ino)
            .or_insert_with(|| {
                tree.read
                    .lost_in(Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))
                    .map(|l| {
                        format!(
                            "some of its log items were in lost log block {} ({})",
                            l.bytenr, l.why
                        )
                    })
            })
            .clone()
    }

    /// Whether replay may change `ino` (its names, its items).
    fn ok(&mut self, tree: &LogTree, ino: u64) -> bool {
        !self.not.contains_key(&ino) && self.lost(tree, ino).is_none()
    }

    /// Take out inodes whose replay would touch inodes that are not
    /// replayed, until nothing changes.
    fn settle(mut self, fs: &mut Store, tree: &LogTree) -> Result<Selection> {
        // Every rule needs an inode that is not replayed to begin with.
        if self.not.is_empty() && tree.read.lost.is_empty() {
            return Ok(self);
        }
        let mut c = Committed {
            subvol: self.subvol,
            exists: HashMap::new(),
        };
        // Every round takes out at least one inode or ends.
        for _ in 0..=self.logged.len() {
            let mut out: Vec<(u64, String)> = Vec::new();
            let inos: Vec<u64> = self.logged.keys().copied().collect();
            for ino in inos {
                if !self.ok(tree, ino) {
                    continue;
                }
                if let Some(why) = self.violation(fs, tree, &mut c, ino)? {
                    out.push((ino, why));
                }
            }
            if out.is_empty() {
                break;
            }
            for (ino, why) in out {
                self.not.insert(ino, why);
            }
        }
        Ok(self)
    }

    /// Why replaying `x` would change an inode that is not replayed, if it would.
    fn violation(
        &mut self,
        fs: &mut Store,
        tree: &LogTree,
        c: &mut Committed,
        x: u64,
    ) -> Result<Option<String>> {
        let Some(l) = self.logged.get(&x) else {
            return Ok(None);
        };
        if l.linkless() {
            return Ok(None);
        }
        let (is_dir, has_item) = (l.is_dir(), l.inode.is_some());
        let dir_log = l.dir_log.clone();
        let dir_index = l.dir_index.clone();
        let refs = l.refs.clone();
        // A directory's logged ranges delete the committed entries the log
        // does not hold; each such entry's inode must be replayable, and a
        // directory losing its last name takes its entries with it.
        if is_dir && has_item {
            for (lo, hi) in dir_log {
                for (idx, name, t, ty) in c.entries(fs, x, lo, hi)? {
                    if ty != BTRFS_INODE_ITEM_KEY {
                        continue;
                    }
                    let in_log = dir_index.iter().any(|(i, n, _, _)| *i == idx && *n == name);
                    if in_log {
                        continue;
                    }
                    if let Some(why) = self.subtree_blocked(fs, tree, c, t)? {
                        return Ok(Some(format!(
                            "its log removes the entry \"{}\", but {why}",
                            String::from_utf8_lossy(&name)
                        )));
                    }
                }
            }
        }
        // Its logged entries are added (where the inode exists), replacing
        // what holds the index or the name.
        for (idx, name, t, ty) in &dir_index {
            if *ty != BTRFS_INODE_ITEM_KEY {
                continue;
            }
            let shown = String::from_utf8_lossy(name);
            if let Some((n, i)) = c.dir_index(fs, x, *idx)? {
                if !(n == *name && i == *t || self.ok(tree, i)) {
                    return Ok(Some(format!(
                        "its entry \"{shown}\" replaces one of inode {i}, which is not recovered"
                    )));
                }
            }
            if let Some(i) = c.lookup(fs, x, name)? {
                if !self.ok(tree, i) {
                    return Ok(Some(format!(
                        "its entry \"{shown}\" is held by inode {i}, which is not recovered"
                    )));
                }
            }
            if !self.ok(tree, *t) && c.exists(fs, *t)? {
                return Ok(Some(format!(
                    "its entry \"{shown}\" names inode {t}, which is not recovered"
                )));
            }
        }
        // Its own names: added where the directory will exist, replacing
        // entries that hold the name or the index.
        let mut parents = 0usize;
        let mut reachable = 0usize;
        let mut blocked_parent = None;
        for (d, idx, name) in &refs {
            if *d == x {
                continue;
            }
            parents += 1;
            let will_exist = c.exists(fs, *d)?
                || (self.ok(tree, *d)
                    && self
                        .logged
                        .get(d)
                        .is_some_and(|p| p.inode.is_some() && !p.linkless()));
            if !will_exist {
                if !self.ok(tree, *d) {
                    blocked_parent.get_or_insert(*d);
                }
                continue;
            }
            reachable += 1;
            let shown = String::from_utf8_lossy(name);
            if let Some(i) = c.lookup(fs, *d, name)? {
                if i != x && !self.ok(tree, i) {
                    return Ok(Some(format!("its name \"{shown}\" in directory {d} is held by inode {i}, which is not recovered")));
                }
            }
            if let Some((n, i)) = c.dir_index(fs, *d, *idx)? {
                if !(n == *name && i == x || self.ok(tree, i)) {
                    return Ok(Some(format!("its name \"{shown}\" in directory {d} replaces one of inode {i}, which is not recovered")));
                }
            }
        }
        if parents > 0 && reachable == 0 {
            if let Some(d) = blocked_parent {
                return Ok(Some(format!(
                    "the directory it is named in (inode {d}) is not recovered"
                )));
            }
        }
        // A directory has one name. A committed name of it outside the
        // directories its own log names must be removed by the log of the
        // directory holding it, so that directory must be replayed too.
        if is_dir {
            for (q, _, name) in c.names(fs, x)? {
                let handled = refs.iter().any(|(d, _, _)| *d == q);
                if !handled && !self.ok(tree, q) {
                    return Ok(Some(format!(
                        "a directory has one name, and its old name \"{}\" is in directory {q}, which is not recovered",
                        String::from_utf8_lossy(&name)
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Why removing a name of `t` could change something that is not
    /// replayed: `t` itself, or (a directory that may lose its last name
    /// takes its entries with it) anything below it.
    fn subtree_blocked(
        &mut self,
        fs: &mut Store,
        tree: &LogTree,
        c: &mut Committed,
        t: u64,
    ) -> Result<Option<String>> {
        let mut stack = vec![t];
        let mut seen = HashSet::new();
        while let Some(i) = stack.pop() {
            if !seen.insert(i) || seen.len() > 100_000 {
                continue;
            }
            if !self.ok(tree, i) {
                return Ok(Some(if i == t {
                    format!("inode {t} is not recovered")
                } else {
                    format!("inode {i} inside it is not recovered")
                }));
            }
            if c.is_dir(fs, i)? {
                for (_, _, child, ty) in c.entries(fs, i, 0, u64::MAX)? {
                    if ty == BTRFS_INODE_ITEM_KEY {
                        stack.push(child);
                    }
                }
            }
        }
        Ok(None)
    }

    /// The log with only the items replay may use: those of inodes it
    /// replays, the checksum items, and items that belong to no inode.
    fn filter(&self, mut tree: LogTree) -> LogTree {
        tree.items
            .retain(|(k, _)| !is_inode(k.objectid) || !self.not.contains_key(&k.objectid));
        tree
    }

    /// One line per inode the readable log names.
    fn outcomes(&self, fs: &Store, tree: &LogTree) -> Vec<InodeOutcome> {
        let mut inos: BTreeSet<u64> = self.logged.keys().copied().collect();
        // Inodes only a logged directory entry names: not replayable when
        // their own items may be in a lost block.
        for l in self.logged.values() {
            for (_, _, t, ty) in &l.dir_index {
                if *ty == BTRFS_INODE_ITEM_KEY && self.lost_memo_or_scan(tree, *t).is_some() {
                    inos.insert(*t);
                }
            }
        }
        let mut named: Vec<LoggedInode> = inos
            .iter()
            .map(|&ino| {
                let names = self
                    .logged
                    .get(&ino)
                    .map(|l| {
                        l.refs
                            .iter()
                            .map(|(d, idx, n)| LoggedName {
                                kind: NameKind::Ref,
                                parent: *d,
                                index: *idx,
                                name: escape_bytes(n),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                LoggedInode {
                    ino,
                    names,
                    ..Default::default()
                }
            })
            .collect();
        // Directory entries name inodes too, where their refs are missing.
        let entry_names: HashMap<u64, (u64, String)> = self
            .logged
            .iter()
            .flat_map(|(d, l)| {
                l.dir_index
                    .iter()
                    .map(move |(_, n, t, _)| (*t, (*d, escape_bytes(n))))
            })
            .collect();
        let img = fs.image();
        let fs_root = img.find_root(self.subvol).ok().flatten();
        resolve_paths(&mut named, |ino| {
            entry_names
                .get(&ino)
                .cloned()
                .or_else(|| fs_root.and_then(|r| committed_name(img, r, ino)))
        });
        named
            .into_iter()
            .map(|n| {
                let ino = n.ino;
                let kind = self
                    .logged
                    .get(&ino)
                    .and_then(|l| l.inode.as_ref())
                    .map(|i| mode_kind(i.mode.get()));
                let reason = self
                    .not
                    .get(&ino)
                    .cloned()
                    .or_else(|| self.lost_memo_or_scan(tree, ino));
                InodeOutcome {
                    subvol: self.subvol,
                    ino,
                    path: n.path,
                    kind,
                    outcome: if reason.is_none() {
                        Outcome::Recovered
                    } else {
                        Outcome::NotRecovered
                    },
                    reason,
                }
            })
            .collect()
    }

    fn lost_memo_or_scan(&self, tree: &LogTree, ino: u64) -> Option<String> {
        match self.lost_memo.get(&ino) {
            Some(v) => v.clone(),
            None => tree
                .read
                .lost_in(Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))
                .map(|l| {
                    format!(
                        "its log items were in lost log block {} ({})",
                        l.bytenr, l.why
                    )
                }),
        }
    }
}

fn csum_key(bytenr: u64) -> Key {
    Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, bytenr)
}

/// The committed subvolume, as replay will find it before it changes
/// anything (entries replay adds belong to inodes it replays, so checking
/// collisions against the committed entries is enough).
struct Committed {
    subvol: u64,
    exists: HashMap<u64, Option<u32>>,
}

impl Committed {
    fn mode(&mut self, fs: &mut Store, ino: u64) -> Result<Option<u32>> {
        if let Some(&m) = self.exists.get(&ino) {
            return Ok(m);
        }
        let m = crate::fs::inode::get_inode(fs, self.subvol, ino)?.map(|i| i.mode.get());
        self.exists.insert(ino, m);
        Ok(m)
    }
    fn exists(&mut self, fs: &mut Store, ino: u64) -> Result<bool> {
        Ok(self.mode(fs, ino)?.is_some())
    }
    fn is_dir(&mut self, fs: &mut Store, ino: u64) -> Result<bool> {
        Ok(self
            .mode(fs, ino)?
            .is_some_and(|m| m & 0o170000 == 0o040000))
    }
    /// (name, inode) of the entry at index `idx` of `dir`.
    fn dir_index(&mut self, fs: &mut Store, dir: u64, idx: u64) -> Result<Option<(Vec<u8>, u64)>> {
        Ok(crate::fs::names::entry_at(fs, self.subvol, dir, idx)?
            .map(|(n, loc, _)| (n, loc.objectid)))
    }
    /// The inode the entry `name` of `dir` names.
    fn lookup(&mut self, fs: &mut Store, dir: u64, name: &[u8]) -> Result<Option<u64>> {
        Ok(crate::fs::names::lookup_name(fs, self.subvol, dir, name)?.map(|(loc, _)| loc.objectid))
    }
    /// (directory, index, name) of every name of `ino`.
    fn names(&mut self, fs: &mut Store, ino: u64) -> Result<Vec<(u64, u64, Vec<u8>)>> {
        let items = fs.items_in(
            self.subvol,
            Key::new(ino, BTRFS_INODE_REF_KEY, 0),
            Key::new(ino, BTRFS_INODE_EXTREF_KEY, u64::MAX),
        )?;
        let mut out = Vec::new();
        for (k, d) in items {
            if k.ty == BTRFS_INODE_REF_KEY {
                for r in parse_inode_refs(&d).map_err(|e| e.at(0, k))? {
                    out.push((k.offset, r.index, r.name.to_vec()));
                }
            } else if k.ty == BTRFS_INODE_EXTREF_KEY {
                for r in parse_inode_extrefs(&d).map_err(|e| e.at(0, k))? {
                    out.push((r.parent, r.index, r.name.to_vec()));
                }
            }
        }
        // A subvolume root's ".." ref names itself; it is not a name in a directory.
        out.retain(|(d, _, _)| *d != ino);
        Ok(out)
    }
    /// (index, name, target, target key type) of the entries of `dir` with
    /// index in `[lo, hi]`.
    fn entries(
        &mut self,
        fs: &mut Store,
        dir: u64,
        lo: u64,
        hi: u64,
    ) -> Result<Vec<(u64, Vec<u8>, u64, u8)>> {
        let items = fs.items_in(
            self.subvol,
            Key::new(dir, BTRFS_DIR_INDEX_KEY, lo),
            Key::new(dir, BTRFS_DIR_INDEX_KEY, hi),
        )?;
        let mut out = Vec::with_capacity(items.len());
        for (k, d) in items {
            let v = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
            if let Some(e) = v.first() {
                let loc = Key::from(&e.item.location);
                out.push((k.offset, e.name.to_vec(), loc.objectid, loc.ty));
            }
        }
        Ok(out)
    }
}

/// After replay: an inode logged as unlinked that is still there kept its
/// committed state (the entry naming it could only go with a log that was
/// not replayed).
pub(crate) fn after_replay(
    fs: &mut Store,
    report: &mut SalvageReport,
    logs: &[LogTree],
) -> Result<()> {
    for o in report
        .inodes
        .iter_mut()
        .filter(|o| o.outcome == Outcome::Recovered)
    {
        let Some(log) = logs.iter().find(|l| l.subvol == o.subvol) else {
            continue;
        };
        let Some(logged) = log.inode_item(o.ino) else {
            continue;
        };
        // A replayed inode that replay removed lost its names to logs that
        // were replayed (a directory's logged deletions, its own names), as
        // in the kernel's replay: the selection never leaves one whose new
        // directory is missing without a name.
        let exists = crate::fs::inode::get_inode(fs, o.subvol, o.ino)?.is_some();
        if logged.nlink.get() == 0 && exists {
            // Logged as unlinked: the kernel's replay removes it once the
            // entries naming it go, which other inodes' logs decide.
            o.outcome = Outcome::NotRecovered;
            o.reason = Some("logged as unlinked, but an entry naming it could only be removed by a log that was not recovered; it keeps its committed state".into());
        }
    }
    report.recovered = report
        .inodes
        .iter()
        .filter(|i| i.outcome == Outcome::Recovered)
        .count();
    report.not_recovered = report.inodes.len() - report.recovered;
    Ok(())
}
