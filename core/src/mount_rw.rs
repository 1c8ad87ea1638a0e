//! A writable view of a filesystem for `btrkit-mount --rw`: the VFS
//! operations FUSE carries, applied through the engine (page cache,
//! ordered extents, transactions), with fsync, fdatasync and fsyncdir
//! through the same log writer the shell's scripts use, so a crash of the
//! server leaves a log the kernel replays.
//!
//! Node ids as in [`crate::mount_view`]: the start subvolume's inodes keep
//! their numbers (its root is 1), other subvolumes' get ids from 2^56 up.
//! Btrfs never reuses an inode number within a mount, so an id names one
//! inode for the life of the mount even as files come and go.
//!
//! Time: the engine's clock is moved to the wall clock before every
//! operation and by [`WritableView::tick`], so timestamps are real and the
//! transaction thread's commit interval (`commit=`) counts real seconds.
//!
//! Permission checks are the kernel's (the mount uses FUSE's
//! `default_permissions`); what the VFS leaves to the filesystem is here:
//! the owner of new inodes ([`crate::fs::Creds`]), renameat2's flags,
//! xattr flags, O_APPEND, O_DIRECT.

use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::fs::extents::{extent_span, extents_in};
use crate::fs::ops::Stat;
use crate::fs::FsyncTicket;
use crate::fs::{Creds, Filesystem, Loc, MountOptions};
use crate::io::BlockDevice;
use crate::mount_view::{Entry, NodeIds, Space, ROOT_NODE};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// renameat2 flags.
pub use crate::fs::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};

/// setxattr flags.
const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;

/// fallocate modes.
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// How a read-write mount opens the filesystem.
#[derive(Clone, Debug, Default)]
pub struct RwOptions {
    /// The subvolume shown at the mount's root (path from the top level,
    /// or an id); the default subvolume when None.
    pub subvol: Option<String>,
    /// Mount options as the kernel's (`commit=N`, `compress=...`, ...).
    pub options: Vec<String>,
    /// Devices of the set may be missing.
    pub degraded: bool,
}

/// What setattr changes (None: left as it is).
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// Permission bits (and set-id bits).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// New size (truncate).
    pub size: Option<u64>,
    /// Access time: Some(None) is "now".
    pub atime: Option<Option<(i64, u32)>>,
    /// Modification time: Some(None) is "now".
    pub mtime: Option<Option<(i64, u32)>>,
}

/// An open file or directory.
struct Handle {
    l: Loc,
    append: bool,
    direct: bool,
    /// A directory's (not held open in the engine).
    dir: bool,
}

/// The filesystem behind a read-write mount.
pub struct WritableView {
    fs: Filesystem,
    /// Node id <-> inode, as the read-only view's.
    ids: NodeIds,
    /// The directory a node was last found in (for readdir's "..").
    parents: HashMap<u64, u64>,
    handles: HashMap<u64, Handle>,
    next_handle: u64,
    /// Wall time of the mount, against which the engine's clock is kept.
    mounted: Instant,
}

fn errno(e: i32, what: impl Into<String>) -> Error {
    Error::errno(e, what)
}

