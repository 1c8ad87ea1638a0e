//! The FUSE side of a read-write mount: fuser's callbacks answered from a
//! [`WritableView`]. Nothing here decides anything about Btrfs; it
//! converts, and says whom a request acts for.

use crate::fuse::{attr, dirent_kind, errno, xattr_reply};
use btrkit_core::fs::ops::Stat;
use btrkit_core::fs::Creds;
use btrkit_core::log::batch::{sync_logged, FsHolder, SeatBoard};
use btrkit_core::mount_rw::{SetAttr, WritableView};
use fuser::{
    BackgroundSession, Config, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, MountOption, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    SessionACL, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may keep names and attributes. Every change comes
/// through this server and the kernel drops what a change makes stale,
/// so the figure only bounds how long a missed case could show.
const TTL: Duration = Duration::from_secs(1);

/// Entries read from the engine for one READDIR(PLUS) request: more than
/// a page of the kernel's buffer holds.
const DIR_BATCH: usize = 128;

/// The view, shared with the server's main thread (the commit interval's
/// tick, the unmount, pulling the plug). None once unmounted.
pub type Shared = Arc<Mutex<Option<WritableView>>>;

struct BtrkitRw {
    view: Shared,
    /// The log syncs' batching board (no client takes a seat: the
    /// requesting processes come and go, so every window runs its ticks,
    /// as the kernel's).
    seats: SeatBoard,
}

/// Mount `view` read-write on `mountpoint`, served by background threads.
pub fn mount(
    view: Shared,
    mountpoint: &Path,
    source: &str,
    allow_other: bool,
    threads: usize,
) -> std::io::Result<BackgroundSession> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::RW,
        MountOption::FSName(source.to_string()),
        MountOption::Subtype("btrkit".into()),
        MountOption::DefaultPermissions,
    ];
    // Device nodes and set-id programs work as on the kernel's mount when
    // root mounts (fusermount3 refuses both to others).
    // (/proc/self belongs to the effective user.)
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    if root {
        cfg.mount_options.push(MountOption::Dev);
        cfg.mount_options.push(MountOption::Suid);
    }
    if allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(threads.max(1));
    cfg.clone_fd = threads > 1;
    fuser::spawn_mount(
        BtrkitRw {
            view,
            seats: SeatBoard::with_window(0),
        },
        mountpoint,
        &cfg,
    )
}

/// The caller's credentials: uid and gid from the request, supplementary
/// groups from /proc (only a non-root caller needs them).
fn creds(req: &Request) -> Creds {
    let (uid, gid) = (req.uid(), req.gid());
    let mut groups = Vec::new();
    if uid != 0 {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) {
            if let Some(line) = s.lines().find(|l| l.starts_with("Groups:")) {
                groups = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|g| g.parse().ok())
                    .collect();
            }
        }
    }
    Creds {
        uid,
        gid,
        groups,
        umask: 0,
    }
}

fn time_of(t: TimeOrNow) -> Option<(i64, u32)> {
    match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(st) => Some(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                // Before the epoch: whole seconds down, nanoseconds up.
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    (-s, 0)
                } else {
                    (-s - 1, 1_000_000_000 - n)
                }
            }
        }),
    }
}

impl BtrkitRw {
    /// The view; a callback that panicked may have left the engine half
    /// way through a change, so the server stops answering (EIO) rather
    /// than build on it.
    fn view(&self) -> Result<MutexGuard<'_, Option<WritableView>>, Errno> {
        match self.view.lock() {
            Ok(g) if g.is_some() => Ok(g),
            _ => Err(Errno::EIO),
        }
    }

    /// fsync, fdatasync, fsyncdir: the inode logged under the view's lock,
    /// the log sync (its batching window and its I/O) without it, so other
    /// requests go on meanwhile and fsyncs of other threads join the same
    /// log sync.
    fn fsync(&self, node: u64, datasync: bool) -> Result<(), Errno> {
        let ticket = {
            let mut g = self.view()?;
            let v = g.as_mut().ok_or(Errno::EIO)?;
            v.fsync_log(node, datasync).map_err(|e| errno(&e))?
        };
        sync_logged(self, &self.seats, ticket).map_err(|e| errno(&e))
    }
}

