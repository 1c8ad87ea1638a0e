//! Free space tree upkeep: at commit, each block group whose free space
//! changed gets its FREE_SPACE_INFO and extent or bitmap items brought in
//! line with `free ∪ pinned`, converting between extents and bitmaps at the
//! kernel's thresholds.

use super::commit::Commit;
use crate::alloc::RangeSet;
use crate::format::consts::*;
use crate::format::free_space::FreeSpaceInfo;
use crate::format::key::Key;
use crate::Result;
use zerocopy::IntoBytes;

const FST: u64 = BTRFS_FREE_SPACE_TREE_OBJECTID;
/// Bytes of one bitmap item (BTRFS_FREE_SPACE_BITMAP_SIZE).
const BITMAP_SIZE: u64 = 256;

/// True when `[s, e)` is exactly one range of `set`.
fn is_whole(set: &RangeSet, s: u64, e: u64) -> bool {
    let mut it = set.iter_in(s.saturating_sub(1), e.saturating_add(1));
    matches!(it.next(), Some((a, b)) if a == s && b == e) && it.next().is_none()
}

impl Commit<'_> {
    fn bitmap_range(&self) -> u64 {
        self.st.sectorsize() as u64 * BITMAP_SIZE * 8
    }

    /// (low, high) extent-count thresholds of a group of `length` bytes:
    /// above high, bitmaps are smaller than extent items; below low, extents.
    fn fst_thresholds(&self, length: u64) -> (u64, u64) {
        let range = self.bitmap_range();
        let nbitmaps = length.div_ceil(range);
        let total = nbitmaps * (crate::format::header::ITEM_SIZE as u64 + BITMAP_SIZE);
        let high = total / crate::format::header::ITEM_SIZE as u64;
        (high.saturating_sub(100), high)
    }

    /// Bring the free space tree entries of group `start` up to date.
    pub(super) fn update_fst_group(&mut self, start: u64) -> Result<()> {
        let Some(g) = self.st.space.alloc.groups.get(&start) else {
            return Ok(());
        };
        let (length, was_bitmaps) = (g.length, g.fst_bitmaps);
        let want = g.fst_free();
        let count = want.len() as u64;
        let (low, high) = self.fst_thresholds(length);
        let bitmaps = if was_bitmaps {
            count >= low
        } else {
            count > high
        };
        let end = start + length;
        // Current entries (everything keyed inside the group but the info).
        let existing = self.st.items_in(
            FST,
            Key::new(start, BTRFS_FREE_SPACE_INFO_KEY + 1, 0),
            Key::new(end - 1, u8::MAX, u64::MAX),
        )?;
        let ss = self.st.sectorsize() as u64;
        if !bitmaps {
            // Delete stale entries (all bitmaps, and extents not wanted exactly).
            for (k, _) in &existing {
                let keep = k.ty == BTRFS_FREE_SPACE_EXTENT_KEY
                    && is_whole(&want, k.objectid, k.objectid.saturating_add(k.offset));
                if !keep {
                    self.st.delete_item(FST, k)?;
                }
            }
            for (s, e) in want.iter() {
                let k = Key::new(s, BTRFS_FREE_SPACE_EXTENT_KEY, e - s);
                if !existing.iter().any(|(ek, _)| *ek == k) {
                    self.st.insert_item(FST, &k, &[])?;
                }
            }
        } else {
            let range = self.bitmap_range();
            for (k, _) in &existing {
                if k.ty != BTRFS_FREE_SPACE_BITMAP_KEY {
                    self.st.delete_item(FST, k)?;
                }
            }
            let mut s = start;
            while s < end {
                let len = range.min(end - s);
                let nbits = len / ss;
                let mut bm = vec![0u8; nbits.div_ceil(8) as usize];
                for (a, b) in want.iter_in(s, s + len) {
                    for bit in (a - s) / ss..(b - s) / ss {
                        bm[(bit / 8) as usize] |= 1 << (bit % 8);
                    }
                }
                let k = Key::new(s, BTRFS_FREE_SPACE_BITMAP_KEY, len);
                let cur = existing
                    .iter()
                    .find(|(ek, _)| *ek == k)
                    .map(|(_, d)| d.clone());
                if cur.as_deref() != Some(&bm[..]) {
                    self.st.update_item(FST, &k, &bm)?;
                }
                s += len;
            }
        }
        let info = FreeSpaceInfo {
            extent_count: (count as u32).into(),
            flags: (if bitmaps {
                BTRFS_FREE_SPACE_USING_BITMAPS
            } else {
                0
            })
            .into(),
        };
        self.st.update_item(
            FST,
            &Key::new(start, BTRFS_FREE_SPACE_INFO_KEY, length),
            info.as_bytes(),
        )?;
        if let Some(g) = self.st.space.alloc.groups.get_mut(&start) {
            g.fst_bitmaps = bitmaps;
        }
        Ok(())
    }
}
