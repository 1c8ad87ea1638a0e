//! The FUSE side: fuser's callbacks answered from a [`ReadOnlyView`].
//! Nothing here decides anything about Btrfs; it converts.

use btrkit_core::format::dir::name_fault;
use btrkit_core::fs::ops::Stat;
use btrkit_core::log::inspect::escape_bytes;
use btrkit_core::mount_view::{ReadOnlyView, ROOT_NODE};
use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, Notifier, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyXattr, Request, SessionACL,
};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache names and attributes: the filesystem
/// never changes while mounted.
const TTL: Duration = Duration::from_secs(3600);

struct Btrkit {
    view: Mutex<ReadOnlyView>,
    /// Which names are served (taken after `view` when both are held).
    names: Mutex<Names>,
    /// Set once the session runs: pushes data into the kernel's cache.
    notifier: Arc<OnceLock<Notifier>>,
    /// Contents to push for the entries of the last listing answered: the
    /// kernel makes their inodes only when the listing process reads the
    /// answer, so they are pushed at the next request (the listing's next
    /// call, or its release), when the inodes exist.
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
}

/// The names the mount serves, so that a hostile image still gives the
/// kernel a tree of well-formed names:
///
/// - an entry whose name the kernel would refuse (empty, `.`, `..`, with
///   a `/` or a NUL) is skipped: FUSE fails a whole listing on one such
///   name (EIO), and a `..` would shadow the real parent;
/// - a directory is served under one name only, the first met (by a
///   lookup or a listing): a second name of a directory inode (a
///   hard-linked directory, or an entry pointing back at an ancestor,
///   which is a cycle) is hidden, so nothing walking the mount can
///   recurse forever, and the kernel never sees one directory inode
///   under two parents.
///
/// Each skipped entry is said once, as a warning naming the directory's
/// inode and the name's bytes (escaped).
struct Names {
    /// Directory node -> (parent node, name) it is served under. The root
    /// is served as itself, under no name.
    homes: HashMap<u64, (u64, Vec<u8>)>,
    /// (directory node, name) of every entry skipped and said so.
    warned: HashSet<(u64, Vec<u8>)>,
}

impl Names {
    fn new() -> Names {
        Names {
            homes: HashMap::from([(ROOT_NODE, (ROOT_NODE, Vec::new()))]),
            warned: HashSet::new(),
        }
    }

    /// Whether entry `name` of directory `dir`, which names `node` (a
    /// directory when `is_dir`), is served; Err says why it is not. The
    /// first directory entry met for a directory node becomes its home.
    fn admit(&mut self, dir: u64, name: &[u8], node: u64, is_dir: bool) -> Result<(), String> {
        if let Some(why) = name_fault(name) {
            return Err(format!("its name {why}"));
        }
        // A directory already homed is one even if this entry says not.
        if !is_dir && !self.homes.contains_key(&node) {
            return Ok(());
        }
        match self.homes.get(&node) {
            Some((p, n)) if *p == dir && n.as_slice() == name => Ok(()),
            Some(_) if node == ROOT_NODE => {
                Err("it names the mount's root directory (a directory cycle)".into())
            }
            Some((p, n)) => Err(format!(
                "it is a second name of directory node {node}, served as \"{}\" in directory node {p} (a directory has one name; a cycle, or a hard-linked directory)",
                escape_bytes(n)
            )),
            None => {
                self.homes.insert(node, (dir, name.to_vec()));
                Ok(())
            }
        }
    }

    /// True the first time entry `name` of `dir` is skipped.
    fn first_warning(&mut self, dir: u64, name: &[u8]) -> bool {
        self.warned.insert((dir, name.to_vec()))
    }
}

/// Say once that entry `name` of directory node `dir` is skipped, naming
/// the directory's inode (and subvolume) and the name's bytes.
fn skipped(v: &mut ReadOnlyView, names: &mut Names, dir: u64, name: &[u8], why: &str) {
    if !names.first_warning(dir, name) {
        return;
    }
    let inode = match v.getattr(dir) {
        Ok(st) => format!("directory inode {} of subvolume {}", st.ino, st.subvol),
        Err(_) => format!("directory node {dir}"),
    };
    crate::say(format_args!(
        "warning: {inode}: entry \"{}\" skipped: {why}",
        escape_bytes(name)
    ));
}

/// Regular files this small with inline data have their contents pushed
/// into the kernel's page cache with the listing that names them
/// (FUSE_NOTIFY_STORE): the data sits in the leaf the listing's
/// attributes came from, and reading the file then needs no request. A
/// page of cache per such file, reclaimable like any other.
const PUSH_INLINE: u64 = 4096;

