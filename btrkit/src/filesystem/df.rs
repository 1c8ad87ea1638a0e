//! `btrkit filesystem df`.

use crate::common::{size, ImageArgs};
use btrkit_core::usage::space_report;

/// Arguments of `filesystem df`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem df -b disk.img\n  btrkit filesystem df disk.img --json"
)]
pub struct Args {
    #[command(flatten)]
    img: ImageArgs,
    /// Sizes in bytes.
    #[arg(short = 'b', long)]
    raw: bool,
    /// The report as JSON (bytes).
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    let mut o = a.img.open()?;
    let r = space_report(&mut o.fs, &o.names)?;
    if a.json {
        let mut v: Vec<serde_json::Value> = r
            .profiles
            .iter()
            .map(|p| {
                serde_json::json!({
                    "type": p.kind, "profile": p.profile, "total": p.size, "used": p.used,
                })
            })
            .collect();
        v.push(serde_json::json!({
            "type": "GlobalReserve", "profile": "single",
            "total": r.global_reserve, "used": r.global_reserve_used,
        }));
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for p in &r.profiles {
        println!(
            "{}, {}: total={}, used={}",
            p.kind,
            p.profile,
            size(p.size, a.raw),
            size(p.used, a.raw)
        );
    }
    println!(
        "GlobalReserve, single: total={}, used={}",
        size(r.global_reserve, a.raw),
        size(r.global_reserve_used, a.raw)
    );
    Ok(())
}
