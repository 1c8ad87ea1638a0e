//! Depth-first walk of a whole tree, visiting every block once in the order
//! btrfs-progs prints them (a node, then each child in key order). Damaged
//! blocks are reported and, where their pointers are still usable, walked
//! through; a block reached twice is reported, not walked again.

use super::node::{Expect, Node, Problem};
use super::TreeRoot;
use crate::format::consts::*;
use crate::format::key::Key;
use crate::image::Image;
use crate::Error;
use std::collections::HashSet;
use std::ops::ControlFlow;

pub enum WalkEvent<'a> {
    /// A block was read; `problems` is empty for a valid block.
    Block {
        node: &'a Node,
        problems: &'a [Problem],
        depth: usize,
    },
    /// A block could not be read at all (outside every chunk, I/O error, or
    /// a level that breaks the tree's shape).
    Unreadable {
        bytenr: u64,
        parent: Option<u64>,
        key: Option<Key>,
        error: &'a Error,
    },
    /// A block already visited in this walk was referenced again.
    Revisit { bytenr: u64, parent: u64 },
}

/// Walk `root`. The visitor may stop the walk early with `Break`.
pub fn walk_tree<F>(img: &Image, root: TreeRoot, mut visit: F) -> ControlFlow<()>
where
    F: FnMut(WalkEvent<'_>) -> ControlFlow<()>,
{
    let log = root.id == BTRFS_TREE_LOG_OBJECTID;
    let mut seen = HashSet::new();
    // Explicit stack: (bytenr, expect, parent, depth). Children are pushed in
    // reverse so they pop in key order.
    let mut stack = vec![(root.bytenr, Expect::root(&root), None::<u64>, 0usize)];
    while let Some((bytenr, expect, parent, depth)) = stack.pop() {
        if !seen.insert(bytenr) {
            visit(WalkEvent::Revisit {
                bytenr,
                parent: parent.unwrap_or(0),
            })?;
            continue;
        }
        let (node, problems) = match img.read_tree_block_checked(bytenr, &expect, log) {
            Ok(x) => x,
            Err(e) => {
                visit(WalkEvent::Unreadable {
                    bytenr,
                    parent,
                    key: expect.first_key,
                    error: &e,
                })?;
                continue;
            }
        };
        visit(WalkEvent::Block {
            node: &node,
            problems: &problems,
            depth,
        })?;
        if node.is_leaf() || depth >= BTRFS_MAX_LEVEL as usize {
            continue;
        }
        for slot in (0..node.nr_safe()).rev() {
            if let Some(c) = node.child_expect(slot, root.id) {
                stack.push((c.bytenr, c.expect, Some(bytenr), depth + 1));
            }
        }
    }
    ControlFlow::Continue(())
}
