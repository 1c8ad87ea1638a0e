//! Tree blocks: read views with validation ([`node`]), search and iteration
//! ([`search`]), and whole-tree walks ([`walk`]).

pub mod edit;
pub mod node;
pub mod search;
pub mod walk;

pub use node::{Child, Expect, Node, Problem, ValidateCtx};
pub use search::TreeIter;
pub use walk::{
    walk, walk_tree, Damage, DamageKind, OnDamage, Order, Place, Stop, WalkEvent, WalkOptions,
};

/// A tree to read: its root block and what that block must look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TreeRoot {
    /// Tree id (ROOT_ITEM objectid; TREE_LOG for log trees).
    pub id: u64,
    pub bytenr: u64,
    pub level: u8,
    pub generation: u64,
}
