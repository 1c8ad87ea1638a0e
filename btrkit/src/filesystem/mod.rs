//! `btrkit filesystem`: btrfs(8)'s `filesystem` group.

mod compsize;
mod df;
mod du;
mod label;
mod resize;
mod sync;
mod usage;

use clap::Subcommand;

/// The `filesystem` group's arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Allocation and use per type, profile and device, and the free space
    /// a mount reports (as `btrfs filesystem usage`).
    Usage(usage::Args),
    /// Space per block group type and profile (as `btrfs filesystem df`).
    Df(df::Args),
    /// Per file and directory: total, exclusive and set-shared bytes (as
    /// `btrfs filesystem du`).
    Du(du::Args),
    /// Disk usage and uncompressed size by compression algorithm (as
    /// compsize).
    Compsize(compsize::Args),
    /// Grow or shrink a device (as `btrfs filesystem resize`); changes the
    /// image.
    Resize(resize::Args),
    /// Print or set the filesystem's label (as `btrfs filesystem label`).
    Label(label::Args),
    /// Commit a mounted filesystem: a `btrkit-mount --rw` mount or the
    /// kernel's (as `btrfs filesystem sync`).
    Sync(sync::Args),
}

/// Run the command.
pub fn run(a: &Args) -> anyhow::Result<()> {
    match &a.cmd {
        Cmd::Usage(a) => usage::run(a),
        Cmd::Df(a) => df::run(a),
        Cmd::Du(a) => du::run(a),
        Cmd::Compsize(a) => compsize::run(a),
        Cmd::Resize(a) => resize::run(a),
        Cmd::Label(a) => label::run(a),
        Cmd::Sync(a) => sync::run(a),
    }
}
