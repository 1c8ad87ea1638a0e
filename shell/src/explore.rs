//! `btrkit-shell explore IMAGE SCRIPT`: crash the script at every flush
//! point and check each recovery (core's workload::explore does the work).

use btrkit_core::workload::explore::{explore_set, ExploreOptions, ExploreReport};
use btrkit_core::workload::Script;
use clap::Args;
use comfy_table::Table;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  btrkit-shell explore disk.img workload.scn\n  \
btrkit-shell explore disk.img workload.scn --random 4 --seed 9 --save bad/\n  \
btrkit-shell explore x.img raid1.scn --json       # raid1.scn: devices 2 ...\n\n\
Exit status: 0 every crash recovered as promised, 1 a violation (listed), 2 the run could not start."
)]
pub struct ExploreArgs {
    /// The starting image (made from the script's mkfs and fssize when
    /// missing). It is not changed: the run writes to memory.
    pub image: PathBuf,
    /// The workload script (its `crash`, if any, ends the run).
    pub script: String,
    /// Also try N random subsets of the unflushed writes at each flush
    /// point (some writes torn into their 4 KiB pages).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub random: u32,
    /// Seed of the random subsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Save each crash image that shows a violation in DIR (as it was
    /// before recovery).
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,
    /// One line of JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Another device of the filesystem (repeatable, devid order after
    /// IMAGE). Without it a script's `devices N` uses IMAGE-2.EXT ...
    /// Each device keeps its own unflushed writes at a crash.
    #[arg(long = "device", value_name = "PATH")]
    pub devices: Vec<PathBuf>,
}

pub fn run(a: &ExploreArgs) -> i32 {
    match run_inner(a) {
        Ok(r) => {
            if r.violations.is_empty() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("btrkit-shell: explore: {e}");
            2
        }
    }
}

fn run_inner(a: &ExploreArgs) -> anyhow::Result<ExploreReport> {
    let text = std::fs::read_to_string(&a.script)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", a.script))?;
    let script = Script::parse(&a.script, &text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {}", a.script, e.line, e.msg))?;
    let pb = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::new(0);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} crash states [{elapsed}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let mut progress = |done: usize, total: usize| {
        if let Some(pb) = &pb {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }
    };
    if let Some(d) = &a.save {
        std::fs::create_dir_all(d).map_err(|e| anyhow::anyhow!("{}: {e}", d.display()))?;
    }
    let o = ExploreOptions {
        random: a.random,
        seed: a.seed,
        save_dir: a.save.clone(),
    };
    let paths = crate::run::session_paths(&a.image, &a.devices, &script);
    let r = explore_set(&paths, &script, &o, &mut progress)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.image.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(r);
    }
    let mut t = Table::new();
    t.set_header(vec![
        "steps",
        "writes",
        "flush points",
        "states checked",
        "fsync promises",
        "violations",
    ]);
    t.add_row(vec![
        r.steps,
        r.writes,
        r.flush_points,
        r.states_checked,
        r.promises,
        r.violations.len(),
    ]);
    println!("{t}");
    if !r.violations.is_empty() {
        let mut v = Table::new();
        v.set_header(vec!["flush point", "subset", "what"]);
        for x in r.violations.iter().take(50) {
            v.add_row(vec![
                x.flush_point.to_string(),
                x.subset.map_or("-".into(), |s| s.to_string()),
                x.what.clone(),
            ]);
        }
        println!("{v}");
    }
    Ok(r)
}
