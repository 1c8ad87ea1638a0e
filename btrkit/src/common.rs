//! What every command that reads an image shares: its devices and how the
//! log is read, the units sizes are printed in.

use anyhow::Context;
use btrkit_core::io::FileDevice;
use btrkit_core::restore::{LogMode, ReadOptions};
use btrkit_core::usage::Opened;
use std::path::PathBuf;

/// The image and how it is opened.
#[derive(clap::Args, Clone, Debug)]
pub struct ImageArgs {
    /// The image, and the other devices of a filesystem on several devices
    /// (any order).
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
    /// Ignore the fsync log: read the state of the last commit (by default
    /// the log is applied in memory, as a mount would).
    #[arg(long)]
    pub no_log: bool,
    /// Read a filesystem on several devices with some missing.
    #[arg(long)]
    pub degraded: bool,
}

impl ImageArgs {
    /// Open the filesystem read-only; a note about the log goes to stderr.
    pub fn open(&self) -> anyhow::Result<Opened> {
        let devs = FileDevice::open_all_mmap(&self.images)?;
        let o = btrkit_core::usage::open(
            devs,
            &ReadOptions {
                log: if self.no_log {
                    LogMode::Ignore
                } else {
                    LogMode::Replay
                },
                degraded: self.degraded,
                ..Default::default()
            },
        )
        .context("opening the filesystem")?;
        if let Some(n) = &o.note {
            eprintln!("btrkit: warning: {n}");
        }
        Ok(o)
    }
}

/// A size as btrfs prints it: bytes with `-b`, else binary units with two
/// decimals (`1.50MiB`).
pub fn size(bytes: u64, raw: bool) -> String {
    if raw {
        return bytes.to_string();
    }
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut u = 0;
    let mut d = 1u64;
    while u + 1 < UNITS.len() && bytes / d >= 1024 {
        d *= 1024;
        u += 1;
    }
    format!("{:.2}{}", bytes as f64 / d as f64, UNITS[u])
}

/// [`size`] of a value that may be negative (unallocated space of an
/// over-committed device).
pub fn ssize(v: i64, raw: bool) -> String {
    if v < 0 {
        format!("-{}", size(v.unsigned_abs(), raw))
    } else {
        size(v as u64, raw)
    }
}
