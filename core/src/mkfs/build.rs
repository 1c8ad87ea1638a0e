//! The whole of `btrkit-mkfs` after its arguments are parsed: the checks
//! made before any image is touched, the image files made or sized, the
//! filesystem made, the directory copied in, quota, `--shrink`, and what
//! happens to the images when a step fails.
//!
//! The failure policy: a failed mkfs never leaves images that look like a
//! finished filesystem and are not one. What is checked before the images
//! are written (paths, the source, `--reflink`) refuses with the images as
//! they were; making the filesystem zeroes the old superblocks first and
//! holds the new ones back, so a failure there leaves no filesystem
//! ([`Left::NotMade`]). Once a `--rootdir` copy has begun every commit is
//! a valid filesystem: running out of space keeps what was committed
//! ([`Left::Partial`]), any other failure zeroes the superblocks again
//! ([`Left::Unusable`]). Image files it created are removed unless they
//! hold a filesystem.

use super::rootdir::{self, Listing, RootdirOptions, RootdirStats, SubvolSpec};
use super::{MkfsOptions, MkfsSummary};
use crate::io::{BlockDevice, FileDevice};
use crate::trans::Store;
use crate::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What to make: the parsed options of `btrkit-mkfs`.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The image files or block devices, devids 1.. in this order.
    pub images: Vec<PathBuf>,
    /// The filesystem's options.
    pub options: MkfsOptions,
    /// `--rootdir`: the directory copied in.
    pub rootdir: Option<PathBuf>,
    /// `--subvol`: directories of the source made subvolumes.
    pub subvols: Vec<SubvolSpec>,
    /// `--inode-flags`: inode flags of paths of the source.
    pub inode_flags: Vec<(PathBuf, u64)>,
    /// `--reflink`: share the source files' blocks with the images.
    pub reflink: bool,
    /// `--shrink`: the smallest filesystem holding the source, the image
    /// file cut to it.
    pub shrink: bool,
    /// `-f`: overwrite an existing filesystem.
    pub force: bool,
}

/// What [`build`] made.
#[derive(Clone, Debug)]
pub struct Built {
    /// The filesystem made (its size the shrunk one after `--shrink`).
    pub summary: MkfsSummary,
    /// What the `--rootdir` copy copied.
    pub stats: Option<RootdirStats>,
}

/// Told how the `--rootdir` copy goes.
pub trait Progress {
    /// The copy begins: `total_bytes` of file data to copy.
    fn start(&mut self, total_bytes: u64);
    /// After each new inode: the files, directories and symlinks made so
    /// far and the file bytes copied.
    fn copied(&mut self, files: u64, bytes: u64);
    /// The copy ended (done or failed).
    fn finish(&mut self);
}

/// A [`Progress`] that shows nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _: u64) {}
    fn copied(&mut self, _: u64, _: u64) {}
    fn finish(&mut self) {}
}

/// What a failed [`build`] left on the images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// No new filesystem: refused before any image was written (the
    /// images as they were), or failed while making it (superblocks
    /// zeroed, no filesystem). The image files it created are removed.
    NotMade,
    /// A valid filesystem holding the files committed before the copy ran
    /// out of space.
    Partial,
    /// The copy failed: the superblocks are zeroed, the images are no
    /// filesystem (when zeroing them failed too, the message says so).
    /// The image files it created are removed.
    Unusable,
}

/// Why [`build`] failed, and what it left on the images.
#[derive(Debug)]
pub struct Failure {
    /// The state of the images.
    pub left: Left,
    /// The whole message: what was being done and why it failed.
    message: String,
    /// The engine's error, when one caused the failure.
    pub error: Option<Error>,
}

impl Failure {
    fn refused(message: String) -> Failure {
        Failure {
            left: Left::NotMade,
            message,
            error: None,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            left: Left::NotMade,
            message: e.to_string(),
            error: Some(e),
        }
    }
}

