//! `rescue clear-ino-cache`: remove the deprecated inode cache.

use crate::cli::Common;
use btrkit_core::rescue::clear_ino_cache::clear_ino_cache;

pub fn run(common: &Common, dry_run: bool) -> anyhow::Result<i32> {
    let r = clear_ino_cache(&common.images, dry_run)?;
    super::show(common, "clear-ino-cache", &r)
}
