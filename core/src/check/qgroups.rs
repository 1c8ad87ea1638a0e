//! Phase 9: quota groups. The quota tree's items against accounting
//! recomputed from the trees, as `btrfs check` and the kernel's rescan
//! define it:
//!
//! - every extent (data extent or tree block) is referenced by a set of
//!   subvolumes: those from whose root it can be reached. A tree block
//!   reached through a block shared with a snapshot belongs to both, however
//!   its own back references say it (a keyed reference from the original
//!   root only, or a full reference from its parent): the sets are computed
//!   over every path from every root, so indirect and full back references
//!   come out the same. A data extent belongs to the roots of every leaf
//!   whose file extents point into it. Deleted subvolumes count until the
//!   cleaner drops them; the part of a tree already dropped does not.
//! - a level-0 qgroup `0/id` refers to every extent whose set holds `id`,
//!   and has it exclusively when the set is exactly `{id}`;
//! - a higher-level qgroup refers to an extent when any member (directly
//!   or through other groups) does, and has it exclusively when every root
//!   of the set is a member (a root without a qgroup is in no group).
//!
//! Counts are compared only when the status item says they are
//! trustworthy: a rescan in progress or the inconsistent flag means the
//! kernel itself expects them to be off (a warning, as btrfs check).

use super::findings::{Category, Phase, QgroupCount, QgroupReport, Repair, F};
use super::Ctx;
use crate::format::consts::*;
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::format::qgroup::qgroupid_str;
use crate::tree::Node;
use std::collections::{BTreeMap, HashMap};

const P: Phase = Phase::Qgroups;
const Q: u64 = BTRFS_QUOTA_TREE_OBJECTID;
const STATUS_VERSION: u64 = 1;
const KNOWN_STATUS_FLAGS: u64 = BTRFS_QGROUP_STATUS_FLAG_ON
    | BTRFS_QGROUP_STATUS_FLAG_RESCAN
    | BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT
    | BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE;
/// max_rfer, max_excl, rsv_rfer, rsv_excl, rfer_cmpr, excl_cmpr.
const KNOWN_LIMIT_FLAGS: u64 = 0x3f;
/// Most per-qgroup count findings stored (the rest are counted).
const MAX_COUNT_FINDINGS: usize = 200;

#[derive(Clone, Copy, Debug)]
struct Status {
    key: Key,
    /// Simple quotas: the generation they were enabled at.
    enable_gen: Option<u64>,
    version: u64,
    generation: u64,
    flags: u64,
    rescan: u64,
}

#[derive(Clone, Copy, Debug)]
struct Info {
    id: u64,
    key: Key,
    generation: u64,
    rfer: u64,
    rfer_cmpr: u64,
    excl: u64,
    excl_cmpr: u64,
}

#[derive(Clone, Copy, Debug)]
struct Limit {
    id: u64,
    key: Key,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
}

#[derive(Default)]
pub(crate) struct Facts {
    status: Option<Status>,
    statuses: u32,
    infos: Vec<Info>,
    limits: Vec<Limit>,
    /// (objectid, offset) of each relation item.
    relations: Vec<(u64, u64)>,
    /// The quota tree was walked (quotas are enabled).
    pub present: bool,
}

pub(super) fn on_quota_leaf(cx: &mut Ctx, node: &Node) {
    cx.qgroups.present = true;
    for slot in 0..node.nr_safe() {
        let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
            continue;
        };
        match decode(&k, d, 0) {
            Ok(ItemBody::QgroupStatus(s, enable_gen)) => {
                cx.qgroups.statuses += 1;
                cx.qgroups.status = Some(Status {
                    key: k,
                    enable_gen,
                    version: s.version.get(),
                    generation: s.generation.get(),
                    flags: s.flags.get(),
                    rescan: s.rescan.get(),
                });
            }
            Ok(ItemBody::QgroupInfo(i)) => cx.qgroups.infos.push(Info {
                id: k.offset,
                key: k,
                generation: i.generation.get(),
                rfer: i.rfer.get(),
                rfer_cmpr: i.rfer_cmpr.get(),
                excl: i.excl.get(),
                excl_cmpr: i.excl_cmpr.get(),
            }),
            Ok(ItemBody::QgroupLimit(l)) => cx.qgroups.limits.push(Limit {
                id: k.offset,
                key: k,
                flags: l.flags.get(),
                max_rfer: l.max_rfer.get(),
                max_excl: l.max_excl.get(),
            }),
            Ok(ItemBody::QgroupRelation) => cx.qgroups.relations.push((k.objectid, k.offset)),
            // Malformed items were reported with the block.
            Err(_) => {}
            Ok(_) => cx.report(
                F::err(P, Category::QgroupItem)
                    .tree(Q)
                    .at(node.bytenr)
                    .key(k)
                    .msg(format!("unexpected item type {} in the quota tree", k.ty)),
            ),
        }
    }
}

