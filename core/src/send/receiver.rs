//! `btrfs receive` into an image: each stream's subvolume is created (or,
//! for an incremental stream, snapshotted from the subvolume it names as
//! its parent) under a directory of the filesystem, its commands applied
//! through the engine as the kernel applies btrfs-progs' system calls, and
//! at its END the subvolume gets `received_uuid`, `stransid`, `rtransid`
//! and read-only (BTRFS_IOC_SET_RECEIVED_SUBVOL, then SUBVOL_SETFLAGS).
//!
//! A stream is untrusted: every path is resolved inside the subvolume
//! being received (no `..`, no `.`, no symlink followed on the way), so
//! nothing outside it changes; a malformed or cut stream is an error and
//! leaves the subvolume as far as it got, writable and without
//! `received_uuid`, as the kernel leaves it.

use super::stream::{self, Command, Next, StreamReader};
use crate::format::consts::*;
use crate::fs::{Filesystem, Loc};
use crate::{Error, Result};
use serde::Serialize;
use std::io::Read;

/// How to receive.
#[derive(Clone, Copy, Debug)]
pub struct ReceiveOptions {
    /// Stop after this many failed commands (0: never), as `--max-errors`.
    pub max_errors: u64,
    /// Stop at the first END (`-e`): the rest of the input is not read.
    pub honor_end: bool,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            max_errors: 1,
            honor_end: false,
        }
    }
}

/// A subvolume a stream made.
#[derive(Clone, Debug, Serialize)]
pub struct Received {
    /// Its path from the top level.
    pub path: String,
    /// Its id.
    pub id: u64,
    /// The uuid it was received as.
    pub received_uuid: String,
    /// The sending subvolume's ctransid.
    pub stransid: u64,
    /// Made from a parent (incremental stream).
    pub incremental: bool,
}

/// What a receive did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReceiveReport {
    /// Subvolumes finished (read-only, received uuid set), stream order.
    pub subvolumes: Vec<Received>,
    /// Commands applied.
    pub commands: u64,
    /// Bytes of file data written or cloned.
    pub data_bytes: u64,
    /// Commands that failed, with why (up to `max_errors`).
    pub errors: Vec<String>,
}

/// The subvolume a stream is building.
struct Current {
    root: Loc,
    path: String,
    uuid: [u8; 16],
    stransid: u64,
    incremental: bool,
}

/// Applies streams to a mounted filesystem.
pub struct Receiver<'a> {
    fs: &'a mut Filesystem,
    dest: Loc,
    dest_path: String,
    cur: Option<Current>,
    report: ReceiveReport,
    /// Paths resolved since the last command that moved or removed a
    /// name: (subvolume, path) -> inode. A stream names the same file and
    /// directory in command after command.
    resolved: std::collections::HashMap<(u64, Vec<u8>), Loc>,
    /// A create held back one command: the kernel's streams make most
    /// inodes at an orphan name and rename them into place next; the pair
    /// is applied as one create at the final name.
    held: Option<Command>,
}

/// The path a create command makes.
fn created_path(c: &mut Command) -> Option<&mut Vec<u8>> {
    match c {
        Command::Mkfile { path, .. }
        | Command::Mkdir { path, .. }
        | Command::Mknod { path, .. }
        | Command::Mkfifo { path, .. }
        | Command::Mksock { path, .. }
        | Command::Symlink { path, .. } => Some(path),
        _ => None,
    }
}

