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

use super::findings::{Finding, Repair, Report, Severity};
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
use std::collections::BTreeMap;
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
}

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
        for f in &report.findings {
            if let Some(r) = &f.repair {
                add(r.clone(), Some(&f.message));
                continue;
            }
            if f.severity != Severity::Error {
                continue;
            }
            if opts.init_csum_tree && is_csum_finding(f) {
                add(Repair::RebuildCsumTree, Some(&f.message));
                continue;
            }
            if (2..=4).contains(&f.phase) && unsafe_alloc.is_none() {
                unsafe_alloc = Some(f);
            }
            not_repairable.push(Unrepaired {
                finding: f.clone(),
                reason: reason(f).into(),
            });
        }
        if report.suppressed > 0 {
            not_repairable.push(Unrepaired {
                finding: Finding {
                    phase: 0,
                    category: "suppressed",
                    severity: Severity::Error,
                    tree: None,
                    bytenr: None,
                    key: None,
                    message: format!("{} findings were counted but not stored", report.suppressed),
                    repair: None,
                },
                reason: "too many findings to plan a repair of each; run again after this one"
                    .into(),
            });
        }
        let refused = if img.sb.log_root.get() != 0 {
            Some(
                "the filesystem has a log tree to replay: run btrkit-replay first (a repair \
                 would have to drop it)"
                    .to_string(),
            )
        } else if let Some(f) = unsafe_alloc {
            Some(format!(
                "the allocator cannot be trusted ({}: {}): a repair could write over blocks in use",
                f.category, f.message
            ))
        } else if !img.missing.is_empty() {
            Some("devices are missing: repair a complete set".to_string())
        } else {
            None
        };
        let mut actions: Vec<Action> = by_repair.into_values().collect();
        actions.sort_by_key(|a| order(&a.repair));
        Plan {
            actions,
            not_repairable,
            refused,
        }
    }

    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
}

/// Run order: sizes and inodes first (they change items the later steps
/// recount from), then the caches that are derived from everything else.
fn order(r: &Repair) -> u8 {
    match r {
        Repair::RewriteSuperblocks => 0,
        Repair::DeviceSizes => 1,
        Repair::SetNlink { .. } | Repair::SetSize { .. } | Repair::SetNbytes { .. } => 2,
        Repair::DeleteUnlinkedInode { .. } => 3,
        Repair::ClearSpaceCache => 4,
        Repair::RebuildCsumTree => 5,
        Repair::BlockGroupUsage => 6,
        Repair::RebuildFreeSpaceTree => 7,
        Repair::RecountQgroups => 8,
    }
}

fn is_csum_finding(f: &Finding) -> bool {
    f.phase == 7
        && matches!(
            f.category,
            "csum-missing"
                | "data-csum"
                | "csum-odd"
                | "csum-orphan"
                | "csum-item"
                | "csum-overlap"
        )
}

/// Why an error without a repair is left alone.
fn reason(f: &Finding) -> &'static str {
    match f.category {
        "name" => "directory entries and back references are not repaired yet",
        "extent-ref" | "extent-refs" | "extent-item" | "extent-missing" | "extent-overlap" => {
            "extent references are not repaired yet (the extent tree would have to be rebuilt)"
        }
        "csum-missing" | "data-csum" | "csum-odd" | "csum-orphan" | "csum-item"
        | "csum-overlap" => {
            "checksums are rebuilt only on request (--init-csum-tree), as that trusts the data"
        }
        "inode-generation" | "extent-generation" => {
            "a generation from the future is not determined by anything else on disk"
        }
        "file-extent" | "inode-mode" | "inode-flags" | "unknown-key" | "inode-cache" => {
            "what the item should hold is not determined by what is on disk"
        }
        "inode" | "inode-nlink" => "no other item on disk says what the right value is",
        "root-ref" | "root-orphan" | "root-item" => "subvolume links are not repaired yet",
        "log-root" | "log-block" | "log-shape" | "log-extent" | "log-csum" | "log-dir-range"
        | "log-generation" => "the log is replayed (btrkit-replay) or dropped, not repaired",
        _ => "not determined by what is on disk, or not repaired yet",
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
        match self {
            Target::Paths { paths, degraded } => {
                super::check_paths(paths, *degraded, opts, progress)
            }
            Target::Device(d) => super::check_device(d.clone(), opts, progress),
        }
    }

    /// The filesystem: the primary superblock, or the first good mirror
    /// when it is unusable (one device), as the check does.
    fn open(&self, writable: bool) -> Result<Image> {
        let opts = |mirror, degraded| OpenOptions {
            mirror,
            writable,
            degraded,
            ..Default::default()
        };
        let dev: Arc<dyn crate::io::BlockDevice> = match self {
            Target::Paths { paths, degraded } if paths.len() > 1 => {
                let mut devs: Vec<(String, Arc<dyn crate::io::BlockDevice>)> = Vec::new();
                for p in paths {
                    devs.push((
                        p.display().to_string(),
                        Arc::new(crate::io::FileDevice::open(p, writable)?),
                    ));
                }
                let set = crate::devices::DeviceSet::assemble(devs)?;
                return set.open(opts(0, *degraded));
            }
            Target::Paths { paths, .. } => {
                let Some(path) = paths.first() else {
                    return Err(Error::Invalid("no device given".into()));
                };
                Arc::new(crate::io::FileDevice::open(path, writable)?)
            }
            Target::Device(d) => d.clone(),
        };
        let mut first = None;
        for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
            match Image::open(dev.clone(), opts(mirror, false)) {
                Ok(img) => return Ok(img),
                Err(e @ Error::Io { .. }) => return Err(e),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or_else(|| Error::Invalid("no usable superblock".into())))
    }
}

