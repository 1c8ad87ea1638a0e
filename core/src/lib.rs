//! btrkit-core: a userspace Btrfs engine.
//!
//! Layers only call downward: `format` <- `io` <- `chunk` <- `tree` <- the rest.
//! Nothing in this crate prints or exits; every failure is an [`Error`].

// Unsafe code lives in io/ only (file.rs, copy.rs, host.rs: system
// calls), each block with a SAFETY comment.
#![warn(missing_docs)]

pub mod alloc;
pub mod balance;
pub mod check;
pub mod chunk;
pub mod csum;
pub mod device_change;
pub mod devices;
pub mod error;
pub mod format;
pub mod fs;
pub mod heatmap;
pub mod image;
pub mod io;
pub mod log;
pub mod mkfs;
pub mod mount_rw;
pub mod mount_view;
pub mod offline;
pub mod rescue;
pub mod resize;
pub mod restore;
pub mod send;
pub mod subvolume;
pub mod trans;
pub mod tree;
pub mod tune;
pub mod usage;
pub mod util;
pub mod workload;

pub use error::{CorruptKind, Error, Result};
