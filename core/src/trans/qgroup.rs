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
//!
//! Simple quotas (squota, `SIMPLE_MODE`) count differently: an extent
//! counts, in full and as exclusive, for the subvolume that allocated it
//! (a data extent names it in its EXTENT_OWNER_REF, a tree block in its
//! header), from its allocation to its free, when it was allocated at or
//! after the generation quotas were enabled at; sharing changes nothing,
//! and the compressed counters are left alone (the kernel's
//! btrfs_record_squota_delta).

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

/// Quota accounting over the store's trees: the quota tree's items, the
/// qgroup counters ([`Qgroups`], which the store owns) and their update at
/// commit. Obtained from [`Store::quotas`].
pub struct Quotas<'a> {
    st: &'a mut Store,
}

impl Store {
    /// Quota accounting: see [`Quotas`].
    pub fn quotas(&mut self) -> Quotas<'_> {
        Quotas { st: self }
    }
}

/// The counters of one qgroup, as its QGROUP_INFO item holds them, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes of every extent a subvolume of the qgroup references.
    pub rfer: u64,
    /// Compressed-size counterpart of `rfer`, changed by the same amounts (as
    /// the kernel does: both count on-disk extent bytes).
    pub rfer_cmpr: u64,
    /// Bytes of the extents referenced only by subvolumes of the qgroup.
    pub excl: u64,
    /// Compressed-size counterpart of `excl`, changed by the same amounts.
    pub excl_cmpr: u64,
}

/// The qgroup state of the store (the kernel's in-memory `btrfs_qgroup`
/// tree): counters by qgroup id, the relation graph, and what the running
/// transaction changed, accounted at commit.
#[derive(Debug, Default)]
pub struct Qgroups {
    /// Quotas are on (the status item has `BTRFS_QGROUP_STATUS_FLAG_ON`);
    /// nothing else here is kept when false.
    pub enabled: bool,
    /// qgroup id -> counters.
    pub groups: BTreeMap<u64, Counts>,
    /// child qgroup -> its parents.
    pub parents: BTreeMap<u64, BTreeSet<u64>>,
    dirty: BTreeSet<u64>,
    /// Extents whose references changed in this transaction: bytenr ->
    /// (bytes, level of a tree block).
    extents: BTreeMap<u64, (u64, Option<u8>)>,
    /// Extents whose items a repair rewrote in place (not through delayed
    /// references): bytenr -> (bytes, level). A rescan in the same
    /// transaction counts the committed trees, so it notes these to be
    /// accounted at commit from their committed references to the new.
    rewritten: BTreeMap<u64, (u64, Option<u8>)>,
    status_written: bool,
    /// Simple quotas: the generation they were enabled at (extents older
    /// than it count nowhere); None: full qgroup accounting.
    pub simple: Option<u64>,
}

/// Whether a changed extent can count in some qgroup: data, or a tree
/// block of a subvolume (directly or through a shared parent).
fn may_count(head: &RefHead) -> bool {
    head.level.is_none()
        || head.refs.keys().any(|r| {
            matches!(r, BackRef::Tree { root } if is_fstree(*root))
                || matches!(r, BackRef::SharedTree { .. })
        })
}

impl Qgroups {
    /// Note an extent whose item a repair rewrote in place (see
    /// `rewritten`).
    pub fn note_rewritten(&mut self, bytenr: u64, num_bytes: u64, level: Option<u8>) {
        if self.enabled && self.simple.is_none() {
            self.rewritten.entry(bytenr).or_insert((num_bytes, level));
        }
    }

