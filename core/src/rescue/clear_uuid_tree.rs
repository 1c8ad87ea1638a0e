//! `clear-uuid-tree`: delete the UUID tree, every block of it freed and
//! its root item removed, in one commit (btrfs-progs `btrfs rescue
//! clear-uuid-tree`). The kernel finds no UUID tree at the next
//! read-write mount and builds it again from the subvolumes' root items.
//! As btrfs-progs 6.14 does, the superblock's `uuid_tree_generation` is
//! left as it is: the commit moves the generation past it, which alone
//! makes the kernel rescan; there is no compat_ro flag for the UUID tree.

use super::{open_store, TreeChange};
use crate::format::consts::*;
use crate::trans::TreeId;
use crate::Result;
use std::path::PathBuf;

/// Delete the UUID tree of the filesystem at `paths`.
pub fn clear_uuid_tree(paths: &[PathBuf], dry_run: bool) -> Result<TreeChange> {
    let mut st = open_store(paths, dry_run)?;
    let mut out = TreeChange::new("clear-uuid-tree", dry_run);
    const UUID: u64 = BTRFS_UUID_TREE_OBJECTID;
    if !st.tree_exists(UUID)? {
        out.notes.push("the filesystem has no UUID tree".into());
        out.finish(st)?;
        return Ok(out);
    }
    let items = st.items_in(
        UUID,
        crate::format::key::Key::MIN,
        crate::format::key::Key::MAX,
    )?;
    let key = st.root_key(UUID)?;
    st.subtrees().drop_tree(UUID)?;
    st.delete_item(TreeId::Root, &key)?;
    st.subtrees().forget_tree(UUID);
    out.changes.push(format!(
        "UUID tree deleted ({} items); the kernel rebuilds it at the next read-write mount",
        items.len()
    ));
    out.finish(st)?;
    Ok(out)
}
