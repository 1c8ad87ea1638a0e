//! btrkit-replay: replay a Btrfs image's fsync log offline, as the kernel
//! would at mount, so what fsync made durable is not lost.

mod report;

use anyhow::{bail, Context};
use btrkit_core::io::{clone_or_copy, BlockDevice, CopyMethod, FileDevice, OverlayDevice};
use btrkit_core::log::replay::{replay_with_progress, ReplayOptions, ReplaySummary};
use btrkit_core::trans::Store;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "btrkit-replay",
    version,
    about = "Replay the fsync log of a Btrfs image offline",
    after_help = "Examples:\n  btrkit-replay crash.img                 replay in place\n  btrkit-replay crash.img -o fixed.img    write the recovered image to fixed.img\n  btrkit-replay crash.img --dry-run       show what replay would change\n  btrkit-replay crash.img --salvage --dry-run   what a damaged log still gives\n  btrkit-replay crash.img --salvage -o fixed.img\n\nExit status: 0 replayed or no log to replay, 1 error (the image is left as it was)."
)]
struct Args {
    /// The crash image (file or block device).
    image: PathBuf,
    /// Write the recovered image here and leave IMAGE untouched (a reflink
    /// copy where the filesystem supports it, else a sparse copy).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Print what replay would change without writing anything.
    #[arg(long)]
    dry_run: bool,
    /// Replay even when the log lacks data checksums.
    #[arg(long)]
    force: bool,
    /// The log is damaged: replay every logged inode whose items are all
    /// still readable, keep the committed state of the others, and report
    /// per inode what was recovered (never worse than zero-log).
    #[arg(long, conflicts_with = "force")]
    salvage: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

fn main() {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => {}
        Err(e) => {
            let mut msg = format!("{e:#}").replace('\n', " ");
            let log_damaged = e
                .chain()
                .filter_map(|c| c.downcast_ref::<btrkit_core::Error>())
                .any(|c| c.corrupt_kind() == Some(btrkit_core::CorruptKind::LogBlock));
            if !a.salvage && log_damaged {
                msg.push_str(
                    " (the log is damaged: --salvage replays what the rest of it still proves)",
                );
            }
            eprintln!("btrkit-replay: error: {msg}");
            std::process::exit(1);
        }
    }
}

/// Whether the image's superblock names a log. A device of a filesystem
/// on several devices is refused here, before anything is copied or
/// written: replaying or copying one device of a set would give a
/// filesystem missing the others.
fn has_log(path: &std::path::Path) -> anyhow::Result<bool> {
    let dev = FileDevice::open(path, false)?;
    let sb = btrkit_core::image::read_superblock(&dev, 0)?;
    if sb.num_devices.get() > 1 {
        return Err(btrkit_core::Error::Unsupported(format!(
            "{} is device {} of a filesystem on {} devices; filesystems on several devices are not supported yet (nothing written)",
            path.display(),
            sb.dev_item.devid.get(),
            sb.num_devices.get()
        ))
        .into());
    }
    Ok(sb.log_root.get() != 0)
}

/// Replay with a progress bar on a terminal (hidden otherwise).
fn run_replay(fs: &mut Store, opts: ReplayOptions) -> anyhow::Result<ReplaySummary> {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    use std::io::IsTerminal;
    let pb = ProgressBar::new(0);
    if !std::io::stderr().is_terminal() {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = replay_with_progress(fs, opts, &mut |stage, done, total| {
        pb.set_length(total);
        pb.set_position(done);
        pb.set_message(stage);
    });
    pb.finish_and_clear();
    Ok(r?)
}

/// Copy the image to the new file `out`: a reflink where the filesystem
/// can, else a sparse copy. A copy that fails half way is removed.
fn copy_image(image: &std::path::Path, out: &std::path::Path) -> anyhow::Result<CopyMethod> {
    match clone_or_copy(image, out) {
        Ok(m) => Ok(m),
        Err(e) => {
            // create_new failed only if `out` appeared meanwhile; then it is not ours.
            if !matches!(&e, btrkit_core::Error::Io { context, .. } if context.starts_with("cannot create"))
            {
                let _ = std::fs::remove_file(out);
            }
            Err(e).with_context(|| format!("copying {} to {}", image.display(), out.display()))
        }
    }
}

fn run(a: &Args) -> anyhow::Result<()> {
    if a.dry_run && a.output.is_some() {
        bail!("--dry-run and -o cannot be combined");
    }
    if !has_log(&a.image)? {
        if let Some(out) = &a.output {
            // Nothing to replay: the recovered image is the image itself.
            if out.exists() {
                bail!("{} exists; refusing to overwrite it", out.display());
            }
            copy_image(&a.image, out)?;
        }
        report::no_log(&a.image, a.json);
        return Ok(());
    }
    let opts = ReplayOptions {
        force: a.force,
        salvage: a.salvage,
    };
    if a.dry_run {
        let base: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&a.image, false)?);
        let overlay: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(base));
        let mut fs = Store::open_for_replay(overlay)?;
        let s = run_replay(&mut fs, opts)?;
        report::print(&s, true, a.json, None);
        return Ok(());
    }
    let (target, copy) = match &a.output {
        Some(out) => {
            if out.exists() {
                bail!("{} exists; refusing to overwrite it", out.display());
            }
            let m = copy_image(&a.image, out)?;
            (out.clone(), Some(m))
        }
        None => (a.image.clone(), None),
    };
    let result = (|| -> anyhow::Result<_> {
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&target, true)?);
        let mut fs = Store::open_for_replay(dev)?;
        run_replay(&mut fs, opts)
    })();
    match result {
        Ok(s) => {
            report::print(&s, false, a.json, copy);
            Ok(())
        }
        Err(e) => {
            if let Some(out) = &a.output {
                let _ = std::fs::remove_file(out);
            }
            Err(e)
        }
    }
}