/// Mount `view` on `mountpoint`, served by a background thread.
pub fn mount(
    view: ReadOnlyView,
    mountpoint: &Path,
    source: &str,
    allow_other: bool,
    threads: usize,
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
    // Several threads wait on the device, so a request finds one ready
    // while the last answer is still on its way: the wait between two
    // requests, not the answering, is most of a small file's read.
    cfg.n_threads = Some(threads.max(1));
    cfg.clone_fd = threads > 1;
    let notifier = Arc::new(OnceLock::new());
    let session = fuser::spawn_mount(
        Btrkit {
            view: Mutex::new(view),
            names: Mutex::new(Names::new()),
            notifier: notifier.clone(),
            pending: Mutex::new(Vec::new()),
        },
        mountpoint,
        &cfg,
    )?;
    let _ = notifier.set(session.notifier());
    Ok(session)
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
            // Bytes, not a str slice: a multibyte character after a
            // backslash is no boundary to cut at.
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
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

pub(crate) fn errno(e: &btrkit_core::Error) -> Errno {
    let n = e.as_errno();
    if n == libc::EIO {
        // A read the kernel would also fail: say why, once per failure.
        crate::say(format_args!("{e}"));
    }
    Errno::from_i32(n)
}

/// A time of (seconds, negative before 1970; nanoseconds) as FUSE takes
/// it. Never a panic: a time before the epoch is `UNIX_EPOCH - Duration`
/// (-1 s and 500,000,000 ns is half a second before it), and the
/// arithmetic is checked: a time SystemTime cannot hold falls back to its
/// whole seconds, then to the epoch.
fn time(t: (i64, u32)) -> SystemTime {
    let secs = Duration::from_secs(t.0.unsigned_abs());
    let nsec = Duration::from_nanos(u64::from(t.1.min(999_999_999)));
    let whole = if t.0 >= 0 {
        UNIX_EPOCH.checked_add(secs)
    } else {
        UNIX_EPOCH.checked_sub(secs)
    };
    whole.map_or(UNIX_EPOCH, |w| w.checked_add(nsec).unwrap_or(w))
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

pub(crate) fn dirent_kind(ftype: u8) -> FileType {
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

pub(crate) fn attr(node: u64, s: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(node),
        size: s.size,
        blocks: s.blocks,
        atime: time(s.atime),
        mtime: time(s.mtime),
        ctime: time(s.ctime),
        crtime: time(s.otime),
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
    /// Push what the last listing left pending (see `pending`). A push
    /// the kernel refuses (an inode it has dropped already) only costs
    /// the request it would have saved.
    fn push_pending(&self) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for (node, data) in batch {
            let _ = n.store(INodeNo(node), 0, &data);
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, ReadOnlyView> {
        // A callback that panicked left the view as it was (it is only
        // read): go on serving.
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Taken while the view is held, never the other way round.
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// FUSE shows the node id as `st_ino` ([`ReadOnlyView`] picks them).
impl fuser::Filesystem for Btrkit {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Every request is a round trip between two processes, which costs
        // more than answering it: large reads, symlinks cached, and
        // readdirplus (a listing carries every entry's attributes, so no
        // lookup per name follows).
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut v = self.view();
        let name = name.as_bytes();
        if name_fault(name).is_some() {
            // The kernel sends no such name; an entry with one is not served.
            reply.error(Errno::ENOENT);
            return;
        }
        let r = v.lookup(parent.0, name);
        for w in v.take_warnings() {
            crate::say(format_args!("warning: {w}"));
        }
        match r {
            Ok((n, st)) => {
                let mut names = self.names();
                let is_dir = st.mode & libc::S_IFMT == libc::S_IFDIR;
                if let Err(why) = names.admit(parent.0, name, n, is_dir) {
                    skipped(&mut v, &mut names, parent.0, name, &why);
                    reply.error(Errno::ENOENT);
                    return;
                }
                reply.entry(&TTL, &attr(n, &st), Generation(0))
            }
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

    /// ENOSYS tells the kernel that files need no open and no release
    /// (its no_open mode): two round trips fewer per file. The mount is
    /// read-only, so the VFS refuses opens for writing before they come
    /// here; the data needs no per-open state.
    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            reply.error(Errno::EROFS);
            return;
        }
        reply.error(Errno::ENOSYS);
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
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut v = self.view();
        let entries = match v.dir_entries(fh.0) {
            Ok(e) => e,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        let mut names = self.names();
        // Offsets index the whole listing, so a skipped entry leaves a gap
        // and the next call resumes where this one stopped.
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, e) in entries.iter().enumerate().skip(start) {
            // The first two are the view's own "." and "..".
            if i >= 2 {
                let is_dir = e.ftype == btrkit_core::format::consts::BTRFS_FT_DIR;
                if let Err(why) = names.admit(ino.0, &e.name, e.node, is_dir) {
                    skipped(&mut v, &mut names, ino.0, &e.name, &why);
                    continue;
                }
            }
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

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut v = self.view();
        let entries = match v.dir_entries(fh.0) {
            Ok(e) => e,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        let mut small: Vec<(u64, u64)> = Vec::new();
        let mut names = self.names();
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, e) in entries.iter().enumerate().skip(start) {
            if i >= 2 {
                if let Some(why) = name_fault(&e.name) {
                    skipped(
                        &mut v,
                        &mut names,
                        ino.0,
                        &e.name,
                        &format!("its name {why}"),
                    );
                    continue;
                }
            }
            // An entry whose inode cannot be read is listed with attributes
            // valid for no time: using it asks lookup again, which fails
            // with the error.
            let (a, ttl) = match v.getattr(e.node) {
                Ok(st) => (attr(e.node, &st), TTL),
                Err(_) => (
                    FileAttr {
                        kind: dirent_kind(e.ftype),
                        ..attr(e.node, &Stat::default())
                    },
                    Duration::ZERO,
                ),
            };
            if i >= 2 {
                let is_dir = a.kind == FileType::Directory;
                if let Err(why) = names.admit(ino.0, &e.name, e.node, is_dir) {
                    skipped(&mut v, &mut names, ino.0, &e.name, &why);
                    continue;
                }
            }
            if reply.add(
                INodeNo(e.node),
                i as u64 + 1,
                OsStr::from_bytes(&e.name),
                &ttl,
                &a,
                Generation(0),
            ) {
                break;
            }
            if a.kind == FileType::RegularFile && i >= 2 {
                small.push((e.node, a.size));
            }
        }
        drop(names);
        reply.ok();
        self.push_pending();
        if self.notifier.get().is_some() {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            for (node, size) in small {
                if let Some(data) = v.inline_contents(node, size, PUSH_INLINE) {
                    p.push((node, data));
                }
            }
        }
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
        self.push_pending();
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
pub(crate) fn xattr_reply(reply: ReplyXattr, val: &[u8], size: u32) {
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
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_before_the_epoch() {
        let t = super::time;
        assert_eq!(t((0, 0)), UNIX_EPOCH);
        // 1960-01-01 00:00:00 UTC.
        assert_eq!(
            t((-315_619_200, 0)),
            UNIX_EPOCH - Duration::from_secs(315_619_200)
        );
        // 1969-12-31 23:59:59.5: half a second before the epoch.
        assert_eq!(
            t((-1, 500_000_000)),
            UNIX_EPOCH - Duration::from_millis(500)
        );
        assert_eq!(t((5, u32::MAX)), UNIX_EPOCH + Duration::new(5, 999_999_999));
        // The extremes do not panic.
        for s in [i64::MIN, i64::MIN + 1, i64::MAX, i64::MAX - 1] {
            let _ = t((s, 999_999_999));
        }
    }

    #[test]
    fn names_served_once() {
        use super::{Names, ROOT_NODE};
        let mut n = Names::new();
        // Names the kernel refuses.
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert!(n.admit(ROOT_NODE, bad, 300, false).is_err(), "{bad:?}");
        }
        // A directory is served under its first name, again and again.
        assert!(n.admit(ROOT_NODE, b"top", 257, true).is_ok());
        assert!(n.admit(ROOT_NODE, b"top", 257, true).is_ok());
        assert!(n.admit(257, b"mid", 258, true).is_ok());
        // A second name: in another directory, or back at an ancestor
        // (a cycle), or at the root; even when its entry says it is a file.
        let e = n.admit(ROOT_NODE, b"other", 258, true).unwrap_err();
        assert!(e.contains("second name of directory node 258"), "{e}");
        assert!(n.admit(258, b"loop", 257, true).is_err());
        assert!(n.admit(258, b"lies", 257, false).is_err());
        assert!(n.admit(258, b"root", ROOT_NODE, true).is_err());
        // Files may have many names.
        assert!(n.admit(ROOT_NODE, b"f", 400, false).is_ok());
        assert!(n.admit(258, b"g", 400, false).is_ok());
        // Each skipped entry is said once.
        assert!(n.first_warning(258, b"loop"));
        assert!(!n.first_warning(258, b"loop"));
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(super::unescape("/a\\040b\\134c"), b"/a b\\c");
        assert_eq!(super::unescape("/plain"), b"/plain");
        assert_eq!(super::unescape("/\\abé"), "/\\abé".as_bytes());
    }
}
