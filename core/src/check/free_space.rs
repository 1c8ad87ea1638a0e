//! Phase 5: the free space tree against the extent tree. Per block group:
//! one FREE_SPACE_INFO, entries inside the group in the form its flags say,
//! an extent count that matches, and free space that is exactly the group
//! minus its extents and the superblock copies it contains.

use super::findings::{Category, Phase, Repair, F};
use super::Ctx;
use crate::format::consts::*;
use crate::format::free_space::bitmap_ranges;
use crate::format::item::{decode, ItemBody};
use crate::tree::Node;

const P: Phase = Phase::FreeSpace;
const T: u64 = BTRFS_FREE_SPACE_TREE_OBJECTID;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Info {
    pub start: u64,
    pub len: u64,
    pub count: u32,
    pub bitmaps: bool,
}

#[derive(Default)]
pub(crate) struct Facts {
    pub infos: Vec<Info>,
    /// Free ranges (start, len), in key order.
    pub free: Vec<(u64, u64)>,
    pub loaded: bool,
}

pub(super) fn on_leaf(cx: &mut Ctx, node: &Node) {
    cx.fst.loaded = true;
    let ss = cx.img.sectorsize as u64;
    for slot in 0..node.nr_safe() {
        let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
            continue;
        };
        let cur = cx.fst.infos.last().copied();
        let inside = cur.is_some_and(|i| {
            k.objectid >= i.start
                && k.objectid.saturating_add(k.offset) <= i.start.saturating_add(i.len)
        });
        match k.ty {
            BTRFS_FREE_SPACE_INFO_KEY => {
                if let Ok(ItemBody::FreeSpaceInfo(fi)) = decode(&k, d, 0) {
                    cx.fst.infos.push(Info {
                        start: k.objectid,
                        len: k.offset,
                        count: fi.extent_count.get(),
                        bitmaps: fi.flags.get() & BTRFS_FREE_SPACE_USING_BITMAPS != 0,
                    });
                }
            }
            BTRFS_FREE_SPACE_EXTENT_KEY | BTRFS_FREE_SPACE_BITMAP_KEY => {
                let is_bitmap = k.ty == BTRFS_FREE_SPACE_BITMAP_KEY;
                if !inside {
                    cx.report(
                        F::err(P, Category::FreeSpace)
                            .fix(Repair::RebuildFreeSpaceTree)
                            .tree(T)
                            .at(node.bytenr)
                            .key(k)
                            .msg("free space entry outside its block group's info"),
                    );
                    continue;
                }
                if cur.is_some_and(|i| i.bitmaps != is_bitmap) {
                    cx.report(
                        F::err(P, Category::FreeSpace)
                            .fix(Repair::RebuildFreeSpaceTree)
                            .tree(T)
                            .at(node.bytenr)
                            .key(k)
                            .msg(format!(
                                "free space {} entry in a block group whose info says {}",
                                if is_bitmap { "bitmap" } else { "extent" },
                                if is_bitmap { "extents" } else { "bitmaps" }
                            )),
                    );
                }
                if k.offset == 0 {
                    cx.report(
                        F::err(P, Category::FreeSpace)
                            .fix(Repair::RebuildFreeSpaceTree)
                            .tree(T)
                            .at(node.bytenr)
                            .key(k)
                            .msg("empty free space entry"),
                    );
                    continue;
                }
                if is_bitmap {
                    let bits = k.offset / ss.max(1);
                    if (d.len() as u64) != bits.div_ceil(8) {
                        cx.report(
                            F::err(P, Category::FreeSpace)
                                .fix(Repair::RebuildFreeSpaceTree)
                                .tree(T)
                                .at(node.bytenr)
                                .key(k)
                                .msg(format!("bitmap of {} bytes for {bits} sectors", d.len())),
                        );
                        continue;
                    }
                    for (s, l) in bitmap_ranges(d, k.objectid, ss) {
                        cx.fst.free.push((
                            s,
                            l.min(k.objectid.saturating_add(k.offset).saturating_sub(s)),
                        ));
                    }
                } else {
                    cx.fst.free.push((k.objectid, k.offset));
                }
            }
            _ => cx.report(
                F::err(P, Category::FreeSpace)
                    .fix(Repair::RebuildFreeSpaceTree)
                    .tree(T)
                    .at(node.bytenr)
                    .key(k)
                    .msg("unexpected key in the free space tree"),
            ),
        }
    }
}

/// Superblock copies inside `[start, end)` (a block group), which are
/// neither used nor free: the allocator's rule, for every profile.
pub(super) fn excluded(cx: &Ctx, start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out =
        crate::alloc::super_stripes(&cx.img.chunks, start, end.saturating_sub(start), &|_| None);
    out.sort_unstable();
    out.dedup();
    out
}