fn level(id: u64) -> u64 {
    id >> 48
}

/// Trees quotas account: the top-level subvolume and every subvolume or
/// snapshot (not the data relocation tree, whose id is negative).
fn is_subvol(id: u64) -> bool {
    id == BTRFS_FS_TREE_OBJECTID
        || (BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&id)
}

pub(super) fn check(cx: &mut Ctx) {
    let facts = std::mem::take(&mut cx.qgroups);
    if !facts.present {
        return;
    }
    let gen = cx.gen;
    let not_computed = |cx: &mut Ctx, why: &str| {
        cx.sink.qgroups = Some(QgroupReport {
            simple: false,
            rescan: None,
            inconsistent: false,
            groups: Vec::new(),
            not_computed: Some(why.to_string()),
        })
    };
    let Some(st) = facts.status else {
        not_computed(cx, "the quota tree has no status item");
        cx.report(
            F::err(P, Category::QgroupStatus)
                .tree(Q)
                .msg("the quota tree has no status item"),
        );
        return;
    };
    if facts.statuses > 1 {
        cx.report(
            F::err(P, Category::QgroupStatus)
                .tree(Q)
                .key(st.key)
                .msg(format!("{} status items in the quota tree", facts.statuses)),
        );
    }
    if st.version != STATUS_VERSION {
        not_computed(cx, &format!("quota status version {}", st.version));
        cx.report(F::warn(P, Category::QgroupStatus).tree(Q).key(st.key).msg(format!(
            "quota status version {} (the kernel knows {STATUS_VERSION} and disables quotas otherwise)",
            st.version
        )));
        return;
    }
    if st.flags & !KNOWN_STATUS_FLAGS != 0 {
        cx.report(
            F::warn(P, Category::QgroupStatus)
                .tree(Q)
                .key(st.key)
                .msg(format!(
                    "unknown quota status flags 0x{:x}",
                    st.flags & !KNOWN_STATUS_FLAGS
                )),
        );
    }
    if st.generation != gen {
        cx.report(F::warn(P, Category::QgroupStatus).tree(Q).key(st.key).msg(format!(
            "quota status generation {} differs from the filesystem's {gen}: the kernel marks the counts inconsistent at mount",
            st.generation
        )));
    }

    // Structure: limits need their qgroup, relations come in pairs between
    // existing qgroups of increasing level.
    let infos: BTreeMap<u64, Info> = facts.infos.iter().map(|i| (i.id, *i)).collect();
    for l in &facts.limits {
        if !infos.contains_key(&l.id) {
            cx.report(
                F::err(P, Category::QgroupLimit)
                    .tree(Q)
                    .key(l.key)
                    .msg(format!(
                        "limit item for qgroup {}, which has no info item",
                        qgroupid_str(l.id)
                    )),
            );
        }
        if l.flags & !KNOWN_LIMIT_FLAGS != 0 {
            cx.report(
                F::warn(P, Category::QgroupLimit)
                    .tree(Q)
                    .key(l.key)
                    .msg(format!(
                        "qgroup {} limit has unknown flags 0x{:x}",
                        qgroupid_str(l.id),
                        l.flags & !KNOWN_LIMIT_FLAGS
                    )),
            );
        }
    }
    let mut rels = facts.relations.clone();
    rels.sort_unstable();
    let mut parents: HashMap<u64, Vec<u64>> = HashMap::new();
    for &(a, b) in &rels {
        if rels.binary_search(&(b, a)).is_err() {
            cx.report(F::err(P, Category::QgroupRelation).tree(Q).msg(format!(
                "relation {} -> {} has no reverse item",
                qgroupid_str(a),
                qgroupid_str(b)
            )));
        }
        if a > b {
            continue;
        }
        // (member, parent): the parent is the higher level.
        let (member, parent) = (a, b);
        let mut bad = Vec::new();
        if !infos.contains_key(&member) {
            bad.push(format!("member {} does not exist", qgroupid_str(member)));
        }
        if !infos.contains_key(&parent) {
            bad.push(format!("parent {} does not exist", qgroupid_str(parent)));
        }
        if level(member) >= level(parent) {
            bad.push(format!(
                "member level {} is not below parent level {}",
                level(member),
                level(parent)
            ));
        }
        if bad.is_empty() {
            parents.entry(member).or_default().push(parent);
        } else {
            cx.report(F::err(P, Category::QgroupRelation).tree(Q).msg(format!(
                "relation {} in {}: {}",
                qgroupid_str(member),
                qgroupid_str(parent),
                bad.join(", ")
            )));
        }
    }
    for i in infos.values() {
        if i.generation > gen.saturating_add(1) {
            cx.report(
                F::warn(P, Category::QgroupInfo)
                    .tree(Q)
                    .key(i.key)
                    .msg(format!(
                        "qgroup {} generation {} newer than the filesystem's {gen}",
                        qgroupid_str(i.id),
                        i.generation
                    )),
            );
        }
    }
    // Every live subvolume is accounted from its creation on.
    let mut missing = Vec::new();
    for r in &cx.roots {
        let id = r.id();
        if is_subvol(id) && r.item.refs.get() > 0 && !infos.contains_key(&id) {
            missing.push(id);
        }
    }
    for id in missing {
        cx.report(
            F::warn(P, Category::QgroupInfo)
                .tree(Q)
                .msg(format!("subvolume {id} has no qgroup 0/{id}")),
        );
    }

    let skip =
        st.flags & (BTRFS_QGROUP_STATUS_FLAG_RESCAN | BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT) != 0;
    if st.flags & BTRFS_QGROUP_STATUS_FLAG_RESCAN != 0 {
        cx.report(
            F::warn(P, Category::QgroupStatus)
                .tree(Q)
                .key(st.key)
                .msg(format!(
            "a quota rescan is in progress (at {}): counts are not final and are not compared",
            st.rescan
        )),
        );
    } else if st.flags & BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT != 0 {
        cx.report(F::warn(P, Category::QgroupStatus).tree(Q).key(st.key).msg(
            "quotas are marked inconsistent: counts are not compared (`btrfs quota rescan` recomputes them)",
        ));
    }

    let simple = cx.has_incompat(BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA)
        || st.flags & BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE != 0;
    let computed = if simple {
        recompute_simple(cx, &infos, &parents, st.enable_gen.unwrap_or(0))
    } else {
        recompute(cx, &infos, &parents)
    };
    cx.sink.checked(P, infos.len() as u64);
    cx.sink.qgroups = Some(QgroupReport {
        simple,
        rescan: (st.flags & BTRFS_QGROUP_STATUS_FLAG_RESCAN != 0).then_some(st.rescan),
        inconsistent: st.flags & BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT != 0,
        groups: infos
            .values()
            .map(|i| {
                let (rfer, excl) = computed.get(&i.id).copied().unwrap_or((0, 0));
                QgroupCount {
                    id: i.id,
                    name: qgroupid_str(i.id),
                    disk_referenced: i.rfer,
                    disk_exclusive: i.excl,
                    disk_referenced_compressed: i.rfer_cmpr,
                    disk_exclusive_compressed: i.excl_cmpr,
                    referenced: rfer,
                    exclusive: excl,
                }
            })
            .collect(),
        not_computed: None,
    });
    let mut reported = 0usize;
    for i in infos.values() {
        let (rfer, excl) = computed.get(&i.id).copied().unwrap_or((0, 0));
        // Simple quotas do not keep the compressed counters (the kernel's
        // squota moves rfer and excl only).
        if !simple && (i.rfer_cmpr != i.rfer || i.excl_cmpr != i.excl) {
            cx.report(F::warn(P, Category::QgroupInfo).tree(Q).key(i.key).msg(format!(
                "qgroup {}: compressed counts ({}, {}) differ from the counts ({}, {}); the kernel keeps them equal",
                qgroupid_str(i.id),
                i.rfer_cmpr,
                i.excl_cmpr,
                i.rfer,
                i.excl
            )));
        }
        if rfer == i.rfer && excl == i.excl {
            continue;
        }
        if reported >= MAX_COUNT_FINDINGS {
            continue;
        }
        reported += 1;
        let m = format!(
            "qgroup {}: referenced {} but {rfer} recomputed, exclusive {} but {excl} recomputed",
            qgroupid_str(i.id),
            i.rfer,
            i.excl
        );
        if skip {
            cx.report(
                F::warn(P, Category::QgroupCount)
                    .tree(Q)
                    .key(i.key)
                    .fix(Repair::RecountQgroups)
                    .msg(m),
            );
        } else {
            cx.report(
                F::err(P, Category::QgroupCount)
                    .tree(Q)
                    .key(i.key)
                    .fix(Repair::RecountQgroups)
                    .msg(m),
            );
        }
    }
    for l in &facts.limits {
        let Some(&(rfer, excl)) = computed.get(&l.id) else {
            continue;
        };
        if l.flags & 1 != 0 && rfer > l.max_rfer {
            cx.report(
                F::warn(P, Category::QgroupLimit)
                    .tree(Q)
                    .key(l.key)
                    .msg(format!(
                        "qgroup {} refers to {rfer} bytes, over its limit {}",
                        qgroupid_str(l.id),
                        l.max_rfer
                    )),
            );
        }
        if l.flags & 2 != 0 && excl > l.max_excl {
            cx.report(
                F::warn(P, Category::QgroupLimit)
                    .tree(Q)
                    .key(l.key)
                    .msg(format!(
                        "qgroup {} has {excl} exclusive bytes, over its limit {}",
                        qgroupid_str(l.id),
                        l.max_excl
                    )),
            );
        }
    }
}

