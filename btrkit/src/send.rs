//! `btrkit send`: btrfs(8)'s `send` from an image: a stream of a
//! read-only snapshot (paths inside the filesystem, from its top level),
//! to stdout or `-f FILE`. The image is only read.

use anyhow::{bail, Context};
use btrkit_cli::progress::Bar;
use btrkit_core::check::Progress;
use btrkit_core::fs::Filesystem;
use btrkit_core::send::sender::{self, SendOptions};
use std::io::Write;
use std::path::PathBuf;

/// `btrkit send`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Send only what differs from this read-only snapshot (it must be on
    /// the receiving side already).
    #[arg(short = 'p', value_name = "PARENT")]
    parent: Option<String>,
    /// A read-only snapshot data may be cloned from (repeatable; it must
    /// be on the receiving side already).
    #[arg(short = 'c', value_name = "CLONE_SRC")]
    clone_src: Vec<String>,
    /// Write the stream to FILE instead of stdout.
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Protocol version (1 or 2).
    #[arg(long, default_value_t = 1)]
    proto: u32,
    /// Send compressed extents as they are stored (protocol 2).
    #[arg(long)]
    compressed_data: bool,
    /// Send no file data, only where it changed (UPDATE_EXTENT).
    #[arg(long)]
    no_data: bool,
    /// Print nothing but errors.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Ignore the fsync log (by default applied in memory).
    #[arg(long)]
    no_log: bool,
    /// The image, the set's other devices, then the snapshot's path
    /// inside the filesystem.
    #[arg(required = true, num_args = 2.., value_name = "IMAGE... SNAPSHOT")]
    args: Vec<String>,
}

fn subvol_of(fs: &mut Filesystem, path: &str) -> anyhow::Result<u64> {
    let l = fs
        .resolve(path, true)
        .with_context(|| format!("{path}: not found in the filesystem"))?;
    if l.ino != btrkit_core::fs::ROOT_DIR {
        bail!("{path}: not a subvolume");
    }
    Ok(l.subvol)
}

/// Run it.
pub fn run(a: &Args) -> anyhow::Result<()> {
    let (snap, images) = a.args.split_last().context("no snapshot named")?;
    let img = crate::common::ImageArgs {
        images: images.iter().map(PathBuf::from).collect(),
        no_log: a.no_log,
        degraded: false,
    };
    let mut o = img.open()?;
    let fs = &mut o.fs;
    let id = subvol_of(fs, snap)?;
    let parent = a.parent.as_deref().map(|p| subvol_of(fs, p)).transpose()?;
    let clones = a
        .clone_src
        .iter()
        .map(|c| subvol_of(fs, c))
        .collect::<anyhow::Result<Vec<u64>>>()?;
    let opts = SendOptions {
        version: if a.compressed_data {
            a.proto.max(2)
        } else {
            a.proto
        },
        compressed_data: a.compressed_data,
        no_data: a.no_data,
    };
    let out: Box<dyn Write> = match &a.file {
        Some(f) => {
            Box::new(std::fs::File::create(f).with_context(|| format!("creating {}", f.display()))?)
        }
        None => {
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                bail!("not writing a send stream to a terminal: redirect stdout or use -f FILE");
            }
            Box::new(std::io::stdout().lock())
        }
    };
    let out = std::io::BufWriter::with_capacity(1 << 20, out);
    if !a.quiet {
        eprintln!("At subvol {snap}");
    }
    let bar = Bar::new(!a.quiet);
    let mut last = 0u64;
    let r = sender::send(fs, id, parent, &clones, out, opts, &mut |d, t| {
        if last == 0 {
            bar.phase(1, "sending inodes", t);
        }
        bar.advance(d.saturating_sub(last));
        last = d.max(1);
    });
    bar.finish();
    r.context("sending")?;
    Ok(())
}
