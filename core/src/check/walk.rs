//! Phase 3: every block of every tree, each read once (fs trees that share
//! blocks with a snapshot are descended again for their inode checks, but
//! a shared block is validated and its references counted only once).
//! Each leaf is handed to the collectors of the later phases.

use super::extents::FoundTree;
use super::findings::{Category, Phase, Repair, F};
use super::fs::FsTree;
use super::{Ctx, RootLink, RootRec};
use crate::format::consts::*;
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::image::Image;
use crate::tree::node::{Expect, Problem, ProblemKind};
use crate::tree::{
    walk_with, Node, OnDamage, Order, Place, TreeRoot, Visitor, WalkEvent, WalkOptions,
};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;

const P: Phase = Phase::TreeBlocks;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Root,
    Chunk,
    Extent,
    Dev,
    Csum,
    FreeSpace,
    BlockGroup,
    Quota,
    Uuid,
    Fs,
    Reloc,
    Other,
}

fn kind_of(id: u64) -> Kind {
    match id {
        BTRFS_ROOT_TREE_OBJECTID => Kind::Root,
        BTRFS_CHUNK_TREE_OBJECTID => Kind::Chunk,
        BTRFS_EXTENT_TREE_OBJECTID => Kind::Extent,
        BTRFS_DEV_TREE_OBJECTID => Kind::Dev,
        BTRFS_CSUM_TREE_OBJECTID => Kind::Csum,
        BTRFS_FREE_SPACE_TREE_OBJECTID => Kind::FreeSpace,
        BTRFS_BLOCK_GROUP_TREE_OBJECTID => Kind::BlockGroup,
        BTRFS_TREE_RELOC_OBJECTID => Kind::Reloc,
        BTRFS_QUOTA_TREE_OBJECTID => Kind::Quota,
        BTRFS_UUID_TREE_OBJECTID => Kind::Uuid,
        id if is_fstree(id) => Kind::Fs,
        _ => Kind::Other,
    }
}

/// A tree to walk and how.
pub(crate) struct Spec {
    pub root: TreeRoot,
    pub kind: Kind,
    /// Root id recorded as the owner of the root block's reference.
    pub ref_root: u64,
    /// Resume key of a partially dropped tree: subtrees before it are gone.
    pub drop_key: Option<Key>,
    /// Run the inode checks (phase 6) on this tree.
    pub fs_check: Option<RootRec>,
}

/// A block read and validated, with its damaged mirror copies (copy index,
/// (devid, physical)), and whether copies after the first are still to be verified
/// (done at the end of the walk, in disk order).
type Loaded = (
    crate::Result<(Node, Vec<Problem>)>,
    Vec<(usize, (u64, u64))>,
    bool,
);

fn load(
    img: &Image,
    stream: &BlockStream,
    bytenr: u64,
    expect: &Expect,
    all_copies: bool,
) -> Loaded {
    // Common case first: copy 0 is good, so read it once (and, when every
    // copy is checked, each other copy once later to verify it). Anything
    // else goes to the image's best-copy selection, which reads the other
    // copies anyway, so their state is reported whatever `all_copies` says.
    let ns = img.nodesize as usize;
    if let Ok(copies) = img.block_copy_addrs(bytenr) {
        if let Some(&(d0, p0)) = copies.first() {
            if let Some(b) = img
                .device_of(d0)
                .and_then(|dev| {
                    stream
                        .take(bytenr, (d0, p0))
                        .or_else(|| dev.read_vec(p0, ns).ok())
                })
                .filter(|b| copy_ok(img, b, bytenr))
            {
                if let Ok(node) = Node::from_vec(bytenr, b) {
                    // copy_ok verified the checksum.
                    let problems = node.validate_checksummed(&img.ctx(false), expect);
                    if problems.is_empty() {
                        return (
                            Ok((node, problems)),
                            Vec::new(),
                            all_copies && copies.len() > 1,
                        );
                    }
                }
            }
        }
    }
    let r = img.read_tree_block_checked(bytenr, expect, false);
    let bad = match &r {
        Ok((node, _)) => bad_copies(img, node, 0),
        Err(_) => Vec::new(),
    };
    (r, bad, false)
}

