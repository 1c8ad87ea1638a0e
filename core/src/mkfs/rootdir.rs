//! Populating a new filesystem from a directory (`--rootdir`).

use crate::trans::Fs;
use crate::{Error, Result};
use std::path::Path;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RootdirStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub bytes: u64,
}

pub fn populate(_fs: &mut Fs, _dir: &Path, _progress: &mut dyn FnMut(u64, u64)) -> Result<RootdirStats> {
    Err(Error::Unsupported("--rootdir is not implemented yet".into()))
}
