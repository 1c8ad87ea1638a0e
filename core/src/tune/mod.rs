//! `btrkit-tune`: the changes btrfstune makes to a filesystem after mkfs,
//! offline, on one image or every device of a set.
//!
//! Each change is one step of its own module:
//! - [`fsid`]: a new fsid (`-u`, `-U`): every tree block header, every
//!   device item and superblock rewritten in place, under the
//!   superblock flag CHANGING_FSID, resumable;
//! - [`uuids`]: the metadata UUID (`-m`, `-M`, superblocks only, under
//!   CHANGING_FSID_V2 on sets) and new subvolume UUIDs (root items and
//!   the UUID tree, one commit);
//! - [`csum`]: every data and metadata checksum converted to another
//!   algorithm (`--csum`), under CHANGING_DATA_CSUM then
//!   CHANGING_META_CSUM, resumable;
//! - [`features`]: block group tree to and from, free space tree,
//!   no-holes, extended refs, skinny metadata (every tree block's
//!   EXTENT_ITEM rewritten), quotas and simple quotas, each one commit;
//! - [`superblock`]: the label and the seeding flag, every superblock
//!   copy of every device.
//!
//! Crash safety. A step that changes the trees is one transaction of the
//! engine (an interruption leaves the old state or the new one). The two
//! changes that cannot be one commit, because they rewrite what every
//! block carries (fsid, checksum algorithm), rewrite blocks in place
//! ([`rewrite`]) under a superblock flag that the kernel refuses to mount
//! with and that `btrkit-fsck` names; a rerun of the same command finds the
//! flag and finishes the job. Any other command is refused while a flag is
//! set.
//!
//! Refusals (nothing written): a device mounted or in use by a mount, a
//! set with a device missing, an fsync log not yet replayed, an option
//! combination that makes no sense ([`Request::validate`]).

pub mod csum;
pub mod features;
pub mod fsid;
pub mod guard;
pub mod rewrite;
pub mod superblock;
pub mod uuids;

use crate::check::Progress;
use crate::csum::CsumType;
use crate::io::BlockDevice;
use crate::{Error, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// A UUID to set: a random one, or the one given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewUuid {
    /// A fresh random (version 4) UUID.
    Random,
    /// This UUID.
    Given([u8; 16]),
}

/// A change of the quota state (`btrfs quota enable|disable`, btrfstune's
/// `--enable-simple-quota` / `--remove-simple-quota`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaChange {
    /// Full qgroups: the quota tree with a level-0 qgroup per subvolume,
    /// its counts from a rescan.
    Enable,
    /// The quota tree removed (full or simple).
    Disable,
    /// Simple quotas (incompat SIMPLE_QUOTA).
    EnableSimple,
    /// Simple quotas removed: the quota tree and the incompat flag.
    RemoveSimple,
}

/// What to change. Everything unset is left alone.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// `-u` / `-U UUID`: a new fsid written everywhere.
    pub fsid: Option<NewUuid>,
    /// `-m` / `-M UUID`: a new fsid in the superblocks only, the old one
    /// kept as metadata UUID (or, when the UUID is the metadata UUID, the
    /// flag removed).
    pub metadata_uuid: Option<NewUuid>,
    /// New UUIDs for every subvolume: asked explicitly
    /// (`--new-subvol-uuids`) or implied by `fsid`/`metadata_uuid` unless
    /// `keep_subvol_uuids`.
    pub subvol_uuids: bool,
    /// `--keep-subvol-uuids`: a new fsid leaves the subvolume UUIDs.
    pub keep_subvol_uuids: bool,
    /// `--csum ALGO`.
    pub csum: Option<CsumType>,
    /// `--convert-to-block-group-tree` (true) / `--convert-from-...` (false).
    pub block_group_tree: Option<bool>,
    /// `--convert-to-free-space-tree`.
    pub free_space_tree: bool,
    /// `-n`: no-holes.
    pub no_holes: bool,
    /// `-r`: extended inode refs.
    pub extref: bool,
    /// `-x`: skinny metadata.
    pub skinny_metadata: bool,
    /// `-S 0|1`: the seeding flag.
    pub seeding: Option<bool>,
    /// `-L LABEL`.
    pub label: Option<String>,
    /// Quota on or off.
    pub quota: Option<QuotaChange>,
    /// `-f`: allow what btrfstune only allows with `-f` (clearing the
    /// seeding flag).
    pub force: bool,
}

impl Request {
    /// Whether nothing is asked.
    pub fn is_empty(&self) -> bool {
        self.fsid.is_none()
            && self.metadata_uuid.is_none()
            && !self.subvol_uuids
            && self.csum.is_none()
            && self.block_group_tree.is_none()
            && !self.free_space_tree
            && !self.no_holes
            && !self.extref
            && !self.skinny_metadata
            && self.seeding.is_none()
            && self.label.is_none()
            && self.quota.is_none()
    }

    /// Whether only superblock fields (label, seeding) are asked: the
    /// trees are not read, a pending log does not matter.
    pub fn superblock_only(&self) -> bool {
        !self.is_empty() && self.is_empty_but_superblock()
    }

    fn is_empty_but_superblock(&self) -> bool {
        Request {
            label: None,
            seeding: None,
            ..self.clone()
        }
        .is_empty()
    }

    /// Whether the subvolume UUIDs are to be renewed.
    pub fn renews_subvol_uuids(&self) -> bool {
        self.subvol_uuids
            || ((self.fsid.is_some() || self.metadata_uuid.is_some()) && !self.keep_subvol_uuids)
    }