    /// Note an extent for accounting at commit.
    pub fn note_extent(&mut self, bytenr: u64, num_bytes: u64, level: Option<u8>) {
        if self.enabled {
            self.extents.entry(bytenr).or_insert((num_bytes, level));
        }
    }

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
            let Some(c) = self.groups.get_mut(&q) else {
                continue;
            };
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

impl Quotas<'_> {
    /// Read the quota tree when quotas are on.
    pub(super) fn load_qgroups(&mut self) -> Result<()> {
        if !self.st.tree_exists(BTRFS_QUOTA_TREE_OBJECTID)? {
            return Ok(());
        }
        let status_key = Key::new(0, BTRFS_QGROUP_STATUS_KEY, 0);
        let Some(d) = self.st.lookup(QUOTA_TREE, &status_key)? else {
            return Ok(());
        };
        let st = QgroupStatusItem::read_from_prefix(&d)
            .map_err(|_| {
                Error::corrupt_key_as(
                    crate::CorruptKind::Item,
                    "qgroup status item size",
                    0,
                    status_key,
                )
            })?
            .0;
        if st.flags.get() & BTRFS_QGROUP_STATUS_FLAG_ON == 0 {
            return Ok(());
        }
        let simple = (st.flags.get() & BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE != 0).then(|| {
            d.get(32..40)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        });
        let mut q = Qgroups {
            enabled: true,
            simple,
            ..Default::default()
        };
        for (k, d) in self.st.items_in(
            QUOTA_TREE,
            Key::new(0, BTRFS_QGROUP_INFO_KEY, 0),
            Key::new(0, BTRFS_QGROUP_INFO_KEY, u64::MAX),
        )? {
            let i = QgroupInfoItem::read_from_bytes(&d).map_err(|_| {
                Error::corrupt_key_as(crate::CorruptKind::Item, "qgroup info item size", 0, k)
            })?;
            q.groups.insert(
                k.offset,
                Counts {
                    rfer: i.rfer.get(),
                    rfer_cmpr: i.rfer_cmpr.get(),
                    excl: i.excl.get(),
                    excl_cmpr: i.excl_cmpr.get(),
                },
            );
        }
        // Relations are stored both ways; (child, RELATION, parent) has
        // the child first (child < parent as qgroup ids: parents have a
        // higher level).
        for (k, _) in self.st.items_in(
            QUOTA_TREE,
            Key::new(0, BTRFS_QGROUP_RELATION_KEY, 0),
            Key::new(u64::MAX, BTRFS_QGROUP_RELATION_KEY, u64::MAX),
        )? {
            if k.ty == BTRFS_QGROUP_RELATION_KEY && k.objectid < k.offset {
                q.parents.entry(k.objectid).or_default().insert(k.offset);
            }
        }
        self.st.qgroups = q;
        Ok(())
    }

    /// Note an extent whose references changed (its head is about to run).
    pub(super) fn qgroup_note_extent(&mut self, bytenr: u64, head: &RefHead) {
        // Simple quotas count at allocation and free, not from references.
        if self.st.qgroups.enabled && self.st.qgroups.simple.is_none() && may_count(head) {
            self.st
                .qgroups
                .extents
                .entry(bytenr)
                .or_insert((head.num_bytes, head.level));
        }
    }

    /// Account every noted extent and write the changed info items and the
    /// status item (once per commit). Returns whether the quota tree changed.
    pub(super) fn account_qgroups(&mut self) -> Result<bool> {
        if !self.st.qgroups.enabled {
            return Ok(false);
        }
        self.account_noted(None)?;
        let mut changed = false;
        let transid = self.st.transid;
        for id in std::mem::take(&mut self.st.qgroups.dirty) {
            let Some(c) = self.st.qgroups.groups.get(&id).copied() else {
                continue;
            };
            let item = QgroupInfoItem {
                generation: transid.into(),
                rfer: c.rfer.into(),
                rfer_cmpr: c.rfer_cmpr.into(),
                excl: c.excl.into(),
                excl_cmpr: c.excl_cmpr.into(),
            };
            self.st.update_item(
                QUOTA_TREE,
                &Key::new(0, BTRFS_QGROUP_INFO_KEY, id),
                item.as_bytes(),
            )?;
            changed = true;
        }
        if !self.st.qgroups.status_written {
            let k = Key::new(0, BTRFS_QGROUP_STATUS_KEY, 0);
            if let Some(mut d) = self.st.lookup(QUOTA_TREE, &k)? {
                if d.len() >= 16 {
                    d[8..16].copy_from_slice(&transid.to_le_bytes());
                    self.st.update_item(QUOTA_TREE, &k, &d)?;
                }
            }
            self.st.qgroups.status_written = true;
            changed = true;
        }
        Ok(changed)
    }

