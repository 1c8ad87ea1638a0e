//! The FUSE side: fuser's callbacks answered from a [`ReadOnlyView`].
//! Nothing here decides anything about Btrfs; it converts.

use btrkit_core::fs::ops::Stat;
use btrkit_core::restore::view::ReadOnlyView;
use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
    SessionACL,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache names and attributes: the filesystem
/// never changes while mounted.
const TTL: Duration = Duration::from_secs(3600);

struct Btrkit {
    view: Mutex<ReadOnlyView>,
}

/// Mount `view` on `mountpoint`, served by a background thread.
pub fn mount(
    view: ReadOnlyView,
    mountpoint: &Path,
    source: &str,
    allow_other: bool,
) -> std::io::Result<BackgroundSession> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::RO,
        MountOption::FSName(source.to_string()),
        MountOption::Subtype("btrkit".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if allow_other {
        cfg.acl = SessionACL::All;
    }
    fuser::spawn_mount(
        Btrkit {
            view: Mutex::new(view),
        },
        mountpoint,
        &cfg,
    )
}

/// How many FUSE filesystems are mounted at `target` (canonical).
pub fn mounts_at(target: &Path) -> usize {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    info.lines()
        .filter(|l| {
            let mut halves = l.splitn(2, " - ");
            let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
                return false;
            };
            let at = left.split(' ').nth(4).map(unescape);
            // Mounted by root, the type is plain "fuse"; through fusermount3,
            // "fuse.btrkit".
            at.as_deref() == Some(target.as_os_str().as_bytes())
                && (right.starts_with("fuse ") || right.starts_with("fuse.btrkit "))
        })
        .count()
}

/// mountinfo writes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() + 1 && b[i + 1..].len() >= 3 {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn errno(e: &btrkit_core::Error) -> Errno {
    let n = e.as_errno();
    if n == libc::EIO {
        // A read the kernel would also fail: say why, once per failure.
        crate::say(format_args!("{e}"));
    }
    Errno::from_i32(n)
}

fn time(t: (u64, u32)) -> SystemTime {
    UNIX_EPOCH + Duration::new(t.0, t.1.min(999_999_999))
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn dirent_kind(ftype: u8) -> FileType {
    use btrkit_core::format::consts::*;
    match ftype {
        BTRFS_FT_DIR => FileType::Directory,
        BTRFS_FT_SYMLINK => FileType::Symlink,
        BTRFS_FT_CHRDEV => FileType::CharDevice,
        BTRFS_FT_BLKDEV => FileType::BlockDevice,
        BTRFS_FT_FIFO => FileType::NamedPipe,
        BTRFS_FT_SOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn attr(node: u64, s: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(node),
        size: s.size,
        blocks: s.blocks,
        atime: time(s.atime),
        mtime: time(s.mtime),
        ctime: time(s.ctime),
        crtime: time(s.ctime),
        kind: kind(s.mode),
        perm: (s.mode & 0o7777) as u16,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: libc::makedev(s.rdev.0, s.rdev.1) as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl Btrkit {
    fn view(&self) -> std::sync::MutexGuard<'_, ReadOnlyView> {
        // A callback that panicked left the view as it was (it is only
        // read): go on serving.
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// FUSE shows the node id as `st_ino` ([`ReadOnlyView`] picks them).
impl fuser::Filesystem for Btrkit {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large reads, symlinks cached: fewer round trips per file.
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut v = self.view();
        let r = v.lookup(parent.0, name.as_bytes());
        for w in v.take_warnings() {
            crate::say(format_args!("warning: {w}"));
        }
        match r {
            Ok((n, st)) => reply.entry(&TTL, &attr(n, &st), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut v = self.view();
        match v.getattr(ino.0) {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.view().readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            reply.error(Errno::EROFS);
            return;
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
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
        match self.view().read(ino.0, offset, u64::from(size)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut v = self.view();
        let r = v.opendir(ino.0);
        for w in v.take_warnings() {
            crate::say(format_args!("warning: {w}"));
        }
        match r {
            Ok(h) => reply.opened(
                FileHandle(h),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let v = self.view();
        let entries = match v.dir_entries(fh.0) {
            Ok(e) => e,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let full = reply.add(
                INodeNo(e.node),
                i as u64 + 1,
                dirent_kind(e.ftype),
                OsStr::from_bytes(&e.name),
            );
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.view().releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.view().space();
        let b = u64::from(s.block.max(1));
        let free = s.total.saturating_sub(s.used) / b;
        reply.statfs(s.total / b, free, free, 0, 0, s.block, 255, s.block);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.view().getxattr(ino.0, name.as_bytes()) {
            Ok(val) => xattr_reply(reply, &val, size),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.view().listxattr(ino.0) {
            Ok(list) => xattr_reply(reply, &list, size),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// getxattr/listxattr: the size when asked with 0, the value when it fits,
/// ERANGE when it does not.
fn xattr_reply(reply: ReplyXattr, val: &[u8], size: u32) {
    if size == 0 {
        reply.size(val.len() as u32);
    } else if val.len() <= size as usize {
        reply.data(val);
    } else {
        reply.error(Errno::ERANGE);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes() {
        assert_eq!(super::unescape("/a\\040b\\134c"), b"/a b\\c");
        assert_eq!(super::unescape("/plain"), b"/plain");
    }
}
