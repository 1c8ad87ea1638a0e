//! Populating a new filesystem from a directory (`--rootdir`): files
//! (inline when small, regular extents otherwise, holes kept sparse),
//! directories, symlinks, hard links, special files, xattrs, modes, owners
//! and times.
//!
//! The source is scanned first, so an unreadable entry is reported before
//! the image is touched; copying then commits every few thousand inodes, so
//! running out of space leaves the last commit intact.

use crate::format::consts::*;
use crate::format::inode::{InodeItem, Timespec};
use crate::fs::compress::{self, Method};
use crate::fs::extents::MAX_COMPRESSED;
use crate::fs::inode::{get_inode, inode_key, put_inode};
use crate::fs::{data, ftype_of_mode, names, xattr, MAX_EXTENT_SIZE, MAX_INLINE};
use crate::trans::Store;
use crate::{Error, Result};
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use zerocopy::FromZeros;

/// Counts of what [`populate`] copied into the filesystem.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RootdirStats {
    /// Regular files copied (each inode once; extra hard links are in
    /// `hardlinks`).
    pub files: u64,
    /// Directories created, not counting the root directory.
    pub dirs: u64,
    /// Symbolic links created.
    pub symlinks: u64,
    /// Special files (FIFOs, sockets, device nodes) created.
    pub special: u64,
    /// Extra names given to an inode already copied (hard links).
    pub hardlinks: u64,
    /// Sum of the sizes (i_size, holes included) of the regular files copied.
    pub bytes: u64,
    /// Subvolumes made (`--subvol`).
    pub subvols: u64,
}

/// How [`populate`] copies: mkfs.btrfs's `--compress` and `--subvol`.
#[derive(Clone, Debug, Default)]
pub struct RootdirOptions {
    /// Compress file data (see [`copy_file_data`]'s rules).
    pub compress: Option<Method>,
    /// Compress as under `-o compress-force`: no heuristic, no inode
    /// given up on (see [`copy_file_data`]).
    pub compress_force: bool,
    /// Directories of the source made subvolumes.
    pub subvols: Vec<SubvolSpec>,
    /// `--inode-flags FLAGS:PATH`: inode flags (NODATACOW, NODATASUM) for
    /// a path of the source and, for a directory, everything under it.
    pub inode_flags: Vec<(PathBuf, u64)>,
    /// `--reflink`: file extents share the source files' blocks with the
    /// image file (FICLONERANGE) instead of being written; the data is
    /// still read, for its checksums. Not with `compress`.
    pub reflink: bool,
}

/// One `--inode-flags FLAGS:PATH` (FLAGS comma separated: nodatacow,
/// nodatasum): the path relative to the source root and the inode flags.
/// nodatacow implies nodatasum, as `chattr +C` on an empty file does.
pub fn parse_inode_flags(arg: &str) -> Result<(PathBuf, u64)> {
    let bad = || {
        Error::Invalid(format!(
            "--inode-flags {arg}: expected FLAGS:PATH, FLAGS of nodatacow, nodatasum"
        ))
    };
    let (flags, path) = arg.split_once(':').ok_or_else(bad)?;
    let mut f = 0u64;
    for name in flags.split(',') {
        f |= match name.trim() {
            "nodatacow" => BTRFS_INODE_NODATACOW | BTRFS_INODE_NODATASUM,
            "nodatasum" => BTRFS_INODE_NODATASUM,
            _ => return Err(bad()),
        };
    }
    let sv = SubvolSpec::parse(path).map_err(|_| bad())?;
    Ok((sv.path, f))
}

/// One `--subvol TYPE:SUBDIR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubvolSpec {
    /// The directory, relative to the source root.
    pub path: PathBuf,
    /// `ro` / `default-ro`: the subvolume is read-only.
    pub readonly: bool,
    /// `default` / `default-ro`: it becomes the default subvolume.
    pub default: bool,
}

impl SubvolSpec {
    /// `TYPE:SUBDIR` (TYPE rw, ro, default or default-ro) or `SUBDIR` (rw).
    pub fn parse(arg: &str) -> Result<SubvolSpec> {
        let (kind, dir) = match arg.split_once(':') {
            Some((k @ ("rw" | "ro" | "default" | "default-ro"), d)) => (k, d),
            _ => ("rw", arg),
        };
        let path = PathBuf::from(dir.trim_start_matches("./"));
        let clean = path
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if dir.is_empty() || !clean {
            return Err(Error::Invalid(format!(
                "--subvol {arg}: SUBDIR must be a relative path inside the --rootdir directory"
            )));
        }
        Ok(SubvolSpec {
            path,
            readonly: kind.ends_with("ro"),
            default: kind.starts_with("default"),
        })
    }
}

/// Each of `paths` names an entry of the scanned source (`what` names the
/// option in the error).
pub fn check_paths<'a>(
    listing: &Listing,
    paths: impl Iterator<Item = &'a Path>,
    what: &str,
) -> Result<()> {
    let root = &listing.entries[0].path;
    for p in paths {
        if !listing
            .entries
            .iter()
            .any(|e| e.path.strip_prefix(root).ok() == Some(p))
        {
            return Err(Error::Invalid(format!(
                "{what} {}: no such path in {}",
                p.display(),
                root.display()
            )));
        }
    }
    Ok(())
}

