//! `fsck --repair`: the checker's findings become a [`Plan`] (finding ->
//! action), and the plan runs through the engine as one transaction: every
//! change is copy-on-write and the single commit that ends it is the only
//! moment the image changes meaning. Cut anywhere before that commit's
//! superblocks are written, the image is what it was; after, it is
//! repaired.
//!
//! A repair is offered only where what is on disk determines the answer
//! (the checker attaches it to its finding as a [`Repair`]); every other
//! error is listed as not repairable with its reason. When the allocator
//! itself cannot be trusted (a damaged extent tree, chunk tree or tree
//! block: a new block could land on one in use), nothing is written.

use super::findings::{Category, Finding, Phase, Repair, Report, Severity};
use super::{CheckOptions, Progress};
use crate::alloc::RangeSet;
use crate::format::consts::*;
use crate::format::file_extent::FileExtent;
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::image::{Image, OpenOptions};
use crate::trans::{Store, TreeId};
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

/// Which free space cache an explicit `--clear-space-cache` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpaceCache {
    /// The v1 cache (inodes in the root tree): removed.
    V1,
    /// The free space tree: rebuilt from the extent tree.
    V2,
}

/// What the user asked for beyond the repairs the findings call for.
#[derive(Clone, Copy, Debug, Default)]
pub struct RepairOptions {
    /// Rebuild the checksum tree from the data (`--init-csum-tree`).
    pub init_csum_tree: bool,
    /// Clear (v1) or rebuild (v2) the free space cache even if it is fine.
    pub clear_space_cache: Option<SpaceCache>,
}

/// One action of a plan, with the findings it answers.
#[derive(Clone, Debug, Serialize)]
pub struct Action {
    /// The repair class (`free-space`, `inode`, `superblock`...).
    pub class: &'static str,
    /// What is done.
    pub repair: Repair,
    /// The same in a sentence.
    pub description: String,
    /// Messages of the findings this answers (at most [`MAX_LISTED`];
    /// `findings` counts them all); empty for an action the user asked
    /// for by option.
    pub answers: Vec<String>,
    /// How many findings this answers.
    pub findings: u64,
}

/// An error the plan does not repair, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Unrepaired {
    /// The finding.
    pub finding: Finding,
    /// Why it is left alone.
    pub reason: String,
}

/// What a repair would do: built from a check's findings, nothing written.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// The actions, in the order they run.
    pub actions: Vec<Action>,
    /// Errors left as they are.
    pub not_repairable: Vec<Unrepaired>,
    /// Set when nothing may be written at all, with the reason; the
    /// actions are then what would be done once that is resolved.
    pub refused: Option<String>,
    /// Every range the trees reference ([`Report::in_use`]): kept from
    /// the allocator while the plan runs, whatever the extent tree says.
    #[serde(skip)]
    pub in_use: Vec<(u64, u64)>,
}

/// Why nothing is written while a log waits for replay.
const LOG_TO_REPLAY: &str =
    "the filesystem has a log tree to replay: run btrkit-replay first (a repair would have to drop it)";

/// Most finding messages listed under one action.
pub const MAX_LISTED: usize = 20;

impl Plan {
    /// The plan for the findings of `report`, on a filesystem whose
    /// superblock is `img`'s.
    pub fn new(report: &Report, img: &Image, opts: RepairOptions) -> Plan {
        let mut by_repair: BTreeMap<Repair, Action> = BTreeMap::new();
        let mut add = |r: Repair, msg: Option<&str>| {
            let a = by_repair.entry(r.clone()).or_insert_with(|| Action {
                class: r.class(),
                description: r.describe(),
                repair: r,
                answers: Vec::new(),
                findings: 0,
            });
            if let Some(m) = msg {
                a.findings += 1;
                if a.answers.len() < MAX_LISTED {
                    a.answers.push(m.to_string());
                }
            }
        };
        match opts.clear_space_cache {
            Some(SpaceCache::V1) => add(Repair::ClearSpaceCache, None),
            Some(SpaceCache::V2) => add(Repair::RebuildFreeSpaceTree, None),
            None => {}
        }
        if opts.init_csum_tree {
            add(Repair::RebuildCsumTree, None);
        }
        let mut not_repairable = Vec::new();
        let mut unsafe_alloc: Option<&Finding> = None;
        let (by_place, by_addr) = repairs_by_place(report);
        // A tree's references are only as good as the root item that says
        // which tree it is.
        let links_damaged = report.findings.iter().any(|f| {
            f.severity == Severity::Error
                && f.repair.is_none()
                && kind(f.category) == Kind::SubvolumeLinks
        });
        for f in &report.findings {
            if let Some(r) = &f.repair {
                let trusted = !matches!(
                    r,
                    Repair::ExtentRefs {
                        other_owners: true,
                        ..
                    }
                ) || !links_damaged;
                if trusted {
                    add(r.clone(), Some(&f.message));
                    continue;
                }
                if unsafe_alloc.is_none() {
                    unsafe_alloc = Some(f);
                }
                not_repairable.push(Unrepaired {
                    finding: f.clone(),
                    reason: "the trees hold this extent under other owners, and the subvolume links that say which tree is which are damaged".into(),
                });
                continue;
            }
            if f.severity != Severity::Error {
                continue;
            }
            let same = match f.key {
                Some(k) => by_place.get(&(f.tree, k)),
                None => f.bytenr.and_then(|b| by_addr.get(&(f.tree, b))),
            };
            if let Some(r) = same {
                add(r.clone(), Some(&f.message));
                continue;
            }
            if opts.init_csum_tree && is_csum_finding(f) {
                add(Repair::RebuildCsumTree, Some(&f.message));
                continue;
            }
            if walk_incomplete(f) && unsafe_alloc.is_none() {
                unsafe_alloc = Some(f);
            }
            not_repairable.push(Unrepaired {
                finding: f.clone(),
                reason: reason(f).into(),
            });
        }
        if report.suppressed > 0 {
            not_repairable.push(suppressed(report.suppressed));
        }
        let refused = refusal(report, img, unsafe_alloc);
        let mut actions: Vec<Action> = by_repair.into_values().collect();
        actions.sort_by_key(|a| order(&a.repair));
        Plan {
            actions,
            not_repairable,
            refused,
            in_use: report.in_use.clone(),
        }
    }

    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
}

/// The repairs of the report's findings by the item they are about (tree
/// and key) and, for findings without a key, by block or extent.
fn repairs_by_place(
    report: &Report,
) -> (
    BTreeMap<(Option<u64>, Key), Repair>,
    BTreeMap<(Option<u64>, u64), Repair>,
) {
    // A finding without a repair about the same item (or, without a
    // key, the same block or extent) as one with a repair is answered
    // by that repair: e.g. the tree checker's complaint about an
    // extent item the extent phase rebuilds.
    let mut by_place: BTreeMap<(Option<u64>, Key), Repair> = BTreeMap::new();
    let mut by_addr: BTreeMap<(Option<u64>, u64), Repair> = BTreeMap::new();
    for f in &report.findings {
        if let Some(r) = &f.repair {
            if let Some(k) = f.key {
                by_place.entry((f.tree, k)).or_insert_with(|| r.clone());
            }
            if let (Some(b), None) = (f.bytenr, f.key) {
                by_addr.entry((f.tree, b)).or_insert_with(|| r.clone());
            }
            if let (Some(b), Repair::FileExtentDisk { tree, .. }) = (f.bytenr, r) {
                by_addr.entry((Some(*tree), b)).or_insert_with(|| r.clone());
            }
        }
    }
    (by_place, by_addr)
}

