//! btrkit-dump: print the superblock, every tree, and the fsync log of a
//! Btrfs image. Read-only: the image is opened without write access.

mod devices;
mod heatmap;
mod json;
mod log;
mod render;
mod sink;
mod super_cmd;
mod text;
mod tree;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "btrkit-dump",
    version,
    about = "Inspect a Btrfs image: superblock, trees, and the fsync log",
    after_help = "Examples:\n  btrkit-dump super disk.img --all-mirrors\n  btrkit-dump tree a.img b.img --tree chunk   (a filesystem on two devices)\n  btrkit-dump tree disk.img --tree fs\n  btrkit-dump tree disk.img --block 30408704\n  btrkit-dump log crash.img --json\n  btrkit-dump heatmap disk.img -o disk.png\n\nExit status: 0 done, 1 an error (one line on stderr), 2 usage error; a subcommand's page names any other it uses."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print every superblock field, feature flags by name.
    Super(super_cmd::Args),
    /// Print trees as `btrfs inspect-internal dump-tree` does.
    Tree(tree::Args),
    /// Print the fsync log, one section per logged inode.
    Log(log::Args),
    /// Draw where block groups lie and how full they are (PNG or terminal).
    Heatmap(heatmap::Args),
}

fn main() {
    btrkit_cli::generate::handle::<Cli>();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Super(a) => super_cmd::run(a),
        Cmd::Tree(a) => tree::run(a),
        Cmd::Log(a) => log::run(a),
        Cmd::Heatmap(a) => heatmap::run(a),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the chain of causes joined, never a backtrace.
            eprintln!(
                "btrkit-dump: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            std::process::exit(1);
        }
    }
}
