//! btrkit-mkfs: create a Btrfs filesystem image, optionally populated from
//! a directory.

mod args;
mod report;

use anyhow::{bail, Context};
use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_core::mkfs::{self, MkfsOptions};
use clap::Parser;
use std::sync::Arc;

fn main() {
    let a = args::Args::parse();
    match run(a) {
        Ok(()) => {}
        Err(e) => {
            eprintln!(
                "btrkit-mkfs: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            std::process::exit(1);
        }
    }
}

fn run(a: args::Args) -> anyhow::Result<()> {
    if args::lists_features(&a) {
        print!("{}", btrkit_core::mkfs::Features::list_all());
        return Ok(());
    }
    if a.images.is_empty() {
        bail!("no image given (usage: btrkit-mkfs [OPTIONS] IMAGE...)");
    }
    let mut created = Vec::new();
    let r = make(&a, &mut created);
    if r.is_err() {
        // A refused or failed mkfs leaves no file that was not there.
        for p in &created {
            let _ = std::fs::remove_file(p);
        }
    }
    r
}

/// [`run`]'s work; the image files it creates go to `created`.
fn make(a: &args::Args, created: &mut Vec<std::path::PathBuf>) -> anyhow::Result<()> {
    let opts: MkfsOptions = a.options()?;
    for (i, path) in a.images.iter().enumerate() {
        if a.images[..i].iter().any(|p| same_file(p, path)) {
            bail!("{} is given twice", path.display());
        }
        if path.exists() && path.is_dir() {
            bail!("{} is a directory", path.display());
        }
        if path.exists() && !a.force {
            if let Some(what) = args::existing_filesystem(path)? {
                bail!(
                    "{} already contains a {what} filesystem; use -f to overwrite it",
                    path.display()
                );
            }
        }
        if !path.exists() && opts.size.is_none() && a.rootdir.is_none() {
            bail!("{} does not exist; give its size with -b", path.display());
        }
    }
    // Scan the source before touching the images: an unreadable entry is
    // reported with the images unchanged.
    let subvols = a.subvols()?;
    let inode_flags = a.inode_flags()?;
    let listing = match &a.rootdir {
        Some(dir) => {
            let l = mkfs::rootdir::scan(dir)?;
            mkfs::rootdir::check_subvols(&l, &subvols)?;
            mkfs::rootdir::check_paths(
                &l,
                inode_flags.iter().map(|f| f.0.as_path()),
                "--inode-flags",
            )?;
            Some(l)
        }
        None => None,
    };
    if a.reflink {
        check_reflink(a, &opts, listing.as_ref())?;
    }
    let rootdir_opts = mkfs::rootdir::RootdirOptions {
        compress: opts.compress,
        subvols,
        inode_flags,
        reflink: a.reflink,
    };
    let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
    for path in &a.images {
        if !path.exists() {
            let f = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            created.push(path.clone());
            // Without -b, a new image file holds the source for certain
            // (sparse; --shrink cuts it).
            let size = opts
                .size
                .or_else(|| listing.as_ref().map(|l| l.estimated_device_size()));
            if let Some(size) = size {
                f.set_len(size)
                    .with_context(|| format!("cannot size {}", path.display()))?;
            }
        } else if let Some(size) = opts.size {
            let meta = std::fs::metadata(path)?;
            if meta.is_file() && meta.len() < size {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)?
                    .set_len(size)?;
            }
        }
        devs.push((
            path.display().to_string(),
            Arc::new(FileDevice::open(path, true)?),
        ));
    }
    let all: Vec<Arc<dyn BlockDevice>> = devs.iter().map(|d| d.1.clone()).collect();
    let (mut fs, staged, mut summary) = mkfs::make_set(devs, &opts)?;
    let mut stats = None;
    let mut shrunk = None;
    if let (Some(dir), Some(listing)) = (&a.rootdir, &listing) {
        // From here on every commit is a valid filesystem: running out of
        // space keeps what was committed.
        staged.publish()?;
        let pb = report::progress_bar(listing.total_bytes);
        let r = mkfs::rootdir::populate(&mut fs, listing, &rootdir_opts, &mut |files, bytes| {
            report::tick(&pb, files, bytes)
        });
        pb.finish_and_clear();
        let r = r.and_then(|s| {
            if opts.features.quota {
                mkfs::enable_quota(&mut fs)?;
            }
            if a.shrink {
                shrunk = Some(mkfs::shrink(&mut fs)?);
            }
            Ok(s)
        });
        match r {
            Ok(s) => {
                stats = Some(s);
                drop(fs);
            }
            Err(e @ btrkit_core::Error::NoSpace(_)) => {
                // The images hold a valid filesystem: they stay.
                created.clear();
                bail!(
                    "{e} while copying {}; the image keeps the files committed before the failure",
                    dir.display()
                )
            }
            Err(e) => {
                drop(fs);
                for d in &all {
                    mkfs::wipe_superblocks(d.as_ref())?;
                }
                return Err(anyhow::Error::new(e).context(format!(
                    "copying {} (the image was left unusable)",
                    dir.display()
                )));
            }
        }
    } else {
        if opts.features.quota {
            mkfs::enable_quota(&mut fs)?;
        }
        mkfs::finish(fs, &staged)?;
    }
    if let Some(end) = shrunk {
        // The committed filesystem ends at `end`: what lies beyond is
        // no longer part of it, so cutting it cannot lose anything.
        let path = &a.images[0];
        if std::fs::metadata(path)?.is_file() {
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(end).and_then(|_| f.sync_all()))
                .with_context(|| format!("cannot truncate {} to {end} bytes", path.display()))?;
        }
        summary.filesystem_size = end;
    }
    report::print(&summary, stats.as_ref(), a.json, a.quiet);
    Ok(())
}

/// `--reflink` can work, found before any image is touched: image files
/// (not block devices), data not RAID5/6, and the directory of each image
/// able to share a source file's blocks (a reflink into an unnamed
/// temporary file there).
fn check_reflink(
    a: &args::Args,
    opts: &MkfsOptions,
    listing: Option<&mkfs::rootdir::Listing>,
) -> anyhow::Result<()> {
    use btrkit_core::format::consts::{BTRFS_BLOCK_GROUP_RAID5, BTRFS_BLOCK_GROUP_RAID6};
    if opts
        .data_profile
        .is_some_and(|p| p & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0)
    {
        bail!("--reflink cannot be used with RAID5/6 data (parity is computed from the bytes)");
    }
    let Some(sample) = listing.and_then(|l| {
        l.entries
            .iter()
            .find(|e| e.meta.is_file() && e.meta.len() >= 4096)
    }) else {
        // No file has a whole block to share.
        return Ok(());
    };
    for path in &a.images {
        if path.exists() && !std::fs::metadata(path)?.is_file() {
            bail!(
                "--reflink needs image files: {} is not a regular file",
                path.display()
            );
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        btrkit_core::io::host::probe_clone(&sample.path, 4096, &dir).map_err(|e| {
            anyhow::anyhow!(
                "--reflink: {} cannot share the blocks of {}: {} ({e})",
                dir.display(),
                sample.path.display(),
                btrkit_core::io::host::clone_failure(&e)
            )
        })?;
    }
    Ok(())
}

/// Whether two paths name one file (the same device twice would make a
/// set that overwrites itself).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}
