//! Qgroup accounting, as the kernel keeps it: every extent whose
//! references a transaction changed is accounted at commit by comparing the
//! subvolumes that referenced it before (the committed trees) with those
//! that reference it after. A qgroup's `rfer` counts every extent one of its
//! subvolumes references; `excl` counts those no subvolume outside it
//! references. Higher-level qgroups cover the subvolumes of their members.
//!
//! Invariant: with quotas on, the info items equal that definition after
//! every commit, given they did before (the same rule `btrfs check`
//! verifies).

use super::backref::{RootCache, View};
use super::delayed::{BackRef, RefHead};
use super::{Store, TreeId};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::qgroup::{QgroupInfoItem, QgroupStatusItem};
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use zerocopy::{FromBytes, IntoBytes};

const QUOTA_TREE: TreeId = TreeId::Tree(BTRFS_QUOTA_TREE_OBJECTID);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub rfer: u64,
    pub rfer_cmpr: u64,
    pub excl: u64,
    pub excl_cmpr: u64,
}

#[derive(Debug, Default)]
pub struct Qgroups {
    pub enabled: bool,
    /// qgroup id -> counters.
    pub groups: BTreeMap<u64, Counts>,
    /// child qgroup -> its parents.
    pub parents: BTreeMap<u64, BTreeSet<u64>>,
    dirty: BTreeSet<u64>,
    /// Extents whose references changed in this transaction: bytenr ->
    /// (bytes, level of a tree block).
    extents: BTreeMap<u64, (u64, Option<u8>)>,
    status_written: bool,
}

/// Whether a changed extent can count in some qgroup: data, or a tree
/// block of a subvolume (directly or through a shared parent).
fn may_count(head: &RefHead) -> bool {
    head.level.is_none() || head.refs.keys().any(|r| matches!(r, BackRef::Tree { root } if is_fstree(*root)) || matches!(r, BackRef::SharedTree { .. }))
}

impl Store {
    /// Read the quota tree when quotas are on.
    pub(super) fn load_qgroups(&mut self) -> Result<()> {
        if !self.tree_exists(BTRFS_QUOTA_TREE_OBJECTID)? {
            return Ok(());
        }
        let status_key = Key::new(0, BTRFS_QGROUP_STATUS_KEY, 0);
        let Some(d) = self.lookup(QUOTA_TREE, &status_key)? else { return Ok(()) };
        let st = QgroupStatusItem::read_from_prefix(&d).map_err(|_| Error::corrupt_key("qgroup status item size", 0, status_key))?.0;
        if st.flags.get() & BTRFS_QGROUP_STATUS_FLAG_ON == 0 {
            return Ok(());
        }
        let mut q = Qgroups { enabled: true, ..Default::default() };
        for (k, d) in self.items_in(QUOTA_TREE, Key::new(0, BTRFS_QGROUP_INFO_KEY, 0), Key::new(0, BTRFS_QGROUP_INFO_KEY, u64::MAX))? {
            let i = QgroupInfoItem::read_from_bytes(&d).map_err(|_| Error::corrupt_key("qgroup info item size", 0, k))?;
            q.groups.insert(k.offset, Counts { rfer: i.rfer.get(), rfer_cmpr: i.rfer_cmpr.get(), excl: i.excl.get(), excl_cmpr: i.excl_cmpr.get() });
        }
        // Relations are stored both ways; (child, RELATION, parent) has
        // the child first (child < parent as qgroup ids: parents have a
        // higher level).
        for (k, _) in self.items_in(QUOTA_TREE, Key::new(0, BTRFS_QGROUP_RELATION_KEY, 0), Key::new(u64::MAX, BTRFS_QGROUP_RELATION_KEY, u64::MAX))? {
            if k.ty == BTRFS_QGROUP_RELATION_KEY && k.objectid < k.offset {
                q.parents.entry(k.objectid).or_default().insert(k.offset);
            }
        }
        self.qgroups = q;
        Ok(())
    }

    /// Note an extent whose references changed (its head is about to run).
    pub(super) fn qgroup_note_extent(&mut self, bytenr: u64, head: &RefHead) {
        if self.qgroups.enabled && may_count(head) {
            self.qgroups.extents.entry(bytenr).or_insert((head.num_bytes, head.level));
        }
    }

