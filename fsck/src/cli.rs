//! Command line.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "btrkit-fsck",
    version,
    // `btrkit-fsck IMAGE...` checks; `btrkit-fsck rescue NAME IMAGE...`
    // runs one of btrfs rescue's commands. A first word `rescue` is the
    // subcommand (an image of that name is `./rescue`), and the check's
    // flags do not mix with it.
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    about = "Check a Btrfs image: superblocks, chunks, every tree block, extent refs, free space, subvolumes, checksums and the fsync log; read-only unless --repair",
    after_help = "Exit codes (as fsck(8)): 0 clean, 1 errors repaired (clean now), 4 errors found (or left), 8 could not check or repair, 16 usage error.\n\nExamples:\n  btrkit-fsck disk.img\n  btrkit-fsck a.img b.img          (a filesystem on two devices)\n  btrkit-fsck --degraded a.img     (one device of a RAID1 set missing)\n  btrkit-fsck --check-data-csum disk.img\n  btrkit-fsck --check-mirrors disk.img\n  btrkit-fsck --json crash.img | jq '.findings[]'\n  btrkit-fsck --qgroup-report disk.img   (quota counts: on disk, recomputed)\n  btrkit-fsck --repair --dry-run disk.img   (the plan: finding -> action)\n  btrkit-fsck --repair --yes disk.img\n  btrkit-fsck --repair --clear-space-cache v2 --yes disk.img\n  btrkit-fsck rescue chunk-recover -y disk.img   (btrfs rescue's commands: btrkit-fsck rescue --help)"
)]
pub struct Args {
    /// `btrfs rescue`'s commands.
    #[command(subcommand)]
    pub command: Option<Command>,
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

/// Commands beside the check.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// The `btrfs rescue` commands: narrow repairs of one kind of damage,
    /// for when the check cannot open the filesystem or --repair does not
    /// take the damage on.
    #[command(
        after_help = "Exit codes: 0 nothing to do, 1 repaired, 4 something left (or, with --dry-run/--readonly, something to do), 8 failed, 16 usage error.\n\nbtrfs rescue -> btrkit-fsck rescue (IMAGE... = the image and the other devices of a set, any order):\n  chunk-recover, super-recover, zero-log, fix-device-size, fix-data-checksum,\n  clear-uuid-tree, clear-ino-cache; clear-space-cache is `btrkit-fsck --repair --clear-space-cache v1|v2`.\n\nExamples:\n  btrkit-fsck rescue chunk-recover -y disk.img\n  btrkit-fsck rescue chunk-recover --dry-run --json a.img b.img\n  btrkit-fsck rescue super-recover -y disk.img\n  btrkit-fsck rescue zero-log disk.img\n  btrkit-fsck rescue fix-device-size disk.img\n  btrkit-fsck rescue fix-data-checksum --readonly disk.img\n  btrkit-fsck rescue fix-data-checksum --mirror 1 disk.img\n  btrkit-fsck rescue clear-uuid-tree disk.img\n  btrkit-fsck rescue clear-ino-cache disk.img"
    )]
    Rescue {
        /// Which one.
        #[command(subcommand)]
        cmd: Rescue,
    },
}

/// The image, the devices, and what every rescue command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// The image file (or block device), and the other devices of a
    /// filesystem on several devices, in any order.
    #[arg(required = true, num_args = 1.., value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `btrfs rescue`'s commands.
#[derive(Subcommand, Debug)]
pub enum Rescue {
    /// Rebuild the chunk tree and the superblock's sys_chunk_array from a
    /// scan of the devices (tree blocks, block group items, dev extents),
    /// also when both are destroyed; verified against the tree blocks and
    /// data checksums found, then written in one commit.
    #[command(
        after_help = "As btrfs rescue chunk-recover, which needs a readable sys_chunk_array; this does not.\n\nExamples:\n  btrkit-fsck rescue chunk-recover -y disk.img\n  btrkit-fsck rescue chunk-recover --dry-run disk.img   (scan, rebuild and verify; write nothing)\n  btrkit-fsck rescue chunk-recover -y --json a.img b.img"
    )]
    ChunkRecover {
        #[command(flatten)]
        common: Common,
        /// Do not ask (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
        /// Scan, rebuild and verify; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Write the newest superblock copy whose trees read to every copy of
    /// every device.
    #[command(
        after_help = "Examples:\n  btrkit-fsck rescue super-recover -y disk.img\n  btrkit-fsck rescue super-recover --dry-run a.img b.img"
    )]
    SuperRecover {
        #[command(flatten)]
        common: Common,
        /// Do not ask (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
        /// Show what would be written; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Clear the fsync log pointer in every superblock copy. The data and
    /// names the log holds are thrown away: `btrkit-replay` replays them
    /// instead.
    #[command(
        after_help = "Examples:\n  btrkit-replay disk.img            (replays the log: usually what you want)\n  btrkit-fsck rescue zero-log disk.img"
    )]
    ZeroLog {
        #[command(flatten)]
        common: Common,
        /// Show what would be cleared; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Make the device items' and the superblock's sizes consistent with
    /// the devices and the dev extents (total_bytes sector aligned).
    #[command(after_help = "Examples:\n  btrkit-fsck rescue fix-device-size disk.img")]
    FixDeviceSize {
        #[command(flatten)]
        common: Common,
        /// Show the changes; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Read every checksummed data sector (every copy); rewrite a bad copy
    /// from one that matches its checksum, report the rest.
    #[command(
        after_help = "Options as btrfs rescue fix-data-checksum (btrfs-progs 6.16): --readonly, --mirror N (no --interactive).\n\nExamples:\n  btrkit-fsck rescue fix-data-checksum --readonly disk.img\n  btrkit-fsck rescue fix-data-checksum disk.img      (bad copies rewritten from good ones)\n  btrkit-fsck rescue fix-data-checksum --mirror 1 --json disk.img"
    )]
    FixDataChecksum {
        #[command(flatten)]
        common: Common,
        /// Report only; write nothing.
        #[arg(long, short = 'r', alias = "dry-run")]
        readonly: bool,
        /// For sectors no copy of which matches its checksum: record the
        /// checksum of copy N's data in the checksum tree (counted from 1)
        /// and make the other copies equal to it. Only when that copy's
        /// data is known to be right.
        #[arg(long, short = 'm', value_name = "N")]
        mirror: Option<usize>,
    },
    /// Delete the UUID tree (the kernel builds it again at the next
    /// read-write mount).
    #[command(after_help = "Examples:\n  btrkit-fsck rescue clear-uuid-tree disk.img")]
    ClearUuidTree {
        #[command(flatten)]
        common: Common,
        /// Show the change; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove what the deprecated inode cache left in every subvolume.
    #[command(after_help = "Examples:\n  btrkit-fsck rescue clear-ino-cache disk.img")]
    ClearInoCache {
        #[command(flatten)]
        common: Common,
        /// Show the changes; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}
