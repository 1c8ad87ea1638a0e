//! `--convert-to-free-space-tree`: the free space tree built from the
//! extent tree, compat_ro FREE_SPACE_TREE and FREE_SPACE_TREE_VALID set,
//! the v1 space cache removed (its header items in the root tree, its
//! inodes and their data), in one commit.
//!
//! The tree is written by the commit itself: every block group is marked
//! dirty, and a commit with the free space tree on writes each dirty
//! group's FREE_SPACE_INFO and its extent or bitmap items from the
//! allocator's view, which is derived from the extent tree (the same path
//! `btrkit-fsck --repair --clear-space-cache v2` takes). The superblock's
//! cache_generation ends at 0, as btrfstune and the kernel leave it once
//! the v1 cache is gone.

use super::{done, open_store};
use crate::format::consts::*;
use crate::tune::{Ctx, Step};
use crate::Result;

const FST: u64 = BTRFS_FREE_SPACE_TREE_OBJECTID;

/// `--convert-to-free-space-tree`.
pub fn free_space_tree(ctx: &mut Ctx) -> Result<Step> {
    const OP: &str = "convert-to-free-space-tree";
    let mut st = open_store(ctx)?;
    let ro = st.sb().compat_ro_flags.get();
    if ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID != 0 {
        return Ok(Step::already(OP, "the free space tree is on already"));
    }
    let groups = st.block_groups().count() as u64;
    ctx.progress.phase(1, "free space tree", groups);
    let mut lines = crate::check::repair::clear_space_cache(&mut st)?;
    if ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0 && st.tree_exists(FST)? {
        // A tree the kernel marked invalid (FREE_SPACE_TREE without
        // VALID): emptied and written again, as btrfstune clears it first.
        st.repair().rebuild_free_space_tree()?;
        lines.push("the stale free space tree was emptied".into());
    } else {
        if st.tree_exists(FST)? {
            // A root item without the feature flag: nothing reads it.
            let key = st.root_key(FST)?;
            st.subtrees().drop_tree(FST)?;
            st.delete_item(crate::trans::TreeId::Root, &key)?;
            st.subtrees().forget_tree(FST);
        }
        let ri = crate::format::root::new_root_item(0, st.transid(), 0, None);
        st.create_tree(FST, ri)?;
    }
    st.update_superblock(|sb| {
        sb.compat_ro_flags.set(
            sb.compat_ro_flags.get()
                | BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE
                | BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID,
        );
        sb.cache_generation.set(0);
    });
    st.chunks().rewrite_block_groups();
    st.commit()?;
    ctx.progress.advance(groups);
    lines.push(format!(
        "free space tree built for {groups} block groups; compat_ro FREE_SPACE_TREE and FREE_SPACE_TREE_VALID set"
    ));
    Ok(done(OP, lines))
}
