//! Delayed references: changes to the back references of extents (tree
//! blocks and data) are queued during a transaction and applied to the
//! extent tree when the commit runs them, as the kernel's delayed refs are.
//!
//! Queuing is what makes a drop and a re-add of the same reference within
//! one transaction a no-op: the deltas of one extent are merged by back
//! reference, and when the head runs, additions are applied before drops,
//! so an extent whose last reference is dropped and taken again is never
//! freed on the way (and keeps its checksums). An extent is freed only when
//! the merged count reaches zero.
//!
//! Invariant: a head with `new` set describes an extent this transaction
//! allocated whose extent item does not exist yet; its net deltas are never
//! negative.

use crate::format::extent::InlineRef;
use crate::format::key::Key;
use std::collections::BTreeMap;

/// The identity of one back reference; counts live in the deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BackRef {
    /// A tree block referenced by a tree's root or an unshared parent.
    Tree {
        /// Id of the referencing tree (the TREE_BLOCK_REF key offset).
        root: u64,
    },
    /// A tree block referenced by a full-backref parent block.
    SharedTree {
        /// Logical address of the parent block (the SHARED_BLOCK_REF key
        /// offset).
        parent: u64,
    },
    /// A data extent referenced by file extent items of (root, inode) at
    /// file offset minus extent offset.
    Data {
        /// Id of the subvolume tree holding the file extent items.
        root: u64,
        /// Inode number of the file.
        objectid: u64,
        /// File offset of the items minus their offset into the extent
        /// (`btrfs_extent_data_ref.offset`).
        offset: u64,
    },
    /// A data extent referenced from a full-backref leaf.
    SharedData {
        /// Logical address of the leaf holding the file extent items (the
        /// SHARED_DATA_REF key offset).
        parent: u64,
    },
}

impl BackRef {
    /// The inline form with `count` references.
    pub fn inline(&self, count: u32) -> InlineRef {
        match *self {
            BackRef::Tree { root } => InlineRef::TreeBlock { root },
            BackRef::SharedTree { parent } => InlineRef::SharedBlock { parent },
            BackRef::Data {
                root,
                objectid,
                offset,
            } => InlineRef::ExtentData {
                root,
                objectid,
                offset,
                count,
            },
            BackRef::SharedData { parent } => InlineRef::SharedData { parent, count },
        }
    }

    /// The back reference an inline ref stands for (None for owner refs).
    pub fn of_inline(r: &InlineRef) -> Option<BackRef> {
        Some(match *r {
            InlineRef::TreeBlock { root } => BackRef::Tree { root },
            InlineRef::SharedBlock { parent } => BackRef::SharedTree { parent },
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                ..
            } => BackRef::Data {
                root,
                objectid,
                offset,
            },
            InlineRef::SharedData { parent, .. } => BackRef::SharedData { parent },
            InlineRef::Owner { .. } => return None,
        })
    }

    /// Whether this is a data extent's reference (EXTENT_DATA_REF or
    /// SHARED_DATA_REF) rather than a tree block's.
    pub fn is_data(&self) -> bool {
        matches!(self, BackRef::Data { .. } | BackRef::SharedData { .. })
    }
}

/// What the extent item of an extent allocated in this transaction holds
/// besides its references.
#[derive(Clone, Copy, Debug)]
pub struct NewExtent {
    /// Transaction that allocated the extent (the extent item's `generation`).
    pub generation: u64,
    /// Extent item flags: `BTRFS_EXTENT_FLAG_DATA` or
    /// `BTRFS_EXTENT_FLAG_TREE_BLOCK`.
    pub flags: u64,
    /// First key of a tree block when it was allocated (non-skinny items).
    pub first_key: Key,
}

/// The queued count changes of one extent's back references, in back
/// reference order, none zero. Almost every head has one or two (a new
/// extent's first reference, a CoW's drop and add), so they are a sorted
/// vector: a map's node per head cost a transaction of 100,000 new files
/// 40 MB until its commit.
#[derive(Clone, Debug, Default)]
pub struct RefDeltas(Vec<(BackRef, i64)>);

