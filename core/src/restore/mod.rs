//! Getting files out of an image without writing it (`btrkit-restore`).
//!
//! The devices are opened behind copy-on-write overlays ([`OverlayDevice`]):
//! the log replay, the mount's own work and anything else the engine
//! writes land in memory, so the image is never changed while what is
//! read is what the kernel shows after its replay. Then the tree is
//! walked from a subvolume root and copied to a host directory; an inode
//! or directory that cannot be read (a tree block damaged on every copy)
//! is recorded as lost with the reason and the walk goes on.

use crate::devices::DeviceSet;
use crate::format::consts::{
    BTRFS_DIR_INDEX_KEY, BTRFS_FIRST_FREE_OBJECTID, BTRFS_FT_DIR, BTRFS_ROOT_ITEM_KEY,
};
use crate::fs::read::MapKind;
use crate::fs::{Filesystem, Loc, MountOptions};
use crate::image::OpenOptions;
use crate::io::{BlockDevice, OverlayDevice};
use crate::log::replay::ReplayOptions;
use crate::trans::Store;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod view;

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
            let img = if devs.len() == 1 {
                crate::image::Image::open(
                    first.clone(),
                    OpenOptions {
                        mirror: o.mirror,
                        degraded: o.degraded,
                        ..Default::default()
                    },
                )?
            } else {
                DeviceSet::assemble(devs.to_vec())?.open(OpenOptions {
                    mirror: o.mirror,
                    degraded: o.degraded,
                    ..Default::default()
                })?
            };
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
    let overlays: Vec<(String, Arc<dyn BlockDevice>)> = devs
        .into_iter()
        .map(|(n, d)| {
            let d: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(d));
            (n, d)
        })
        .collect();
    if o.root != RootChoice::Latest {
        choose_root(&overlays, o)?;
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
    let open = || -> Result<crate::image::Image> {
        if overlays.len() == 1 && !o.degraded {
            crate::image::Image::open(overlays[0].1.clone(), open_opts)
        } else {
            DeviceSet::assemble(overlays.clone())?.open(open_opts)
        }
    };
    let mut img = open()?;
    if img.sb.log_root.get() != 0 {
        let mut st = Store::from_image_for_replay(img)?;
        match o.log {
            LogMode::Replay | LogMode::Salvage => {
                crate::log::replay::replay(
                    &mut st,
                    ReplayOptions {
                        force: false,
                        salvage: o.log == LogMode::Salvage,
                    },
                )?;
            }
            LogMode::Ignore => {
                st.clear_log_root();
                st.commit()?;
            }
        }
        drop(st);
        // The superblock the commit wrote is the overlay's mirror 0.
        img = if overlays.len() == 1 && !o.degraded {
            crate::image::Image::open(
                overlays[0].1.clone(),
                OpenOptions {
                    mirror: 0,
                    ..open_opts
                },
            )?
        } else {
            DeviceSet::assemble(overlays.clone())?.open(OpenOptions {
                mirror: 0,
                ..open_opts
            })?
        };
    }
    let store = Store::from_image(img)?;
    Filesystem::with_store(
        store,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
        crate::log::LogState::boxed(),
    )
}

/// What [`restore`] copies and how.
#[derive(Default)]
pub struct RestoreOptions<'a> {
    /// Owner, mode and times too (`btrfs restore -m`).
    pub metadata: bool,
    /// Replace files that exist at the destination (else they are skipped).
    pub overwrite: bool,
    /// List what would be restored; write nothing.
    pub dry_run: bool,
    /// Descend into snapshots (subvolumes made as snapshots are skipped
    /// otherwise, as `btrfs restore` skips them without `-s`).
    pub snapshots: bool,
    /// Only paths (from the start, `/a/b`) this accepts are restored;
    /// directories are always descended.
    pub select: Option<&'a dyn Fn(&str) -> bool>,
}

