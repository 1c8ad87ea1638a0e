//! The one walk of a tree's blocks: from a start block down through its
//! pointers, depth first (the order btrfs-progs prints with `--dfs`, and
//! key order for leaves) or breadth first (dump-tree's default), every
//! block once. What a child must look like comes from
//! [`Node::child_expect`]; each block carries the key range `[lo, hi)` its
//! parent gives it. A [`OnDamage`] policy says what a damaged block
//! (unreadable, invalid, referenced twice, or known bad from elsewhere)
//! does to the walk: stop it, lose the block and what is under it, or use
//! what can still be read of it.
//!
//! Its callers: the log reader (replay, salvage, inspection), dump,
//! [`walk_tree`] (tests, tools) and the checker. Most hand [`walk`] a
//! closure; a caller that reads blocks its own way (the checker reads
//! every mirror copy, passes by blocks another tree's walk validated and
//! loads a node's leaves in parallel) or keeps the blocks it is handed
//! implements [`Visitor`] and calls [`walk_with`].

use super::node::{Expect, Node, Problem, ProblemKind};
use super::TreeRoot;
use crate::format::consts::*;
use crate::format::key::Key;
use crate::image::Image;
use crate::Error;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::ControlFlow;

/// What a walk (or a read built on it) does with a block that is
/// unreadable or fails validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDamage {
    /// Stop with the damage (replay must not guess).
    Fail,
    /// The block and everything under it is lost: the visitor hears of it,
    /// its pointers are not followed (salvage).
    Skip,
    /// Use whatever can still be read of a damaged block (its items, its
    /// pointers) and report the problems (inspection, dump, the checker).
    Keep,
}

/// The order blocks are visited in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// A node, then each child's whole subtree in key order.
    Depth,
    /// Level by level from the start block, each in key order.
    Breadth,
}

/// How to walk.
#[derive(Clone, Copy, Debug)]
pub struct WalkOptions<'a> {
    /// Visiting order.
    pub order: Order,
    /// What damage does to the walk.
    pub on_damage: OnDamage,
    /// The blocks are a log tree's (validated against the log's generation
    /// bound).
    pub log: bool,
    /// Subtrees wholly left of this key are not read: an interrupted
    /// subvolume deletion's drop_progress (they have been freed).
    pub drop: Option<Key>,
    /// Start reading a node's children as soon as it is read (many reads
    /// in flight on a cold page cache).
    pub prefetch: bool,
    /// Report a key outside the range the parent gives a block as a
    /// problem of that block (the tree-checker cannot see it: a wrong
    /// block with a valid checksum would pass).
    pub check_range: bool,
    /// Blocks known to be damaged from elsewhere, with why: treated as
    /// damage when reached.
    pub excluded: Option<&'a HashMap<u64, String>>,
}

impl Default for WalkOptions<'_> {
    fn default() -> Self {
        WalkOptions {
            order: Order::Depth,
            on_damage: OnDamage::Keep,
            log: false,
            drop: None,
            prefetch: false,
            check_range: false,
            excluded: None,
        }
    }
}

/// Where a block sits in the walk.
#[derive(Clone, Debug)]
pub struct Place {
    /// Logical address of the block.
    pub bytenr: u64,
    /// What the pointer to it says about it.
    pub expect: Expect,
    /// The node pointing at it (None for the start block).
    pub parent: Option<u64>,
    /// Pointers followed from the start block.
    pub depth: usize,
    /// Lowest key the block may hold (its parent's pointer key, or the
    /// parent's own lower bound for a first child).
    pub lo: Key,
    /// The first key right of the block's subtree (None: none known).
    pub hi: Option<Key>,
}

impl Place {
    /// The start of a walk at `bytenr`, expected to look like `expect`.
    pub fn start(bytenr: u64, expect: Expect) -> Place {
        Place {
            bytenr,
            expect,
            parent: None,
            depth: 0,
            lo: Key::MIN,
            hi: None,
        }
    }
}

/// What a walk came across.
pub enum WalkEvent<'a> {
    /// A block was read; `problems` is empty for a valid block.
    Block {
        /// The block.
        node: &'a Node,
        /// What validation (and the range check) found wrong with it.
        problems: &'a [Problem],
        /// Pointers followed from the start block.
        depth: usize,
        /// Where it sits.
        at: &'a Place,
    },
    /// A block could not be read at all (outside every chunk, I/O error, or
    /// a level that breaks the tree's shape).
    Unreadable {
        /// Its address.
        bytenr: u64,
        /// The node pointing at it.
        parent: Option<u64>,
        /// The first key its parent gives it.
        key: Option<Key>,
        /// Why it could not be read.
        error: &'a Error,
        /// Where it sits.
        at: &'a Place,
    },
    /// A block already visited in this walk was referenced again.
    Revisit {
        /// Its address.
        bytenr: u64,
        /// The node referencing it again (0 for none).
        parent: u64,
        /// Where it sits this second time.
        at: &'a Place,
    },
    /// A block listed in [`WalkOptions::excluded`] was reached.
    Excluded {
        /// Why it is known to be damaged.
        why: &'a str,
        /// Where it sits.
        at: &'a Place,
    },
}

