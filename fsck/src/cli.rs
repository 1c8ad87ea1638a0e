//! Command line.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "btrkit-fsck",
    version,
    about = "Check a Btrfs image read-only: superblocks, chunks, every tree block, extent refs, free space, subvolumes, checksums and the fsync log",
    after_help = "Exit codes (as fsck(8)): 0 clean, 4 errors found, 8 could not check, 16 usage error.\n\nExamples:\n  btrkit-fsck disk.img\n  btrkit-fsck a.img b.img          (a filesystem on two devices)\n  btrkit-fsck --degraded a.img     (one device of a RAID1 set missing)\n  btrkit-fsck --check-data-csum disk.img\n  btrkit-fsck --check-mirrors disk.img\n  btrkit-fsck --json crash.img | jq '.findings[]'"
)]
pub struct Args {
    /// The image file (or block device) to check, and the other devices of
    /// a filesystem on several devices, in any order. Never written.
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// Another device of the filesystem (repeatable; as `mount -o device=`).
    #[arg(long = "device", value_name = "PATH")]
    pub devices: Vec<PathBuf>,
    /// Check a filesystem on several devices with some missing (as `mount
    /// -o degraded`): the missing devices are a warning, what only they
    /// held is reported where it is needed.
    #[arg(long)]
    pub degraded: bool,
    /// Also read every data sector that has a checksum and verify it.
    #[arg(long)]
    pub check_data_csum: bool,
    /// Also read and verify every other copy of every tree block (DUP,
    /// RAID1, RAID10 on every device), as a metadata scrub would (btrfs
    /// check reads one good copy). A damaged copy is a warning naming its
    /// device and offset: reads use the good one.
    #[arg(long)]
    pub check_mirrors: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Show a progress bar on stderr (only when stderr is a terminal).
    #[arg(long)]
    pub progress: bool,
}
