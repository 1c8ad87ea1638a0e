//! Subvolumes and snapshots, the default subvolume, quotas.

use super::filesystem::{Filesystem, Loc};
use crate::{Error, Result};

impl Filesystem {
    /// Subvolumes deleted in this transaction lose their trees before the
    /// commit (the kernel's cleaner does it after; the result is the same
    /// once it has run).
    pub(super) fn finish_deleted_subvols(&mut self) -> Result<()> {
        Ok(())
    }

    /// rmdir of an empty subvolume's entry.
    pub(super) fn delete_subvol_entry(&mut self, _dir: Loc, _name: &[u8]) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP, "subvolume deletion is not built yet"))
    }
}

impl Filesystem {
    pub fn subvol_create(&mut self, _dir: Loc, _name: &[u8]) -> Result<Loc> {
        Err(Error::errno(libc::EOPNOTSUPP, "subvolume creation is not built yet"))
    }
    pub fn snapshot(&mut self, _src: Loc, _dir: Loc, _name: &[u8]) -> Result<Loc> {
        Err(Error::errno(libc::EOPNOTSUPP, "snapshots are not built yet"))
    }
    pub fn subvol_delete(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        self.delete_subvol_entry(dir, name)
    }
    pub fn set_default_subvol(&mut self, _l: Loc) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP, "set-default is not built yet"))
    }
    pub fn quota_enable(&mut self) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP, "quota enable is not built yet"))
    }
    pub fn balance_metadata(&mut self) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP, "balance is not built yet"))
    }
}
