//! Incompat flags: no-holes (`-n`) and extended inode refs (`-r`), which
//! only change what the kernel writes from now on, and skinny metadata
//! (`-x`), for which every tree block's EXTENT_ITEM is rewritten as a
//! METADATA_ITEM.

use super::{done, open_store};
use crate::format::consts::*;
use crate::format::extent::{EXTENT_ITEM_SIZE, TREE_BLOCK_INFO_SIZE};
use crate::format::key::Key;
use crate::tune::{Ctx, Step};
use crate::Result;

const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;

/// Set incompat `bit` in one commit (btrfstune sets these flags in a
/// transaction commit too), unless it is set.
fn set_flag(ctx: &mut Ctx, op: &'static str, bit: u64, name: &str) -> Result<Step> {
    let mut st = open_store(ctx)?;
    if st.sb().incompat_flags.get() & bit != 0 {
        return Ok(Step::already(op, format!("{name} is already on")));
    }
    st.set_incompat(bit);
    st.commit()?;
    Ok(done(op, vec![format!("incompat feature {name} set")]))
}

/// `-n`: incompat NO_HOLES. Files keep their hole extent items; new
/// holes are written without them.
pub fn no_holes(ctx: &mut Ctx) -> Result<Step> {
    set_flag(ctx, "no-holes", BTRFS_FEATURE_INCOMPAT_NO_HOLES, "NO_HOLES")
}

/// `-r`: incompat EXTENDED_IREF. Existing inode refs stay; a link that
/// no longer fits an inode ref gets an extref.
pub fn extref(ctx: &mut Ctx) -> Result<Step> {
    set_flag(
        ctx,
        "extref",
        BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF,
        "EXTENDED_IREF",
    )
}

/// `-x`: incompat SKINNY_METADATA, and every tree block's EXTENT_ITEM
/// (with its `btrfs_tree_block_info`) rewritten as a METADATA_ITEM keyed
/// by level, its inline references kept, in the same commit. btrfstune
/// only sets the flag (the kernel reads both forms); rewriting leaves one
/// form in the extent tree.
///
/// The flag is set before the first edit: the extent tree blocks this
/// transaction allocates (its own copy-on-write) get METADATA_ITEMs from
/// the start, and references to the blocks it frees are found under
/// either key.
pub fn skinny_metadata(ctx: &mut Ctx) -> Result<Step> {
    let mut st = open_store(ctx)?;
    if st.skinny() {
        // Already skinny: items of the old form are legal and the kernel
        // keeps them, so there is nothing to do (as btrfstune).
        return Ok(Step::already(
            "skinny-metadata",
            "SKINNY_METADATA is already on",
        ));
    }
    st.set_incompat(BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA);
    ctx.progress
        .phase(1, "skinny metadata", st.sb().bytes_used.get());
    let ns = st.nodesize() as u64;
    let mut converted = 0u64;
    super::each_extent_item(&mut st, |st, key, data, v| {
        let Some(tbi) = v.tree_block_info else {
            return Ok(());
        };
        let level = tbi.level;
        let mut new = Vec::with_capacity(data.len() - TREE_BLOCK_INFO_SIZE);
        new.extend_from_slice(&data[..EXTENT_ITEM_SIZE]);
        new.extend_from_slice(&data[EXTENT_ITEM_SIZE + TREE_BLOCK_INFO_SIZE..]);
        st.delete_item(EXTENT, key)?;
        st.insert_item(
            EXTENT,
            &Key::new(key.objectid, BTRFS_METADATA_ITEM_KEY, level as u64),
            &new,
        )?;
        converted += 1;
        ctx.progress.advance(ns);
        Ok(())
    })?;
    st.commit()?;
    Ok(done(
        "skinny-metadata",
        vec![
            "incompat feature SKINNY_METADATA set".into(),
            format!("{converted} tree block extent items rewritten as METADATA_ITEMs"),
        ],
    ))
}
