//! A set of disjoint, non-adjacent byte ranges `[start, end)`.

use std::collections::BTreeMap;

/// Byte ranges `[start, end)`, kept merged: stored ranges never overlap or
/// touch, so two sets holding the same bytes compare equal however they were
/// built. Empty ranges are ignored. A [`BlockGroup`](super::BlockGroup) keeps
/// its free, pinned and excluded space in these.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end; ranges never overlap or touch.
    map: BTreeMap<u64, u64>,
    /// Sum of the ranges' lengths, kept as they change (free space is
    /// asked for on every buffered write that dirties a new page).
    bytes: u64,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }
    /// True when the set holds no byte.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// Number of disjoint ranges (not bytes: see [`total`](Self::total)).
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Bytes in the set, the sum of the ranges' lengths (kept, not counted).
    pub fn total(&self) -> u64 {
        self.bytes
    }
    /// The ranges as `(start, end)`, in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }
    /// Ranges intersecting `[start, end)`, clipped to it.
    pub fn iter_in(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self
            .map
            .range(..=start)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(start);
        self.map.range(first..end).filter_map(move |(&s, &e)| {
            let (a, b) = (s.max(start), e.min(end));
            (a < b).then_some((a, b))
        })
    }

    /// Add `[start, end)`, merging it with every range it overlaps or touches.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        // Absorb a range that starts before and touches/overlaps.
        if let Some((&ps, &pe)) = self.map.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.map.remove(&ps);
                self.bytes -= pe - ps;
            }
        }
        // Absorb following ranges that start within or at the end.
        loop {
            let next = self.map.range(s..).next().map(|(&a, &b)| (a, b));
            match next {
                Some((ns, ne)) if ns <= e => {
                    e = e.max(ne);
                    self.map.remove(&ns);
                    self.bytes -= ne - ns;
                }
                _ => break,
            }
        }
        self.map.insert(s, e);
        self.bytes += e - s;
    }

    /// Take `[start, end)` out, splitting a range that straddles either end;
    /// bytes of it not in the set are ignored.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let hits: Vec<(u64, u64)> = self.iter_in(start, end).collect();
        for (a, b) in hits {
            // Find the containing stored range.
            let (&s, &e) = match self.map.range(..=a).next_back() {
                Some(x) => x,
                None => continue,
            };
            self.map.remove(&s);
            self.bytes -= e - s;
            if s < a {
                self.map.insert(s, a);
                self.bytes += a - s;
            }
            if b < e {
                self.map.insert(b, e);
                self.bytes += e - b;
            }
        }
    }

    /// True when every byte of `[start, end)` is in the set (hence in one
    /// stored range).
    pub fn contains(&self, start: u64, end: u64) -> bool {
        match self.map.range(..=start).next_back() {
            Some((_, &e)) => e >= end,
            None => false,
        }
    }
    /// True when any byte of `[start, end)` is in the set.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.iter_in(start, end).next().is_some()
    }

    /// First sub-range of `len` bytes, aligned to `align`, inside
    /// `[lo, hi)`, searching from `hint` and wrapping once.
    pub fn find(&self, lo: u64, hi: u64, len: u64, align: u64, hint: u64) -> Option<u64> {
        let try_from = |from: u64, to: u64| {
            for (s, e) in self.iter_in(from, to) {
                let a = s.div_ceil(align) * align;
                if a + len <= e {
                    return Some(a);
                }
            }
            None
        };
        let h = hint.clamp(lo, hi);
        try_from(h, hi).or_else(|| try_from(lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merge_split() {
        let mut r = RangeSet::new();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 30);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        r.remove(15, 25);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 15), (25, 40)]);
        assert_eq!(r.find(0, 100, 10, 5, 0), Some(25));
        assert_eq!(r.find(0, 100, 4, 4, 0), Some(28));
        assert!(r.contains(26, 40));
        assert!(!r.contains(14, 16));
        assert_eq!(r.total(), 20);
    }

    proptest! {
        #[test]
        fn matches_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 1u64..40), 1..60)) {
            let mut r = RangeSet::new();
            let mut bits = vec![false; 256];
            for (ins, s, l) in ops {
                let e = (s + l).min(256);
                if ins { r.insert(s, e) } else { r.remove(s, e) }
                for b in &mut bits[s as usize..e as usize] { *b = ins; }
                let mut want = RangeSet::new();
                for (i, &b) in bits.iter().enumerate() { if b { want.insert(i as u64, i as u64 + 1); } }
                prop_assert_eq!(&r, &want);
                prop_assert_eq!(r.total(), bits.iter().filter(|&&b| b).count() as u64);
            }
        }
    }
}
