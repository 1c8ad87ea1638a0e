//! `clear-ino-cache`: remove what the inode cache (the `inode_cache`
//! mount option, removed from the kernel in 5.11) left in every
//! subvolume: the items of its FREE_INO and FREE_SPACE objects and the
//! references of their data extents, in one commit (btrfs-progs `btrfs
//! rescue clear-ino-cache`; the same removal `btrkit-fsck --repair` does
//! for the checker's `inode-cache` findings).

use super::{open_store, TreeChange};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::trans::TreeId;
use crate::Result;
use std::path::PathBuf;

/// Remove the inode cache of every subvolume of the filesystem at `paths`.
pub fn clear_ino_cache(paths: &[PathBuf], dry_run: bool) -> Result<TreeChange> {
    let mut st = open_store(paths, dry_run)?;
    let mut out = TreeChange::new("clear-ino-cache", dry_run);
    let roots = st.items_in(
        TreeId::Root,
        Key::new(BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0),
        Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
    )?;
    let mut trees: Vec<u64> = roots
        .iter()
        .filter(|(k, d)| {
            k.ty == BTRFS_ROOT_ITEM_KEY
                && is_fstree(k.objectid)
                && k.objectid != BTRFS_DATA_RELOC_TREE_OBJECTID
                && RootItem::parse(d).is_ok_and(|r| r.refs.get() > 0)
        })
        .map(|(k, _)| k.objectid)
        .collect();
    trees.dedup();
    let mut cleaned = 0;
    for tree in trees {
        let n = crate::check::repair::clear_inode_cache(&mut st, tree)?;
        if n > 0 {
            cleaned += 1;
            out.changes
                .push(format!("subvolume {tree}: {n} inode cache items removed"));
        }
    }
    if cleaned == 0 {
        out.notes
            .push("no subvolume holds inode cache items".into());
    }
    out.finish(st)?;
    Ok(out)
}
