//! `fix-device-size`: every device item's `total_bytes` aligned down to
//! the sector size and no larger than its device (never below its last
//! dev extent), its `bytes_used` what its dev extents add up to, and the
//! superblock's `total_bytes` and `num_devices` their sum and count
//! (btrfs-progs `btrfs rescue fix-device-size`, which aligns the sizes
//! only). The same primitive `btrkit-fsck --repair` uses for its
//! "superblock" class ([`crate::trans::Store::fix_device_sizes`]), run on
//! its own in one transaction.

use super::{open_store, TreeChange};
use crate::Result;
use std::path::PathBuf;

/// Make the device sizes consistent on the filesystem at `paths`.
pub fn fix_device_size(paths: &[PathBuf], dry_run: bool) -> Result<TreeChange> {
    let mut st = open_store(paths, dry_run)?;
    let mut out = TreeChange::new("fix-device-size", dry_run);
    out.changes = st.repair().fix_device_sizes()?;
    out.finish(st)?;
    Ok(out)
}
