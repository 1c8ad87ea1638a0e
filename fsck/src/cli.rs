//! Command line.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "btrkit-fsck",
    version,
    about = "Check a Btrfs image read-only: superblocks, chunks, every tree block, extent refs, free space, subvolumes, checksums and the fsync log",
    after_help = "Exit codes (as fsck(8)): 0 clean, 4 errors found, 8 could not check, 16 usage error.\n\nExamples:\n  btrkit-fsck disk.img\n  btrkit-fsck --check-data-csum disk.img\n  btrkit-fsck --check-mirrors disk.img\n  btrkit-fsck --json crash.img | jq '.findings[]'"
)]
pub struct Args {
    /// The image file (or block device) to check. It is never written.
    pub image: PathBuf,
    /// Also read every data sector that has a checksum and verify it.
    #[arg(long)]
    pub check_data_csum: bool,
    /// Also read and verify the second copy of every DUP tree block, as a
    /// metadata scrub would (btrfs check reads one good copy). A damaged
    /// copy is a warning: reads use the good one.
    #[arg(long)]
    pub check_mirrors: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Show a progress bar on stderr (only when stderr is a terminal).
    #[arg(long)]
    pub progress: bool,
}
