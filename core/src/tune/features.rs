//! Feature conversions: block group tree, free space tree, no-holes,
//! extended refs, skinny metadata, quotas.

use super::{Ctx, Step};
use crate::{Error, Result};

/// `--convert-to-block-group-tree` (`on`) or `--convert-from-block-group-tree`.
pub fn block_group_tree(_ctx: &mut Ctx, _on: bool) -> Result<Step> {
    Err(Error::Unsupported(
        "block group tree conversion is not implemented yet".into(),
    ))
}
/// `--convert-to-free-space-tree`.
pub fn free_space_tree(_ctx: &mut Ctx) -> Result<Step> {
    Err(Error::Unsupported(
        "free space tree conversion is not implemented yet".into(),
    ))
}
/// `-n`.
pub fn no_holes(_ctx: &mut Ctx) -> Result<Step> {
    Err(Error::Unsupported("-n is not implemented yet".into()))
}
/// `-r`.
pub fn extref(_ctx: &mut Ctx) -> Result<Step> {
    Err(Error::Unsupported("-r is not implemented yet".into()))
}
/// `-x`.
pub fn skinny_metadata(_ctx: &mut Ctx) -> Result<Step> {
    Err(Error::Unsupported("-x is not implemented yet".into()))
}
/// Quotas on or off.
pub fn quota(_ctx: &mut Ctx, _q: super::QuotaChange) -> Result<Step> {
    Err(Error::Unsupported(
        "quota changes are not implemented yet".into(),
    ))
}
