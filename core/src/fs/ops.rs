//! Namespace operations: create, mkdir, mknod, symlink, link, unlink,
//! rmdir, rename, O_TMPFILE, xattrs, chmod, chown, utimes, stat, readdir.
//! Errors are the kernel's (EEXIST, ENOENT, ENOTEMPTY, EISDIR, ...).

use super::filesystem::{Filesystem, Loc};
use super::inode::*;
use super::names;
use super::props::Xattrs;
use crate::format::consts::*;
use crate::format::key::Key;
use crate::trans::TreeId;
use crate::{Error, Result};

/// Most links an inode has (BTRFS_LINK_MAX).
pub const LINK_MAX: u32 = 65535;
/// XATTR_NAME_MAX and XATTR_SIZE_MAX.
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;

/// What stat(2) shows.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stat {
    /// Subvolume (root objectid) holding the inode.
    pub subvol: u64,
    /// Inode number within `subvol`.
    pub ino: u64,
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    /// Number of names (hard links).
    pub nlink: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Size in bytes: the in-memory i_size for regular files (including
    /// data not yet written back), the inode item's size otherwise.
    pub size: u64,
    /// 512-byte blocks: bytes on disk plus dirty data.
    pub blocks: u64,
    /// Device (major, minor) of a character or block device node.
    pub rdev: (u32, u32),
    /// Access time (seconds, negative before 1970; nanoseconds, below
    /// 10^9), as [`Timespec::get`](crate::format::inode::Timespec::get)
    /// reads it.
    pub atime: (i64, u32),
    /// Modification time, as `atime`.
    pub mtime: (i64, u32),
    /// Change time, as `atime`.
    pub ctime: (i64, u32),
    /// Creation time (the inode item's otime), as `atime`.
    pub otime: (i64, u32),
    /// Transid in which the inode was created (`st_gen`, the inode item's generation).
    pub generation: u64,
    /// Inode flags (BTRFS_INODE_*: NODATACOW, NODATASUM, COMPRESS, ...).
    pub flags: u64,
}

impl Stat {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        is_dir(self.mode)
    }
}