/// The note of findings counted but not stored: too many to plan.
fn suppressed(n: u64) -> Unrepaired {
    Unrepaired {
        finding: Finding {
            phase: Phase::None,
            category: Category::Suppressed,
            severity: Severity::Error,
            tree: None,
            bytenr: None,
            key: None,
            message: format!("{n} findings were counted but not stored"),
            repair: None,
        },
        reason: "too many findings to plan a repair of each; run again after this one".into(),
    }
}

/// Why the repair must not be done at all: a log to replay, a tree that
/// could not be walked whole, more errors than the report lists, missing
/// devices.
fn refusal(report: &Report, img: &Image, unsafe_alloc: Option<&Finding>) -> Option<String> {
    // Findings past the report's cap are counted, not listed: in the
    // phases that walk the trees, an unlisted one may be a block that
    // could not be walked.
    let unlisted = [Phase::Chunks, Phase::TreeBlocks].into_iter().find(|&p| {
        let listed = report
            .findings
            .iter()
            .filter(|f| f.phase == p && f.severity == Severity::Error)
            .count() as u64;
        report
            .phases
            .iter()
            .any(|s| s.phase == p && s.errors > listed)
    });
    if img.sb.log_root.get() != 0 {
        Some(LOG_TO_REPLAY.to_string())
    } else if let Some(f) = unsafe_alloc {
        Some(format!(
                "{} could not be walked whole ({}: {}{}): what it references is unknown, so a repair could write over blocks in use",
                match f.tree {
                    Some(t) => format!("tree {}", t as i64),
                    None => "the chunk tree".to_string(),
                },
                f.category,
                f.message,
                f.bytenr.map(|b| format!(", block {b}")).unwrap_or_default()
            ))
    } else if let Some(p) = unlisted {
        Some(format!(
                "phase {p} found more errors than the report lists: too many to know that the allocator can be trusted"
            ))
    } else if !img.missing.is_empty() {
        Some("devices are missing: repair a complete set".to_string())
    } else {
        None
    }
}

/// Run order: sizes first; then names (removals before additions, so an
/// index a bogus entry held is free for the right one); then the counts
/// that follow from names and extents; then the caches that are derived
/// from everything else.
fn order(r: &Repair) -> u8 {
    match r {
        Repair::RootItemLocation { .. } => 0,
        Repair::LeafItems { .. } => 0,
        Repair::RecowPath { .. } => 0,
        Repair::AddExtentItem { .. } => 0,
        Repair::RebuildExtentItem { .. } => 0,
        Repair::FileExtentDisk { .. } => 1,
        Repair::DeleteDevExtent { .. } | Repair::DevExtentFromChunk { .. } => 0,
        Repair::AddRootOrphan { .. } => 1,
        Repair::CsumOverlap { .. } => 1,
        Repair::InodeMode { .. } | Repair::InodeFlags { .. } => 2,
        Repair::FileExtentGeneration { .. } => 2,
        Repair::RewriteSuperblocks => 0,
        Repair::DeviceSizes => 1,
        Repair::ClearInodeCache { .. } => 2,
        Repair::RecreateInodeItem { .. } => 2,
        Repair::InodeGeneration { .. } | Repair::ExtentGeneration { .. } => 2,
        Repair::ExtentRefs { .. } => 2,
        Repair::FileHoles { .. } => 7,
        Repair::RemoveDirEntry { .. } | Repair::RemoveInodeRef { .. } => 3,
        Repair::AddInodeRef { .. } => 4,
        Repair::AddDirItem { .. } | Repair::AddDirIndex { .. } => 5,
        Repair::LinkToLostFound { .. } => 6,
        Repair::InlineRamBytes { .. } => 7,
        Repair::SetNlink { .. } | Repair::SetSize { .. } | Repair::SetNbytes { .. } => 8,
        Repair::DeleteUnlinkedInode { .. } | Repair::OrphanCleanup { .. } => 9,
        Repair::ClearSpaceCache => 10,
        Repair::RebuildCsumTree => 11,
        Repair::BlockGroupUsage => 12,
        Repair::RebuildFreeSpaceTree => 13,
        Repair::RecountQgroups => 14,
        Repair::RebuildUuidTree => 15,
    }
}

/// Whether an error without a repair means some tree could not be walked
/// whole, so that what it references is unknown: a damaged chunk tree (the
/// map from addresses to devices) or a tree block that failed its checks
/// (an extent item whose body cannot be read is not one: its key still
/// claims its range, and the references come from the other trees). Errors
/// in derived records (block group and device counts, dev extents, the
/// extent items' contents) do not stop a repair: the allocator of a
/// repair keeps every range a tree references, see [`Plan::in_use`].
fn walk_incomplete(f: &Finding) -> bool {
    match f.phase {
        Phase::Chunks => kind(f.category) == Kind::ChunkMap,
        Phase::TreeBlocks => {
            !(kind(f.category) == Kind::TreeItem && f.tree == Some(BTRFS_EXTENT_TREE_OBJECTID))
        }
        Phase::None
        | Phase::Superblocks
        | Phase::Extents
        | Phase::FreeSpace
        | Phase::Subvolumes
        | Phase::Checksums
        | Phase::Logs
        | Phase::Qgroups => false,
    }
}

fn is_csum_finding(f: &Finding) -> bool {
    f.phase == Phase::Checksums && kind(f.category) == Kind::Checksums
}

/// What a repair makes of a finding's category when the finding carries
/// no repair of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Directory entries and back references.
    Names,
    /// An extent item whose range or length is in question.
    ExtentItems,
    /// Data checksums (rebuilt only on request).
    Checksums,
    /// A generation from the future.
    FutureGeneration,
    /// An item whose right contents nothing on disk determines.
    Undetermined,
    /// A count no other item records.
    NoOtherRecord,
    /// Subvolume links: root items and references.
    SubvolumeLinks,
    /// The fsync log.
    Log,
    /// The chunk tree or the system chunk array: the address map.
    ChunkMap,
    /// A tree item whose body is malformed.
    TreeItem,
    /// Anything else.
    Other,
}

fn kind(c: Category) -> Kind {
    match c {
        Category::Name => Kind::Names,
        Category::ExtentRef
        | Category::ExtentRefs
        | Category::ExtentItem
        | Category::ExtentMissing
        | Category::ExtentOverlap => Kind::ExtentItems,
        Category::CsumMissing
        | Category::DataCsum
        | Category::CsumOdd
        | Category::CsumOrphan
        | Category::CsumItem
        | Category::CsumOverlap => Kind::Checksums,
        Category::InodeGeneration | Category::ExtentGeneration => Kind::FutureGeneration,
        Category::FileExtent
        | Category::InodeMode
        | Category::InodeFlags
        | Category::UnknownKey
        | Category::InodeCache => Kind::Undetermined,
        Category::Inode | Category::InodeNlink => Kind::NoOtherRecord,
        Category::RootRef | Category::RootOrphan | Category::RootItem => Kind::SubvolumeLinks,
        Category::LogRoot
        | Category::LogBlock
        | Category::LogShape
        | Category::LogExtent
        | Category::LogCsum
        | Category::LogDirRange
        | Category::LogGeneration => Kind::Log,
        Category::Chunk | Category::SysChunkArray => Kind::ChunkMap,
        Category::Item => Kind::TreeItem,
        Category::BackupRoot
        | Category::BlockGroup
        | Category::Checksum
        | Category::DevExtent
        | Category::DevItem
        | Category::DirLink
        | Category::ExtentPlacement
        | Category::Features
        | Category::FreeSpace
        | Category::FreeSpaceStale
        | Category::Header
        | Category::ItemBounds
        | Category::KeyOrder
        | Category::MirrorCopy
        | Category::Open
        | Category::Orphan
        | Category::ParentTransid
        | Category::Parity
        | Category::ParityRebuild
        | Category::QgroupCount
        | Category::QgroupInfo
        | Category::QgroupItem
        | Category::QgroupLimit
        | Category::QgroupRelation
        | Category::QgroupStatus
        | Category::SpaceCache
        | Category::Superblock
        | Category::Suppressed
        | Category::TreeShape
        | Category::Unreadable
        | Category::UuidTree => Kind::Other,
    }
}