/// Walk every tree. Subvolume checks still running are left in `pending`
/// for the caller to join (they need nothing the later phases change).
pub(super) fn walk_all<'a: 'scope, 'scope, 'env>(
    cx: &mut Ctx<'a>,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    pending: &mut Vec<FsPending<'scope>>,
) {
    let mut seen: HashSet<u64> = HashSet::new();
    let img = cx.img;
    let total: u64 = 2;
    cx.progress.phase(P.number(), "tree blocks", total);

    let root_spec = Spec {
        root: img.root_tree(),
        kind: Kind::Root,
        ref_root: BTRFS_ROOT_TREE_OBJECTID,
        drop_key: None,
        fs_check: None,
    };
    let mut mirrors = Vec::new();
    walk_blocks(cx, &mut seen, &mut mirrors, &root_spec, &mut |_| {});
    let chunk_spec = Spec {
        root: img.chunk_tree(),
        kind: Kind::Chunk,
        ref_root: BTRFS_CHUNK_TREE_OBJECTID,
        drop_key: None,
        fs_check: None,
    };

    // Progress: root items say how many bytes of tree blocks each tree has.
    let ns = img.nodesize as u64;
    let est: u64 = cx
        .roots
        .iter()
        .map(|r| r.item.bytes_used.get() / ns.max(1))
        .fold(0u64, |a, b| a.saturating_add(b));
    cx.progress.phase(P.number(), "tree blocks", est);

    let mut specs = vec![chunk_spec];
    let mut have = HashSet::new();
    let roots = cx.roots.clone();
    for r in &roots {
        let id = r.id();
        have.insert(id);
        let ri = &r.item;
        if ri.generation.get() > cx.gen.saturating_add(1) {
            // Copying the root gives it, and so the item, the repair's
            // generation (a root block that disagrees with the item is a
            // finding of its own, without a repair).
            let fix = Repair::RecowPath {
                tree: id,
                key: Key::MIN,
            };
            cx.report(
                F::err(P, Category::RootItem)
                    .tree(id)
                    .key(r.key)
                    .fix(fix)
                    .msg(format!(
                        "root item generation {} newer than the superblock's {}",
                        ri.generation.get(),
                        cx.gen
                    )),
            );
        }
        if ri.level >= BTRFS_MAX_LEVEL {
            cx.report(
                F::err(P, Category::RootItem)
                    .tree(id)
                    .key(r.key)
                    .msg(format!("root item level {} too high", ri.level)),
            );
            continue;
        }
        let kind = kind_of(id);
        let dropping = r.drop_key().is_some();
        let dead = ri.refs.get() == 0 || cx.orphan_roots.contains(&id);
        let fs_check = (kind == Kind::Fs && !dropping && !dead).then(|| r.clone());
        specs.push(Spec {
            root: TreeRoot {
                id,
                bytenr: ri.bytenr.get(),
                level: ri.level,
                generation: ri.generation.get(),
            },
            kind,
            ref_root: id,
            drop_key: r.drop_key(),
            fs_check,
        });
    }
    for (id, feat) in [
        (BTRFS_EXTENT_TREE_OBJECTID, None),
        (BTRFS_DEV_TREE_OBJECTID, None),
        (BTRFS_FS_TREE_OBJECTID, None),
        (BTRFS_CSUM_TREE_OBJECTID, None),
        (
            BTRFS_FREE_SPACE_TREE_OBJECTID,
            Some(BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE),
        ),
        (
            BTRFS_BLOCK_GROUP_TREE_OBJECTID,
            Some(BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE),
        ),
    ] {
        if feat.is_none_or(|f| img.sb.has_compat_ro(f)) && !have.contains(&id) {
            cx.report(
                F::err(P, Category::RootItem)
                    .tree(id)
                    .msg(format!("the root tree has no root item for tree {id}")),
            );
        }
    }
    cx.uuid.present = have.contains(&BTRFS_UUID_TREE_OBJECTID);
    if img
        .sb
        .has_compat_ro(BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE)
    {
        cx.chunks.bg_loaded = have.contains(&BTRFS_BLOCK_GROUP_TREE_OBJECTID);
    } else {
        cx.chunks.bg_loaded = have.contains(&BTRFS_EXTENT_TREE_OBJECTID);
    }
    // Extent tree first so its facts are complete before the rest.
    specs.sort_by_key(|s| match s.kind {
        Kind::Extent => 0,
        Kind::Chunk => 1,
        Kind::Fs | Kind::Reloc => 3,
        _ => 2,
    });
    let mut prefetching = None;
    {
        let mut mirror_check = None;
        let t0 = std::time::Instant::now();
        let prof = std::env::var_os("BTRKIT_PROF").is_some();
        for i in 0..specs.len() {
            let s = &specs[i];
            match &s.fs_check {
                Some(r) => {
                    if let Some(t) = super::reuse::take(cx, r.id(), &r.item, &seen) {
                        super::reuse::replay(cx, r.id(), t, &mut seen);
                    } else {
                        let m = super::reuse::mark(cx);
                        walk(cx, &mut seen, &mut mirrors, s, scope, pending);
                        if let Some(m) = m {
                            super::reuse::walked(cx, r.id(), &r.item, m);
                        }
                    }
                }
                None => walk(cx, &mut seen, &mut mirrors, s, scope, pending),
            }
            if prof {
                eprintln!("tree {} walked at {:?}", s.root.id as i64, t0.elapsed());
            }
            if s.kind == Kind::Extent {
                // Every later tree is walked from where its root must be.
                stale_root_items(cx, &mut specs[i + 1..]);
                // The extent tree lists every tree block: their first
                // copies are read in disk order past the page cache, ahead
                // of the walk, which takes the blocks from the stream; the
                // other copies are verified with large direct reads on a
                // thread of their own.
                let (blocks, copies) = metadata_runs(cx, &seen);
                cx.stream.active.store(true, Relaxed);
                let stream = cx.stream.clone();
                let walked = cx.walked.clone();
                let devs: Vec<_> = img.devices().map(|(id, d)| (id, d.clone())).collect();
                let ns = img.nodesize as usize;
                prefetching = std::thread::Builder::new()
                    .name("meta-stream".into())
                    .spawn(move || stream.fill(&devs, &blocks, ns, &walked))
                    .ok();
                // Without a reader the walk asks for each block's children.
                cx.meta_prefetched = prefetching.is_some();
                cx.stream.active.store(cx.meta_prefetched, Relaxed);
                if cx.opts.check_mirrors {
                    mirror_check = std::thread::Builder::new()
                        .name("meta-mirrors".into())
                        .spawn_scoped(scope, move || verify_copies(img, copies))
                        .ok();
                }
            }
        }
        // Copies already verified beside the walk; the rest now.
        let checked = mirror_check.take().and_then(|h| h.join().ok());
        let rest = match checked {
            Some((done, bad)) => {
                let mut late = Vec::new();
                for (bytenr, tree) in std::mem::take(&mut mirrors) {
                    if done.binary_search(&bytenr).is_err() {
                        late.push((bytenr, tree));
                        continue;
                    }
                    let i = bad.partition_point(|b| b.0 < bytenr);
                    for &(_, copy, devid, phys) in bad[i..].iter().take_while(|b| b.0 == bytenr) {
                        cx.report(damaged_copy(img, tree, bytenr, copy, (devid, phys)));
                    }
                }
                late
            }
            None => std::mem::take(&mut mirrors),
        };
        verify_mirrors(cx, rest);
        if prof {
            eprintln!("mirrors at {:?}", t0.elapsed());
            let (hits, misses) = cx.stream.counts();
            eprintln!("stream: {hits} blocks taken, {misses} read by the walk");
        }
    }
    cx.walked.store(u64::MAX, Relaxed);
    if let Some(h) = prefetching {
        let _ = h.join();
    }
    cx.chunks.block_groups.sort_by_key(|b| b.start);
    cx.ext.recs.sort_by_key(|r| r.bytenr);
    cx.ext.loaded = true;
}

