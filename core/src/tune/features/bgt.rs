//! `--convert-to-block-group-tree` / `--convert-from-block-group-tree`:
//! every BLOCK_GROUP_ITEM moved between the extent tree and the block
//! group tree (objectid 11, its root item in the root tree), compat_ro
//! BLOCK_GROUP_TREE set or cleared, in one commit.
//!
//! btrfstune moves the items in batches of commits under the superblock
//! flag CHANGING_BG_TREE and resumes from it. One commit needs no flag:
//! the old superblock points at trees with every item in the old place,
//! the new one at trees with every item in the new place. An image that
//! arrives with the flag (an interrupted btrfstune) has items in both
//! trees; the store then reads them from both, and the conversion puts
//! all of them where the request says and clears the flag, so either
//! direction finishes it.
//!
//! Preconditions as btrfstune's: converting to the block group tree needs
//! the free space tree (compat_ro FREE_SPACE_TREE_VALID; the kernel
//! refuses BLOCK_GROUP_TREE without it), and sets NO_HOLES as btrfstune
//! does.

use super::{done, open_store};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::trans::{Store, TreeId};
use crate::tune::{Ctx, Outcome, Step};
use crate::{Error, Result};

const BGT: u64 = BTRFS_BLOCK_GROUP_TREE_OBJECTID;
const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;

/// `--convert-to-block-group-tree` (`on`) or
/// `--convert-from-block-group-tree`.
pub fn block_group_tree(ctx: &mut Ctx, on: bool) -> Result<Step> {
    let op = if on {
        "convert-to-block-group-tree"
    } else {
        "convert-from-block-group-tree"
    };
    let mut st = open_store(ctx)?;
    let ro = st.sb().compat_ro_flags.get();
    let changing = st.sb().flags.get() & BTRFS_SUPER_FLAG_CHANGING_BG_TREE != 0;
    let has = ro & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0;
    if !changing && has == on {
        return Ok(Step::already(
            op,
            if on {
                "the block group items are in the block group tree already"
            } else {
                "the filesystem has no block group tree"
            },
        ));
    }
    if on && ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID == 0 {
        return Err(Error::Unsupported(
            "the block group tree needs the free space tree (space cache v2): convert with --convert-to-free-space-tree first".into(),
        ));
    }
    let groups = st.block_groups().count();
    ctx.progress.phase(1, "block group items", groups as u64);
    let mut lines = Vec::new();
    if on {
        if !st.tree_exists(BGT)? {
            let ri = crate::format::root::new_root_item(0, st.transid(), 0, None);
            st.create_tree(BGT, ri)?;
        }
        let moved = delete_group_items(&mut st, EXTENT)?;
        st.set_block_group_tree(BGT);
        st.update_superblock(|sb| {
            sb.compat_ro_flags
                .set(sb.compat_ro_flags.get() | BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE);
            sb.incompat_flags
                .set(sb.incompat_flags.get() | BTRFS_FEATURE_INCOMPAT_NO_HOLES);
        });
        lines.push(format!(
            "{groups} block group items written to the block group tree ({moved} were in the extent tree)"
        ));
        lines.push("compat_ro BLOCK_GROUP_TREE set (and incompat NO_HOLES, as btrfstune)".into());
    } else {
        if st.tree_exists(BGT)? {
            let key = st.root_key(BGT)?;
            st.subtrees().drop_tree(BGT)?;
            st.delete_item(TreeId::Root, &key)?;
            st.subtrees().forget_tree(BGT);
        }
        st.set_block_group_tree(EXTENT);
        st.update_superblock(|sb| {
            sb.compat_ro_flags
                .set(sb.compat_ro_flags.get() & !BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE);
        });
        lines.push(format!(
            "{groups} block group items written to the extent tree, the block group tree removed"
        ));
        lines.push("compat_ro BLOCK_GROUP_TREE cleared".into());
    }
    // Every group's item is written at the commit into the tree chosen
    // above, its used bytes from the extent tree (as the store keeps
    // them); an item already there is overwritten in place.
    st.chunks().rewrite_block_groups();
    st.update_superblock(|sb| {
        sb.flags
            .set(sb.flags.get() & !BTRFS_SUPER_FLAG_CHANGING_BG_TREE);
    });
    st.commit()?;
    ctx.progress.advance(groups as u64);
    let mut step = done(op, lines);
    if changing {
        step.outcome = Outcome::Resumed;
        step.lines.insert(
            0,
            "an interrupted btrfstune conversion (CHANGING_BG_TREE) was finished".into(),
        );
    }
    Ok(step)
}

/// Delete every BLOCK_GROUP_ITEM of tree `tree` (keyed by the groups the
/// store read); returns how many there were.
fn delete_group_items(st: &mut Store, tree: u64) -> Result<usize> {
    let keys: Vec<Key> = st
        .block_groups()
        .map(|g| Key::new(g.start, BTRFS_BLOCK_GROUP_ITEM_KEY, g.length))
        .collect();
    let mut n = 0;
    for k in keys {
        if st.delete_item(tree, &k)? {
            n += 1;
        }
    }
    Ok(n)
}