/// Something that could not be restored.
#[derive(Clone, Debug, Serialize)]
pub struct Lost {
    /// Its path from the start of the restore.
    pub path: String,
    /// Subvolume (root objectid) and inode number.
    pub subvol: u64,
    /// Inode number.
    pub ino: u64,
    /// Why: the error met reading it (naming the block where it is a
    /// damaged tree block).
    pub what: String,
}

/// What [`restore`] did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestoreReport {
    /// Regular files written (hard links not counted).
    pub files: u64,
    /// Directories made (the destination itself not counted).
    pub dirs: u64,
    /// Symbolic links made.
    pub symlinks: u64,
    /// Further names of files already restored, made as hard links.
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes made.
    pub special: u64,
    /// File bytes written (data, not holes).
    pub bytes: u64,
    /// Files left alone because they exist at the destination.
    pub skipped_existing: u64,
    /// Snapshots not descended into.
    pub skipped_snapshots: u64,
    /// What could not be read, with why.
    pub lost: Vec<Lost>,
    /// Extended attributes or metadata the destination refused (the file
    /// itself was restored): path and why.
    pub warnings: Vec<String>,
    /// With `dry_run`: every path that would be restored, with its size.
    pub listed: Vec<(String, u64)>,
    /// Tree blocks read although every copy failed its checksum (nothing
    /// else was wrong with them); what they hold was restored as it stands.
    pub bad_csum_blocks: Vec<u64>,
}

/// Most entries one restore walks (a bound on a looping directory graph).
const MAX_ENTRIES: u64 = 1 << 40;
/// Largest read of file data at once.
const READ_CHUNK: u64 = 4 << 20;

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