pub(super) fn name_str(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

impl Filesystem {
    /// Make a new inode under `dir` (not yet linked): number, item, flags
    /// inherited as the kernel's btrfs_inherit_iflags and mount options.
    fn new_inode(&mut self, dir: Loc, mode: u32, rdev: u64) -> Result<Loc> {
        let ino = self.alloc_ino(dir.subvol)?;
        let now = self.clock.now();
        let transid = self.store.transid();
        let parent = self.item(dir)?;
        let (uid, gid, mode) = self
            .creds
            .new_owner(parent.mode.get(), parent.gid.get(), mode);
        // posix_acl_create: the directory's default ACL, or the umask.
        let dir_default = match super::xattr::get_xattr(
            &mut self.store,
            dir.subvol,
            dir.ino,
            super::acl::ACL_DEFAULT,
        )? {
            Some(v) => super::acl::parse(&v).ok().flatten(),
            None => None,
        };
        let (mode, access_acl, default_acl) =
            super::acl::inherit(dir_default, mode, self.creds.umask);
        let mut it = new_inode_item(mode, uid, gid, rdev, now, transid);
        let dflags = parent.flags.get();
        let mut flags = 0u64;
        if dflags & BTRFS_INODE_NOCOMPRESS != 0 {
            flags |= BTRFS_INODE_NOCOMPRESS;
        } else if dflags & BTRFS_INODE_COMPRESS != 0 {
            flags |= BTRFS_INODE_COMPRESS;
        }
        if dflags & BTRFS_INODE_NODATACOW != 0 {
            flags |= BTRFS_INODE_NODATACOW;
            if is_reg(mode) {
                flags |= BTRFS_INODE_NODATASUM;
            }
        }
        if is_reg(mode) {
            if !self.opts.datasum {
                flags |= BTRFS_INODE_NODATASUM;
            }
            if !self.opts.datacow {
                flags |= BTRFS_INODE_NODATACOW | BTRFS_INODE_NODATASUM;
            }
        }
        it.flags.set(flags);
        let l = Loc::new(dir.subvol, ino);
        // Its runtime state first: there is no item to load it from.
        self.new_rt(l, 0);
        if let Err(e) = self.put_item(l, &it) {
            self.forget_inode(l);
            return Err(e);
        }
        for (name, acl) in [
            (super::acl::ACL_ACCESS, access_acl),
            (super::acl::ACL_DEFAULT, default_acl),
        ] {
            if let Some(acl) = acl {
                super::xattr::set_xattr(
                    &mut self.store,
                    l.subvol,
                    l.ino,
                    name,
                    &acl.encode(),
                    transid,
                )?;
            }
        }
        self.xattrs().inherit_props(l, dir)?;
        Ok(l)
    }

    /// Link `target` into `dir` as `name` at the directory's next index.
    pub(super) fn add_link(&mut self, dir: Loc, name: &[u8], target: Loc, mode: u32) -> Result<()> {
        let idx = self.next_index(dir)?;
        self.add_link_at(dir, name, target, mode, idx)
    }

    /// Link `target` into `dir` as `name` at index `idx`, taken from the
    /// directory's counter by the caller (a rename exchange takes both
    /// indexes before either name moves, as btrfs_rename_exchange).
    pub(super) fn add_link_at(
        &mut self,
        dir: Loc,
        name: &[u8],
        target: Loc,
        mode: u32,
        idx: u64,
    ) -> Result<()> {
        let t = self.store.transid();
        let now = self.clock.now();
        // The directory's times move with its size, in one item change
        // (what stamp() would make a second one).
        names::add_name_with(
            &mut self.store,
            dir.subvol,
            dir.ino,
            inode_key(target.ino),
            name,
            ftype_of_mode(mode),
            idx,
            t,
            |it| {
                it.ctime = now;
                it.mtime = now;
                it.sequence.set(it.sequence.get() + 1);
            },
        )?;
        self.mark_changed(dir);
        self.touch_trans(dir)
    }

    /// The checks before a new name goes into `dir`, in the VFS's order.
    /// `in_placeholder` is what the operation fails with in the empty
    /// placeholder of a subvolume, whose inode has none of the directory
    /// operations (open(O_CREAT) EACCES, mkdir/mknod/symlink/link EPERM).
    fn check_new_name(&mut self, dir: Loc, name: &[u8], in_placeholder: i32) -> Result<()> {
        if name.is_empty() || name == b"." || name == b".." {
            return Err(Error::errno(
                libc::EEXIST,
                format!("{}: exists", name_str(name)),
            ));
        }
        if name.len() > BTRFS_NAME_LEN {
            return Err(Error::errno(
                libc::ENAMETOOLONG,
                format!("{}: name too long", name_str(name)),
            ));
        }
        if !is_dir(self.item(dir)?.mode.get()) {
            return Err(Error::errno(libc::ENOTDIR, "parent is not a directory"));
        }
        if dir.is_placeholder() {
            return Err(Error::errno(
                in_placeholder,
                format!(
                    "{}: the empty directory standing for a subvolume takes no entries",
                    name_str(name)
                ),
            ));
        }
        if self.lookup(dir, name)?.is_some() {
            return Err(Error::errno(
                libc::EEXIST,
                format!("{}: file exists", name_str(name)),
            ));
        }
        Ok(())
    }

    /// open(O_CREAT): the existing file, or a new regular file.
    pub fn create(&mut self, dir: Loc, name: &[u8], mode: u32) -> Result<Loc> {
        if let Some(l) = self.lookup(dir, name)? {
            if is_dir(self.item(l)?.mode.get()) {
                return Err(Error::errno(
                    libc::EISDIR,
                    format!("{}: is a directory", name_str(name)),
                ));
            }
            return Ok(l);
        }
        self.check_new_name(dir, name, libc::EACCES)?;
        self.make_node(dir, name, S_IFREG | (mode & 0o7777), 0)
    }

    /// mknod(2) (regular files, fifos, devices, sockets).
    pub fn mknod(&mut self, dir: Loc, name: &[u8], mode: u32, rdev: u64) -> Result<Loc> {
        self.check_new_name(dir, name, libc::EPERM)?;
        self.make_node(dir, name, mode, rdev)
    }

    /// A new inode linked as `name`, the name checked already.
    fn make_node(&mut self, dir: Loc, name: &[u8], mode: u32, rdev: u64) -> Result<Loc> {
        let l = self.new_inode(dir, mode, rdev)?;
        self.add_link(dir, name, l, mode)?;
        // d_instantiate: the new name is in the dentry cache.
        self.dcache.insert(dir, name, l, mode);
        Ok(l)
    }

    /// mkdir(2): a new directory `name` in `dir` with permission bits `mode`;
    /// its DIR_INDEX counter starts at 2 as the kernel's.
    pub fn mkdir(&mut self, dir: Loc, name: &[u8], mode: u32) -> Result<Loc> {
        self.check_new_name(dir, name, libc::EPERM)?;
        let m = S_IFDIR | (mode & 0o7777);
        let l = self.new_inode(dir, m, 0)?;
        self.rt(l)?.index_cnt = Some(2);
        self.add_link(dir, name, l, m)?;
        self.dcache.insert(dir, name, l, m);
        Ok(l)
    }

    /// symlink(2): the target is the file's inline data.
    pub fn symlink(&mut self, dir: Loc, name: &[u8], target: &[u8]) -> Result<Loc> {
        self.check_new_name(dir, name, libc::EPERM)?;
        let max = self.store.nodesize() as usize
            - crate::format::header::HEADER_SIZE
            - crate::format::header::ITEM_SIZE
            - crate::format::file_extent::FILE_EXTENT_INLINE_DATA_START;
        if target.is_empty() || target.len() > max.min(4095) {
            return Err(Error::errno(
                libc::ENAMETOOLONG,
                format!("symlink target of {} bytes", target.len()),
            ));
        }
        let m = S_IFLNK | 0o777;
        let l = self.new_inode(dir, m, 0)?;
        super::data::write_inline(
            &mut self.store,
            l.subvol,
            l.ino,
            target.len() as u64,
            BTRFS_COMPRESS_NONE,
            target,
        )?;
        let mut it = self.item(l)?;
        it.size.set(target.len() as u64);
        it.nbytes.set(target.len() as u64);
        self.put_item(l, &it)?;
        let rt = self.rt(l)?;
        rt.i_size = target.len() as u64;
        rt.disk_i_size = target.len() as u64;
        self.add_link(dir, name, l, m)?;
        Ok(l)
    }

    /// link(2). The checks in the kernel's order: the new name first (the
    /// VFS creates its dentry: EEXIST), then vfs_link's (no directories:
    /// EPERM), then btrfs_link's (EXDEV across subvolumes, EMLINK).
    pub fn link(&mut self, target: Loc, dir: Loc, name: &[u8]) -> Result<()> {
        self.check_new_name(dir, name, libc::EPERM)?;
        let it = self.item(target)?;
        if is_dir(it.mode.get()) {
            return Err(Error::errno(
                libc::EPERM,
                "link: hard links to directories are not allowed",
            ));
        }
        if target.subvol != dir.subvol {
            return Err(Error::errno(libc::EXDEV, "link: across subvolumes"));
        }
        if it.nlink.get() >= LINK_MAX {
            return Err(Error::errno(libc::EMLINK, "link: too many links"));
        }
        self.add_link(dir, name, target, it.mode.get())?;
        let mut it = self.item(target)?;
        it.nlink.set(it.nlink.get() + 1);
        self.put_item(target, &it)?;
        self.stamp(target, true, false)?;
        self.log_new_name(target, None, dir)
    }

    /// Remove one name; an inode left without names goes now, or at its
    /// last close (an orphan item keeps it until then). A log holding the
    /// name loses it before the next log sync (__btrfs_unlink_inode's log
    /// hooks).
    pub(super) fn drop_name(&mut self, dir: Loc, name: &[u8]) -> Result<Loc> {
        let now = self.clock.now();
        self.dcache.clear();
        let (ino, nlink, index) = names::unlink(&mut self.store, dir.subvol, dir.ino, name, now)?;
        let l = Loc::new(dir.subvol, ino);
        self.touch_trans(dir)?;
        self.touch_trans(l)?;
        if self.store.log_trees().has_log(dir.subvol) {
            self.name_changes.push(super::fsync::NameChange::Unlink {
                dir,
                name: name.to_vec(),
                index,
                inode: l,
            });
        }
        if nlink == 0 {
            let open = match self.rt_if_loaded(l) {
                Some(r) if r.opens > 0 => {
                    r.unlinked_from = dir.ino;
                    true
                }
                _ => false,
            };
            if open {
                self.add_orphan(l)?;
            } else {
                self.delete_inode(l)?;
            }
        }
        Ok(l)
    }

    pub(super) fn add_orphan(&mut self, l: Loc) -> Result<()> {
        let k = Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, l.ino);
        self.store.update_item(TreeId::Tree(l.subvol), &k, &[])
    }

    /// unlink(2).
    pub fn unlink(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        let l = self.lookup(dir, name)?.ok_or_else(|| {
            Error::errno(libc::ENOENT, format!("{}: no such file", name_str(name)))
        })?;
        if is_dir(self.item(l)?.mode.get()) {
            return Err(Error::errno(
                libc::EISDIR,
                format!("{}: is a directory", name_str(name)),
            ));
        }
        // btrfs_record_unlink_dir: a later fsync of the inode logs its
        // old parents.
        let t = self.store.transid();
        self.rt(l)?.last_unlink_trans = t;
        self.drop_name(dir, name)?;
        self.fsync_path().log_name_changes();
        Ok(())
    }

    /// rmdir(2).
    pub fn rmdir(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        let l = self.lookup(dir, name)?.ok_or_else(|| {
            Error::errno(
                libc::ENOENT,
                format!("{}: no such directory", name_str(name)),
            )
        })?;
        if !is_dir(self.item(l)?.mode.get()) {
            return Err(Error::errno(
                libc::ENOTDIR,
                format!("{}: not a directory", name_str(name)),
            ));
        }
        if !names::dir_is_empty(&mut self.store, l.subvol, l.ino)? {
            return Err(Error::errno(
                libc::ENOTEMPTY,
                format!("{}: directory not empty", name_str(name)),
            ));
        }
        if l.is_placeholder() {
            // btrfs_rmdir lets the placeholder go: only its entry is
            // removed, the subvolume it names is not touched.
            self.subvols().remove_placeholder_entry(dir, name)?;
            return Ok(());
        }
        if l.subvol != dir.subvol {
            // An empty subvolume: rmdir deletes it, as the kernel allows.
            return self.subvols().delete_subvol_entry(dir, name);
        }
        // A directory that lost a subvolume (or passed such a loss up)
        // passes it to its parent: its deletion cannot be logged.
        let t = self.store.transid();
        if self.rt(l)?.last_unlink_trans >= t {
            self.rt(dir)?.last_unlink_trans = t;
        }
        self.drop_name(dir, name)?;
        self.fsync_path().log_name_changes();
        Ok(())
    }

    /// btrfs_record_unlink_dir: the inode lost a name in this transaction;
    /// for a rename out of `dir` that the log cannot follow (neither the
    /// directory nor the inode is in it), the directory is marked too, so
    /// fully logging it commits instead.
    pub(super) fn record_unlink_dir(&mut self, dir: Loc, l: Loc, for_rename: bool) -> Result<()> {
        let t = self.store.transid();
        self.rt(l)?.last_unlink_trans = t;
        if !for_rename || self.inode_logged(dir)? || self.inode_logged(l)? {
            return Ok(());
        }
        self.rt(dir)?.last_unlink_trans = t;
        Ok(())
    }

    /// btrfs_log_new_name's bookkeeping: the inode's names are copied again
    /// at its next logging, its old parents are logged, and a log that
    /// holds it (or the old directory) is brought up to date before the
    /// next log sync.
    pub(super) fn log_new_name(
        &mut self,
        l: Loc,
        old: Option<(Loc, Vec<u8>, u64)>,
        parent: Loc,
    ) -> Result<()> {
        let t = self.store.transid();
        let dir = is_dir(self.item(l)?.mode.get());
        let rt = self.rt(l)?;
        rt.copy_everything = true;
        if !dir {
            rt.last_unlink_trans = t;
        }
        if self.store.log_trees().has_log(l.subvol) {
            self.name_changes.push(super::fsync::NameChange::NewName {
                inode: l,
                old,
                parent,
            });
        }
        self.fsync_path().log_name_changes();
        Ok(())
    }

    /// open(O_TMPFILE): an open inode with no name (an orphan until closed).
    pub fn tmpfile(&mut self, dir: Loc, mode: u32) -> Result<Loc> {
        if !is_dir(self.item(dir)?.mode.get()) {
            return Err(Error::errno(libc::ENOTDIR, "tmpfile: not a directory"));
        }
        if dir.is_placeholder() {
            return Err(Error::errno(
                libc::EOPNOTSUPP,
                "tmpfile: in the empty directory standing for a subvolume",
            ));
        }
        let l = self.new_inode(dir, S_IFREG | (mode & 0o7777), 0)?;
        let mut it = self.item(l)?;
        it.nlink.set(0);
        self.put_item(l, &it)?;
        self.open(l)?;
        self.add_orphan(l)?;
        Ok(l)
    }

    /// chmod(2). chmod, chown and utimes of a placeholder succeed and
    /// change nothing one can see: the kernel changes only the in-memory
    /// placeholder (simple_setattr), and its dentry is dropped as the call
    /// returns (btrfs_dentry_delete), so the next lookup makes a new one.
    pub fn chmod(&mut self, l: Loc, mode: u32) -> Result<()> {
        if l.is_placeholder() {
            return Ok(());
        }
        let mut it = self.item(l)?;
        it.mode.set((it.mode.get() & S_IFMT) | (mode & 0o7777));
        self.put_item(l, &it)?;
        // posix_acl_chmod: an access ACL follows the new mode.
        let name = super::acl::ACL_ACCESS;
        if let Some(v) = super::xattr::get_xattr(&mut self.store, l.subvol, l.ino, name)? {
            if let Ok(Some(mut acl)) = super::acl::parse(&v) {
                acl.chmod(mode);
                let t = self.store.transid();
                super::xattr::set_xattr(&mut self.store, l.subvol, l.ino, name, &acl.encode(), t)?;
                self.rt(l)?.copy_everything = true;
            }
        }
        self.stamp(l, true, false)
    }

    /// chown(2)/lchown(2): a regular file loses set-user-id (and
    /// set-group-id with group execute), as Linux clears them.
    pub fn chown(&mut self, l: Loc, uid: u32, gid: u32) -> Result<()> {
        if l.is_placeholder() {
            return Ok(());
        }
        let mut it = self.item(l)?;
        it.uid.set(uid);
        it.gid.set(gid);
        let m = it.mode.get();
        if is_reg(m) {
            let mut nm = m & !0o4000;
            if m & 0o010 != 0 {
                nm &= !0o2000;
            }
            it.mode.set(nm);
        }
        self.put_item(l, &it)?;
        self.stamp(l, true, false)
    }

    /// utimensat(2) without following a link: access and modification
    /// times as given, or both now (`None`, utimes(NULL)); the change time
    /// now.
    pub fn set_times(&mut self, l: Loc, times: Option<((i64, u32), (i64, u32))>) -> Result<()> {
        if l.is_placeholder() {
            return Ok(());
        }
        let (atime, mtime) = match times {
            Some((a, m)) => (
                crate::format::inode::Timespec::new(a.0, a.1),
                crate::format::inode::Timespec::new(m.0, m.1),
            ),
            None => (self.clock.now(), self.clock.now()),
        };
        // The in-memory times a write left for its writeback are replaced.
        if times.is_some() {
            self.rt(l)?.pending_times = None;
        }
        let mut it = self.item(l)?;
        it.atime = atime;
        it.mtime = mtime;
        self.put_item(l, &it)?;
        self.stamp(l, true, false)
    }

    /// stat(2) (lstat: of the inode itself).
    pub fn stat(&mut self, l: Loc) -> Result<Stat> {
        let it = self.item(l)?;
        let m = it.mode.get();
        let (size, dirty) = if is_reg(m) {
            let rt = self.rt(l)?;
            (rt.i_size, rt.pages.dirty_bytes())
        } else {
            (it.size.get(), 0)
        };
        Ok(Stat {
            subvol: l.subvol,
            ino: l.ino,
            mode: m,
            nlink: it.nlink.get(),
            uid: it.uid.get(),
            gid: it.gid.get(),
            size,
            // nbytes comes from disk: saturating, never a wrap or a panic.
            blocks: it.nbytes.get().saturating_add(dirty).div_ceil(512),
            rdev: decode_dev(it.rdev.get()),
            atime: it.atime.get(),
            mtime: it.mtime.get(),
            ctime: it.ctime.get(),
            otime: it.otime.get(),
            generation: it.generation.get(),
            flags: it.flags.get(),
        })
    }

    /// The entries of a directory, in index order: (name, inode, type).
    pub fn readdir(&mut self, l: Loc) -> Result<Vec<(Vec<u8>, Loc, u8)>> {
        if !is_dir(self.item(l)?.mode.get()) {
            return Err(Error::errno(libc::ENOTDIR, "readdir: not a directory"));
        }
        let entries = names::list_dir(&mut self.store, l.subvol, l.ino)?;
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let loc = self.entry_target(l, &e.name, &e.location)?;
            out.push((e.name, loc, e.ftype));
        }
        Ok(out)
    }
}