    /// Account every extent noted in this transaction: the subvolumes that
    /// referenced it in the committed trees against those that reference it
    /// now. `skip` leaves one subvolume out of both sets (a snapshot whose
    /// counters btrfs_qgroup_inherit sets right after).
    ///
    /// Invariant: the counters describe the committed trees plus what was
    /// accounted since, so the committed trees are each extent's old roots.
    /// Whatever sets counters from the trees as they stand (a snapshot's
    /// inherit) is followed by a commit before any reference changes
    /// (see `qgroup_account_snapshot`); a rescan counts the committed trees
    /// (see `quota_rescan`).
    fn account_noted(&mut self, skip: Option<u64>) -> Result<()> {
        let extents = std::mem::take(&mut self.st.qgroups.extents);
        let mut cache = RootCache::new();
        for (bytenr, (num_bytes, level)) in extents {
            let mut old =
                self.st
                    .committed()
                    .extent_roots(View::Committed, bytenr, level, &mut cache)?;
            let mut new =
                self.st
                    .committed()
                    .extent_roots(View::Current, bytenr, level, &mut cache)?;
            if let Some(id) = skip {
                old.remove(&id);
                new.remove(&id);
            }
            if old != new {
                self.st.qgroups.account(num_bytes, &old, &new);
            }
        }
        Ok(())
    }

    /// Create qgroup 0/`id` with zero counters (a new subvolume).
    pub fn qgroup_create(&mut self, id: u64) -> Result<()> {
        if !self.st.qgroups.enabled {
            return Ok(());
        }
        self.st.qgroups.groups.insert(id, Counts::default());
        self.write_qgroup_items(id, true)
    }

    /// Write qgroup `id`'s info item (and with `limit`, a zero limit item).
    fn write_qgroup_items(&mut self, id: u64, limit: bool) -> Result<()> {
        let c = self.st.qgroups.groups.get(&id).copied().unwrap_or_default();
        let t = self.st.transid;
        let item = QgroupInfoItem {
            generation: t.into(),
            rfer: c.rfer.into(),
            rfer_cmpr: c.rfer_cmpr.into(),
            excl: c.excl.into(),
            excl_cmpr: c.excl_cmpr.into(),
        };
        self.st.update_item(
            QUOTA_TREE,
            &Key::new(0, BTRFS_QGROUP_INFO_KEY, id),
            item.as_bytes(),
        )?;
        if limit {
            let z = crate::format::qgroup::QgroupLimitItem {
                flags: 0.into(),
                max_rfer: 0.into(),
                max_excl: 0.into(),
                rsv_rfer: 0.into(),
                rsv_excl: 0.into(),
            };
            self.st.update_item(
                QUOTA_TREE,
                &Key::new(0, BTRFS_QGROUP_LIMIT_KEY, id),
                z.as_bytes(),
            )?;
        }
        Ok(())
    }

    /// Remove qgroup 0/`id` (its subvolume is gone): info, limit, relations.
    pub fn qgroup_remove(&mut self, id: u64) -> Result<()> {
        if !self.st.qgroups.enabled {
            return Ok(());
        }
        self.st.qgroups.groups.remove(&id);
        self.st.qgroups.dirty.remove(&id);
        self.st
            .delete_item(QUOTA_TREE, &Key::new(0, BTRFS_QGROUP_INFO_KEY, id))?;
        self.st
            .delete_item(QUOTA_TREE, &Key::new(0, BTRFS_QGROUP_LIMIT_KEY, id))?;
        if let Some(ps) = self.st.qgroups.parents.remove(&id) {
            for p in ps {
                self.st
                    .delete_item(QUOTA_TREE, &Key::new(id, BTRFS_QGROUP_RELATION_KEY, p))?;
                self.st
                    .delete_item(QUOTA_TREE, &Key::new(p, BTRFS_QGROUP_RELATION_KEY, id))?;
            }
        }
        Ok(())
    }

    /// The qgroup side of a snapshot (the kernel's qgroup_account_snapshot
    /// in create_pending_snapshot): every reference change queued so far is
    /// run and accounted with the new snapshot `dst` left out (its counters
    /// are set next, whatever its tree shares), then `dst`'s qgroup becomes
    /// a copy of `src`'s (btrfs_qgroup_inherit): it references what the
    /// source references, and each has only its root block to itself.
    ///
    /// The caller commits next, before any reference changes: that commit
    /// is the kernel's switch of commit roots after the inherit, so that
    /// every later change is accounted from trees in which `dst` exists.
    /// A reference change in between would be accounted from trees without
    /// `dst` and count the extent for `dst` a second time.
    pub fn qgroup_account_snapshot(&mut self, src: u64, dst: u64) -> Result<()> {
        if !self.st.qgroups.enabled {
            return Ok(());
        }
        if self.st.qgroups.simple.is_some() {
            // A snapshot allocates nothing but what it writes next: its
            // qgroup starts empty.
            self.st.qgroups.groups.entry(dst).or_default();
            return self.write_qgroup_items(dst, true);
        }
        while self.st.committer().run_delayed_refs()? {}
        self.account_noted(Some(dst))?;
        let ns = self.st.nodesize() as u64;
        let s = self
            .st
            .qgroups
            .groups
            .get(&src)
            .copied()
            .unwrap_or_default();
        self.st.qgroups.groups.insert(
            dst,
            Counts {
                rfer: s.rfer,
                rfer_cmpr: s.rfer_cmpr,
                excl: ns,
                excl_cmpr: ns,
            },
        );
        if let Some(c) = self.st.qgroups.groups.get_mut(&src) {
            c.excl = ns;
            c.excl_cmpr = ns;
        }
        self.st.qgroups.dirty.insert(src);
        self.st.qgroups.dirty.insert(dst);
        if let Ok(Some(d)) = self
            .st
            .lookup(QUOTA_TREE, &Key::new(0, BTRFS_QGROUP_LIMIT_KEY, src))
        {
            self.st
                .update_item(QUOTA_TREE, &Key::new(0, BTRFS_QGROUP_LIMIT_KEY, dst), &d)?;
        } else {
            self.write_qgroup_items(dst, true)?;
        }
        self.write_qgroup_items(dst, false)
    }