/// Check `--subvol` against the scanned source, before any image is
/// touched: each names a directory of it (not its root), once, and at
/// most one is the default (mkfs.btrfs's rules).
pub fn check_subvols(listing: &Listing, subvols: &[SubvolSpec]) -> Result<()> {
    let root = &listing.entries[0].path;
    for (i, s) in subvols.iter().enumerate() {
        if subvols[..i].iter().any(|o| o.path == s.path) {
            return Err(Error::Invalid(format!(
                "--subvol {} is given twice",
                s.path.display()
            )));
        }
        let found = listing
            .entries
            .iter()
            .find(|e| e.path.strip_prefix(root).ok() == Some(&s.path));
        match found {
            Some(e) if e.meta.is_dir() => {}
            Some(_) => {
                return Err(Error::Invalid(format!(
                    "--subvol {}: not a directory in {}",
                    s.path.display(),
                    root.display()
                )))
            }
            None => {
                return Err(Error::Invalid(format!(
                    "--subvol {}: no such directory in {}",
                    s.path.display(),
                    root.display()
                )))
            }
        }
    }
    if subvols.iter().filter(|s| s.default).count() > 1 {
        return Err(Error::Invalid(
            "--subvol: only one subvolume can be the default".into(),
        ));
    }
    Ok(())
}

/// One entry of the scanned source tree, in copy order (parents first).
#[derive(Clone, Debug)]
pub struct Entry {
    /// Path of the entry on the host.
    pub path: PathBuf,
    /// Index of the parent entry in the listing (None for the root).
    pub parent: Option<usize>,
    /// File name within the parent directory, as raw bytes (empty for the root).
    pub name: Vec<u8>,
    /// The entry's own metadata (`lstat`: symlinks are not followed).
    pub meta: std::fs::Metadata,
}

/// The source tree of `--rootdir` as [`scan`] found it.
#[derive(Debug, Default)]
pub struct Listing {
    /// Every entry, breadth first: the source root, then each directory's
    /// children (sorted by name) after it.
    pub entries: Vec<Entry>,
    /// Sum of the sizes of the regular files, in bytes, counted once per name
    /// (hard links counted each time).
    pub total_bytes: u64,
}

impl Listing {
    /// A device size that holds this tree for certain, for an image file
    /// made without `-b`: twice the data and 4 KiB per entry (a second copy
    /// of everything, as DUP metadata and a worst case of small files
    /// inline), plus 256 MiB for the first chunks. The file is sparse, and
    /// `--shrink` cuts it to what was used.
    pub fn estimated_device_size(&self) -> u64 {
        let per_entry = 4096u64.saturating_mul(self.entries.len() as u64);
        let need = self
            .total_bytes
            .saturating_add(per_entry)
            .saturating_mul(2)
            .saturating_add(256 << 20);
        need.div_ceil(1 << 20).saturating_mul(1 << 20)
    }
}

fn io_err(p: &Path, what: &str, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

/// Walk `root` (not following symlinks), checking every entry is readable.
pub fn scan(root: &Path) -> Result<Listing> {
    let meta = std::fs::symlink_metadata(root).map_err(|e| io_err(root, "cannot stat", e))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    let mut l = Listing::default();
    l.entries.push(Entry {
        path: root.to_path_buf(),
        parent: None,
        name: Vec::new(),
        meta,
    });
    let mut i = 0;
    while i < l.entries.len() {
        if l.entries[i].meta.is_dir() {
            let p = l.entries[i].path.clone();
            let rd = std::fs::read_dir(&p).map_err(|e| io_err(&p, "cannot read directory", e))?;
            let mut kids: Vec<(Vec<u8>, PathBuf)> = Vec::new();
            for de in rd {
                let de = de.map_err(|e| io_err(&p, "cannot read directory", e))?;
                kids.push((de.file_name().as_bytes().to_vec(), de.path()));
            }
            kids.sort();
            for (name, path) in kids {
                if name.len() > BTRFS_NAME_LEN {
                    return Err(Error::Invalid(format!(
                        "{}: name longer than {BTRFS_NAME_LEN} bytes",
                        path.display()
                    )));
                }
                let m = std::fs::symlink_metadata(&path)
                    .map_err(|e| io_err(&path, "cannot stat", e))?;
                if m.is_file() {
                    // Fail now rather than half-way through the copy. The
                    // permission check is enough (an open and a close per
                    // file cost a fifth of the scan); the copy's own open
                    // still reports whatever else goes wrong.
                    readable(&path)?;
                    l.total_bytes += m.len();
                } else if m.file_type().is_symlink() {
                    std::fs::read_link(&path).map_err(|e| io_err(&path, "cannot read link", e))?;
                }
                l.entries.push(Entry {
                    path,
                    parent: Some(i),
                    name,
                    meta: m,
                });
            }
        }
        i += 1;
    }
    Ok(l)
}

/// Whether this process may read `path`.
fn readable(path: &Path) -> Result<()> {
    crate::io::host::readable(path).map_err(|e| io_err(path, "cannot read", e))
}

/// A host time as stat(2) gives it: seconds negative before 1970 (kept so,
/// as the kernel stores them), nanoseconds in 0..10^9.
fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec::new(
        sec,
        nsec.clamp(0, i64::from(crate::format::inode::MAX_NSEC)) as u32,
    )
}

