//! Phase B of a checksum conversion: every tree block and every
//! superblock copy rewritten in place with the new checksum, under
//! CHANGING_META_CSUM.
//!
//! Tree blocks first (the shared in-place rewriter: every copy, RAID5/6
//! parity kept; a block already carrying the new checksum is skipped, so a
//! rerun only does what is left), flushed; then each device's superblock
//! copies with `csum_type` set to the new algorithm and checksummed in it,
//! the flag still set, flushed. A crash anywhere here leaves tree blocks
//! in either algorithm under a set flag; the superblocks are each whole (a
//! 4 KiB write), in the old algorithm or the new, and the flag stays set in
//! both until the engine's final commit clears it.

use super::super::Ctx;
use crate::csum::CsumType;
use crate::format::consts::*;
use crate::image::{first_valid_superblock, read_superblock};
use crate::rescue::{copies_on, write_super_copy};
use crate::{Error, Result};

/// Rewrite every tree block and superblock in `to`; the report's lines.
pub(super) fn run(ctx: &Ctx, from: CsumType, to: CsumType) -> Result<Vec<String>> {
    let mut lines = rewrite_blocks(ctx, from, to)?;
    for (_, d) in &ctx.devs {
        d.flush()?;
    }
    let mut copies = 0usize;
    for (name, d) in &ctx.devs {
        // A primary torn by a crash in this very step is rebuilt from a
        // mirror: every copy of a device's superblock has the same fields.
        let mut sb = match read_superblock(d.as_ref(), 0) {
            Ok(sb) => sb,
            Err(_) => first_valid_superblock(d.as_ref())
                .map_err(|e| Error::Invalid(format!("{name}: no valid superblock: {e}")))?,
        };
        if sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_META_CSUM == 0 {
            return Err(Error::Internal(format!(
                "{name}: CHANGING_META_CSUM not set when writing the superblocks"
            )));
        }
        sb.csum_type.set(to.to_disk());
        for m in 0..copies_on(d.size()) {
            write_super_copy(d.as_ref(), &sb, m, to)?;
            copies += 1;
        }
    }
    for (_, d) in &ctx.devs {
        d.flush()?;
    }
    lines.push(format!(
        "{copies} superblock cop{} written in {}",
        if copies == 1 { "y" } else { "ies" },
        to.name()
    ));
    Ok(lines)
}

/// Every tree block rewritten with the new checksum.
fn rewrite_blocks(_ctx: &Ctx, _from: CsumType, _to: CsumType) -> Result<Vec<String>> {
    Err(Error::Unsupported(
        "the metadata phase of --csum waits for the in-place rewriter".into(),
    ))
}