/// Subvolume root items that point somewhere else than the extent tree's
/// root block for the subvolume (kernels 3.17 left read-only snapshots
/// pointing at the tree from before their orphan cleanup: the old blocks
/// are freed, the extent tree knows only the new ones). As btrfs check,
/// the extent tree's block is the root when it is the only block at the
/// highest level whose first reference names the tree; here it must also
/// be a sound block of that tree no older than the root item says, and the
/// root item's own block must have no extent item at all, so a root item
/// that points at a live block is never second-guessed. The walk then
/// goes from that block, so the findings are those of the image repaired.
fn stale_root_items(cx: &mut Ctx, specs: &mut [Spec]) {
    for s in specs.iter_mut() {
        let id = s.root.id;
        if s.kind != Kind::Fs || id < BTRFS_FIRST_FREE_OBJECTID {
            continue;
        }
        let Some(rb) = cx.ext.root_blocks.get(&id).copied() else {
            continue;
        };
        if rb.count != 1 || (rb.bytenr == s.root.bytenr && rb.level == s.root.level) {
            continue;
        }
        if cx.ext.recs.iter().any(|r| r.bytenr == s.root.bytenr) {
            continue;
        }
        let expect = Expect {
            level: Some(rb.level),
            generation: None,
            owner: Some(id),
            first_key: None,
        };
        let Ok((node, problems)) = cx.img.read_tree_block_checked(rb.bytenr, &expect, false) else {
            continue;
        };
        let generation = node.generation();
        if !problems.is_empty() || node.owner() != id || generation < s.root.generation {
            continue;
        }
        let mut f = F::err(P, Category::RootItem)
            .tree(id)
            .fix(Repair::RootItemLocation {
                tree: id,
                bytenr: rb.bytenr,
                level: rb.level,
                generation,
            });
        if let Some(r) = s.fs_check.as_ref() {
            f = f.key(r.key);
        }
        cx.report(f.msg(format!(
            "root item of tree {id} points at block {} (level {}, generation {}), which has no extent item; the extent tree's root block of the tree is {} (level {}, generation {generation})",
            s.root.bytenr, s.root.level, s.root.generation, rb.bytenr, rb.level
        )));
        s.root.bytenr = rb.bytenr;
        s.root.level = rb.level;
        s.root.generation = generation;
        if let Some(r) = s.fs_check.as_mut() {
            r.item.bytenr.set(rb.bytenr);
            r.item.level = rb.level;
            r.item.generation.set(generation);
        }
    }
}

/// What the walk of a subvolume hands to its inode checks, in key order.
enum FsFeed {
    Leaf(Node),
    /// A block of the tree could not be read.
    Lost,
}

/// A subvolume's checks still running on their own thread.
pub(crate) type FsPending<'scope> = std::thread::ScopedJoinHandle<'scope, FsTree>;

/// Walk one tree. `seen` is global across trees. A subvolume's inode and
/// name checks run on a thread of their own, fed the leaves in key order
/// while the walk reads and validates the next blocks; the thread is left
/// to finish (names are matched once the tree is complete) while the walk
/// goes on, and joined by the caller.
pub(crate) fn walk<'scope, 'env>(
    cx: &mut Ctx,
    seen: &mut HashSet<u64>,
    mirrors: &mut Vec<(u64, u64)>,
    spec: &Spec,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    pending: &mut Vec<FsPending<'scope>>,
) {
    let Some(r) = spec.fs_check.as_ref() else {
        walk_blocks(cx, seen, mirrors, spec, &mut |_| {});
        return;
    };
    let mut fs = FsTree::new(cx, r);
    // Leaves go over in batches: a hand-over per leaf costs each side a
    // wake-up more than checking the leaf does.
    const BATCH: usize = 16;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<FsFeed>>(8);
    let stream = cx.stream.clone();
    let checker = std::thread::Builder::new()
        .name("fs-checks".into())
        .spawn_scoped(scope, move || {
            for batch in rx {
                let mut done = Vec::with_capacity(batch.len());
                for m in batch {
                    match m {
                        FsFeed::Leaf(n) => {
                            fs.leaf(&n);
                            done.push(n.into_vec());
                        }
                        FsFeed::Lost => fs.lost_block(),
                    }
                }
                stream.recycle(done);
            }
            fs.finish();
            fs
        });
    match checker {
        Ok(h) => {
            // The first batches are smaller: the checks start on the
            // first leaf instead of waiting for a batch's worth to be read.
            let mut batch = Vec::with_capacity(BATCH);
            let mut want = 1;
            walk_blocks(cx, seen, mirrors, spec, &mut |m| {
                batch.push(m);
                if batch.len() >= want {
                    let _ = tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)));
                    want = (want * 2).min(BATCH);
                }
            });
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
            drop(tx);
            pending.push(h);
        }
        Err(_) => {
            // No thread to be had: check the leaves here.
            let mut fs = FsTree::new(cx, r);
            walk_blocks(cx, seen, mirrors, spec, &mut |m| match m {
                FsFeed::Leaf(n) => fs.leaf(&n),
                FsFeed::Lost => fs.lost_block(),
            });
            fs.finish();
            fs.deliver(cx);
        }
    }
}

fn walk_blocks(
    cx: &mut Ctx,
    seen: &mut HashSet<u64>,
    mirrors: &mut Vec<(u64, u64)>,
    spec: &Spec,
    feed: &mut dyn FnMut(FsFeed),
) {
    let root = spec.root;
    // A relocation tree's root block is referenced by itself (full backref).
    let root_parent = if spec.kind == Kind::Reloc {
        root.bytenr
    } else {
        0
    };
    cx.ext.found_tree.push(FoundTree {
        bytenr: root.bytenr,
        parent: root_parent,
        owner: spec.ref_root,
        level: root.level,
        tree: root.id,
    });
    let opts = WalkOptions {
        order: Order::Depth,
        on_damage: OnDamage::Keep,
        drop: spec.drop_key,
        ..Default::default()
    };
    let mut v = BlockCheck {
        all_copies: cx.opts.check_mirrors,
        cx,
        validated: seen,
        mirrors,
        spec,
        feed,
        preloaded: HashMap::new(),
        first: false,
        bad: Vec::new(),
        mirrors_later: false,
        mended: false,
    };
    let start = Place::start(root.bytenr, Expect::root(&root));
    // Blocks are revisited per tree (a block twice in one tree is a
    // finding); `validated` is across trees.
    let _ = walk_with(v.cx.img, start, &opts, &mut HashSet::new(), &mut v);
}

/// The checker's side of the walk of one tree. A block is validated, its
/// references counted and its items collected once across all trees (the
/// first tree to reach it); a subvolume with inode checks is descended
/// through blocks shared with a tree walked before, so its checks see every
/// leaf, in key order.
struct BlockCheck<'c, 'a> {
    cx: &'c mut Ctx<'a>,
    /// Blocks validated by any tree's walk so far.
    validated: &'c mut HashSet<u64>,
    /// Blocks whose copies after the first are to be verified at the end.
    mirrors: &'c mut Vec<(u64, u64)>,
    spec: &'c Spec,
    feed: &'c mut dyn FnMut(FsFeed),
    all_copies: bool,
    /// Leaves read ahead in parallel, taken when the walk reaches them.
    preloaded: HashMap<u64, Loaded>,
    /// The block just loaded is validated by this walk (not by an earlier tree's).
    first: bool,
    /// Its damaged mirror copies (copy index, (devid, physical)).
    bad: Vec<(usize, (u64, u64))>,
    /// Its copies after the first are still to be verified.
    mirrors_later: bool,
    /// The block is a leaf whose item offsets were mended ([`mend`]): the
    /// walk goes on with the mended leaf.
    mended: bool,
}