fn inode_from(m: &std::fs::Metadata, transid: u64) -> InodeItem {
    let mut i = InodeItem::new_zeroed();
    i.generation.set(transid);
    i.transid.set(transid);
    i.nlink.set(1);
    i.uid.set(m.uid());
    i.gid.set(m.gid());
    i.mode.set(m.mode());
    // The host's st_rdev in the kernel's own encoding.
    let (major, minor) = (libc::major(m.rdev()), libc::minor(m.rdev()));
    i.rdev.set(crate::fs::inode::encode_dev(major, minor));
    i.atime = ts(m.atime(), m.atime_nsec());
    i.mtime = ts(m.mtime(), m.mtime_nsec());
    i.ctime = ts(m.ctime(), m.ctime_nsec());
    i.otime = i.ctime;
    i
}

/// A directory made by the filesystem (a root directory) takes its source
/// directory's mode, owners and times.
fn take_attrs(item: &mut InodeItem, src: &InodeItem) {
    item.mode = src.mode;
    item.uid = src.uid;
    item.gid = src.gid;
    item.atime = src.atime;
    item.mtime = src.mtime;
    item.ctime = src.ctime;
}

fn xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    crate::io::host::xattrs(path).map_err(|e| io_err(path, "cannot read xattrs of", e))
}

/// Data ranges of a file (SEEK_DATA/SEEK_HOLE), sector aligned outward.
/// A file with as many 512-byte blocks allocated as its size needs has no
/// hole to find (two lseeks saved per file; blocks of an extent tree can
/// hide a hole of as many blocks, which is then kept as zeros, as a
/// reader sees it).
fn data_ranges(f: &std::fs::File, meta: &std::fs::Metadata, ss: u64) -> Vec<(u64, u64)> {
    let size = meta.len();
    if size == 0 {
        return Vec::new();
    }
    if meta.blocks().saturating_mul(512) >= size.div_ceil(ss) * ss {
        return vec![(0, size.div_ceil(ss) * ss)];
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (d, h) in crate::io::host::data_runs(f, 0, size) {
        let s = d / ss * ss;
        let e = h.div_ceil(ss) * ss;
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Where a regular file's data comes from: read ahead in full, or an open
/// file read extent by extent.
enum FileSource<'a> {
    Read {
        ranges: Vec<(u64, u64)>,
        data: Vec<u8>,
    },
    Open {
        f: std::fs::File,
        ranges: Vec<(u64, u64)>,
        path: &'a Path,
    },
}

impl FileSource<'_> {
    fn ranges(&self) -> &[(u64, u64)] {
        match self {
            FileSource::Read { ranges, .. } | FileSource::Open { ranges, .. } => ranges,
        }
    }
    /// `len` bytes at `off` (within the file) into `buf`.
    fn read<'b>(&'b self, off: u64, len: u64, buf: &'b mut Vec<u8>) -> Result<&'b [u8]> {
        match self {
            FileSource::Read { data, .. } => Ok(&data[off as usize..(off + len) as usize]),
            FileSource::Open { f, path, .. } => {
                buf.resize(len as usize, 0);
                f.read_exact_at(buf, off)
                    .map_err(|err| io_err(path, "cannot read", err))?;
                Ok(&buf[..])
            }
        }
    }
}

/// Decide how a file's data is stored and hand each piece to `sink`:
/// inline when small, else one extent per data range (at most
/// MAX_EXTENT_SIZE each), holes left sparse (or explicit hole extents
/// without no-holes). Returns the inode's nbytes and the inode flags
/// compression gave it. `inline_cap`: the most bytes stored inline
/// ([`crate::fs::extents::inline_cap`]).
///
/// With `compress` (mkfs.btrfs `--compress`), as the kernel's writeback
/// compresses a file written whole under `-o compress` (compress_file_range):
/// a small file is stored inline compressed when its compressed bytes fit
/// max_inline; a larger one in runs of 512 KiB, compressed while the inode
/// has not given up (NOCOMPRESS) and the heuristic finds the rest of the
/// run compressible, in extents of 128 KiB kept where they save a sector;
/// the first that does not marks the inode NOCOMPRESS and the rest of its
/// run goes plain. With `force` (`-o compress-force`), as the kernel does
/// then: no heuristic, and a piece that does not shrink leaves the rest of
/// its run plain but marks nothing, so every run is tried again. As under
/// the mount option, no inode is marked COMPRESS
/// (mkfs.btrfs 6.14 marks the files it compressed; the kernel's writeback
/// does not, and a file compressed in part and then given up on would
/// carry both flags, which the tree checker refuses).
#[allow(clippy::too_many_arguments)]
fn copy_file_data(
    sink: &mut dyn DataSink,
    ss: u64,
    inline_cap: u64,
    size: u64,
    src: &FileSource<'_>,
    no_holes: bool,
    compress: Option<Method>,
    force: bool,
    buf: &mut Vec<u8>,
) -> Result<(u64, u64)> {
    let can_inline = |n: u64| n > 0 && n <= inline_cap;
    let mut flags = 0u64;
    if size == 0 {
        return Ok((0, flags));
    }
    // A file within the first sector compressed: inline when its
    // compressed bytes fit (the kernel's writeback inlines up to max_inline
    // of compressed bytes, so a sector's worth of text goes inline too).
    if let (Some(m), true) = (compress, size <= ss && !src.ranges().is_empty()) {
        let d = src.read(0, size, buf)?;
        let c = (force || compress::heuristic(d))
            .then(|| compress::compress(m, d, ss as usize))
            .flatten();
        if let Some(c) = c {
            if can_inline(c.len() as u64) {
                sink.inline(size, m.kind, &c)?;
                return Ok((size, flags));
            }
        }
    }
    if can_inline(size) {
        if src.ranges().is_empty() {
            return Ok((0, flags));
        }
        let d = src.read(0, size, buf)?;
        sink.inline(size, BTRFS_COMPRESS_NONE, d)?;
        return Ok((size, flags));
    }
    let mut nbytes = 0u64;
    let mut covered = 0u64;
    for &(s, e) in src.ranges() {
        if !no_holes && s > covered {
            sink.hole(covered, s - covered)?;
        }
        let mut off = s;
        // End of the current compression run (512 KiB), and whether its
        // remaining pieces are compressed.
        let mut run_end = off;
        let mut run_compressed = false;
        while off < e {
            if let Some(m) = compress {
                if off >= run_end {
                    run_end = (off + COMPRESS_RUN).min(e);
                    run_compressed = force || flags & BTRFS_INODE_NOCOMPRESS == 0;
                }
                // Before each piece, the heuristic looks at the rest of the
                // run (inode_need_compress on [start, end] of the async
                // chunk); a no leaves the rest plain, unmarked.
                if run_compressed && !force {
                    let sample_end = run_end.min(size).max(off);
                    run_compressed = sample_end > off
                        && compress::heuristic(src.read(off, sample_end - off, buf)?);
                }
                let len = (run_end - off).min(if run_compressed {
                    MAX_COMPRESSED
                } else {
                    MAX_EXTENT_SIZE
                });
                let want = len.min(size.saturating_sub(off));
                let d = src.read(off, want, buf)?;
                let total = want.div_ceil(ss) * ss;
                let kept = (run_compressed && want > 0)
                    .then(|| compress::compress(m, d, ss as usize))
                    .flatten()
                    .filter(|c| compress::saves_a_sector(c.len(), total, ss));
                match kept {
                    Some(c) => {
                        sink.compressed(off, c, total, m.kind)?;
                        nbytes += total;
                    }
                    None => {
                        if run_compressed {
                            // Gave up: the rest of the run (and, unless
                            // forced, every later run) goes plain.
                            if !force {
                                flags |= BTRFS_INODE_NOCOMPRESS;
                            }
                            run_compressed = false;
                            continue;
                        }
                        sink.plain(off, d)?;
                        nbytes += total;
                    }
                }
                off += len;
                continue;
            }
            let len = (e - off).min(MAX_EXTENT_SIZE);
            let want = len.min(size.saturating_sub(off));
            let d = src.read(off, want, buf)?;
            sink.plain(off, d)?;
            nbytes += want.div_ceil(ss) * ss;
            off += len;
        }
        covered = e;
    }
    let end = size.div_ceil(ss) * ss;
    if !no_holes && covered < end {
        sink.hole(covered, end - covered)?;
    }
    Ok((nbytes, flags))
}

/// Where [`copy_file_data`]'s decisions go: into the filesystem at once
/// ([`WriteSink`]), or recorded by a reader thread ([`Plan`]) and written
/// later in copy order.
trait DataSink {
    /// The whole file inline: `size` bytes, stored as `bytes` (compressed
    /// with `kind`, or the bytes themselves).
    fn inline(&mut self, size: u64, kind: u8, bytes: &[u8]) -> Result<()>;
    /// An explicit hole (filesystems without no-holes).
    fn hole(&mut self, off: u64, len: u64) -> Result<()>;
    /// An uncompressed extent of the file's bytes `data` at `off`.
    fn plain(&mut self, off: u64, data: &[u8]) -> Result<()>;
    /// A compressed extent at `off` holding `ram` bytes.
    fn compressed(&mut self, off: u64, disk: Vec<u8>, ram: u64, kind: u8) -> Result<()>;
}

/// Writes each piece into inode `ino` of subvolume `tree`.
struct WriteSink<'a> {
    fs: &'a mut Store,
    tree: u64,
    ino: u64,
    /// Checksum the data (not for NODATASUM inodes).
    datasum: bool,
    /// `--reflink`: the source file, whose blocks plain extents share.
    shared: Option<&'a std::fs::File>,
}