/// Why an error without a repair is left alone.
fn reason(f: &Finding) -> &'static str {
    match kind(f.category) {
        Kind::Names => "directory entries and back references are not repaired yet",
        Kind::ExtentItems => {
            "the extent item cannot be rewritten in place from the trees (its range or length is in question): the extent tree would have to be rebuilt"
        }
        Kind::Checksums => {
            "checksums are rebuilt only on request (--init-csum-tree), as that trusts the data"
        }
        Kind::FutureGeneration => {
            "a generation from the future is not determined by anything else on disk"
        }
        Kind::Undetermined => "what the item should hold is not determined by what is on disk",
        Kind::NoOtherRecord => "no other item on disk says what the right value is",
        Kind::SubvolumeLinks => "subvolume links are not repaired yet",
        Kind::Log => "the log is replayed (btrkit-replay) or dropped, not repaired",
        Kind::ChunkMap | Kind::TreeItem | Kind::Other => {
            "not determined by what is on disk, or not repaired yet"
        }
    }
}

/// What a repair run did.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// The check before anything was written.
    pub before: Report,
    /// The plan made from it.
    pub plan: Plan,
    /// Whether the plan was carried out and committed.
    pub committed: bool,
    /// What each action changed, in order.
    pub changes: Vec<String>,
    /// The check after the commit.
    pub after: Option<Report>,
}

/// The devices a repair works on.
#[derive(Clone)]
pub enum Target {
    /// Image files or block devices, in any order (one filesystem);
    /// `degraded` as `mount -o degraded`.
    Paths {
        /// The devices.
        paths: Vec<PathBuf>,
        /// Some may be missing.
        degraded: bool,
    },
    /// One device already open (an image in memory, a crash device).
    Device(Arc<dyn crate::io::BlockDevice>),
}

impl Target {
    fn check(&self, opts: CheckOptions, progress: &dyn Progress) -> Result<Report> {
        self.check_after(opts, progress, None)
    }

    /// The check after a repair, taking the unchanged trees' facts from
    /// the one before it.
    fn check_after(
        &self,
        opts: CheckOptions,
        progress: &dyn Progress,
        prior: Option<Arc<super::reuse::Prior>>,
    ) -> Result<Report> {
        match self {
            Target::Paths { paths, degraded } => {
                super::check_paths_after(paths, *degraded, opts, progress, prior)
            }
            Target::Device(d) => super::check_device_after(d.clone(), opts, progress, prior),
        }
    }

    /// The filesystem: the primary superblock, or the first good mirror
    /// when it is unusable (one device), as the check does.
    pub fn open(&self, writable: bool) -> Result<Image> {
        use crate::devices::{Access, Devices, Single};
        let (devices, degraded) = match self {
            Target::Paths { paths, degraded } => (
                Devices::open_paths(
                    paths,
                    Access {
                        writable,
                        mmap: false,
                    },
                )?,
                // One device is opened whole or not at all.
                *degraded && paths.len() > 1,
            ),
            Target::Device(d) => (Devices::new(vec![(String::new(), d.clone())]), false),
        };
        let opts = OpenOptions {
            writable,
            degraded,
            ..Default::default()
        };
        Ok(devices.open(opts, Single::AnyMirror)?.img)
    }
}

/// Check the filesystem and plan its repair; nothing written.
pub fn plan(
    target: &Target,
    check: CheckOptions,
    opts: RepairOptions,
    progress: &dyn Progress,
) -> Result<Outcome> {
    let before = target.check(
        CheckOptions {
            for_repair: true,
            ..check
        },
        progress,
    )?;
    let probe = target.open(false)?;
    let plan = Plan::new(&before, &probe, opts);
    Ok(Outcome {
        before,
        plan,
        committed: false,
        changes: Vec::new(),
        after: None,
    })
}

/// `--clear-space-cache` on its own, as btrfs check runs it: the v1 cache
/// removed or the free space tree rebuilt from the extent tree (and the
/// block group items with it), one commit, no check before or after. The
/// extent tree is read as every engine read is, validated block by block;
/// nothing else is. Refused when a log is to be replayed or a device is
/// missing. Returns what changed.
pub fn clear_space_cache_only(target: &Target, which: SpaceCache) -> Result<Vec<String>> {
    let img = target.open(true)?;
    if img.sb.log_root.get() != 0 {
        return Err(Error::Invalid(LOG_TO_REPLAY.into()));
    }
    if !img.missing.is_empty() {
        return Err(Error::Invalid(
            "devices are missing: clear the cache on a complete set".into(),
        ));
    }
    // The whole extent tree is read to know what is free: ask for all of
    // its leaves at once rather than one after another.
    super::walk::prefetch_extent_leaves(&img);
    let mut st = Store::from_image(img)?;
    let changes = match which {
        SpaceCache::V1 => clear_space_cache(&mut st)?,
        SpaceCache::V2 => {
            if !st.has_fst() {
                return Err(Error::Invalid(
                    "the filesystem has no free space tree to rebuild".into(),
                ));
            }
            rebuild_free_space(&mut st)?
        }
    };
    st.commit()?;
    Ok(changes)
}

/// Carry out the plan of `planned` ([`plan`]) in one transaction, then
/// check again. A plan that is empty or refused writes nothing.
pub fn carry_out(
    target: &Target,
    check: CheckOptions,
    mut planned: Outcome,
    progress: &dyn Progress,
) -> Result<Outcome> {
    if planned.plan.is_empty() || planned.plan.refused.is_some() || planned.committed {
        return Ok(planned);
    }
    progress.phase(10, "repair", planned.plan.actions.len() as u64);
    let img = target.open(true)?;
    planned.changes = apply(img, &planned.plan, progress)?;
    planned.committed = true;
    let prior = planned.before.prior.clone();
    planned.after = Some(target.check_after(check, progress, prior)?);
    Ok(planned)
}

/// Carry out `plan` on `img` (opened writable) in one transaction and
/// commit it. Returns what each action changed.
pub fn apply(img: Image, plan: &Plan, progress: &dyn Progress) -> Result<Vec<String>> {
    if let Some(r) = &plan.refused {
        return Err(Error::Invalid(format!("repair refused: {r}")));
    }
    let mut img = img;
    // Blocks from the future are read to be copied (the check found each).
    img.accept_future = plan
        .actions
        .iter()
        .any(|a| matches!(a.repair, Repair::RecowPath { .. }));
    img.accept_extent_items = plan
        .actions
        .iter()
        .any(|a| matches!(a.repair, Repair::RebuildExtentItem { .. }));
    let mut st = Store::from_image(img)?;
    // Extents in use that the extent tree lost are free space to the
    // allocator: every one is taken before the first block is copied.
    for a in &plan.actions {
        if let Repair::AddExtentItem { bytenr, len, .. } = a.repair {
            st.chunks().reserve(bytenr, len)?;
        }
    }
    // What any tree references is in use, whatever the extent tree says
    // (an item lost, a length wrong): kept from allocation until the
    // commit, without changing what the extent tree accounts.
    for &(s, e) in &plan.in_use {
        st.chunks().pin_free(s, e);
    }
    let mut run = Run {
        st: &mut st,
        dirs: BTreeSet::new(),
        inodes: BTreeSet::new(),
        changes: Vec::new(),
    };
    for a in &plan.actions {
        if order(&a.repair) >= 8 {
            run.recount()?;
        }
        run.one(&a.repair)?;
        progress.advance(1);
    }
    run.recount()?;
    let changes = std::mem::take(&mut run.changes);
    st.commit()?;
    Ok(changes)
}

