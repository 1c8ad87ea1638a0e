//! Getting files out of an image without writing it (`btrkit-restore`).
//!
//! The devices are opened behind copy-on-write overlays ([`OverlayDevice`]):
//! the log replay, the mount's own work and anything else the engine
//! writes land in memory, so the image is never changed while what is
//! read is what the kernel shows after its replay. Then the tree is
//! walked from a subvolume root and copied to a host directory; an inode
//! or directory that cannot be read (a tree block damaged on every copy)
//! is recorded as lost with the reason and the walk goes on.

use crate::devices::{Devices, Single};
use crate::format::consts::BTRFS_FIRST_FREE_OBJECTID;
use crate::fs::{Filesystem, Loc, MountOptions};
use crate::image::OpenOptions;
use crate::io::{BlockDevice, OverlayDevice};
use crate::log::replay::ReplayOptions;
use crate::trans::Store;
use crate::{Error, Result};
use serde::Serialize;
use std::sync::Arc;

pub mod copy;
pub mod dest;

pub use copy::{restore, BadData, Lost, RestoreOptions, RestoreReport};

/// What to do with a log the superblock names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogMode {
    /// Replay it (in memory), as the kernel's mount would.
    #[default]
    Replay,
    /// Replay what a damaged log still proves (see [`crate::log::salvage`]).
    Salvage,
    /// Leave it: the state of the last commit.
    Ignore,
}

/// Which tree root the filesystem is read from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RootChoice {
    /// The superblock's (the last commit).
    #[default]
    Latest,
    /// The superblock's backup root slot N (0-3): the roots of one of the
    /// last commits (`btrfs restore -u`-style recovery from older roots;
    /// blocks reused since read as damaged).
    Backup(usize),
    /// A root tree node at this logical address (`btrfs restore -t`), its
    /// level and generation from its header.
    TreeRoot(u64),
}

impl LogMode {
    /// From the tools' flags: `--no-log` ignores it, `--salvage` salvages.
    pub fn from_flags(no_log: bool, salvage: bool) -> LogMode {
        if no_log {
            LogMode::Ignore
        } else if salvage {
            LogMode::Salvage
        } else {
            LogMode::Replay
        }
    }
}

impl RootChoice {
    /// From the tools' flags: `--backup N` first, then `--tree-root BYTENR`.
    pub fn from_flags(backup: Option<usize>, tree_root: Option<u64>) -> RootChoice {
        match (backup, tree_root) {
            (Some(n), _) => RootChoice::Backup(n),
            (_, Some(b)) => RootChoice::TreeRoot(b),
            _ => RootChoice::Latest,
        }
    }
}

/// The directory a read starts from: the root of subvolume `subvol` (an
/// id, or a path in the filesystem), the default subvolume's root if None.
pub fn start_dir(fs: &mut Filesystem, subvol: Option<&str>) -> Result<Loc> {
    let start = match subvol {
        None => fs.root(),
        Some(s) => match s.parse::<u64>() {
            Ok(id) => {
                let l = Loc::new(id, BTRFS_FIRST_FREE_OBJECTID);
                fs.stat(l).map_err(|e| {
                    Error::Invalid(format!("subvolume {id}: no root directory ({e})"))
                })?;
                l
            }
            Err(_) => fs.resolve(s, true)?,
        },
    };
    if fs.stat(start)?.mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Error::Invalid(format!(
            "{}: not a directory",
            subvol.unwrap_or("/")
        )));
    }
    Ok(start)
}

/// How [`open_virtual`] opens the image.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// The log.
    pub log: LogMode,
    /// Read a set with devices missing from the copies left.
    pub degraded: bool,
    /// Superblock copy to start from (0 primary, 1 and 2 the mirrors).
    pub mirror: usize,
    /// The tree root to read from. An older root has no log: a log
    /// belongs to the newest commit.
    pub root: RootChoice,
}

/// A backup root slot of the superblock, as `--list-roots` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct BackupRoot {
    /// Slot (0-3).
    pub slot: usize,
    /// Generation of the commit.
    pub generation: u64,
    /// Logical address of its root tree node.
    pub tree_root: u64,
    /// Logical address of its FS_TREE root node.
    pub fs_root: u64,
}

/// The superblock's backup roots (copy `mirror` of the first device),
/// newest first; empty slots left out.
pub fn backup_roots(dev: &dyn BlockDevice, mirror: usize) -> Result<Vec<BackupRoot>> {
    let sb = crate::image::read_superblock(dev, mirror)?;
    let mut v: Vec<BackupRoot> = sb
        .super_roots
        .iter()
        .enumerate()
        .filter(|(_, b)| b.tree_root.get() != 0)
        .map(|(slot, b)| BackupRoot {
            slot,
            generation: b.tree_root_gen.get(),
            tree_root: b.tree_root.get(),
            fs_root: b.fs_root.get(),
        })
        .collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.generation));
    Ok(v)
}