    /// Account every noted extent and write the changed info items and the
    /// status item (once per commit). Returns whether the quota tree changed.
    pub(super) fn account_qgroups(&mut self) -> Result<bool> {
        if !self.qgroups.enabled {
            return Ok(false);
        }
        let extents = std::mem::take(&mut self.qgroups.extents);
        let mut cache = RootCache::new();
        for (bytenr, (num_bytes, level)) in extents {
            let old = self.extent_roots(View::Committed, bytenr, level, &mut cache)?;
            let new = self.extent_roots(View::Current, bytenr, level, &mut cache)?;
            if old != new {
                self.qgroups.account(num_bytes, &old, &new);
            }
        }
        let mut changed = false;
        let transid = self.transid;
        for id in std::mem::take(&mut self.qgroups.dirty) {
            let Some(c) = self.qgroups.groups.get(&id).copied() else { continue };
            let item = QgroupInfoItem { generation: transid.into(), rfer: c.rfer.into(), rfer_cmpr: c.rfer_cmpr.into(), excl: c.excl.into(), excl_cmpr: c.excl_cmpr.into() };
            self.update_item(QUOTA_TREE, &Key::new(0, BTRFS_QGROUP_INFO_KEY, id), item.as_bytes())?;
            changed = true;
        }
        if !self.qgroups.status_written {
            let k = Key::new(0, BTRFS_QGROUP_STATUS_KEY, 0);
            if let Some(mut d) = self.lookup(QUOTA_TREE, &k)? {
                if d.len() >= 16 {
                    d[8..16].copy_from_slice(&transid.to_le_bytes());
                    self.update_item(QUOTA_TREE, &k, &d)?;
                }
            }
            self.qgroups.status_written = true;
            changed = true;
        }
        Ok(changed)
    }

    /// After the commit: the next transaction writes its status again.
    pub(super) fn qgroups_committed(&mut self) {
        self.qgroups.status_written = false;
    }
}

impl Qgroups {
    /// The qgroups covering subvolume `root`: its level-0 qgroup and every
    /// ancestor.
    fn covering(&self, root: u64) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        if !self.groups.contains_key(&root) {
            return out;
        }
        let mut todo = vec![root];
        while let Some(q) = todo.pop() {
            if out.insert(q) {
                if let Some(ps) = self.parents.get(&q) {
                    todo.extend(ps.iter().copied());
                }
            }
        }
        out
    }

    /// Move counters for one extent of `num_bytes` whose referencing
    /// subvolumes went from `old` to `new`.
    pub fn account(&mut self, num_bytes: u64, old: &BTreeSet<u64>, new: &BTreeSet<u64>) {
        let (nr_old, nr_new) = (old.len(), new.len());
        let mut counts: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for r in old {
            for q in self.covering(*r) {
                counts.entry(q).or_default().0 += 1;
            }
        }
        for r in new {
            for q in self.covering(*r) {
                counts.entry(q).or_default().1 += 1;
            }
        }
        for (q, (o, n)) in counts {
            let Some(c) = self.groups.get_mut(&q) else { continue };
            let before = *c;
            if o == 0 && n > 0 {
                c.rfer += num_bytes;
                c.rfer_cmpr += num_bytes;
            } else if o > 0 && n == 0 {
                c.rfer = c.rfer.saturating_sub(num_bytes);
                c.rfer_cmpr = c.rfer_cmpr.saturating_sub(num_bytes);
            }
            // Exclusive: every referencing subvolume is under this qgroup.
            let excl_before = o > 0 && o == nr_old;
            let excl_after = n > 0 && n == nr_new;
            if excl_before && !excl_after {
                c.excl = c.excl.saturating_sub(num_bytes);
                c.excl_cmpr = c.excl_cmpr.saturating_sub(num_bytes);
            } else if !excl_before && excl_after {
                c.excl += num_bytes;
                c.excl_cmpr += num_bytes;
            }
            if *c != before {
                self.dirty.insert(q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_and_shared() {
        let mut q = Qgroups { enabled: true, ..Default::default() };
        q.groups.insert(5, Counts::default());
        q.groups.insert(256, Counts::default());
        let l1 = (1u64 << 48) | 1;
        q.groups.insert(l1, Counts::default());
        q.parents.entry(5).or_default().insert(l1);
        q.parents.entry(256).or_default().insert(l1);
        let s = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        // New in 5: exclusive to 5 and to 1/1.
        q.account(4096, &s(&[]), &s(&[5]));
        assert_eq!((q.groups[&5].rfer, q.groups[&5].excl), (4096, 4096));
        // Snapshot shares it: 5 loses exclusivity, 1/1 keeps it.
        q.account(4096, &s(&[5]), &s(&[5, 256]));
        assert_eq!((q.groups[&5].rfer, q.groups[&5].excl), (4096, 0));
        assert_eq!((q.groups[&256].rfer, q.groups[&256].excl), (4096, 0));
        assert_eq!((q.groups[&l1].rfer, q.groups[&l1].excl), (4096, 4096));
        // 5 drops it: exclusive to 256 now.
        q.account(4096, &s(&[5, 256]), &s(&[256]));
        assert_eq!((q.groups[&5].rfer, q.groups[&5].excl), (0, 0));
        assert_eq!((q.groups[&256].rfer, q.groups[&256].excl), (4096, 4096));
        // Gone.
        q.account(4096, &s(&[256]), &s(&[]));
        assert_eq!(q.groups[&256], Counts::default());
        assert_eq!(q.groups[&l1], Counts::default());
    }
}