/// Copy the tree under `start` to `dest` (made if missing). Errors only for
/// what stops the whole restore (the destination cannot be written); what
/// cannot be read is recorded in the report's `lost`.
pub fn restore(
    fs: &mut Filesystem,
    start: Loc,
    dest: &Path,
    o: &RestoreOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RestoreReport> {
    let mut r = RestoreReport::default();
    if !o.dry_run {
        std::fs::create_dir_all(dest)
            .map_err(|e| Error::io(format!("cannot make {}", dest.display()), e))?;
    }
    // (subvol, ino) of files with several names -> where the first went.
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    // Directories whose times are set once their contents are in.
    let mut dir_times: Vec<(PathBuf, (i64, u32), (i64, u32))> = Vec::new();
    // (path, inode, directory entry type; FT_DIR for the start)
    warm(fs, start.subvol);
    let mut stack: Vec<(String, Loc, u8)> = vec![(String::new(), start, BTRFS_FT_DIR)];
    let mut writers = Writers::start();
    // Directories this restore made: nothing in them can exist already.
    let mut fresh: std::collections::HashSet<PathBuf> = Default::default();
    // Further names of files handed to the writers: linked once all are made.
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut seen = 0u64;
    while let Some((rel, l, ft)) = stack.pop() {
        seen += 1;
        if seen > MAX_ENTRIES {
            return Err(Error::Invalid("restore: too many entries".into()));
        }
        let shown = if rel.is_empty() {
            "/".to_string()
        } else {
            rel.clone()
        };
        let out = dest.join(rel.trim_start_matches('/'));
        let lose = |r: &mut RestoreReport, e: Error| {
            r.lost.push(Lost {
                path: shown.clone(),
                subvol: l.subvol,
                ino: l.ino,
                what: e.to_string(),
            })
        };
        if l.ino == crate::format::consts::BTRFS_EMPTY_SUBVOL_DIR_OBJECTID {
            // A subvolume whose root is not there: an empty directory, as
            // the kernel shows it.
            if !o.dry_run {
                make_dir(&out, &mut r)?;
            }
            continue;
        }
        let st = match fs.stat(l) {
            Ok(s) => Some(s),
            // A directory whose inode item is lost still has its entries
            // (DIR_INDEX items of its own, in other leaves maybe): restore
            // them into a directory without its metadata.
            Err(e) if ft == BTRFS_FT_DIR => {
                r.warnings.push(format!(
                    "{shown}: directory inode unreadable, entries salvaged: {e}"
                ));
                None
            }
            // A regular file whose inode item is lost and that has no
            // extent items is made empty, as btrfs restore makes it; with
            // extents its size is not known and it is lost.
            Err(e) if ft == crate::format::consts::BTRFS_FT_REG_FILE => {
                if o.dry_run {
                    lose(&mut r, e);
                    continue;
                }
                if o.select.is_some_and(|f| !f(&shown)) {
                    continue;
                }
                if std::fs::symlink_metadata(&out).is_ok() && !o.overwrite {
                    r.skipped_existing += 1;
                    continue;
                }
                match salvage_file(fs, l, &out, &mut r) {
                    Ok(()) => r.warnings.push(format!(
                        "{shown}: inode item unreadable ({e}); it has no extent items: \
                         made empty, mode and owner not known"
                    )),
                    Err(e2) => {
                        let _ = std::fs::remove_file(&out);
                        lose(
                            &mut r,
                            Error::Invalid(format!("{e}; from its extents: {e2}")),
                        );
                    }
                }
                continue;
            }
            Err(e) => {
                lose(&mut r, e);
                continue;
            }
        };
        let kind = st.as_ref().map_or(libc::S_IFDIR, |s| s.mode & libc::S_IFMT);
        if kind == libc::S_IFDIR {
            // Read around damage: a leaf lost loses the entries it held.
            let entries = match st.as_ref().map(|_| fs.readdir(l)) {
                Some(Ok(v)) => v,
                _ => match salvage_readdir(fs, l) {
                    Ok((v, damaged)) => {
                        for (bytenr, why) in damaged {
                            r.lost.push(Lost {
                                path: format!("{shown} (entries in tree block {bytenr})"),
                                subvol: l.subvol,
                                ino: l.ino,
                                what: why,
                            });
                        }
                        v
                    }
                    Err(e) => {
                        lose(&mut r, e);
                        continue;
                    }
                },
            };
            if !o.dry_run && !rel.is_empty() && make_dir(&out, &mut r)? {
                fresh.insert(out.clone());
            }
            let mut children = Vec::with_capacity(entries.len());
            for (name, child, ty) in entries {
                let name = String::from_utf8_lossy(&name).into_owned();
                if child.subvol != l.subvol && !o.snapshots && is_snapshot(fs, child.subvol) {
                    r.skipped_snapshots += 1;
                    continue;
                }
                children.push((format!("{rel}/{name}"), child, ty));
            }
            // Popped in name order.
            children.sort_by(|a, b| b.0.cmp(&a.0));
            stack.extend(children);
            if let (false, Some(st)) = (o.dry_run, &st) {
                copy_xattrs(fs, l, &out, &shown, &mut r);
                if o.metadata {
                    set_owner_mode(&out, st.uid, st.gid, st.mode, false, &shown, &mut r);
                    dir_times.push((out.clone(), st.atime, st.mtime));
                }
            }
            continue;
        }
        let Some(st) = st else { continue };
        if o.select.is_some_and(|f| !f(&shown)) {
            continue;
        }
        if o.dry_run {
            r.listed.push((shown, st.size));
            continue;
        }
        let in_fresh = out.parent().is_some_and(|p| fresh.contains(p));
        if !in_fresh && std::fs::symlink_metadata(&out).is_ok() {
            if !o.overwrite {
                r.skipped_existing += 1;
                continue;
            }
            std::fs::remove_file(&out)
                .map_err(|e| Error::io(format!("cannot replace {}", out.display()), e))?;
        }
        if st.nlink > 1 {
            if let Some(first) = linked.get(&(l.subvol, l.ino)) {
                links.push((first.clone(), out.clone()));
                r.hardlinks += 1;
                continue;
            }
        }
        if kind == libc::S_IFREG && st.size <= SMALL_FILE {
            match read_small(fs, l, st.size) {
                Ok(data) => {
                    let xattrs = match fs.list_xattrs(l) {
                        Ok(x) => x,
                        Err(e) => {
                            r.warnings.push(format!("{shown}: xattrs: {e}"));
                            Vec::new()
                        }
                    };
                    r.bytes += data.iter().map(|d| d.1.len() as u64).sum::<u64>();
                    r.files += 1;
                    if st.nlink > 1 {
                        linked.insert((l.subvol, l.ino), out.clone());
                    }
                    let meta = o
                        .metadata
                        .then_some((st.uid, st.gid, st.mode, st.atime, st.mtime));
                    writers.send(
                        FileJob {
                            out,
                            shown,
                            size: st.size,
                            data,
                            xattrs,
                            meta,
                        },
                        &mut r,
                    )?;
                    progress(r.files + r.symlinks + r.special, r.bytes);
                }
                Err(e) => lose(&mut r, e),
            }
            continue;
        }
        let made = match kind {
            libc::S_IFREG => copy_file(fs, l, st.size, &out, &mut r),
            libc::S_IFLNK => match fs.read_link(l) {
                Ok(t) => {
                    use std::os::unix::ffi::OsStrExt;
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), &out)
                        .map_err(|e| Error::io(format!("cannot make {}", out.display()), e))?;
                    r.symlinks += 1;
                    Ok(())
                }
                Err(e) => Err(e),
            },
            _ => {
                crate::io::host::mknod(&out, st.mode, st.rdev)
                    .map_err(|e| Error::io(format!("cannot make {}", out.display()), e))?;
                r.special += 1;
                Ok(())
            }
        };
        if let Err(e) = made {
            let _ = std::fs::remove_file(&out);
            lose(&mut r, e);
            continue;
        }
        if st.nlink > 1 {
            linked.insert((l.subvol, l.ino), out.clone());
        }
        copy_xattrs(fs, l, &out, &shown, &mut r);
        if o.metadata {
            let link = kind == libc::S_IFLNK;
            set_owner_mode(&out, st.uid, st.gid, st.mode, link, &shown, &mut r);
            if let Err(e) = crate::io::host::set_times(&out, st.atime, st.mtime) {
                r.warnings.push(format!("{shown}: times: {e}"));
            }
        }
        progress(r.files + r.symlinks + r.special, r.bytes);
    }
    writers.finish(&mut r)?;
    for (first, out) in links {
        std::fs::hard_link(&first, &out)
            .map_err(|e| Error::io(format!("cannot link {}", out.display()), e))?;
    }
    r.bad_csum_blocks = fs.store.image().trusted_bad_csum();
    r.warnings.extend(rebuilt_warnings(fs.store.image()));
    // Innermost first: setting a directory's times before its parent's.
    for (p, a, m) in dir_times.iter().rev() {
        if let Err(e) = crate::io::host::set_times(p, *a, *m) {
            r.warnings.push(format!("{}: times: {e}", p.display()));
        }
    }
    Ok(r)
}