/// Point every device's superblock (in its overlay, copy 0) at another
/// tree root, with no log: what [`open_virtual`] reads from then.
fn choose_root(devs: &[(String, Arc<dyn BlockDevice>)], o: &ReadOptions) -> Result<()> {
    let first = &devs[0].1;
    let sb0 = crate::image::read_superblock(first.as_ref(), o.mirror)?;
    // (root, level, generation, chunk root and level if they change)
    let (root, level, gen, chunk) = match o.root {
        RootChoice::Latest => return Ok(()),
        RootChoice::Backup(n) => {
            let b = sb0.super_roots.get(n).ok_or_else(|| {
                Error::Invalid(format!("backup root {n} does not exist (0 to 3)"))
            })?;
            if b.tree_root.get() == 0 {
                return Err(Error::Invalid(format!("backup root slot {n} is empty")));
            }
            (
                b.tree_root.get(),
                b.tree_root_level,
                b.tree_root_gen.get(),
                Some((
                    b.chunk_root.get(),
                    b.chunk_root_level,
                    b.chunk_root_gen.get(),
                )),
            )
        }
        RootChoice::TreeRoot(bytenr) => {
            let img = Devices::new(devs.to_vec())
                .open(
                    OpenOptions {
                        mirror: o.mirror,
                        degraded: o.degraded,
                        ..Default::default()
                    },
                    Single::Direct,
                )?
                .img;
            let node = img.read_tree_block(bytenr, &crate::tree::Expect::default(), false)?;
            let h = node.header();
            if h.owner.get() != crate::format::consts::BTRFS_ROOT_TREE_OBJECTID {
                return Err(Error::Invalid(format!(
                    "the block at {bytenr} belongs to tree {}, not the root tree",
                    h.owner.get()
                )));
            }
            (bytenr, h.level, h.generation.get(), None)
        }
    };
    let csum = crate::csum::CsumType::from_disk(sb0.csum_type.get())?;
    for (_, d) in devs {
        let mut sb = crate::image::read_superblock(d.as_ref(), o.mirror)?;
        sb.root.set(root);
        sb.root_level = level;
        sb.generation.set(gen);
        if let Some((c, cl, cg)) = chunk {
            sb.chunk_root.set(c);
            sb.chunk_root_level = cl;
            sb.chunk_root_generation.set(cg);
        }
        sb.log_root.set(0);
        sb.log_root_level = 0;
        sb.bytenr.set(crate::format::consts::btrfs_sb_offset(0));
        let mut bytes = zerocopy::IntoBytes::as_bytes(&sb).to_vec();
        let c = crate::csum::block_csum(csum, &bytes);
        bytes[..crate::format::consts::BTRFS_CSUM_SIZE].copy_from_slice(&c);
        d.write_at(crate::format::consts::btrfs_sb_offset(0), &bytes)?;
    }
    Ok(())
}

/// Open the filesystem on `devs` (name, device) for reading only: every
/// device behind an overlay that keeps writes in memory, the log replayed
/// into it (or salvaged, or ignored), then mounted. Nothing reaches the
/// devices.
pub fn open_virtual(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    o: &ReadOptions,
) -> Result<Filesystem> {
    open_steps(devs, o).map_err(|f| match f {
        OpenFailure::Log(e) => log_unreplayable(e),
        OpenFailure::Other(e) => e,
    })
}

/// Open as [`open_virtual`] does; when the fsync log cannot be replayed,
/// read what `--salvage` gets from it instead, and when that fails too,
/// the last commit (`--no-log`). The note says which, and why: a restore
/// from a damaged log is never silent about what it left out.
pub fn open_virtual_fallback(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    o: &ReadOptions,
) -> Result<(Filesystem, Option<String>)> {
    let first = match open_steps(devs.clone(), o) {
        Ok(fs) => return Ok((fs, None)),
        Err(OpenFailure::Other(e)) => return Err(e),
        Err(OpenFailure::Log(e)) => e,
    };
    if o.log == LogMode::Replay {
        let salvage = ReadOptions {
            log: LogMode::Salvage,
            ..*o
        };
        match open_steps(devs.clone(), &salvage) {
            Ok(fs) => {
                return Ok((
                    fs,
                    Some(format!(
                        "the fsync log cannot be replayed ({first}): read as with --salvage, \
                         what the rest of the log proves; files fsynced through the damaged \
                         part are at their last commit"
                    )),
                ))
            }
            Err(OpenFailure::Other(e)) => return Err(e),
            Err(OpenFailure::Log(_)) => {}
        }
    }
    let ignore = ReadOptions {
        log: LogMode::Ignore,
        ..*o
    };
    match open_steps(devs, &ignore) {
        Ok(fs) => Ok((
            fs,
            Some(format!(
                "the fsync log cannot be replayed nor salvaged ({first}): read as with \
                 --no-log, the last commit; what was fsynced since is not restored"
            )),
        )),
        Err(OpenFailure::Log(e)) | Err(OpenFailure::Other(e)) => Err(e),
    }
}

