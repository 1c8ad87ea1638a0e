//! Phase 8: the fsync log, which `btrfs check` barely looks at. Everything
//! log replay would trip over is reported before anyone mounts: the log
//! root's generation must be the superblock's + 1, every log block must
//! parse and sit in free metadata space, logged file extents must point
//! inside data block groups and carry checksums (in the log or the csum
//! tree), and dir-log ranges must be ordered.

use super::csums::{covered, union_of};
use super::findings::F;
use super::Ctx;
use crate::format::consts::*;
use crate::format::file_extent::FileExtent;
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::tree::node::Expect;
use crate::tree::Node;
use std::collections::HashSet;

const P: u8 = 8;
const LOG: u64 = BTRFS_TREE_LOG_OBJECTID;

pub(super) fn check(cx: &mut Ctx) {
    let Some(root) = cx.img.log_root_tree() else { return };
    let want_gen = cx.gen.saturating_add(1);
    let mut seen = HashSet::new();
    let mut log_roots: Vec<(Key, RootItem)> = Vec::new();
    let mut leaves = |cx: &mut Ctx, node: &Node| {
        for slot in 0..node.nr_safe() {
            let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else { continue };
            if k.ty == BTRFS_ROOT_ITEM_KEY {
                match RootItem::parse(d) {
                    Ok(ri) => log_roots.push((k, ri)),
                    Err(e) => cx.report(F::err(P, "log-root").tree(LOG).at(node.bytenr).key(k).msg(format!("log root item unreadable: {e}"))),
                }
            }
        }
    };
    let top = walk_log(cx, &mut seen, root.bytenr, root.level, None, LOG, &mut leaves);
    if let Some(g) = top {
        if g != want_gen {
            cx.report(F::err(P, "log-generation").tree(LOG).at(root.bytenr).msg(format!(
                "log root tree generation {g} but replay requires the superblock's generation + 1 ({want_gen})"
            )));
        }
    }
    let fs_roots: HashSet<u64> = cx.roots.iter().map(|r| r.id()).collect();
    for (k, ri) in log_roots {
        let subvol = k.offset;
        if k.objectid != LOG {
            cx.report(F::err(P, "log-root").tree(LOG).key(k).msg("unexpected root item in the log root tree"));
            continue;
        }
        if !fs_roots.contains(&subvol) {
            cx.report(F::err(P, "log-root").tree(subvol).key(k).msg(format!("log tree for subvolume {subvol}, which does not exist")));
        }
        if ri.generation.get() > want_gen {
            cx.report(F::err(P, "log-generation").tree(subvol).key(k).msg(format!(
                "log tree generation {} newer than the superblock's + 1 ({want_gen})",
                ri.generation.get()
            )));
        }
        if ri.level >= BTRFS_MAX_LEVEL {
            cx.report(F::err(P, "log-root").tree(subvol).key(k).msg("log tree level too high"));
            continue;
        }
        let mut st = LogTree::default();
        let mut visit = |cx: &mut Ctx, node: &Node| st.leaf(cx, node, subvol);
        walk_log(cx, &mut seen, ri.bytenr.get(), ri.level, Some(ri.generation.get()), subvol, &mut visit);
        st.finish(cx, subvol);
    }
}

