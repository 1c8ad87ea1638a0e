//! `--csum ALGO`: every data and metadata checksum converted.

use super::{Ctx, Step};
use crate::{Error, Result};

/// Convert every checksum to `to`.
pub fn convert(_ctx: &mut Ctx, _to: crate::csum::CsumType) -> Result<Step> {
    Err(Error::Unsupported("--csum is not implemented yet".into()))
}
