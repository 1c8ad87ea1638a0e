//! The engine backend of the script language: steps applied to a mounted
//! [`Filesystem`], with the descriptor table scripts name by path or handle
//! (`open-fd`, `tmpfile`), and manifests of what a user would see.

use super::content::{file_content, file_name, file_size, FillStream};
use super::manifest::{content_hash, md5_hex, push_alloc, Entry, Manifest};
use super::script::{NodeKind, Step, SyncKind, SYNC_RANGE_WAIT_AFTER, SYNC_RANGE_WRITE};
use crate::fs::inode::*;
use crate::fs::read::MapKind;
use crate::fs::{Filesystem, Loc};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};

/// What a step printed (inspection verbs), for the shell to show.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// Text to show the user, None when the step prints nothing.
    pub text: Option<String>,
}

/// Runs steps on a filesystem. Crash, remount and the engine switches need
/// the device and the session, so the caller handles `Crash`, `Remount`
/// and `Set` (see `Session` in btrkit-shell).
pub struct EngineRunner {
    /// Descriptors held by `open-fd` and `tmpfile`, by the name the script
    /// gives them.
    pub fds: HashMap<String, Loc>,
    /// The bytes of a `write` step, a piece at a time (kept: a script
    /// writes many small files, and a fresh zeroed buffer each was a
    /// measurable part of the files benchmark).
    scratch: Vec<u8>,
}

impl Default for EngineRunner {
    fn default() -> Self {
        EngineRunner::new()
    }
}

fn ino_err(path: &str, e: Error) -> Error {
    match e {
        Error::Errno { errno, msg } => Error::Errno {
            errno,
            msg: if msg.contains(path) {
                msg
            } else {
                format!("{path}: {msg}")
            },
        },
        e => e,
    }
}

