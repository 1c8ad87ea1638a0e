//! Command-line arguments shared by the btrkit binaries, flattened into
//! each one's own clap arguments (`#[command(flatten)]`).

pub mod generate;
pub mod progress;

use btrkit_core::restore::{LogMode, ReadOptions, RootChoice};
use std::path::PathBuf;

/// How a binary that reads an image without writing it (`btrkit-mount`,
/// `btrkit-restore`) finds and opens the filesystem: the other devices,
/// the fsync log, the superblock copy and the tree root. The positional
/// image paths stay the binary's own (their value name says what follows
/// them). Help texts name what is shown ("show the state of the last
/// commit"); a binary with other words overrides them with `mut_arg`.
#[derive(clap::Args, Clone, Debug)]
pub struct ReadArgs {
    /// Another device of the filesystem (repeatable; as `mount -o device=`).
    #[arg(long = "device", value_name = "PATH")]
    pub devices: Vec<PathBuf>,
    /// Read a filesystem on several devices with some missing.
    #[arg(long)]
    pub degraded: bool,
    /// Ignore the fsync log: show the state of the last commit.
    #[arg(long)]
    pub no_log: bool,
    /// The log is damaged: apply what the rest of it still proves.
    #[arg(long, conflicts_with = "no_log")]
    pub salvage: bool,
    /// Start from superblock copy N (0 primary, 1 and 2 the mirrors).
    #[arg(short = 's', long = "super", default_value_t = 0, value_name = "N")]
    pub mirror: usize,
    /// Read from backup root slot N of the superblock (an older commit).
    #[arg(long, value_name = "N", conflicts_with = "tree_root")]
    pub backup: Option<usize>,
    /// Read from the root tree node at this logical address.
    #[arg(short = 't', long = "tree-root", value_name = "BYTENR")]
    pub tree_root: Option<u64>,
}

impl ReadArgs {
    /// The device paths: `images` (the positional ones), then `--device`s.
    pub fn paths(&self, images: &[PathBuf]) -> Vec<PathBuf> {
        images.iter().chain(self.devices.iter()).cloned().collect()
    }

    /// What `--no-log` and `--salvage` ask of the log.
    pub fn log_mode(&self) -> LogMode {
        LogMode::from_flags(self.no_log, self.salvage)
    }

    /// The tree root `--backup` or `--tree-root` chose.
    pub fn root(&self) -> RootChoice {
        RootChoice::from_flags(self.backup, self.tree_root)
    }

    /// The options of the virtual open, with the log as `log`.
    pub fn read_options(&self, log: LogMode) -> ReadOptions {
        ReadOptions {
            log,
            degraded: self.degraded,
            mirror: self.mirror,
            root: self.root(),
        }
    }
}
