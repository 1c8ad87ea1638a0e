//! btrkit: btrfs(8)'s commands on images, offline. Command groups carry
//! btrfs' names (`btrkit filesystem usage`); where btrfs names a mount
//! point, btrkit names the image and the set's other devices, last. One
//! module per group, one per command; the work is in btrkit-core.

mod balance;
mod common;
mod device;
mod filesystem;
mod inspect;
mod property;
mod receive;
mod send;
mod subvolume;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "btrkit",
    version,
    about = "btrfs(8)'s commands on Btrfs images, without mounting them",
    after_help = "Examples:\n  btrkit filesystem usage -b disk.img\n  btrkit filesystem df a.img b.img          a filesystem on two devices\n  btrkit filesystem du -s disk.img --path /home\n  btrkit filesystem compsize disk.img --json\n  btrkit balance start -dusage=50 disk.img\n  btrkit filesystem resize -1g disk.img\n\nThe reporting commands read the image, never write it (the fsync log is applied in memory, the state a mount shows, or ignored with --no-log); balance and resize change it in place, never while it is mounted.\n\nExit status: 0 success, 1 the image cannot be read (one line on stderr), 16 usage."
)]
struct Cli {
    #[command(subcommand)]
    group: Group,
}

/// The command groups, as btrfs(8) names them.
#[derive(Subcommand)]
enum Group {
    /// Space usage: usage, df, du, compsize.
    #[command(visible_alias = "fi")]
    Filesystem(filesystem::Args),
    /// Relocate block groups: compact, convert profiles (changes the
    /// images).
    Balance(balance::Args),
    /// Add, remove and replace devices (changes the images).
    Device(device::Args),
    /// Create, snapshot, delete and list subvolumes (create, snapshot,
    /// delete and set-default change the images).
    #[command(visible_alias = "sub")]
    Subvolume(subvolume::Args),
    /// Get and set properties: ro, compression, label.
    #[command(visible_alias = "prop")]
    Property(property::Args),
    /// Low-level questions: min-dev-size.
    InspectInternal(inspect::Args),
    /// Write a stream of a read-only snapshot (as btrfs send).
    Send(send::Args),
    /// Apply send streams into an image (as btrfs receive).
    Receive(receive::Args),
}

fn main() {
    btrkit_cli::generate::handle::<Cli>();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let usage = !matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            let _ = e.print();
            std::process::exit(if usage { 16 } else { 0 });
        }
    };
    let r = match &cli.group {
        Group::Filesystem(a) => filesystem::run(a),
        Group::Balance(a) => balance::run(a),
        Group::Device(a) => device::run(a),
        Group::Subvolume(a) => subvolume::run(a),
        Group::Property(a) => property::run(a),
        Group::InspectInternal(a) => inspect::run(a),
        Group::Send(a) => send::run(a),
        Group::Receive(a) => receive::run(a),
    };
    if let Err(e) = r {
        eprintln!("btrkit: error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