/// Which step of opening failed: the log replay (which `--salvage` or
/// `--no-log` may get past) or anything else.
enum OpenFailure {
    Log(Error),
    Other(Error),
}

/// A log replay's error, saying what the user can do.
fn log_unreplayable(e: Error) -> Error {
    const HINT: &str = "the fsync log cannot be replayed (--salvage applies what the rest \
                        of it proves, --no-log reads the last commit)";
    match e {
        Error::Corrupt {
            kind,
            what,
            bytenr,
            key,
        } => Error::Corrupt {
            kind,
            what: format!("{what}; {HINT}"),
            bytenr,
            key,
        },
        Error::Io { context, err } => Error::Io {
            context: format!("{HINT}: {context}"),
            err,
        },
        e => Error::Invalid(format!("{HINT}: {e}")),
    }
}

fn open_steps(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    o: &ReadOptions,
) -> std::result::Result<Filesystem, OpenFailure> {
    use OpenFailure::{Log, Other};
    let overlays: Vec<(String, Arc<dyn BlockDevice>)> = devs
        .into_iter()
        .map(|(n, d)| {
            let d: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(d));
            (n, d)
        })
        .collect();
    if o.root != RootChoice::Latest {
        choose_root(&overlays, o).map_err(Other)?;
    }
    let open_opts = OpenOptions {
        writable: true,
        degraded: o.degraded,
        // A chosen root was written to copy 0 of the overlays.
        mirror: if o.root == RootChoice::Latest {
            o.mirror
        } else {
            0
        },
        // A tree block bad only in its checksum on every copy is read as
        // it stands (btrfs restore does too); file data keeps its own
        // checksums. The report lists such blocks.
        trust_bad_csum: true,
        ..Default::default()
    };
    // One device is opened as it is, unless degraded (matched as a set,
    // as several are).
    let overlays = Devices::new(overlays);
    let single = if o.degraded {
        Single::AsSet
    } else {
        Single::Direct
    };
    let open = |opts| overlays.open(opts, single).map(|o| o.img);
    let mut img = open(open_opts).map_err(Other)?;
    let mut replayed = false;
    if img.sb.log_root.get() != 0 {
        let mut st = Store::from_image_for_replay(img).map_err(Log)?;
        match o.log {
            LogMode::Replay | LogMode::Salvage => {
                crate::log::replay::replay(
                    &mut st,
                    ReplayOptions {
                        force: false,
                        salvage: o.log == LogMode::Salvage,
                    },
                )
                .map_err(Log)?;
            }
            LogMode::Ignore => {
                st.log_trees().clear_log_root();
                st.commit().map_err(Other)?;
            }
        }
        drop(st);
        // The superblock the commit wrote is the overlay's mirror 0.
        // What the replay wrote is read from here on: a failure is the log's.
        replayed = o.log != LogMode::Ignore;
        img = open(OpenOptions {
            mirror: 0,
            ..open_opts
        })
        .map_err(|e| if replayed { Log(e) } else { Other(e) })?;
    }
    let blame = |e: Error| if replayed { Log(e) } else { Other(e) };
    let store = Store::from_image(img).map_err(blame)?;
    Filesystem::with_store(
        store,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
        crate::log::LogState::boxed(),
    )
    .map_err(blame)
}

/// Reads of RAID5/6 stripes rebuilt from parity since the last call, as
/// warnings (never silent: a damaged or missing stripe is redundancy
/// lost).
pub fn rebuilt_warnings(img: &crate::image::Image) -> Vec<String> {
    let r = img.take_rebuilt_reads();
    let mut out: Vec<String> = r.described.iter().map(|d| d.describe(img)).collect();
    if r.count > r.described.len() as u64 {
        out.push(format!(
            "{} more reads rebuilt from RAID5/6 parity",
            r.count - r.described.len() as u64
        ));
    }
    out
}
