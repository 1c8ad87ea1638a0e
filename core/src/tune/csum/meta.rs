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
use crate::tune::rewrite::{rewrite_with, Accept, Options};
use crate::{Error, Result};

/// Rewrite every tree block and superblock in `to`; the report's lines.
pub(super) fn run(ctx: &Ctx, from: CsumType, to: CsumType, resumed: bool) -> Result<Vec<String>> {
    let mut lines = rewrite_blocks(ctx, from, to, resumed)?;
    super::prof("tree blocks rewritten");
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

/// Every tree block rewritten with the new checksum; `resumed`: an
/// interrupted run may have left copies of a block in either algorithm.
fn rewrite_blocks(ctx: &Ctx, from: CsumType, to: CsumType, resumed: bool) -> Result<Vec<String>> {
    let accept = Accept {
        fsids: Vec::new(),
        csums: vec![from, to],
    };
    let s = rewrite_with(
        &ctx.devs,
        &accept,
        to,
        &|_| false,
        Options { resumed },
        ctx.progress,
    )?;
    let mut lines = vec![format!(
        "{} tree blocks rewritten in {} ({} already were)",
        s.written,
        to.name(),
        s.already
    )];
    if s.stale > 0 {
        lines.push(format!(
            "{} extent records of tree blocks no tree uses and that do not read as tree blocks: left as they are",
            s.stale
        ));
    }
    Ok(lines)
}
