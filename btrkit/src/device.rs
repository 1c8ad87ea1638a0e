//! `btrkit device`: btrfs(8)'s `device` group (add, remove) and `replace
//! start`, on unmounted images.

use btrkit_cli::progress::Bar;
use btrkit_core::check::Progress;
use btrkit_core::device_change::{self, Report};
use clap::Subcommand;
use std::path::PathBuf;

/// The `device` group's arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Add a device (an image file) to the filesystem, as `btrfs device
    /// add`.
    Add(AddArgs),
    /// Move everything off a device and take it out of the filesystem, as
    /// `btrfs device remove`.
    #[command(visible_alias = "delete")]
    Remove(RemoveArgs),
    /// Copy a device (or rebuild a missing one) onto a new one that takes
    /// its place, as `btrfs replace`.
    Replace(ReplaceArgs),
}

/// Arguments of `device add`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  truncate -s 4g new.img && btrkit device add new.img disk.img\n\nThe new device must exist (an image file of the size wanted, or a block device); one holding a btrfs filesystem needs --force."
)]
pub struct AddArgs {
    /// Overwrite a filesystem the new device holds.
    #[arg(short = 'f', long)]
    force: bool,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// The device to add.
    #[arg(value_name = "NEW")]
    new: PathBuf,
    /// The image, and the set's other devices.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<PathBuf>,
}

/// Arguments of `device remove`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit device remove 2 a.img b.img\n  btrkit device remove b.img a.img b.img\n\nEverything on the device moves to the others first (each block group in its own transactions: a cut leaves a consistent filesystem and running the command again finishes); then its superblocks are wiped."
)]
pub struct RemoveArgs {
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// The device: its devid, its path, or `missing` (a device of the
    /// set that is not there: what it held is rebuilt from the others).
    #[arg(value_name = "DEVID|PATH|missing")]
    which: String,
    /// The image, and the set's other devices (the one removed among them).
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<PathBuf>,
}

/// `device replace` subcommands.
#[derive(clap::Args)]
pub struct ReplaceArgs {
    #[command(subcommand)]
    cmd: ReplaceCmd,
}

#[derive(Subcommand)]
enum ReplaceCmd {
    /// Replace SRC with NEW.
    Start(ReplaceStart),
}

/// Arguments of `device replace start`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit device replace start 2 new.img a.img b.img\n  btrkit device replace start 2 new.img a.img        device 2 missing: rebuilt from mirrors or parity\n\nThe target gets the source's devid once everything is on it; until then the filesystem is as it was."
)]
pub struct ReplaceStart {
    /// Overwrite a filesystem the target holds.
    #[arg(short = 'f', long)]
    force: bool,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// The device replaced: its devid or its path.
    #[arg(value_name = "SRC")]
    src: String,
    /// The device that takes its place.
    #[arg(value_name = "NEW")]
    new: PathBuf,
    /// The image, and the set's other devices (the source among them when
    /// present).
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<PathBuf>,
}

/// Run the command.
pub fn run(a: &Args) -> anyhow::Result<()> {
    match &a.cmd {
        Cmd::Add(a) => {
            let r = device_change::add(&a.images, &a.new, a.force)?;
            print(
                &r,
                a.json,
                &format!("Added device {} ({})", r.devid, a.new.display()),
            )
        }
        Cmd::Remove(a) => {
            let bar = Bar::new(true);
            let r = device_change::remove(&a.images, &a.which, &mut |done, total| {
                if done == 1 {
                    bar.phase(1, "relocating block groups", total);
                }
                bar.advance(1);
            });
            bar.finish();
            let r = r?;
            print(&r, a.json, &format!("Removed device {}", r.devid))
        }
        Cmd::Replace(r) => match &r.cmd {
            ReplaceCmd::Start(a) => {
                let bar = Bar::new(true);
                let mut last = 0u64;
                let r = device_change::replace(
                    &a.images,
                    &a.src,
                    &a.new,
                    a.force,
                    &mut |done, total| {
                        if last == 0 {
                            bar.phase(1, "copying", total);
                        }
                        bar.advance(done - last);
                        last = done;
                    },
                );
                bar.finish();
                let r = r?;
                print(
                    &r,
                    a.json,
                    &format!(
                        "Replaced device {} by {}: {} bytes copied, {} of them rebuilt",
                        r.devid,
                        a.new.display(),
                        r.copied,
                        r.rebuilt
                    ),
                )
            }
        },
    }
}

fn print(r: &Report, json: bool, line: &str) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        println!("{line}");
    }
    Ok(())
}