impl DataSink for WriteSink<'_> {
    fn inline(&mut self, size: u64, kind: u8, bytes: &[u8]) -> Result<()> {
        data::write_inline(self.fs, self.tree, self.ino, size, kind, bytes)
    }
    fn hole(&mut self, off: u64, len: u64) -> Result<()> {
        data::write_hole(self.fs, self.tree, self.ino, off, len)
    }
    fn plain(&mut self, off: u64, d: &[u8]) -> Result<()> {
        match self.shared {
            Some(src) => {
                data::clone_extent(self.fs, self.tree, self.ino, off, d, self.datasum, src, off)
            }
            None => data::write_extent(self.fs, self.tree, self.ino, off, d, self.datasum),
        }
        .map(|_| ())
    }
    fn compressed(&mut self, off: u64, disk: Vec<u8>, ram: u64, kind: u8) -> Result<()> {
        data::write_compressed_extent(self.fs, self.tree, self.ino, off, &disk, ram, kind)
            .map(|_| ())
    }
}

/// One recorded piece of a [`Plan`]; plain extents name their bytes by
/// range (the file's data travels with the plan).
enum Step {
    Inline {
        size: u64,
        kind: u8,
        bytes: Vec<u8>,
    },
    Hole {
        off: u64,
        len: u64,
    },
    Plain {
        off: u64,
        len: usize,
    },
    Compressed {
        off: u64,
        disk: Vec<u8>,
        ram: u64,
        kind: u8,
    },
}