/// A leaf whose only problems are item offsets and sizes, mended
/// ([`crate::tree::mend`]) when the mended leaf passes every check.
fn mend(img: &Image, node: &Node, problems: &[Problem], expect: &Expect) -> Option<Node> {
    // An item read at a wrong offset has a body its checker refuses as
    // well: those follow from the bounds, and the mended leaf must pass
    // every check anyway.
    if !node.is_leaf()
        || !problems.iter().any(|p| p.kind == ProblemKind::ItemBounds)
        || problems
            .iter()
            .any(|p| !matches!(p.kind, ProblemKind::ItemBounds | ProblemKind::ItemBody))
    {
        return None;
    }
    let m = crate::tree::mend::mend_item_offsets(node.bytes(), img.csum.size())?;
    let mended = Node::from_vec(node.bytenr, m.block).ok()?;
    // The checksum is the old bytes'; the repair's copy gets its own.
    mended
        .validate(&img.ctx(false), expect)
        .iter()
        .all(|p| p.kind == ProblemKind::Checksum)
        .then_some(mended)
}

impl BlockCheck<'_, '_> {
    fn fs_check(&self) -> bool {
        self.spec.fs_check.is_some()
    }

    fn block(&mut self, node: &Node, problems: &[Problem], at: &Place) {
        let cx = &mut *self.cx;
        let root = self.spec.root;
        cx.progress.advance(1);
        cx.sink.checked(P, 1);
        cx.walked.fetch_add(1, Relaxed);
        cx.ext.block_owner.push((node.bytenr, node.owner()));
        // A generation from the future is copied away when it is the
        // block's only problem (a copy of a block with others would carry
        // them along).
        // So is one whose generation disagrees with its parent's pointer
        // while it is otherwise sound (checksum, header, items): copied,
        // the pointer and the block agree again (btrfs check --repair).
        let generation_only =
            |k: ProblemKind| matches!(k, ProblemKind::Generation | ProblemKind::ParentTransid);
        let recowable = problems.iter().all(|p| generation_only(p.kind));
        for pr in problems {
            let cat = match pr.kind {
                ProblemKind::Checksum => Category::Checksum,
                ProblemKind::Header
                | ProblemKind::Generation
                | ProblemKind::Owner
                | ProblemKind::Level => Category::Header,
                ProblemKind::ParentTransid => Category::ParentTransid,
                ProblemKind::FirstKey | ProblemKind::KeyOrder => Category::KeyOrder,
                ProblemKind::ItemBounds => Category::ItemBounds,
                ProblemKind::ItemBody => Category::Item,
            };
            let mut f = F::err(P, cat).tree(root.id).at(at.bytenr).opt_key(pr.key);
            // The engine reads the allocator's trees whole when it opens
            // (extent, block group, free space, chunk, device and root
            // trees): a leaf of theirs cannot wait for its repair.
            let rewritable = is_fstree(root.id)
                || matches!(
                    root.id,
                    BTRFS_CSUM_TREE_OBJECTID | BTRFS_UUID_TREE_OBJECTID | BTRFS_QUOTA_TREE_OBJECTID
                );
            if self.mended && rewritable {
                f = f.fix(Repair::LeafItems {
                    tree: root.id,
                    bytenr: at.bytenr,
                });
            } else if generation_only(pr.kind) && recowable {
                f = f.fix(Repair::RecowPath {
                    tree: root.id,
                    key: pr.key.or_else(|| node.key(0)).unwrap_or(Key::MIN),
                });
            }
            cx.report(f.msg(pr.message.clone()));
        }
        if self.spec.kind == Kind::Reloc {
            // A relocation tree's blocks belong to the subvolume it relocates.
            let o = node.owner();
            if o != BTRFS_TREE_RELOC_OBJECTID && !is_fstree(o) {
                cx.report(
                    F::err(P, Category::Header)
                        .tree(root.id)
                        .at(at.bytenr)
                        .msg(format!("owner {} in a relocation tree", o as i64)),
                );
            }
        }
        for (i, at) in std::mem::take(&mut self.bad) {
            cx.report(damaged_copy(cx.img, root.id, node.bytenr, i, at));
        }
        if self.mirrors_later {
            self.mirrors.push((node.bytenr, root.id));
        }
        if let (Some(hi), Some(last)) = (
            at.hi,
            node.nr_safe().checked_sub(1).and_then(|s| node.key(s)),
        ) {
            if last >= hi {
                cx.report(
                    F::err(P, Category::KeyOrder)
                        .tree(root.id)
                        .at(at.bytenr)
                        .key(last)
                        .msg(format!(
                            "last key {} is not below the parent's next key {}",
                            super::fmt_key(&last),
                            super::fmt_key(&hi)
                        )),
                );
            }
        }
        if node.is_leaf() {
            leaf(cx, self.spec, node);
        }
    }
}

impl Visitor for BlockCheck<'_, '_> {
    type Break = std::convert::Infallible;

    fn load(
        &mut self,
        img: &Image,
        at: &Place,
        _log: bool,
    ) -> Option<crate::Result<(Node, Vec<Problem>)>> {
        self.first = self.validated.insert(at.bytenr);
        if !self.first {
            if let Some(k) = self.cx.keep.as_mut() {
                k.shared = true;
            }
        }
        if !self.first && !self.fs_check() {
            return None;
        }
        let (read, bad, later) = self
            .preloaded
            .remove(&at.bytenr)
            .unwrap_or_else(|| load(img, &self.cx.stream, at.bytenr, &at.expect, self.all_copies));
        self.bad = bad;
        self.mirrors_later = later;
        self.mended = false;
        let read = read.map(
            |(node, problems)| match mend(img, &node, &problems, &at.expect) {
                Some(m) => {
                    self.mended = true;
                    (m, problems)
                }
                None => (node, problems),
            },
        );
        Some(read)
    }

    fn event(&mut self, ev: WalkEvent<'_>) -> ControlFlow<Self::Break, bool> {
        let root = self.spec.root;
        match ev {
            WalkEvent::Block {
                node, problems, at, ..
            } => {
                if self.first {
                    self.block(node, problems, at);
                }
            }
            WalkEvent::Unreadable { error, at, .. } => {
                if self.first {
                    self.cx.report(
                        F::err(P, Category::Unreadable)
                            .tree(root.id)
                            .at(at.bytenr)
                            .opt_key(at.expect.first_key)
                            .msg(format!("tree block unreadable: {error}")),
                    );
                }
                if self.fs_check() {
                    (self.feed)(FsFeed::Lost);
                }
            }
            WalkEvent::Revisit { at, .. } => self.cx.report(
                F::err(P, Category::TreeShape)
                    .tree(root.id)
                    .at(at.bytenr)
                    .msg(format!(
                        "block {} is referenced twice in tree {}",
                        at.bytenr, root.id as i64
                    )),
            ),
            WalkEvent::Excluded { .. } => {}
        }
        ControlFlow::Continue(true)
    }

