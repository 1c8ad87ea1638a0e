//! `btrkit inspect-internal`: btrfs(8)'s `inspect-internal` group.

use anyhow::Context;
use btrkit_core::devices::{Access, Devices, Single};
use clap::Subcommand;
use std::path::PathBuf;

/// The `inspect-internal` group's arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The smallest size a device can be shrunk to (as `btrfs
    /// inspect-internal min-dev-size`).
    MinDevSize(MinArgs),
}

/// Arguments of `min-dev-size`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit inspect-internal min-dev-size disk.img\n  btrkit inspect-internal min-dev-size --id 2 a.img b.img"
)]
pub struct MinArgs {
    /// The device to ask about.
    #[arg(long = "id", default_value_t = 1, value_name = "DEVID")]
    devid: u64,
    /// The result as JSON.
    #[arg(long)]
    json: bool,
    /// The image, and the other devices of a filesystem on several devices.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<PathBuf>,
}

/// Run the command.
pub fn run(a: &Args) -> anyhow::Result<()> {
    match &a.cmd {
        Cmd::MinDevSize(m) => min_dev_size(m),
    }
}

fn min_dev_size(a: &MinArgs) -> anyhow::Result<()> {
    let devs = Devices::open_paths(&a.images, Access::default())?;
    let opened = devs
        .open(Default::default(), Single::AsSet)
        .context("opening the filesystem")?;
    let mut st = btrkit_core::trans::Store::from_image(opened.img)?;
    let n = btrkit_core::resize::min_dev_size(&mut st, a.devid)?;
    if a.json {
        println!("{}", serde_json::json!({ "devid": a.devid, "min_size": n }));
    } else {
        println!("{n} bytes ({})", crate::common::size(n, false));
    }
    Ok(())
}
