//! `-u` / `-U UUID`: a new fsid everywhere.

use super::{Ctx, Step};
use crate::{Error, Result};

/// `-u` / `-U UUID`.
pub fn change(_ctx: &mut Ctx, _u: super::NewUuid) -> Result<Step> {
    Err(Error::Unsupported("-u/-U is not implemented yet".into()))
}
