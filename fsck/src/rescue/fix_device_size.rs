//! `rescue fix-device-size`: device and superblock sizes made consistent.

use crate::cli::Common;
use btrkit_core::rescue::fix_device_size::fix_device_size;

pub fn run(common: &Common, dry_run: bool) -> anyhow::Result<i32> {
    let r = fix_device_size(&common.images, dry_run)?;
    super::show(common, "fix-device-size", &r)
}
