//! btrkit-shell: run workload scripts on a Btrfs image through btrkit's own
//! engine, or an interactive shell on one.

mod interactive;
mod run;

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "btrkit-shell",
    version,
    about = "Run a workload script on a Btrfs image through btrkit's engine (interactive without a script)",
    after_help = "The script language is the one of the kernel oracle (kcrash.py): mkfs/fssize/mount directives, \
steps (mkdir, write, fsync, rename, crash, ...) and expect lines, plus read, ls, stat, stats [--json] and \
set NAME on|off.\n\nExamples:\n  btrkit-shell disk.img workload.scn      # disk.img is made from the script's mkfs/fssize if missing\n  \
echo 'write /f 0 4K' | btrkit-shell disk.img -\n  btrkit-shell disk.img                   # interactive"
)]
struct Cli {
    /// The image (created by the script's `mkfs` and `fssize` when missing).
    image: PathBuf,
    /// Script file, or `-` for standard input. Without one on a terminal:
    /// an interactive shell.
    script: Option<String>,
    /// Print nothing but errors and the output of inspection steps.
    #[arg(short, long)]
    quiet: bool,
}

fn main() {
    let cli = Cli::parse();
    let code = match &cli.script {
        Some(s) => run::run_script(&cli.image, s, cli.quiet),
        None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => interactive::run(&cli.image),
        None => run::run_script(&cli.image, "-", cli.quiet),
    };
    std::process::exit(code);
}
