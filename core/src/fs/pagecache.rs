//! Dirty pages of one inode: written data not yet in an extent. A page is
//! a whole sector of the file (4 KiB), complete (read in before a partial
//! write), so writeback never needs the disk's old contents.

use std::collections::BTreeMap;

pub const PAGE: u64 = 4096;

#[derive(Debug, Default)]
pub struct PageCache {
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl PageCache {
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }
    pub fn dirty_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }
    pub fn get(&self, index: u64) -> Option<&[u8]> {
        self.pages.get(&index).map(|p| &p[..])
    }
    pub fn get_mut(&mut self, index: u64) -> Option<&mut [u8]> {
        self.pages.get_mut(&index).map(|p| &mut p[..])
    }
    /// Add a dirty page; returns whether it is new.
    pub fn insert(&mut self, index: u64, page: Box<[u8]>) -> bool {
        self.pages.insert(index, page).is_none()
    }
    pub fn contains(&self, index: u64) -> bool {
        self.pages.contains_key(&index)
    }
    /// Remove pages `[from, to)`; returns how many went.
    pub fn drop_range(&mut self, from: u64, to: u64) -> usize {
        let keys: Vec<u64> = self.pages.range(from..to).map(|(k, _)| *k).collect();
        for k in &keys {
            self.pages.remove(k);
        }
        keys.len()
    }
    /// Take pages `[from, to)` out, in order.
    pub fn take_range(&mut self, from: u64, to: u64) -> Vec<(u64, Box<[u8]>)> {
        let keys: Vec<u64> = self.pages.range(from..to).map(|(k, _)| *k).collect();
        keys.into_iter()
            .filter_map(|k| self.pages.remove(&k).map(|p| (k, p)))
            .collect()
    }
    /// Runs of consecutive dirty pages as byte ranges `[start, end)`.
    pub fn dirty_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &k in self.pages.keys() {
            match out.last_mut() {
                Some(r) if r.1 == k * PAGE => r.1 += PAGE,
                _ => out.push((k * PAGE, (k + 1) * PAGE)),
            }
        }
        out
    }
    /// Whether any page meets `[from, to)` (page indexes).
    pub fn any_in(&self, from: u64, to: u64) -> bool {
        self.pages.range(from..to).next().is_some()
    }
}
