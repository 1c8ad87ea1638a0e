//! `btrkit filesystem resize`.

use btrkit_cli::progress::Bar;
use btrkit_core::check::Progress;
use std::path::PathBuf;

/// Arguments of `filesystem resize`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem resize +1g disk.img      grow the image file and the filesystem\n  \
btrkit filesystem resize 300m disk.img     shrink: what lies past 300 MiB moves, then the file is cut\n  \
btrkit filesystem resize 2:max a.img b.img  device 2 to the size of its image file\n\n\
Shrinking moves every block group past the new end first, each in its own transactions: a cut \
leaves the filesystem consistent at its old size, and running the command again finishes the job. \
`btrkit inspect-internal min-dev-size` says how small a device can go."
)]
pub struct Args {
    /// `[DEVID:][+/-]SIZE[kKmMgGtTpPeE]` or `[DEVID:]max` (device 1 by
    /// default).
    #[arg(allow_hyphen_values = true, value_name = "[DEVID:][+/-]SIZE|max")]
    size: String,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// The image, and the other devices of a filesystem on several devices.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<PathBuf>,
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    let bar = Bar::new(true);
    let r = btrkit_core::offline::resize_images(&a.images, &a.size, &mut |done, total| {
        if done == 1 {
            bar.phase(1, "relocating block groups", total);
        }
        bar.advance(1);
    });
    bar.finish();
    let r = r?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "Resize device id {} from {} to {}",
            r.devid,
            crate::common::size(r.old_size, false),
            crate::common::size(r.new_size, false)
        );
    }
    Ok(())
}