/// The damage that stopped a walk under [`OnDamage::Fail`].
#[derive(Debug)]
pub struct Damage {
    /// Where the damaged block sits.
    pub at: Place,
    /// What is wrong with it.
    pub what: DamageKind,
}

/// What is wrong with a damaged block.
#[derive(Debug)]
pub enum DamageKind {
    /// Referenced a second time (a loop, or a block shared where none may be).
    Revisit,
    /// Listed as damaged by the caller.
    Excluded(String),
    /// Could not be read.
    Unreadable(Error),
    /// Read, but invalid: its first problem.
    Invalid(Problem),
}

/// Why a walk stopped early.
#[derive(Debug)]
pub enum Stop<B> {
    /// The visitor stopped it.
    Visitor(B),
    /// Damage under [`OnDamage::Fail`].
    Damage(Box<Damage>),
}

/// What a walk calls back: [`Visitor::event`] hears every event; the
/// other methods let a visitor read blocks its own way and keep what it
/// is handed. The walk's shape (order, bounds, what a child must look
/// like, the damage policy) stays the walk's.
pub trait Visitor {
    /// What a visitor stops the walk with.
    type Break;

    /// Reads and validates the block at `at`. `None` passes it by unread:
    /// no event, nothing under it followed (a block another walk has
    /// validated already).
    fn load(
        &mut self,
        img: &Image,
        at: &Place,
        log: bool,
    ) -> Option<crate::Result<(Node, Vec<Problem>)>> {
        Some(img.read_tree_block_checked(at.bytenr, &at.expect, log))
    }

