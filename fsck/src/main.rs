//! btrkit-fsck: check a Btrfs image without changing it. Exit codes follow
//! fsck(8): 0 clean, 4 errors found, 8 the image could not be checked.

mod cli;
mod progress;
mod render;

use clap::Parser;

const EXIT_CLEAN: i32 = 0;
const EXIT_ERRORS: i32 = 4;
const EXIT_FAILED: i32 = 8;

fn main() {
    let args = cli::Args::parse();
    // The engine never panics on disk data by design; should it ever, the
    // caller still gets one line and the "could not check" exit code.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("btrkit-fsck: internal error: {info}");
    }));
    let code = match std::panic::catch_unwind(|| run(&args)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            eprintln!("btrkit-fsck: error: {}", format!("{e:#}").replace('\n', " "));
            EXIT_FAILED
        }
        Err(_) => EXIT_FAILED,
    };
    std::process::exit(code);
}

fn run(args: &cli::Args) -> anyhow::Result<i32> {
    let bar = progress::Bar::new(args.progress);
    let opts = btrkit_core::check::CheckOptions { check_data_csum: args.check_data_csum };
    let report = btrkit_core::check::check_path(&args.image, opts, &bar)?;
    bar.finish();
    if args.json {
        render::json(&args.image, &report)?;
    } else {
        render::human(&args.image, &report);
    }
    Ok(if report.is_clean() { EXIT_CLEAN } else { EXIT_ERRORS })
}
