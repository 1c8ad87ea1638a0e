//! `rescue super-recover`: the best superblock copy, to every copy.

use crate::cli::Common;
use btrkit_core::rescue::super_recover::super_recover;

pub fn run(common: &Common, yes: bool, dry_run: bool) -> anyhow::Result<i32> {
    if !dry_run {
        // What would be written first: nothing to do needs no answer.
        let look = super_recover(&common.images, true)?;
        if look.copies.iter().all(|c| !c.written) {
            return super::show(common, "super-recover", &look);
        }
        match super::confirmed(yes, "super-recover")? {
            None => return Ok(crate::EXIT_USAGE),
            Some(false) => {
                eprintln!("btrkit-fsck: nothing written");
                return Ok(crate::EXIT_ERRORS);
            }
            Some(true) => {}
        }
    }
    let r = super_recover(&common.images, dry_run)?;
    super::show(common, "super-recover", &r)
}