    /// An event; the answer to a `Block` says whether to follow its
    /// pointers (other events' answers are ignored).
    fn event(&mut self, ev: WalkEvent<'_>) -> ControlFlow<Self::Break, bool>;

    /// The children of `node` the walk is about to take up, in key order,
    /// before any of them is read (read-ahead).
    fn children(&mut self, _img: &Image, _node: &Node, _children: &[Place]) {}

    /// The walk is done with a block it read; the visitor may keep it.
    fn done(&mut self, _node: Node) {}
}

/// A closure as a [`Visitor`] that reads blocks the default way.
struct FnVisitor<F>(F);

impl<B, F: FnMut(WalkEvent<'_>) -> ControlFlow<B, bool>> Visitor for FnVisitor<F> {
    type Break = B;
    fn event(&mut self, ev: WalkEvent<'_>) -> ControlFlow<B, bool> {
        (self.0)(ev)
    }
}

/// Walks the tree under `start`. Blocks in `seen` are not read again (a
/// second reference is a [`WalkEvent::Revisit`]), and every block read is
/// added to it, so a caller reading several trees that may share no block
/// passes one set to all of them. The visitor answers a `Block` event with
/// whether to follow the block's pointers (other events' answers are
/// ignored), or stops the walk. Bounded: every block is read at most once,
/// and no deeper than BTRFS_MAX_LEVEL pointers from the start.
pub fn walk<B>(
    img: &Image,
    start: Place,
    opts: &WalkOptions<'_>,
    seen: &mut HashSet<u64>,
    visit: impl FnMut(WalkEvent<'_>) -> ControlFlow<B, bool>,
) -> ControlFlow<Stop<B>> {
    walk_with(img, start, opts, seen, &mut FnVisitor(visit))
}

/// [`walk`] with a [`Visitor`] that may read blocks its own way, look at a
/// node's children before they are read and keep the blocks.
pub fn walk_with<V: Visitor>(
    img: &Image,
    start: Place,
    opts: &WalkOptions<'_>,
    seen: &mut HashSet<u64>,
    v: &mut V,
) -> ControlFlow<Stop<V::Break>> {
    let fail = opts.on_damage == OnDamage::Fail;
    let stop = |what: DamageKind, at: Place| {
        ControlFlow::Break(Stop::Damage(Box::new(Damage { at, what })))
    };
    let mut todo = VecDeque::from([start]);
    let mut children: Vec<Place> = Vec::new();
    while let Some(p) = match opts.order {
        Order::Depth => todo.pop_back(),
        Order::Breadth => todo.pop_front(),
    } {
        if !seen.insert(p.bytenr) {
            if fail {
                return stop(DamageKind::Revisit, p);
            }
            let ev = WalkEvent::Revisit {
                bytenr: p.bytenr,
                parent: p.parent.unwrap_or(0),
                at: &p,
            };
            if let ControlFlow::Break(b) = v.event(ev) {
                return ControlFlow::Break(Stop::Visitor(b));
            }
            continue;
        }
        if let Some(why) = opts.excluded.and_then(|x| x.get(&p.bytenr)) {
            if fail {
                return stop(DamageKind::Excluded(why.clone()), p);
            }
            if let ControlFlow::Break(b) = v.event(WalkEvent::Excluded { why, at: &p }) {
                return ControlFlow::Break(Stop::Visitor(b));
            }
            continue;
        }
        let Some(read) = v.load(img, &p, opts.log) else {
            continue;
        };
        let (node, mut problems) = match read {
            Ok(x) => x,
            Err(e) => {
                if fail {
                    return stop(DamageKind::Unreadable(e), p);
                }
                let ev = WalkEvent::Unreadable {
                    bytenr: p.bytenr,
                    parent: p.parent,
                    key: p.expect.first_key,
                    error: &e,
                    at: &p,
                };
                if let ControlFlow::Break(b) = v.event(ev) {
                    return ControlFlow::Break(Stop::Visitor(b));
                }
                continue;
            }
        };
        if opts.check_range {
            if let Some(slot) = (0..node.nr_safe()).find(|&s| {
                node.key(s)
                    .is_some_and(|k| k < p.lo || p.hi.is_some_and(|h| k >= h))
            }) {
                problems.push(Problem {
                    bytenr: p.bytenr,
                    key: node.key(slot),
                    slot: Some(slot),
                    kind: ProblemKind::KeyOrder,
                    message: "key outside the range its parent gives the block".into(),
                });
            }
        }
        if fail && !problems.is_empty() {
            return stop(DamageKind::Invalid(problems.swap_remove(0)), p);
        }
        let ev = WalkEvent::Block {
            node: &node,
            problems: &problems,
            depth: p.depth,
            at: &p,
        };
        let follow = match v.event(ev) {
            ControlFlow::Break(b) => return ControlFlow::Break(Stop::Visitor(b)),
            ControlFlow::Continue(f) => f,
        };
        let lost = opts.on_damage == OnDamage::Skip && !problems.is_empty();
        if !follow || lost || node.is_leaf() || p.depth >= BTRFS_MAX_LEVEL as usize {
            v.done(node);
            continue;
        }
        // Child i covers keys from its pointer's key (the parent's lower
        // bound for the first) to the next pointer's key (the parent's
        // upper bound for the last). A block asked for by address names no
        // tree: its children are expected to share its owner, as the
        // kernel's btrfs_read_node_slot expects.
        let tree = p.expect.owner.unwrap_or_else(|| node.owner());
        let n = node.nr_safe();
        children.clear();
        for slot in 0..n {
            let hi = if slot + 1 < n {
                node.key(slot + 1)
            } else {
                p.hi
            };
            if let (Some(d), Some(h)) = (opts.drop, hi) {
                if h <= d {
                    continue;
                }
            }
            let Some(c) = node.child_expect(slot, tree) else {
                continue;
            };
            let key = c.expect.first_key.unwrap_or(Key::MIN);
            children.push(Place {
                bytenr: c.bytenr,
                expect: c.expect,
                parent: Some(node.bytenr),
                depth: p.depth + 1,
                lo: if slot == 0 { p.lo.min(key) } else { key },
                hi,
            });
        }
        if opts.prefetch {
            for c in &children {
                img.prefetch_tree_block(c.bytenr);
            }
        }
        v.children(img, &node, &children);
        v.done(node);
        match opts.order {
            // Pushed in reverse so they pop in key order.
            Order::Depth => todo.extend(children.drain(..).rev()),
            Order::Breadth => todo.extend(children.drain(..)),
        }
    }
    ControlFlow::Continue(())
}

/// Walks the whole tree of `root` depth first, using what can be read of
/// damaged blocks. The visitor may stop the walk early with `Break`.
pub fn walk_tree<F>(img: &Image, root: TreeRoot, mut visit: F) -> ControlFlow<()>
where
    F: FnMut(WalkEvent<'_>) -> ControlFlow<()>,
{
    let opts = WalkOptions {
        log: root.id == BTRFS_TREE_LOG_OBJECTID,
        ..Default::default()
    };
    let start = Place::start(root.bytenr, Expect::root(&root));
    match walk(img, start, &opts, &mut HashSet::new(), |ev| {
        match visit(ev) {
            ControlFlow::Continue(()) => ControlFlow::Continue(true),
            ControlFlow::Break(()) => ControlFlow::Break(()),
        }
    }) {
        ControlFlow::Continue(()) => ControlFlow::Continue(()),
        ControlFlow::Break(_) => ControlFlow::Break(()),
    }
}
