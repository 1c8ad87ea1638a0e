//! `btrkit filesystem sync`.

use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `filesystem sync`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem sync /mnt      commit a btrkit-mount --rw mount (or the kernel's btrfs)\n\nsync(1) and syncfs(2) do not reach a FUSE server; this ioctl (BTRFS_IOC_SYNC, as\n`btrfs filesystem sync`) does. Images changed by btrkit's offline commands are\ncommitted when each command ends."
)]
pub struct Args {
    /// A file or directory on the mount.
    #[arg(value_name = "PATH")]
    path: PathBuf,
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    btrkit_core::io::host::btrfs_sync(&a.path).with_context(|| {
        format!(
            "{}: not on a btrfs mount or a btrkit-mount --rw mount",
            a.path.display()
        )
    })
}