/// Check the filesystem and plan its repair; nothing written.
pub fn plan(
    target: &Target,
    check: CheckOptions,
    opts: RepairOptions,
    progress: &dyn Progress,
) -> Result<Outcome> {
    let before = target.check(check, progress)?;
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
    planned.after = Some(target.check(check, progress)?);
    Ok(planned)
}

/// Carry out `plan` on `img` (opened writable) in one transaction and
/// commit it. Returns what each action changed.
pub fn apply(img: Image, plan: &Plan, progress: &dyn Progress) -> Result<Vec<String>> {
    if let Some(r) = &plan.refused {
        return Err(Error::Invalid(format!("repair refused: {r}")));
    }
    let mut st = Store::from_image(img)?;
    let mut changes = Vec::new();
    for a in &plan.actions {
        changes.extend(run(&mut st, &a.repair)?);
        progress.advance(1);
    }
    st.commit()?;
    Ok(changes)
}

fn run(st: &mut Store, r: &Repair) -> Result<Vec<String>> {
    let one = |s: String| Ok(vec![s]);
    match *r {
        Repair::RewriteSuperblocks => one("every superblock copy written by the commit".into()),
        Repair::DeviceSizes => st.fix_device_sizes(),
        Repair::SetNlink { tree, ino, nlink } => {
            let mut old = 0;
            let found = crate::fs::inode::modify_inode(st, tree, ino, |i| {
                old = i.nlink.get();
                i.nlink.set(nlink);
            })?;
            inode_change(found, tree, ino, format!("nlink {old} -> {nlink}"))
        }
        Repair::SetSize { tree, ino, size } => {
            let mut old = 0;
            let found = crate::fs::inode::modify_inode(st, tree, ino, |i| {
                old = i.size.get();
                i.size.set(size);
            })?;
            inode_change(found, tree, ino, format!("size {old} -> {size}"))
        }
        Repair::SetNbytes { tree, ino, nbytes } => {
            let mut old = 0;
            let found = crate::fs::inode::modify_inode(st, tree, ino, |i| {
                old = i.nbytes.get();
                i.nbytes.set(nbytes);
            })?;
            inode_change(found, tree, ino, format!("nbytes {old} -> {nbytes}"))
        }
        Repair::DeleteUnlinkedInode { tree, ino } => {
            crate::fs::extents::drop_inode_items(st, tree, ino)?;
            one(format!("inode {ino} (tree {tree}): deleted with its data"))
        }
        Repair::ClearSpaceCache => clear_space_cache(st),
        Repair::RebuildCsumTree => rebuild_csum_tree(st),
        Repair::BlockGroupUsage => {
            st.rewrite_block_groups();
            one("block group items rewritten from the extent tree".into())
        }
        Repair::RebuildFreeSpaceTree => {
            st.rebuild_free_space_tree()?;
            st.rewrite_block_groups();
            one("free space tree rebuilt".into())
        }
        Repair::RecountQgroups => {
            st.quota_rescan()?;
            one("quota groups recounted".into())
        }
    }
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
fn clear_space_cache(st: &mut Store) -> Result<Vec<String>> {
    let headers = st.space_cache_headers()?;
    let n = headers.len();
    for (k, ino) in headers {
        st.delete_item(TreeId::Root, &k)?;
        if ino < BTRFS_FIRST_FREE_OBJECTID {
            continue;
        }
        let items = st.items_in(
            TreeId::Root,
            Key::new(ino, 0, 0),
            Key::new(ino, u8::MAX, u64::MAX),
        )?;
        for (ik, d) in items {
            st.delete_item(TreeId::Root, &ik)?;
            if ik.ty != BTRFS_EXTENT_DATA_KEY {
                continue;
            }
            if let Ok(FileExtent::Disk { item, .. }) =
                crate::format::file_extent::parse_file_extent(&d)
            {
                let b = item.disk_bytenr.get();
                if b != 0 {
                    st.queue_data_ref(
                        b,
                        item.disk_num_bytes.get(),
                        crate::fs::extents::data_backref(
                            BTRFS_ROOT_TREE_OBJECTID,
                            ino,
                            ik.offset,
                            item,
                        ),
                        -1,
                    );
                }
            }
        }
    }
    st.sb.cache_generation.set(u64::MAX);
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
    let old = st.items_in(CSUM, Key::MIN, Key::MAX)?;
    for (k, _) in old.iter().rev() {
        st.delete_item(CSUM, k)?;
    }
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
            st.read_data(at, &mut buf)?;
            let mut sums = Vec::with_capacity((len / ss) as usize * cs);
            for sector in buf.chunks(ss as usize) {
                sums.extend_from_slice(&csum_type.compute(sector)[..cs]);
            }
            st.csum_insert(at, &sums)?;
            bytes += len;
            at += len;
        }
    }
    Ok(vec![format!(
        "checksum tree rebuilt: {} items removed, {bytes} bytes of data checksummed",
        old.len()
    )])
}