    fn children(&mut self, img: &Image, node: &Node, children: &[Place]) {
        if self.first {
            for c in children {
                self.cx.ext.found_tree.push(FoundTree {
                    bytenr: c.bytenr,
                    parent: node.bytenr,
                    owner: node.owner(),
                    level: c.expect.level.unwrap_or(0),
                    tree: self.spec.root.id,
                });
            }
        }
        // Ask the kernel to start reading every child now (many reads in
        // flight instead of one at a time), then read and validate leaves
        // in parallel; the rest of the walk (and every finding) stays in
        // key order.
        let fs_check = self.fs_check();
        let todo: Vec<&Place> = children
            .iter()
            .filter(|c| fs_check || !self.validated.contains(&c.bytenr))
            .collect();
        if !self.cx.meta_prefetched {
            for c in &todo {
                img.prefetch_tree_block(c.bytenr);
            }
        }
        if node.level() == 1 && children.len() > 1 {
            // Only the leaves walked next: memory stays at PRELOAD blocks
            // whatever the node size and fan-out. Whatever is left of the
            // previous node's (blocks the walk passed by) goes.
            const PRELOAD: usize = 32;
            let all_copies = self.all_copies;
            let stream = &*self.cx.stream;
            self.preloaded = todo
                .par_iter()
                .take(PRELOAD)
                .map(|c| (c.bytenr, load(img, stream, c.bytenr, &c.expect, all_copies)))
                .collect();
        }
    }

    fn done(&mut self, node: Node) {
        if self.fs_check() && node.is_leaf() {
            (self.feed)(FsFeed::Leaf(node));
        }
    }
}

/// Second (and later) copies of blocks whose first copy was good, read in
/// physical order per device, a batch ahead, and verified in parallel.
/// Copies on a missing device are not read (the open says it is missing).
fn verify_mirrors(cx: &mut Ctx, blocks: Vec<(u64, u64)>) {
    let img = cx.img;
    let ns = img.nodesize as usize;
    let mut todo: Vec<((u64, u64), usize, u64, u64)> = Vec::with_capacity(blocks.len());
    for (bytenr, tree) in blocks {
        if let Ok(copies) = img.block_copy_addrs(bytenr) {
            for (i, &c) in copies.iter().enumerate().skip(1) {
                if img.device_of(c.0).is_some() {
                    todo.push((c, i, bytenr, tree));
                }
            }
        }
    }
    todo.sort_unstable();
    const BATCH: usize = 256;
    let ahead = |from: usize| {
        for &((d, p), ..) in todo.iter().skip(from).take(BATCH) {
            if let Some(dev) = img.device_of(d) {
                dev.prefetch(p, ns as u64);
            }
        }
    };
    ahead(0);
    let mut bad = Vec::new();
    for (n, chunk) in todo.chunks(BATCH).enumerate() {
        ahead((n + 1) * BATCH);
        let res: Vec<Option<((u64, u64), usize, u64, u64)>> = chunk
            .par_iter()
            .map(|&(c, i, bytenr, tree)| {
                let mut b = vec![0u8; ns];
                let ok = img.read_copy(c.0, c.1, &mut b).is_ok() && copy_ok(img, &b, bytenr);
                (!ok).then_some((c, i, bytenr, tree))
            })
            .collect();
        bad.extend(res.into_iter().flatten());
    }
    for (c, i, bytenr, tree) in bad {
        cx.report(damaged_copy(img, tree, bytenr, i, c));
    }
}

/// How far the stream of tree blocks runs ahead of the walk (our memory:
/// most of the checker's peak on a large filesystem); 16 MiB still covers
/// how far a kernel-made image's disk order strays from the walk's (a few
/// dozen blocks of 36,000 read by the walk itself at 1,000,000 files; at
/// 8 MiB, 1,500).
const STREAM_WINDOW: u64 = 16 << 20;
/// The reader's largest read, and its ring of run buffers: a window's
/// worth and one more, so a buffer is usually free again when wanted.
const STREAM_RUN: u64 = 4 << 20;
const STREAM_RUNS: usize = (STREAM_WINDOW / STREAM_RUN) as usize + 1;
/// Runs up to this long are copied out of their buffer as soon as read.
const STREAM_SHORT_RUN: usize = 256 << 10;

/// The extent tree lists every tree block: the first present copy of each
/// (devid, physical, bytenr), for the stream to read ahead of the walk, in
/// the order the walk wants them: the blocks of trees that are not
/// subvolumes first (they are walked first), each part in disk order, and
/// none the walk has passed already (the extent tree's own); and
/// the other copies on present devices (devid, physical, copy index,
/// bytenr) in disk order.
#[allow(clippy::type_complexity)]
fn metadata_runs(
    cx: &Ctx,
    seen: &HashSet<u64>,
) -> (Vec<(u64, u64, u64)>, Vec<(u64, u64, usize, u64)>) {
    let img = cx.img;
    let mut first: Vec<(bool, (u64, u64, u64))> = Vec::new();
    let mut copies: Vec<(u64, u64, usize, u64)> = Vec::new();
    // The tree a block belongs to is its tree block reference's root; the
    // references were declared in the same (address) order as the items.
    let declared = &cx.ext.declared;
    let mut di = 0usize;
    for r in &cx.ext.recs {
        if r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK == 0 {
            continue;
        }
        let Ok(all) = img.block_copy_addrs(r.bytenr) else {
            continue;
        };
        let mut present = all
            .iter()
            .enumerate()
            .filter(|(_, c)| img.device_of(c.0).is_some());
        if let Some((_, &(d, p))) = present.next() {
            copies.extend(present.map(|(i, &(d, p))| (d, p, i, r.bytenr)));
            // Walked already (the extent tree's own): not again.
            if seen.contains(&r.bytenr) {
                continue;
            }
            while declared.get(di).is_some_and(|x| x.bytenr < r.bytenr) {
                di += 1;
            }
            // A block shared by reference (no root named) is a subvolume's.
            let tree = declared[di..]
                .iter()
                .take_while(|x| x.bytenr == r.bytenr)
                .find_map(|x| match x.key {
                    super::extents::RefKey::Tree(root) => Some(root),
                    _ => None,
                });
            let late = tree.is_none_or(is_fstree);
            first.push((late, (d, p, r.bytenr)));
        }
    }
    copies.sort_unstable();
    first.sort_unstable();
    (first.into_iter().map(|f| f.1).collect(), copies)
}