/// Read the tree blocks of subvolume `subvol` and of the checksum tree
/// ahead, in block order with many reads in flight, so the walk's
/// lookups (an inode, its directory, its extents and checksums: several
/// searches per file, in no order the disk likes) find them cached. Damage
/// is left for the walk to meet and report.
fn warm(fs: &mut Filesystem, subvol: u64) {
    use crate::tree::walk::{walk, OnDamage, Place, WalkOptions};
    use std::ops::ControlFlow;
    let img = fs.store.image();
    let opts = WalkOptions {
        on_damage: OnDamage::Skip,
        prefetch: true,
        ..Default::default()
    };
    for id in [subvol, crate::format::consts::BTRFS_CSUM_TREE_OBJECTID] {
        let Ok(Some(root)) = img.find_root(id) else {
            continue;
        };
        let mut seen = std::collections::HashSet::new();
        let start = Place::start(root.bytenr, crate::tree::Expect::root(&root));
        let _ = walk::<()>(img, start, &opts, &mut seen, |_| {
            ControlFlow::Continue(true)
        });
    }
}

/// A small file read whole, for a writer thread to make.
struct FileJob {
    out: PathBuf,
    shown: String,
    size: u64,
    /// Data runs: (file offset, bytes).
    data: Vec<(u64, Vec<u8>)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Owner, group, mode, atime, mtime (with `metadata`).
    meta: Option<(u32, u32, u32, (i64, u32), (i64, u32))>,
}

