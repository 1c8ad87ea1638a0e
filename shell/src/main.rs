//! btrkit-shell: run workload scripts on a Btrfs image through btrkit's own
//! engine, or an interactive shell on one.

mod bench;
mod explore;
mod interactive;
mod run;
mod verbs;

// The engine allocates and frees many small buffers per file operation
// (pages, item buffers, tree paths); mimalloc's per-size free lists keep
// that off glibc's bins (a fifth of the files benchmark's CPU time).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "btrkit-shell",
    version,
    about = "Run a workload script on a Btrfs image through btrkit's engine (interactive without a script)",
    after_help = "The script language is the one of the kernel oracle (kcrash.py): mkfs/fssize/mount directives, \
steps (mkdir, write, fsync, rename, crash, ...) and expect lines, plus read, ls, stat, stats [--json] and \
set NAME on|off.\n\nExamples:\n  btrkit-shell disk.img workload.scn      # disk.img is made from the script's mkfs/fssize if missing\n  \
echo 'write /f 0 4K' | btrkit-shell disk.img -\n  btrkit-shell disk.img                   # interactive\n  \
btrkit-shell explore disk.img workload.scn --random 4 --json\n  \
btrkit-shell a.img --device b.img raid1.scn     # raid1.scn says: devices 2, mkfs -m raid1 -d raid1\n  \
btrkit-shell verbs write                # a verb's syntax and an example (help VERB when interactive)\n\n\
Interactive: help [VERB], completion of verbs and of paths in the image (Tab), history in \
$XDG_STATE_HOME/btrkit/shell_history (~/.local/state/btrkit/shell_history).\n\n\
Exit status: 0 the script ran and every expectation holds, 1 a step or an expectation failed or \
the image could not be opened, 2 the script could not be read or parsed (or usage).",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// The image (created by the script's `mkfs` and `fssize` when missing).
    image: Option<PathBuf>,
    /// Script file, or `-` for standard input. Without one on a terminal:
    /// an interactive shell.
    script: Option<String>,
    /// Print nothing but errors and the output of inspection steps.
    #[arg(short, long)]
    quiet: bool,
    /// Another device of the filesystem (repeatable, devid order after
    /// IMAGE). Without it a script's `devices N` uses IMAGE-2.EXT ...
    /// beside IMAGE.
    #[arg(long = "device", value_name = "PATH")]
    devices: Vec<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Crash the script at every flush point (and random subsets of the
    /// unflushed writes), recover each image, check it and every fsync's
    /// promise; exit 1 on a violation.
    Explore(explore::ExploreArgs),
    /// Benchmarks on btrkit's engine (sysbench's fileio, dbench).
    #[command(
        subcommand,
        after_help = "Examples:\n  btrkit-shell bench fileio f.img --file-test-mode rndwr\n  \
btrkit-shell bench dbench d.img /usr/share/dbench/client.txt --clients 4\n\n\
Exit status: 0 done, 1 failed, 2 usage."
    )]
    Bench(bench::BenchCmd),
    /// List the script language's verbs, or show one: its syntax, what it
    /// does and an example (as `help VERB` in the interactive shell).
    #[command(
        after_help = "Examples:\n  btrkit-shell verbs\n  btrkit-shell verbs fsync\n\n\
Exit status: 0 shown, 2 no such verb (or usage)."
    )]
    Verbs {
        /// The verb to show; without one, all of them.
        #[arg(value_parser = verbs::value_parser(), hide_possible_values = true)]
        verb: Option<String>,
    },
}

/// Keep freed memory mapped. mimalloc's default hands memory unused for
/// 10 ms back to the kernel, so a writeback's multi-megabyte buffers and
/// pages go back between two fsyncs and the next ones fault in fresh pages
/// the kernel zeroes first (a tenth of dbench's CPU time; a one-second
/// delay still leaves part of it). What stays mapped is bounded by the
/// engine's own peak (dirty limit plus caches), which the process reaches
/// anyway. `MIMALLOC_PURGE_DELAY` still decides when set.
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // mimalloc.h's mi_option_purge_delay (15 in both of its versions;
        // the bindings name no constant for it); -1: never purge.
        const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
        // SAFETY: sets one of mimalloc's integer options; no memory is touched.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

fn main() {
    btrkit_cli::generate::handle::<Cli>();
    tune_allocator();
    let cli = Cli::parse();
    match &cli.cmd {
        Some(Cmd::Explore(a)) => std::process::exit(explore::run(a)),
        Some(Cmd::Bench(b)) => std::process::exit(bench::run(b)),
        Some(Cmd::Verbs { verb }) => {
            match verb.as_deref().and_then(verbs::find) {
                Some(v) => println!("{}", verbs::help(v)),
                None => println!("{}", verbs::overview()),
            }
            std::process::exit(0);
        }
        None => {}
    }
    let Some(image) = &cli.image else {
        eprintln!("btrkit-shell: error: an IMAGE is needed (see --help)");
        std::process::exit(2);
    };
    let code = match &cli.script {
        Some(s) => run::run_script(image, &cli.devices, s, cli.quiet),
        None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => {
            interactive::run(image, &cli.devices)
        }
        None => run::run_script(image, &cli.devices, "-", cli.quiet),
    };
    std::process::exit(code);
}
