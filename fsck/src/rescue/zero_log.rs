//! `rescue zero-log`: clear the log pointer of every superblock copy.

use crate::cli::Common;
use btrkit_core::rescue::zero_log::zero_log;

pub fn run(common: &Common, dry_run: bool) -> anyhow::Result<i32> {
    let r = zero_log(&common.images, dry_run)?;
    super::show(common, "zero-log", &r)
}
