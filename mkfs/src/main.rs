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
    let opts: MkfsOptions = a.options()?;
    let path = &a.image;
    let exists = path.exists();
    if exists && path.is_dir() {
        bail!("{} is a directory", path.display());
    }
    if exists && !a.force {
        if let Some(what) = args::existing_filesystem(path)? {
            bail!(
                "{} already contains a {what} filesystem; use -f to overwrite it",
                path.display()
            );
        }
    }
    // Scan the source before touching the image: an unreadable entry is
    // reported with the image unchanged.
    let listing = match &a.rootdir {
        Some(dir) => Some(mkfs::rootdir::scan(dir)?),
        None => None,
    };
    if !exists {
        let Some(size) = opts.size else {
            bail!("{} does not exist; give its size with -b", path.display());
        };
        let f = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        f.set_len(size)
            .with_context(|| format!("cannot size {}", path.display()))?;
    } else if let Some(size) = opts.size {
        let meta = std::fs::metadata(path)?;
        if meta.is_file() && meta.len() < size {
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)?
                .set_len(size)?;
        }
    }
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, true)?);
    let (mut fs, staged, summary) = mkfs::make(dev.clone(), &opts)?;
    let mut stats = None;
    if let (Some(dir), Some(listing)) = (&a.rootdir, &listing) {
        // From here on every commit is a valid filesystem: running out of
        // space keeps what was committed.
        staged.publish()?;
        let pb = report::progress_bar(listing.total_bytes);
        let r = mkfs::rootdir::populate(&mut fs, listing, &mut |files, bytes| {
            report::tick(&pb, files, bytes)
        });
        pb.finish_and_clear();
        match r {
            Ok(s) => stats = Some(s),
            Err(e @ btrkit_core::Error::NoSpace(_)) => {
                bail!(
                    "{e} while copying {}; the image keeps the files committed before the failure",
                    dir.display()
                )
            }
            Err(e) => {
                drop(fs);
                mkfs::wipe_superblocks(dev.as_ref())?;
                return Err(anyhow::Error::new(e).context(format!(
                    "copying {} (the image was left unusable)",
                    dir.display()
                )));
            }
        }
    } else {
        mkfs::finish(fs, &staged)?;
    }
    report::print(&summary, stats.as_ref(), a.json, a.quiet);
    Ok(())
}
