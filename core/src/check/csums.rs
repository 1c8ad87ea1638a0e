//! Phase 7: the checksum tree. Csum items must not overlap and must cover
//! only data extents; every data range a file extent needs checksummed must
//! be covered. With `check_data_csum`, every covered sector is read and
//! verified, in parallel.

use super::findings::{Category, Phase, Repair, F};
use super::Ctx;
use crate::format::consts::*;
use crate::tree::Node;

const P: Phase = Phase::Checksums;

/// A data range a file extent needs checksums for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Need {
    pub start: u64,
    pub len: u64,
    pub root: u64,
    pub ino: u64,
}

/// A data range that must have no checksums: a nodatasum inode's extent,
/// or a prealloc extent (unless the same disk extent was written through
/// another file extent, `prealloc_of` holds its disk bytenr for that).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forbid {
    pub start: u64,
    pub len: u64,
    pub root: u64,
    pub ino: u64,
    pub prealloc_of: Option<u64>,
}

/// Does any part of `[start, start+len)` have checksums?
pub(crate) fn any_covered(union: &[(u64, u64)], start: u64, len: u64) -> bool {
    let end = start.saturating_add(len);
    let i = union.partition_point(|&(_, e)| e <= start);
    union.get(i).is_some_and(|&(s, _)| s < end)
}

#[derive(Default)]
pub(crate) struct Facts {
    /// (start, len, leaf) of each csum item, in key order.
    pub items: Vec<(u64, u64, u64)>,
    /// Union of the csum items: sorted, disjoint, merged.
    pub union: Vec<(u64, u64)>,
}

impl Facts {
    /// Is all of `[start, start+len)` covered by checksums?
    pub fn covered(&self, start: u64, len: u64) -> bool {
        covered(&self.union, start, len)
    }
}

pub(crate) fn covered(union: &[(u64, u64)], start: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let i = union.partition_point(|&(s, _)| s <= start);
    let Some(&(s, e)) = i.checked_sub(1).and_then(|i| union.get(i)) else {
        return false;
    };
    s <= start && start.saturating_add(len) <= e
}

pub(super) fn on_leaf(cx: &mut Ctx, node: &Node) {
    // A half-done conversion holds items of two sizes: phase 1 names it,
    // the csum tree is checked once it is finished.
    if cx.img.sb.flags.get() & super::superblock::CSUM_CHANGE_FLAGS != 0 {
        return;
    }
    let cs = cx.img.csum.size() as u64;
    let ss = cx.img.sectorsize as u64;
    for slot in 0..node.nr_safe() {
        let Some(k) = node.key(slot) else { continue };
        if k.objectid != BTRFS_EXTENT_CSUM_OBJECTID || k.ty != BTRFS_EXTENT_CSUM_KEY {
            cx.report(
                F::err(P, Category::CsumItem)
                    .tree(7)
                    .at(node.bytenr)
                    .key(k)
                    .msg("unexpected key in the checksum tree"),
            );
            continue;
        }
        let Some(it) = node.item(slot) else { continue };
        let size = it.size.get() as u64;
        if !size.is_multiple_of(cs) || k.offset % ss != 0 {
            cx.report(
                F::err(P, Category::CsumItem)
                    .tree(7)
                    .at(node.bytenr)
                    .key(k)
                    .msg("csum item size or start misaligned"),
            );
            continue;
        }
        cx.csum.items.push((k.offset, size / cs * ss, node.bytenr));
    }
}

