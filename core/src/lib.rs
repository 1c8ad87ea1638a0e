//! btrkit-core: a userspace Btrfs engine.
//!
//! Layers only call downward: `format` <- `io` <- `chunk` <- `tree` <- the rest.
//! Nothing in this crate prints or exits; every failure is an [`Error`].

pub mod csum;
pub mod error;
pub mod format;
pub mod io;
pub mod chunk;
pub mod tree;
pub mod alloc;
pub mod trans;
pub mod mkfs;
pub mod fs;
pub mod log;
pub mod image;
pub mod check;
pub mod workload;
pub mod util;

pub use error::{Error, Result};
