//! Superblock fields alone: the label and the seeding flag.

use super::{Ctx, Step};
use crate::{Error, Result};

/// `-L LABEL`.
pub fn label(_ctx: &mut Ctx, _l: &str) -> Result<Step> {
    Err(Error::Unsupported("-L is not implemented yet".into()))
}
/// `-S 0|1`.
pub fn seeding(_ctx: &mut Ctx, _on: bool) -> Result<Step> {
    Err(Error::Unsupported("-S is not implemented yet".into()))
}
