//! What a tree dump produces, in order: the events the walker of
//! [`crate::tree`] emits and both renderings ([`crate::text`] and
//! [`crate::json`]) consume, so neither rendering depends on the walker.

use btrkit_core::format::key::Key;
use btrkit_core::tree::{Node, Problem};
use std::io;

/// What a dump produces, in order. Text and JSON render the same events.
pub enum Event<'a> {
    /// A tree starts. `key` is the ROOT_ITEM key it was found by, if any.
    Section {
        title: &'a str,
        tree: u64,
        key: Option<Key>,
    },
    /// A block that was read; its problems come first (empty when valid).
    Block {
        node: &'a Node,
        problems: &'a [Problem],
    },
    /// Something could not be read at all.
    Error {
        message: &'a str,
        bytenr: Option<u64>,
        key: Option<Key>,
    },
    Totals {
        total_bytes: u64,
        bytes_used: u64,
        fsid: [u8; 16],
    },
}

pub trait Sink {
    fn event(&mut self, ev: Event<'_>) -> io::Result<()>;
    fn finish(&mut self) -> io::Result<()>;
}
