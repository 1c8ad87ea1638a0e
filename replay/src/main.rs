//! btrkit-replay: replay a Btrfs image's fsync log offline, as the kernel
//! would at mount, so what fsync made durable is not lost.

mod report;

use anyhow::{bail, Context};
use btrkit_core::devices::{Access, Devices, Single};
use btrkit_core::image::OpenOptions;
use btrkit_core::io::{clone_or_copy, BlockDevice, CopyMethod, OverlayDevice};
use btrkit_core::log::replay::{replay_with_progress, ReplayOptions, ReplaySummary};
use btrkit_core::trans::Store;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "btrkit-replay",
    version,
    about = "Replay the fsync log of a Btrfs image offline",
    after_help = "Examples:\n  btrkit-replay crash.img                 replay in place\n  btrkit-replay a.img b.img               replay a filesystem on two devices in place\n  btrkit-replay a.img b.img -o fixed/     one recovered file per device in fixed/\n  btrkit-replay crash.img -o fixed.img    write the recovered image to fixed.img\n  btrkit-replay crash.img --dry-run       show what replay would change\n  btrkit-replay crash.img --salvage --dry-run   what a damaged log still gives\n  btrkit-replay crash.img --salvage -o fixed.img\n\nExit status: 0 replayed or no log to replay, 1 error (the image is left as it was)."
)]
struct Args {
    /// The crash image (file or block device), and the other devices of a
    /// filesystem on several devices, in any order.
    #[arg(required = true, num_args = 1..)]
    images: Vec<PathBuf>,
    /// Another device of the filesystem (repeatable; as `mount -o device=`).
    #[arg(long = "device", value_name = "PATH")]
    devices: Vec<PathBuf>,
    /// Write the recovered image here and leave IMAGE untouched (a reflink
    /// copy where the filesystem supports it, else a sparse copy). With
    /// several devices, a directory that gets one file per device, named as
    /// the device's file.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Replay a filesystem on several devices with some of them missing
    /// (as `mount -o degraded`): the copies on the devices given are
    /// written, the missing ones keep what they had. Refused when the log
    /// or the trees need a block with no copy on the devices given.
    #[arg(long)]
    degraded: bool,
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
    btrkit_cli::generate::handle::<Args>();
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

/// Whether the filesystem's superblock names a log. Every device must be
/// given and match the others; one device of a filesystem on several
/// devices is refused here, before anything is copied or written:
/// replaying or copying one device of a set would give a filesystem
/// missing the others.
fn has_log(paths: &[PathBuf], degraded: bool) -> anyhow::Result<bool> {
    let devices = Devices::open_paths(paths, Access::default())?;
    let set = devices.set()?;
    if !degraded {
        if let Some(e) = devices.missing(
            &set,
            "give every device, or --degraded to replay onto the ones given (nothing written)",
        ) {
            return Err(e.into());
        }
    }
    let first = set
        .members()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no device given"))?;
    Ok(first.sb.log_root.get() != 0)
}

/// Open `paths` (read-write unless `dev` wraps them) as one filesystem for
/// replay.
fn open_for_replay(
    paths: &[PathBuf],
    wrap: &dyn Fn(Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice>,
    writable: bool,
    degraded: bool,
) -> anyhow::Result<Store> {
    let devices = Devices::open_paths(
        paths,
        Access {
            writable,
            mmap: false,
        },
    )?
    .wrap(wrap);
    let opened = devices.open(
        OpenOptions {
            writable: true,
            degraded,
            ..Default::default()
        },
        Single::AsSet,
    )?;
    Ok(Store::from_image_for_replay(opened.img)?)
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

/// Where `-o` puts each device's copy: OUT itself for one device, else
/// OUT/<the device's file name> (OUT created when absent).
fn output_paths(paths: &[PathBuf], out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if paths.len() == 1 {
        if out.exists() {
            bail!("{} exists; refusing to overwrite it", out.display());
        }
        return Ok(vec![out.to_path_buf()]);
    }
    if out.exists() && !out.is_dir() {
        bail!(
            "{} is not a directory: with several devices, -o names a directory for one file per device",
            out.display()
        );
    }
    let mut v: Vec<PathBuf> = Vec::with_capacity(paths.len());
    for p in paths {
        let name = p
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("{} has no file name", p.display()))?;
        let o = out.join(name);
        if v.contains(&o) {
            bail!(
                "two devices are both named {}: -o cannot hold both",
                name.to_string_lossy()
            );
        }
        if o.exists() {
            bail!("{} exists; refusing to overwrite it", o.display());
        }
        v.push(o);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    Ok(v)
}

/// Copy every device to its output; on failure, remove what was copied.
fn copy_all(paths: &[PathBuf], outs: &[PathBuf]) -> anyhow::Result<CopyMethod> {
    let mut method = None;
    for (i, (p, o)) in paths.iter().zip(outs).enumerate() {
        match copy_image(p, o) {
            Ok(m) => {
                method.get_or_insert(m);
            }
            Err(e) => {
                for done in &outs[..i] {
                    let _ = std::fs::remove_file(done);
                }
                return Err(e);
            }
        }
    }
    method.ok_or_else(|| anyhow::anyhow!("no device given"))
}

fn run(a: &Args) -> anyhow::Result<()> {
    let paths: Vec<PathBuf> = a.images.iter().chain(&a.devices).cloned().collect();
    if a.dry_run && a.output.is_some() {
        bail!("--dry-run and -o cannot be combined");
    }
    if !has_log(&paths, a.degraded)? {
        if let Some(out) = &a.output {
            // Nothing to replay: the recovered image is the image itself.
            let outs = output_paths(&paths, out)?;
            copy_all(&paths, &outs)?;
        }
        report::no_log(&paths[0], a.json);
        return Ok(());
    }
    let opts = ReplayOptions {
        force: a.force,
        salvage: a.salvage,
    };
    if a.dry_run {
        let overlay =
            |d: Arc<dyn BlockDevice>| -> Arc<dyn BlockDevice> { Arc::new(OverlayDevice::new(d)) };
        let mut fs = open_for_replay(&paths, &overlay, false, a.degraded)?;
        let s = run_replay(&mut fs, opts)?;
        report::print(&s, true, a.json, None);
        return Ok(());
    }
    let (targets, outs, copy) = match &a.output {
        Some(out) => {
            let outs = output_paths(&paths, out)?;
            let m = copy_all(&paths, &outs)?;
            (outs.clone(), outs, Some(m))
        }
        None => (paths.clone(), Vec::new(), None),
    };
    let result = (|| -> anyhow::Result<_> {
        let mut fs = open_for_replay(&targets, &|d| d, true, a.degraded)?;
        run_replay(&mut fs, opts)
    })();
    match result {
        Ok(s) => {
            report::print(&s, false, a.json, copy);
            Ok(())
        }
        Err(e) => {
            for o in &outs {
                let _ = std::fs::remove_file(o);
            }
            Err(e)
        }
    }
}