/// A file's pieces decided on a reader thread (its compression work done
/// there), with the nbytes and flags they give.
#[derive(Default)]
struct Plan {
    steps: Vec<Step>,
    nbytes: u64,
    flags: u64,
}

impl DataSink for Plan {
    fn inline(&mut self, size: u64, kind: u8, bytes: &[u8]) -> Result<()> {
        self.steps.push(Step::Inline {
            size,
            kind,
            bytes: bytes.to_vec(),
        });
        Ok(())
    }
    fn hole(&mut self, off: u64, len: u64) -> Result<()> {
        self.steps.push(Step::Hole { off, len });
        Ok(())
    }
    fn plain(&mut self, off: u64, d: &[u8]) -> Result<()> {
        self.steps.push(Step::Plain { off, len: d.len() });
        Ok(())
    }
    fn compressed(&mut self, off: u64, disk: Vec<u8>, ram: u64, kind: u8) -> Result<()> {
        self.steps.push(Step::Compressed {
            off,
            disk,
            ram,
            kind,
        });
        Ok(())
    }
}

impl Plan {
    /// Write the recorded pieces; `data` is the file's contents.
    fn write(self, sink: &mut WriteSink<'_>, data: &[u8]) -> Result<()> {
        for s in self.steps {
            match s {
                Step::Inline { size, kind, bytes } => sink.inline(size, kind, &bytes)?,
                Step::Hole { off, len } => sink.hole(off, len)?,
                Step::Plain { off, len } => {
                    sink.plain(off, &data[off as usize..off as usize + len])?
                }
                Step::Compressed {
                    off,
                    disk,
                    ram,
                    kind,
                } => sink.compressed(off, disk, ram, kind)?,
            }
        }
        Ok(())
    }
}

/// The range the kernel's writeback compresses as one (an async chunk of
/// compress_file_range): the heuristic and NOCOMPRESS are looked at once
/// per run.
const COMPRESS_RUN: u64 = 512 << 10;

/// Copy the scanned tree into the fs tree. Commits every `COMMIT_EVERY`
/// inodes and at the end.
/// Contents of a small regular file, read ahead by the reader thread.
struct Prefetched {
    ranges: Vec<(u64, u64)>,
    data: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// With compression: the file's pieces, decided (and compressed) on
    /// the reader thread.
    plan: Option<Plan>,
}

/// What a reader thread needs to decide a file's pieces.
#[derive(Clone, Copy)]
struct PlanArgs {
    ss: u64,
    inline_cap: u64,
    no_holes: bool,
    compress: Option<Method>,
    compress_force: bool,
}

/// Files up to this size are read ahead on a second thread, so reading the
/// source overlaps with building trees and writing the image.
const PREFETCH_MAX: u64 = 4 << 20;

fn prefetchable(e: &Entry) -> bool {
    e.parent.is_some() && e.meta.is_file() && e.meta.len() <= PREFETCH_MAX && (e.meta.nlink() <= 1)
}

fn prefetch(e: &Entry, a: PlanArgs) -> Result<Prefetched> {
    let ss = a.ss;
    let size = e.meta.len();
    let f = std::fs::File::open(&e.path).map_err(|err| io_err(&e.path, "cannot read", err))?;
    let mut data = vec![0u8; size as usize];
    f.read_exact_at(&mut data, 0)
        .map_err(|err| io_err(&e.path, "cannot read", err))?;
    unchanged(&e.path, &e.meta, f.metadata())?;
    let ranges = if size > 0 {
        data_ranges(&f, &e.meta, ss)
    } else {
        Vec::new()
    };
    let mut p = Prefetched {
        ranges,
        data,
        xattrs: xattrs(&e.path)?,
        plan: None,
    };
    if a.compress.is_some() {
        let src = FileSource::Read {
            ranges: std::mem::take(&mut p.ranges),
            data: std::mem::take(&mut p.data),
        };
        let mut plan = Plan::default();
        let mut buf = Vec::new();
        let (nbytes, flags) = copy_file_data(
            &mut plan,
            ss,
            a.inline_cap,
            size,
            &src,
            a.no_holes,
            a.compress,
            a.compress_force,
            &mut buf,
        )?;
        plan.nbytes = nbytes;
        plan.flags = flags;
        if let FileSource::Read { ranges, data } = src {
            p.ranges = ranges;
            p.data = data;
        }
        p.plan = Some(plan);
    }
    Ok(p)
}

