//! The item cache: the data of inode items and dir items of subvolume
//! trees, by exact key, so that path walks and inode reads do not search
//! the tree again for what they read a moment ago (the kernel keeps the
//! same things as dentries and in-memory inodes).
//!
//! Coherence is the btree layer's job and lives in one place: every item
//! change (`insert_item`, `update_item`, `delete_item`, `modify_item`)
//! writes its result through here, and a tree that is created, replaced
//! or dropped loses all its entries. An entry is either the item's bytes
//! or "no such item" (a lookup that missed, or a delete).

use super::TreeId;
use crate::format::consts::*;
use crate::format::key::Key;
use crate::util::hash::FastMap;

/// Entries kept before the cache starts over (about 200 bytes each).
const MAX_ENTRIES: usize = 1 << 17;

/// Inode and dir items of subvolume trees by (tree, key): each entry is the
/// item's bytes or "no such item". Cleared wholesale when it reaches its
/// entry limit; see the module docs for how it stays coherent.
pub struct ItemCache {
    map: FastMap<(TreeId, Key), Option<Box<[u8]>>>,
    /// Entries kept before starting over.
    limit: usize,
}

impl Default for ItemCache {
    fn default() -> Self {
        ItemCache {
            map: FastMap::default(),
            limit: MAX_ENTRIES,
        }
    }
}

/// Whether items with `key` in `tree` are cached: the two kinds every
/// path walk reads, in the trees that hold them.
pub fn cacheable(tree: TreeId, key: &Key) -> bool {
    matches!(tree, TreeId::Tree(_))
        && (key.ty == BTRFS_INODE_ITEM_KEY || key.ty == BTRFS_DIR_ITEM_KEY)
}

impl ItemCache {
    /// Some(None): known not to exist; None: not known.
    pub fn get(&self, tree: TreeId, key: &Key) -> Option<Option<&[u8]>> {
        self.map.get(&(tree, *key)).map(|v| v.as_deref())
    }

    /// The item now is `data` (None: there is none).
    pub fn put(&mut self, tree: TreeId, key: &Key, data: Option<&[u8]>) {
        if self.map.len() >= self.limit {
            self.map.clear();
        }
        self.map.insert((tree, *key), data.map(Box::from));
    }

    /// Keep at most `entries` (default [`MAX_ENTRIES`]); a lower limit
    /// than the entries held starts over now, memory given back.
    pub fn set_limit(&mut self, entries: usize) {
        self.limit = entries.max(1);
        if self.map.len() > self.limit {
            self.map = FastMap::default();
        }
    }

    /// Not known any more (before a change that might not finish).
    pub fn forget(&mut self, tree: TreeId, key: &Key) {
        self.map.remove(&(tree, *key));
    }

    /// Every entry of `tree` (created, replaced or dropped as a whole).
    pub fn forget_tree(&mut self, tree: TreeId) {
        if !self.map.is_empty() {
            self.map.retain(|(t, _), _| *t != tree);
        }
    }
}