fn invalid(what: impl Into<String>) -> Error {
    Error::errno(libc::EINVAL, what.into())
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

impl<'a> Receiver<'a> {
    /// Receive into directory `dest_path` (from the top level) of `fs`.
    pub fn new(fs: &'a mut Filesystem, dest_path: &str) -> Result<Receiver<'a>> {
        let dest = fs.resolve(dest_path, true)?;
        if fs.stat(dest)?.mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Error::Invalid(format!("{dest_path}: not a directory")));
        }
        if fs.store.root_item(dest.subvol)?.flags.get() & BTRFS_ROOT_SUBVOL_RDONLY != 0 {
            return Err(Error::errno(
                libc::EROFS,
                format!("{dest_path}: in a read-only subvolume"),
            ));
        }
        Ok(Receiver {
            fs,
            dest,
            dest_path: dest_path.trim_matches('/').to_string(),
            cur: None,
            report: ReceiveReport::default(),
            resolved: Default::default(),
            held: None,
        })
    }

    /// Read and apply every stream of `input` (several may follow one
    /// another). `progress(bytes of input read)`.
    pub fn receive(
        mut self,
        input: &mut dyn Read,
        opts: ReceiveOptions,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ReceiveReport> {
        let mut counted = CountingReader { inner: input, n: 0 };
        let mut streams = 0u64;
        let mut errors = 0u64;
        loop {
            let Some(mut r) = StreamReader::open(&mut counted)? else {
                if streams == 0 {
                    return Err(Error::Invalid(
                        "empty stream is not considered valid".into(),
                    ));
                }
                break;
            };
            streams += 1;
            loop {
                let c = match r.next_command()? {
                    Next::Command(c) => c,
                    Next::Eof => {
                        return Err(Error::Invalid(format!(
                            "send stream ends at byte {} without its END command: cut short",
                            r.position()
                        )))
                    }
                };
                if c == Command::End {
                    let at = r.position();
                    if let Err(e) = self.flush_held() {
                        errors += 1;
                        self.report
                            .errors
                            .push(format!("command before byte {at}: {e}"));
                        if opts.max_errors > 0 && errors >= opts.max_errors {
                            return Err(e);
                        }
                    }
                    break;
                }
                let at = r.position();
                if let Err(e) = self.apply_folded(c) {
                    errors += 1;
                    self.report
                        .errors
                        .push(format!("command ending at byte {at}: {e}"));
                    if opts.max_errors > 0 && errors >= opts.max_errors {
                        return Err(e);
                    }
                }
                self.report.commands += 1;
                if self.report.commands.is_multiple_of(256) {
                    self.fs.periodic()?;
                    progress(r.position());
                }
            }
            self.finish_subvol()?;
            if opts.honor_end {
                break;
            }
        }
        if errors > 0 {
            return Err(Error::Invalid(format!(
                "{errors} command(s) failed; the first: {}",
                self.report.errors[0]
            )));
        }
        Ok(self.report)
    }

    /// The report so far.
    pub fn report(&self) -> &ReceiveReport {
        &self.report
    }

    fn finish_subvol(&mut self) -> Result<()> {
        let Some(c) = self.cur.take() else {
            return Ok(());
        };
        self.fs.close_all()?;
        self.fs
            .subvols()
            .set_received(c.root.subvol, &c.uuid, c.stransid)?;
        self.fs.commit("receive")?;
        self.report.subvolumes.push(Received {
            path: c.path,
            id: c.root.subvol,
            received_uuid: crate::util::uuid::uuid_str(&c.uuid),
            stransid: c.stransid,
            incremental: c.incremental,
        });
        Ok(())
    }

    fn cur(&self) -> Result<&Current> {
        self.cur
            .as_ref()
            .ok_or_else(|| invalid("a command before the stream's subvol or snapshot command"))
    }

    /// The inode at `path` inside the subvolume being received: each
    /// component looked up, intermediate ones directories, nothing
    /// followed; the empty path is the subvolume's root.
    fn resolve_in(&mut self, root: Loc, path: &[u8]) -> Result<Loc> {
        if let Some(l) = self.resolved.get(&(root.subvol, path.to_vec())) {
            return Ok(*l);
        }
        let l = self.walk(root, path)?;
        if self.resolved.len() > 4096 {
            self.resolved.clear();
        }
        self.resolved.insert((root.subvol, path.to_vec()), l);
        Ok(l)
    }

    fn walk(&mut self, root: Loc, path: &[u8]) -> Result<Loc> {
        let mut l = root;
        let parts = components(path)?;
        for (i, name) in parts.iter().enumerate() {
            if i > 0 && self.fs.stat(l)?.mode & libc::S_IFMT != libc::S_IFDIR {
                return Err(Error::errno(
                    libc::ENOTDIR,
                    format!("{}: a component is not a directory", show(path)),
                ));
            }
            l = self.fs.lookup(l, name)?.ok_or_else(|| {
                Error::errno(libc::ENOENT, format!("{}: no such file", show(path)))
            })?;
        }
        Ok(l)
    }

    fn resolve(&mut self, path: &[u8]) -> Result<Loc> {
        let root = self.cur()?.root;
        self.resolve_in(root, path)
    }

    /// The directory that holds the last component of `path`, and it.
    fn parent(&mut self, path: &[u8]) -> Result<(Loc, Vec<u8>)> {
        let root = self.cur()?.root;
        let mut parts = components(path)?;
        let name = parts
            .pop()
            .ok_or_else(|| invalid(format!("{}: no name to make", show(path))))?
            .to_vec();
        let dir_path = parts.join(&b'/');
        let dir = self.resolve_in(root, &dir_path)?;
        if self.fs.stat(dir)?.mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Error::errno(
                libc::ENOTDIR,
                format!("{}: not a directory", show(path)),
            ));
        }
        Ok((dir, name))
    }

    fn start(
        &mut self,
        path: &[u8],
        parent: Option<Loc>,
        uuid: [u8; 16],
        stransid: u64,
    ) -> Result<()> {
        if self.cur.is_some() {
            return Err(invalid("a second subvolume started before the first ended"));
        }
        let parts = components(path)?;
        if parts.len() != 1 {
            return Err(invalid(format!(
                "{}: a subvolume's name is one component",
                show(path)
            )));
        }
        let name = parts[0].to_vec();
        let root = match parent {
            None => self.fs.subvols().subvol_create(self.dest, &name)?,
            Some(p) => self.fs.subvols().snapshot(p, self.dest, &name)?,
        };
        let shown = if self.dest_path.is_empty() {
            show(&name)
        } else {
            format!("{}/{}", self.dest_path, show(&name))
        };
        self.cur = Some(Current {
            root,
            path: shown,
            uuid,
            stransid,
            incremental: parent.is_some(),
        });
        Ok(())
    }

    /// The subvolume the stream means by `uuid` and `transid`: one received
    /// as it (received uuid and stransid), else the one that is it (uuid
    /// and ctransid), as btrfs-progs' search_source_subvol.
    fn find_subvol(&mut self, uuid: &[u8; 16], transid: u64) -> Result<Loc> {
        let found = find_by_uuid(self.fs, uuid, transid)?;
        found
            .map(|id| Loc::new(id, BTRFS_FIRST_FREE_OBJECTID))
            .ok_or_else(|| {
                Error::errno(
                    libc::ENOENT,
                    format!(
                        "cannot find subvolume {} (transid {transid}) in the filesystem",
                        crate::util::uuid::uuid_str(uuid)
                    ),
                )
            })
    }

    /// Apply one command, a create followed by the rename of what it made
    /// (to a name that is free) as one create at the final name: the same
    /// result without the orphan name's entries made and dropped.
    fn apply_folded(&mut self, mut c: Command) -> Result<()> {
        if created_path(&mut c).is_some() {
            let prev = self.held.replace(c);
            return prev.map_or(Ok(()), |p| self.apply(p));
        }
        let Some(mut h) = self.held.take() else {
            return self.apply(c);
        };
        if let Command::Rename { from, to } = &c {
            let hp = created_path(&mut h).map(|p| p.clone());
            if hp.as_ref() == Some(from) && self.is_free(to) {
                if let Some(p) = created_path(&mut h) {
                    *p = to.clone();
                }
                self.resolved.clear();
                return self.apply(h);
            }
        }
        self.apply(h)?;
        self.apply(c)
    }

    /// Apply the held create, if any.
    fn flush_held(&mut self) -> Result<()> {
        match self.held.take() {
            Some(h) => self.apply(h),
            None => Ok(()),
        }
    }

    /// `path` names a directory that exists and no entry in it.
    fn is_free(&mut self, path: &[u8]) -> bool {
        match self.parent(path) {
            Ok((d, n)) => matches!(self.fs.lookup(d, &n), Ok(None)),
            Err(_) => false,
        }
    }

    /// Apply one command.
    pub fn apply(&mut self, c: Command) -> Result<()> {
        if matches!(
            c,
            Command::Rename { .. } | Command::Unlink { .. } | Command::Rmdir { .. }
        ) {
            self.resolved.clear();
        }
        match c {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => self.start(&path, None, uuid, ctransid),
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                let p = self.find_subvol(&clone_uuid, clone_ctransid)?;
                self.start(&path, Some(p), uuid, ctransid)
            }
            Command::Mkfile { path, .. } => {
                let (d, n) = self.parent(&path)?;
                self.fs.mknod(d, &n, libc::S_IFREG | 0o600, 0).map(|_| ())
            }
            Command::Mkdir { path, .. } => {
                let (d, n) = self.parent(&path)?;
                self.fs.mkdir(d, &n, 0o700).map(|_| ())
            }
            Command::Mknod {
                path, mode, rdev, ..
            } => {
                let (d, n) = self.parent(&path)?;
                let ty = mode as u32 & libc::S_IFMT;
                if !matches!(
                    ty,
                    libc::S_IFCHR | libc::S_IFBLK | libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFREG
                ) {
                    return Err(invalid(format!("mknod of mode {mode:o}")));
                }
                let (ma, mi) = stream::decode_dev(rdev);
                let rdev = crate::fs::inode::encode_dev(ma, mi);
                self.fs.mknod(d, &n, ty, rdev).map(|_| ())
            }
            Command::Mkfifo { path, .. } => {
                let (d, n) = self.parent(&path)?;
                self.fs.mknod(d, &n, libc::S_IFIFO | 0o600, 0).map(|_| ())
            }
            Command::Mksock { path, .. } => {
                let (d, n) = self.parent(&path)?;
                self.fs.mknod(d, &n, libc::S_IFSOCK | 0o600, 0).map(|_| ())
            }
            Command::Symlink { path, target, .. } => {
                let (d, n) = self.parent(&path)?;
                self.fs.symlink(d, &n, &target).map(|_| ())
            }
            Command::Rename { from, to } => {
                let (od, on) = self.parent(&from)?;
                let (nd, nn) = self.parent(&to)?;
                self.fs.rename(od, &on, nd, &nn)
            }
            Command::Link { path, target } => {
                let t = self.resolve(&target)?;
                let (d, n) = self.parent(&path)?;
                self.fs.link(t, d, &n)
            }
            Command::Unlink { path } => {
                let (d, n) = self.parent(&path)?;
                self.fs.unlink(d, &n)
            }
            Command::Rmdir { path } => {
                let (d, n) = self.parent(&path)?;
                self.fs.rmdir(d, &n)
            }
            Command::SetXattr { path, name, data } => {
                let l = self.resolve(&path)?;
                self.fs.xattrs().set_xattr(l, &name, &data)
            }
            Command::RemoveXattr { path, name } => {
                let l = self.resolve(&path)?;
                self.fs.xattrs().remove_xattr(l, &name)
            }
            Command::Write { path, offset, data } => {
                let l = self.resolve(&path)?;
                self.report.data_bytes = self.report.data_bytes.saturating_add(data.len() as u64);
                self.fs.write(l, offset, &data)
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                let dst = self.resolve(&path)?;
                let cur = self.cur()?;
                let src_root = if cur.uuid == clone_uuid {
                    cur.root
                } else {
                    self.find_subvol(&clone_uuid, clone_ctransid)?
                };
                let src = self.resolve_in(src_root, &clone_path)?;
                self.report.data_bytes = self.report.data_bytes.saturating_add(len);
                self.fs
                    .ranges()
                    .clone_range(src, clone_offset, dst, offset, len)
            }
            Command::Truncate { path, size } => {
                let l = self.resolve(&path)?;
                self.fs.truncate(l, size)
            }
            Command::Chmod { path, mode } => {
                let l = self.resolve(&path)?;
                self.fs.chmod(l, mode as u32 & 0o7777)
            }
            Command::Chown { path, uid, gid } => {
                let l = self.resolve(&path)?;
                let (u, g) = (
                    u32::try_from(uid).map_err(|_| invalid("uid past 32 bits"))?,
                    u32::try_from(gid).map_err(|_| invalid("gid past 32 bits"))?,
                );
                self.fs.chown(l, u, g)
            }
            Command::Utimes {
                path, atime, mtime, ..
            } => {
                let l = self.resolve(&path)?;
                self.fs
                    .set_times(l, Some(((atime.sec, atime.nsec), (mtime.sec, mtime.nsec))))
            }
            // Sent with --no-data: nothing to apply.
            Command::UpdateExtent { path, .. } => self.resolve(&path).map(|_| ()),
            Command::Fallocate {
                path,
                mode,
                offset,
                len,
            } => {
                let l = self.resolve(&path)?;
                const KEEP_SIZE: u32 = 0x01;
                const PUNCH_HOLE: u32 = 0x02;
                const ZERO_RANGE: u32 = 0x10;
                let keep = mode & KEEP_SIZE != 0;
                match mode & !KEEP_SIZE {
                    0 => self.fs.ranges().fallocate(l, offset, len, keep),
                    PUNCH_HOLE if keep => self.fs.ranges().punch_hole(l, offset, len),
                    ZERO_RANGE => self.fs.ranges().zero_range(l, offset, len, keep),
                    _ => Err(Error::errno(
                        libc::EOPNOTSUPP,
                        format!("fallocate mode {mode:#x}"),
                    )),
                }
            }
            // btrfs-progs ignores file attributes (not yet applied by any
            // receiver).
            Command::Fileattr { path, .. } => self.resolve(&path).map(|_| ()),
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                if encryption != 0 {
                    return Err(Error::errno(
                        libc::EOPNOTSUPP,
                        "encoded_write: encryption not supported",
                    ));
                }
                let l = self.resolve(&path)?;
                self.report.data_bytes = self.report.data_bytes.saturating_add(unencoded_file_len);
                self.encoded_write(
                    l,
                    offset,
                    unencoded_file_len,
                    unencoded_len,
                    unencoded_offset,
                    compression,
                    &data,
                )
            }
            Command::EnableVerity { .. } => Err(Error::errno(
                libc::EOPNOTSUPP,
                "enable_verity: fs-verity is not supported",
            )),
            Command::End => Ok(()),
        }
    }

    /// An encoded write kept compressed where the engine takes it as the
    /// kernel's ioctl would; otherwise decoded and written, as
    /// btrfs-progs falls back.
    #[allow(clippy::too_many_arguments)]
    fn encoded_write(
        &mut self,
        l: Loc,
        offset: u64,
        file_len: u64,
        ram: u64,
        ext_off: u64,
        compression: u32,
        data: &[u8],
    ) -> Result<()> {
        let ss = self.fs.store.sectorsize() as u64;
        let kind = match compression {
            stream::encoded::NONE => None,
            stream::encoded::ZLIB => Some(BTRFS_COMPRESS_ZLIB),
            stream::encoded::ZSTD => Some(BTRFS_COMPRESS_ZSTD),
            // LZO in pages of the sector size is btrfs' own lzo format.
            c if c == stream::encoded::LZO_4K + (ss.trailing_zeros().saturating_sub(12)) => {
                Some(BTRFS_COMPRESS_LZO)
            }
            c => {
                return Err(Error::errno(
                    libc::EOPNOTSUPP,
                    format!("encoded_write: compression {c} not supported"),
                ))
            }
        };
        if let Some(k) = kind {
            match self
                .fs
                .ranges()
                .encoded_write(l, offset, file_len, ram, ext_off, k, data)
            {
                Ok(()) => return Ok(()),
                Err(e) if e.as_errno() == libc::EINVAL => {}
                Err(e) => return Err(e),
            }
        }
        // Decode and write what the range holds.
        if ext_off.checked_add(file_len).is_none_or(|e| e > ram) {
            return Err(invalid("encoded_write: range outside the decoded data"));
        }
        let plain = match kind {
            None => data.to_vec(),
            Some(k) => crate::fs::compress::decompress(k, data, ram as usize, ss as usize)?,
        };
        let (a, b) = (ext_off as usize, (ext_off + file_len) as usize);
        if b > plain.len() {
            return Err(invalid("encoded_write: data shorter than it claims"));
        }
        self.fs.write(l, offset, &plain[a..b])
    }
}

