//! The inode cache: the runtime state of the inodes a mount has touched
//! (`InodeRt`: page cache, open count, log bookkeeping), as the kernel's
//! inode cache holds `struct btrfs_inode`. Loading an inode's state from
//! its item is the filesystem's job (`Filesystem::rt`); this type decides
//! what stays in memory.

use super::filesystem::{InodeRt, Loc};
use crate::util::hash::FastMap as HashMap;
use std::collections::HashSet;

/// Inodes kept in memory before clean, closed ones are evicted.
const INODE_CACHE: usize = 16384;

/// The runtime state of loaded inodes.
#[derive(Default)]
pub struct InodeCache {
    map: HashMap<Loc, InodeRt>,
    /// Inodes left after the last pressure eviction (open or dirty ones
    /// stay): the next one waits until a quarter of the cache more has
    /// come in, so thousands of dirty inodes are not scanned again on
    /// every step.
    kept: usize,
}

impl InodeCache {
    /// The state of `l`, if loaded.
    pub fn get(&self, l: &Loc) -> Option<&InodeRt> {
        self.map.get(l)
    }

    /// The state of `l` to change, if loaded.
    pub fn get_mut(&mut self, l: &Loc) -> Option<&mut InodeRt> {
        self.map.get_mut(l)
    }

    /// Whether `l`'s state is loaded.
    pub fn contains(&self, l: &Loc) -> bool {
        self.map.contains_key(l)
    }

    /// Sets `l`'s state (a newly made or newly loaded inode) and returns it.
    pub fn insert(&mut self, l: Loc, rt: InodeRt) -> &mut InodeRt {
        match self.map.entry(l) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                e.insert(rt);
                e.into_mut()
            }
            std::collections::hash_map::Entry::Vacant(e) => e.insert(rt),
        }
    }

    /// Drops `l`'s state (the inode is gone), returning it.
    pub fn remove(&mut self, l: &Loc) -> Option<InodeRt> {
        self.map.remove(l)
    }

    /// Every loaded inode.
    pub fn locs(&self) -> Vec<Loc> {
        self.map.keys().copied().collect()
    }

    /// The loaded inodes some file descriptor holds open.
    pub fn open(&self) -> Vec<Loc> {
        self.map
            .iter()
            .filter(|(_, rt)| rt.opens > 0)
            .map(|(l, _)| *l)
            .collect()
    }

    /// Every loaded inode's state, to change.
    pub fn states_mut(&mut self) -> impl Iterator<Item = &mut InodeRt> {
        self.map.values_mut()
    }

    /// Forgets everything (an unmount).
    pub fn clear(&mut self) {
        self.map.clear();
        self.kept = 0;
    }

    /// Memory pressure: past the cache's size, inodes that are neither
    /// open nor `dirty` go (their state is reloaded from the item when
    /// next needed).
    pub fn shrink(&mut self, dirty: impl Fn(&Loc) -> bool) {
        if self.map.len() > INODE_CACHE.max(self.kept + INODE_CACHE / 4) {
            self.map.retain(|l, rt| rt.opens > 0 || dirty(l));
            self.kept = self.map.len();
        }
    }

    /// What `drop_caches` drops: inodes neither open, nor with pages
    /// (cached or dirty), nor dirtied since their last writeback, nor in
    /// `pinned` (dentries that pin them).
    pub fn evict(&mut self, pinned: &HashSet<Loc>) {
        self.map.retain(|l, rt| {
            rt.opens > 0
                || rt.has_page_cache
                || !rt.pages.is_empty()
                || rt.pages_dirtied_at.is_some()
                || pinned.contains(l)
        });
    }
}