#[derive(Default)]
struct WriterState {
    /// The first write that failed: the restore stops with it.
    fatal: Option<Error>,
    warnings: Vec<String>,
}

/// Small files handed to a writer at once.
const BATCH: usize = 64;
/// Most file bytes read and not yet written (the reader waits above it).
const IN_FLIGHT_BYTES: u64 = 256 << 20;
/// Most files read and not yet written.
const IN_FLIGHT_FILES: u64 = 64 << 10;

/// Work handed over and not done: what bounds the reader's lead.
#[derive(Default)]
struct InFlight {
    files: u64,
    bytes: u64,
}

/// Threads that make small files while the tree is read: creating files
/// on the host is most of a restore's time, and it runs in parallel.
///
/// Each directory's files go to one writer, the next directory's to the
/// next: writers creating files in one host directory at once queue on
/// its lock (the host kernel spins on it, which costs more than the
/// files), while the reader, far faster, runs several directories ahead.
/// Files go over in batches (a hand-over per file costs a wake-up), and
/// what is read ahead is bounded in files and bytes.
struct Writers {
    txs: Vec<std::sync::mpsc::Sender<Vec<FileJob>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    state: Arc<std::sync::Mutex<WriterState>>,
    flight: Arc<(std::sync::Mutex<InFlight>, std::sync::Condvar)>,
    /// The directory being filled, its writer, and its jobs not handed over.
    dir: Option<PathBuf>,
    next: usize,
    batch: Vec<FileJob>,
}

fn job_bytes(j: &FileJob) -> u64 {
    j.data.iter().map(|d| d.1.len() as u64).sum::<u64>() + 256
}