/// The running repair: what it changed, and the directories and inodes
/// whose names it changed (their sizes and link counts follow).
struct Run<'a> {
    st: &'a mut Store,
    dirs: BTreeSet<(u64, u64)>,
    inodes: BTreeSet<(u64, u64)>,
    changes: Vec<String>,
}

impl Run<'_> {
    /// Sizes of the directories and link counts of the inodes whose
    /// names changed, from what they now hold.
    fn recount(&mut self) -> Result<()> {
        for (tree, dir) in std::mem::take(&mut self.dirs) {
            self.set_size(tree, dir)?;
        }
        for (tree, ino) in std::mem::take(&mut self.inodes) {
            self.set_nlink(tree, ino)?;
        }
        Ok(())
    }

    fn set_size(&mut self, tree: u64, dir: u64) -> Result<()> {
        let size = crate::fs::names::dir_size_from_entries(self.st, tree, dir)?;
        let mut old = 0;
        let found = crate::fs::inode::modify_inode(self.st, tree, dir, |i| {
            old = i.size.get();
            i.size.set(size);
        })?;
        if found && old != size {
            self.changes.push(format!(
                "directory {dir} (tree {tree}): size {old} -> {size}"
            ));
        }
        Ok(())
    }

    /// The link count the names give: one per name, and one for a
    /// directory that has any (a directory has no hard links).
    fn set_nlink(&mut self, tree: u64, ino: u64) -> Result<()> {
        let n = crate::fs::names::count_links(self.st, tree, ino)?;
        if n == 0 {
            return Ok(());
        }
        let (mut old, mut new) = (0, 0);
        let found = crate::fs::inode::modify_inode(self.st, tree, ino, |i| {
            old = i.nlink.get();
            new = if crate::fs::inode::is_dir(i.mode.get()) {
                1
            } else {
                n
            };
            i.nlink.set(new);
        })?;
        if found && old != new {
            self.changes
                .push(format!("inode {ino} (tree {tree}): nlink {old} -> {new}"));
        }
        Ok(())
    }

    fn one(&mut self, r: &Repair) -> Result<()> {
        match *r {
            Repair::RewriteSuperblocks => self
                .changes
                .push("every superblock copy written by the commit".into()),
            Repair::DeviceSizes => self.changes.extend(self.st.repair().fix_device_sizes()?),
            Repair::SetNlink { tree, ino, .. } => self.set_nlink(tree, ino)?,
            Repair::SetSize { tree, ino, .. } => self.set_size(tree, ino)?,
            Repair::SetNbytes { tree, ino, .. } => self.set_nbytes(tree, ino)?,
            Repair::OrphanCleanup { tree, ino } => {
                self.changes.push(orphan_cleanup(self.st, tree, ino)?)
            }
            Repair::DeleteUnlinkedInode { tree, ino } => {
                crate::fs::extents::drop_inode_items(self.st, tree, ino)?;
                self.changes
                    .push(format!("inode {ino} (tree {tree}): deleted with its data"));
            }
            Repair::RemoveDirEntry {
                tree,
                dir,
                ino,
                key_type,
                offset,
            } => self.remove_dir_entry(tree, dir, ino, key_type, offset)?,
            Repair::AddDirItem {
                tree,
                dir,
                ino,
                index,
            }
            | Repair::AddDirIndex {
                tree,
                dir,
                ino,
                index,
            } => self.add_dir_entry(r, tree, dir, ino, index)?,
            Repair::RemoveInodeRef {
                tree,
                dir,
                ino,
                index,
            } => self.remove_inode_ref(tree, dir, ino, index)?,
            Repair::AddInodeRef {
                tree,
                dir,
                ino,
                index,
            } => self.add_inode_ref(tree, dir, ino, index)?,
            Repair::LinkToLostFound { tree, ino } => self.link_to_lost_found(tree, ino)?,
            Repair::ClearInodeCache { tree } => {
                let n = clear_inode_cache(self.st, tree)?;
                self.changes
                    .push(format!("tree {tree}: {n} inode cache items removed"));
            }
            Repair::InlineRamBytes { tree, ino } => self.inline_ram_bytes(tree, ino)?,
            Repair::RecreateInodeItem { tree, ino } => {
                self.changes.push(recreate_inode_item(self.st, tree, ino)?)
            }
            Repair::FileHoles { tree, ino } => {
                let n = fill_file_holes(self.st, tree, ino)?;
                self.changes
                    .push(format!("inode {ino} (tree {tree}): {n} holes covered"));
            }
            Repair::InodeGeneration { tree, ino } => self.inode_generation(tree, ino)?,
            Repair::ExtentGeneration { bytenr } => self.extent_generation(bytenr)?,
            Repair::InodeMode { tree, ino } => self.inode_mode(tree, ino)?,
            Repair::InodeFlags { tree, ino, clear } => self.inode_flags(tree, ino, clear)?,
            Repair::FileExtentGeneration { tree, ino, offset } => {
                self.file_extent_generation(tree, ino, offset)?
            }
            Repair::AddRootOrphan { tree } => self.add_root_orphan(tree)?,
            Repair::ClearSpaceCache => self.changes.extend(clear_space_cache(self.st)?),
            Repair::RebuildCsumTree => self.changes.extend(rebuild_csum_tree(self.st)?),
            Repair::BlockGroupUsage => {
                self.st.chunks().rewrite_block_groups();
                self.changes
                    .push("block group items rewritten from the extent tree".into());
            }
            Repair::RebuildFreeSpaceTree => self.changes.extend(rebuild_free_space(self.st)?),
            Repair::RecountQgroups => {
                self.st.quotas().quota_rescan()?;
                self.changes.push("quota groups recounted".into());
            }
            Repair::RebuildUuidTree => {
                let (removed, added) = crate::fs::subvol::rebuild_uuid_tree(self.st)?;
                self.changes.push(format!(
                    "UUID tree rebuilt: {removed} items removed, {added} entries added"
                ));
            }
            Repair::ExtentRefs { .. }
            | Repair::AddExtentItem { .. }
            | Repair::RebuildExtentItem { .. }
            | Repair::FileExtentDisk { .. }
            | Repair::DevExtentFromChunk { .. }
            | Repair::DeleteDevExtent { .. }
            | Repair::RecowPath { .. }
            | Repair::LeafItems { .. }
            | Repair::RootItemLocation { .. }
            | Repair::CsumOverlap { .. } => self.tree_repair(r)?,
        }
        Ok(())
    }

    /// A repair of the extent, device, checksum or root trees, or of a
    /// tree block: the store's operation, and the change it reports.
    fn tree_repair(&mut self, r: &Repair) -> Result<()> {
        match *r {
            Repair::ExtentRefs {
                bytenr, ref refs, ..
            } => self.changes.push(
                self.st
                    .repair()
                    .rewrite_extent_refs(bytenr, &inline_refs(refs))?,
            ),
            Repair::AddExtentItem {
                bytenr,
                len,
                level,
                ref refs,
            } => self.changes.push(self.st.repair().add_extent_item(
                bytenr,
                len,
                level,
                &inline_refs(refs),
            )?),
            Repair::RebuildExtentItem {
                bytenr,
                len,
                level,
                ref refs,
            } => self.changes.push(self.st.repair().rebuild_extent_item(
                bytenr,
                len,
                level,
                &inline_refs(refs),
            )?),
            Repair::FileExtentDisk {
                tree,
                ino,
                offset,
                from,
                to,
            } => self
                .changes
                .push(file_extent_disk(self.st, tree, ino, offset, from, to)?),
            Repair::DevExtentFromChunk {
                devid,
                physical,
                chunk,
                length,
            } => self.changes.push(
                self.st
                    .repair()
                    .dev_extent_from_chunk(devid, physical, chunk, length)?,
            ),
            Repair::DeleteDevExtent { devid, physical } => self
                .changes
                .push(self.st.repair().delete_dev_extent(devid, physical)?),
            Repair::CsumOverlap { bytenr } => self
                .changes
                .push(self.st.repair().cut_csum_overlap(bytenr)?),
            Repair::RecowPath { tree, key } => {
                self.changes.push(self.st.repair().recow_path(tree, &key)?)
            }
            Repair::LeafItems { tree, bytenr } => self
                .changes
                .push(self.st.repair().rewrite_mended_leaf(tree, bytenr)?),
            Repair::RootItemLocation {
                tree,
                bytenr,
                level,
                generation,
            } => self.changes.push(
                self.st
                    .repair()
                    .point_root_at(tree, bytenr, level, generation)?,
            ),
            Repair::RewriteSuperblocks
            | Repair::DeviceSizes
            | Repair::SetNlink { .. }
            | Repair::SetSize { .. }
            | Repair::SetNbytes { .. }
            | Repair::OrphanCleanup { .. }
            | Repair::DeleteUnlinkedInode { .. }
            | Repair::RemoveDirEntry { .. }
            | Repair::AddDirItem { .. }
            | Repair::AddDirIndex { .. }
            | Repair::RemoveInodeRef { .. }
            | Repair::AddInodeRef { .. }
            | Repair::LinkToLostFound { .. }
            | Repair::ClearInodeCache { .. }
            | Repair::InlineRamBytes { .. }
            | Repair::RecreateInodeItem { .. }
            | Repair::FileHoles { .. }
            | Repair::InodeGeneration { .. }
            | Repair::ExtentGeneration { .. }
            | Repair::InodeMode { .. }
            | Repair::InodeFlags { .. }
            | Repair::FileExtentGeneration { .. }
            | Repair::AddRootOrphan { .. }
            | Repair::ClearSpaceCache
            | Repair::RebuildCsumTree
            | Repair::BlockGroupUsage
            | Repair::RebuildFreeSpaceTree
            | Repair::RecountQgroups
            | Repair::RebuildUuidTree => {
                return Err(Error::Invalid(format!(
                    "not a tree repair: {}",
                    r.describe()
                )))
            }
        }
        Ok(())
    }

    /// Set an inode's nbytes to what its file extents add up to.
    fn set_nbytes(&mut self, tree: u64, ino: u64) -> Result<()> {
        let nbytes = crate::fs::extents::count_nbytes(self.st, tree, ino)?;
        let mut old = 0;
        let found = crate::fs::inode::modify_inode(self.st, tree, ino, |i| {
            old = i.nbytes.get();
            i.nbytes.set(nbytes);
        })?;
        self.changes.extend(inode_change(
            found,
            tree,
            ino,
            format!("nbytes {old} -> {nbytes}"),
        )?);
        Ok(())
    }

    /// Remove the entries naming `ino` from a directory item.
    fn remove_dir_entry(
        &mut self,
        tree: u64,
        dir: u64,
        ino: u64,
        key_type: u8,
        offset: u64,
    ) -> Result<()> {
        let k = Key::new(dir, key_type, offset);
        let n = crate::fs::names::remove_dir_entries_of(self.st, tree, &k, ino)?;
        if n > 0 {
            self.dirs.insert((tree, dir));
            self.inodes.insert((tree, ino));
            self.changes.push(format!(
                "directory {dir} (tree {tree}): removed {} for inode {ino}",
                crate::format::names::key_string(&k)
            ));
        }
        Ok(())
    }

    /// Re-add a directory's DIR_ITEM or DIR_INDEX from the inode's back reference.
    fn add_dir_entry(
        &mut self,
        r: &Repair,
        tree: u64,
        dir: u64,
        ino: u64,
        index: u64,
    ) -> Result<()> {
        let transid = self.st.transid();
        let names = crate::fs::names::links_in(self.st, tree, ino, dir)?;
        let Some((_, name)) = names.into_iter().find(|(i, _)| *i == index) else {
            return Err(Error::Invalid(format!(
                "inode {ino} (tree {tree}) has no back reference {index} in directory {dir}"
            )));
        };
        let mode = inode_mode(self.st, tree, ino)?;
        let which = matches!(r, Repair::AddDirIndex { .. }).then_some(index);
        crate::fs::names::add_dir_entry(
            self.st,
            tree,
            dir,
            Key::new(ino, BTRFS_INODE_ITEM_KEY, 0),
            &name,
            crate::fs::inode::ftype_of_mode(mode),
            which,
            transid,
        )?;
        self.dirs.insert((tree, dir));
        self.changes.push(format!(
            "directory {dir} (tree {tree}): {} for '{}' (inode {ino}) re-added",
            if which.is_some() {
                "DIR_INDEX"
            } else {
                "DIR_ITEM"
            },
            String::from_utf8_lossy(&name)
        ));
        Ok(())
    }

    /// Remove an inode's back reference no entry confirms.
    fn remove_inode_ref(&mut self, tree: u64, dir: u64, ino: u64, index: u64) -> Result<()> {
        let names = crate::fs::names::links_in(self.st, tree, ino, dir)?;
        if let Some((_, name)) = names.into_iter().find(|(i, _)| *i == index) {
            let rk = Key::new(ino, BTRFS_INODE_REF_KEY, dir);
            if !crate::fs::names::remove_packed(self.st, tree, &rk, &name, dir)? {
                let xk = Key::new(
                    ino,
                    BTRFS_INODE_EXTREF_KEY,
                    crate::format::dir::extref_hash(dir, &name),
                );
                crate::fs::names::remove_packed(self.st, tree, &xk, &name, dir)?;
            }
            self.inodes.insert((tree, ino));
            self.changes.push(format!(
                "inode {ino} (tree {tree}): back reference '{}' in directory {dir} removed",
                String::from_utf8_lossy(&name)
            ));
        }
        Ok(())
    }

    /// Re-add an inode's back reference from its directory's entries.
    fn add_inode_ref(&mut self, tree: u64, dir: u64, ino: u64, index: u64) -> Result<()> {
        let Some((name, loc, _)) = crate::fs::names::index_entry(self.st, tree, dir, index)? else {
            return Err(Error::Invalid(format!(
                "directory {dir} (tree {tree}) has no DIR_INDEX {index}"
            )));
        };
        if loc.objectid != ino {
            return Err(Error::Invalid(format!(
                "DIR_INDEX {index} of directory {dir} names inode {}, not {ino}",
                loc.objectid
            )));
        }
        crate::fs::names::add_backref(self.st, tree, ino, dir, &name, index)?;
        self.inodes.insert((tree, ino));
        self.changes.push(format!(
            "inode {ino} (tree {tree}): back reference '{}' in directory {dir} re-added",
            String::from_utf8_lossy(&name)
        ));
        Ok(())
    }

    /// Name an unreachable inode in lost+found.
    fn link_to_lost_found(&mut self, tree: u64, ino: u64) -> Result<()> {
        let transid = self.st.transid();
        let lf = lost_found(self.st, tree)?;
        let mode = inode_mode(self.st, tree, ino)?;
        let mut name = ino.to_string().into_bytes();
        let mut n = 0;
        while crate::fs::names::lookup_name(self.st, tree, lf, &name)?.is_some() {
            n += 1;
            name = format!("{ino}.{n}").into_bytes();
        }
        let index = crate::fs::names::next_dir_index(self.st, tree, lf)?;
        crate::fs::names::add_name(
            self.st,
            tree,
            lf,
            Key::new(ino, BTRFS_INODE_ITEM_KEY, 0),
            &name,
            crate::fs::inode::ftype_of_mode(mode),
            index,
            transid,
        )?;
        self.set_nlink(tree, ino)?;
        self.changes.push(format!(
            "inode {ino} (tree {tree}): linked as lost+found/{}",
            String::from_utf8_lossy(&name)
        ));
        Ok(())
    }

    /// Set an inline extent's ram_bytes to the bytes it holds.
    fn inline_ram_bytes(&mut self, tree: u64, ino: u64) -> Result<()> {
        let t = TreeId::Tree(tree);
        let k = Key::new(ino, BTRFS_EXTENT_DATA_KEY, 0);
        if let Some(mut d) = self.st.lookup(t, &k)? {
            // btrfs_file_extent_item: generation (8), ram_bytes (8),
            // compression (1), encryption (1), other_encoding (2),
            // type (1) at 20; inline data from 21.
            if d.len() > 21 && d[16] == 0 && d[20] == BTRFS_FILE_EXTENT_INLINE {
                let len = (d.len() - 21) as u64;
                let old = u64::from_le_bytes(d[8..16].try_into().unwrap_or([0; 8]));
                d[8..16].copy_from_slice(&len.to_le_bytes());
                self.st.update_item(t, &k, &d)?;
                self.changes.push(format!(
                    "inode {ino} (tree {tree}): inline ram_bytes {old} -> {len}"
                ));
            }
        }
        Ok(())
    }

    /// Bring an inode's generation and transid back from the future.
    fn inode_generation(&mut self, tree: u64, ino: u64) -> Result<()> {
        let transid = self.st.transid();
        let mut old = (0, 0);
        let found = crate::fs::inode::modify_inode(self.st, tree, ino, |i| {
            old = (i.generation.get(), i.transid.get());
            i.generation.set(old.0.min(transid));
            i.transid.set(old.1.min(transid));
        })?;
        self.changes.extend(inode_change(
            found,
            tree,
            ino,
            format!(
                "generation/transid {}/{} -> at most {transid}",
                old.0, old.1
            ),
        )?);
        Ok(())
    }

    /// Bring an extent item's generation back from the future.
    fn extent_generation(&mut self, bytenr: u64) -> Result<()> {
        let transid = self.st.transid();
        const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;
        let items = self.st.items_in(
            EXTENT,
            Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0),
            Key::new(bytenr, BTRFS_METADATA_ITEM_KEY, u64::MAX),
        )?;
        for (k, mut d) in items {
            if !matches!(k.ty, BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY) || d.len() < 16 {
                continue;
            }
            // btrfs_extent_item: refs (8), generation (8), flags (8).
            let old = u64::from_le_bytes(d[8..16].try_into().unwrap_or([0; 8]));
            if old > transid {
                // A tree block's is its header's (btrfs check's
                // get_extent_item_generation; its root item
                // check compares the two); data's the repair's.
                let flags = d
                    .get(16..24)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0);
                let new = if flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
                    self.st
                        .image()
                        .read_tree_block(bytenr, &Default::default(), false)
                        .map(|n| n.generation())
                        .ok()
                        .filter(|&g| g != 0 && g <= transid)
                        .unwrap_or(transid)
                } else {
                    transid
                };
                d[8..16].copy_from_slice(&new.to_le_bytes());
                self.st.update_item(EXTENT, &k, &d)?;
                self.changes
                    .push(format!("extent {bytenr}: generation {old} -> {new}"));
            }
        }
        Ok(())
    }

    /// Set the type bits of an inode's mode from its names and items.
    fn inode_mode(&mut self, tree: u64, ino: u64) -> Result<()> {
        let (ftype, _) = deduce_ftype(self.st, tree, ino)?;
        let mode = mode_of_ftype(ftype, None);
        let mut old = 0;
        let mut new = 0;
        let found = crate::fs::inode::modify_inode(self.st, tree, ino, |i| {
            old = i.mode.get();
            new = (mode & crate::fs::inode::S_IFMT) | (old & 0o7777);
            i.mode.set(new);
        })?;
        let mode = new;
        self.changes.extend(inode_change(
            found,
            tree,
            ino,
            format!("mode 0{old:o} -> 0{mode:o}"),
        )?);
        Ok(())
    }

    /// Clear inode flags its type cannot carry.
    fn inode_flags(&mut self, tree: u64, ino: u64, clear: u64) -> Result<()> {
        let mut old = 0;
        let found = crate::fs::inode::modify_inode(self.st, tree, ino, |i| {
            old = i.flags.get();
            i.flags.set(old & !clear);
        })?;
        self.changes.extend(inode_change(
            found,
            tree,
            ino,
            format!("flags 0x{old:x} -> 0x{:x}", old & !clear),
        )?);
        Ok(())
    }

    /// Bring a file extent's generation back from the future.
    fn file_extent_generation(&mut self, tree: u64, ino: u64, offset: u64) -> Result<()> {
        let transid = self.st.transid();
        let t = TreeId::Tree(tree);
        let k = Key::new(ino, BTRFS_EXTENT_DATA_KEY, offset);
        if let Some(mut d) = self.st.lookup(t, &k)? {
            // btrfs_file_extent_item.generation: the first 8 bytes.
            if let Some(g) = d.get_mut(0..8) {
                let old = u64::from_le_bytes(g.try_into().unwrap_or([0; 8]));
                if old > transid {
                    g.copy_from_slice(&transid.to_le_bytes());
                    self.st.update_item(t, &k, &d)?;
                    self.changes.push(format!(
                        "inode {ino} (tree {tree}): file extent at {offset}: generation {old} -> {transid}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Add the orphan item of a deleted subvolume.
    fn add_root_orphan(&mut self, tree: u64) -> Result<()> {
        let k = Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, tree);
        if self.st.lookup(TreeId::Root, &k)?.is_none() {
            self.st.insert_item(TreeId::Root, &k, &[])?;
            self.changes.push(format!(
                "deleted subvolume {tree}: orphan item added (the kernel's cleaner drops it)"
            ));
        }
        Ok(())
    }
}

/// The free space tree rebuilt from the extent tree, and the block group
/// items (and so the superblock's bytes_used) written from it too.
fn rebuild_free_space(st: &mut Store) -> Result<Vec<String>> {
    st.repair().rebuild_free_space_tree()?;
    st.chunks().rewrite_block_groups();
    Ok(vec!["free space tree rebuilt".into()])
}

/// See [`Repair::OrphanCleanup`]: the kernel's rule, as the mount runs it.
fn orphan_cleanup(st: &mut Store, tree: u64, ino: u64) -> Result<String> {
    use crate::fs::inode::OrphanOutcome;
    let did = match crate::fs::inode::clean_orphan(st, tree, ino)? {
        OrphanOutcome::NoInode => "no such inode".to_string(),
        OrphanOutcome::Deleted => "deleted with its data".to_string(),
        OrphanOutcome::Linked(0) => "linked, kept as it is".to_string(),
        OrphanOutcome::Linked(n) => {
            format!("linked, {n} fs-verity items of an unfinished build dropped")
        }
    };
    Ok(format!(
        "orphan item {ino} (tree {tree}): {did}; item removed"
    ))
}

/// See [`Repair::FileExtentDisk`]. The item is changed only while it
/// still holds `from`; the inode's nbytes follow.
fn file_extent_disk(
    st: &mut Store,
    tree: u64,
    ino: u64,
    offset: u64,
    from: u64,
    to: Option<(u64, u64)>,
) -> Result<String> {
    use crate::format::file_extent::FileExtentItem;
    use zerocopy::{FromBytes, IntoBytes};
    let t = TreeId::Tree(tree);
    let k = Key::new(ino, BTRFS_EXTENT_DATA_KEY, offset);
    let Some(d) = st.lookup(t, &k)? else {
        return Ok(format!(
            "inode {ino} (tree {tree}): no file extent at {offset}"
        ));
    };
    let Ok(mut item) = FileExtentItem::read_from_bytes(&d) else {
        return Ok(format!(
            "inode {ino} (tree {tree}): file extent at {offset} is not a disk extent"
        ));
    };
    if item.disk_bytenr.get() != from {
        return Ok(format!(
            "inode {ino} (tree {tree}): file extent at {offset} changed already"
        ));
    }
    let what = match to {
        Some((b, l)) => {
            item.disk_bytenr.set(b);
            item.disk_num_bytes.set(l);
            format!("disk extent {from} -> {b}+{l} (the extent whose back reference names it)")
        }
        None => {
            let len = item.num_bytes.get();
            item = FileExtentItem::hole(item.generation.get().min(st.transid()), len);
            format!("disk address {from} holds no extent: {len} bytes made a hole (data lost)")
        }
    };
    st.update_item(t, &k, item.as_bytes())?;
    let nbytes = crate::fs::extents::count_nbytes(st, tree, ino)?;
    crate::fs::inode::modify_inode(st, tree, ino, |i| i.nbytes.set(nbytes))?;
    Ok(format!(
        "inode {ino} (tree {tree}): file extent at {offset}: {what}"
    ))
}

/// The file type of inode `ino` as what points at it and what it holds
/// show (btrfs check's `detect_imode`): the type field of a directory
/// entry that names it and that its back reference confirms; with none,
/// a directory when it holds entries, else a regular file. The bool says
/// whether a name decided it.
fn deduce_ftype(st: &mut Store, tree: u64, ino: u64) -> Result<(u8, bool)> {
    for l in crate::fs::names::links_of(st, tree, ino)? {
        if let Some((loc, ft)) = crate::fs::names::lookup_name(st, tree, l.parent, &l.name)? {
            if loc.objectid == ino && (BTRFS_FT_REG_FILE..=BTRFS_FT_SYMLINK).contains(&ft) {
                return Ok((ft, true));
            }
        }
    }
    let entries = !st
        .items_in(
            TreeId::Tree(tree),
            Key::new(ino, BTRFS_DIR_ITEM_KEY, 0),
            Key::new(ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
        )?
        .is_empty();
    Ok((
        if entries {
            BTRFS_FT_DIR
        } else {
            BTRFS_FT_REG_FILE
        },
        false,
    ))
}

/// A mode of file type `ftype` with the permission bits `perm`, or those
/// btrfs check gives a made inode (0755 for a directory, 0777 for a
/// symlink, 0644 otherwise).
fn mode_of_ftype(ftype: u8, perm: Option<u32>) -> u32 {
    use crate::fs::inode::{S_IFDIR, S_IFLNK, S_IFREG};
    let (ty, def) = match ftype {
        BTRFS_FT_DIR => (S_IFDIR, 0o755),
        BTRFS_FT_SYMLINK => (S_IFLNK, 0o777),
        BTRFS_FT_CHRDEV => (libc::S_IFCHR, 0o644),
        BTRFS_FT_BLKDEV => (libc::S_IFBLK, 0o644),
        BTRFS_FT_FIFO => (libc::S_IFIFO, 0o644),
        BTRFS_FT_SOCK => (libc::S_IFSOCK, 0o644),
        _ => (S_IFREG, 0o644),
    };
    ty | perm.unwrap_or(def)
}

/// See [`Repair::RecreateInodeItem`].
fn recreate_inode_item(st: &mut Store, tree: u64, ino: u64) -> Result<String> {
    let t = TreeId::Tree(tree);
    let (ftype, _) = deduce_ftype(st, tree, ino)?;
    let mode = mode_of_ftype(ftype, None);
    let ss = st.sectorsize() as u64;
    let size = if ftype == BTRFS_FT_DIR {
        crate::fs::names::dir_size_from_entries(st, tree, ino)?
    } else {
        let mut end = 0;
        for (k, d) in st.items_in(
            t,
            crate::fs::extents::extent_key(ino, 0),
            crate::fs::extents::extent_key(ino, u64::MAX),
        )? {
            end = end.max(match crate::format::file_extent::parse_file_extent(&d) {
                Ok(FileExtent::Inline { head, .. }) => k.offset + head.ram_bytes.get(),
                _ => crate::fs::extents::extent_span(ss, k.offset, &d).map_or(0, |(_, e)| e),
            });
        }
        end
    };
    let nbytes = crate::fs::extents::count_nbytes(st, tree, ino)?;
    let links = crate::fs::names::count_links(st, tree, ino)?;
    let mut item = crate::fs::inode::new_inode_item(
        mode,
        0,
        0,
        0,
        crate::format::inode::now_ts(unix_now()),
        st.transid(),
    );
    item.size.set(size);
    item.nbytes.set(nbytes);
    item.nlink.set(if ftype == BTRFS_FT_DIR {
        1
    } else {
        links.max(1)
    });
    crate::fs::inode::put_inode(st, tree, ino, &item)?;
    Ok(format!(
        "inode {ino} (tree {tree}): inode item made (mode 0{mode:o}, size {size}, nbytes {nbytes}, nlink {})",
        item.nlink.get()
    ))
}

/// See [`Repair::FileHoles`]. Returns how many gaps were covered.
fn fill_file_holes(st: &mut Store, tree: u64, ino: u64) -> Result<u64> {
    let Some(inode) = crate::fs::inode::get_inode(st, tree, ino)? else {
        return Ok(0);
    };
    let ss = st.sectorsize() as u64;
    let end = inode.size.get().div_ceil(ss) * ss;
    let mut gaps = Vec::new();
    let mut at = 0u64;
    for (k, d) in st.items_in(
        TreeId::Tree(tree),
        crate::fs::extents::extent_key(ino, 0),
        crate::fs::extents::extent_key(ino, u64::MAX),
    )? {
        if k.offset > at {
            gaps.push((at, k.offset.min(end)));
        }
        if let Some((_, e)) = crate::fs::extents::extent_span(ss, k.offset, &d) {
            at = at.max(e);
        }
    }
    if at < end {
        gaps.push((at, end));
    }
    let transid = st.transid();
    let mut n = 0;
    for (a, b) in gaps {
        if a < b {
            crate::fs::extents::fill_hole(st, tree, ino, a, b, transid)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The references a repair found, as the extent tree writes them.
fn inline_refs(refs: &[super::findings::ExtentRef]) -> Vec<crate::format::extent::InlineRef> {
    refs.iter().map(inline_ref).collect()
}

fn inline_ref(r: &super::findings::ExtentRef) -> crate::format::extent::InlineRef {
    use super::findings::ExtentRef as E;
    use crate::format::extent::InlineRef as I;
    match *r {
        E::Tree { root } => I::TreeBlock { root },
        E::SharedBlock { parent } => I::SharedBlock { parent },
        E::Data {
            root,
            ino,
            offset,
            count,
        } => I::ExtentData {
            root,
            objectid: ino,
            offset,
            count: count.min(u32::MAX as u64) as u32,
        },
        E::SharedData { parent, count } => I::SharedData {
            parent,
            count: count.min(u32::MAX as u64) as u32,
        },
    }
}

/// Whole seconds of wall time: the times of what a repair makes.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn inode_mode(st: &mut Store, tree: u64, ino: u64) -> Result<u32> {
    crate::fs::inode::get_inode(st, tree, ino)?
        .map(|i| i.mode.get())
        .ok_or_else(|| Error::Invalid(format!("inode {ino} of tree {tree} has no inode item")))
}

/// The subvolume's `/lost+found`, made (mode 0700, as btrfs check makes
/// it) when missing.
fn lost_found(st: &mut Store, tree: u64) -> Result<u64> {
    let root_dir = BTRFS_FIRST_FREE_OBJECTID;
    if let Some((loc, _)) = crate::fs::names::lookup_name(st, tree, root_dir, b"lost+found")? {
        return Ok(loc.objectid);
    }
    let hi = Key::new(BTRFS_LAST_FREE_OBJECTID, u8::MAX, u64::MAX);
    let lo = Key::new(BTRFS_FIRST_FREE_OBJECTID, 0, 0);
    let ino = match st.prev_item(TreeId::Tree(tree), &hi, &lo)? {
        Some((k, _)) => k.objectid + 1,
        None => BTRFS_FIRST_FREE_OBJECTID + 1,
    };
    let item = crate::fs::inode::new_inode_item(
        crate::fs::inode::S_IFDIR | 0o700,
        0,
        0,
        0,
        crate::format::inode::now_ts(unix_now()),
        st.transid(),
    );
    crate::fs::inode::put_inode(st, tree, ino, &item)?;
    let index = crate::fs::names::next_dir_index(st, tree, root_dir)?;
    let transid = st.transid();
    crate::fs::names::add_name(
        st,
        tree,
        root_dir,
        Key::new(ino, BTRFS_INODE_ITEM_KEY, 0),
        b"lost+found",
        BTRFS_FT_DIR,
        index,
        transid,
    )?;
    Ok(ino)
}

/// Remove the deprecated inode cache of subvolume `tree`: every item of
/// its FREE_INO and FREE_SPACE objects, their data extents' references
/// dropped (btrfs-progs' `truncate_free_ino_items`). Returns how many
/// items went.
pub(crate) fn clear_inode_cache(st: &mut Store, tree: u64) -> Result<usize> {
    let mut n = 0;
    for obj in [BTRFS_FREE_INO_OBJECTID, BTRFS_FREE_SPACE_OBJECTID] {
        n += drop_object(st, TreeId::Tree(tree), tree, obj)?;
    }
    Ok(n)
}

/// Delete every item of `objectid` in `tree`, dropping the data
/// references of its file extents (owned by `root`). Returns how many.
fn drop_object(st: &mut Store, tree: TreeId, root: u64, objectid: u64) -> Result<usize> {
    let items = st.items_in(
        tree,
        Key::new(objectid, 0, 0),
        Key::new(objectid, u8::MAX, u64::MAX),
    )?;
    let n = items.len();
    for (ik, d) in items {
        st.delete_item(tree, &ik)?;
        if ik.ty != BTRFS_EXTENT_DATA_KEY {
            continue;
        }
        if let Ok(FileExtent::Disk { item, .. }) = crate::format::file_extent::parse_file_extent(&d)
        {
            let b = item.disk_bytenr.get();
            if b != 0 {
                st.extent_refs().queue_data_ref(
                    b,
                    item.disk_num_bytes.get(),
                    crate::fs::extents::data_backref(root, objectid, ik.offset, item),
                    -1,
                );
            }
        }
    }
    Ok(n)
}

fn inode_change(found: bool, tree: u64, ino: u64, what: String) -> Result<Vec<String>> {
    if !found {
        return Err(Error::Invalid(format!(
            "inode {ino} of tree {tree} disappeared before its repair"
        )));
    }
    Ok(vec![format!("inode {ino} (tree {tree}): {what}")])
}

/// Remove every v1 cache header, its inode and the inode's data extents
/// (`btrfs check --clear-space-cache v1`); the superblock's cache
/// generation is set to -1 so no kernel trusts a cache left anywhere.
pub(crate) fn clear_space_cache(st: &mut Store) -> Result<Vec<String>> {
    let headers = st.repair().space_cache_headers()?;
    let n = headers.len();
    for (k, ino) in headers {
        st.delete_item(TreeId::Root, &k)?;
        if ino >= BTRFS_FIRST_FREE_OBJECTID {
            drop_object(st, TreeId::Root, BTRFS_ROOT_TREE_OBJECTID, ino)?;
        }
    }
    st.update_superblock(|sb| sb.cache_generation.set(u64::MAX));
    Ok(vec![format!(
        "v1 free space cache cleared ({n} block groups)"
    )])
}

/// Bytes of data read and checksummed at a time.
const CSUM_CHUNK: u64 = 4 << 20;

/// Empty the checksum tree and checksum, from the data as it is now,
/// every range a file extent needs checksums for: the referenced part of
/// each regular extent of an inode without nodatasum (the whole disk
/// extent when compressed), as the checker's rule has it; prealloc and
/// nodatasum data get none.
fn rebuild_csum_tree(st: &mut Store) -> Result<Vec<String>> {
    const CSUM: u64 = BTRFS_CSUM_TREE_OBJECTID;
    let removed = st.repair().empty_tree(CSUM)?;
    let trees: Vec<u64> = st
        .items_in(
            TreeId::Root,
            Key::new(BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0),
            Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
        )?
        .into_iter()
        .filter(|(k, _)| k.ty == BTRFS_ROOT_ITEM_KEY && is_fstree(k.objectid))
        .map(|(k, _)| k.objectid)
        .collect();
    let cs = st.image().csum.size();
    let mut need = RangeSet::new();
    for tree in trees {
        let mut k = Key::MIN;
        let mut nodatasum = false;
        let mut cur_ino = 0;
        while let Some((_, items)) = st.leaf_from(tree, &k)? {
            let Some(last) = items.last().map(|(k, _)| *k) else {
                break;
            };
            for (ik, d) in &items {
                if ik.ty == BTRFS_INODE_ITEM_KEY {
                    cur_ino = ik.objectid;
                    nodatasum = match decode(ik, d, cs) {
                        Ok(ItemBody::InodeItem(ii)) => ii.flags.get() & BTRFS_INODE_NODATASUM != 0,
                        _ => true,
                    };
                    continue;
                }
                if ik.ty != BTRFS_EXTENT_DATA_KEY || ik.objectid != cur_ino || nodatasum {
                    continue;
                }
                let Ok(FileExtent::Disk { head, item }) =
                    crate::format::file_extent::parse_file_extent(d)
                else {
                    continue;
                };
                let disk = item.disk_bytenr.get();
                if disk == 0 || head.type_ == BTRFS_FILE_EXTENT_PREALLOC {
                    continue;
                }
                let (s, l) = if head.compression != 0 {
                    (disk, item.disk_num_bytes.get())
                } else {
                    (disk + item.offset.get(), item.num_bytes.get())
                };
                if l > 0 {
                    need.insert(s, s + l);
                }
            }
            if last == Key::MAX {
                break;
            }
            k = crate::trans::next_key(&last);
        }
    }
    let ss = st.sectorsize() as u64;
    let csum_type = st.image().csum;
    let mut bytes = 0u64;
    let mut buf = Vec::new();
    let ranges: Vec<(u64, u64)> = need.iter().collect();
    for (s, e) in ranges {
        let mut at = s;
        while at < e {
            let len = (e - at).min(CSUM_CHUNK);
            buf.resize(len as usize, 0);
            st.data().read_data(at, &mut buf)?;
            let mut sums = Vec::with_capacity((len / ss) as usize * cs);
            for sector in buf.chunks(ss as usize) {
                sums.extend_from_slice(&csum_type.compute(sector)[..cs]);
            }
            st.csums().csum_insert(at, &sums)?;
            bytes += len;
            at += len;
        }
    }
    Ok(vec![format!(
        "checksum tree rebuilt: {removed} items removed, {bytes} bytes of data checksummed"
    )])
}