    /// Turn quotas on (btrfs_quota_enable): the quota tree with its status
    /// item and a qgroup for every subvolume. The caller commits, then
    /// rescans (`quota_rescan`) and commits again.
    pub fn quota_enable(&mut self, subvols: &[u64]) -> Result<()> {
        self.enable_quotas(subvols, false)
    }

    /// Turn simple quotas on (`btrfs quota enable --simple`, mkfs `-O
    /// squota`): the SIMPLE_QUOTA incompat flag, the status item in simple
    /// mode with this transaction as the enable generation, and a qgroup
    /// for every subvolume, all empty: what was allocated before counts
    /// nowhere, everything allocated from now on counts for its owner. No
    /// rescan.
    pub fn quota_enable_simple(&mut self, subvols: &[u64]) -> Result<()> {
        self.enable_quotas(subvols, true)
    }

    /// [`Store::quota_enable`] and [`Store::quota_enable_simple`]: the
    /// quota tree, the status item (inconsistent until the rescan, or
    /// simple with its enable generation), an empty qgroup per subvolume.
    fn enable_quotas(&mut self, subvols: &[u64], simple: bool) -> Result<()> {
        if self.st.qgroups.enabled {
            return Ok(());
        }
        if !self.st.tree_exists(BTRFS_QUOTA_TREE_OBJECTID)? {
            let t = self.st.transid;
            let ri = crate::format::root::new_root_item(0, t, 0, None);
            self.st.create_tree(BTRFS_QUOTA_TREE_OBJECTID, ri)?;
        }
        let t = self.st.transid;
        let mode = if simple {
            BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE
        } else {
            BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT
        };
        let mut st = vec![0u8; crate::format::qgroup::QGROUP_STATUS_SIMPLE_SIZE];
        st[..8].copy_from_slice(&1u64.to_le_bytes());
        st[8..16].copy_from_slice(&t.to_le_bytes());
        st[16..24].copy_from_slice(&(BTRFS_QGROUP_STATUS_FLAG_ON | mode).to_le_bytes());
        if simple {
            st[32..40].copy_from_slice(&t.to_le_bytes());
            let f = self.st.sb.incompat_flags.get();
            self.st
                .sb
                .incompat_flags
                .set(f | BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA);
        }
        self.st
            .update_item(QUOTA_TREE, &Key::new(0, BTRFS_QGROUP_STATUS_KEY, 0), &st)?;
        self.st.qgroups = Qgroups {
            enabled: true,
            simple: simple.then_some(t),
            ..Default::default()
        };
        for &id in subvols
            .iter()
            .chain(std::iter::once(&BTRFS_FS_TREE_OBJECTID))
        {
            self.st.qgroups.groups.insert(id, Counts::default());
            self.write_qgroup_items(id, true)?;
        }
        Ok(())
    }

    /// Turn quotas off (btrfs_quota_disable): the counters go, the quota
    /// tree is dropped (every block freed, its root item removed) and the
    /// SIMPLE_QUOTA incompat flag cleared, all at the next commit. Simple
    /// quotas' owner refs in data extent items are the caller's: the
    /// kernel refuses them without the flag.
    pub fn quota_disable(&mut self) -> Result<()> {
        self.st.qgroups = Qgroups::default();
        if self.st.tree_exists(BTRFS_QUOTA_TREE_OBJECTID)? {
            let key = self.st.root_key(BTRFS_QUOTA_TREE_OBJECTID)?;
            self.st.subtrees().drop_tree(BTRFS_QUOTA_TREE_OBJECTID)?;
            self.st.delete_item(TreeId::Root, &key)?;
            self.st.subtrees().forget_tree(BTRFS_QUOTA_TREE_OBJECTID);
        }
        let f = self.st.sb.incompat_flags.get();
        self.st
            .sb
            .incompat_flags
            .set(f & !BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA);
        Ok(())
    }