impl Writers {
    fn start() -> Writers {
        let n = std::thread::available_parallelism()
            .map_or(2, |n| n.get() * 2)
            .clamp(2, 8);
        let state: Arc<std::sync::Mutex<WriterState>> = Arc::default();
        let flight: Arc<(std::sync::Mutex<InFlight>, std::sync::Condvar)> = Arc::default();
        let mut txs = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<FileJob>>();
            let (state, flight) = (state.clone(), flight.clone());
            let t = std::thread::Builder::new()
                .name(format!("btrkit-restore-{i}"))
                .spawn(move || {
                    while let Ok(batch) = rx.recv() {
                        let mut warnings = Vec::new();
                        let mut fatal = None;
                        for job in &batch {
                            if let Err(e) = write_job(job, &mut warnings) {
                                fatal.get_or_insert(e);
                            }
                        }
                        if let Ok(mut s) = state.lock() {
                            s.warnings.extend(warnings);
                            if let Some(e) = fatal {
                                s.fatal.get_or_insert(e);
                            }
                        }
                        let (m, cv) = &*flight;
                        if let Ok(mut f) = m.lock() {
                            f.files -= batch.len() as u64;
                            f.bytes -= batch.iter().map(job_bytes).sum::<u64>();
                        }
                        cv.notify_all();
                    }
                });
            if let Ok(t) = t {
                txs.push(tx);
                threads.push(t);
            }
        }
        Writers {
            txs,
            threads,
            state,
            flight,
            dir: None,
            next: 0,
            batch: Vec::with_capacity(BATCH),
        }
    }

    /// Hand `job` to a writer (made here if no writer thread runs).
    fn send(&mut self, job: FileJob, r: &mut RestoreReport) -> Result<()> {
        if self.txs.is_empty() {
            return write_job(&job, &mut r.warnings);
        }
        let parent = job.out.parent().map(Path::to_path_buf);
        if parent != self.dir {
            self.flush()?;
            self.dir = parent;
            self.next = (self.next + 1) % self.txs.len();
        }
        self.batch.push(job);
        if self.batch.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if let Some(e) = self.state.lock().ok().and_then(|mut s| s.fatal.take()) {
            return Err(e);
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        let (files, bytes) = (batch.len() as u64, batch.iter().map(job_bytes).sum::<u64>());
        {
            let (m, cv) = &*self.flight;
            let mut f = m
                .lock()
                .map_err(|_| Error::Internal("restore writer state poisoned".into()))?;
            // Wait for room (work in flight always drains: writers never
            // wait on the reader).
            while f.files > 0
                && (f.files + files > IN_FLIGHT_FILES || f.bytes + bytes > IN_FLIGHT_BYTES)
            {
                f = cv
                    .wait(f)
                    .map_err(|_| Error::Internal("restore writer state poisoned".into()))?;
            }
            f.files += files;
            f.bytes += bytes;
        }
        self.txs[self.next]
            .send(batch)
            .map_err(|_| Error::Internal("restore writers stopped".into()))
    }

    /// Wait for every file handed over; the first failure, if any.
    fn finish(mut self, r: &mut RestoreReport) -> Result<()> {
        let flushed = self.flush();
        self.txs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        flushed?;
        let mut s = self
            .state
            .lock()
            .map_err(|_| Error::Internal("restore writer state poisoned".into()))?;
        r.warnings.append(&mut s.warnings);
        match s.fatal.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Make one small file: data, size, xattrs, then owner, mode and times.
fn write_job(j: &FileJob, warnings: &mut Vec<String>) -> Result<()> {
    let f = std::fs::File::create(&j.out)
        .map_err(|e| Error::io(format!("cannot create {}", j.out.display()), e))?;
    let mut end = 0;
    for (at, data) in &j.data {
        f.write_all_at(data, *at)
            .map_err(|e| Error::io(format!("cannot write {}", j.out.display()), e))?;
        end = at + data.len() as u64;
    }
    if end != j.size {
        f.set_len(j.size)
            .map_err(|e| Error::io(format!("cannot size {}", j.out.display()), e))?;
    }
    drop(f);
    for (n, v) in &j.xattrs {
        if let Err(e) = crate::io::host::set_xattr(&j.out, n, v) {
            warnings.push(format!(
                "{}: xattr {}: {e}",
                j.shown,
                String::from_utf8_lossy(n)
            ));
        }
    }
    if let Some((uid, gid, mode, atime, mtime)) = j.meta {
        let mut r = RestoreReport::default();
        set_owner_mode(&j.out, uid, gid, mode, false, &j.shown, &mut r);
        warnings.append(&mut r.warnings);
        if let Err(e) = crate::io::host::set_times(&j.out, atime, mtime) {
            warnings.push(format!("{}: times: {e}", j.shown));
        }
    }
    Ok(())
}

/// Largest file read whole and handed to a writer thread; larger ones are
/// copied a piece at a time on the reading thread.
const SMALL_FILE: u64 = 4 << 20;

/// The entries of directory `l` from its DIR_INDEX items, read around
/// damage: the subvolume tree is walked over the directory's key range
/// only, and a block that cannot be read loses just the entries it held.
/// Returns the entries (name, inode, type) in index order and the
/// damaged blocks with why.
fn salvage_readdir(
    fs: &mut Filesystem,
    l: Loc,
) -> Result<(Vec<(Vec<u8>, Loc, u8)>, Vec<(u64, String)>)> {
    use crate::format::key::Key;
    use crate::tree::walk::{walk, OnDamage, Place, WalkEvent, WalkOptions};
    use std::ops::ControlFlow;
    let img = fs.store.image();
    let root = img
        .find_root(l.subvol)?
        .ok_or_else(|| Error::Invalid(format!("subvolume {} has no root", l.subvol)))?;
    let (lo, hi) = (
        Key::new(l.ino, BTRFS_DIR_INDEX_KEY, 0),
        Key::new(l.ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
    );
    let mut out = Vec::new();
    let mut damaged = Vec::new();
    let opts = WalkOptions {
        on_damage: OnDamage::Skip,
        ..Default::default()
    };
    let mut seen = std::collections::HashSet::new();
    let start = Place::start(root.bytenr, crate::tree::Expect::root(&root));
    let _ = walk::<()>(img, start, &opts, &mut seen, |ev| match ev {
        WalkEvent::Block {
            node, problems, at, ..
        } => {
            // Only blocks whose key range meets the directory's.
            if at.lo > hi || at.hi.is_some_and(|h| h <= lo) {
                return ControlFlow::Continue(false);
            }
            if !problems.is_empty() {
                damaged.push((node.bytenr, problems[0].message.clone()));
                return ControlFlow::Continue(false);
            }
            if node.is_leaf() {
                for slot in 0..node.nritems() {
                    let Some(k) = node.key(slot) else { continue };
                    if k < lo || k > hi {
                        continue;
                    }
                    let Ok(data) = node.item_data(slot) else {
                        continue;
                    };
                    let Ok(ents) = crate::format::dir::parse_dir_items(data) else {
                        continue;
                    };
                    for e in ents {
                        let loc = Key::from(e.item.location);
                        let child = if loc.ty == BTRFS_ROOT_ITEM_KEY {
                            Loc {
                                subvol: loc.objectid,
                                ino: BTRFS_FIRST_FREE_OBJECTID,
                                parent: 0,
                            }
                        } else {
                            Loc {
                                subvol: l.subvol,
                                ino: loc.objectid,
                                parent: 0,
                            }
                        };
                        out.push((e.name.to_vec(), child, e.item.type_));
                    }
                }
            }
            ControlFlow::Continue(true)
        }
        WalkEvent::Unreadable {
            bytenr, error, at, ..
        } => {
            if !(at.lo > hi || at.hi.is_some_and(|h| h <= lo)) {
                damaged.push((bytenr, error.to_string()));
            }
            ControlFlow::Continue(false)
        }
        _ => ControlFlow::Continue(false),
    });
    Ok((out, damaged))
}

/// Make directory `out`; whether it is new (false: it was there).
fn make_dir(out: &Path, r: &mut RestoreReport) -> Result<bool> {
    match std::fs::create_dir(out) {
        Ok(()) => {
            r.dirs += 1;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && out.is_dir() => Ok(false),
        Err(e) => Err(Error::io(format!("cannot make {}", out.display()), e)),
    }
}

/// Whether subvolume `id` was made as a snapshot (its root item names a
/// parent).
fn is_snapshot(fs: &mut Filesystem, id: u64) -> bool {
    fs.store
        .root_state(id)
        .ok()
        .and_then(|s| s.item.as_ref().map(|(_, ri)| ri.parent_uuid != [0u8; 16]))
        .unwrap_or(false)
}

/// A small file's data runs, read whole (decompressed, checksums verified).
fn read_small(fs: &mut Filesystem, l: Loc, size: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    for (s, e, kind) in crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino)? {
        if kind != MapKind::Data || s >= size {
            continue;
        }
        let end = e.min(size);
        out.push((s, fs.read_untracked(l, s, end - s)?));
    }
    Ok(out)
}

/// Write a regular file's data: its data runs read (decompressed, with
/// checksums verified) and written where they are; holes and
/// preallocated space left as holes; the size set last.
fn copy_file(
    fs: &mut Filesystem,
    l: Loc,
    size: u64,
    out: &Path,
    r: &mut RestoreReport,
) -> Result<()> {
    let runs = crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino)?;
    write_runs(fs, out, size, runs, r, |fs, at, n| {
        fs.read_untracked(l, at, n)
    })
}

/// Make `out` of `size` bytes from a file's data runs (as
/// [`crate::fs::read::extent_map`] gives them), each read with `read`;
/// holes and preallocated space stay holes.
fn write_runs(
    fs: &mut Filesystem,
    out: &Path,
    size: u64,
    runs: Vec<(u64, u64, MapKind)>,
    r: &mut RestoreReport,
    mut read: impl FnMut(&mut Filesystem, u64, u64) -> Result<Vec<u8>>,
) -> Result<()> {
    let f = std::fs::File::create(out)
        .map_err(|e| Error::io(format!("cannot create {}", out.display()), e))?;
    for (s, e, kind) in runs {
        if kind != MapKind::Data {
            continue;
        }
        let (mut at, end) = (s, e.min(size));
        while at < end {
            let n = (end - at).min(READ_CHUNK);
            let data = read(fs, at, n)?;
            f.write_all_at(&data, at)
                .map_err(|e| Error::io(format!("cannot write {}", out.display()), e))?;
            r.bytes += data.len() as u64;
            at += n;
        }
    }
    f.set_len(size)
        .map_err(|e| Error::io(format!("cannot size {}", out.display()), e))?;
    r.files += 1;
    Ok(())
}

/// The size of a file whose inode item is lost, where it is known: 0 when
/// it has no extent items either (an empty file under its name, as btrfs
/// restore makes it). With extents, the size is not known (the last
/// extent ends on a sector boundary, i_size anywhere before it): the
/// file is lost rather than restored with contents that may be wrong.
fn size_from_extents(fs: &mut Filesystem, l: Loc) -> Result<u64> {
    let runs = crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino)?;
    if runs.is_empty() {
        Ok(0)
    } else {
        Err(Error::Invalid(format!(
            "its size is not known ({} extent items, up to byte {})",
            runs.len(),
            runs.iter().map(|x| x.1).max().unwrap_or(0)
        )))
    }
}

/// Make the file a name stands for whose inode item is lost, when that
/// is determined: an empty file (see [`size_from_extents`]).
fn salvage_file(fs: &mut Filesystem, l: Loc, out: &Path, r: &mut RestoreReport) -> Result<()> {
    size_from_extents(fs, l)?;
    std::fs::File::create(out)
        .map_err(|e| Error::io(format!("cannot create {}", out.display()), e))?;
    r.files += 1;
    Ok(())
}

fn copy_xattrs(fs: &mut Filesystem, l: Loc, out: &Path, shown: &str, r: &mut RestoreReport) {
    match fs.list_xattrs(l) {
        Ok(list) => {
            for (n, v) in list {
                if let Err(e) = crate::io::host::set_xattr(out, &n, &v) {
                    r.warnings.push(format!(
                        "{shown}: xattr {}: {e}",
                        String::from_utf8_lossy(&n)
                    ));
                }
            }
        }
        Err(e) => r.warnings.push(format!("{shown}: xattrs: {e}")),
    }
}

fn set_owner_mode(
    out: &Path,
    uid: u32,
    gid: u32,
    mode: u32,
    link: bool,
    shown: &str,
    r: &mut RestoreReport,
) {
    if let Err(e) = std::os::unix::fs::lchown(out, Some(uid), Some(gid)) {
        r.warnings.push(format!("{shown}: owner: {e}"));
    }
    if !link {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) =
            std::fs::set_permissions(out, std::fs::Permissions::from_mode(mode & 0o7777))
        {
            r.warnings.push(format!("{shown}: mode: {e}"));
        }
    }
}
