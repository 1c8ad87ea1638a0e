//! `btrkit filesystem usage`.

use crate::common::{size, ssize, ImageArgs};
use btrkit_core::usage::{space_report, SpaceReport};

/// Arguments of `filesystem usage`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem usage -b disk.img\n  btrkit filesystem usage a.img b.img --json\n\n\"Free (statfs, df)\" is what df shows on a read-write mount; a read-only mount shows less (estimated in the --json field statfs.available_read_only)."
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
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", text(&r, a.raw));
    }
    Ok(())
}

fn device_name(r: &SpaceReport, devid: u64) -> String {
    r.devices
        .iter()
        .find(|d| d.devid == devid)
        .and_then(|d| d.path.clone())
        .unwrap_or_else(|| format!("<missing disk #{devid}>"))
}

fn text(r: &SpaceReport, raw: bool) -> String {
    let w = if raw { 18 } else { 10 };
    let s = |v: u64| size(v, raw);
    let mut o = String::from("Overall:\n");
    o += &format!("    Device size:\t\t{:>w$}\n", s(r.device_size));
    o += &format!("    Device allocated:\t\t{:>w$}\n", s(r.device_allocated));
    o += &format!(
        "    Device unallocated:\t\t{:>w$}\n",
        ssize(r.device_unallocated, raw)
    );
    o += &format!("    Device missing:\t\t{:>w$}\n", s(r.device_missing));
    o += &format!("    Device slack:\t\t{:>w$}\n", s(r.device_slack));
    o += &format!("    Used:\t\t\t{:>w$}\n", s(r.used));
    o += &format!(
        "    Free (estimated):\t\t{:>w$}\t(min: {})\n",
        s(r.free_estimated),
        s(r.free_min)
    );
    o += &format!("    Free (statfs, df):\t\t{:>w$}\n", s(r.statfs.available));
    o += &format!("    Data ratio:\t\t\t{:>w$.2}\n", r.data_ratio);
    o += &format!("    Metadata ratio:\t\t{:>w$.2}\n", r.metadata_ratio);
    o += &format!(
        "    Global reserve:\t\t{:>w$}\t(used: {})\n",
        s(r.global_reserve),
        s(r.global_reserve_used)
    );
    if r.multiple_profiles.is_empty() {
        o += &format!("    Multiple profiles:\t\t{:>w$}\n", "no");
    } else {
        o += &format!(
            "    Multiple profiles:\t\t{:>w$}\t({})\n",
            "yes",
            r.multiple_profiles.join(", ")
        );
    }
    // btrfs' order: by type (system last), then by profile bits.
    let mut p: Vec<_> = r.profiles.iter().collect();
    p.sort_by_key(|p| {
        let t = p.flags & 7;
        (t == 2, t, p.flags)
    });
    for p in p {
        let pct = if p.size == 0 {
            0.0
        } else {
            p.used as f64 * 100.0 / p.size as f64
        };
        o += &format!(
            "\n{},{}: Size:{}, Used:{} ({:.2}%)\n",
            p.kind,
            p.profile,
            s(p.size),
            s(p.used),
            pct
        );
        for &(devid, b) in &p.devices {
            o += &format!("   {}\t{:>w$}\n", device_name(r, devid), s(b));
        }
    }
    o += "\nUnallocated:\n";
    for d in &r.devices {
        o += &format!(
            "   {}\t{:>w$}\n",
            device_name(r, d.devid),
            ssize(d.unallocated, raw)
        );
    }
    o
}
