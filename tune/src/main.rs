//! btrkit-tune: change a Btrfs image after mkfs, offline, with
//! btrfstune's option names: a new fsid or metadata UUID (and new
//! subvolume UUIDs for a clone), another checksum algorithm, features
//! turned on or converted, the label, the seeding flag, quotas.
//! Exit codes: 0 done (or nothing to do), 1 the change failed or was
//! refused (nothing written, or an interrupted change a rerun finishes),
//! 2 usage error.

mod cli;
use btrkit_cli::progress;

use clap::Parser;

fn main() {
    btrkit_cli::generate::handle::<cli::Args>();
    let args = match cli::Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    std::panic::set_hook(Box::new(|info| {
        eprintln!("btrkit-tune: internal error: {info}");
    }));
    let code = match std::panic::catch_unwind(|| run(&args)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            eprintln!("btrkit-tune: error: {}", e.to_string().replace('\n', " "));
            1
        }
        Err(_) => 1,
    };
    std::process::exit(code);
}

fn run(args: &cli::Args) -> anyhow::Result<i32> {
    let req = args.request()?;
    let bar = progress::Bar::new(!args.quiet);
    let paths: Vec<_> = args.images.iter().chain(&args.devices).cloned().collect();
    let report = btrkit_core::tune::tune(&paths, &req, &bar)?;
    bar.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !args.quiet {
        for s in &report.steps {
            for l in &s.lines {
                println!("{}: {l}", s.op);
            }
        }
    }
    Ok(0)
}