/// Depth-first over one log tree; returns the root block's generation.
fn walk_log(
    cx: &mut Ctx,
    seen: &mut HashSet<u64>,
    bytenr: u64,
    level: u8,
    gen: Option<u64>,
    tree: u64,
    visit: &mut dyn FnMut(&mut Ctx, &Node),
) -> Option<u64> {
    let img = cx.img;
    let mut top_gen = None;
    let mut stack = vec![(bytenr, Expect { level: Some(level), generation: gen, owner: Some(LOG), first_key: None })];
    while let Some((b, e)) = stack.pop() {
        if !seen.insert(b) {
            cx.report(F::err(P, "log-shape").tree(tree).at(b).msg(format!("log block {b} is referenced twice")));
            continue;
        }
        let (node, problems) = match img.read_tree_block_checked(b, &e, true) {
            Ok(x) => x,
            Err(err) => {
                cx.report(F::err(P, "log-block").tree(tree).at(b).opt_key(e.first_key).msg(format!("log block unreadable: {err}")));
                continue;
            }
        };
        top_gen.get_or_insert(node.generation());
        cx.sink.checked(P, 1);
        for pr in problems {
            cx.report(F::err(P, "log-block").tree(tree).at(b).opt_key(pr.key).msg(pr.message));
        }
        // Log blocks live in free metadata space, never on top of a committed extent.
        match cx.chunks.bg_of(b).copied() {
            Some(bg) if bg.flags & BTRFS_BLOCK_GROUP_METADATA == 0 => {
                cx.report(F::err(P, "log-block").tree(tree).at(b).msg("log block outside metadata block groups"))
            }
            None if cx.chunks.bg_loaded => cx.report(F::err(P, "log-block").tree(tree).at(b).msg("log block outside every block group")),
            _ => {}
        }
        let i = cx.ext.recs.partition_point(|r| r.bytenr <= b);
        if let Some(r) = i.checked_sub(1).and_then(|i| cx.ext.recs.get(i)) {
            if b < r.bytenr.saturating_add(r.len) {
                cx.report(F::err(P, "log-block").tree(tree).at(b).msg(format!("log block overlaps allocated extent {}+{}", r.bytenr, r.len)));
            }
        }
        if node.is_leaf() {
            visit(cx, &node);
            continue;
        }
        let l = node.level().saturating_sub(1);
        for slot in (0..node.nr_safe()).rev() {
            if let Some(p) = node.key_ptr(slot) {
                stack.push((
                    p.blockptr.get(),
                    Expect { level: Some(l), generation: Some(p.generation.get()), owner: Some(LOG), first_key: Some(Key::from(&p.key)) },
                ));
            }
        }
    }
    top_gen
}

#[derive(Default)]
struct LogTree {
    csum_inode: Option<u64>,
    /// (addr, len, ino, file offset) of logged extents that need checksums.
    needs: Vec<(u64, u64, u64, u64)>,
    csums: Vec<(u64, u64)>,
}

impl LogTree {
    fn leaf(&mut self, cx: &mut Ctx, node: &Node, subvol: u64) {
        let cs = cx.img.csum.size();
        let ss = cx.img.sectorsize as u64;
        for slot in 0..node.nr_safe() {
            let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else { continue };
            let Ok(body) = decode(&k, d, cs) else { continue };
            match body {
                ItemBody::InodeItem(ii) => {
                    self.csum_inode = (ii.flags.get() & BTRFS_INODE_NODATASUM == 0).then_some(k.objectid);
                }
                ItemBody::FileExtent(FileExtent::Disk { head, item }) => {
                    let addr = item.disk_bytenr.get();
                    if addr == 0 {
                        continue;
                    }
                    let dlen = item.disk_num_bytes.get();
                    match cx.chunks.bg_of(addr).copied() {
                        Some(bg) if bg.flags & BTRFS_BLOCK_GROUP_DATA != 0 && addr.saturating_add(dlen) <= bg.end() => {}
                        _ => cx.report(F::err(P, "log-extent").tree(subvol).at(node.bytenr).key(k).msg(format!(
                            "logged extent {addr}+{dlen} of inode {} is not inside a data block group",
                            k.objectid
                        ))),
                    }
                    if head.type_ == BTRFS_FILE_EXTENT_REG && self.csum_inode == Some(k.objectid) {
                        let (a, l) = if head.compression != 0 {
                            (addr, dlen)
                        } else {
                            (addr.saturating_add(item.offset.get()), item.num_bytes.get())
                        };
                        self.needs.push((a, l, k.objectid, k.offset));
                    }
                }
                ItemBody::ExtentCsum(c) => {
                    self.csums.push((k.offset, (c.len() / cs.max(1)) as u64 * ss));
                }
                ItemBody::DirLog(dl) => {
                    let end = dl.end.get();
                    // Ranges may overlap: the kernel logs a deleted entry as
                    // a one-index range inside a range it logged before
                    // (btrfs_del_dir_entries_in_log), and replay handles
                    // each range on its own. Key order is phase 3's check.
                    if end < k.offset {
                        cx.report(F::err(P, "log-dir-range").tree(subvol).at(node.bytenr).key(k).msg(format!("dir log range [{}, {end}] ends before it starts", k.offset)));
                    }
                }
                _ => {}
            }
        }
    }

    fn finish(self, cx: &mut Ctx, subvol: u64) {
        let log_union = union_of(self.csums);
        for (a, l, ino, off) in self.needs {
            if !covered(&log_union, a, l) && !cx.csum.covered(a, l) {
                cx.report(F::err(P, "log-csum").tree(subvol).at(a).msg(format!(
                    "logged extent of inode {ino} at file offset {off} (data {a}+{l}) has no checksums in the log or the csum tree"
                )));
            }
        }
    }
}
