//! `btrkit filesystem du`.

use crate::common::{size, ImageArgs};
use btrkit_core::usage::du;
use comfy_table::{presets::NOTHING, CellAlignment, Table};

/// Arguments of `filesystem du`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem du disk.img                      every file, from the top\n  btrkit filesystem du -s disk.img --path /home --path /srv\n  btrkit filesystem du -b a.img b.img --json\n\nPaths are in the filesystem, from its top (the default subvolume's root); snapshots and subvolumes are entered, as btrfs filesystem du does."
)]
pub struct Args {
    #[command(flatten)]
    img: ImageArgs,
    /// A path in the filesystem to report (repeatable; default `/`).
    #[arg(long = "path", value_name = "PATH")]
    paths: Vec<String>,
    /// Only a total for each path.
    #[arg(short = 's', long)]
    summarize: bool,
    /// Sizes in bytes.
    #[arg(short = 'b', long)]
    raw: bool,
    /// The report as JSON (bytes).
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    let mut fs = a.img.open()?.fs;
    let paths = if a.paths.is_empty() {
        vec!["/".to_string()]
    } else {
        a.paths.clone()
    };
    let r = du(&mut fs, &paths, a.summarize)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(NOTHING);
    t.set_header(vec!["Total", "Exclusive", "Set shared", "Filename"]);
    for e in &r.entries {
        t.add_row(vec![
            size(e.total, a.raw),
            size(e.exclusive, a.raw),
            e.set_shared.map_or("-".into(), |v| size(v, a.raw)),
            e.path.clone(),
        ]);
    }
    for i in 0..3 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    println!("{t}");
    Ok(())
}