/// The components of a stream path: empty ones skipped, `.` and `..`
/// refused (a stream names nothing outside its subvolume).
fn components(path: &[u8]) -> Result<Vec<&[u8]>> {
    let mut v = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" => {}
            b"." | b".." => {
                return Err(Error::errno(
                    libc::EPERM,
                    format!(
                        "{}: a stream path may not hold . or .. (it would name something outside the subvolume)",
                        show(path)
                    ),
                ))
            }
            c if c.len() > BTRFS_NAME_LEN => {
                return Err(Error::errno(libc::ENAMETOOLONG, format!("{}: name too long", show(path))))
            }
            c => v.push(c),
        }
    }
    Ok(v)
}

/// The subvolume (id) received as `uuid` at `transid`, else the one whose
/// own uuid it is at ctransid `transid`.
pub fn find_by_uuid(fs: &mut Filesystem, uuid: &[u8; 16], transid: u64) -> Result<Option<u64>> {
    let roots = subvolume_roots(fs)?;
    if let Some((id, _)) = roots
        .iter()
        .find(|(_, r)| r.received_uuid == *uuid && r.stransid.get() == transid)
    {
        return Ok(Some(*id));
    }
    Ok(roots
        .iter()
        .find(|(_, r)| r.uuid == *uuid && r.ctransid.get() == transid)
        .map(|(id, _)| *id))
}

/// Every live subvolume's root item (the top level included).
pub fn subvolume_roots(fs: &mut Filesystem) -> Result<Vec<(u64, crate::format::root::RootItem)>> {
    use crate::format::key::Key;
    use crate::trans::TreeId;
    let mut out = Vec::new();
    let mut k = Key::new(BTRFS_FS_TREE_OBJECTID, 0, 0);
    let mut guard = 0usize;
    while let Some((key, d)) = fs.store.next_item(TreeId::Root, &k)? {
        guard += 1;
        if key.objectid > BTRFS_LAST_FREE_OBJECTID || guard > 1 << 24 {
            break;
        }
        k = crate::trans::next_key(&key);
        if key.ty != BTRFS_ROOT_ITEM_KEY
            || !(key.objectid == BTRFS_FS_TREE_OBJECTID
                || key.objectid >= BTRFS_FIRST_FREE_OBJECTID)
        {
            continue;
        }
        let ri = crate::format::root::RootItem::parse(&d).map_err(|e| e.at(0, key))?;
        if ri.refs.get() > 0 {
            out.push((key.objectid, ri));
        }
    }
    Ok(out)
}

struct CountingReader<'r> {
    inner: &'r mut dyn Read,
    n: u64,
}

impl Read for CountingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}