/// Copy the scanned tree into the top-level subvolume (fs tree 5): the
/// root directory takes the source root's mode, owners, times and xattrs;
/// hard links are found by (device, inode). Reading runs ahead on a helper
/// thread. Commits after every 50,000 new inodes or every sixteenth of the
/// filesystem size of file data (at least 64 MiB, at most 1 GiB), and once
/// at the end. `progress(entries, bytes)` is called after each new inode
/// with the files, directories and symlinks made so far and the file bytes
/// copied. The superblock stays held until [`super::finish`].
pub fn populate(
    fs: &mut Store,
    listing: &Listing,
    opts: &RootdirOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RootdirStats> {
    let ss = fs.sectorsize() as u64;
    // The small files, numbered in copy order, are read by READERS threads
    // in turn (reader k takes every READERS-th from the k-th): a cold
    // source is read several requests at a time (eight keep a virtual
    // disk's queue busy while two cores compress), and the copy takes them
    // back in order, from each reader's channel in turn. What is read and
    // not yet taken is bounded by bytes (READ_AHEAD), not only by files.
    const READERS: usize = 8;
    let budget = ReadBudget::new(READ_AHEAD);
    let args = PlanArgs {
        ss,
        inline_cap: crate::fs::extents::inline_cap(fs, MAX_INLINE),
        no_holes: fs.sb().incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_NO_HOLES != 0,
        compress: opts.compress,
        compress_force: opts.compress_force,
    };
    let small: Vec<usize> = (0..listing.entries.len())
        .filter(|&i| prefetchable(&listing.entries[i]))
        .collect();
    std::thread::scope(|scope| {
        let mut rxs = Vec::with_capacity(READERS);
        for k in 0..READERS {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Result<Prefetched>)>(256);
            rxs.push(rx);
            let small = &small;
            let budget = &budget;
            scope.spawn(move || {
                for (seq, &i) in small.iter().enumerate().skip(k).step_by(READERS) {
                    budget.take(seq, listing.entries[i].meta.len());
                    if tx.send((i, prefetch(&listing.entries[i], args))).is_err() {
                        return;
                    }
                }
            });
        }
        // File data reaches the image on a thread of its own, so copying
        // it into the page cache overlaps with building the trees.
        fs.data().start_data_writer()?;
        let mut seq = 0usize;
        let r = populate_with(fs, listing, opts, progress, &mut |i| {
            let got = rxs[seq % READERS].recv();
            seq += 1;
            budget.give(listing.entries[i].meta.len());
            match got {
                Ok((j, r)) if j == i => r,
                Ok((j, _)) => Err(Error::Invalid(format!(
                    "reader out of step: entry {j} for {i}"
                ))),
                Err(_) => Err(Error::Internal("reader thread stopped".into())),
            }
        });
        // Readers blocked on a full channel stop once theirs is dropped,
        // those waiting for the budget once it is closed.
        drop(rxs);
        budget.close();
        let stopped = fs.data().stop_data_writer();
        r.and_then(|st| stopped.map(|_| st))
    })
}

/// Bytes of file data the readers may hold read ahead of the copy.
const READ_AHEAD: u64 = 256 << 20;

/// The bytes read ahead and not yet taken by the copy, bounded: a reader
/// waits before reading a file that would pass the limit (unless nothing
/// is held, so a file larger than the limit is still read). The file the
/// copy waits for next never waits: what is held is then files after it,
/// which only the copy's progress frees.
struct ReadBudget {
    state: std::sync::Mutex<BudgetState>,
    freed: std::sync::Condvar,
    limit: u64,
}

#[derive(Default)]
struct BudgetState {
    held: u64,
    /// Files the copy has taken (the copy-order number of the one it
    /// waits for).
    taken: usize,
    closed: bool,
}

impl ReadBudget {
    fn new(limit: u64) -> ReadBudget {
        ReadBudget {
            state: std::sync::Mutex::new(BudgetState::default()),
            freed: std::sync::Condvar::new(),
            limit,
        }
    }
    /// Wait for room for the `n` bytes of file `seq` (copy order), and
    /// hold them.
    fn take(&self, seq: usize, n: u64) {
        let Ok(mut g) = self.state.lock() else { return };
        while !g.closed && seq != g.taken && g.held > 0 && g.held + n > self.limit {
            match self.freed.wait(g) {
                Ok(x) => g = x,
                Err(_) => return,
            }
        }
        g.held += n;
    }
    /// The copy took the next file, of `n` bytes.
    fn give(&self, n: u64) {
        if let Ok(mut g) = self.state.lock() {
            g.held = g.held.saturating_sub(n);
            g.taken += 1;
        }
        self.freed.notify_all();
    }
    /// The copy is over: nobody waits any more.
    fn close(&self) {
        if let Ok(mut g) = self.state.lock() {
            g.closed = true;
        }
        self.freed.notify_all();
    }
}

