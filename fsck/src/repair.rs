//! `--repair`: the plan shown (and confirmed on a terminal), then carried
//! out by the engine in one transaction, then the check again.

use crate::{cli::Args, progress::Bar, render};
use btrkit_core::check::repair::{self, Outcome, RepairOptions, SpaceCache};
use btrkit_core::check::CheckOptions;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

pub fn run(args: &Args, paths: &[PathBuf], check: CheckOptions, bar: &Bar) -> anyhow::Result<i32> {
    let opts = RepairOptions {
        init_csum_tree: args.init_csum_tree,
        clear_space_cache: match args.clear_space_cache.as_deref() {
            Some("v1") => Some(SpaceCache::V1),
            Some("v2") => Some(SpaceCache::V2),
            _ => None,
        },
    };
    let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    if !args.dry_run && !args.yes && !interactive {
        eprintln!("btrkit-fsck: --repair writes to the image: add --yes to confirm (or --dry-run to see the plan)");
        return Ok(crate::EXIT_USAGE);
    }
    // `--clear-space-cache` on its own is that one operation, as btrfs
    // check runs it: no check before or after, nothing else repaired.
    if let (Some(which), false, false) = (opts.clear_space_cache, args.dry_run, opts.init_csum_tree)
    {
        let target = repair::Target::Paths {
            paths: paths.to_vec(),
            degraded: args.degraded,
        };
        let changes = repair::clear_space_cache_only(&target, which)?;
        render::cleared(args.json, paths, which, &changes)?;
        return Ok(crate::EXIT_CLEAN);
    }
    // Plan first, without writing: the user confirms what they see.
    let target = repair::Target::Paths {
        paths: paths.to_vec(),
        degraded: args.degraded,
    };
    let planned = repair::plan(&target, check, opts, bar)?;
    bar.finish();
    let needs_run = !planned.plan.is_empty() && planned.plan.refused.is_none();
    if args.dry_run || !needs_run {
        show(args, paths, &planned)?;
        return Ok(exit_code(&planned));
    }
    if !args.yes {
        if !args.json {
            render::human(paths, &planned.before);
            render::plan(&planned.plan);
        }
        eprint!(
            "Carry out these {} repairs? [y/N] ",
            planned.plan.actions.len()
        );
        std::io::stderr().flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if !matches!(line.trim(), "y" | "Y" | "yes") {
            eprintln!("btrkit-fsck: nothing written");
            return Ok(crate::EXIT_ERRORS);
        }
    }
    let outcome = repair::carry_out(&target, check, planned, bar)?;
    bar.finish();
    show(args, paths, &outcome)?;
    Ok(exit_code(&outcome))
}

fn exit_code(o: &Outcome) -> i32 {
    match &o.after {
        Some(after) if after.is_clean() && o.before.is_clean() => crate::EXIT_CLEAN,
        Some(after) if after.is_clean() => crate::EXIT_REPAIRED,
        Some(_) => crate::EXIT_ERRORS,
        None if o.before.is_clean() => crate::EXIT_CLEAN,
        None => crate::EXIT_ERRORS,
    }
}

fn show(args: &Args, paths: &[PathBuf], o: &Outcome) -> anyhow::Result<()> {
    if args.json {
        return render::repair_json(paths, o);
    }
    render::human(paths, &o.before);
    render::plan(&o.plan);
    if let Some(r) = &o.plan.refused {
        println!("repair refused, nothing written: {r}");
    } else if o.committed {
        for c in &o.changes {
            println!("  {c}");
        }
        println!("repairs committed; checking again:");
        if let Some(after) = &o.after {
            render::human(paths, after);
        }
    } else if args.dry_run && !o.plan.is_empty() {
        println!("dry run: nothing written");
    }
    Ok(())
}
