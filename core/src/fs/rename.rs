//! rename(2) and renameat2(2): the VFS's checks, btrfs_rename (a name
//! moves, replacing any target), btrfs_rename_exchange (two names trade
//! their inodes) and RENAME_WHITEOUT (a whiteout left at the old name).

use super::filesystem::{Filesystem, Loc};
use super::inode::*;
use super::names;
use super::ops::name_str;
use crate::format::consts::*;
use crate::{Error, Result};

/// renameat2: fail if the new name exists (<linux/fs.h>).
pub const RENAME_NOREPLACE: u32 = 1;
/// renameat2: swap the two names' inodes.
pub const RENAME_EXCHANGE: u32 = 2;
/// renameat2: leave a whiteout at the old name.
pub const RENAME_WHITEOUT: u32 = 4;

impl Filesystem {
    /// rename(2), replacing an existing target.
    pub fn rename(&mut self, odir: Loc, oname: &[u8], ndir: Loc, nname: &[u8]) -> Result<()> {
        self.rename2(odir, oname, ndir, nname, 0)
    }

    /// renameat2(2): RENAME_NOREPLACE fails with EEXIST on an existing
    /// target, RENAME_EXCHANGE swaps the two names' inodes, and
    /// RENAME_WHITEOUT leaves a whiteout (a character device 0:0) at the
    /// old name. The checks come in do_renameat2's order: flags, the
    /// source, the names, the target (ENOENT for an exchange, EEXIST
    /// with RENAME_NOREPLACE).
    pub fn rename2(
        &mut self,
        odir: Loc,
        oname: &[u8],
        ndir: Loc,
        nname: &[u8],
        flags: u32,
    ) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || (flags & RENAME_EXCHANGE != 0 && flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0)
        {
            return Err(Error::errno(libc::EINVAL, "rename: bad flags"));
        }
        let src = self.lookup(odir, oname)?.ok_or_else(|| {
            Error::errno(libc::ENOENT, format!("{}: no such file", name_str(oname)))
        })?;
        if nname.is_empty() || nname == b"." || nname == b".." {
            return Err(Error::errno(libc::EINVAL, "rename: bad target name"));
        }
        if nname.len() > BTRFS_NAME_LEN {
            return Err(Error::errno(libc::ENAMETOOLONG, "rename: name too long"));
        }
        let dst = self.lookup(ndir, nname)?;
        let mut op = Rename { fs: self };
        if flags & RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or_else(|| {
                Error::errno(libc::ENOENT, format!("{}: no such file", name_str(nname)))
            })?;
            return op.exchange(odir, oname, src, ndir, nname, dst);
        }
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Error::errno(
                libc::EEXIST,
                format!("{}: file exists", name_str(nname)),
            ));
        }
        op.replace(odir, oname, src, ndir, nname, dst)?;
        if flags & RENAME_WHITEOUT != 0 && !(odir == ndir && oname == nname) {
            // btrfs_whiteout_for_rename: a new inode (S_IFCHR, mode 0,
            // WHITEOUT_DEV) at the old name, in the same transaction.
            op.fs.mknod(odir, oname, S_IFCHR, 0)?;
        }
        Ok(())
    }
}

/// One rename in progress.
struct Rename<'a> {
    fs: &'a mut Filesystem,
}

