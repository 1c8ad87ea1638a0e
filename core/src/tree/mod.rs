//! Tree blocks: read views with validation ([`node`]), search and iteration
//! ([`search`]), and whole-tree walks ([`walk()`]).

pub mod edit;
pub mod mend;
pub mod node;
pub mod search;
pub mod walk;

pub use node::{Child, Expect, Node, Problem, ValidateCtx};
pub use search::TreeIter;
pub use walk::{
    walk, walk_tree, walk_with, Damage, DamageKind, OnDamage, Order, Place, Stop, Visitor,
    WalkEvent, WalkOptions,
};

/// A tree to read: its root block and what that block must look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TreeRoot {
    /// Tree id (ROOT_ITEM objectid; TREE_LOG for log trees).
    pub id: u64,
    /// Logical address (bytes) of the root block.
    pub bytenr: u64,
    /// Level of the root block (0 for a single-leaf tree), as its referrer
    /// records it.
    pub level: u8,
    /// Generation of the root block as its referrer records it (the root item's
    /// `generation`, or the matching superblock field for the root, chunk and
    /// log root trees): the parent transid the block must carry.
    pub generation: u64,
}