impl EngineRunner {
    /// A runner holding no descriptors.
    pub fn new() -> EngineRunner {
        EngineRunner {
            fds: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    /// The inode a step names: a held descriptor, or a path.
    fn target(&self, fs: &mut Filesystem, name: &str, follow: bool) -> Result<Loc> {
        if let Some(l) = self.fds.get(name) {
            return Ok(*l);
        }
        fs.resolve(name, follow).map_err(|e| ino_err(name, e))
    }

    /// The file a write names: a held descriptor, the existing file, or a
    /// new one (open with O_CREAT).
    fn target_create(&self, fs: &mut Filesystem, name: &str) -> Result<Loc> {
        if let Some(l) = self.fds.get(name) {
            return Ok(*l);
        }
        match fs.resolve(name, true) {
            Ok(l) => Ok(l),
            Err(Error::Errno {
                errno: libc::ENOENT,
                ..
            }) => {
                let (dir, n) = fs.resolve_parent(name).map_err(|e| ino_err(name, e))?;
                fs.create(dir, &n, 0o644).map_err(|e| ino_err(name, e))
            }
            Err(e) => Err(ino_err(name, e)),
        }
    }

    /// Close every held descriptor (before an unmount or a crash).
    pub fn close_all(&mut self, fs: &mut Filesystem) -> Result<()> {
        let held: Vec<Loc> = self.fds.drain().map(|(_, l)| l).collect();
        for l in held {
            fs.close(l)?;
        }
        Ok(())
    }

    /// Forget descriptors without closing (the filesystem went away).
    pub fn drop_all(&mut self) {
        self.fds.clear();
    }

    /// Apply one step (not `Crash`, `Remount` or `Set`).
    pub fn apply(&mut self, fs: &mut Filesystem, st: &Step) -> Result<StepOutput> {
        self.apply_prepared(fs, st, None)
    }

    /// [`EngineRunner::apply`], with the step's payload made ahead of time
    /// where there is one ([`super::content::prepared_payload`]): the
    /// bytes a write of a generated fill writes.
    pub fn apply_prepared(
        &mut self,
        fs: &mut Filesystem,
        st: &Step,
        payload: Option<&[u8]>,
    ) -> Result<StepOutput> {
        let mut out = StepOutput::default();
        match st {
            Step::Mkdir(p) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                fs.mkdir(d, &n, 0o755).map_err(|e| ino_err(p, e))?;
            }
            Step::Create(p) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                fs.create(d, &n, 0o644).map_err(|e| ino_err(p, e))?;
            }
            Step::Swrite {
                path,
                off,
                len,
                byte,
                datasync,
            } => {
                let l = self.target_create(fs, path)?;
                let buf = vec![*byte; (*len).min(1 << 20) as usize];
                let mut done = 0u64;
                while done < *len {
                    let n = (*len - done).min(buf.len() as u64) as usize;
                    fs.write_sync(l, off + done, &buf[..n], *datasync)
                        .map_err(|e| ino_err(path, e))?;
                    done += n as u64;
                }
            }
            Step::Write {
                path,
                off,
                len,
                fill,
                enospc_ok,
            } => {
                let l = self.target_create(fs, path)?;
                let mut s = FillStream::new(fill);
                let mut done = 0u64;
                let want = (*len).min(1 << 20) as usize;
                // A payload made ahead is the whole write, in one piece as
                // the stream would give it (it is never over a piece).
                let pre = payload.filter(|p| p.len() as u64 == *len && p.len() <= want);
                if pre.is_none() && self.scratch.len() < want {
                    self.scratch.resize(want, 0);
                }
                while done < *len {
                    let n = (*len - done).min(want as u64) as usize;
                    let piece: &[u8] = match pre {
                        Some(p) => p,
                        None => {
                            s.next(&mut self.scratch[..n]);
                            &self.scratch[..n]
                        }
                    };
                    match fs.write(l, off + done, piece) {
                        Ok(()) => {}
                        Err(e) if *enospc_ok && e.as_errno() == libc::ENOSPC => break,
                        Err(e) => return Err(ino_err(path, e)),
                    }
                    done += n as u64;
                    // Dirty data past the limit is written back as it grows.
                    if let Err(e) = fs.periodic() {
                        if *enospc_ok && e.as_errno() == libc::ENOSPC {
                            break;
                        }
                        return Err(e);
                    }
                }
            }
            Step::Dwrite {
                path,
                off,
                len,
                byte,
                chunk,
            } => {
                let l = self.target_create(fs, path)?;
                let buf = vec![*byte; (*chunk).max(1) as usize];
                let mut done = 0u64;
                while done < *len {
                    let n = (*len - done).min(buf.len() as u64) as usize;
                    fs.direct_write(l, off + done, &buf[..n])
                        .map_err(|e| ino_err(path, e))?;
                    done += n as u64;
                }
            }
            Step::Mwrite {
                path,
                off,
                len,
                byte,
            } => {
                let l = self.target(fs, path, true)?;
                fs.mmap_write(l, *off, &vec![*byte; *len as usize])
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::Msync { path, range } => {
                let l = self.target(fs, path, true)?;
                let size = fs.stat(l)?.size;
                let (o, n) = range.unwrap_or((0, size));
                fs.fsync(l, true, Some((o, o.saturating_add(n))))
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::SyncRange {
                path,
                off,
                len,
                flags,
            } => {
                let l = self.target(fs, path, true)?;
                let f = if flags & SYNC_RANGE_WAIT_AFTER != 0 {
                    flags | SYNC_RANGE_WRITE
                } else {
                    *flags
                };
                fs.sync_file_range(l, *off, *len, f)
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::Truncate(p, size) => {
                let l = self.target(fs, p, true)?;
                // Through a path, ftruncate on a descriptor of its own,
                // closed at once (what the close does after a truncate to
                // zero happens then).
                let own = !self.fds.contains_key(p);
                if own {
                    fs.open(l)?;
                }
                let r = fs.truncate(l, *size).map_err(|e| ino_err(p, e));
                if own {
                    fs.close(l)?;
                }
                r?;
            }
            Step::Fallocate {
                path,
                off,
                len,
                keep,
                enospc_ok,
            } => {
                // As fallocate(1): the file is created if missing.
                let l = self.target_create(fs, path)?;
                match fs.ranges().fallocate(l, *off, *len, *keep) {
                    Err(e) if *enospc_ok && e.as_errno() == libc::ENOSPC => {}
                    r => r.map_err(|e| ino_err(path, e))?,
                }
            }
            Step::Punch { path, off, len } => {
                // As fallocate(1): the file is created if missing.
                let l = self.target_create(fs, path)?;
                fs.ranges()
                    .punch_hole(l, *off, *len)
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::ZeroRange {
                path,
                off,
                len,
                keep,
            } => {
                // As fallocate(1): the file is created if missing.
                let l = self.target_create(fs, path)?;
                fs.ranges()
                    .zero_range(l, *off, *len, *keep)
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::Collapse { path, off, len } => {
                // As fallocate(1): the file is created if missing.
                let l = self.target_create(fs, path)?;
                fs.ranges()
                    .collapse_range(l, *off, *len)
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::Clone {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                let s = self.target(fs, src, true)?;
                let d = self.target_create(fs, dst)?;
                fs.ranges()
                    .clone_range(s, *src_off, d, *dst_off, *len)
                    .map_err(|e| ino_err(dst, e))?;
            }
            Step::Link(a, b) => {
                let t = fs.resolve(a, false).map_err(|e| ino_err(a, e))?;
                let (d, n) = fs.resolve_parent(b).map_err(|e| ino_err(b, e))?;
                fs.link(t, d, &n).map_err(|e| ino_err(b, e))?;
            }
            Step::Symlink { target, path } => {
                let (d, n) = fs.resolve_parent(path).map_err(|e| ino_err(path, e))?;
                fs.symlink(d, &n, target.as_bytes())
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::Rename(a, b) => {
                let (od, on) = fs.resolve_parent(a).map_err(|e| ino_err(a, e))?;
                let (nd, nn) = fs.resolve_parent(b).map_err(|e| ino_err(b, e))?;
                fs.rename(od, &on, nd, &nn).map_err(|e| ino_err(a, e))?;
            }
            Step::Exchange(a, b) => {
                let (od, on) = fs.resolve_parent(a).map_err(|e| ino_err(a, e))?;
                let (nd, nn) = fs.resolve_parent(b).map_err(|e| ino_err(b, e))?;
                fs.rename2(od, &on, nd, &nn, crate::fs::rename::RENAME_EXCHANGE)
                    .map_err(|e| ino_err(a, e))?;
            }
            Step::Unlink(p) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                fs.unlink(d, &n).map_err(|e| ino_err(p, e))?;
            }
            Step::Rmdir(p) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                fs.rmdir(d, &n).map_err(|e| ino_err(p, e))?;
            }
            Step::SetXattr { path, name, value } => {
                let l = self.target(fs, path, false)?;
                fs.xattrs()
                    .set_xattr(l, name.as_bytes(), value)
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::RemoveXattr { path, name } => {
                let l = self.target(fs, path, false)?;
                fs.xattrs()
                    .remove_xattr(l, name.as_bytes())
                    .map_err(|e| ino_err(path, e))?;
            }
            Step::Fsync(p) | Step::Fdatasync(p) => {
                let l = self.target(fs, p, true)?;
                fs.fsync(l, matches!(st, Step::Fdatasync(_)), None)
                    .map_err(|e| ino_err(p, e))?;
            }
            Step::Sync => fs.sync()?,
            Step::Chmod(p, m) => {
                let l = self.target(fs, p, true)?;
                fs.chmod(l, *m).map_err(|e| ino_err(p, e))?;
            }
            Step::Chown(p, u, g) => {
                let l = self.target(fs, p, false)?;
                fs.chown(l, *u, *g).map_err(|e| ino_err(p, e))?;
            }
            Step::Touch(p) => {
                let l = match fs.resolve(p, true) {
                    Ok(l) => l,
                    Err(Error::Errno {
                        errno: libc::ENOENT,
                        ..
                    }) => {
                        let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                        fs.create(d, &n, 0o644).map_err(|e| ino_err(p, e))?
                    }
                    Err(e) => return Err(ino_err(p, e)),
                };
                fs.set_times(l, None).map_err(|e| ino_err(p, e))?;
            }
            Step::Mknod(p, kind) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                let (mode, rdev) = match kind {
                    NodeKind::Fifo => (S_IFIFO | 0o644, 0),
                    NodeKind::Chr(a, b) => (S_IFCHR | 0o644, encode_dev(*a, *b)),
                    NodeKind::Blk(a, b) => (S_IFBLK | 0o644, encode_dev(*a, *b)),
                };
                fs.mknod(d, &n, mode, rdev).map_err(|e| ino_err(p, e))?;
            }
            Step::Tmpfile(h) => {
                let root = fs.root();
                let l = fs.tmpfile(root, 0o644)?;
                if let Some(old) = self.fds.insert(h.clone(), l) {
                    fs.close(old)?;
                }
            }
            Step::OpenFd(p) => {
                let l = fs.resolve(p, true).map_err(|e| ino_err(p, e))?;
                fs.open(l)?;
                if let Some(old) = self.fds.insert(p.clone(), l) {
                    fs.close(old)?;
                }
            }
            Step::CloseFd(p) => {
                let l = self
                    .fds
                    .remove(p)
                    .ok_or_else(|| Error::errno(libc::EBADF, format!("close-fd {p}: not open")))?;
                fs.close(l)?;
            }
            Step::Evict => fs.evict(),
            Step::Sleep(s) => fs.advance_clock(std::time::Duration::from_secs_f64(*s))?,
            Step::SubvolCreate(p) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                fs.subvols()
                    .subvol_create(d, &n)
                    .map_err(|e| ino_err(p, e))?;
            }
            Step::Snapshot(a, b) => {
                let src = fs.resolve(a, true).map_err(|e| ino_err(a, e))?;
                let (d, n) = fs.resolve_parent(b).map_err(|e| ino_err(b, e))?;
                fs.subvols()
                    .snapshot(src, d, &n)
                    .map_err(|e| ino_err(b, e))?;
            }
            Step::SubvolDelete(p) => {
                let (d, n) = fs.resolve_parent(p).map_err(|e| ino_err(p, e))?;
                fs.subvols()
                    .subvol_delete(d, &n)
                    .map_err(|e| ino_err(p, e))?;
            }
            Step::SubvolSetDefault(p) => {
                let l = fs.resolve(p, true).map_err(|e| ino_err(p, e))?;
                fs.subvols()
                    .set_default_subvol(l)
                    .map_err(|e| ino_err(p, e))?;
            }
            Step::QuotaEnable => fs.subvols().quota_enable()?,
            Step::BalanceMetadata => fs.subvols().balance_metadata()?,
            Step::Balance(args) => {
                let req = crate::balance::parse_args(args)?.normalize()?;
                crate::balance::on_filesystem(fs, &req)?;
            }
            Step::WriteFiles {
                dir,
                count,
                min,
                max,
                sync,
            } => {
                let d = fs.resolve(dir, true).map_err(|e| ino_err(dir, e))?;
                for i in 0..*count {
                    let name = file_name(i);
                    let l = fs
                        .mknod(d, name.as_bytes(), S_IFREG | 0o644, 0)
                        .map_err(|e| ino_err(&format!("{dir}/{name}"), e))?;
                    fs.write(l, 0, &file_content(i, file_size(i, *min, *max)))?;
                    match sync {
                        SyncKind::None => {}
                        SyncKind::Fsync => fs.fsync(l, false, None)?,
                        SyncKind::Fdatasync => fs.fsync(l, true, None)?,
                    }
                    fs.periodic()?;
                }
            }
            Step::Read { path, off, len } => {
                let l = self.target(fs, path, true)?;
                let size = fs.stat(l)?.size;
                let n = len.unwrap_or(size.saturating_sub(*off));
                let data = fs.read(l, *off, n).map_err(|e| ino_err(path, e))?;
                out.text = Some(render_bytes(&data));
            }
            Step::Ls(p) => {
                let l = self.target(fs, p, true)?;
                let mut lines = Vec::new();
                for (name, child, _) in fs.readdir(l).map_err(|e| ino_err(p, e))? {
                    let s = fs.stat(child)?;
                    lines.push(format!(
                        "{:>8} {} {:>3} {:>12} {:>20} {}",
                        s.ino,
                        mode_string(s.mode),
                        s.nlink,
                        s.size,
                        time_string(s.mtime),
                        String::from_utf8_lossy(&name)
                    ));
                }
                out.text = Some(lines.join("\n"));
            }
            Step::Stat(p) => {
                let l = self.target(fs, p, false)?;
                let s = fs.stat(l).map_err(|e| ino_err(p, e))?;
                out.text = Some(format!(
                    "subvol {} ino {} mode {} nlink {} uid {} gid {} size {} blocks {} rdev {}:{} generation {} flags {:#x} atime {} mtime {} ctime {} otime {}",
                    s.subvol,
                    s.ino,
                    mode_string(s.mode),
                    s.nlink,
                    s.uid,
                    s.gid,
                    s.size,
                    s.blocks,
                    s.rdev.0,
                    s.rdev.1,
                    s.generation,
                    s.flags,
                    time_string(s.atime),
                    time_string(s.mtime),
                    time_string(s.ctime),
                    time_string(s.otime)
                ));
            }
            Step::Stats { .. } | Step::Set { .. } | Step::Crash { .. } | Step::Remount => {
                return Err(Error::Invalid(format!(
                    "{}: handled by the session",
                    st.verb()
                )));
            }
        }
        fs.periodic()?;
        Ok(out)
    }
}

/// `ls -l`-style mode.
pub fn mode_string(mode: u32) -> String {
    let t = match mode & S_IFMT {
        S_IFDIR => 'd',
        S_IFLNK => 'l',
        S_IFIFO => 'p',
        S_IFCHR => 'c',
        S_IFBLK => 'b',
        S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (0o400 >> i) != 0 { c } else { '-' });
    }
    s
}

/// A time as `stat` and `ls` show it: signed seconds since the epoch
/// (negative before 1970) and nanoseconds, `-1.500000000` for half a
/// second before it.
pub fn time_string((sec, nsec): (i64, u32)) -> String {
    format!("{sec}.{nsec:09}")
}

/// Bytes for `read`: text when printable, else a hex dump.
fn render_bytes(d: &[u8]) -> String {
    if d.iter()
        .all(|&b| b == b'\n' || b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return String::from_utf8_lossy(d).into_owned();
    }
    let mut s = String::new();
    for (i, chunk) in d.chunks(16).enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(&format!("{:08x} ", i * 16));
        for b in chunk {
            s.push_str(&format!(" {b:02x}"));
        }
    }
    s
}

/// What a user would see of every path, through the engine (dirty data
/// included, as a reader of the live filesystem sees it).
pub fn manifest(fs: &mut Filesystem) -> Result<Manifest> {
    let mut m = Manifest::default();
    let root = fs.root();
    let mut stack = vec![("/".to_string(), root)];
    let mut guard = 0usize;
    while let Some((path, l)) = stack.pop() {
        guard += 1;
        if guard > 50_000_000 {
            return Err(Error::Invalid("manifest: too many paths".into()));
        }
        let e = describe(fs, l)?;
        if e.kind == 'd' {
            for (name, child, _) in fs.readdir(l)? {
                let n = String::from_utf8_lossy(&name);
                stack.push((
                    if path == "/" {
                        format!("/{n}")
                    } else {
                        format!("{path}/{n}")
                    },
                    child,
                ));
            }
        }
        m.entries.insert(path, e);
    }
    Ok(m)
}

fn describe(fs: &mut Filesystem, l: Loc) -> Result<Entry> {
    let s = fs.stat(l)?;
    let kind = match s.mode & S_IFMT {
        S_IFREG => 'f',
        S_IFDIR => 'd',
        S_IFLNK => 'l',
        S_IFIFO => 'p',
        S_IFCHR => 'c',
        S_IFBLK => 'b',
        _ => 's',
    };
    let mut xattrs = BTreeMap::new();
    for (n, v) in fs.xattrs().list_xattrs(l)? {
        if n.starts_with(b"user.") {
            xattrs.insert(String::from_utf8_lossy(&n).into_owned(), v);
        }
    }
    let mut e = Entry {
        kind,
        ino: s.ino,
        mode: s.mode & 0o7777,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        nlink: s.nlink as u64,
        hash: None,
        md5: None,
        target: None,
        rdev: None,
        xattrs,
        alloc: Vec::new(),
    };
    match kind {
        'f' => {
            let data = fs.read_untracked(l, 0, s.size)?;
            e.hash = Some(content_hash(&data));
            e.md5 = Some(md5_hex(&data));
            e.alloc = alloc_map(fs, l)?;
        }
        'l' => e.target = Some(String::from_utf8_lossy(&fs.read_link(l)?).into_owned()),
        'c' | 'b' => e.rdev = Some(s.rdev),
        _ => {}
    }
    Ok(e)
}

/// The extent map as FIEMAP shows it, with dirty (delalloc) ranges as data.
fn alloc_map(fs: &mut Filesystem, l: Loc) -> Result<Vec<(u64, u64, &'static str)>> {
    let mut runs: Vec<(u64, u64, &'static str)> =
        crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino)?
            .into_iter()
            .map(|(s, e, k)| {
                (
                    s,
                    e,
                    if k == MapKind::Data {
                        "data"
                    } else {
                        "unwritten"
                    },
                )
            })
            .collect();
    let dirty = fs.rt(l)?.pages.dirty_ranges();
    if !dirty.is_empty() {
        // Dirty pages win over what the disk holds.
        let mut cut: Vec<(u64, u64, &'static str)> = Vec::new();
        for (s, e, k) in runs {
            let mut pieces = vec![(s, e)];
            for &(ds, de) in &dirty {
                pieces = pieces
                    .into_iter()
                    .flat_map(|(a, b)| {
                        let mut v = Vec::new();
                        if a < ds.min(b) {
                            v.push((a, ds.min(b)));
                        }
                        if de.max(a) < b {
                            v.push((de.max(a), b));
                        }
                        v
                    })
                    .collect();
            }
            cut.extend(pieces.into_iter().map(|(a, b)| (a, b, k)));
        }
        cut.extend(dirty.iter().map(|&(a, b)| (a, b, "data")));
        cut.sort();
        runs = cut;
    }
    let mut out = Vec::new();
    for (s, e, k) in runs {
        push_alloc(&mut out, s, e, k);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_show_signed() {
        assert_eq!(super::time_string((-1, 500_000_000)), "-1.500000000");
        assert_eq!(
            super::time_string((-315_619_200, 0)),
            "-315619200.000000000"
        );
        assert_eq!(super::time_string((7, 5)), "7.000000005");
    }
}
