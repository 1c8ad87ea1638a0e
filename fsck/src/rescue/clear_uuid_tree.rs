//! `rescue clear-uuid-tree`: delete the UUID tree.

use crate::cli::Common;
use btrkit_core::rescue::clear_uuid_tree::clear_uuid_tree;

pub fn run(common: &Common, dry_run: bool) -> anyhow::Result<i32> {
    let r = clear_uuid_tree(&common.images, dry_run)?;
    super::show(common, "clear-uuid-tree", &r)
}
