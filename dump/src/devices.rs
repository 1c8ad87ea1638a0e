//! The devices a command reads: one image, or every device of a
//! filesystem on several devices.

use btrkit_core::devices::DeviceSet;
use btrkit_core::image::{Image, OpenOptions};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct Devices {
    /// The image file or block device, and the other devices of a
    /// filesystem on several devices (any order).
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// Another device of the filesystem (repeatable; as `mount -o device=`).
    #[arg(long = "device", value_name = "PATH")]
    pub devices: Vec<PathBuf>,
    /// Read a filesystem on several devices with some missing (as `mount
    /// -o degraded`): what only they held cannot be shown.
    #[arg(long)]
    pub degraded: bool,
}

impl Devices {
    /// Every device given.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.images.iter().chain(&self.devices).cloned().collect()
    }

    /// The first device given (what JSON output names as the image).
    pub fn first(&self) -> &Path {
        &self.images[0]
    }

    /// Open the filesystem read-only, damaged blocks returned with their
    /// problems.
    pub fn open(&self) -> anyhow::Result<Image> {
        let paths = self.paths();
        let opts = OpenOptions {
            lenient: true,
            degraded: self.degraded,
            ..Default::default()
        };
        DeviceSet::open_paths(&paths, opts).map_err(|e| match e {
            // I/O errors already name the path.
            e @ btrkit_core::Error::Io { .. } => anyhow::Error::new(e),
            e if paths.len() == 1 => anyhow::anyhow!("{}: {e}", paths[0].display()),
            e => anyhow::Error::new(e),
        })
    }
}
