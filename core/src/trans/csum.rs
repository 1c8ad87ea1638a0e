//! The checksum tree: EXTENT_CSUM items keyed by the logical address of
//! their first sector, each holding the checksums of a run of contiguous
//! sectors. Inserts extend the item that ends where the new run starts
//! (as the kernel merges), up to what a leaf can hold; deletes trim or split
//! items.

use super::{Store, TreeId};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::{Error, Result};

/// The checksum tree: data checksums inserted, deleted and looked up by logical range. Obtained from [`Store::csums`].
pub struct Csums<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Csums`].
    pub fn csums(&mut self) -> Csums<'_> {
        Csums { st: self }
    }
}

const CSUM_TREE: TreeId = TreeId::Tree(BTRFS_CSUM_TREE_OBJECTID);

/// The most data one [`Store::csum_lookup`] answers for: 1 GiB, 8 MiB of
/// sha256 or blake2 checksums and a flag per sector.
pub const CSUM_LOOKUP_MAX: u64 = 1 << 30;
/// The piece [`Store::csums_missing`] looks at in one lookup: 64 MiB of
/// data, 512 KiB of checksums at most.
pub const CSUM_LOOKUP_WINDOW: u64 = 64 << 20;

/// The checksums of a run of sectors, as the csum tree holds them: one
/// buffer for all, and which sectors have one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectorSums {
    size: usize,
    bytes: Vec<u8>,
    have: Vec<bool>,
}

impl SectorSums {
    /// Number of sectors covered, with or without a checksum.
    pub fn len(&self) -> usize {
        self.have.len()
    }
    /// Whether the run covers no sectors.
    pub fn is_empty(&self) -> bool {
        self.have.is_empty()
    }
    /// Sector `i`'s checksum, if it has one.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        match self.have.get(i) {
            Some(true) => Some(&self.bytes[i * self.size..(i + 1) * self.size]),
            _ => None,
        }
    }
    /// Every sector's checksum in order, None for a sector without one.
    pub fn iter(&self) -> impl Iterator<Item = Option<&[u8]>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
    /// Whether at least one sector has a checksum.
    pub fn any_present(&self) -> bool {
        self.have.iter().any(|&h| h)
    }
    /// Whether at least one sector has no checksum in the csum tree.
    pub fn any_missing(&self) -> bool {
        self.have.iter().any(|&h| !h)
    }
}

impl Csums<'_> {
    /// Largest csum item body, in bytes of checksums, a leaf takes.
    fn max_csum_item(&self) -> usize {
        let cs = self.st.image().csum.size();
        let room = self.st.nodesize() as usize
            - crate::format::header::HEADER_SIZE
            - 2 * crate::format::header::ITEM_SIZE;
        // Keep items well below a full leaf so neighbours still fit.
        (room / 2) / cs * cs
    }

    /// Record `sums` (one checksum per sector) for data starting at `start`.
    pub fn csum_insert(&mut self, start: u64, sums: &[u8]) -> Result<()> {
        self.csum_insert_in(CSUM_TREE, start, sums)
    }

    /// [`csum_insert`](Store::csum_insert) into `tree`: the csum tree, or a
    /// log tree (which keeps the checksums of the data it logs).
    pub fn csum_insert_in(&mut self, tree: TreeId, start: u64, sums: &[u8]) -> Result<()> {
        let cs = self.st.image().csum.size();
        let ss = self.st.sectorsize() as u64;
        let max = self.max_csum_item();
        let mut start = start;
        let mut sums = sums;
        // Extend the previous item when it ends exactly at `start`: in
        // place when it is in the leaf `start` goes in and there is room.
        let in_place = self.st.grow_prev_item(
            tree,
            &Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, start),
            sums,
            |k, d| {
                let csum_item =
                    k.objectid == BTRFS_EXTENT_CSUM_OBJECTID && k.ty == BTRFS_EXTENT_CSUM_KEY;
                let end = k.offset + (d.len() / cs) as u64 * ss;
                if csum_item && end == start && d.len() < max {
                    (max - d.len()).min(sums.len())
                } else {
                    0
                }
            },
        )?;
        if in_place > 0 {
            start += (in_place / cs) as u64 * ss;
            sums = &sums[in_place..];
        } else if let Some((k, d)) = self.csum_item_before(tree, start)? {
            let end = k.offset + (d.len() / cs) as u64 * ss;
            if end == start && d.len() < max {
                let take = (max - d.len()).min(sums.len());
                let mut nd = d;
                nd.extend_from_slice(&sums[..take]);
                self.st.update_item(tree, &k, &nd)?;
                start += (take / cs) as u64 * ss;
                sums = &sums[take..];
            }
        }
        while !sums.is_empty() {
            let take = max.min(sums.len());
            let k = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, start);
            self.st.insert_item(tree, &k, &sums[..take])?;
            start += (take / cs) as u64 * ss;
            sums = &sums[take..];
        }
        Ok(())
    }

    /// The csum item with the greatest start <= `bytenr`.
    fn csum_item_before(&mut self, tree: TreeId, bytenr: u64) -> Result<Option<(Key, Vec<u8>)>> {
        // Items are few per leaf; search back from the key just after bytenr.
        let lo = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0);
        let hi = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, bytenr);
        self.st.prev_item(tree, &hi, &lo)
    }

    /// Remove the checksums of `[start, start+len)`.
    pub fn csum_delete(&mut self, start: u64, len: u64) -> Result<()> {
        self.csum_delete_in(CSUM_TREE, start, len)
    }

    /// [`csum_delete`](Store::csum_delete) in `tree`.
    pub fn csum_delete_in(&mut self, tree: TreeId, start: u64, len: u64) -> Result<()> {
        let cs = self.st.image().csum.size();
        let ss = self.st.sectorsize() as u64;
        let end = start + len;
        let mut items = Vec::new();
        if let Some(p) = self.csum_item_before(tree, start)? {
            items.push(p);
        }
        let lo = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, start);
        let hi = Key::new(
            BTRFS_EXTENT_CSUM_OBJECTID,
            BTRFS_EXTENT_CSUM_KEY,
            end.saturating_sub(1),
        );
        for it in self.st.items_in(tree, lo, hi)? {
            if !items.iter().any(|(k, _)| *k == it.0) {
                items.push(it);
            }
        }
        for (k, d) in items {
            let istart = k.offset;
            let iend = istart + (d.len() / cs) as u64 * ss;
            if iend <= start || istart >= end {
                continue;
            }
            self.st.delete_item(tree, &k)?;
            if istart < start {
                let n = ((start - istart) / ss) as usize * cs;
                self.st.insert_item(tree, &k, &d[..n])?;
            }
            if iend > end {
                let skip = ((end - istart) / ss) as usize * cs;
                self.st.insert_item(
                    tree,
                    &Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, end),
                    &d[skip..],
                )?;
            }
        }
        Ok(())
    }

    /// Checksums stored for `[start, start+len)`, sector by sector.
    ///
    /// The result holds a checksum per sector, so `len` is bounded: at most
    /// [`CSUM_LOOKUP_MAX`] bytes of data (a read, or one extent, is far
    /// less), an `Invalid` error beyond it and for a range past the end of
    /// the address space. A range whose length comes from disk is looked
    /// at piece by piece ([`csums_missing`](Store::csums_missing)).
    pub fn csum_lookup(&mut self, start: u64, len: u64) -> Result<SectorSums> {
        let cs = self.st.image().csum.size();
        let ss = self.st.sectorsize() as u64;
        if len > CSUM_LOOKUP_MAX || start.checked_add(len).is_none() {
            return Err(Error::Invalid(format!(
                "checksum lookup of {len} bytes at {start}: more than {CSUM_LOOKUP_MAX} at once"
            )));
        }
        let n = (len / ss) as usize;
        let mut out = SectorSums {
            size: cs,
            bytes: vec![0; n * cs],
            have: vec![false; n],
        };
        let end = start + n as u64 * ss;
        let mut items = Vec::new();
        if let Some(p) = self.csum_item_before(CSUM_TREE, start)? {
            items.push(p);
        }
        let lo = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, start);
        let hi = Key::new(
            BTRFS_EXTENT_CSUM_OBJECTID,
            BTRFS_EXTENT_CSUM_KEY,
            (start + len).saturating_sub(1),
        );
        items.extend(self.st.items_in(CSUM_TREE, lo, hi)?);
        for (k, d) in items {
            // Only the sectors both the item and the range cover; an item
            // holds up to a leaf's worth of sums, the range often a page.
            let count = (d.len() / cs) as u64;
            let item_end = k.offset.saturating_add(count.saturating_mul(ss));
            let mut at = k.offset.max(start);
            if at > k.offset {
                at = k
                    .offset
                    .saturating_add((at - k.offset).div_ceil(ss).saturating_mul(ss));
            }
            // At most `n` rounds: `at` moves a sector each, inside the range.
            while at < item_end.min(end) {
                if (at - start).is_multiple_of(ss) {
                    let src = ((at - k.offset) / ss) as usize * cs;
                    let dst = ((at - start) / ss) as usize;
                    out.bytes[dst * cs..(dst + 1) * cs].copy_from_slice(&d[src..src + cs]);
                    out.have[dst] = true;
                }
                let Some(next) = at.checked_add(ss) else {
                    break;
                };
                at = next;
            }
        }
        Ok(out)
    }

    /// Whether some sector of `[start, end)` has no checksum in the csum
    /// tree. The range may come from disk (a logged extent): it is looked
    /// at in pieces of [`CSUM_LOOKUP_WINDOW`] bytes, so memory stays
    /// bounded whatever its length, and the answer comes at the first gap.
    pub fn csums_missing(&mut self, start: u64, end: u64) -> Result<bool> {
        let mut at = start;
        // Each round moves `at` forward by a whole window or ends.
        while at < end {
            let n = (end - at).min(CSUM_LOOKUP_WINDOW);
            if self.csum_lookup(at, n)?.any_missing() {
                return Ok(true);
            }
            at += n;
        }
        Ok(false)
    }
}
