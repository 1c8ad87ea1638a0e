//! `rescue chunk-recover`: scan, rebuild, verify; then (asked first) write.

use crate::cli::Common;
use crate::progress::Bar;
use btrkit_core::rescue::chunk_recover::{chunk_recover, Options};

pub fn run(common: &Common, yes: bool, dry_run: bool) -> anyhow::Result<i32> {
    if !dry_run {
        match super::confirmed(yes, "chunk-recover")? {
            None => return Ok(crate::EXIT_USAGE),
            Some(false) => {
                eprintln!("btrkit-fsck: nothing written");
                return Ok(crate::EXIT_ERRORS);
            }
            Some(true) => {}
        }
    }
    // The scan reads every byte of every device: a bar when stderr is a
    // terminal.
    let bar = Bar::new(true);
    let r = chunk_recover(&common.images, Options { dry_run }, &bar);
    bar.finish();
    super::show(common, "chunk-recover", &r?)
}