fn populate_with(
    fs: &mut Store,
    listing: &Listing,
    opts: &RootdirOptions,
    progress: &mut dyn FnMut(u64, u64),
    next: &mut dyn FnMut(usize) -> Result<Prefetched>,
) -> Result<RootdirStats> {
    // Commit points bound both memory (dirty tree blocks) and what running
    // out of space can lose.
    const COMMIT_EVERY: u64 = 50_000;
    // A sixteenth of the filesystem between commits, so running out of space
    // loses at most that much, without a flush every few megabytes.
    let commit_bytes: u64 = (fs.sb().total_bytes.get() / 16).clamp(64 << 20, 1 << 30);
    let mut bytes_at_commit = 0u64;
    let top = BTRFS_FS_TREE_OBJECTID;
    let ss = fs.sectorsize() as u64;
    let no_holes = fs.sb().incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_NO_HOLES != 0;
    let inline_cap = crate::fs::extents::inline_cap(fs, MAX_INLINE);
    let mut st = RootdirStats::default();
    // Per entry: its inode number; per directory: the next dir index.
    let mut ino_of: Vec<u64> = vec![0; listing.entries.len()];
    // Per entry: the subvolume it is in; per subvolume: its next inode.
    let mut tree_of: Vec<u64> = vec![top; listing.entries.len()];
    let mut next_ino_of: HashMap<u64, u64> = HashMap::new();
    let mut next_subvol = BTRFS_FIRST_FREE_OBJECTID;
    let root_path = &listing.entries[0].path;
    let mut next_index: HashMap<usize, u64> = HashMap::new();
    let mut links: HashMap<(u64, u64, u64), u64> = HashMap::new();
    next_ino_of.insert(top, BTRFS_FIRST_FREE_OBJECTID + 1);
    let mut since_commit = 0u64;
    let mut buf: Vec<u8> = Vec::new();
    ino_of[0] = BTRFS_FIRST_FREE_OBJECTID;
    next_index.insert(0, 2);
    for (i, e) in listing.entries.iter().enumerate() {
        let Some(parent) = e.parent else { continue };
        let pino = ino_of[parent];
        let tree = tree_of[parent];
        let m = &e.meta;
        let ftype = ftype_of_mode(m.mode());
        let idx = next_index
            .get_mut(&parent)
            .ok_or_else(|| Error::Invalid("parent not a directory".into()))?;
        let index = *idx;
        *idx += 1;
        // A directory named by --subvol: a new subvolume in its place,
        // its root directory taking the source directory's attributes.
        let rel = e.path.strip_prefix(root_path).unwrap_or(&e.path);
        if let Some(sv) = m
            .is_dir()
            .then(|| opts.subvols.iter().find(|s| s.path == rel))
            .flatten()
        {
            let id = next_subvol;
            next_subvol += 1;
            let src = inode_from(m, fs.transid());
            let mut item = crate::fs::subvol::create_subvol_tree(fs, id, src.ctime, sv.readonly)?;
            crate::fs::subvol::link_subvol_items(fs, tree, pino, &e.name, id, 0, index)?;
            if sv.default {
                crate::fs::subvol::set_default_subvol_item(fs, id, 0)?;
            }
            take_attrs(&mut item, &src);
            item.otime = src.otime;
            put_inode(fs, id, BTRFS_FIRST_FREE_OBJECTID, &item)?;
            for (n, v) in xattrs(&e.path)? {
                let t = fs.transid();
                xattr::set_xattr(fs, id, BTRFS_FIRST_FREE_OBJECTID, &n, &v, t)?;
            }
            ino_of[i] = BTRFS_FIRST_FREE_OBJECTID;
            tree_of[i] = id;
            next_ino_of.insert(id, BTRFS_FIRST_FREE_OBJECTID + 1);
            next_index.insert(i, 2);
            st.subvols += 1;
            continue;
        }
        tree_of[i] = tree;
        let forced: u64 = opts
            .inode_flags
            .iter()
            .filter(|(p, _)| rel.starts_with(p))
            .fold(0, |a, (_, f)| a | f);
        // Hard links: a second name for an inode already copied (in the
        // same subvolume: a link cannot cross one).
        if !m.is_dir() && m.nlink() > 1 {
            if let Some(&ino) = links.get(&(tree, m.dev(), m.ino())) {
                let t = fs.transid();
                names::add_name(fs, tree, pino, inode_key(ino), &e.name, ftype, index, t)?;
                if let Some(mut item) = get_inode(fs, tree, ino)? {
                    item.nlink.set(item.nlink.get() + 1);
                    put_inode(fs, tree, ino, &item)?;
                }
                ino_of[i] = ino;
                st.hardlinks += 1;
                continue;
            }
        }
        let next_ino = next_ino_of
            .entry(tree)
            .or_insert(BTRFS_FIRST_FREE_OBJECTID + 1);
        let ino = *next_ino;
        *next_ino += 1;
        ino_of[i] = ino;
        let t = fs.transid();
        names::add_name(fs, tree, pino, inode_key(ino), &e.name, ftype, index, t)?;
        let mut item = inode_from(m, fs.transid());
        item.flags.set(item.flags.get() | forced);
        let mut pre_xattrs: Option<Vec<(Vec<u8>, Vec<u8>)>> = None;
        if m.is_dir() {
            next_index.insert(i, 2);
            st.dirs += 1;
        } else if m.file_type().is_symlink() {
            let target = std::fs::read_link(&e.path)
                .map_err(|err| io_err(&e.path, "cannot read link", err))?;
            let tb = target.as_os_str().as_bytes();
            data::write_inline(fs, tree, ino, tb.len() as u64, BTRFS_COMPRESS_NONE, tb)?;
            item.size.set(tb.len() as u64);
            item.nbytes.set(tb.len() as u64);
            st.symlinks += 1;
        } else if m.is_file() {
            let size = m.len();
            let mut plan = None;
            let src = if prefetchable(e) {
                let p = next(i)?;
                pre_xattrs = Some(p.xattrs);
                plan = p.plan;
                FileSource::Read {
                    ranges: p.ranges,
                    data: p.data,
                }
            } else {
                let f = std::fs::File::open(&e.path)
                    .map_err(|err| io_err(&e.path, "cannot read", err))?;
                let ranges = if size > 0 {
                    data_ranges(&f, &e.meta, ss)
                } else {
                    Vec::new()
                };
                FileSource::Open {
                    f,
                    ranges,
                    path: &e.path,
                }
            };
            // NODATASUM data is neither checksummed nor compressed (the
            // kernel compresses only checksummed data).
            let datasum = forced & BTRFS_INODE_NODATASUM == 0;
            // --reflink: extents share the file's blocks (a file stored
            // inline has none to share).
            let reopened;
            let shared = match &src {
                _ if !opts.reflink || size <= inline_cap => None,
                FileSource::Open { f, .. } => Some(f),
                FileSource::Read { .. } => {
                    reopened = std::fs::File::open(&e.path)
                        .map_err(|err| io_err(&e.path, "cannot read", err))?;
                    Some(&reopened)
                }
            };
            let mut sink = WriteSink {
                fs,
                tree,
                ino,
                datasum,
                shared,
            };
            let (nbytes, flags) = match (plan.filter(|_| datasum), &src) {
                (Some(plan), FileSource::Read { data, .. }) => {
                    let r = (plan.nbytes, plan.flags);
                    plan.write(&mut sink, data)?;
                    r
                }
                _ => copy_file_data(
                    &mut sink,
                    ss,
                    inline_cap,
                    size,
                    &src,
                    no_holes,
                    opts.compress.filter(|_| datasum),
                    opts.compress_force,
                    &mut buf,
                )?,
            };
            if let FileSource::Open { f, path, .. } = &src {
                unchanged(path, m, f.metadata())?;
            } else if let Some(f) = shared {
                // Read ahead, then shared: the blocks must still be the
                // bytes the checksums were made from.
                unchanged(&e.path, m, f.metadata())?;
            }
            item.size.set(size);
            item.nbytes.set(nbytes);
            item.flags.set(item.flags.get() | flags);
            st.files += 1;
            st.bytes += size;
        } else {
            st.special += 1;
        }
        let xa = match pre_xattrs.take() {
            Some(x) => x,
            None => xattrs(&e.path)?,
        };
        put_inode(fs, tree, ino, &item)?;
        for (n, v) in xa {
            let t = fs.transid();
            xattr::set_xattr(fs, tree, ino, &n, &v, t)?;
        }
        if !m.is_dir() && m.nlink() > 1 {
            links.insert((tree, m.dev(), m.ino()), ino);
        }
        since_commit += 1;
        progress(st.files + st.dirs + st.symlinks, st.bytes);
        if since_commit >= COMMIT_EVERY || st.bytes - bytes_at_commit >= commit_bytes {
            fs.commit()?;
            since_commit = 0;
            bytes_at_commit = st.bytes;
        }
    }
    // Root directory attributes from the source root.
    let root = BTRFS_FIRST_FREE_OBJECTID;
    let tree = top;
    if let Some(mut item) = get_inode(fs, tree, root)? {
        take_attrs(
            &mut item,
            &inode_from(&listing.entries[0].meta, fs.transid()),
        );
        put_inode(fs, tree, root, &item)?;
    }
    for (n, v) in xattrs(&listing.entries[0].path)? {
        let t = fs.transid();
        xattr::set_xattr(fs, tree, root, &n, &v, t)?;
    }
    // A directory whose entries changed since the scan would leave the
    // image without (or with stale) names: refused rather than silent.
    for e in listing.entries.iter().filter(|e| e.meta.is_dir()) {
        unchanged(&e.path, &e.meta, std::fs::symlink_metadata(&e.path))?;
    }
    fs.commit()?;
    Ok(st)
}

