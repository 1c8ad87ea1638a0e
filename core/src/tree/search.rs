//! Key search and forward iteration over one tree. A path holds one block
//! per level; descending always goes exactly one level down (checked against
//! the block read), so a walk ends after at most `BTRFS_MAX_LEVEL` steps down
//! whatever the pointers say.

use super::node::{Expect, Node};
use super::TreeRoot;
use crate::error::ProblemKind;
use crate::format::consts::*;
use crate::format::item::ItemBody;
use crate::format::key::Key;
use crate::image::Image;
use crate::CorruptKind;
use crate::{Error, Result};
use std::sync::Arc;

/// A leaf item found by iteration.
#[derive(Clone)]
pub struct ItemRef {
    /// The item's key.
    pub key: Key,
    /// The leaf holding the item, shared with the iterator's path.
    pub node: Arc<Node>,
    /// Slot of the item in `node`.
    pub slot: usize,
}

impl ItemRef {
    /// The item's body, bounds-checked against the leaf.
    pub fn data(&self) -> Result<&[u8]> {
        self.node.item_data(self.slot)
    }
    /// Decode the item's body by its key type; `csum_size` is the checksum size
    /// in bytes (for csum items).
    pub fn decode(&self, csum_size: usize) -> Result<(Key, ItemBody<'_>)> {
        self.node.decode_item(self.slot, csum_size)
    }
}

/// Forward iterator over the items of one tree in key order, from a start
/// key to the end of the tree: the read-only counterpart of
/// `btrfs_search_slot` followed by `btrfs_next_item`. Every block is read
/// through [`Image::read_tree_block`] with what its parent expects of it, and
/// an error ends the iteration.
pub struct TreeIter<'a> {
    img: &'a Image,
    root: TreeRoot,
    log: bool,
    /// (block, next slot to visit) from the root down to the current leaf.
    path: Vec<(Arc<Node>, usize)>,
    done: bool,
}

impl<'a> TreeIter<'a> {
    /// Position at the first item with key >= `start`.
    pub fn new(img: &'a Image, root: TreeRoot, start: Key) -> Result<TreeIter<'a>> {
        let log = root.id == BTRFS_TREE_LOG_OBJECTID;
        let mut it = TreeIter {
            img,
            root,
            log,
            path: Vec::new(),
            done: false,
        };
        it.seek(start)?;
        Ok(it)
    }

    fn read(&self, bytenr: u64, e: &Expect) -> Result<Arc<Node>> {
        Ok(Arc::new(self.img.read_tree_block(bytenr, e, self.log)?))
    }

    fn seek(&mut self, start: Key) -> Result<()> {
        self.path.clear();
        let mut node = self.read(self.root.bytenr, &Expect::root(&self.root))?;
        loop {
            if node.is_leaf() {
                let slot = match node.bin_search(&start) {
                    Ok(s) | Err(s) => s,
                };
                self.path.push((node, slot));
                return Ok(());
            }
            let slot = match node.bin_search(&start) {
                Ok(s) => s,
                Err(s) => s.saturating_sub(1),
            };
            let child = self.child(&node, slot)?;
            self.path.push((node, slot + 1));
            node = child;
        }
    }

    fn child(&self, node: &Node, slot: usize) -> Result<Arc<Node>> {
        if node.is_leaf() {
            return Err(Error::corrupt_as(
                CorruptKind::Block(ProblemKind::Level),
                "leaf used as node",
                node.bytenr,
            ));
        }
        let c = node.child_expect(slot, self.root.id).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Block(ProblemKind::ItemBounds),
                format!("node has no pointer in slot {slot}"),
                node.bytenr,
            )
        })?;
        self.read(c.bytenr, &c.expect)
    }

    /// The next item, or None at the end of the tree.
    pub fn next_item(&mut self) -> Option<Result<ItemRef>> {
        if self.done {
            return None;
        }
        loop {
            let (leaf, slot) = self.path.last_mut()?;
            if *slot < leaf.nr_safe() {
                let s = *slot;
                *slot += 1;
                let key = match leaf.key(s) {
                    Some(k) => k,
                    None => continue,
                };
                return Some(Ok(ItemRef {
                    key,
                    node: leaf.clone(),
                    slot: s,
                }));
            }
            // Leaf exhausted: climb to the first ancestor with a next pointer.
            self.path.pop();
            loop {
                let Some((node, slot)) = self.path.last_mut() else {
                    self.done = true;
                    return None;
                };
                if *slot < node.nr_safe() {
                    let s = *slot;
                    *slot += 1;
                    let node = node.clone();
                    // Descend to the leftmost leaf under this pointer.
                    let mut cur = match self.child(&node, s) {
                        Ok(c) => c,
                        Err(e) => {
                            self.done = true;
                            return Some(Err(e));
                        }
                    };
                    while !cur.is_leaf() {
                        let c = match self.child(&cur, 0) {
                            Ok(c) => c,
                            Err(e) => {
                                self.done = true;
                                return Some(Err(e));
                            }
                        };
                        self.path.push((cur, 1));
                        cur = c;
                    }
                    self.path.push((cur, 0));
                    break;
                }
                self.path.pop();
            }
        }
    }
}

impl TreeIter<'_> {
    /// Logical addresses of the blocks from the root down to the leaf of
    /// the item [`TreeIter::next_item`] returned last.
    pub fn path_blocks(&self) -> Vec<u64> {
        self.path
            .iter()
            .map(|(n, _)| n.header().bytenr.get())
            .collect()
    }
}

impl Iterator for TreeIter<'_> {
    type Item = Result<ItemRef>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_item()
    }
}

/// Look up exactly `key` in `root`.
pub fn lookup(img: &Image, root: TreeRoot, key: Key) -> Result<Option<ItemRef>> {
    let mut it = TreeIter::new(img, root, key)?;
    match it.next_item() {
        Some(Ok(i)) if i.key == key => Ok(Some(i)),
        Some(Err(e)) => Err(e),
        _ => Ok(None),
    }
}
