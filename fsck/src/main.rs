//! btrkit-fsck: check a Btrfs image without changing it, or repair it
//! with `--repair`. Exit codes follow fsck(8): 0 clean, 1 errors repaired,
//! 4 errors found or left, 8 the image could not be checked, 16 usage error.
//! `btrkit-fsck rescue NAME IMAGE...` runs one of btrfs rescue's commands.

mod cli;
use btrkit_cli::progress;
mod render;
mod repair;
mod rescue;

use clap::Parser;

pub(crate) const EXIT_CLEAN: i32 = 0;
pub(crate) const EXIT_REPAIRED: i32 = 1;
pub(crate) const EXIT_ERRORS: i32 = 4;
const EXIT_FAILED: i32 = 8;
pub(crate) const EXIT_USAGE: i32 = 16;

fn main() {
    btrkit_cli::generate::handle::<cli::Args>();
    let args = match cli::Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() {
                EXIT_USAGE
            } else {
                EXIT_CLEAN
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    // The engine never panics on disk data by design; should it ever, the
    // caller still gets one line and the "could not check" exit code.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("btrkit-fsck: internal error: {info}");
    }));
    let code = match std::panic::catch_unwind(|| run(&args)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            // Engine errors already carry their cause in one line.
            eprintln!("btrkit-fsck: error: {}", e.to_string().replace('\n', " "));
            EXIT_FAILED
        }
        Err(_) => EXIT_FAILED,
    };
    std::process::exit(code);
}

fn run(args: &cli::Args) -> anyhow::Result<i32> {
    // The checker reads thousands of node-sized blocks into short-lived buffers.
    btrkit_core::io::host::keep_freed_heap();
    if let Some(cli::Command::Rescue { cmd }) = &args.command {
        return rescue::run(cmd);
    }
    // `btrkit-fsck --json rescue ...`: the check's flags before `rescue`
    // make it an image name; say how it is spelled instead.
    if args
        .images
        .first()
        .is_some_and(|p| p.as_os_str() == "rescue" && !p.exists())
    {
        eprintln!(
            "btrkit-fsck: `rescue` comes first, its options after its name: btrkit-fsck rescue NAME [OPTIONS] IMAGE..."
        );
        return Ok(EXIT_USAGE);
    }
    let bar = progress::Bar::new(args.progress);
    let opts = btrkit_core::check::CheckOptions {
        check_data_csum: args.check_data_csum,
        check_mirrors: args.check_mirrors,
        for_repair: false,
    };
    let paths: Vec<_> = args.images.iter().chain(&args.devices).cloned().collect();
    if args.repair {
        return repair::run(args, &paths, opts, &bar);
    }
    let report = btrkit_core::check::check_paths(&paths, args.degraded, opts, &bar)?;
    bar.finish();
    if args.qgroup_report {
        render::qgroup_report(args.json, &paths, &report)?;
    } else if args.json {
        render::json(&paths, &report)?;
    } else {
        render::human(&paths, &report);
    }
    Ok(if report.is_clean() {
        EXIT_CLEAN
    } else {
        EXIT_ERRORS
    })
}