impl RefDeltas {
    /// Add `delta` to the count change of `r`; a change that reaches zero
    /// goes.
    pub fn add(&mut self, r: BackRef, delta: i64) {
        match self.0.binary_search_by(|(k, _)| k.cmp(&r)) {
            Ok(i) => {
                self.0[i].1 += delta;
                if self.0[i].1 == 0 {
                    self.0.remove(i);
                }
            }
            Err(i) if delta != 0 => self.0.insert(i, (r, delta)),
            Err(_) => {}
        }
    }
    /// The back references with a pending change, in order.
    pub fn keys(&self) -> impl Iterator<Item = &BackRef> {
        self.0.iter().map(|(k, _)| k)
    }
    /// The pending count changes, in back reference order.
    pub fn values(&self) -> impl Iterator<Item = &i64> {
        self.0.iter().map(|(_, v)| v)
    }
    /// Each back reference with its pending count change, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&BackRef, &i64)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
    /// Whether no back reference has a pending change.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Number of back references with a pending change.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// The queued changes of one extent.
#[derive(Clone, Debug)]
pub struct RefHead {
    /// Size of the extent in bytes (nodesize for a tree block).
    pub num_bytes: u64,
    /// Level of a tree block; None for data.
    pub level: Option<u8>,
    /// Set when this transaction allocated the extent: running the head inserts
    /// its extent item (the kernel's `must_insert_reserved`).
    pub new: Option<NewExtent>,
    /// The merged count changes of its back references.
    pub refs: RefDeltas,
}

impl RefHead {
    /// Net change of the extent's reference count.
    pub fn delta(&self) -> i64 {
        self.refs.values().sum()
    }
}

/// The delayed ref heads of the running transaction by extent bytenr: the
/// kernel's `btrfs_delayed_ref_root`, run by the commit in bytenr order.
#[derive(Clone, Debug, Default)]
pub struct DelayedRefs {
    heads: BTreeMap<u64, RefHead>,
}

impl DelayedRefs {
    fn head(&mut self, bytenr: u64, num_bytes: u64, level: Option<u8>) -> &mut RefHead {
        self.heads.entry(bytenr).or_insert_with(|| RefHead {
            num_bytes,
            level,
            new: None,
            refs: RefDeltas::default(),
        })
    }

    /// Queue `delta` on one back reference of an existing (or new) extent.
    pub fn add(&mut self, bytenr: u64, num_bytes: u64, level: Option<u8>, r: BackRef, delta: i64) {
        self.head(bytenr, num_bytes, level).refs.add(r, delta);
    }

    /// Queue a new extent with its first reference.
    pub fn add_new(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        level: Option<u8>,
        new: NewExtent,
        r: BackRef,
    ) {
        let h = self.head(bytenr, num_bytes, level);
        h.new = Some(new);
        h.num_bytes = num_bytes;
        h.level = level;
        h.refs.add(r, 1);
    }

    /// The head queued for the extent at `bytenr`, if any.
    pub fn get(&self, bytenr: u64) -> Option<&RefHead> {
        self.heads.get(&bytenr)
    }

    /// Drop the head of `bytenr` with all its changes (an extent allocated and
    /// freed in this transaction never gets an extent item).
    pub fn remove(&mut self, bytenr: u64) -> Option<RefHead> {
        self.heads.remove(&bytenr)
    }

    /// Net pending change of an extent's reference count.
    pub fn delta(&self, bytenr: u64) -> i64 {
        self.heads.get(&bytenr).map_or(0, RefHead::delta)
    }

    /// Whether no extent has queued changes.
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// Number of heads (extents with queued changes).
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    /// Every head, in bytenr order, leaving the queue empty.
    pub fn take_all(&mut self) -> BTreeMap<u64, RefHead> {
        std::mem::take(&mut self.heads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_and_readd_merge_to_nothing() {
        let mut d = DelayedRefs::default();
        let r = BackRef::Data {
            root: 5,
            objectid: 257,
            offset: 0,
        };
        d.add(4096, 8192, None, r, -1);
        d.add(4096, 8192, None, r, 1);
        assert_eq!(d.delta(4096), 0);
        assert!(d.get(4096).is_some_and(|h| h.refs.is_empty()));
        let n = NewExtent {
            generation: 7,
            flags: 1,
            first_key: Key::MIN,
        };
        d.add_new(1 << 20, 4096, Some(0), n, BackRef::Tree { root: 5 });
        assert_eq!(d.delta(1 << 20), 1);
        assert_eq!(d.take_all().len(), 2);
        assert!(d.is_empty());
    }

    #[test]
    fn deltas_stay_in_back_reference_order() {
        let mut m = RefDeltas::default();
        let refs = [
            BackRef::SharedData { parent: 9 },
            BackRef::Tree { root: 5 },
            BackRef::Data {
                root: 5,
                objectid: 300,
                offset: 0,
            },
            BackRef::Data {
                root: 5,
                objectid: 257,
                offset: 4096,
            },
        ];
        for (i, r) in refs.iter().enumerate() {
            m.add(*r, i as i64 + 1);
        }
        m.add(refs[1], -2);
        m.add(refs[0], 0);
        let mut want: Vec<(BackRef, i64)> = vec![(refs[0], 1), (refs[2], 3), (refs[3], 4)];
        want.sort();
        assert_eq!(m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), want);
        assert_eq!(m.values().sum::<i64>(), 8);
        assert_eq!(m.len(), 3);
    }
}
