//! Phase 8: the fsync log, which `btrfs check` barely looks at. Everything
//! log replay would trip over is reported before anyone mounts: the log
//! root's generation must be the superblock's + 1, every log block must
//! parse and sit in free metadata space, logged file extents must point
//! inside data block groups and carry checksums (in the log or the csum
//! tree), and dir-log ranges must be ordered.

use super::findings::{Category, Phase, F};
use super::Ctx;
use crate::format::consts::*;
use crate::format::file_extent::FileExtent;
use crate::format::item::{decode, ItemBody};
use crate::log::reader::{
    read_log, uncovered, LogTree, OnDamage, ProblemClass, ReadOptions, TreeRead,
};
use std::collections::HashSet;

const P: Phase = Phase::Logs;
const LOG: u64 = BTRFS_TREE_LOG_OBJECTID;

pub(super) fn check(cx: &mut Ctx) {
    // The log as replay would read it (the shared reader), every damaged
    // block reported and read through where possible. The log root tree's
    // generation is checked here, as a finding of its own.
    let opts = ReadOptions {
        on_damage: OnDamage::Keep,
        root_generation: false,
    };
    let read = match read_log(cx.img, opts) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            cx.report(
                F::err(P, Category::LogBlock)
                    .tree(LOG)
                    .at(cx.img.sb.log_root.get())
                    .msg(format!("log unreadable: {e}")),
            );
            return;
        }
    };
    let want_gen = cx.gen.saturating_add(1);
    blocks(cx, &read.root_tree, LOG);
    if let Some(g) = read.root_tree.root_block_generation {
        if g != want_gen {
            cx.report(F::err(P, Category::LogGeneration).tree(LOG).at(read.root_tree.root.bytenr).msg(format!(
                "log root tree generation {g} but replay requires the superblock's generation + 1 ({want_gen})"
            )));
        }
    }
    let fs_roots: HashSet<u64> = cx.roots.iter().map(|r| r.id()).collect();
    for (k, ri) in &read.roots {
        let subvol = k.offset;
        if k.objectid != LOG {
            cx.report(
                F::err(P, Category::LogRoot)
                    .tree(LOG)
                    .key(*k)
                    .msg("unexpected root item in the log root tree"),
            );
            continue;
        }
        if !fs_roots.contains(&subvol) {
            cx.report(
                F::err(P, Category::LogRoot)
                    .tree(subvol)
                    .key(*k)
                    .msg(format!(
                        "log tree for subvolume {subvol}, which does not exist"
                    )),
            );
        }
        if ri.generation.get() > want_gen {
            cx.report(
                F::err(P, Category::LogGeneration)
                    .tree(subvol)
                    .key(*k)
                    .msg(format!(
                        "log tree generation {} newer than the superblock's + 1 ({want_gen})",
                        ri.generation.get()
                    )),
            );
        }
        if ri.level >= BTRFS_MAX_LEVEL {
            cx.report(
                F::err(P, Category::LogRoot)
                    .tree(subvol)
                    .key(*k)
                    .msg("log tree level too high"),
            );
            continue;
        }
        if let Some(t) = read
            .trees
            .iter()
            .find(|t| t.subvol == subvol && t.read.root.bytenr == ri.bytenr.get())
        {
            blocks(cx, &t.read, subvol);
            items(cx, t);
        }
    }
}

