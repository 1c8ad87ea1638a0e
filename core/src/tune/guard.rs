//! What `btrkit-tune` refuses before it writes anything: a device that a
//! mount uses, a set with a device missing, a log not yet replayed, and
//! any change but the one an interrupted run left unfinished.

use super::{Ctx, Request};
use crate::devices::{Devices, Single};
use crate::format::consts::*;
use crate::format::superblock::Superblock;
use crate::image::OpenOptions;
use crate::io::{BlockDevice, FileDevice};
use crate::{Error, Result};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A change an interrupted run left half done, from the superblock flags
/// btrfstune defines for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfinished {
    /// CHANGING_FSID: tree blocks carry the old fsid or the new one.
    Fsid,
    /// CHANGING_FSID_V2: the superblocks of a set disagree on the fsid.
    MetadataUuid,
    /// CHANGING_DATA_CSUM or CHANGING_META_CSUM.
    Csum,
    /// CHANGING_BG_TREE: block group items in both trees.
    BlockGroupTree,
}

impl Unfinished {
    /// The unfinished change `sb` records, if any.
    pub fn of(sb: &Superblock) -> Option<Unfinished> {
        let f = sb.flags.get();
        if f & BTRFS_SUPER_FLAG_CHANGING_FSID != 0 {
            Some(Unfinished::Fsid)
        } else if f & BTRFS_SUPER_FLAG_CHANGING_FSID_V2 != 0 {
            Some(Unfinished::MetadataUuid)
        } else if f & (BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM | BTRFS_SUPER_FLAG_CHANGING_META_CSUM)
            != 0
        {
            Some(Unfinished::Csum)
        } else if f & BTRFS_SUPER_FLAG_CHANGING_BG_TREE != 0 {
            Some(Unfinished::BlockGroupTree)
        } else {
            None
        }
    }

    /// The option that finishes it.
    pub fn option(self) -> &'static str {
        match self {
            Unfinished::Fsid => "-u or -U (the same UUID)",
            Unfinished::MetadataUuid => "-m or -M (the same UUID)",
            Unfinished::Csum => "--csum (the same algorithm)",
            Unfinished::BlockGroupTree => {
                "--convert-to-block-group-tree or --convert-from-block-group-tree (the same direction)"
            }
        }
    }

    /// Whether `req` asks for this change (so that running it finishes the
    /// interrupted one) and for nothing else that needs the trees.
    fn asked_by(self, req: &Request) -> bool {
        let only = |n: usize| -> bool {
            let others = [
                req.fsid.is_some(),
                req.metadata_uuid.is_some(),
                req.csum.is_some(),
                req.block_group_tree.is_some(),
                req.free_space_tree,
                req.no_holes,
                req.extref,
                req.skinny_metadata,
                req.quota.is_some(),
                req.subvol_uuids,
                req.label.is_some(),
                req.seeding.is_some(),
            ];
            others.iter().enumerate().all(|(i, &on)| i == n || !on)
        };
        match self {
            Unfinished::Fsid => req.fsid.is_some() && only(0),
            Unfinished::MetadataUuid => req.metadata_uuid.is_some() && only(1),
            Unfinished::Csum => req.csum.is_some() && only(2),
            Unfinished::BlockGroupTree => req.block_group_tree.is_some() && only(3),
        }
    }
}

/// The primary superblock of every device that has a valid one.
pub(super) fn primaries(ctx: &Ctx) -> Vec<(usize, Superblock)> {
    ctx.devs
        .iter()
        .enumerate()
        .filter_map(|(i, (_, d))| {
            crate::image::first_valid_superblock(d.as_ref())
                .ok()
                .map(|sb| (i, sb))
        })
        .collect()
}

/// The unfinished change recorded on any device, refused unless `req`
/// finishes it (and asks nothing else).
pub(super) fn unfinished_allows(ctx: &Ctx, req: &Request) -> Result<Option<Unfinished>> {
    let Some(u) = primaries(ctx).iter().find_map(|(_, sb)| Unfinished::of(sb)) else {
        return Ok(None);
    };
    if !u.asked_by(req) {
        return Err(Error::Unsupported(format!(
            "an interrupted change is unfinished (superblock flag {}): finish it first with btrkit-tune {} and nothing else",
            crate::format::names::super_flag_names(flags_of(ctx)).join("|"),
            u.option()
        )));
    }
    Ok(Some(u))
}