/// Merge sorted (start, len) ranges into disjoint [start, end) intervals.
pub(crate) fn union_of(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, l) in v {
        let e = s.saturating_add(l);
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

pub(super) fn check(cx: &mut Ctx) {
    let items = std::mem::take(&mut cx.csum.items);
    cx.sink.checked(P, items.len() as u64);
    for w in items.windows(2) {
        let ((s0, l0, _), (s1, _, leaf)) = (w[0], w[1]);
        if s0.saturating_add(l0) > s1 {
            cx.report(
                F::err(P, Category::CsumOverlap)
                    .tree(7)
                    .at(leaf)
                    .fix(Repair::CsumOverlap { bytenr: s1 })
                    .msg(format!(
                        "csum item at {s1} overlaps the one at {s0} (ends {})",
                        s0.saturating_add(l0)
                    )),
            );
        }
    }
    cx.csum.union = union_of(items.iter().map(|&(s, l, _)| (s, l)).collect());

    // Checksums only where data extents are.
    let data: Vec<(u64, u64)> = union_of(
        cx.ext
            .recs
            .iter()
            .filter(|r| r.flags & BTRFS_EXTENT_FLAG_DATA != 0)
            .map(|r| (r.bytenr, r.len))
            .collect(),
    );
    if cx.ext.loaded {
        let mut reported = 0;
        for &(s, e) in &cx.csum.union.clone() {
            if !covered(&data, s, e - s) && reported < 100 {
                // Find the first uncovered point for the message.
                reported += 1;
                cx.report(F::warn(P, Category::CsumOrphan).tree(7).at(s).msg(format!(
                    "checksums for [{s}, {e}) cover space that is not a data extent"
                )));
            }
        }
    }

    // Every range a file extent needs checksummed has them.
    let mut needs = std::mem::take(&mut cx.csum_needed);
    needs.sort_unstable_by_key(|n| n.start);
    let mut last = None;
    for n in &needs {
        if last == Some((n.start, n.len)) {
            continue;
        }
        last = Some((n.start, n.len));
        if !cx.csum.covered(n.start, n.len) {
            cx.report(
                F::err(P, Category::CsumMissing)
                    .tree(n.root)
                    .at(n.start)
                    .msg(format!(
                        "inode {} data [{}, +{}) has no checksums (or only some)",
                        n.ino, n.start, n.len
                    )),
            );
        }
    }

    // Ranges that must not have checksums (I_ERR_ODD_CSUM_ITEM).
    let forbidden = std::mem::take(&mut cx.csum_forbidden);
    if !forbidden.is_empty() {
        let mut written: Vec<u64> = cx
            .ext
            .found_data
            .iter()
            .filter(|d| d.regular)
            .map(|d| d.bytenr)
            .collect();
        written.sort_unstable();
        written.dedup();
        let mut reported = 0u32;
        for f in &forbidden {
            if !any_covered(&cx.csum.union, f.start, f.len) {
                continue;
            }
            let what = match f.prealloc_of {
                Some(disk) if written.binary_search(&disk).is_ok() => continue,
                Some(_) => "a preallocated extent that was never written",
                None => "a nodatasum inode's extent",
            };
            if reported < 100 {
                cx.report(
                    F::err(P, Category::CsumOdd)
                        .tree(f.root)
                        .at(f.start)
                        .msg(format!(
                            "inode {}: data [{}, +{}) has checksums but is {what}",
                            f.ino, f.start, f.len
                        )),
                );
            }
            reported += 1;
        }
    }

    if cx.opts.check_data_csum {
        let sbf = cx.img.sb.flags.get();
        if sbf & (BTRFS_SUPER_FLAG_METADUMP | BTRFS_SUPER_FLAG_METADUMP_V2) != 0 {
            cx.report(
                F::warn(P, Category::DataCsum)
                    .msg("metadump image holds no data: data checksums not verified"),
            );
        } else {
            let (sectors, bad) = match cx.data_verified.take() {
                Some(r) => r,
                None => super::datacsum::verify_all(cx.img),
            };
            cx.progress.phase(P.number(), "data checksums", sectors);
            cx.progress.advance(sectors);
            cx.sink.checked(P, sectors);
            for (b, m) in bad {
                cx.report(F::err(P, Category::DataCsum).tree(7).at(b).msg(m));
            }
        }
    }
    cx.csum.items = items;
}