/// Block-level findings of one tree of the log: what the reader found
/// damaged, and where the blocks it read sit.
fn blocks(cx: &mut Ctx, read: &TreeRead, tree: u64) {
    for p in &read.problems {
        let f = match p.class {
            ProblemClass::Revisit => F::err(P, Category::LogShape)
                .tree(tree)
                .at(p.bytenr)
                .msg(format!("log block {} is referenced twice", p.bytenr)),
            ProblemClass::Unreadable => F::err(P, Category::LogBlock)
                .tree(tree)
                .at(p.bytenr)
                .opt_key(p.key)
                .msg(format!("log {}", p.message)),
            ProblemClass::Damaged => F::err(P, Category::LogBlock)
                .tree(tree)
                .at(p.bytenr)
                .opt_key(p.key)
                .msg(p.message.clone()),
            // An undecodable log root item; item bounds inside log trees are
            // already block problems.
            ProblemClass::Item if tree == LOG => F::err(P, Category::LogRoot)
                .tree(LOG)
                .at(p.bytenr)
                .opt_key(p.key)
                .msg(p.message.clone()),
            // A logged file extent beyond the format's bounds (the
            // reader's check, which replay fails on).
            ProblemClass::Item if p.key.is_some_and(|k| k.ty == BTRFS_EXTENT_DATA_KEY) => {
                F::err(P, Category::LogExtent)
                    .tree(tree)
                    .at(p.bytenr)
                    .opt_key(p.key)
                    .msg(format!("logged {}", p.message))
            }
            ProblemClass::Item => continue,
        };
        cx.report(f);
    }
    for b in &read.blocks {
        cx.sink.checked(P, 1);
        let b = b.bytenr;
        // Log blocks live in free metadata space, never on top of a committed extent.
        match cx.chunks.bg_of(b).copied() {
            Some(bg) if bg.flags & BTRFS_BLOCK_GROUP_METADATA == 0 => cx.report(
                F::err(P, Category::LogBlock)
                    .tree(tree)
                    .at(b)
                    .msg("log block outside metadata block groups"),
            ),
            None if cx.chunks.bg_loaded => cx.report(
                F::err(P, Category::LogBlock)
                    .tree(tree)
                    .at(b)
                    .msg("log block outside every block group"),
            ),
            _ => {}
        }
        let i = cx.ext.recs.partition_point(|r| r.bytenr <= b);
        if let Some(r) = i.checked_sub(1).and_then(|i| cx.ext.recs.get(i)) {
            if b < r.bytenr.saturating_add(r.len) {
                cx.report(F::err(P, Category::LogBlock).tree(tree).at(b).msg(format!(
                    "log block overlaps allocated extent {}+{}",
                    r.bytenr, r.len
                )));
            }
        }
    }
}

/// Item-level findings of one log tree: logged extents inside data block
/// groups and with checksums somewhere (the shared rule of which extents
/// need them), dir-log ranges well formed.
fn items(cx: &mut Ctx, t: &LogTree) {
    let subvol = t.subvol;
    let cs = cx.img.csum.size();
    for (i, (k, d)) in t.items.iter().enumerate() {
        let at = t.leaf_of(i);
        let Ok(body) = decode(k, d, cs) else { continue };
        match body {
            ItemBody::FileExtent(FileExtent::Disk { item, .. }) => {
                let addr = item.disk_bytenr.get();
                if addr == 0 {
                    continue;
                }
                let dlen = item.disk_num_bytes.get();
                match cx.chunks.bg_of(addr).copied() {
                    Some(bg)
                        if bg.flags & BTRFS_BLOCK_GROUP_DATA != 0
                            && addr.saturating_add(dlen) <= bg.end() => {}
                    _ => cx.report(
                        F::err(P, Category::LogExtent)
                            .tree(subvol)
                            .at(at)
                            .key(*k)
                            .msg(format!(
                        "logged extent {addr}+{dlen} of inode {} is not inside a data block group",
                        k.objectid
                    )),
                    ),
                }
            }
            ItemBody::DirLog(dl) => {
                let end = dl.end.get();
                // Ranges may overlap: the kernel logs a deleted entry as
                // a one-index range inside a range it logged before
                // (btrfs_del_dir_entries_in_log), and replay handles
                // each range on its own. Key order is phase 3's check.
                if end < k.offset {
                    cx.report(
                        F::err(P, Category::LogDirRange)
                            .tree(subvol)
                            .at(at)
                            .key(*k)
                            .msg(format!(
                                "dir log range [{}, {end}] ends before it starts",
                                k.offset
                            )),
                    );
                }
            }
            _ => {}
        }
    }
    let have = t.csum_ranges(cs, cx.img.sectorsize);
    for n in t.csum_needs() {
        let missing = uncovered(&have, n.start, n.end)
            .into_iter()
            .any(|(a, b)| !cx.csum.covered(a, b - a));
        if missing {
            let (a, l) = (n.start, n.end - n.start);
            cx.report(F::err(P, Category::LogCsum).tree(subvol).at(a).msg(format!(
                "logged extent of inode {} at file offset {} (data {a}+{l}) has no checksums in the log or the csum tree",
                n.ino, n.file_offset
            )));
        }
    }
}