/// Each qgroup's ancestors (bounded: relations may loop in a damaged tree).
fn ancestors(parents: &HashMap<u64, Vec<u64>>, q: u64) -> Vec<u64> {
    let mut out = vec![q];
    let mut k = 0;
    while k < out.len() && out.len() < 4096 {
        for &p in parents.get(&out[k]).map(|v| v.as_slice()).unwrap_or(&[]) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        k += 1;
    }
    out
}

/// Simple quotas: an extent made since quotas were enabled belongs to
/// one subvolume only, the one that allocated it (a data extent's owner
/// ref, a tree block's header owner), exclusively, whoever shares it later.
fn recompute_simple(
    cx: &Ctx,
    infos: &BTreeMap<u64, Info>,
    parents: &HashMap<u64, Vec<u64>>,
    enable_gen: u64,
) -> HashMap<u64, (u64, u64)> {
    let mut owner_of: HashMap<u64, u64> = cx.ext.block_owner.iter().copied().collect();
    let mut result: HashMap<u64, (u64, u64)> = infos.keys().map(|&q| (q, (0, 0))).collect();
    for r in &cx.ext.recs {
        if r.generation < enable_gen {
            continue;
        }
        let root = if r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
            owner_of.remove(&r.bytenr).unwrap_or(0)
        } else {
            r.owner_root
        };
        if !is_subvol(root) || !infos.contains_key(&root) {
            continue;
        }
        for q in ancestors(parents, root) {
            let e = result.entry(q).or_default();
            e.0 += r.len;
            e.1 += r.len;
        }
    }
    result
}