/// The OS error of a step, with what was being done.
fn io_context(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Failure {
    let what = what.into();
    move |e| Failure::from(Error::io(what, e))
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The message holds the engine error's text: it is not a `source` too,
/// so an error chain shows it once.
impl std::error::Error for Failure {}

/// Make the filesystem `req` asks for, the `--rootdir` copy reported to
/// `progress`. On failure the images are left as [`Failure::left`] says.
pub fn build(req: &Request, progress: &mut dyn Progress) -> Result<Built, Failure> {
    if req.images.is_empty() {
        return Err(Failure::refused("no image given".into()));
    }
    let mut created = Vec::new();
    let r = build_into(req, progress, &mut created);
    if let Err(f) = &r {
        if f.left != Left::Partial {
            // A refused or failed mkfs leaves no file that was not there.
            for p in &created {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    r
}

/// [`build`]'s work; the image files it creates go to `created`.
fn build_into(
    req: &Request,
    progress: &mut dyn Progress,
    created: &mut Vec<PathBuf>,
) -> Result<Built, Failure> {
    check_images(req)?;
    // Scan the source before touching the images: an unreadable entry is
    // reported with the images unchanged.
    let listing = match &req.rootdir {
        Some(dir) => Some(scan_source(req, dir)?),
        None => None,
    };
    if req.reflink {
        check_reflink(req, listing.as_ref())?;
    }
    let devs = open_images(req, listing.as_ref(), created)?;
    let all: Vec<Arc<dyn BlockDevice>> = devs.iter().map(|d| d.1.clone()).collect();
    let (mut fs, staged, mut summary) = super::make_set(devs, &req.options)?;
    let (Some(dir), Some(listing)) = (&req.rootdir, &listing) else {
        if req.options.features.quota {
            super::enable_quota(&mut fs)?;
        }
        super::finish(fs, &staged)?;
        return Ok(Built {
            summary,
            stats: None,
        });
    };
    // From here on every commit is a valid filesystem: running out of
    // space keeps what was committed.
    staged.publish()?;
    let (stats, shrunk) = match fill(req, &mut fs, listing, progress) {
        Ok(r) => r,
        Err(e @ Error::NoSpace(_)) => {
            // The images hold a valid filesystem: they stay.
            return Err(Failure {
                left: Left::Partial,
                message: format!(
                    "{e} while copying {}; the image keeps the files committed before the failure",
                    dir.display()
                ),
                error: Some(e),
            });
        }
        Err(e) => {
            drop(fs);
            for d in &all {
                super::wipe_superblocks(d.as_ref()).map_err(|we| Failure {
                    left: Left::Unusable,
                    message: format!(
                        "copying {} failed ({e}) and its superblocks could not be zeroed: {we}",
                        dir.display()
                    ),
                    error: Some(we),
                })?;
            }
            return Err(Failure {
                left: Left::Unusable,
                message: format!(
                    "copying {} (the image was left unusable): {e}",
                    dir.display()
                ),
                error: Some(e),
            });
        }
    };
    drop(fs);
    if let Some(end) = shrunk {
        cut_image(&req.images[0], end)?;
        summary.filesystem_size = end;
    }
    Ok(Built {
        summary,
        stats: Some(stats),
    })
}

/// The checks of the image paths, before anything is touched.
fn check_images(req: &Request) -> Result<(), Failure> {
    for (i, path) in req.images.iter().enumerate() {
        if req.images[..i].iter().any(|p| same_file(p, path)) {
            return Err(Failure::refused(format!(
                "{} is given twice",
                path.display()
            )));
        }
        if path.exists() && path.is_dir() {
            return Err(Failure::refused(format!(
                "{} is a directory",
                path.display()
            )));
        }
        if path.exists() && !req.force {
            if let Some(what) = existing_filesystem(path)? {
                return Err(Failure::refused(format!(
                    "{} already contains a {what} filesystem; use -f to overwrite it",
                    path.display()
                )));
            }
        }
        if !path.exists() && req.options.size.is_none() && req.rootdir.is_none() {
            return Err(Failure::refused(format!(
                "{} does not exist; give its size with -b",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The `--rootdir` source listed, with the `--subvol` and
/// `--inode-flags` paths found in it.
fn scan_source(req: &Request, dir: &Path) -> Result<Listing, Failure> {
    let l = rootdir::scan(dir)?;
    rootdir::check_subvols(&l, &req.subvols)?;
    rootdir::check_paths(
        &l,
        req.inode_flags.iter().map(|f| f.0.as_path()),
        "--inode-flags",
    )?;
    Ok(l)
}

/// The images opened, made or extended first: a missing image file is
/// created (and recorded in `created`) with the size given or, without
/// one, a size that holds the source for certain (sparse; `--shrink` cuts
/// it); an image file smaller than the size given is extended.
fn open_images(
    req: &Request,
    listing: Option<&Listing>,
    created: &mut Vec<PathBuf>,
) -> Result<Vec<(String, Arc<dyn BlockDevice>)>, Failure> {
    let size_given = req.options.size;
    let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
    for path in &req.images {
        if !path.exists() {
            let f = std::fs::File::create(path)
                .map_err(io_context(format!("cannot create {}", path.display())))?;
            created.push(path.clone());
            let size = size_given.or_else(|| listing.map(|l| l.estimated_device_size()));
            if let Some(size) = size {
                f.set_len(size)
                    .map_err(io_context(format!("cannot size {}", path.display())))?;
            }
        } else if let Some(size) = size_given {
            let meta = std::fs::metadata(path)
                .map_err(io_context(format!("cannot stat {}", path.display())))?;
            if meta.is_file() && meta.len() < size {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .and_then(|f| f.set_len(size))
                    .map_err(io_context(format!("cannot size {}", path.display())))?;
            }
        }
        devs.push((
            path.display().to_string(),
            Arc::new(FileDevice::open(path, true)?),
        ));
    }
    Ok(devs)
}

/// The copy into the published filesystem, then quota and `--shrink`
/// (the device's new end).
fn fill(
    req: &Request,
    fs: &mut Store,
    listing: &Listing,
    progress: &mut dyn Progress,
) -> crate::Result<(RootdirStats, Option<u64>)> {
    let opts = RootdirOptions {
        compress: req.options.compress,
        compress_force: req.options.compress_force,
        subvols: req.subvols.clone(),
        inode_flags: req.inode_flags.clone(),
        reflink: req.reflink,
    };
    progress.start(listing.total_bytes);
    let r = rootdir::populate(fs, listing, &opts, &mut |files, bytes| {
        progress.copied(files, bytes)
    });
    progress.finish();
    let stats = r?;
    if req.options.features.quota {
        super::enable_quota(fs)?;
    }
    let shrunk = if req.shrink {
        Some(super::shrink(fs)?)
    } else {
        None
    };
    Ok((stats, shrunk))
}

/// `--shrink`: the committed filesystem ends at `end`; what lies beyond
/// is no longer part of it, so cutting an image file there cannot lose
/// anything.
fn cut_image(path: &Path, end: u64) -> Result<(), Failure> {
    let cut_failed = io_context(format!("cannot truncate {} to {end} bytes", path.display()));
    let meta =
        std::fs::metadata(path).map_err(io_context(format!("cannot stat {}", path.display())))?;
    if meta.is_file() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.set_len(end).and_then(|_| f.sync_all()))
            .map_err(cut_failed)?;
    }
    Ok(())
}

/// `--reflink` can work, found before any image is touched: image files
/// (not block devices), data not RAID5/6, and the directory of each image
/// able to share a source file's blocks (a reflink into an unnamed
/// temporary file there).
fn check_reflink(req: &Request, listing: Option<&Listing>) -> Result<(), Failure> {
    use crate::format::consts::{BTRFS_BLOCK_GROUP_RAID5, BTRFS_BLOCK_GROUP_RAID6};
    if req
        .options
        .data_profile
        .is_some_and(|p| p & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0)
    {
        return Err(Failure::refused(
            "--reflink cannot be used with RAID5/6 data (parity is computed from the bytes)".into(),
        ));
    }
    let Some(sample) = listing.and_then(|l| {
        l.entries
            .iter()
            .find(|e| e.meta.is_file() && e.meta.len() >= 4096)
    }) else {
        // No file has a whole block to share.
        return Ok(());
    };
    for path in &req.images {
        if path.exists()
            && !std::fs::metadata(path)
                .map_err(io_context(format!("cannot stat {}", path.display())))?
                .is_file()
        {
            return Err(Failure::refused(format!(
                "--reflink needs image files: {} is not a regular file",
                path.display()
            )));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        crate::io::host::probe_clone(&sample.path, 4096, &dir).map_err(|e| {
            Failure::refused(format!(
                "--reflink: {} cannot share the blocks of {}: {} ({e})",
                dir.display(),
                sample.path.display(),
                crate::io::host::clone_failure(&e)
            ))
        })?;
    }
    Ok(())
}

/// Whether two paths name one file (the same device twice would make a
/// set that overwrites itself).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// Name of a filesystem already on `path`, if one is recognised.
pub fn existing_filesystem(path: &Path) -> crate::Result<Option<&'static str>> {
    use std::io::Read;
    let cannot_read = |e| Error::io(format!("cannot open {}", path.display()), e);
    let mut f = std::fs::File::open(path).map_err(cannot_read)?;
    let mut buf = vec![0u8; 65536 + 4096];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
        }
    }
    let buf = &buf[..n];
    if buf.len() >= 65536 + 72 && &buf[65536 + 64..65536 + 72] == b"_BHRfS_M" {
        return Ok(Some("btrfs"));
    }
    if buf.len() >= 4 && &buf[..4] == b"XFSB" {
        return Ok(Some("xfs"));
    }
    if buf.len() >= 1082 && buf[1080] == 0x53 && buf[1081] == 0xef {
        return Ok(Some("ext2/3/4"));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(images: Vec<PathBuf>, size: Option<u64>) -> Request {
        Request {
            images,
            options: MkfsOptions {
                size,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn refusals_leave_the_images_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        // No size for a missing image: nothing is made.
        let f = build(&request(vec![img.clone()], None), &mut NoProgress).unwrap_err();
        assert_eq!(f.left, Left::NotMade);
        assert!(f.to_string().contains("give its size with -b"), "{f}");
        assert!(!img.exists());
        // The same image twice.
        let f = build(
            &request(vec![img.clone(), img.clone()], Some(256 << 20)),
            &mut NoProgress,
        )
        .unwrap_err();
        assert!(f.to_string().contains("is given twice"), "{f}");
        assert!(!img.exists());
        // A made filesystem is not overwritten without force.
        let made = build(
            &request(vec![img.clone()], Some(256 << 20)),
            &mut NoProgress,
        )
        .unwrap();
        assert_eq!(made.summary.filesystem_size, 256 << 20);
        assert_eq!(existing_filesystem(&img).unwrap(), Some("btrfs"));
        let f = build(
            &request(vec![img.clone()], Some(256 << 20)),
            &mut NoProgress,
        )
        .unwrap_err();
        assert_eq!(f.left, Left::NotMade);
        assert!(f.to_string().contains("already contains a btrfs"), "{f}");
    }

    #[test]
    fn a_failed_make_removes_the_image_files_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("small.img");
        // Created, then too small for a filesystem.
        let f = build(&request(vec![img.clone()], Some(1 << 20)), &mut NoProgress).unwrap_err();
        assert_eq!(f.left, Left::NotMade);
        assert!(f.error.is_some());
        assert!(!img.exists(), "a file made for a failed mkfs stays");
    }
}