/// Tree blocks read ahead of the walk in disk order, in large reads past
/// the page cache, and kept until the walk takes them. The reader holds at
/// most STREAM_WINDOW bytes of blocks the walk has not taken yet, so memory
/// is bounded whatever the metadata's size. A block the walk needs before
/// the reader has it is waited for when the reader is about to bring it
/// (within a window of its place), else read as usual (and dropped by the
/// reader when it comes by).
///
/// Blocks stay in the run buffer they were read into, and the walk copies
/// each out as it takes it: the reader only reads (copying every block out
/// itself cost it a third of its time, during which the disk idled). The
/// run buffers are a ring; a run still holding blocks when its buffer is
/// wanted again has them copied out first (blocks the walk reaches late).
#[derive(Default)]
pub(crate) struct BlockStream {
    /// A reader was started (it starts once the extent tree, which lists
    /// the blocks, is walked; before that the walk does not look here).
    active: std::sync::atomic::AtomicBool,
    blocks: std::sync::Mutex<StreamState>,
    /// Signalled when the walk takes a block (room in the window).
    taken: std::sync::Condvar,
    /// Signalled when a run's blocks are in (for a walk waiting for one).
    arrived: std::sync::Condvar,
    /// Block buffers the subvolume checks are done with, filled again by
    /// the walk's copies: fresh ones cost a page fault and a zeroed page
    /// per 4 KiB. At most a run's worth.
    spare: std::sync::Mutex<Vec<Vec<u8>>>,
}

/// Where a block the reader brought is held.
enum Held {
    /// In run buffer `slot` at byte `at`.
    InRun { slot: usize, at: usize },
    /// Copied out of a run buffer wanted again.
    Own(Vec<u8>),
}

/// One buffer of the reader's ring and the blocks it holds.
#[derive(Default)]
struct RunSlot {
    /// None while the reader reads into it.
    buf: Option<crate::io::IoBuf>,
    /// Bytes read into it.
    len: usize,
    /// (bytenr, byte offset) of the blocks it was read with; those the
    /// walk took are gone from `ready`.
    blocks: Vec<(u64, usize)>,
    /// Blocks of it not taken yet.
    left: usize,
}

#[derive(Default)]
struct StreamState {
    /// bytenr -> (devid, physical, where the copy's bytes are).
    ready: crate::util::hash::FastMap<u64, (u64, u64, Held)>,
    runs: Vec<RunSlot>,
    /// Blocks the walk read itself: not kept when the reader reaches them.
    missed: std::collections::HashSet<u64, crate::util::hash::MixBuild>,
    /// Blocks taken from the stream, and read by the walk itself.
    hits: u64,
    misses: u64,
    /// The reader waits for room (a take wakes it; otherwise a wake-up
    /// per block would cost more than the block).
    reader_waits: bool,
    /// Each block's place in the reader's order, and the place of the
    /// first block not read yet; the reader has ended.
    order: crate::util::hash::FastMap<u64, usize>,
    next: usize,
    /// Blocks in a window: how far past `next` a block is coming soon.
    ahead: usize,
    /// Block size.
    ns: usize,
    done: bool,
    /// Walk threads waiting for a run.
    walk_waits: u32,
}

impl StreamState {
    /// The bytes of a block held in run `slot` at `at`.
    fn run_bytes(&mut self, slot: usize, at: usize) -> Option<&[u8]> {
        let ns = self.ns;
        let r = self.runs.get_mut(slot)?;
        let len = r.len;
        let b = r.buf.as_mut()?.get(len).ok()?;
        b.get(at..at + ns).map(|b| b as &[u8])
    }
}

impl BlockStream {
    /// The copy at (devid, physical) of block `bytenr`, if the reader has it.
    fn take(&self, bytenr: u64, at: (u64, u64)) -> Option<Vec<u8>> {
        if !self.active.load(Relaxed) {
            return None;
        }
        let mut st = self.blocks.lock().ok()?;
        loop {
            match st.ready.remove(&bytenr) {
                Some((d, p, held)) => {
                    if let Held::InRun { slot, .. } = held {
                        if let Some(r) = st.runs.get_mut(slot) {
                            r.left = r.left.saturating_sub(1);
                        }
                    }
                    if (d, p) == at {
                        let b = match held {
                            Held::Own(b) => Some(b),
                            Held::InRun { slot, at: off } => {
                                st.run_bytes(slot, off).map(|b| self.copy_block(b))
                            }
                        };
                        if let Some(b) = b {
                            st.hits += 1;
                            let wake = st.reader_waits;
                            drop(st);
                            if wake {
                                self.taken.notify_one();
                            }
                            return Some(b);
                        }
                    }
                }
                None => {
                    // Coming within the window (the walk got ahead of the
                    // reader, as at its start): waited for, rather than
                    // read twice with a small read of its own. Not when
                    // the reader itself waits for the walk.
                    let ahead = st.ahead;
                    let soon = !st.done
                        && !st.reader_waits
                        && st
                            .order
                            .get(&bytenr)
                            .is_some_and(|&i| i >= st.next && i < st.next + ahead);
                    if soon {
                        st.walk_waits += 1;
                        let r = self
                            .arrived
                            .wait_timeout(st, std::time::Duration::from_millis(2));
                        st = r.ok()?.0;
                        st.walk_waits -= 1;
                        continue;
                    }
                }
            }
            st.misses += 1;
            st.missed.insert(bytenr);
            return None;
        }
    }

    /// A copy of block `b` in a buffer of its own (a spare one when there
    /// is one).
    fn copy_block(&self, b: &[u8]) -> Vec<u8> {
        let mut v = self
            .spare
            .lock()
            .ok()
            .and_then(|mut s| s.pop())
            .unwrap_or_default();
        v.clear();
        v.extend_from_slice(b);
        v
    }

    /// Give block buffers back for the walk's copies (kept only while the
    /// reader runs). They circulate between the walk and the subvolume
    /// checks, whose queue holds a few hundred blocks: more spares than a
    /// run's worth would be memory held for nothing.
    pub(super) fn recycle(&self, bufs: Vec<Vec<u8>>) {
        if bufs.is_empty() || !self.active.load(Relaxed) {
            return;
        }
        if let Ok(mut spare) = self.spare.lock() {
            for b in bufs {
                if (spare.len() * b.capacity()) as u64 >= STREAM_RUN {
                    break;
                }
                spare.push(b);
            }
        }
    }