impl WritableView {
    /// Mount the filesystem on `devs` read-write (a pending log replayed,
    /// orphans cleaned, as the kernel's mount).
    pub fn mount(devs: Vec<(String, Arc<dyn BlockDevice>)>, o: &RwOptions) -> Result<WritableView> {
        let mut opts = MountOptions::parse(&o.options)?;
        if opts.read_only {
            return Err(Error::Invalid(
                "a read-write mount with the option ro: mount without --rw".into(),
            ));
        }
        let by_id = o
            .subvol
            .as_deref()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|_| o.subvol.as_deref().is_some_and(|s| !s.contains('/')));
        if let Some(id) = by_id {
            opts.subvolid = Some(id);
        }
        crate::offline::check_writable(&devs)?;
        let mut fs = crate::log::replay::mount_devices(devs, opts, o.degraded)?;
        let start = match (&o.subvol, by_id) {
            (Some(path), None) => {
                let top = Loc::new(crate::fs::FS_TREE, crate::fs::ROOT_DIR);
                let l = resolve_from(&mut fs, top, path)?;
                if !fs.stat(l)?.is_dir() {
                    return Err(Error::Invalid(format!("--subvol {path}: not a directory")));
                }
                l
            }
            _ => fs.root(),
        };
        let mut v = WritableView {
            fs,
            ids: NodeIds::new(start),
            parents: HashMap::new(),
            handles: HashMap::new(),
            next_handle: 1,
            mounted: Instant::now(),
        };
        v.parents.insert(ROOT_NODE, ROOT_NODE);
        Ok(v)
    }

    /// The engine under the view (tests and the server's statistics).
    pub fn fs(&mut self) -> &mut Filesystem {
        &mut self.fs
    }

    fn node_of(&mut self, l: Loc) -> u64 {
        self.ids.node_of(l)
    }

    fn loc(&self, node: u64) -> Result<Loc> {
        self.ids.loc(node)
    }

    /// Bring the engine's clock up to the wall clock (never back).
    fn catch_up(&mut self) -> Result<()> {
        let wall = self.mounted.elapsed();
        let engine = self.fs.clock().uptime();
        if wall > engine {
            self.fs.advance_clock(wall - engine)?;
        }
        Ok(())
    }

    /// Before an operation on behalf of `c`: the clock, and whom new
    /// inodes belong to.
    fn begin(&mut self, c: Option<&Creds>) -> Result<()> {
        if let Some(c) = c {
            if self.fs.creds != *c {
                self.fs.creds = c.clone();
            }
        }
        self.catch_up()
    }

    /// The transaction thread's and the flusher's work that fell due:
    /// called about once a second by the server.
    pub fn tick(&mut self) -> Result<()> {
        self.catch_up()
    }

    /// syncfs(2): everything written back and committed.
    pub fn sync(&mut self) -> Result<()> {
        self.catch_up()?;
        self.fs.sync()
    }

    /// Unmount: open files closed (unlinked ones go), everything committed.
    pub fn unmount(mut self) -> Result<()> {
        self.catch_up()?;
        let open: Vec<Loc> = self
            .handles
            .drain()
            .filter(|(_, h)| !h.dir)
            .map(|(_, h)| h.l)
            .collect();
        for l in open {
            self.fs.close(l)?;
        }
        self.fs.close_all()?;
        self.fs.sync()
    }

    fn entry(&mut self, dir: u64, l: Loc) -> Result<(u64, Stat)> {
        let st = self.fs.stat(l)?;
        let n = self.node_of(l);
        self.parents.insert(n, dir);
        Ok((n, st))
    }

    /// lookup: the inode `name` names in directory `dir`.
    pub fn lookup(&mut self, dir: u64, name: &[u8]) -> Result<(u64, Stat)> {
        self.begin(None)?;
        let d = self.loc(dir)?;
        // btrfs_lookup: a name longer than a Btrfs name can be.
        if name.len() > BTRFS_NAME_LEN {
            return Err(errno(libc::ENAMETOOLONG, "name too long"));
        }
        match self.fs.lookup(d, name)? {
            Some(l) => self.entry(dir, l),
            None => Err(errno(libc::ENOENT, "no such entry")),
        }
    }

    /// getattr.
    pub fn getattr(&mut self, node: u64) -> Result<Stat> {
        let l = self.loc(node)?;
        self.fs.stat(l)
    }

    /// setattr: owner first (which clears set-id bits as chown does), then
    /// mode, size and times, as notify_change applies them.
    pub fn setattr(&mut self, node: u64, a: &SetAttr, fh: Option<u64>, c: &Creds) -> Result<Stat> {
        self.begin(Some(c))?;
        let l = self.loc(node)?;
        if a.uid.is_some() || a.gid.is_some() {
            let st = self.fs.stat(l)?;
            self.fs
                .chown(l, a.uid.unwrap_or(st.uid), a.gid.unwrap_or(st.gid))?;
        }
        if let Some(m) = a.mode {
            self.fs.chmod(l, m)?;
        }
        if let Some(size) = a.size {
            let st = self.fs.stat(l)?;
            if st.is_dir() {
                return Err(errno(libc::EISDIR, "truncate: is a directory"));
            }
            if st.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(errno(libc::EINVAL, "truncate: not a regular file"));
            }
            // truncate(2) by path holds the file open for the call (the
            // close after a truncate to zero flushes as the kernel's).
            let held = fh.is_some_and(|h| self.handles.contains_key(&h));
            if !held {
                self.fs.open(l)?;
            }
            let r = self.fs.truncate(l, size);
            if !held {
                self.fs.close(l)?;
            }
            r?;
        }
        if a.atime.is_some() || a.mtime.is_some() {
            let st = self.fs.stat(l)?;
            let now = self.fs.clock().now();
            let now = (now.sec.get() as i64, now.nsec.get());
            let pick = |t: Option<Option<(i64, u32)>>, old: (i64, u32)| match t {
                None => old,
                Some(None) => now,
                Some(Some(t)) => t,
            };
            let at = pick(a.atime, st.atime);
            let mt = pick(a.mtime, st.mtime);
            self.fs.set_times(l, Some((at, mt)))?;
        }
        self.fs.stat(l)
    }

    /// mknod (regular files, fifos, sockets, devices).
    pub fn mknod(
        &mut self,
        dir: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        c: &Creds,
    ) -> Result<(u64, Stat)> {
        self.begin(Some(c))?;
        let d = self.loc(dir)?;
        let l = self.fs.mknod(d, name, mode, rdev)?;
        self.entry(dir, l)
    }

    /// mkdir.
    pub fn mkdir(&mut self, dir: u64, name: &[u8], mode: u32, c: &Creds) -> Result<(u64, Stat)> {
        self.begin(Some(c))?;
        let d = self.loc(dir)?;
        let l = self.fs.mkdir(d, name, mode)?;
        self.entry(dir, l)
    }

    /// symlink.
    pub fn symlink(
        &mut self,
        dir: u64,
        name: &[u8],
        target: &[u8],
        c: &Creds,
    ) -> Result<(u64, Stat)> {
        self.begin(Some(c))?;
        let d = self.loc(dir)?;
        let l = self.fs.symlink(d, name, target)?;
        self.entry(dir, l)
    }

    /// link: a new name `name` in `dir` for `node`.
    pub fn link(&mut self, node: u64, dir: u64, name: &[u8]) -> Result<(u64, Stat)> {
        self.begin(None)?;
        let l = self.loc(node)?;
        let d = self.loc(dir)?;
        self.fs.link(l, d, name)?;
        self.entry(dir, l)
    }

    /// unlink.
    pub fn unlink(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        self.begin(None)?;
        let d = self.loc(dir)?;
        self.fs.unlink(d, name)
    }

    /// rmdir.
    pub fn rmdir(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        self.begin(None)?;
        let d = self.loc(dir)?;
        self.fs.rmdir(d, name)
    }

    /// renameat2 with RENAME_NOREPLACE, RENAME_EXCHANGE and
    /// RENAME_WHITEOUT, as the engine's rename2.
    pub fn rename(
        &mut self,
        odir: u64,
        oname: &[u8],
        ndir: u64,
        nname: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.begin(None)?;
        let od = self.loc(odir)?;
        let nd = self.loc(ndir)?;
        let moved = self.fs.lookup(od, oname)?;
        let swapped = if flags & RENAME_EXCHANGE != 0 {
            self.fs.lookup(nd, nname)?
        } else {
            None
        };
        self.fs.rename2(od, oname, nd, nname, flags)?;
        for (l, parent) in [(moved, ndir), (swapped, odir)] {
            if let Some(n) = l.and_then(|l| self.ids.known(l)) {
                self.parents.insert(n, parent);
            }
        }
        Ok(())
    }

    fn new_handle(&mut self, h: Handle) -> u64 {
        let fh = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(fh, h);
        fh
    }

    /// open: a handle on `node` (held open in the engine until release,
    /// so an unlinked file lives until its last close).
    pub fn open(&mut self, node: u64, flags: i32) -> Result<u64> {
        self.begin(None)?;
        let l = self.loc(node)?;
        let st = self.fs.stat(l)?;
        if st.is_dir() {
            return Ok(self.new_handle(Handle {
                l,
                append: false,
                direct: false,
                dir: true,
            }));
        }
        self.fs.open(l)?;
        Ok(self.new_handle(Handle {
            l,
            append: flags & libc::O_APPEND != 0,
            direct: flags & libc::O_DIRECT != 0 && st.mode & libc::S_IFMT == libc::S_IFREG,
            dir: false,
        }))
    }

    /// create: open(O_CREAT) of a new file (an existing one is the VFS's
    /// to open: it never asks for it here).
    pub fn create(
        &mut self,
        dir: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        c: &Creds,
    ) -> Result<(u64, Stat, u64)> {
        self.begin(Some(c))?;
        let d = self.loc(dir)?;
        if self.fs.lookup(d, name)?.is_some() {
            return Err(errno(libc::EEXIST, "create: the name exists"));
        }
        let l = self.fs.create(d, name, mode)?;
        let (n, st) = self.entry(dir, l)?;
        let fh = self.open(n, flags)?;
        Ok((n, st, fh))
    }

    /// O_TMPFILE: an unnamed file in `dir`, open, on the orphan list until
    /// it is linked or closed.
    pub fn tmpfile(
        &mut self,
        dir: u64,
        mode: u32,
        flags: i32,
        c: &Creds,
    ) -> Result<(u64, Stat, u64)> {
        self.begin(Some(c))?;
        let d = self.loc(dir)?;
        // tmpfile leaves the inode open once (its own reference).
        let l = self.fs.tmpfile(d, mode)?;
        let st = self.fs.stat(l)?;
        let n = self.node_of(l);
        let fh = self.new_handle(Handle {
            l,
            append: flags & libc::O_APPEND != 0,
            direct: flags & libc::O_DIRECT != 0,
            dir: false,
        });
        Ok((n, st, fh))
    }

    /// release of a file handle (or of a directory's).
    pub fn release(&mut self, fh: u64) -> Result<()> {
        self.begin(None)?;
        match self.handles.remove(&fh) {
            Some(h) if !h.dir => self.fs.close(h.l),
            _ => Ok(()),
        }
    }

    /// read.
    pub fn read(&mut self, node: u64, off: u64, len: u64) -> Result<Vec<u8>> {
        self.begin(None)?;
        let l = self.loc(node)?;
        self.fs.read(l, off, len)
    }

    /// write through handle `fh`: at the end of the file with O_APPEND,
    /// around the page cache with O_DIRECT.
    pub fn write(&mut self, fh: u64, node: u64, off: u64, data: &[u8]) -> Result<u64> {
        self.begin(None)?;
        let (l, append, direct) = match self.handles.get(&fh) {
            Some(h) => (h.l, h.append, h.direct),
            None => (self.loc(node)?, false, false),
        };
        let off = if append { self.fs.stat(l)?.size } else { off };
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(errno(libc::EFBIG, "write past the largest file size"));
        }
        let ss = self.fs.store.sectorsize() as u64;
        if direct && off.is_multiple_of(ss) && (data.len() as u64).is_multiple_of(ss) {
            self.fs.direct_write(l, off, data)?;
        } else {
            self.fs.write(l, off, data)?;
        }
        // Dirty data past the thresholds goes out as the kernel's
        // balance_dirty_pages sends it.
        self.fs.periodic()?;
        Ok(data.len() as u64)
    }

    /// fsync, fdatasync (a file) and fsyncdir (a directory): through the
    /// log writer.
    pub fn fsync(&mut self, node: u64, datasync: bool) -> Result<()> {
        let ticket = self.fsync_log(node, datasync)?;
        self.fs.fsync_path().fsync_finish(ticket)
    }

    /// The part of an fsync that needs the filesystem: the data written,
    /// the inode logged. The log sync the ticket names runs without it
    /// ([`crate::log::batch::sync_logged`]), batched with other threads'
    /// fsyncs as btrfs_sync_log batches them.
    pub fn fsync_log(&mut self, node: u64, datasync: bool) -> Result<FsyncTicket> {
        self.begin(None)?;
        let l = self.loc(node)?;
        self.fs.fsync_path().fsync_prepare(l, datasync, None)
    }

    /// readdir without a directory handle: the mount answers OPENDIR with
    /// ENOSYS, so the kernel opens directories itself and caches what it
    /// read (FOPEN_CACHE_DIR, dropped when a change goes through it). Each
    /// entry comes with the offset of the next, stable across changes as
    /// btrfs's f_pos: "." at 0, ".." at 1, then the entries by their dir
    /// index (an index below 2 is none of btrfs's and is left out, as the
    /// kernel's readdir does). At most `max` entries from `offset` on.
    pub fn read_dir(&mut self, node: u64, offset: u64, max: usize) -> Result<Vec<(u64, Entry)>> {
        self.begin(None)?;
        let l = self.loc(node)?;
        let mut out = Vec::new();
        if offset == 0 {
            out.push((
                1,
                Entry {
                    name: b".".to_vec(),
                    node,
                    ftype: BTRFS_FT_DIR,
                },
            ));
        }
        if offset <= 1 {
            let parent = self.parents.get(&node).copied().unwrap_or(node);
            out.push((
                2,
                Entry {
                    name: b"..".to_vec(),
                    node: parent,
                    ftype: BTRFS_FT_DIR,
                },
            ));
        }
        let from = offset.max(2);
        let want = max.saturating_sub(out.len());
        for (index, name, child, ftype) in
            crate::fs::ops::readdir_from(&mut self.fs, l, from, want)?
        {
            // The next offset must fit the kernel's signed f_pos.
            if index >= i64::MAX as u64 {
                break;
            }
            let n = self.node_of(child);
            out.push((
                index + 1,
                Entry {
                    name,
                    node: n,
                    ftype,
                },
            ));
        }
        Ok(out)
    }

    /// readlink.
    pub fn readlink(&mut self, node: u64) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        self.fs.read_link(l)
    }

    /// statfs figures.
    pub fn space(&mut self) -> Space {
        let sb = &self.fs.store.image().sb;
        Space {
            total: sb.total_bytes.get(),
            used: sb.bytes_used.get(),
            block: sb.sectorsize.get(),
        }
    }

    /// setxattr with XATTR_CREATE / XATTR_REPLACE.
    pub fn setxattr(&mut self, node: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.begin(None)?;
        let l = self.loc(node)?;
        if flags & (XATTR_CREATE | XATTR_REPLACE) != 0 {
            let exists = self.fs.xattrs().get_xattr(l, name)?.is_some();
            if flags & XATTR_CREATE != 0 && exists {
                return Err(errno(libc::EEXIST, "setxattr: the attribute exists"));
            }
            if flags & XATTR_REPLACE != 0 && !exists {
                return Err(errno(libc::ENODATA, "setxattr: no such attribute"));
            }
        }
        self.fs.xattrs().set_xattr(l, name, value)
    }

    /// getxattr.
    pub fn getxattr(&mut self, node: u64, name: &[u8]) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        if l.is_placeholder() {
            return Err(errno(libc::ENODATA, "no such attribute"));
        }
        self.fs
            .xattrs()
            .get_xattr(l, name)?
            .ok_or_else(|| errno(libc::ENODATA, "no such attribute"))
    }

    /// listxattr: the names, each ended by a NUL.
    pub fn listxattr(&mut self, node: u64) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        if l.is_placeholder() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (name, _) in self.fs.xattrs().list_xattrs(l)? {
            out.extend_from_slice(&name);
            out.push(0);
        }
        Ok(out)
    }

    /// removexattr.
    pub fn removexattr(&mut self, node: u64, name: &[u8]) -> Result<()> {
        self.begin(None)?;
        let l = self.loc(node)?;
        if self.fs.xattrs().get_xattr(l, name)?.is_none() {
            return Err(errno(libc::ENODATA, "no such attribute"));
        }
        self.fs.xattrs().remove_xattr(l, name)
    }

    /// fallocate: allocate (keeping the size or not), punch a hole, zero
    /// a range; other modes EOPNOTSUPP, as btrfs answers them.
    pub fn fallocate(&mut self, node: u64, off: u64, len: u64, mode: i32) -> Result<()> {
        self.begin(None)?;
        let l = self.loc(node)?;
        if len == 0 {
            return Err(errno(libc::EINVAL, "fallocate: length 0"));
        }
        if off.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(errno(libc::EFBIG, "fallocate past the largest file size"));
        }
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let r = match mode & !FALLOC_FL_KEEP_SIZE {
            0 => self.fs.ranges().fallocate(l, off, len, keep),
            FALLOC_FL_PUNCH_HOLE if keep => self.fs.ranges().punch_hole(l, off, len),
            FALLOC_FL_ZERO_RANGE => self.fs.ranges().zero_range(l, off, len, keep),
            _ => Err(errno(libc::EOPNOTSUPP, "fallocate: mode not supported")),
        };
        r?;
        self.fs.periodic()
    }

    /// lseek with SEEK_DATA or SEEK_HOLE (others are the kernel's): the
    /// file's dirty data is written back first, then its extents read;
    /// preallocated ranges are holes, as btrfs reports them.
    pub fn lseek(&mut self, node: u64, off: u64, whence: i32) -> Result<u64> {
        self.begin(None)?;
        let l = self.loc(node)?;
        let size = self.fs.stat(l)?.size;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(errno(libc::EINVAL, "lseek: only SEEK_DATA and SEEK_HOLE"));
        }
        if off >= size {
            return Err(errno(libc::ENXIO, "lseek: past the end"));
        }
        self.fs.sync_file_range(
            l,
            0,
            u64::MAX,
            crate::fs::SYNC_RANGE_WRITE | crate::fs::SYNC_RANGE_WAIT_AFTER,
        )?;
        let ss = self.fs.store.sectorsize() as u64;
        // Windows of extents, so a huge file's map is never held whole.
        const WINDOW: u64 = 256 << 20;
        let mut at = off;
        while at < size {
            let end = at.saturating_add(WINDOW).min(size);
            let items = extents_in(&mut self.fs.store, l.subvol, l.ino, at, end)?;
            // Walk [at, end): data ranges from the items, holes between.
            let mut pos = at;
            for (k, d) in &items {
                let Some((s, e)) = extent_span(ss, k.offset, d) else {
                    continue;
                };
                let data = match parse_file_extent(d) {
                    Ok(FileExtent::Inline { .. }) => true,
                    Ok(FileExtent::Disk { head, item }) => {
                        head.type_ == BTRFS_FILE_EXTENT_REG && item.disk_bytenr.get() != 0
                    }
                    Err(e) => return Err(e.at(0, *k)),
                };
                let (s, e) = (s.max(pos), e.min(end));
                if e <= s && !(s <= pos && pos < e) {
                    continue;
                }
                if s > pos && whence == libc::SEEK_HOLE {
                    return Ok(pos);
                }
                if data {
                    if whence == libc::SEEK_DATA {
                        return Ok(s.max(pos));
                    }
                } else if whence == libc::SEEK_HOLE {
                    return Ok(s.max(pos));
                }
                pos = pos.max(e);
            }
            if pos < end && whence == libc::SEEK_HOLE {
                return Ok(pos);
            }
            at = end;
        }
        match whence {
            libc::SEEK_HOLE => Ok(size),
            _ => Err(errno(libc::ENXIO, "lseek: no data past the offset")),
        }
    }

    /// copy_file_range: a reflink of the sectors the range covers where
    /// both ends allow one (as the VFS tries remap_file_range first), a
    /// copy of the bytes otherwise. Returns the bytes copied.
    pub fn copy_range(
        &mut self,
        src: u64,
        soff: u64,
        dst: u64,
        doff: u64,
        len: u64,
    ) -> Result<u64> {
        self.begin(None)?;
        let s = self.loc(src)?;
        let d = self.loc(dst)?;
        let ssize = self.fs.stat(s)?.size;
        if soff >= ssize || len == 0 {
            return Ok(0);
        }
        let len = len.min(ssize - soff);
        if doff.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(errno(
                libc::EFBIG,
                "copy_file_range past the largest file size",
            ));
        }
        let ss = self.fs.store.sectorsize() as u64;
        let aligned = soff.is_multiple_of(ss)
            && doff.is_multiple_of(ss)
            && (len.is_multiple_of(ss) || soff + len == ssize);
        let overlap = s == d && soff < doff + len && doff < soff + len;
        if aligned && !overlap && self.fs.datasum(s)? == self.fs.datasum(d)? {
            let dsize = self.fs.stat(d)?.size;
            // A clone that would leave a partial last sector inside the
            // destination's data is not one the kernel makes.
            if soff + len == ssize && !len.is_multiple_of(ss) && doff + len < dsize {
                // fall through to the copy
            } else {
                self.fs.ranges().clone_range(s, soff, d, doff, len)?;
                return Ok(len);
            }
        }
        const CHUNK: u64 = 1 << 20;
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            let buf = self.fs.read(s, soff + done, n)?;
            if buf.is_empty() {
                break;
            }
            self.fs.write(d, doff + done, &buf)?;
            done += buf.len() as u64;
            self.fs.periodic()?;
        }
        Ok(done)
    }
}

