//! The `btrfs rescue` commands (btrfs-progs `cmds/rescue*.c`), each a
//! narrow repair of one kind of damage that the checker's full repair does
//! not take on or that has to work where nothing else can open the
//! filesystem:
//!
//! - [`chunk_recover`]: rebuild the chunk tree and the sys_chunk_array
//!   from what a scan of the devices finds;
//! - [`super_recover`]: the best superblock copy written to every copy;
//! - [`zero_log`]: the superblocks' log pointer cleared;
//! - [`fix_device_size`]: device and superblock sizes made consistent;
//! - [`fix_data_checksum`]: bad data sectors rewritten from a good copy,
//!   or (on request) their checksums recorded from one copy;
//! - [`clear_uuid_tree`]: the UUID tree deleted (the kernel rebuilds it);
//! - [`clear_ino_cache`]: the removed inode cache's items deleted.
//!
//! Each returns a typed report (nothing here prints); every change to
//! the trees is one transaction of the engine ending in one commit, so an
//! interruption leaves the image as it was or done. The commands that
//! only rewrite superblock copies ([`super_recover`], [`zero_log`]) write
//! each copy whole, with the same generation, as btrfs-progs does: every
//! copy is at any moment either the old one or the new one.

pub mod chunk_recover;
pub mod clear_ino_cache;
pub mod clear_uuid_tree;
pub mod fix_data_checksum;
pub mod fix_device_size;
pub mod super_recover;
pub mod zero_log;

use crate::check::repair::Target;
use crate::csum::CsumType;
use crate::format::consts::*;
use crate::format::superblock::Superblock;
use crate::image::Image;
use crate::io::{BlockDevice, FileDevice};
use crate::trans::Store;
use crate::{Error, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// How a rescue command ended (the binary's exit code follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Nothing was wrong: nothing written.
    NothingToDo,
    /// Changes were made (committed, or every copy written).
    Done,
    /// A dry run found something to change: nothing written.
    WouldChange,
    /// Something is left that this command could not put right.
    ErrorsLeft,
}

/// What every rescue command reports beside its own details.
pub trait RescueReport: Serialize {
    /// How it ended.
    fn status(&self) -> Status;
    /// What it found and did, one line each, for a human.
    fn lines(&self) -> Vec<String>;
}

/// What a command that changes the trees in one transaction reports.
#[derive(Clone, Debug, Serialize)]
pub struct TreeChange {
    /// The command, as `btrfs rescue` names it.
    pub command: &'static str,
    /// Only looked: nothing was written.
    pub dry_run: bool,
    /// The transaction was committed.
    pub committed: bool,
    /// The generation the commit wrote (None when nothing was committed).
    pub generation: Option<u64>,
    /// What changed (or would change), one line each.
    pub changes: Vec<String>,
    /// Things noticed on the way that are not changes.
    pub notes: Vec<String>,
}

impl TreeChange {
    fn new(command: &'static str, dry_run: bool) -> TreeChange {
        TreeChange {
            command,
            dry_run,
            committed: false,
            generation: None,
            changes: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Commit `st` unless a dry run or nothing changed.
    fn finish(&mut self, mut st: Store) -> Result<()> {
        if self.dry_run || self.changes.is_empty() {
            return Ok(());
        }
        st.commit()?;
        self.committed = true;
        self.generation = Some(st.image().sb.generation.get());
        Ok(())
    }
}

impl RescueReport for TreeChange {
    fn status(&self) -> Status {
        match (self.changes.is_empty(), self.dry_run) {
            (true, _) => Status::NothingToDo,
            (false, true) => Status::WouldChange,
            (false, false) => Status::Done,
        }
    }
    fn lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self.notes.clone();
        v.extend(self.changes.iter().cloned());
        match self.status() {
            Status::NothingToDo => v.push("nothing to do".into()),
            Status::WouldChange => v.push("dry run: nothing written".into()),
            _ => {
                if let Some(g) = self.generation {
                    v.push(format!("committed (generation {g})"));
                }
            }
        }
        v
    }
}

/// Why a tree-changing rescue refuses a filesystem with a log.
const HAS_LOG: &str = "the filesystem has an fsync log to replay: run btrkit-replay first (or `btrkit-fsck rescue zero-log` to throw it away)";

/// The filesystem on `paths` (one device, or every device of a set),
/// opened for a transaction unless `dry_run`: the primary superblock, or
/// on one device the first good copy (as the checker opens it).
pub(crate) fn open_store(paths: &[PathBuf], dry_run: bool) -> Result<Store> {
    let img = open_image(paths, !dry_run)?;
    if img.sb.log_root.get() != 0 {
        return Err(Error::Unsupported(HAS_LOG.into()));
    }
    Store::from_image(img)
}

/// The filesystem on `paths`, read-only or writable.
pub(crate) fn open_image(paths: &[PathBuf], writable: bool) -> Result<Image> {
    let target = Target::Paths {
        paths: paths.to_vec(),
        degraded: false,
    };
    target.open(writable)
}

/// Every device at `paths`, opened read-write unless `read_only`, by name.
pub(crate) fn open_devices(
    paths: &[PathBuf],
    read_only: bool,
) -> Result<Vec<(String, Arc<dyn BlockDevice>)>> {
    if paths.is_empty() {
        return Err(Error::Invalid("no device given".into()));
    }
    let mut v: Vec<(String, Arc<dyn BlockDevice>)> = Vec::with_capacity(paths.len());
    for p in paths {
        v.push((
            p.display().to_string(),
            Arc::new(FileDevice::open(p, !read_only)?),
        ));
    }
    Ok(v)
}

/// Write `sb` as superblock copy `mirror` of `dev` (its `bytenr` set and
/// its checksum computed): one whole 4 KiB write.
pub(crate) fn write_super_copy(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    mirror: usize,
    csum: CsumType,
) -> Result<()> {
    let off = btrfs_sb_offset(mirror);
    let bytes = crate::trans::super_bytes(sb, off, csum);
    dev.write_at(off, &bytes)
}

/// How many superblock copies a device of `size` bytes holds.
pub(crate) fn copies_on(size: u64) -> usize {
    (0..BTRFS_SUPER_MIRROR_MAX)
        .take_while(|&m| btrfs_sb_offset(m) + BTRFS_SUPER_INFO_SIZE as u64 <= size)
        .count()
}
