//! The destination of a restore, made relative to open directories.
//!
//! An image's names are hostile: a name may hold `/`, be `..`, or repeat
//! a name already restored in its directory, and the destination may hold
//! symlinks (made by this run from the image, or there before). So
//! nothing here joins path strings: every file, directory, link and node
//! is made by `*at` calls relative to an open directory of the
//! destination, with `O_NOFOLLOW` and `O_EXCL`, and a directory is opened
//! with `O_NOFOLLOW | O_DIRECTORY` before anything is made in it. A
//! symlink is never followed: one where a directory or file should go is
//! an entry that cannot be restored, never a way out of the destination.

use crate::{Error, Result};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

/// Why a name cannot be made in a directory of the destination, or
/// `None` when it can: the kernel never makes such a name, and joined to
/// a path it would lead out of its directory.
pub fn refused_name(name: &[u8]) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty")
    } else if name == b"." || name == b".." {
        Some("a dot entry")
    } else if name.contains(&b'/') {
        Some("holds '/'")
    } else if name.contains(&0) {
        Some("holds NUL")
    } else if name.len() > 255 {
        Some("longer than 255 bytes")
    } else {
        None
    }
}

/// A name as a report shows it: printable ASCII as it is, every other
/// byte (and `\`, and `/` inside a name) as `\xNN`, so two names that
/// differ in bytes never show alike and no shown name is a path.
pub fn escape_name(name: &[u8]) -> String {
    let mut s = String::with_capacity(name.len());
    for &b in name {
        if (0x20..0x7f).contains(&b) && b != b'\\' && b != b'/' {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

fn cname(name: &[u8]) -> std::io::Result<CString> {
    CString::new(name)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "name with a NUL"))
}

fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Whether a host error stops the whole restore (the destination cannot
/// take more) rather than losing one entry.
pub fn is_fatal(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSPC
                | libc::EDQUOT
                | libc::EROFS
                | libc::EIO
                | libc::ENOMEM
                | libc::EMFILE
                | libc::ENFILE
        )
    )
}

/// An open directory of the destination.
#[derive(Debug)]
pub struct DestDir {
    fd: OwnedFd,
}

/// What [`DestDir::make_dir`] found.
pub enum MadeDir {
    /// Made by this call: nothing in it exists yet.
    Fresh(DestDir),
    /// A directory that was there.
    Existing(DestDir),
}

/// What [`DestDir::create_file`] found.
pub enum Created {
    /// A new empty file, open for writing.
    File(File),
    /// Something is there and overwriting was not asked for.
    Exists,
}

impl DestDir {
    /// Open (making it and its parents first if missing) the directory
    /// the user named as the destination. Its own path is the user's:
    /// symlinks in it are followed as for any path given on a command
    /// line; nothing below it is reached by a path.
    pub fn open_root(dest: &Path, create: bool) -> Result<DestDir> {
        if create {
            std::fs::create_dir_all(dest)
                .map_err(|e| Error::io(format!("cannot make {}", dest.display()), e))?;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dest)
            .map_err(|e| Error::io(format!("cannot open {}", dest.display()), e))?;
        Ok(DestDir { fd: f.into() })
    }

    fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    /// Open subdirectory `name`, never through a symlink.
    pub fn open_dir(&self, name: &[u8]) -> std::io::Result<DestDir> {
        let c = cname(name)?;
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd and a NUL-terminated name.
        let fd = check(unsafe {
            libc::openat(
                self.raw(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        #[allow(unsafe_code)]
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(DestDir {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Open the directory `comps` below this one, component by component,
    /// never through a symlink.
    pub fn open_beneath(&self, comps: &[Vec<u8>]) -> std::io::Result<DestDir> {
        let mut cur = self.open_dir(b".")?;
        for c in comps {
            cur = cur.open_dir(c)?;
        }
        Ok(cur)
    }

    /// Make subdirectory `name` (mode 0777 less the umask), or open the
    /// directory that is there. A symlink or another file there is an
    /// error (ENOTDIR / ELOOP): it is never followed.
    pub fn make_dir(&self, name: &[u8]) -> std::io::Result<MadeDir> {
        let c = cname(name)?;
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd and a NUL-terminated name.
        let r = unsafe { libc::mkdirat(self.raw(), c.as_ptr(), 0o777) };
        let fresh = if r == 0 {
            true
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
            false
        };
        let d = self.open_dir(name).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => std::io::Error::new(
                e.kind(),
                "something other than a directory is there (never followed)",
            ),
            _ => e,
        })?;
        Ok(if fresh {
            MadeDir::Fresh(d)
        } else {
            MadeDir::Existing(d)
        })
    }

    /// What is at `name` (not following a symlink), if anything.
    pub fn stat(&self, name: &[u8]) -> std::io::Result<Option<libc::stat>> {
        let c = cname(name)?;
        #[allow(unsafe_code)]
        // SAFETY: zeroed stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd, a NUL-terminated name and a stat
        // buffer.
        let r =
            unsafe { libc::fstatat(self.raw(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(st))
    }

    /// Remove what is at `name` so a new file can go there: a file, a
    /// symlink (itself, not its target) or a special file; never a
    /// directory.
    pub fn remove_for_overwrite(&self, name: &[u8]) -> std::io::Result<()> {
        if let Some(st) = self.stat(name)? {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "a directory is there",
                ));
            }
            let c = cname(name)?;
            #[allow(unsafe_code)]
            // SAFETY: an open directory fd and a NUL-terminated name.
            check(unsafe { libc::unlinkat(self.raw(), c.as_ptr(), 0) })?;
        }
        Ok(())
    }

    /// Create regular file `name`, which must not exist (`O_EXCL`, never
    /// through a symlink); with `overwrite`, what is there (not a
    /// directory) is removed first.
    pub fn create_file(&self, name: &[u8], overwrite: bool) -> std::io::Result<Created> {
        let c = cname(name)?;
        for _ in 0..2 {
            #[allow(unsafe_code)]
            // SAFETY: an open directory fd and a NUL-terminated name.
            let fd = unsafe {
                libc::openat(
                    self.raw(),
                    c.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o666 as libc::c_uint,
                )
            };
            if fd >= 0 {
                #[allow(unsafe_code)]
                // SAFETY: `fd` was just opened and is owned by nothing else.
                return Ok(Created::File(unsafe { File::from_raw_fd(fd) }));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
            if !overwrite {
                return Ok(Created::Exists);
            }
            self.remove_for_overwrite(name)?;
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "made again while being replaced",
        ))
    }

    /// Make symlink `name` pointing at `target` (the target is data: it
    /// is never resolved here).
    pub fn symlink(&self, target: &[u8], name: &[u8]) -> std::io::Result<()> {
        let (t, c) = (cname(target)?, cname(name)?);
        #[allow(unsafe_code)]
        // SAFETY: NUL-terminated strings and an open directory fd.
        check(unsafe { libc::symlinkat(t.as_ptr(), self.raw(), c.as_ptr()) }).map(|_| ())
    }

    /// Make special file `name` (FIFO, socket or device node) with the
    /// type and permission bits of `mode`, less set-id bits.
    pub fn mknod(&self, name: &[u8], mode: u32, rdev: (u32, u32)) -> std::io::Result<()> {
        let c = cname(name)?;
        let dev = libc::makedev(rdev.0, rdev.1);
        let mode = (mode & libc::S_IFMT) | (mode & 0o777);
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd, a NUL-terminated name, plain values.
        check(unsafe { libc::mknodat(self.raw(), c.as_ptr(), mode as libc::mode_t, dev) })
            .map(|_| ())
    }

    /// Hard link `name` here to `from_name` in `from` (a symlink is linked
    /// itself, not followed).
    pub fn link_from(&self, from: &DestDir, from_name: &[u8], name: &[u8]) -> std::io::Result<()> {
        let (a, b) = (cname(from_name)?, cname(name)?);
        #[allow(unsafe_code)]
        // SAFETY: open directory fds and NUL-terminated names.
        check(unsafe { libc::linkat(from.raw(), a.as_ptr(), self.raw(), b.as_ptr(), 0) })
            .map(|_| ())
    }

    /// Owner of `name` itself (a symlink not followed).
    pub fn chown(&self, name: &[u8], uid: u32, gid: u32) -> std::io::Result<()> {
        let c = cname(name)?;
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd and a NUL-terminated name.
        check(unsafe {
            libc::fchownat(self.raw(), c.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW)
        })
        .map(|_| ())
    }

    /// Mode of special file `name` (never a symlink: checked first; a
    /// symlink's mode means nothing).
    pub fn chmod_special(&self, name: &[u8], mode: u32) -> std::io::Result<()> {
        match self.stat(name)? {
            Some(st) if st.st_mode & libc::S_IFMT != libc::S_IFLNK => {}
            _ => return Ok(()),
        }
        let c = cname(name)?;
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd and a NUL-terminated name.
        check(unsafe { libc::fchmodat(self.raw(), c.as_ptr(), mode as libc::mode_t, 0) })
            .map(|_| ())
    }

    /// Access and modification times of `name` itself.
    pub fn set_times(
        &self,
        name: &[u8],
        atime: (i64, u32),
        mtime: (i64, u32),
    ) -> std::io::Result<()> {
        let c = cname(name)?;
        let times = [timespec(atime), timespec(mtime)];
        #[allow(unsafe_code)]
        // SAFETY: an open directory fd, a NUL-terminated name and two
        // timespecs.
        check(unsafe {
            libc::utimensat(
                self.raw(),
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
        .map(|_| ())
    }

    /// Extended attribute of `name` itself (a symlink not followed): set
    /// through this directory's descriptor in /proc, so no path of the
    /// destination is resolved.
    pub fn set_xattr(&self, name: &[u8], xname: &[u8], value: &[u8]) -> std::io::Result<()> {
        let mut p = format!("/proc/self/fd/{}/", self.raw()).into_bytes();
        p.extend_from_slice(name);
        use std::os::unix::ffi::OsStrExt;
        crate::io::host::set_xattr(Path::new(std::ffi::OsStr::from_bytes(&p)), xname, value)
    }

    /// Owner, mode and times of this directory itself.
    pub fn set_own_meta(&self, uid: u32, gid: u32, mode: u32) -> std::io::Result<()> {
        set_fd_owner_mode(self.raw(), uid, gid, mode)
    }

    /// Times of this directory itself.
    pub fn set_own_times(&self, atime: (i64, u32), mtime: (i64, u32)) -> std::io::Result<()> {
        set_fd_times(self.raw(), atime, mtime)
    }

    /// Extended attribute of this directory itself.
    pub fn set_own_xattr(&self, xname: &[u8], value: &[u8]) -> std::io::Result<()> {
        set_fd_xattr(self.raw(), xname, value)
    }
}

fn timespec(t: (i64, u32)) -> libc::timespec {
    libc::timespec {
        tv_sec: t.0 as libc::time_t,
        tv_nsec: t.1.min(999_999_999) as libc::c_long,
    }
}

/// Owner then mode of an open file or directory (the mode after the
/// owner: changing the owner clears set-id bits).
pub fn set_fd_owner_mode(fd: libc::c_int, uid: u32, gid: u32, mode: u32) -> std::io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: an open fd; plain values.
    let chown = check(unsafe { libc::fchown(fd, uid, gid) });
    #[allow(unsafe_code)]
    // SAFETY: an open fd; a plain value.
    let chmod = check(unsafe { libc::fchmod(fd, (mode & 0o7777) as libc::mode_t) });
    chown.and(chmod).map(|_| ())
}

/// Times of an open file or directory.
pub fn set_fd_times(fd: libc::c_int, atime: (i64, u32), mtime: (i64, u32)) -> std::io::Result<()> {
    let times = [timespec(atime), timespec(mtime)];
    #[allow(unsafe_code)]
    // SAFETY: an open fd and two timespecs.
    check(unsafe { libc::futimens(fd, times.as_ptr()) }).map(|_| ())
}

/// Extended attribute of an open file or directory.
pub fn set_fd_xattr(fd: libc::c_int, xname: &[u8], value: &[u8]) -> std::io::Result<()> {
    let n = cname(xname)?;
    #[allow(unsafe_code)]
    // SAFETY: an open fd, a NUL-terminated name and `value.len()` bytes.
    check(unsafe {
        libc::fsetxattr(
            fd,
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    })
    .map(|_| ())
}

/// A directory of the destination shared by the jobs that fill it.
pub type SharedDir = Arc<DestDir>;

use std::os::unix::fs::OpenOptionsExt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_a_directory_are_refused() {
        for n in [&b""[..], b".", b"..", b"a/b", b"../../x", b"a\0b"] {
            assert!(refused_name(n).is_some(), "{n:?}");
        }
        for n in [&b"a"[..], b"...", b"\xff\xfe", b".hidden", b"a b"] {
            assert!(refused_name(n).is_none(), "{n:?}");
        }
        assert!(refused_name(&[b'x'; 256]).is_some());
    }

    #[test]
    fn escaped_names_are_distinct_and_never_paths() {
        assert_eq!(escape_name(b"a/b"), "a\\x2fb");
        assert_eq!(escape_name(b"\xff"), "\\xff");
        assert_ne!(escape_name(b"\\xff"), escape_name(b"\xff"));
        assert!(!escape_name(b"../../x").contains('/'));
    }

    #[test]
    fn a_symlink_in_the_destination_is_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("victim"), b"keep").unwrap();
        let dest = t.path().join("dest");
        let root = DestDir::open_root(&dest, true).unwrap();
        root.symlink(b"../outside", b"d").unwrap();
        root.symlink(b"../outside/victim", b"f").unwrap();
        assert!(root.make_dir(b"d").is_err());
        assert!(root.open_dir(b"d").is_err());
        assert!(matches!(
            root.create_file(b"f", false).unwrap(),
            Created::Exists
        ));
        // Overwriting replaces the symlink itself.
        match root.create_file(b"f", true).unwrap() {
            Created::File(mut f) => {
                use std::io::Write;
                f.write_all(b"new").unwrap();
            }
            Created::Exists => panic!("not replaced"),
        }
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep");
        assert_eq!(std::fs::read(dest.join("f")).unwrap(), b"new");
        assert!(root.open_beneath(&[b"d".to_vec()]).is_err());
    }
}