impl Rename<'_> {
    /// Whether `anc` is `l` or one of its ancestors, walking `..` as the
    /// VFS's dentry tree does: from a subvolume's root to the directory
    /// holding its entry (its ROOT_BACKREF), from a placeholder to its
    /// directory, up to the mount's root.
    fn is_ancestor(&mut self, anc: Loc, mut l: Loc) -> Result<bool> {
        for _ in 0..4096 {
            if l == anc {
                return Ok(true);
            }
            if l == self.fs.root() {
                return Ok(false);
            }
            if l.is_placeholder() {
                l = Loc::new(l.subvol, l.parent);
                continue;
            }
            if l.ino == super::filesystem::ROOT_DIR {
                match self.fs.subvols().subvol_parent(l.subvol)? {
                    Some(p) => {
                        l = p;
                        continue;
                    }
                    None => return Ok(false),
                }
            }
            let links = names::links_of(&mut self.fs.store, l.subvol, l.ino)?;
            let Some(p) = links.first() else {
                return Ok(false);
            };
            l = Loc::new(l.subvol, p.parent);
        }
        Err(Error::corrupt_as(
            crate::CorruptKind::Structure,
            "directory chain does not reach the root",
            l.ino,
        ))
    }

    /// btrfs_rename: the source's name moves, replacing `dst`. The checks
    /// come in the kernel's order: the VFS's (the ancestor traps of
    /// lock_rename, then the types of source and target), then
    /// btrfs_rename's (nothing goes into a placeholder: EPERM; only a
    /// subvolume's entry moves across subvolumes: EXDEV; a placeholder
    /// does not move and a subvolume is not replaced: ENOTEMPTY; nor is a
    /// directory that has entries).
    fn replace(
        &mut self,
        odir: Loc,
        oname: &[u8],
        src: Loc,
        ndir: Loc,
        nname: &[u8],
        dst: Option<Loc>,
    ) -> Result<()> {
        let smode = self.fs.item(src)?.mode.get();
        if is_dir(smode) && self.is_ancestor(src, ndir)? {
            return Err(Error::errno(
                libc::EINVAL,
                "rename: a directory into itself",
            ));
        }
        if let Some(dst) = dst {
            // The same inode under both names changes nothing. A
            // placeholder is a new inode at every lookup: it is only the
            // same as itself under the same name.
            let same = if src.is_placeholder() {
                odir == ndir && oname == nname
            } else {
                dst == src
            };
            if same {
                return Ok(());
            }
            let dmode = self.fs.item(dst)?.mode.get();
            // The VFS refuses a target that is an ancestor of the source
            // (lock_rename's trap) before it compares the two types.
            if is_dir(dmode) && self.is_ancestor(dst, odir)? {
                return Err(Error::errno(
                    libc::ENOTEMPTY,
                    "rename: target is an ancestor of the source",
                ));
            }
            match (is_dir(smode), is_dir(dmode)) {
                (true, false) => {
                    return Err(Error::errno(
                        libc::ENOTDIR,
                        "rename: directory over a non-directory",
                    ))
                }
                (false, true) => {
                    return Err(Error::errno(libc::EISDIR, "rename: over a directory"))
                }
                _ => {}
            }
        }
        if ndir.is_placeholder() {
            return Err(Error::errno(
                libc::EPERM,
                "rename: into the empty directory standing for a subvolume",
            ));
        }
        // A subvolume's root directory, named by an entry of another tree.
        let src_subvol = src.ino == super::filesystem::ROOT_DIR && src.subvol != odir.subvol;
        if !src_subvol && odir.subvol != ndir.subvol {
            return Err(Error::errno(libc::EXDEV, "rename: across subvolumes"));
        }
        if src.is_placeholder() {
            return Err(Error::errno(
                libc::ENOTEMPTY,
                "rename: of the empty directory standing for a subvolume",
            ));
        }
        let mut replaced = None;
        if let Some(dst) = dst {
            if dst.ino == super::filesystem::ROOT_DIR && dst.subvol != ndir.subvol {
                return Err(Error::errno(libc::ENOTEMPTY, "rename: over a subvolume"));
            }
            if is_dir(smode) && !names::dir_is_empty(&mut self.fs.store, dst.subvol, dst.ino)? {
                return Err(Error::errno(
                    libc::ENOTEMPTY,
                    "rename: target directory not empty",
                ));
            }
            // Replacing a file's content by renaming a new file over it: the
            // new file's data is written back first (btrfs_rename's
            // filemap_flush), so the rename never reaches disk before it.
            if !dst.is_placeholder()
                && is_reg(smode)
                && is_reg(self.fs.item(dst)?.mode.get())
                && self.fs.rt(dst)?.i_size > 0
            {
                self.fs.writeback().inode(
                    src,
                    0,
                    u64::MAX,
                    super::writeback::Reason::Background,
                )?;
            }
            if dst.is_placeholder() {
                self.fs.subvols().remove_placeholder_entry(ndir, nname)?;
            } else {
                // The replaced inode lives until the rename returns (the
                // dentry holds it): the log, brought up to date with the new
                // name below, still finds it, and a name it held conflicts
                // with the renamed inode's (a directory moved out of it
                // makes the fsync commit, as btrfs_log_new_name's logging
                // of the conflicting inode decides).
                self.fs.open(dst)?;
                replaced = Some(dst);
                self.fs.drop_name(ndir, nname)?;
            }
        }
        let r = if src_subvol {
            self.fs
                .subvols()
                .rename_subvol_entry(odir, oname, ndir, nname, src.subvol)
        } else {
            self.inode(odir, oname, ndir, nname, src, smode)
        };
        match replaced {
            Some(dst) => r.and(self.fs.close(dst)),
            None => r,
        }
    }

    /// The rename of an inode (not a subvolume) once the target name is free.
    fn inode(
        &mut self,
        odir: Loc,
        oname: &[u8],
        ndir: Loc,
        nname: &[u8],
        src: Loc,
        smode: u32,
    ) -> Result<()> {
        // The old name goes without touching the link count.
        let idx_old =
            names::index_of_name(&mut self.fs.store, src.subvol, src.ino, odir.ino, oname)?;
        let t = self.fs.store.transid();
        if odir != ndir {
            self.fs.record_unlink_dir(odir, src, true)?;
        }
        self.fs.dcache.clear();
        names::remove_name(
            &mut self.fs.store,
            odir.subvol,
            odir.ino,
            inode_key(src.ino),
            oname,
            idx_old,
            t,
        )?;
        self.fs.add_link(ndir, nname, src, smode)?;
        self.fs.stamp(odir, true, true)?;
        self.fs.stamp(src, true, false)?;
        self.fs
            .log_new_name(src, Some((odir, oname.to_vec(), idx_old)), ndir)?;
        Ok(())
    }

    /// btrfs_rename_exchange: `src` (named `oname` in `odir`) and `dst`
    /// (named `nname` in `ndir`) trade names. Both may be of any type, so
    /// the only VFS checks are the ancestor traps (EINVAL either way).
    /// Across subvolumes only two subvolumes' entries trade (EXDEV
    /// otherwise); the log cannot express a subvolume's entry, so one of
    /// them makes the next fsync commit. Both new indexes are taken before
    /// either name moves (the new directory's first), the old names go,
    /// the new ones come, and the log hears of both inodes' new names.
    fn exchange(
        &mut self,
        odir: Loc,
        oname: &[u8],
        src: Loc,
        ndir: Loc,
        nname: &[u8],
        dst: Loc,
    ) -> Result<()> {
        let smode = self.fs.item(src)?.mode.get();
        let dmode = self.fs.item(dst)?.mode.get();
        if (is_dir(smode) && self.is_ancestor(src, ndir)?)
            || (is_dir(dmode) && self.is_ancestor(dst, odir)?)
        {
            return Err(Error::errno(
                libc::EINVAL,
                "rename: a directory exchanged with one of its descendants",
            ));
        }
        // The same inode under both names changes nothing (vfs_rename).
        let same = if src.is_placeholder() || dst.is_placeholder() {
            odir == ndir && oname == nname
        } else {
            src == dst
        };
        if same {
            return Ok(());
        }
        let s_sub = src.ino == super::filesystem::ROOT_DIR && src.subvol != odir.subvol;
        let d_sub = dst.ino == super::filesystem::ROOT_DIR && dst.subvol != ndir.subvol;
        if odir.subvol != ndir.subvol && !(s_sub && d_sub) {
            return Err(Error::errno(libc::EXDEV, "rename: across subvolumes"));
        }
        // The kernel would fail the transaction on a placeholder (it has
        // no inode ref to remove): refused before anything changes.
        if src.is_placeholder() || dst.is_placeholder() {
            return Err(Error::errno(
                libc::ENOTEMPTY,
                "rename: of the empty directory standing for a subvolume",
            ));
        }
        let old_idx = self.fs.next_index(ndir)?;
        let new_idx = self.fs.next_index(odir)?;
        let t = self.fs.store.transid();
        if odir != ndir {
            if !s_sub {
                self.fs.record_unlink_dir(odir, src, true)?;
            }
            if !d_sub {
                self.fs.record_unlink_dir(ndir, dst, true)?;
            }
        }
        self.fs.dcache.clear();
        let s_old = self.take_name(odir, oname, src, s_sub)?;
        let d_old = self.take_name(ndir, nname, dst, d_sub)?;
        self.give_name(ndir, nname, src, smode, s_sub, old_idx)?;
        self.give_name(odir, oname, dst, dmode, d_sub, new_idx)?;
        self.fs.stamp(odir, true, true)?;
        if ndir != odir {
            self.fs.stamp(ndir, true, true)?;
        }
        if s_sub || d_sub {
            self.fs.log.as_mut().force_full_commit(t);
        }
        if !s_sub {
            self.fs.stamp(src, true, false)?;
        }
        if !d_sub {
            self.fs.stamp(dst, true, false)?;
        }
        if let Some(idx) = s_old {
            self.fs
                .log_new_name(src, Some((odir, oname.to_vec(), idx)), ndir)?;
        }
        if let Some(idx) = d_old {
            self.fs
                .log_new_name(dst, Some((ndir, nname.to_vec(), idx)), odir)?;
        }
        Ok(())
    }

    /// __btrfs_unlink_inode without the link count (or btrfs_unlink_subvol
    /// for a subvolume's entry): `name` leaves `dir`. The index the name
    /// had, for an inode.
    fn take_name(&mut self, dir: Loc, name: &[u8], l: Loc, subvol: bool) -> Result<Option<u64>> {
        if subvol {
            self.fs.subvols().unlink_subvol_entry(dir, name)?;
            return Ok(None);
        }
        let idx = names::index_of_name(&mut self.fs.store, l.subvol, l.ino, dir.ino, name)?;
        let t = self.fs.store.transid();
        names::remove_name(
            &mut self.fs.store,
            dir.subvol,
            dir.ino,
            inode_key(l.ino),
            name,
            idx,
            t,
        )?;
        Ok(Some(idx))
    }

    /// btrfs_add_link at index `idx`, for an inode or a subvolume.
    fn give_name(
        &mut self,
        dir: Loc,
        name: &[u8],
        l: Loc,
        mode: u32,
        subvol: bool,
        idx: u64,
    ) -> Result<()> {
        if subvol {
            return self
                .fs
                .subvols()
                .link_subvol_entry(dir, name, l.subvol, idx);
        }
        self.fs.add_link_at(dir, name, l, mode, idx)
    }
}