/// readdir(2) from a dir index on: at most `max` entries of directory `l`
/// with index `from` or above, each with its index (the offset a reader
/// resumes from), name, inode and type.
pub fn readdir_from(
    fs: &mut Filesystem,
    l: Loc,
    from: u64,
    max: usize,
) -> Result<Vec<(u64, Vec<u8>, Loc, u8)>> {
    if !is_dir(fs.item(l)?.mode.get()) {
        return Err(Error::errno(libc::ENOTDIR, "readdir: not a directory"));
    }
    let entries = names::list_dir_from(&mut fs.store, l.subvol, l.ino, from, max)?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let loc = fs.entry_target(l, &e.name, &e.location)?;
        out.push((e.index, e.name, loc, e.ftype));
    }
    Ok(out)
}

impl Xattrs<'_> {
    /// setxattr(2) (creating or replacing).
    pub fn set_xattr(&mut self, l: Loc, name: &[u8], value: &[u8]) -> Result<()> {
        self.check_xattr_name(l, name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::errno(libc::E2BIG, "setxattr: value too large"));
        }
        let max = self.fs.store.nodesize() as usize
            - crate::format::header::HEADER_SIZE
            - crate::format::header::ITEM_SIZE
            - crate::format::dir::DIR_ITEM_SIZE;
        if name.len() + value.len() > max {
            return Err(Error::errno(
                libc::ENOSPC,
                "setxattr: name and value do not fit in a leaf",
            ));
        }
        if name.starts_with(b"btrfs.") {
            return self.fs.xattrs().set_prop(l, name, Some(value), false);
        }
        if name == super::acl::ACL_ACCESS || name == super::acl::ACL_DEFAULT {
            return self.set_acl(l, name, value);
        }
        let t = self.fs.store.transid();
        super::xattr::set_xattr(&mut self.fs.store, l.subvol, l.ino, name, value, t)?;
        self.fs.rt(l)?.copy_everything = true;
        self.fs.stamp(l, true, false)
    }

    /// removexattr(2).
    pub fn remove_xattr(&mut self, l: Loc, name: &[u8]) -> Result<()> {
        self.check_xattr_name(l, name)?;
        if name.starts_with(b"btrfs.") {
            return self.fs.xattrs().set_prop(l, name, None, true);
        }
        if !super::xattr::remove_xattr(&mut self.fs.store, l.subvol, l.ino, name)? {
            return Err(Error::errno(
                libc::ENODATA,
                format!("removexattr {}: no such attribute", name_str(name)),
            ));
        }
        self.fs.rt(l)?.copy_everything = true;
        self.fs.stamp(l, true, false)
    }

    /// getxattr(2): the value of `name`, `None` when it is not set;
    /// EOPNOTSUPP in a subvolume placeholder.
    pub fn get_xattr(&mut self, l: Loc, name: &[u8]) -> Result<Option<Vec<u8>>> {
        Self::no_xattrs_on_placeholder(l)?;
        super::xattr::get_xattr(&mut self.fs.store, l.subvol, l.ino, name)
    }

    /// listxattr(2) with values: every (name, value) of the inode.
    pub fn list_xattrs(&mut self, l: Loc) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        super::xattr::list_xattrs(&mut self.fs.store, l.subvol, l.ino)
    }

    /// set_posix_acl: the value checked as an ACL; a default ACL only on
    /// a directory; an access ACL sets the mode (posix_acl_update_mode:
    /// one the mode says all of is not kept, and the set-group-id bit goes
    /// when the caller is neither in the file's group nor root).
    fn set_acl(&mut self, l: Loc, name: &[u8], value: &[u8]) -> Result<()> {
        let acl = super::acl::parse(value)?;
        let mut it = self.fs.item(l)?;
        let mut mode = it.mode.get();
        let t = self.fs.store.transid();
        if name == super::acl::ACL_DEFAULT {
            if !is_dir(mode) {
                return Err(Error::errno(
                    libc::EACCES,
                    "a default ACL on something not a directory",
                ));
            }
        } else if let Some(a) = &acl {
            let equiv = a.equiv_mode(&mut mode);
            if !self.fs.creds.in_group(it.gid.get()) && self.fs.creds.uid != 0 {
                mode &= !libc::S_ISGID;
            }
            it.mode.set(mode);
            self.fs.put_item(l, &it)?;
            if equiv {
                super::xattr::remove_xattr(&mut self.fs.store, l.subvol, l.ino, name)?;
                self.fs.rt(l)?.copy_everything = true;
                return self.fs.stamp(l, true, false);
            }
        }
        match acl {
            Some(a) => {
                super::xattr::set_xattr(&mut self.fs.store, l.subvol, l.ino, name, &a.encode(), t)?;
            }
            None => {
                super::xattr::remove_xattr(&mut self.fs.store, l.subvol, l.ino, name)?;
            }
        }
        self.fs.rt(l)?.copy_everything = true;
        self.fs.stamp(l, true, false)
    }

    /// The placeholder's inode has no xattr support (IOP_XATTR cleared):
    /// getting, setting and removing fail, listing finds none.
    fn no_xattrs_on_placeholder(l: Loc) -> Result<()> {
        if l.is_placeholder() {
            return Err(Error::errno(
                libc::EOPNOTSUPP,
                "xattrs: the empty directory standing for a subvolume has none",
            ));
        }
        Ok(())
    }

    fn check_xattr_name(&mut self, l: Loc, name: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(Error::errno(libc::ERANGE, "xattr name length"));
        }
        Self::no_xattrs_on_placeholder(l)?;
        let ok = [
            &b"user."[..],
            b"trusted.",
            b"security.",
            b"system.",
            b"btrfs.",
        ]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len());
        if !ok {
            return Err(Error::errno(
                libc::EOPNOTSUPP,
                format!("xattr {}: namespace not supported", name_str(name)),
            ));
        }
        let m = self.fs.item(l)?.mode.get();
        if name.starts_with(b"user.") && !is_reg(m) && !is_dir(m) {
            return Err(Error::errno(
                libc::EPERM,
                "user xattrs only on files and directories",
            ));
        }
        Ok(())
    }
}