    /// The owner in the header of tree block `bytenr` (a block freed
    /// through a shared reference, whose dropping tree is not its owner).
    pub(super) fn tree_block_owner(&mut self, bytenr: u64) -> Result<u64> {
        if let Some(b) = self.st.cache.get(bytenr) {
            return Ok(crate::tree::edit::owner(b));
        }
        let node =
            self.st
                .img
                .read_tree_block(bytenr, &crate::tree::node::Expect::default(), false)?;
        Ok(node.owner())
    }

    /// A simple-quota change: an extent of `num_bytes` allocated
    /// (`alloc`) or freed by subvolume `root`, allocated at `generation`.
    pub(super) fn squota_delta(&mut self, root: u64, num_bytes: u64, generation: u64, alloc: bool) {
        let Some(enable_gen) = self.st.qgroups.simple else {
            return;
        };
        if !self.st.qgroups.enabled || generation < enable_gen || !is_fstree(root) {
            return;
        }
        for q in self.st.qgroups.covering(root) {
            let Some(c) = self.st.qgroups.groups.get_mut(&q) else {
                continue;
            };
            // Only rfer and excl: the kernel's squota leaves the compressed
            // counters where enabling put them.
            for v in [&mut c.rfer, &mut c.excl] {
                *v = if alloc {
                    v.saturating_add(num_bytes)
                } else {
                    v.saturating_sub(num_bytes)
                };
            }
            self.st.qgroups.dirty.insert(q);
        }
    }

    /// The rescan (btrfs_qgroup_rescan_worker): every counter from zero,
    /// then every extent of the committed extent tree counted for the
    /// subvolumes that reference it in the committed trees; then the status
    /// says consistent and rescan done.
    ///
    /// The committed trees, not the current ones: what the running
    /// transaction changed is noted and accounted at its commit from the
    /// committed trees, so the rescan must start from the same state, or a
    /// change made before the rescan (writeback copying a shared block, the
    /// cleaner dropping a deleted tree at the commit) is counted twice or
    /// taken off what was never added. Noted extents are kept for that.
    pub fn quota_rescan(&mut self) -> Result<()> {
        // Simple quotas have no rescan (the kernel refuses one): what
        // predates them counts nowhere.
        if !self.st.qgroups.enabled || self.st.qgroups.simple.is_some() {
            return Ok(());
        }
        for c in self.st.qgroups.groups.values_mut() {
            *c = Counts::default();
        }
        for (b, v) in std::mem::take(&mut self.st.qgroups.rewritten) {
            self.st.qgroups.extents.entry(b).or_insert(v);
        }
        let ids: Vec<u64> = self.st.qgroups.groups.keys().copied().collect();
        self.st.qgroups.dirty.extend(ids);
        let mut cache = RootCache::new();
        for (bytenr, num_bytes, level) in self
            .st
            .committed()
            .view_extents(View::Committed, &mut cache)?
        {
            let roots =
                self.st
                    .committed()
                    .extent_roots(View::Committed, bytenr, level, &mut cache)?;
            if !roots.is_empty() {
                self.st.qgroups.account(num_bytes, &BTreeSet::new(), &roots);
            }
        }
        let k = Key::new(0, BTRFS_QGROUP_STATUS_KEY, 0);
        if let Some(mut d) = self.st.lookup(QUOTA_TREE, &k)? {
            if d.len() >= 32 {
                let t = self.st.transid;
                d[8..16].copy_from_slice(&t.to_le_bytes());
                d[16..24].copy_from_slice(&BTRFS_QGROUP_STATUS_FLAG_ON.to_le_bytes());
                d[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
                self.st.update_item(QUOTA_TREE, &k, &d)?;
            }
        }
        Ok(())
    }

    /// After the commit: the next transaction writes its status again.
    pub(super) fn qgroups_committed(&mut self) {
        self.st.qgroups.status_written = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_and_shared() {
        let mut q = Qgroups {
            enabled: true,
            ..Default::default()
        };
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
