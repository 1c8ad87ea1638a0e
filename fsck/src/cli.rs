//! Command line.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "btrkit-fsck",
    version,
    about = "Check a Btrfs image: superblocks, chunks, every tree block, extent refs, free space, subvolumes, checksums and the fsync log; read-only unless --repair",
    after_help = "Exit codes (as fsck(8)): 0 clean, 1 errors repaired (clean now), 4 errors found (or left), 8 could not check or repair, 16 usage error.\n\nExamples:\n  btrkit-fsck disk.img\n  btrkit-fsck a.img b.img          (a filesystem on two devices)\n  btrkit-fsck --degraded a.img     (one device of a RAID1 set missing)\n  btrkit-fsck --check-data-csum disk.img\n  btrkit-fsck --check-mirrors disk.img\n  btrkit-fsck --json crash.img | jq '.findings[]'\n  btrkit-fsck --qgroup-report disk.img   (quota counts: on disk, recomputed)\n  btrkit-fsck --repair --dry-run disk.img   (the plan: finding -> action)\n  btrkit-fsck --repair --yes disk.img\n  btrkit-fsck --repair --clear-space-cache v2 --yes disk.img"
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
    /// Print every quota group's referenced and exclusive bytes as on disk
    /// and as recomputed from the trees, with the differences (as `btrfs
    /// check --qgroup-report`), instead of the findings; `--repair`
    /// recounts them. The exit code is still the whole check's.
    #[arg(long, conflicts_with = "repair")]
    pub qgroup_report: bool,
    /// Show a progress bar on stderr (only when stderr is a terminal).
    #[arg(long)]
    pub progress: bool,
    /// Repair what what is on disk determines (free space, block group
    /// and superblock counts, inode link counts and sizes, unlinked
    /// inodes, quota groups), in one transaction: interrupted, the image
    /// is either as it was or repaired. Everything else is listed as not
    /// repairable and left alone.
    #[arg(long)]
    pub repair: bool,
    /// With --repair: print the plan (finding -> action), write nothing.
    #[arg(long, requires = "repair")]
    pub dry_run: bool,
    /// With --repair: do not ask (needed when stdin is not a terminal).
    #[arg(long, short = 'y', requires = "repair")]
    pub yes: bool,
    /// With --repair: rebuild the checksum tree from the data as it is
    /// (it trusts the data: only when the checksums, not the data, are bad).
    #[arg(long, requires = "repair")]
    pub init_csum_tree: bool,
    /// With --repair: clear the v1 free space cache (v1) or rebuild the
    /// free space tree from the extent tree (v2), whether or not they are
    /// damaged, and nothing else: no check before or after, as btrfs check
    /// does it (with --dry-run or --init-csum-tree, part of the full
    /// repair instead).
    #[arg(long, value_name = "v1|v2", requires = "repair", value_parser = ["v1", "v2"])]
    pub clear_space_cache: Option<String>,
}