    /// (blocks taken from the stream, blocks the walk read itself).
    pub(super) fn counts(&self) -> (u64, u64) {
        self.blocks.lock().map_or((0, 0), |st| (st.hits, st.misses))
    }

    /// Read `blocks` (devid, physical, bytenr; in disk order) in runs,
    /// holding back while the walk (`walked` blocks; u64::MAX at its end,
    /// which ends this) is more than a window behind.
    fn fill(
        &self,
        devs: &[(u64, std::sync::Arc<dyn crate::io::BlockDevice>)],
        blocks: &[(u64, u64, u64)],
        ns: usize,
        walked: &std::sync::atomic::AtomicU64,
    ) {
        if let Ok(mut st) = self.blocks.lock() {
            st.order = blocks.iter().enumerate().map(|(i, b)| (b.2, i)).collect();
            st.ahead = (STREAM_WINDOW / ns.max(1) as u64) as usize;
            st.ns = ns;
            st.runs = (0..STREAM_RUNS).map(|_| RunSlot::default()).collect();
        }
        self.fill_runs(devs, blocks, ns, walked);
        if let Ok(mut st) = self.blocks.lock() {
            st.done = true;
        }
        self.arrived.notify_all();
    }

    fn fill_runs(
        &self,
        devs: &[(u64, std::sync::Arc<dyn crate::io::BlockDevice>)],
        blocks: &[(u64, u64, u64)],
        ns: usize,
        walked: &std::sync::atomic::AtomicU64,
    ) {
        const GAP: u64 = 128 << 10;
        let mut i = 0;
        let mut slot = 0;
        let mut kept = true;
        while i < blocks.len() {
            let (devid, start, _) = blocks[i];
            let mut j = i + 1;
            while j < blocks.len()
                && blocks[j].0 == devid
                && blocks[j].1 >= blocks[j - 1].1 + ns as u64
                && blocks[j].1 - (blocks[j - 1].1 + ns as u64) <= GAP
                && blocks[j].1 + ns as u64 - start <= STREAM_RUN
            {
                j += 1;
            }
            let run = &blocks[i..j];
            i = j;
            // Hold back while the blocks waiting for the walk fill the
            // window (the walk's end, u64::MAX, ends this).
            let Ok(mut st) = self.blocks.lock() else {
                return;
            };
            loop {
                if walked.load(Relaxed) == u64::MAX {
                    return;
                }
                if ((st.ready.len() + run.len()) * ns) as u64 <= STREAM_WINDOW {
                    break;
                }
                // Timed: the walk's end is not signalled.
                st.reader_waits = true;
                match self
                    .taken
                    .wait_timeout(st, std::time::Duration::from_millis(1))
                {
                    Ok((g, _)) => st = g,
                    Err(_) => return,
                }
            }
            st.reader_waits = false;
            let Some((_, dev)) = devs.iter().find(|d| d.0 == devid) else {
                st.next = i;
                continue;
            };
            // The ring's next buffer (blocks of its last run the walk has
            // not taken are copied out first), or again the last one when
            // its run was copied out.
            if kept {
                slot = (slot + 1) % STREAM_RUNS;
            }
            let mut buf = self.free_slot(&mut st, slot);
            drop(st);
            // Mapped once at a run's size (a first small read would map
            // a smaller buffer, faulted in again when it grows).
            let _ = buf.get(STREAM_RUN as usize);
            let len = (run[run.len() - 1].1 + ns as u64 - start) as usize;
            let mut ok = false;
            let _ = dev.read_once(start, len, &mut buf, &mut |_| ok = true);
            let Ok(mut st) = self.blocks.lock() else {
                return;
            };
            let mut held = Vec::new();
            // A short run (the trees walked before the subvolumes' are a
            // few blocks here and there) is copied out at once: its buffer
            // serves the next run instead of a fresh one being faulted in.
            kept = len > STREAM_SHORT_RUN;
            if ok {
                let data = if kept {
                    &[][..]
                } else {
                    buf.get(len).unwrap_or_default()
                };
                for &(d, p, bytenr) in run {
                    if st.missed.remove(&bytenr) {
                        continue;
                    }
                    let at = (p - start) as usize;
                    if kept {
                        st.ready.insert(bytenr, (d, p, Held::InRun { slot, at }));
                        held.push((bytenr, at));
                    } else if let Some(b) = data.get(at..at + ns) {
                        st.ready
                            .insert(bytenr, (d, p, Held::Own(self.copy_block(b))));
                    }
                }
            }
            if let Some(r) = st.runs.get_mut(slot) {
                *r = RunSlot {
                    buf: Some(buf),
                    len,
                    left: held.len(),
                    blocks: held,
                };
            }
            st.next = i;
            if st.walk_waits > 0 {
                self.arrived.notify_all();
            }
        }
    }

    /// Take the buffer of ring slot `slot` for the next read, copying out
    /// the blocks of its last run the walk has not taken.
    fn free_slot(&self, st: &mut StreamState, slot: usize) -> crate::io::IoBuf {
        let Some(r) = st.runs.get_mut(slot) else {
            return crate::io::IoBuf::new();
        };
        let r = std::mem::take(r);
        let mut buf = r.buf.unwrap_or_default();
        if r.left > 0 {
            let ns = st.ns;
            if let Ok(data) = buf.get(r.len) {
                for (bytenr, at) in r.blocks {
                    if let Some(e) = st.ready.get_mut(&bytenr) {
                        if matches!(e.2, Held::InRun { slot: s, .. } if s == slot) {
                            e.2 = Held::Own(
                                self.copy_block(data.get(at..at + ns).unwrap_or_default()),
                            );
                        }
                    }
                }
            }
        }
        buf
    }
}

