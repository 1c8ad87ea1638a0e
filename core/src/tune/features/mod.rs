//! Feature conversions, each one transaction of the engine ending in one
//! commit: an interruption at any write leaves the filesystem as it was
//! or fully converted (the commit's superblock write is the switch), so
//! none of them needs a superblock flag of its own.
//!
//! - [`bgt`]: block group items into the block group tree and back;
//! - [`fst`]: the free space tree built, the v1 space cache dropped;
//! - [`incompat`]: no-holes and extended refs (flags only) and skinny
//!   metadata (every tree block's extent item rewritten);
//! - [`quota`]: full qgroups (counted by a rescan in the same
//!   transaction) and simple quotas, on and off.
//!
//! Each step opens the filesystem afresh (an earlier step of the same
//! run committed), finds out whether there is anything to do (else
//! [`Outcome::AlreadySo`](super::Outcome::AlreadySo), nothing written),
//! checks its preconditions before the first change (a refusal writes
//! nothing) and commits once.

pub mod bgt;
pub mod fst;
pub mod incompat;
pub mod quota;

pub use bgt::block_group_tree;
pub use fst::free_space_tree;
pub use incompat::{extref, no_holes, skinny_metadata};
pub use quota::quota;

use super::{Ctx, Outcome, Step};
use crate::devices::{Devices, Single};
use crate::image::OpenOptions;
use crate::trans::Store;
use crate::{Error, Result};

/// A transaction on every device of the filesystem. A log to replay is
/// refused (the guard said so already; a store never opens with one).
pub(crate) fn open_store(ctx: &Ctx) -> Result<Store> {
    let opened = Devices::new(ctx.devs.clone()).open(
        OpenOptions {
            writable: true,
            ..Default::default()
        },
        Single::AsSet,
    )?;
    if opened.img.sb.log_root.get() != 0 {
        return Err(Error::Unsupported(
            "the filesystem has an fsync log to replay: run btrkit-replay first".into(),
        ));
    }
    Store::from_image(opened.img)
}

/// A step that changed the filesystem.
pub(crate) fn done(op: &'static str, lines: Vec<String>) -> Step {
    Step {
        op,
        outcome: Outcome::Done,
        lines,
    }
}
