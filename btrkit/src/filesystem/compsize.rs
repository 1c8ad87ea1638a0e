//! `btrkit filesystem compsize`.

use crate::common::ImageArgs;
use btrkit_core::usage::compsize;
use comfy_table::{presets::NOTHING, Table};

/// Arguments of `filesystem compsize`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem compsize disk.img\n  btrkit filesystem compsize -b disk.img --path /var/log --json\n\nAs compsize counts: each disk extent once (disk usage, uncompressed), each reference (referenced); inline extents by their stored bytes; holes not."
)]
pub struct Args {
    #[command(flatten)]
    img: ImageArgs,
    /// A path in the filesystem (repeatable; default `/`).
    #[arg(long = "path", value_name = "PATH")]
    paths: Vec<String>,
    /// Sizes in bytes.
    #[arg(short = 'b', long)]
    raw: bool,
    /// The report as JSON (bytes).
    #[arg(long)]
    json: bool,
}

/// compsize's own units: whole bytes up to 10 KiB... then one decimal.
fn human(x: u64, raw: bool) -> String {
    if raw {
        return x.to_string();
    }
    const UNITS: &[u8] = b"BKMGTPE";
    let (mut x, mut u) = (x, 0);
    while x >= 10240 {
        u += 1;
        x >>= 10;
    }
    if x >= 1024 {
        format!("{}.{}{}", x >> 10, x * 10 / 1024 % 10, UNITS[u + 1] as char)
    } else {
        format!("{}{}", x, UNITS[u] as char)
    }
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    let mut fs = a.img.open()?.fs;
    let paths = if a.paths.is_empty() {
        vec!["/".to_string()]
    } else {
        a.paths.clone()
    };
    let r = compsize(&mut fs, &paths)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if r.total.uncompressed == 0 {
        anyhow::bail!(if r.files == 0 {
            "no files"
        } else {
            "all files empty"
        });
    }
    if r.files > 1 {
        println!(
            "Processed {} files, {} regular extents ({} refs), {} inline.",
            r.files, r.extents, r.refs, r.inline
        );
    }
    let mut t = Table::new();
    t.load_preset(NOTHING);
    t.set_header(vec![
        "Type",
        "Perc",
        "Disk Usage",
        "Uncompressed",
        "Referenced",
    ]);
    for b in std::iter::once(&r.total).chain(r.types.iter()) {
        t.add_row(vec![
            b.kind.clone(),
            format!("{:3}%", b.percent()),
            human(b.disk, a.raw),
            human(b.uncompressed, a.raw),
            human(b.referenced, a.raw),
        ]);
    }
    println!("{t}");
    Ok(())
}