/// Verify the given copies (devid, physical, copy index, bytenr; in disk
/// order) with large direct reads. Returns the blocks covered (sorted) and
/// the damaged copies (bytenr, copy index, devid, physical; sorted).
#[allow(clippy::type_complexity)]
fn verify_copies(
    img: &Image,
    copies: Vec<(u64, u64, usize, u64)>,
) -> (Vec<u64>, Vec<(u64, usize, u64, u64)>) {
    const REQUEST: u64 = 2 << 20;
    let ns = img.nodesize as u64;
    let mut bad = Vec::new();
    let mut buf = crate::io::IoBuf::new();
    let mut i = 0;
    while i < copies.len() {
        // A run of copies next to each other on one device (small gaps read through).
        let (devid, start) = (copies[i].0, copies[i].1);
        let mut j = i + 1;
        while j < copies.len()
            && copies[j].0 == devid
            && copies[j].1 >= copies[j - 1].1 + ns
            && copies[j].1 - (copies[j - 1].1 + ns) <= 64 << 10
            && copies[j].1 + ns - start <= REQUEST
        {
            j += 1;
        }
        let len = (copies[j - 1].1 + ns - start) as usize;
        let run = &copies[i..j];
        let mut ok = false;
        if let Some(dev) = img.device_of(devid) {
            let _ = dev.read_once(start, len, &mut buf, &mut |data: &[u8]| {
                ok = true;
                for &(d, p, copy, bytenr) in run {
                    let o = (p - start) as usize;
                    let good = data
                        .get(o..o + ns as usize)
                        .is_some_and(|b| copy_ok(img, b, bytenr));
                    if !good {
                        bad.push((bytenr, copy, d, p));
                    }
                }
            });
        }
        if !ok {
            // Unreadable as a whole: block by block.
            let mut b = vec![0u8; ns as usize];
            for &(d, p, copy, bytenr) in run {
                if !(img.read_copy(d, p, &mut b).is_ok() && copy_ok(img, &b, bytenr)) {
                    bad.push((bytenr, copy, d, p));
                }
            }
        }
        i = j;
    }
    let mut done: Vec<u64> = copies.iter().map(|c| c.3).collect();
    done.sort_unstable();
    done.dedup();
    bad.sort_unstable();
    (done, bad)
}

/// The extent tree is walked first and its leaves lie among all the other
/// metadata: ask for them before the bulk read-ahead of the metadata
/// chunks, so that walk is not queued behind the rest of the disk.
pub(super) fn prefetch_extent_leaves(img: &Image) {
    use zerocopy::FromBytes;
    let key = Key::new(BTRFS_EXTENT_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0);
    let Ok(Some(item)) = crate::tree::search::lookup(img, img.root_tree(), key) else {
        return;
    };
    let Some((ri, _)) = item
        .data()
        .ok()
        .and_then(|d| RootItem::read_from_prefix(d).ok())
    else {
        return;
    };
    img.prefetch_leaves(ri.bytenr.get(), ri.level);
}

/// Mirror copies of a block on present devices that do not carry a valid
/// checksum and address of their own: (copy index, (devid, physical)).
fn bad_copies(img: &Image, node: &Node, from: usize) -> Vec<(usize, (u64, u64))> {
    let ns = img.nodesize as usize;
    let Ok(copies) = img.block_copy_addrs(node.bytenr) else {
        return Vec::new();
    };
    if copies.len() < 2 {
        return Vec::new();
    }
    let mut buf = vec![0u8; ns];
    let mut bad = Vec::new();
    for (i, &(d, p)) in copies.iter().enumerate().skip(from) {
        let Some(dev) = img.device_of(d) else {
            continue;
        };
        let ok = match dev.slice(p, ns) {
            Some(s) => copy_ok(img, s, node.bytenr),
            None => dev.read_at(p, &mut buf).is_ok() && copy_ok(img, &buf, node.bytenr),
        };
        if !ok {
            bad.push((i, (d, p)));
        }
    }
    bad
}

/// A copy of a tree block that fails its checksum or names another address
/// while another copy is good. A warning, as btrfs check's verdict is: every
/// read (the kernel's, btrfs check's, ours) takes the good copy, and the
/// kernel's read repair or `btrfs scrub` rewrites the bad one; what is lost
/// is redundancy, not data.
fn damaged_copy(
    img: &Image,
    tree: u64,
    bytenr: u64,
    copy: usize,
    at: (u64, u64),
) -> super::Finding {
    let (devid, phys) = at;
    let place = if img.multi_device() {
        format!("at physical {phys} on {}", img.device_name(devid))
    } else {
        format!("at physical {phys}")
    };
    F::warn(P, Category::MirrorCopy)
        .tree(tree)
        .at(bytenr)
        .msg(format!(
            "copy {copy} of the block ({place}) is damaged; reads use another copy \
         (`btrfs scrub` rewrites it)"
        ))
}

fn copy_ok(img: &Image, b: &[u8], bytenr: u64) -> bool {
    crate::csum::verify_block(img.csum, b)
        && b.get(0x30..0x38)
            .and_then(|s| s.try_into().ok())
            .map(u64::from_le_bytes)
            == Some(bytenr)
}

fn leaf(cx: &mut Ctx, spec: &Spec, node: &Node) {
    match spec.kind {
        Kind::Root => {
            root_leaf(cx, node);
            // Free space cache (v1) inodes keep their data extents in the root tree.
            super::extents::on_fs_leaf(cx, node);
            super::space_cache::on_root_leaf(cx, node);
        }
        Kind::Chunk => super::chunks::on_chunk_leaf(cx, node),
        Kind::Extent => super::extents::on_extent_leaf(cx, node),
        Kind::Dev => super::chunks::on_dev_leaf(cx, node),
        Kind::BlockGroup => {
            for slot in 0..node.nr_safe() {
                let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
                    continue;
                };
                if k.ty == BTRFS_BLOCK_GROUP_ITEM_KEY {
                    super::chunks::on_bg_item(cx, &k, d);
                }
            }
        }
        Kind::Csum => super::csums::on_leaf(cx, node),
        Kind::FreeSpace => super::free_space::on_leaf(cx, node),
        Kind::Quota => super::qgroups::on_quota_leaf(cx, node),
        Kind::Uuid => super::uuid_tree::on_leaf(cx, node),
        Kind::Fs | Kind::Reloc => super::extents::on_fs_leaf(cx, node),
        Kind::Other => {}
    }
}

fn root_leaf(cx: &mut Ctx, node: &Node) {
    for slot in 0..node.nr_safe() {
        let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
            continue;
        };
        match k.ty {
            BTRFS_ROOT_ITEM_KEY => match RootItem::parse(d) {
                Ok(ri) => cx.roots.push(RootRec {
                    key: k,
                    item: Box::new(ri),
                }),
                Err(e) => cx.report(
                    F::err(P, Category::RootItem)
                        .tree(1)
                        .at(node.bytenr)
                        .key(k)
                        .msg(format!("root item unreadable: {e}")),
                ),
            },
            BTRFS_ROOT_REF_KEY | BTRFS_ROOT_BACKREF_KEY => {
                if let Ok(ItemBody::RootRef(r, name)) = decode(&k, d, 0) {
                    cx.root_links.push(RootLink {
                        key: k,
                        dirid: r.dirid.get(),
                        sequence: r.sequence.get(),
                        name: name.to_vec(),
                    });
                }
            }
            BTRFS_ORPHAN_ITEM_KEY if k.objectid == BTRFS_ORPHAN_OBJECTID => {
                cx.orphan_roots.push(k.offset)
            }
            _ => {}
        }
    }
}