impl FsHolder for BtrkitRw {
    fn with_fs<R>(
        &self,
        f: impl FnOnce(&mut btrkit_core::fs::Filesystem) -> btrkit_core::Result<R>,
    ) -> btrkit_core::Result<R> {
        let mut g = self.view().map_err(|_| gone())?;
        let v = g.as_mut().ok_or_else(gone)?;
        f(v.fs())
    }
}

/// The view stopped (a panicked request, a failed commit).
fn gone() -> btrkit_core::Error {
    btrkit_core::Error::errno(libc::EIO, "the mount stopped after an error")
}

macro_rules! with_view {
    ($self:ident, $reply:ident, $v:ident => $body:expr) => {{
        let mut guard = match $self.view() {
            Ok(g) => g,
            Err(e) => return $reply.error(e),
        };
        let Some($v) = guard.as_mut() else {
            return $reply.error(Errno::EIO);
        };
        $body
    }};
}

impl fuser::Filesystem for BtrkitRw {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        // The kernel enforces POSIX ACLs from the xattrs (with
        // default_permissions) and leaves the umask to the server, which
        // applies it only where no default ACL is inherited.
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        with_view!(self, reply, v => match v.lookup(parent.0, name.as_bytes()) {
            Ok((n, st)) => reply.entry(&TTL, &attr(n, &st), Generation(st.generation)),
            // A negative entry (node id 0) the kernel may keep as long as a
            // positive one: every change of the namespace goes through it
            // (the image is locked), so it drops or replaces the negative
            // dentry itself when the name comes.
            Err(e) if e.as_errno() == libc::ENOENT => {
                reply.entry(&TTL, &attr(0, &Stat::default()), Generation(0))
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        with_view!(self, reply, v => match v.getattr(ino.0) {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_of),
            mtime: mtime.map(time_of),
        };
        let c = creds(req);
        with_view!(self, reply, v => match v.setattr(ino.0, &a, fh.map(|h| h.0), &c) {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        with_view!(self, reply, v => match v.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let c = Creds {
            umask,
            ..creds(req)
        };
        // FUSE carries new_encode_dev; the inode item holds the kernel's dev_t.
        let rdev = btrkit_core::fs::inode::encode_dev(
            libc::major(u64::from(rdev)),
            libc::minor(u64::from(rdev)),
        );
        with_view!(self, reply, v => match v.mknod(parent.0, name.as_bytes(), mode, rdev, &c) {
            Ok((n, st)) => reply.entry(&TTL, &attr(n, &st), Generation(st.generation)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let c = Creds {
            umask,
            ..creds(req)
        };
        with_view!(self, reply, v => match v.mkdir(parent.0, name.as_bytes(), mode, &c) {
            Ok((n, st)) => reply.entry(&TTL, &attr(n, &st), Generation(st.generation)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        with_view!(self, reply, v => match v.unlink(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        with_view!(self, reply, v => match v.rmdir(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let c = creds(req);
        with_view!(self, reply, v => match v.symlink(parent.0, link_name.as_bytes(), target.as_os_str().as_bytes(), &c) {
            Ok((n, st)) => reply.entry(&TTL, &attr(n, &st), Generation(st.generation)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        with_view!(self, reply, v => match v.rename(parent.0, name.as_bytes(), newparent.0, newname.as_bytes(), flags.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        with_view!(self, reply, v => match v.link(ino.0, newparent.0, newname.as_bytes()) {
            Ok((n, st)) => reply.entry(&TTL, &attr(n, &st), Generation(st.generation)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        with_view!(self, reply, v => match v.open(ino.0, flags.0) {
            Ok(fh) => {
                let f = if flags.0 & libc::O_DIRECT != 0 {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), f)
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let c = Creds {
            umask,
            ..creds(req)
        };
        with_view!(self, reply, v => match v.create(parent.0, name.as_bytes(), mode, flags, &c) {
            Ok((n, st, fh)) => {
                let f = if flags & libc::O_DIRECT != 0 {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                };
                reply.created(&TTL, &attr(n, &st), Generation(st.generation), FileHandle(fh), f)
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        with_view!(self, reply, v => match v.read(ino.0, offset, u64::from(size)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        with_view!(self, reply, v => match v.write(fh.0, ino.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        })
    }

    /// Nothing to do at close(2) before the release: ENOSYS tells the
    /// kernel to stop sending FLUSH (a round trip fewer per close).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// BTRFS_IOC_SYNC commits (`btrkit filesystem sync MNT`): syncfs(2)
    /// never reaches a FUSE server (the kernel sends FUSE_SYNCFS to
    /// virtiofs only), so this is the way to ask for a commit. Every other
    /// ioctl: ENOTTY.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd != btrkit_core::io::host::BTRFS_IOC_SYNC {
            return reply.error(Errno::ENOTTY);
        }
        with_view!(self, reply, v => match v.sync() {
            Ok(()) => reply.ioctl(0, &[]),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        with_view!(self, reply, v => match v.release(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fsync(ino.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Directories are opened by the kernel itself (OPENDIR answered
    /// ENOSYS): no OPENDIR or RELEASEDIR round trip per listing, and the
    /// kernel caches what it read (FOPEN_CACHE_DIR) until a change goes
    /// through it. Reads carry stable offsets (WritableView::read_dir).
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        with_view!(self, reply, v => {
            let entries = match v.read_dir(ino.0, offset, DIR_BATCH) {
                Ok(e) => e,
                Err(e) => return reply.error(errno(&e)),
            };
            for (next, e) in &entries {
                if reply.add(INodeNo(e.node), *next, dirent_kind(e.ftype), OsStr::from_bytes(&e.name)) {
                    break;
                }
            }
            reply.ok()
        })
    }

    /// A listing with every entry's attributes, so walking a directory
    /// (rm -rf, find) needs no lookup per name.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        with_view!(self, reply, v => {
            let entries = match v.read_dir(ino.0, offset, DIR_BATCH) {
                Ok(e) => e,
                Err(e) => return reply.error(errno(&e)),
            };
            for (next, e) in &entries {
                // "." and ".." (offsets 1 and 2 after them) carry no
                // attributes (the kernel looks them up itself); an entry
                // that cannot be read is listed with attributes valid for
                // no time.
                let (a, ttl, generation) = match (*next > 2).then(|| v.getattr(e.node)) {
                    Some(Ok(st)) => (attr(e.node, &st), TTL, st.generation),
                    _ => (
                        FileAttr {
                            kind: dirent_kind(e.ftype),
                            ..attr(e.node, &Stat::default())
                        },
                        Duration::ZERO,
                        0,
                    ),
                };
                if reply.add(
                    INodeNo(e.node),
                    *next,
                    OsStr::from_bytes(&e.name),
                    &ttl,
                    &a,
                    Generation(generation),
                ) {
                    break;
                }
            }
            reply.ok()
        })
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fsync(ino.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        with_view!(self, reply, v => {
            let s = v.space();
            let b = u64::from(s.block.max(1));
            let free = s.total.saturating_sub(s.used) / b;
            reply.statfs(s.total / b, free, free, 0, 0, s.block, 255, s.block)
        })
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        with_view!(self, reply, v => match v.setxattr(ino.0, name.as_bytes(), value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        with_view!(self, reply, v => match v.getxattr(ino.0, name.as_bytes()) {
            Ok(val) => xattr_reply(reply, &val, size),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        with_view!(self, reply, v => match v.listxattr(ino.0) {
            Ok(list) => xattr_reply(reply, &list, size),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        with_view!(self, reply, v => match v.removexattr(ino.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        with_view!(self, reply, v => match v.fallocate(ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        with_view!(self, reply, v => match v.lseek(ino.0, off, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // One reply carries at most u32::MAX bytes; the caller loops.
        let len = len.min(1 << 30);
        with_view!(self, reply, v => match v.copy_range(ino_in.0, offset_in, ino_out.0, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        })
    }
}