/// A path from `top`, following no symlink at its end.
fn resolve_from(fs: &mut Filesystem, top: Loc, path: &str) -> Result<Loc> {
    let mut l = top;
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        l = fs
            .lookup(l, part.as_bytes())?
            .ok_or_else(|| errno(libc::ENOENT, format!("{path}: no such directory")))?;
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;

    fn view() -> WritableView {
        let mem = Arc::new(MemDevice::zeroed(256 << 20));
        let dev: Arc<dyn BlockDevice> = mem.clone();
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        WritableView::mount(vec![("mem".into(), dev)], &RwOptions::default()).unwrap()
    }

    fn user(uid: u32, gid: u32) -> Creds {
        Creds {
            uid,
            gid,
            groups: Vec::new(),
            umask: 0,
        }
    }

    #[test]
    fn files_made_written_renamed_and_listed() {
        let mut v = view();
        let c = user(1000, 100);
        let (d, st) = v.mkdir(ROOT_NODE, b"d", 0o755, &c).unwrap();
        assert_eq!((st.uid, st.gid), (1000, 100));
        let (f, _, fh) = v.create(d, b"f", 0o644, libc::O_WRONLY, &c).unwrap();
        assert_eq!(v.write(fh, f, 0, b"hello").unwrap(), 5);
        assert_eq!(v.write(fh, f, 5, b" world").unwrap(), 6);
        v.fsync(f, false).unwrap();
        v.release(fh).unwrap();
        assert_eq!(v.read(f, 0, 100).unwrap(), b"hello world");
        v.rename(d, b"f", ROOT_NODE, b"g", RENAME_NOREPLACE)
            .unwrap();
        let (g, st) = v.lookup(ROOT_NODE, b"g").unwrap();
        assert_eq!((g, st.size), (f, 11));
        // NOREPLACE over an existing name.
        v.create(ROOT_NODE, b"h", 0o600, 0, &c).unwrap();
        let e = v.rename(ROOT_NODE, b"g", ROOT_NODE, b"h", RENAME_NOREPLACE);
        assert_eq!(e.unwrap_err().as_errno(), libc::EEXIST);
        let listed = v.read_dir(ROOT_NODE, 0, 100).unwrap();
        let names: Vec<Vec<u8>> = listed.iter().map(|(_, e)| e.name.clone()).collect();
        assert_eq!(
            names,
            vec![
                b".".to_vec(),
                b"..".to_vec(),
                b"d".to_vec(),
                b"g".to_vec(),
                b"h".to_vec()
            ]
        );
        // Offsets are stable: a read from the offset after "g" gives "h",
        // also after an entry before it went away.
        let after_g = listed[3].0;
        v.unlink(ROOT_NODE, b"g").unwrap();
        let rest = v.read_dir(ROOT_NODE, after_g, 100).unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].1.name, b"h");
        assert!(v.read_dir(ROOT_NODE, rest[0].0, 100).unwrap().is_empty());
        // Reads in pieces.
        let first = v.read_dir(ROOT_NODE, 0, 2).unwrap();
        assert_eq!(first.len(), 2);
        let more = v.read_dir(ROOT_NODE, first[1].0, 1).unwrap();
        assert_eq!(more[0].1.name, b"d");
        v.unmount().unwrap();
    }

    #[test]
    fn exchange_swaps_names_and_parents() {
        let mut v = view();
        let c = user(0, 0);
        let (a, _) = v.mkdir(ROOT_NODE, b"a", 0o755, &c).unwrap();
        let (d, _) = v.mkdir(a, b"d", 0o755, &c).unwrap();
        let (f, _, fh) = v
            .create(ROOT_NODE, b"f", 0o644, libc::O_WRONLY, &c)
            .unwrap();
        v.write(fh, f, 0, b"data").unwrap();
        v.release(fh).unwrap();
        // A directory and a file across parents.
        v.rename(a, b"d", ROOT_NODE, b"f", RENAME_EXCHANGE).unwrap();
        assert_eq!(v.lookup(ROOT_NODE, b"f").unwrap().0, d);
        assert_eq!(v.lookup(a, b"d").unwrap().0, f);
        assert_eq!(v.read(f, 0, 10).unwrap(), b"data");
        // Into itself, a missing name, bad flag combinations.
        let e = v.rename(ROOT_NODE, b"a", a, b"d", RENAME_EXCHANGE);
        assert_eq!(e.unwrap_err().as_errno(), libc::EINVAL);
        let e = v.rename(ROOT_NODE, b"a", ROOT_NODE, b"none", RENAME_EXCHANGE);
        assert_eq!(e.unwrap_err().as_errno(), libc::ENOENT);
        let e = v.rename(
            ROOT_NODE,
            b"a",
            ROOT_NODE,
            b"f",
            RENAME_EXCHANGE | RENAME_NOREPLACE,
        );
        assert_eq!(e.unwrap_err().as_errno(), libc::EINVAL);
        // A whiteout stays at the old name.
        v.rename(a, b"d", ROOT_NODE, b"g", RENAME_WHITEOUT).unwrap();
        let (_, st) = v.lookup(a, b"d").unwrap();
        assert_eq!((st.mode, st.rdev), (crate::fs::inode::S_IFCHR, (0, 0)));
        v.unmount().unwrap();
    }

    #[test]
    fn set_group_id_directories_pass_their_group_on() {
        let mut v = view();
        let root = user(0, 0);
        let (d, _) = v.mkdir(ROOT_NODE, b"d", 0o2775, &root).unwrap();
        v.setattr(
            d,
            &SetAttr {
                gid: Some(50),
                ..Default::default()
            },
            None,
            &root,
        )
        .unwrap();
        v.setattr(
            d,
            &SetAttr {
                mode: Some(0o2777),
                ..Default::default()
            },
            None,
            &root,
        )
        .unwrap();
        let c = user(1000, 100);
        let (_, st) = v.mkdir(d, b"sub", 0o755, &c).unwrap();
        assert_eq!((st.gid, st.mode & 0o7777), (50, 0o2755));
        let (_, st) = v.mknod(d, b"x", libc::S_IFREG | 0o2755, 0, &c).unwrap();
        assert_eq!((st.gid, st.mode & 0o7777), (50, 0o755), "not in the group");
        let (_, st) = v.mknod(d, b"y", libc::S_IFREG | 0o2755, 0, &root).unwrap();
        assert_eq!(st.mode & 0o7777, 0o2755, "root keeps it");
    }

    #[test]
    fn seek_data_and_hole() {
        let mut v = view();
        let c = user(0, 0);
        let (f, _, fh) = v.create(ROOT_NODE, b"f", 0o644, 0, &c).unwrap();
        v.write(fh, f, 1 << 20, &[7u8; 8192]).unwrap();
        v.write(fh, f, 4 << 20, &[7u8; 4096]).unwrap();
        assert_eq!(v.lseek(f, 0, libc::SEEK_DATA).unwrap(), 1 << 20);
        assert_eq!(v.lseek(f, 0, libc::SEEK_HOLE).unwrap(), 0);
        assert_eq!(
            v.lseek(f, 1 << 20, libc::SEEK_HOLE).unwrap(),
            (1 << 20) + 8192
        );
        assert_eq!(
            v.lseek(f, (1 << 20) + 8192, libc::SEEK_DATA).unwrap(),
            4 << 20
        );
        assert_eq!(
            v.lseek(f, 4 << 20, libc::SEEK_HOLE).unwrap(),
            (4 << 20) + 4096
        );
        v.fallocate(f, 8 << 20, 4096, 0).unwrap();
        // Preallocated: a hole to lseek, up to the end.
        assert_eq!(
            v.lseek(f, (4 << 20) + 4096, libc::SEEK_HOLE).unwrap(),
            (4 << 20) + 4096
        );
        assert_eq!(
            v.lseek(f, (4 << 20) + 4096, libc::SEEK_DATA)
                .unwrap_err()
                .as_errno(),
            libc::ENXIO
        );
        v.release(fh).unwrap();
    }

    #[test]
    fn unlinked_open_file_lives_until_release() {
        let mut v = view();
        let c = user(0, 0);
        let (f, _, fh) = v.create(ROOT_NODE, b"f", 0o644, 0, &c).unwrap();
        v.write(fh, f, 0, b"data").unwrap();
        v.unlink(ROOT_NODE, b"f").unwrap();
        v.sync().unwrap();
        assert_eq!(v.read(f, 0, 4).unwrap(), b"data");
        v.release(fh).unwrap();
        assert!(v.getattr(f).is_err());
    }

    #[test]
    fn default_acls_are_inherited_and_access_acls_set_the_mode() {
        use crate::fs::acl::{Acl, AclEntry, ACL_ACCESS, ACL_DEFAULT};
        let mut v = view();
        let c = Creds {
            umask: 0o022,
            ..user(0, 0)
        };
        let (d, _) = v.mkdir(ROOT_NODE, b"d", 0o777, &c).unwrap();
        let e = |tag, perm, id| AclEntry { tag, perm, id };
        let dflt = Acl(vec![
            e(0x01, 7, u32::MAX),
            e(0x02, 7, 1000),
            e(0x04, 5, u32::MAX),
            e(0x10, 7, u32::MAX),
            e(0x20, 0, u32::MAX),
        ]);
        v.setxattr(d, ACL_DEFAULT, &dflt.encode(), 0).unwrap();
        // Inherited: no umask, the mask takes the group bits.
        let (f, st, _) = v.create(d, b"f", 0o666, 0, &c).unwrap();
        assert_eq!(st.mode & 0o777, 0o660);
        let acc = crate::fs::acl::parse(&v.getxattr(f, ACL_ACCESS).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(acc.0[3].perm, 6);
        let (sub, st) = v.mkdir(d, b"sub", 0o777, &c).unwrap();
        assert_eq!(st.mode & 0o777, 0o770);
        assert_eq!(v.getxattr(sub, ACL_DEFAULT).unwrap(), dflt.encode());
        // chmod rewrites the mask.
        v.setattr(
            f,
            &SetAttr {
                mode: Some(0o640),
                ..Default::default()
            },
            None,
            &c,
        )
        .unwrap();
        let acc = crate::fs::acl::parse(&v.getxattr(f, ACL_ACCESS).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!((acc.0[0].perm, acc.0[3].perm, acc.0[4].perm), (6, 4, 0));
        // An ACL a mode says all of sets the mode and is not kept.
        let base = Acl(vec![
            e(0x01, 7, u32::MAX),
            e(0x04, 0, u32::MAX),
            e(0x20, 4, u32::MAX),
        ]);
        v.setxattr(f, ACL_ACCESS, &base.encode(), 0).unwrap();
        assert_eq!(v.getattr(f).unwrap().mode & 0o777, 0o704);
        assert_eq!(
            v.getxattr(f, ACL_ACCESS).unwrap_err().as_errno(),
            libc::ENODATA
        );
        // Outside: the umask.
        let (_, st, _) = v.create(ROOT_NODE, b"g", 0o666, 0, &c).unwrap();
        assert_eq!(st.mode & 0o777, 0o644);
        // Malformed, and a default ACL on a file.
        assert_eq!(
            v.setxattr(f, ACL_ACCESS, &[2, 0, 0, 0, 9], 0)
                .unwrap_err()
                .as_errno(),
            libc::EINVAL
        );
        assert_eq!(
            v.setxattr(f, ACL_DEFAULT, &dflt.encode(), 0)
                .unwrap_err()
                .as_errno(),
            libc::EACCES
        );
    }
}