/// `path` still has the size and modification time the scan saw: a file
/// or directory written to during the copy is an error naming it (the
/// image would hold neither its old nor its new contents for sure).
fn unchanged(
    path: &Path,
    seen: &std::fs::Metadata,
    now: std::io::Result<std::fs::Metadata>,
) -> Result<()> {
    let now = now.map_err(|e| io_err(path, "cannot stat", e))?;
    if now.len() != seen.len()
        || now.mtime() != seen.mtime()
        || now.mtime_nsec() != seen.mtime_nsec()
    {
        return Err(Error::Invalid(format!(
            "{} changed during the copy (its size or modification time is not what the scan found)",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers interleaved as `populate` runs them, a budget far below
    /// what they read, a copy taking files in order: every file arrives,
    /// nothing waits forever, and the held bytes never pass the limit by
    /// more than the file the copy waits for.
    #[test]
    fn read_budget_never_stalls_the_copy() {
        const N: usize = 2000;
        const READERS: usize = 8;
        let sizes: Vec<u64> = (0..N).map(|i| 1 + (i as u64 * 7919) % 5000).collect();
        let budget = ReadBudget::new(6000);
        let peak = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            let mut rxs = Vec::new();
            for k in 0..READERS {
                let (tx, rx) = std::sync::mpsc::sync_channel::<usize>(4);
                rxs.push(rx);
                let (budget, sizes, peak) = (&budget, &sizes, &peak);
                scope.spawn(move || {
                    for seq in (k..N).step_by(READERS) {
                        budget.take(seq, sizes[seq]);
                        if let Ok(g) = budget.state.lock() {
                            peak.fetch_max(g.held, std::sync::atomic::Ordering::Relaxed);
                        }
                        if tx.send(seq).is_err() {
                            return;
                        }
                    }
                });
            }
            for seq in 0..N {
                assert_eq!(rxs[seq % READERS].recv().unwrap(), seq);
                budget.give(sizes[seq]);
            }
            budget.close();
        });
        assert!(peak.into_inner() <= 6000 + 5000);
    }
}