fn flags_of(ctx: &Ctx) -> u64 {
    primaries(ctx)
        .iter()
        .fold(0, |f, (_, sb)| f | sb.flags.get())
        & (BTRFS_SUPER_FLAG_CHANGING_FSID
            | BTRFS_SUPER_FLAG_CHANGING_FSID_V2
            | BTRFS_SUPER_FLAG_CHANGING_BG_TREE
            | BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM
            | BTRFS_SUPER_FLAG_CHANGING_META_CSUM)
}

/// Every device of the set is present, and (unless only superblock
/// fields are asked) no log waits to be replayed.
pub(super) fn complete_set(ctx: &Ctx, needs_trees: bool) -> Result<()> {
    let devices = Devices::new(ctx.devs.clone());
    // A seed device may have its label and seeding flag changed: those
    // steps write superblock fields only.
    let set = if needs_trees {
        devices.set()?
    } else {
        crate::devices::DeviceSet::assemble_seed_too(ctx.devs.clone())?
    };
    if let Some(e) = devices.missing(&set, "btrkit-tune changes every device: give them all") {
        return Err(e);
    }
    if needs_trees {
        let opened = devices.open(OpenOptions::default(), Single::AsSet)?;
        if opened.img.sb.log_root.get() != 0 {
            return Err(Error::Unsupported(
                "the filesystem has an fsync log to replay: run btrkit-replay first (or `btrkit-fsck rescue zero-log` to throw it away)".into(),
            ));
        }
    }
    Ok(())
}

/// Open every path read-write, refusing one that a mount uses.
pub fn open_unmounted(paths: &[PathBuf]) -> Result<Vec<(String, Arc<dyn BlockDevice>)>> {
    if paths.is_empty() {
        return Err(Error::Invalid("no device given".into()));
    }
    let mut v: Vec<(String, Arc<dyn BlockDevice>)> = Vec::with_capacity(paths.len());
    for p in paths {
        if let Some(why) = in_use(p)? {
            return Err(Error::Unsupported(format!(
                "{} is in use ({why}): btrkit-tune changes filesystems offline only; unmount it first",
                p.display()
            )));
        }
        v.push((
            p.display().to_string(),
            Arc::new(FileDevice::open(p, true)?),
        ));
    }
    Ok(v)
}

/// Why `path` is in use by a mount, if it is: a block device the kernel
/// holds exclusively (a mounted filesystem holds every device of its set
/// so), or an image file behind such a loop device.
pub fn in_use(path: &Path) -> Result<Option<String>> {
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    if meta.file_type().is_block_device() {
        return Ok(block_busy(path).then(|| "a mounted filesystem holds it".to_string()));
    }
    // An image file a read-write `btrkit-mount` serves: it holds an
    // exclusive lock on it for as long as it runs.
    if let Ok(f) = std::fs::File::open(path) {
        if let Err(std::fs::TryLockError::WouldBlock) = f.try_lock_shared() {
            return Ok(Some("a read-write btrkit-mount serves it".to_string()));
        }
    }
    // An image file: look for loop devices backed by this very inode.
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Ok(None);
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim_end_matches('\n');
        let Ok(bm) = std::fs::metadata(backing) else {
            continue;
        };
        if bm.dev() == meta.dev() && bm.ino() == meta.ino() {
            let dev = Path::new("/dev").join(&name);
            if block_busy(&dev) {
                return Ok(Some(format!("mounted through {}", dev.display())));
            }
        }
    }
    Ok(None)
}

/// Whether the kernel holds block device `dev` exclusively (mounted, or
/// part of a mounted set): an exclusive open then fails with EBUSY.
fn block_busy(dev: &Path) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(dev)
    {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBUSY),
    }
}