pub(super) fn check(cx: &mut Ctx) {
    if !cx
        .img
        .sb
        .has_compat_ro(BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE)
        || !cx.fst.loaded
    {
        return;
    }
    let infos = std::mem::take(&mut cx.fst.infos);
    let mut free = std::mem::take(&mut cx.fst.free);
    free.sort_unstable();
    let bgs = cx.chunks.block_groups.clone();
    cx.sink.checked(P, infos.len() as u64);
    for i in &infos {
        if !bgs.iter().any(|b| b.start == i.start && b.length == i.len) {
            // mkfs.btrfs leaves these behind for its temporary chunks
            // (measured: 6.2 and 6.14 both do); btrfs-progs' check reports
            // them since February 2026 (fsck-tests 058) and its --repair
            // removes them. The kernel never looks them up.
            cx.report(
                F::err(P, Category::FreeSpaceStale)
                    .fix(Repair::RebuildFreeSpaceTree)
                    .tree(T)
                    .at(i.start)
                    .msg(format!(
                "free space info {}+{} for a block group that does not exist (a stale entry, \
                 as mkfs.btrfs 6.2 to 6.14 leave for their temporary chunks; the kernel ignores \
                 it, and --repair removes it by rebuilding the free space tree)",
                i.start, i.len
            )),
            );
        }
    }
    if !cx.chunks.bg_loaded {
        return;
    }
    let mut reported = 0;
    for b in &bgs {
        let Some(info) = infos.iter().find(|i| i.start == b.start) else {
            cx.report(
                F::err(P, Category::FreeSpace)
                    .fix(Repair::RebuildFreeSpaceTree)
                    .tree(T)
                    .at(b.start)
                    .msg(format!(
                        "block group {}+{} has no free space info",
                        b.start, b.length
                    )),
            );
            continue;
        };
        let (s, e) = (b.start, b.end());
        // What the free space tree says is free here, merged.
        let lo = free.partition_point(|&(fs, _)| fs < s);
        let mut have: Vec<(u64, u64)> = Vec::new();
        for &(fs, fl) in free[lo..].iter().take_while(|(fs, _)| *fs < e) {
            let fe = fs.saturating_add(fl);
            match have.last_mut() {
                Some(l) if fs <= l.1 => l.1 = l.1.max(fe),
                _ => have.push((fs, fe)),
            }
        }
        if have.len() as u64 != info.count as u64 {
            cx.report(
                F::err(P, Category::FreeSpace)
                    .fix(Repair::RebuildFreeSpaceTree)
                    .tree(T)
                    .at(b.start)
                    .msg(format!(
                        "block group {} free space info counts {} extents but {} are recorded",
                        b.start,
                        info.count,
                        have.len()
                    )),
            );
        }
        let want = gaps(cx, s, e);
        // Superblock copies are neither used nor free; kernels differ on
        // whether the free space tree lists them, so differences there are
        // not findings.
        let excl = excluded(cx, s, e);
        if let Some((a, b)) = first_difference(&want, &have, &excl) {
            if reported < 50 {
                reported += 1;
                let in_tree = have.iter().any(|&(hs, he)| hs < b && a < he);
                cx.report(F::err(P, Category::FreeSpace).fix(Repair::RebuildFreeSpaceTree).tree(T).at(a).msg(format!(
                    "block group {}+{}: [{a}, {b}) is {} in the free space tree but {} in the extent tree",
                    s,
                    e - s,
                    if in_tree { "free" } else { "not free" },
                    if in_tree { "allocated" } else { "unallocated" },
                )));
            }
        }
    }
    cx.fst.infos = infos;
}

/// What the extent tree says is free in `[s, e)`: the gaps between extents.
pub(super) fn gaps(cx: &Ctx, s: u64, e: u64) -> Vec<(u64, u64)> {
    let mut want: Vec<(u64, u64)> = Vec::new();
    let mut pos = s;
    let i0 = cx.ext.recs.partition_point(|r| r.bytenr < s);
    for r in cx.ext.recs[i0..].iter().take_while(|r| r.bytenr < e) {
        if r.bytenr > pos {
            want.push((pos, r.bytenr));
        }
        pos = pos.max(r.bytenr.saturating_add(r.len).min(e));
    }
    if pos < e {
        want.push((pos, e));
    }
    want
}

fn inside(set: &[(u64, u64)], x: u64) -> bool {
    let i = set.partition_point(|&(s, _)| s <= x);
    i.checked_sub(1)
        .and_then(|i| set.get(i))
        .is_some_and(|&(_, e)| x < e)
}

/// First range where exactly one of `want` and `have` holds, outside `excl`.
pub(super) fn first_difference(
    want: &[(u64, u64)],
    have: &[(u64, u64)],
    excl: &[(u64, u64)],
) -> Option<(u64, u64)> {
    let mut pts: Vec<u64> = Vec::with_capacity(2 * (want.len() + have.len() + excl.len()));
    for &(s, e) in want.iter().chain(have).chain(excl) {
        pts.push(s);
        pts.push(e);
    }
    pts.sort_unstable();
    pts.dedup();
    let excl = crate::check::csums::union_of(excl.iter().map(|&(s, e)| (s, e - s)).collect());
    for w in pts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if inside(want, a) != inside(have, a) && !inside(&excl, a) {
            return Some((a, b));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::first_difference;

    #[test]
    fn differences_outside_superblock_windows_only() {
        let want = [(0, 100), (200, 300)];
        assert_eq!(first_difference(&want, &want, &[]), None);
        // The tree also lists [100, 110) free: only a finding when not a superblock window.
        let have = [(0, 110), (200, 300)];
        assert_eq!(first_difference(&want, &have, &[]), Some((100, 110)));
        assert_eq!(first_difference(&want, &have, &[(100, 120)]), None);
        // Free in the extent tree but missing from the free space tree.
        assert_eq!(first_difference(&want, &[(0, 100)], &[]), Some((200, 300)));
    }
}