    /// Refuse combinations that make no sense, before anything is read.
    pub fn validate(&self) -> Result<()> {
        let refuse = |m: &str| Err(Error::Unsupported(m.into()));
        if self.is_empty() {
            return refuse("nothing to change: give at least one option");
        }
        if self.fsid.is_some() && self.metadata_uuid.is_some() {
            return refuse("-u/-U and -m/-M are exclusive (as in btrfstune)");
        }
        if self.subvol_uuids && self.keep_subvol_uuids {
            return refuse("--new-subvol-uuids and --keep-subvol-uuids are exclusive");
        }
        if self.seeding.is_some() && (self.fsid.is_some() || self.metadata_uuid.is_some()) {
            return refuse("the seeding flag and a new fsid are exclusive (as in btrfstune)");
        }
        if matches!(
            self.quota,
            Some(QuotaChange::Enable) | Some(QuotaChange::EnableSimple)
        ) && self.metadata_uuid.is_some()
        {
            // Not a format conflict; one change at a time keeps the
            // crash states few.
        }
        if self.seeding == Some(false) && !self.force {
            return refuse("clearing the seeding flag needs -f (as in btrfstune): a sprouted filesystem may depend on it");
        }
        if let Some(l) = &self.label {
            if l.len() >= crate::format::consts::BTRFS_LABEL_SIZE {
                return refuse(&format!(
                    "label of {} bytes: at most {} fit",
                    l.len(),
                    crate::format::consts::BTRFS_LABEL_SIZE - 1
                ));
            }
            if l.contains('\n') {
                return refuse("a label cannot hold a newline");
            }
        }
        Ok(())
    }
}

/// How one step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Changed.
    Done,
    /// An interrupted run of the same change was found and finished.
    Resumed,
    /// The filesystem already was as asked: nothing written.
    AlreadySo,
}

/// One change made (or found made).
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// The change, as the option names it (`fsid`, `csum`, `label`, ...).
    pub op: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// What it did, one line each, for a human.
    pub lines: Vec<String>,
}

impl Step {
    /// A step that found nothing to do.
    pub fn already(op: &'static str, why: impl Into<String>) -> Step {
        Step {
            op,
            outcome: Outcome::AlreadySo,
            lines: vec![why.into()],
        }
    }
}

/// What `tune` did, step by step, in the order run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The steps.
    pub steps: Vec<Step>,
}

/// The devices of the filesystem being changed, and the progress sink.
pub struct Ctx<'a> {
    /// Every device of the filesystem, by name, opened read-write.
    pub devs: Vec<(String, Arc<dyn BlockDevice>)>,
    /// Progress of the long steps (`phase` per step, `advance` per block).
    pub progress: &'a dyn Progress,
}

/// Change the filesystem on `paths` (one image, or every device of a set)
/// as `req` asks. Refuses, writing nothing, when a device is mounted or
/// in use, when a device of the set is missing, when the log was not
/// replayed, or when `req` makes no sense.
pub fn tune(paths: &[PathBuf], req: &Request, progress: &dyn Progress) -> Result<Report> {
    req.validate()?;
    let devs = guard::open_unmounted(paths)?;
    tune_devices(devs, req, progress)
}

/// [`tune`] on devices already open (tests use crash devices).
pub fn tune_devices(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    req: &Request,
    progress: &dyn Progress,
) -> Result<Report> {
    req.validate()?;
    let mut ctx = Ctx { devs, progress };
    let mut report = Report::default();
    // An unfinished change first: only its own command may finish it,
    // everything else is refused until it is done.
    let unfinished = guard::unfinished_allows(&ctx, req)?;
    let needs_trees = !req.superblock_only();
    if unfinished.is_none() {
        guard::complete_set(&ctx, needs_trees)?;
    }
    if let Some(on) = req.block_group_tree {
        report.steps.push(features::block_group_tree(&mut ctx, on)?);
    }
    if req.free_space_tree {
        report.steps.push(features::free_space_tree(&mut ctx)?);
    }
    if req.no_holes {
        report.steps.push(features::no_holes(&mut ctx)?);
    }
    if req.extref {
        report.steps.push(features::extref(&mut ctx)?);
    }
    if req.skinny_metadata {
        report.steps.push(features::skinny_metadata(&mut ctx)?);
    }
    if let Some(q) = req.quota {
        report.steps.push(features::quota(&mut ctx, q)?);
    }
    if let Some(c) = req.csum {
        report.steps.push(csum::convert(&mut ctx, c)?);
    }
    if req.renews_subvol_uuids() {
        report.steps.push(uuids::subvol_uuids(&mut ctx)?);
    }
    if let Some(u) = req.fsid {
        report.steps.push(fsid::change(&mut ctx, u)?);
    }
    if let Some(u) = req.metadata_uuid {
        report.steps.push(uuids::metadata_uuid(&mut ctx, u)?);
    }
    if let Some(l) = &req.label {
        report.steps.push(superblock::label(&mut ctx, l)?);
    }
    if let Some(s) = req.seeding {
        report.steps.push(superblock::seeding(&mut ctx, s)?);
    }
    Ok(report)
}

/// With BTRKIT_PROF set, the time since the first call, per step, on
/// stderr (as btrkit-fsck's phases).
pub(crate) fn prof(what: &str) {
    if std::env::var_os("BTRKIT_PROF").is_some() {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let t = START.get_or_init(std::time::Instant::now);
        eprintln!("{what}: {:?}", t.elapsed());
    }
}
