//! `btrkit balance`: btrfs(8)'s `balance` group, on unmounted images.

use anyhow::Context;
use btrkit_cli::progress::Bar;
use btrkit_core::balance;
use btrkit_core::check::Progress;
use btrkit_core::offline::Offline;
use clap::Subcommand;
use std::path::PathBuf;

/// The `balance` group's arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Relocate block groups, as `btrfs balance start` (filters, convert).
    Start(StartArgs),
}

/// Arguments of `balance start`: btrfs' options, then the images.
#[derive(clap::Args)]
#[command(
    after_help = "Options, as btrfs balance start takes them (filters attached):\n  \
-d[FILTERS]  data block groups        -m[FILTERS]  metadata (and system) block groups\n  \
-s[FILTERS]  system block groups (with -f)   -f, --force   lower metadata redundancy, name system groups\n  \
--full-balance  (no type named: every block group)   --json  the report as JSON\n\
Filters: usage=N|A..B, devid=N, drange=A..B, vrange=A..B, stripes=A..B, limit=N|A..B,\n  \
profiles=P|Q, convert=PROFILE, soft (comma separated)\n\n\
Examples:\n  btrkit balance start -dusage=50 disk.img\n  \
btrkit balance start -dconvert=raid1 -mconvert=raid1 a.img b.img\n\n\
The images are changed in place, never while mounted; every block group moves in its own \
transactions, so a cut leaves a consistent filesystem and running the command again finishes the job."
)]
pub struct StartArgs {
    /// btrfs balance start's options, then the image and the set's other
    /// devices.
    #[arg(
        required = true,
        allow_hyphen_values = true,
        trailing_var_arg = true,
        value_name = "OPTIONS|IMAGE"
    )]
    words: Vec<String>,
}

/// Run the command.
pub fn run(a: &Args) -> anyhow::Result<()> {
    match &a.cmd {
        Cmd::Start(s) => start(s),
    }
}

fn start(a: &StartArgs) -> anyhow::Result<()> {
    let (opts, images): (Vec<&String>, Vec<&String>) =
        a.words.iter().partition(|w| w.starts_with('-'));
    let json = opts.iter().any(|o| *o == "--json");
    let opts: Vec<&str> = opts
        .iter()
        .map(|s| s.as_str())
        .filter(|o| *o != "--json")
        .collect();
    if images.is_empty() {
        anyhow::bail!("no image given");
    }
    let req = balance::parse_args(&opts)?.normalize()?;
    let paths: Vec<PathBuf> = images.iter().map(PathBuf::from).collect();
    let mut o = Offline::open(&paths).context("opening the filesystem")?;
    o.fs().sync()?;
    let bar = Bar::new(true);
    let r = balance::run(&mut o.fs().store, &req, &mut |done, total, _| {
        if done == 1 {
            bar.phase(1, "relocating block groups", total);
        }
        bar.advance(1);
    });
    bar.finish();
    let r = r?;
    o.close()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "Done, had to relocate {} out of {} chunks",
            r.relocated, r.considered
        );
    }
    Ok(())
}
