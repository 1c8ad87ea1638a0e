//! The block cache of the tree store: tree blocks by logical address, each
//! either clean (the bytes on disk, evictable) or dirty (modified in the
//! running transaction or log, owned by one tree until it is written).
//!
//! Invariant: a dirty block is never evicted; a clean block is exactly
//! what the device holds at its address (committed, or written by a log
//! sync), so dropping it loses nothing.

use super::TreeId;
use crate::util::hash::FastMap as HashMap;
use std::cell::Cell;

struct Cached {
    data: Vec<u8>,
    /// Last use, on the cache's clock (least recently used goes first).
    used: Cell<u64>,
}

/// Tree blocks of the store by logical address, clean or dirty (see the
/// module docs): the counterpart of the kernel's btree inode page cache and
/// its dirty extent buffers. Clean blocks are evicted least recently used
/// first; dirty ones stay until written or freed.
pub struct BlockCache {
    blocks: HashMap<u64, Cached>,
    /// Dirty blocks and the tree each belongs to.
    dirty: HashMap<u64, TreeId>,
    clock: Cell<u64>,
    /// Bytes of clean blocks kept before eviction starts.
    clean_limit: usize,
    nodesize: usize,
}

impl BlockCache {
    /// An empty cache of `nodesize`-byte blocks keeping up to `clean_limit`
    /// bytes of clean blocks.
    pub fn new(nodesize: usize, clean_limit: usize) -> BlockCache {
        BlockCache {
            blocks: HashMap::default(),
            dirty: HashMap::default(),
            clock: Cell::new(0),
            clean_limit,
            nodesize,
        }
    }

    /// Whether block `bytenr` is cached, clean or dirty.
    pub fn contains(&self, bytenr: u64) -> bool {
        self.blocks.contains_key(&bytenr)
    }

    fn touch(&self, c: &Cached) {
        let t = self.clock.get() + 1;
        self.clock.set(t);
        c.used.set(t);
    }

    /// Block `bytenr`'s bytes, clean or dirty, marking it recently used.
    pub fn get(&self, bytenr: u64) -> Option<&Vec<u8>> {
        let c = self.blocks.get(&bytenr)?;
        self.touch(c);
        Some(&c.data)
    }

    /// A dirty block's bytes for modification (None if not dirty).
    pub fn get_dirty_mut(&mut self, bytenr: u64) -> Option<&mut Vec<u8>> {
        if !self.dirty.contains_key(&bytenr) {
            return None;
        }
        self.blocks.get_mut(&bytenr).map(|c| &mut c.data)
    }

    /// Keep a block read from disk.
    pub fn insert_clean(&mut self, bytenr: u64, data: Vec<u8>) {
        let c = Cached {
            data,
            used: Cell::new(0),
        };
        self.touch(&c);
        self.blocks.insert(bytenr, c);
    }

    /// Keep a new or copied block, dirty for `tree`.
    pub fn insert_dirty(&mut self, bytenr: u64, tree: TreeId, data: Vec<u8>) {
        self.insert_clean(bytenr, data);
        self.dirty.insert(bytenr, tree);
    }

    /// Whether block `bytenr` is dirty: copied or created in the running
    /// transaction (or log) and not yet written, so it may be changed in place.
    pub fn is_dirty(&self, bytenr: u64) -> bool {
        self.dirty.contains_key(&bytenr)
    }

    /// The tree a dirty block belongs to; None if it is clean or not cached.
    pub fn dirty_tree(&self, bytenr: u64) -> Option<TreeId> {
        self.dirty.get(&bytenr).copied()
    }

    /// Forget a block (freed).
    pub fn remove(&mut self, bytenr: u64) {
        self.blocks.remove(&bytenr);
        self.dirty.remove(&bytenr);
    }

    /// Dirty blocks of the trees `which` selects, in address order.
    pub fn dirty_blocks(&self, which: &dyn Fn(TreeId) -> bool) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .dirty
            .iter()
            .filter(|(_, t)| which(**t))
            .map(|(b, _)| *b)
            .collect();
        v.sort_unstable();
        v
    }

    /// The block was written: it is clean from now on.
    pub fn mark_clean(&mut self, bytenr: u64) {
        self.dirty.remove(&bytenr);
    }

    /// Drop every dirty block of the trees `which` selects, unwritten.
    pub fn discard_dirty(&mut self, which: &dyn Fn(TreeId) -> bool) {
        let gone: Vec<u64> = self
            .dirty
            .iter()
            .filter(|(_, t)| which(**t))
            .map(|(b, _)| *b)
            .collect();
        for b in gone {
            self.remove(b);
        }
    }

    /// Number of dirty blocks.
    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Bytes of dirty blocks (count × nodesize).
    pub fn dirty_bytes(&self) -> u64 {
        (self.dirty.len() * self.nodesize) as u64
    }

    /// Bytes of clean blocks (count × nodesize).
    pub fn clean_bytes(&self) -> u64 {
        ((self.blocks.len() - self.dirty.len()) * self.nodesize) as u64
    }

    /// Set the bytes of clean blocks kept before [`BlockCache::trim`] evicts;
    /// nothing is evicted until then.
    pub fn set_clean_limit(&mut self, bytes: usize) {
        self.clean_limit = bytes;
    }

    /// Evict the least recently used clean blocks until the clean part is
    /// at most three quarters of its limit. Callers run this only between
    /// tree operations (no search path holds a block).
    pub fn trim(&mut self) -> usize {
        let clean = self.blocks.len() - self.dirty.len();
        if clean * self.nodesize <= self.clean_limit {
            return 0;
        }
        let keep = self.clean_limit * 3 / 4 / self.nodesize.max(1);
        let mut ages: Vec<(u64, u64)> = self
            .blocks
            .iter()
            .filter(|(b, _)| !self.dirty.contains_key(b))
            .map(|(b, c)| (c.used.get(), *b))
            .collect();
        ages.sort_unstable();
        let n = ages.len().saturating_sub(keep);
        for &(_, b) in &ages[..n] {
            self.blocks.remove(&b);
        }
        n
    }

    /// Forget clean blocks inside any of `ranges` (space freed by a commit:
    /// what is cached there is stale).
    pub fn drop_ranges(&mut self, ranges: &[(u64, u64)]) {
        if ranges.is_empty() {
            return;
        }
        let dirty = &self.dirty;
        self.blocks.retain(|b, _| {
            dirty.contains_key(b) || {
                let i = ranges.partition_point(|(s, _)| *s <= *b);
                i == 0 || *b >= ranges[i - 1].1
            }
        });
    }

    /// Drop every clean block (caches dropped, as `evict` does).
    pub fn drop_clean(&mut self) {
        let dirty = &self.dirty;
        self.blocks.retain(|b, _| dirty.contains_key(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_only_clean_least_recent() {
        let mut c = BlockCache::new(4096, 3 * 4096);
        for b in 0..6u64 {
            c.insert_clean(b * 4096, vec![b as u8; 4096]);
        }
        c.insert_dirty(100 * 4096, TreeId::Tree(5), vec![9; 4096]);
        // Use block 0 so it is the most recent.
        assert!(c.get(0).is_some());
        let n = c.trim();
        assert!(n >= 3);
        assert!(c.contains(0), "recently used block kept");
        assert!(c.contains(100 * 4096), "dirty block kept");
        assert!(!c.contains(4096));
        assert_eq!(c.dirty_blocks(&|t| t == TreeId::Tree(5)), vec![100 * 4096]);
        c.mark_clean(100 * 4096);
        assert_eq!(c.dirty_count(), 0);
    }
}