/// Interned sets of subvolume ids.
#[derive(Default)]
struct Sets {
    ids: HashMap<Vec<u64>, u32>,
    sets: Vec<Vec<u64>>,
}

impl Sets {
    fn new() -> Sets {
        let mut s = Sets::default();
        s.intern(Vec::new());
        s
    }
    fn intern(&mut self, v: Vec<u64>) -> u32 {
        if let Some(&i) = self.ids.get(&v) {
            return i;
        }
        let i = self.sets.len() as u32;
        self.sets.push(v.clone());
        self.ids.insert(v, i);
        i
    }
    fn union(&mut self, ids: &[u32]) -> u32 {
        match ids {
            [] => 0,
            [one] => *one,
            _ if ids.iter().all(|&i| i == ids[0]) => ids[0],
            _ => {
                let mut v: Vec<u64> = ids
                    .iter()
                    .flat_map(|&i| self.sets[i as usize].iter().copied())
                    .collect();
                v.sort_unstable();
                v.dedup();
                self.intern(v)
            }
        }
    }
}

/// (referenced, exclusive) of every qgroup, from the references the walk saw.
fn recompute(
    cx: &Ctx,
    infos: &BTreeMap<u64, Info>,
    parents: &HashMap<u64, Vec<u64>>,
) -> HashMap<u64, (u64, u64)> {
    let ns = cx.img.nodesize as u64;
    let tree = &cx.ext.found_tree;
    // Blocks, parents before children (a parent's level is higher).
    let mut order: Vec<usize> = (0..tree.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(tree[i].level), tree[i].bytenr));
    let mut sets = Sets::new();
    let mut set_of: HashMap<u64, u32> = HashMap::with_capacity(tree.len());
    let mut i = 0;
    let mut from: Vec<u32> = Vec::new();
    while i < order.len() {
        let b = tree[order[i]].bytenr;
        from.clear();
        while i < order.len() && tree[order[i]].bytenr == b {
            let t = tree[order[i]];
            if t.parent == 0 {
                if is_subvol(t.tree) {
                    let s = sets.intern(vec![t.tree]);
                    from.push(s);
                }
            } else if t.parent != t.bytenr {
                if let Some(&s) = set_of.get(&t.parent) {
                    from.push(s);
                }
            }
            i += 1;
        }
        let s = sets.union(&from);
        set_of.insert(b, s);
    }
    // Bytes per set: every tree block once, every data extent once.
    let mut bytes: HashMap<u32, u64> = HashMap::new();
    for (_, &s) in set_of.iter() {
        if s != 0 {
            *bytes.entry(s).or_default() += ns;
        }
    }
    let mut data: Vec<(u64, u32)> = cx
        .ext
        .found_data
        .iter()
        .map(|d| (d.bytenr, set_of.get(&d.leaf).copied().unwrap_or(0)))
        .collect();
    data.sort_unstable();
    let recs = &cx.ext.recs;
    let mut j = 0;
    while j < data.len() {
        let b = data[j].0;
        from.clear();
        while j < data.len() && data[j].0 == b {
            from.push(data[j].1);
            j += 1;
        }
        let s = sets.union(&from);
        if s == 0 {
            continue;
        }
        let Ok(r) = recs.binary_search_by_key(&b, |r| r.bytenr) else {
            continue;
        };
        *bytes.entry(s).or_default() += recs[r].len;
    }
    let mut groups_of: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut result: HashMap<u64, (u64, u64)> = infos.keys().map(|&q| (q, (0, 0))).collect();
    let mut count: HashMap<u64, usize> = HashMap::new();
    for (s, b) in bytes {
        let roots = &sets.sets[s as usize];
        count.clear();
        for &r in roots {
            if !infos.contains_key(&r) {
                continue;
            }
            let g = groups_of.entry(r).or_insert_with(|| ancestors(parents, r));
            for &q in g.iter() {
                *count.entry(q).or_default() += 1;
            }
        }
        for (&q, &n) in &count {
            let e = result.entry(q).or_default();
            e.0 += b;
            if n == roots.len() {
                e.1 += b;
            }
        }
    }
    result
}
