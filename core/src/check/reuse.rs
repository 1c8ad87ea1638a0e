//! What a check keeps for the check that follows a repair of the same
//! filesystem: the facts of each subvolume tree it found clean. A tree
//! is a copy-on-write structure: while its root item is the same, byte
//! for byte, every block under it is the same, and so is everything the
//! walk of it and its inode and name checks produced. The check after a
//! repair takes those facts instead of walking the tree again (most of a
//! check's time on a large filesystem is one subvolume), and derives the
//! global results (extent references, checksums, quotas) from them as
//! from a walk.
//!
//! Only trees that are sure to be independent are kept: no tree block
//! of the filesystem was reached from two trees (a snapshot or a shared
//! subtree would make one tree's walk depend on which tree reached a
//! block first), the walk and the inode checks of the tree found nothing
//! at all, and every copy of every block was not asked for
//! (`check_mirrors`).

use super::csums::{Forbid, Need};
use super::extents::{FoundData, FoundTree};
use super::Ctx;
use std::collections::HashMap;
use zerocopy::IntoBytes;

/// The facts of the clean subvolume trees of one check, by tree id.
#[derive(Default)]
pub struct Prior {
    trees: HashMap<u64, TreeFacts>,
}

impl std::fmt::Debug for Prior {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prior({} trees)", self.trees.len())
    }
}

impl Prior {
    /// How many trees a later check may take from here.
    pub fn trees(&self) -> usize {
        self.trees.len()
    }
}

/// One clean subvolume tree: its root item and what checking it gave.
pub(crate) struct TreeFacts {
    root_item: Vec<u8>,
    walk: WalkFacts,
    fs: FsFacts,
}

/// What the walk of one tree added to the check's lists.
#[derive(Default)]
pub(crate) struct WalkFacts {
    found_tree: Vec<FoundTree>,
    found_data: Vec<FoundData>,
    block_owner: Vec<(u64, u64)>,
}

/// What a subvolume's inode and name checks hand over when clean.
pub(crate) struct FsFacts {
    pub needs: Vec<Need>,
    pub forbids: Vec<Forbid>,
    pub inodes_checked: u64,
    pub subvol_dirents: Vec<(u64, u64)>,
}

/// What a check keeps while it runs, to make a [`Prior`] at its end.
#[derive(Default)]
pub(crate) struct Keep {
    /// A block was reached from a second tree (or twice): nothing is kept.
    pub shared: bool,
    walks: HashMap<u64, (Vec<u8>, WalkFacts)>,
    fs: HashMap<u64, FsFacts>,
}

/// Where the lists stood before a tree's walk.
pub(crate) struct Mark {
    found_tree: usize,
    found_data: usize,
    block_owner: usize,
    findings: u64,
}

fn findings_total(cx: &Ctx) -> u64 {
    cx.sink
        .phases
        .iter()
        .map(|p| p.errors.saturating_add(p.warnings))
        .fold(0u64, |a, b| a.saturating_add(b))
}

/// Before the walk of a subvolume tree: where its facts will start.
pub(crate) fn mark(cx: &Ctx) -> Option<Mark> {
    cx.keep.as_ref()?;
    Some(Mark {
        found_tree: cx.ext.found_tree.len(),
        found_data: cx.ext.found_data.len(),
        block_owner: cx.ext.block_owner.len(),
        findings: findings_total(cx),
    })
}

/// After the walk of subvolume tree `id` whose root item is `item`: its
/// facts are kept when the walk found nothing.
pub(crate) fn walked(cx: &mut Ctx, id: u64, item: &crate::format::root::RootItem, m: Mark) {
    if findings_total(cx) != m.findings {
        return;
    }
    let facts = WalkFacts {
        found_tree: cx
            .ext
            .found_tree
            .get(m.found_tree..)
            .unwrap_or_default()
            .to_vec(),
        found_data: cx
            .ext
            .found_data
            .get(m.found_data..)
            .unwrap_or_default()
            .to_vec(),
        block_owner: cx
            .ext
            .block_owner
            .get(m.block_owner..)
            .unwrap_or_default()
            .to_vec(),
    };
    if let Some(k) = cx.keep.as_mut() {
        k.walks.insert(id, (item.as_bytes().to_vec(), facts));
    }
}

/// A subvolume's inode and name checks are done: kept when clean.
pub(crate) fn checked(cx: &mut Ctx, id: u64, clean: bool, fs: impl FnOnce() -> FsFacts) {
    if let Some(k) = cx.keep.as_mut() {
        if clean {
            k.fs.insert(id, fs());
        }
    }
}

/// The end of a check: the trees kept whole, unless blocks were shared.
pub(crate) fn finish(keep: Keep) -> Option<Prior> {
    if keep.shared {
        return None;
    }
    let mut fs = keep.fs;
    let trees = keep
        .walks
        .into_iter()
        .filter_map(|(id, (root_item, walk))| {
            Some((
                id,
                TreeFacts {
                    root_item,
                    walk,
                    fs: fs.remove(&id)?,
                },
            ))
        })
        .collect();
    Some(Prior { trees })
}

/// The facts of tree `id` from the check before, when its root item is
/// the same and nothing of this check's walk has reached its blocks.
pub(crate) fn take<'p>(
    cx: &Ctx<'p>,
    id: u64,
    item: &crate::format::root::RootItem,
    seen: &std::collections::HashSet<u64>,
) -> Option<&'p TreeFacts> {
    if cx.opts.check_mirrors {
        return None;
    }
    let t = cx.prior?.trees.get(&id)?;
    if t.root_item != item.as_bytes() {
        return None;
    }
    if t.walk.block_owner.iter().any(|(b, _)| seen.contains(b)) {
        return None;
    }
    Some(t)
}

/// Add tree `id`'s facts from the check before, as its walk and its
/// inode and name checks would.
pub(crate) fn replay(
    cx: &mut Ctx,
    id: u64,
    t: &TreeFacts,
    seen: &mut std::collections::HashSet<u64>,
) {
    let w = &t.walk;
    cx.ext.found_tree.extend_from_slice(&w.found_tree);
    cx.ext.found_data.extend_from_slice(&w.found_data);
    cx.ext.block_owner.extend_from_slice(&w.block_owner);
    seen.extend(w.block_owner.iter().map(|(b, _)| *b));
    let n = w.block_owner.len() as u64;
    cx.walked.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    cx.sink.checked(super::Phase::TreeBlocks, n);
    cx.sink.reused_trees += 1;
    cx.progress.advance(n);
    cx.csum_needed.extend_from_slice(&t.fs.needs);
    cx.csum_forbidden.extend_from_slice(&t.fs.forbids);
    cx.sink
        .checked(super::Phase::Subvolumes, t.fs.inodes_checked);
    for &(dir, child) in &t.fs.subvol_dirents {
        cx.subvol_dirents.push(super::SubvolDirent {
            tree: id,
            dir,
            child,
        });
    }
}
