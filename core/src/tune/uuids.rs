//! The metadata UUID (`-m`, `-M`) and new subvolume UUIDs.

use super::{Ctx, Step};
use crate::{Error, Result};

/// `-m` / `-M UUID`.
pub fn metadata_uuid(_ctx: &mut Ctx, _u: super::NewUuid) -> Result<Step> {
    Err(Error::Unsupported("-m/-M is not implemented yet".into()))
}
/// New UUIDs for every subvolume, the UUID tree rebuilt.
pub fn subvol_uuids(_ctx: &mut Ctx) -> Result<Step> {
    Err(Error::Unsupported(
        "new subvolume UUIDs are not implemented yet".into(),
    ))
}
