//! `btrfs send` from an image: a stream of a read-only snapshot, full or
//! relative to a parent snapshot, data shared with clone sources sent as
//! clones.
//!
//! Each snapshot involved is read once into an index (inode items, names,
//! xattrs, file extent items). A full stream creates every inode in
//! inode order, at its name when its directory exists and otherwise at an
//! orphan name (`o<ino>-<gen>-0` in the subvolume's root, the kernel's)
//! until the directory is made. An incremental stream changes the
//! parent's namespace into the snapshot's through a model of what the
//! receiver holds: every name that goes away is taken away first (a
//! directory or a file's last name moved to an orphan name, other names
//! unlinked), inodes that are gone are removed, new inodes are made at
//! orphan names, and every new name is then made by a rename out of an
//! orphan name or a link. Directories reach their new place only from
//! orphan names in the root, so no rename ever moves a directory into
//! itself. Contents follow (only what differs from the parent), then the
//! times of everything touched.

use super::stream::{self, Command, StreamWriter, Time};
use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::inode::{parse_inode_extrefs, parse_inode_refs, InodeItem};
use crate::format::key::Key;
use crate::fs::{Filesystem, Loc};
use crate::trans::TreeId;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use zerocopy::FromBytes;

const ROOT: u64 = BTRFS_FIRST_FREE_OBJECTID;

/// How to send.
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// Protocol version (1 or 2).
    pub version: u32,
    /// v2: compressed extents as encoded writes, kept compressed.
    pub compressed_data: bool,
    /// No file data: UPDATE_EXTENT commands instead of writes.
    pub no_data: bool,
}

/// What a send wrote.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SendReport {
    /// Commands written.
    pub commands: u64,
    /// Bytes of the stream.
    pub bytes: u64,
    /// File bytes written as data.
    pub data_bytes: u64,
    /// File bytes sent as clones.
    pub cloned_bytes: u64,
    /// File bytes sent as encoded (compressed) writes.
    pub encoded_bytes: u64,
}

/// One file extent item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ext {
    off: u64,
    /// BTRFS_FILE_EXTENT_*.
    ty: u8,
    compression: u8,
    disk_bytenr: u64,
    disk_num_bytes: u64,
    ext_off: u64,
    /// Bytes of the file it covers (inline: decoded length).
    num_bytes: u64,
    ram_bytes: u64,
}

#[derive(Clone, Debug, Default)]
struct Inode {
    /// Zeroes until its item is read; inodes without one are dropped.
    item: InodeItem,
    has_item: bool,
    names: Vec<(u64, Vec<u8>)>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    exts: Vec<Ext>,
}

impl Inode {
    fn gen(&self) -> u64 {
        self.item.generation.get()
    }
    fn mode(&self) -> u32 {
        self.item.mode.get()
    }
    fn is_dir(&self) -> bool {
        self.mode() & libc::S_IFMT == libc::S_IFDIR
    }
    fn size(&self) -> u64 {
        self.item.size.get()
    }
}

/// A snapshot read into memory.
struct Snap {
    id: u64,
    /// The uuid a receiver knows it by (received uuid if it has one).
    uuid: [u8; 16],
    ctransid: u64,
    inodes: BTreeMap<u64, Inode>,
    /// The names in its root directory (an orphan name must not take one).
    root_names: std::collections::HashSet<Vec<u8>>,
}

impl Snap {
    fn read(fs: &mut Filesystem, id: u64) -> Result<Snap> {
        let ri = fs.store.root_item(id)?;
        // The whole tree is read in key order: its leaves are asked for at
        // once, not one by one as the walk reaches them.
        fs.store.image().prefetch_leaves(ri.bytenr.get(), ri.level);
        let uuid = if ri.received_uuid != [0; 16] {
            ri.received_uuid
        } else {
            ri.uuid
        };
        let mut inodes: BTreeMap<u64, Inode> = BTreeMap::new();
        let mut k = Key::new(ROOT, 0, 0);
        let end = Key::new(BTRFS_LAST_FREE_OBJECTID, u8::MAX, u64::MAX);
        let mut leaves = 0u64;
        // A leaf at a time: what is kept is parsed, not the items.
        while let Some((_, mut batch)) = fs.store.leaf_from(TreeId::Tree(id), &k)? {
            batch.retain(|(key, _)| *key <= end);
            let Some(last) = batch.last().map(|(k, _)| *k) else {
                break;
            };
            for (key, d) in &batch {
                let e = inodes.entry(key.objectid).or_default();
                match key.ty {
                    BTRFS_INODE_ITEM_KEY => {
                        let it = InodeItem::read_from_prefix(d)
                            .map_err(|_| short(id, key))?
                            .0;
                        e.item = it;
                        e.has_item = true;
                    }
                    BTRFS_INODE_REF_KEY => {
                        for r in parse_inode_refs(d).map_err(|x| x.at(0, *key))? {
                            e.names.push((key.offset, r.name.to_vec()));
                        }
                    }
                    BTRFS_INODE_EXTREF_KEY => {
                        for r in parse_inode_extrefs(d).map_err(|x| x.at(0, *key))? {
                            e.names.push((r.parent, r.name.to_vec()));
                        }
                    }
                    BTRFS_XATTR_ITEM_KEY => {
                        for x in
                            crate::format::dir::parse_dir_items(d).map_err(|x| x.at(0, *key))?
                        {
                            e.xattrs.insert(x.name.to_vec(), x.data.to_vec());
                        }
                    }
                    BTRFS_EXTENT_DATA_KEY => {
                        let fe = parse_file_extent(d).map_err(|x| x.at(0, *key))?;
                        // Bounds every end computed from the item below.
                        fe.check_bounds(key)?;
                        let ext = match fe {
                            FileExtent::Inline { head, .. } => Ext {
                                off: key.offset,
                                ty: BTRFS_FILE_EXTENT_INLINE,
                                compression: head.compression,
                                disk_bytenr: 0,
                                disk_num_bytes: 0,
                                ext_off: 0,
                                num_bytes: head.ram_bytes.get(),
                                ram_bytes: head.ram_bytes.get(),
                            },
                            FileExtent::Disk { head, item } => Ext {
                                off: key.offset,
                                ty: head.type_,
                                compression: head.compression,
                                disk_bytenr: item.disk_bytenr.get(),
                                disk_num_bytes: item.disk_num_bytes.get(),
                                ext_off: item.offset.get(),
                                num_bytes: item.num_bytes.get(),
                                ram_bytes: item.ram_bytes.get(),
                            },
                        };
                        e.exts.push(ext);
                    }
                    _ => {}
                }
            }
            if last == end {
                break;
            }
            k = crate::trans::next_key(&last);
            leaves += 1;
            if leaves.is_multiple_of(256) {
                fs.trim_caches();
            }
        }
        // Items without an inode item (damage) are not sent.
        inodes.retain(|_, i| i.has_item);
        // Every path starts at the root directory: without it nothing can
        // be sent.
        if !inodes.get(&ROOT).is_some_and(Inode::is_dir) {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Structure,
                format!("subvolume {id} has no root directory"),
                ROOT,
            ));
        }
        let root_names = inodes
            .values()
            .flat_map(|i| i.names.iter())
            .filter(|(p, _)| *p == ROOT)
            .map(|(_, n)| n.clone())
            .collect();
        Ok(Snap {
            id,
            uuid,
            ctransid: ri.ctransid.get(),
            inodes,
            root_names,
        })
    }

    /// The inode's path from the snapshot's root through its first names.
    fn path_of(&self, ino: u64) -> Option<Vec<u8>> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ROOT {
                parts.reverse();
                return Some(parts.join(&b'/'));
            }
            let (p, n) = self.inodes.get(&cur)?.names.first()?;
            parts.push(n);
            cur = *p;
        }
        None
    }
}

fn short(id: u64, key: &Key) -> Error {
    Error::corrupt_as(
        crate::CorruptKind::Item,
        format!("inode item {key:?} of subvolume {id} is too short"),
        key.objectid,
    )
}

fn time(t: &crate::format::inode::Timespec) -> Time {
    let (sec, nsec) = t.get();
    Time { sec, nsec }
}

/// Identity of an inode: its number and generation.
type Id = (u64, u64);

/// What the receiver holds: names of inodes, kept as the stream changes
/// them.
#[derive(Default)]
struct Model {
    names: HashMap<Id, Vec<(Id, Vec<u8>)>>,
    entries: HashMap<(Id, Vec<u8>), Id>,
}

impl Model {
    fn add(&mut self, id: Id, dir: Id, name: Vec<u8>) {
        self.entries.insert((dir, name.clone()), id);
        self.names.entry(id).or_default().push((dir, name));
    }
    fn remove(&mut self, id: Id, dir: Id, name: &[u8]) {
        self.entries.remove(&(dir, name.to_vec()));
        if let Some(v) = self.names.get_mut(&id) {
            v.retain(|(d, n)| !(*d == dir && n == name));
        }
    }
    fn path(&self, id: Id, root: Id) -> Result<Vec<u8>> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = id;
        for _ in 0..4096 {
            if cur == root {
                parts.reverse();
                return Ok(parts.join(&b'/'));
            }
            let (d, n) = self
                .names
                .get(&cur)
                .and_then(|v| v.first())
                .ok_or_else(|| Error::Internal(format!("send: inode {} has no name", cur.0)))?;
            parts.push(n);
            cur = *d;
        }
        Err(Error::Internal("send: a path deeper than 4096".into()))
    }
}

/// A place a data extent can be cloned from.
#[derive(Clone, Copy)]
struct CloneSrc {
    /// Index into the clone roots (0: the snapshot sent).
    root: usize,
    ino: u64,
    /// File offset where the extent's byte `ext_off` is.
    off: u64,
    ext_off: u64,
    len: u64,
}

/// Writes a stream.
struct Sender<'a, W: Write> {
    fs: &'a mut Filesystem,
    w: StreamWriter<W>,
    opts: SendOptions,
    snap: Snap,
    /// Clone roots other than the snapshot itself (the parent first).
    others: Vec<std::rc::Rc<Snap>>,
    clones: HashMap<u64, Vec<CloneSrc>>,
    model: Model,
    root_id: Id,
    report: SendReport,
    ss: u64,
    /// The data extents the stream sends, read ahead.
    reader: Option<super::prefetch::ExtentReader>,
}

/// Send snapshot `id` of `fs`, relative to `parent` (a snapshot id) and
/// sharing with `clone_sources`, to `out`.
pub fn send<W: Write>(
    fs: &mut Filesystem,
    id: u64,
    parent: Option<u64>,
    clone_sources: &[u64],
    out: W,
    opts: SendOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SendReport> {
    let ri = fs.store.root_item(id)?;
    if ri.flags.get() & BTRFS_ROOT_SUBVOL_RDONLY == 0 {
        return Err(Error::Invalid(format!(
            "subvolume {id} is not read-only: send needs a read-only snapshot"
        )));
    }
    for &c in parent.iter().chain(clone_sources) {
        let r = fs.store.root_item(c)?;
        if r.flags.get() & BTRFS_ROOT_SUBVOL_RDONLY == 0 {
            return Err(Error::Invalid(format!(
                "clone source or parent {c} is not read-only"
            )));
        }
    }
    if opts.compressed_data && opts.version < 2 {
        return Err(Error::Invalid(
            "--compressed-data needs protocol version 2".into(),
        ));
    }
    let snap = Snap::read(fs, id)?;
    let mut others = Vec::new();
    for &c in parent
        .iter()
        .chain(clone_sources.iter().filter(|c| Some(**c) != parent))
    {
        others.push(std::rc::Rc::new(Snap::read(fs, c)?));
    }
    let ss = fs.store.sectorsize() as u64;
    let w = StreamWriter::new(out, opts.version.max(1))?;
    let mut s = Sender {
        fs,
        w,
        opts,
        snap,
        others,
        clones: HashMap::new(),
        model: Model::default(),
        root_id: (ROOT, 0),
        report: SendReport::default(),
        ss,
        reader: None,
    };
    s.plan_reads(parent.is_some());
    // Every extent of the clone roots may be cloned from at once.
    for r in 0..s.others.len() {
        let mut add = Vec::new();
        for (&ino, i) in &s.others[r].inodes {
            for e in &i.exts {
                if e.ty == BTRFS_FILE_EXTENT_REG && e.disk_bytenr != 0 {
                    add.push((
                        e.disk_bytenr,
                        CloneSrc {
                            root: r + 1,
                            ino,
                            off: e.off,
                            ext_off: e.ext_off,
                            len: e.num_bytes,
                        },
                    ));
                }
            }
        }
        for (b, c) in add {
            s.clones.entry(b).or_default().push(c);
        }
    }
    if parent.is_some() {
        s.incremental(progress)?;
    } else {
        s.full(progress)?;
    }
    s.w.put(&Command::End)?;
    s.report.commands += 1;
    s.report.bytes = s.w.written;
    s.w.finish()?;
    Ok(s.report)
}

impl<W: Write> Sender<'_, W> {
    /// The data extents the stream will read, in inode order: all of
    /// them, or (incremental) those the parent does not have at the same
    /// place, handed to a reader thread. The checksum tree's leaves are
    /// asked for too: every read is verified.
    fn plan_reads(&mut self, incremental: bool) {
        if self.opts.no_data {
            return;
        }
        let none = Inode::default();
        let mut plan = Vec::new();
        for (&ino, i) in &self.snap.inodes {
            if i.mode() & libc::S_IFMT != libc::S_IFREG {
                continue;
            }
            let old = if incremental {
                self.others[0].inodes.get(&ino).unwrap_or(&none)
            } else {
                &none
            };
            for e in &i.exts {
                if e.ty == BTRFS_FILE_EXTENT_REG && e.disk_bytenr != 0 && !old.exts.contains(e) {
                    plan.push((ino, e.disk_bytenr, e.disk_num_bytes));
                }
            }
        }
        if plan.is_empty() {
            return;
        }
        if let Ok(ri) = self.fs.store.root_item(BTRFS_CSUM_TREE_OBJECTID) {
            self.fs
                .store
                .image()
                .prefetch_leaves(ri.bytenr.get(), ri.level);
        }
        let img = self.fs.store.image();
        let devs = img.devices().map(|(d, a)| (d, a.clone())).collect();
        self.reader = Some(super::prefetch::ExtentReader::start(
            img.chunks.clone(),
            devs,
            &plan,
        ));
    }

    /// Extent `e` of `ino` as stored, from the reader when it has it,
    /// checked against its checksums; None to read it the ordinary way.
    fn stored(&mut self, ino: u64, e: &Ext) -> Option<Vec<u8>> {
        let raw = self
            .reader
            .as_mut()?
            .take(ino, e.disk_bytenr, e.disk_num_bytes)?;
        self.verify(e.disk_bytenr, &raw).ok()?;
        Some(raw)
    }

    fn put(&mut self, c: Command) -> Result<()> {
        self.report.commands += 1;
        self.w.put(&c)
    }

    fn name_of_subvol(&mut self) -> Result<Vec<u8>> {
        let subs = crate::subvolume::list(&mut self.fs.store)?;
        let p = subs
            .iter()
            .find(|s| s.id == self.snap.id)
            .map(|s| s.path.clone())
            .unwrap_or_else(|| format!("subvol{}", self.snap.id));
        Ok(p.rsplit('/').next().unwrap_or(&p).as_bytes().to_vec())
    }

    fn id_of(&self, ino: u64) -> Id {
        if ino == ROOT {
            return self.root_id;
        }
        (ino, self.snap.inodes.get(&ino).map_or(0, |i| i.gen()))
    }

    fn path(&self, id: Id) -> Result<Vec<u8>> {
        self.model.path(id, self.root_id)
    }

    /// An orphan name in the root free in the model and in the snapshot
    /// (the kernel's gen_unique_name). Each name taken needs an entry, so
    /// a free one is found within one more tries than there are entries.
    fn orphan_name(&self, id: Id) -> Result<Vec<u8>> {
        let tries = self.model.entries.len() + self.snap.root_names.len() + 1;
        for n in 0..tries {
            let name = format!("o{}-{}-{n}", id.0, id.1).into_bytes();
            if !self
                .model
                .entries
                .contains_key(&(self.root_id, name.clone()))
                && !self.snap.root_names.contains(&name)
            {
                return Ok(name);
            }
        }
        Err(Error::Internal(format!(
            "send: no free orphan name for inode {}",
            id.0
        )))
    }

    /// Create inode `ino` (identity `id`) at an orphan name in the root.
    fn create_orphan(&mut self, ino: u64, id: Id) -> Result<()> {
        let o = self.orphan_name(id)?;
        self.create(ino, o.clone())?;
        self.model.add(id, self.root_id, o);
        Ok(())
    }

    /// Create inode `ino` of the snapshot at `path` (no contents).
    fn create(&mut self, ino: u64, path: Vec<u8>) -> Result<()> {
        let it = self.snap.inodes[&ino].item;
        let mode = it.mode.get();
        let c = match mode & libc::S_IFMT {
            libc::S_IFREG => Command::Mkfile { path, ino },
            libc::S_IFDIR => Command::Mkdir { path, ino },
            libc::S_IFLNK => {
                let target = self.fs.read_link(Loc::new(self.snap.id, ino))?;
                Command::Symlink { path, ino, target }
            }
            libc::S_IFIFO => Command::Mkfifo { path, ino },
            libc::S_IFSOCK => Command::Mksock { path, ino },
            libc::S_IFCHR | libc::S_IFBLK => {
                let (ma, mi) = crate::fs::inode::decode_dev(it.rdev.get());
                Command::Mknod {
                    path,
                    ino,
                    mode: mode as u64,
                    rdev: stream::encode_dev(ma, mi),
                }
            }
            _ => {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Item,
                    format!(
                        "inode {ino} of subvolume {} has mode {mode:o}",
                        self.snap.id
                    ),
                    ino,
                ))
            }
        };
        self.put(c)
    }

    /// Owner, mode and xattrs of `ino` as in the snapshot, against `old`
    /// (None: a new inode).
    fn attrs(&mut self, ino: u64, old: Option<&Inode>) -> Result<()> {
        let id = self.id_of(ino);
        let new = self.snap.inodes[&ino].clone();
        let it = &new.item;
        let path = self.path(id)?;
        let (nx, ox) = (
            &new.xattrs,
            old.map(|o| o.xattrs.clone()).unwrap_or_default(),
        );
        for name in ox.keys() {
            if !nx.contains_key(name) {
                self.put(Command::RemoveXattr {
                    path: path.clone(),
                    name: name.clone(),
                })?;
            }
        }
        for (name, v) in nx {
            if ox.get(name) != Some(v) {
                self.put(Command::SetXattr {
                    path: path.clone(),
                    name: name.clone(),
                    data: v.clone(),
                })?;
            }
        }
        let oit = old.map(|o| &o.item);
        if oit.is_none_or(|o| o.uid.get() != it.uid.get() || o.gid.get() != it.gid.get()) {
            self.put(Command::Chown {
                path: path.clone(),
                uid: it.uid.get() as u64,
                gid: it.gid.get() as u64,
            })?;
        }
        let islnk = it.mode.get() & libc::S_IFMT == libc::S_IFLNK;
        // A chown clears set-user-id: the mode goes after it, always when
        // the owner changed.
        if !islnk
            && (oit.is_none_or(|o| o.mode.get() != it.mode.get())
                || oit.is_some_and(|o| o.uid.get() != it.uid.get() || o.gid.get() != it.gid.get()))
        {
            self.put(Command::Chmod {
                path,
                mode: (it.mode.get() & 0o7777) as u64,
            })?;
        }
        Ok(())
    }

    fn utimes(&mut self, ino: u64) -> Result<()> {
        let id = self.id_of(ino);
        let path = self.path(id)?;
        let it = self.snap.inodes[&ino].item;
        self.put(Command::Utimes {
            path,
            atime: time(&it.atime),
            mtime: time(&it.mtime),
            ctime: time(&it.ctime),
        })
    }

    fn full(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let name = self.name_of_subvol()?;
        self.put(Command::Subvol {
            path: name,
            uuid: self.snap.uuid,
            ctransid: self.snap.ctransid,
        })?;
        self.model.names.insert(self.root_id, Vec::new());
        self.attrs(ROOT, None)?;
        let inos: Vec<u64> = self
            .snap
            .inodes
            .keys()
            .copied()
            .filter(|&i| i > ROOT)
            .collect();
        let total = inos.len() as u64;
        // Names waiting for their directory: dir ino -> (child, name).
        let mut waiting: HashMap<u64, Vec<(u64, Vec<u8>)>> = HashMap::new();
        let mut dirs = vec![ROOT];
        for (n, &ino) in inos.iter().enumerate() {
            let id = self.id_of(ino);
            let names = self.snap.inodes[&ino].names.clone();
            let ready = |p: u64| p == ROOT || p < ino;
            let mut placed = false;
            for (p, nm) in &names {
                if !ready(*p) {
                    waiting.entry(*p).or_default().push((ino, nm.clone()));
                    continue;
                }
                let dir = self.id_of(*p);
                if !placed {
                    let mut path = self.path(dir)?;
                    join(&mut path, nm);
                    self.create(ino, path)?;
                    self.model.add(id, dir, nm.clone());
                    placed = true;
                } else {
                    self.link(id, dir, nm.clone())?;
                }
            }
            if !placed {
                self.create_orphan(ino, id)?;
            }
            let is_dir = self.snap.inodes[&ino].is_dir();
            if is_dir {
                dirs.push(ino);
                for (child, nm) in waiting.remove(&ino).unwrap_or_default() {
                    self.place(self.id_of(child), id, nm)?;
                }
            }
            self.contents(ino, None)?;
            self.attrs(ino, None)?;
            if !is_dir {
                self.utimes(ino)?;
            }
            if n % 1024 == 0 {
                progress(n as u64, total);
                self.fs.trim_caches();
            }
        }
        if let Some((d, _)) = waiting.iter().next() {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Reference,
                format!(
                    "subvolume {}: a name in directory {d}, which does not exist",
                    self.snap.id
                ),
                *d,
            ));
        }
        for d in dirs {
            self.utimes(d)?;
        }
        progress(total, total);
        Ok(())
    }

    /// Give `id` the name `dir/name`: out of its orphan name when it has
    /// only that, else a link.
    fn place(&mut self, id: Id, dir: Id, name: Vec<u8>) -> Result<()> {
        let names = self.model.names.get(&id).cloned().unwrap_or_default();
        let orphan = match names.as_slice() {
            [(d, n)] if *d == self.root_id && n.starts_with(b"o") && is_orphan(n, id) => {
                Some(n.clone())
            }
            [] => None,
            _ => None,
        };
        match orphan {
            Some(o) => {
                let from = self.path(id)?;
                let mut to = self.path(dir)?;
                join(&mut to, &name);
                self.put(Command::Rename { from, to })?;
                self.model.remove(id, self.root_id, &o);
                self.model.add(id, dir, name);
                Ok(())
            }
            None => self.link(id, dir, name),
        }
    }

    fn link(&mut self, id: Id, dir: Id, name: Vec<u8>) -> Result<()> {
        let target = self.path(id)?;
        let mut path = self.path(dir)?;
        join(&mut path, &name);
        self.put(Command::Link { path, target })?;
        self.model.add(id, dir, name);
        Ok(())
    }

    fn incremental(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let name = self.name_of_subvol()?;
        let parent = std::rc::Rc::clone(&self.others[0]);
        self.put(Command::Snapshot {
            path: name,
            uuid: self.snap.uuid,
            ctransid: self.snap.ctransid,
            clone_uuid: parent.uuid,
            clone_ctransid: parent.ctransid,
        })?;
        let pid = |ino: u64| -> Id {
            if ino == ROOT {
                (ROOT, 0)
            } else {
                (ino, parent.inodes.get(&ino).map_or(0, |i| i.gen()))
            }
        };
        // The receiver starts with the parent's names.
        for (&ino, i) in &parent.inodes {
            if ino == ROOT {
                continue;
            }
            for (p, n) in &i.names {
                self.model.add(pid(ino), pid(*p), n.clone());
            }
        }
        self.model.names.entry(self.root_id).or_default();
        let survives = |ino: u64, old: &Inode, snap: &Snap| -> bool {
            ino == ROOT
                || snap.inodes.get(&ino).is_some_and(|n| {
                    n.gen() == old.gen() && n.mode() & libc::S_IFMT == old.mode() & libc::S_IFMT
                })
        };
        // The snapshot's names as identities.
        let mut want: BTreeSet<(Id, Vec<u8>, Id)> = BTreeSet::new();
        for (&ino, i) in &self.snap.inodes {
            if ino == ROOT {
                continue;
            }
            for (p, n) in &i.names {
                want.insert((self.id_of(*p), n.clone(), self.id_of(ino)));
            }
        }
        let mut touched: BTreeSet<u64> = BTreeSet::new();
        // 1. Names that go away.
        let mut gone: Vec<(Id, Vec<u8>, Id)> = self
            .model
            .entries
            .iter()
            .filter(|((d, n), id)| !want.contains(&(*d, n.clone(), **id)))
            .map(|((d, n), id)| (*d, n.clone(), *id))
            .collect();
        gone.sort();
        for (dir, name, id) in gone {
            let old = &parent.inodes[&id.0];
            let mut from = self.path(dir)?;
            join(&mut from, &name);
            let last = self.model.names.get(&id).is_none_or(|v| v.len() <= 1);
            let keep = old.is_dir() || (last && survives(id.0, old, &self.snap));
            touched.insert(dir.0);
            if keep {
                let o = self.orphan_name(id)?;
                self.put(Command::Rename {
                    from,
                    to: o.clone(),
                })?;
                self.model.remove(id, dir, &name);
                self.model.add(id, self.root_id, o);
            } else {
                self.put(Command::Unlink { path: from })?;
                self.model.remove(id, dir, &name);
            }
        }
        // 2. Directories that are gone (all now empty orphans).
        for (&ino, old) in &parent.inodes {
            if ino != ROOT && old.is_dir() && !survives(ino, old, &self.snap) {
                let path = self.path(pid(ino))?;
                self.put(Command::Rmdir { path })?;
                let names = self.model.names.remove(&pid(ino)).unwrap_or_default();
                for (d, n) in names {
                    self.model.entries.remove(&(d, n));
                }
            }
        }
        // 3. New inodes, at orphan names.
        let inos: Vec<u64> = self
            .snap
            .inodes
            .keys()
            .copied()
            .filter(|&i| i > ROOT)
            .collect();
        let mut fresh: BTreeSet<u64> = BTreeSet::new();
        for &ino in &inos {
            let new = parent
                .inodes
                .get(&ino)
                .is_none_or(|o| !survives(ino, o, &self.snap));
            if new {
                let id = self.id_of(ino);
                self.create_orphan(ino, id)?;
                fresh.insert(ino);
                touched.insert(ROOT);
            }
        }
        // 4. New names.
        let added: Vec<(Id, Vec<u8>, Id)> = want
            .iter()
            .filter(|(d, n, _)| !self.model.entries.contains_key(&(*d, n.clone())))
            .cloned()
            .collect();
        // Directories first: a later name may be inside one.
        let (mut dirs_first, rest): (Vec<_>, Vec<_>) = added
            .into_iter()
            .partition(|(_, _, id)| self.snap.inodes[&id.0].is_dir());
        dirs_first.extend(rest);
        for (dir, name, id) in dirs_first {
            touched.insert(dir.0);
            if self
                .model
                .names
                .get(&id)
                .is_some_and(|v| v.len() == 1 && v[0].0 == self.root_id)
            {
                touched.insert(ROOT);
            }
            self.place(id, dir, name)?;
        }
        // 5. Contents and attributes.
        let total = inos.len() as u64;
        for (n, &ino) in std::iter::once(&ROOT).chain(inos.iter()).enumerate() {
            let old = if fresh.contains(&ino) {
                None
            } else {
                parent.inodes.get(&ino)
            };
            let changed = match old {
                None => true,
                Some(o) => {
                    let (a, b) = (&o.item, &self.snap.inodes[&ino].item);
                    zerocopy::IntoBytes::as_bytes(a) != zerocopy::IntoBytes::as_bytes(b)
                        || o.xattrs != self.snap.inodes[&ino].xattrs
                        || o.exts != self.snap.inodes[&ino].exts
                }
            };
            if changed {
                self.contents(ino, old)?;
                self.attrs(ino, old)?;
                touched.insert(ino);
            }
            if n % 1024 == 0 {
                progress(n as u64, total);
                self.fs.trim_caches();
            }
        }
        // 6. Times of everything touched.
        for ino in touched {
            if self.snap.inodes.contains_key(&ino) {
                self.utimes(ino)?;
            }
        }
        progress(total, total);
        Ok(())
    }

    /// The data of regular file `ino`, all of it (`old` None) or what
    /// differs from `old`, then its size.
    fn contents(&mut self, ino: u64, old: Option<&Inode>) -> Result<()> {
        let new = &self.snap.inodes[&ino];
        if new.mode() & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let new = &self.snap.inodes[&ino];
        let size = new.size();
        let exts = new.exts.clone();
        let old_exts: Vec<Ext> = old.map(|o| o.exts.clone()).unwrap_or_default();
        let old_size = old.map_or(0, |o| o.size());
        let id = self.id_of(ino);
        let path = self.path(id)?;
        let mut sent_end = 0u64;
        let data_of = |e: &Ext| e.ty == BTRFS_FILE_EXTENT_INLINE || e.disk_bytenr != 0;
        // Holes where the parent had data; preallocated ranges read as
        // zeros too (a fallocate over data keeps the data: they are
        // punched first).
        if old.is_some() {
            let written = |e: &Ext| data_of(e) && e.ty != BTRFS_FILE_EXTENT_PREALLOC;
            let mut covered: Vec<(u64, u64)> = exts
                .iter()
                .filter(|e| written(e))
                .map(|e| (e.off, e.off + e.num_bytes))
                .collect();
            covered.sort();
            for o in old_exts.iter().filter(|e| written(e)) {
                let (a, b) = (o.off, (o.off + o.num_bytes).min(size));
                let mut pos = a;
                for &(ca, cb) in &covered {
                    if cb <= pos || ca >= b {
                        continue;
                    }
                    if ca > pos {
                        self.hole(&path, pos, ca)?;
                    }
                    pos = pos.max(cb);
                }
                if pos < b {
                    self.hole(&path, pos, b)?;
                }
            }
        }
        for e in &exts {
            if e.off >= size && e.ty != BTRFS_FILE_EXTENT_PREALLOC {
                continue;
            }
            // Bytes past the parent's end are new whatever the item.
            let within = (e.off + e.num_bytes).min(size) <= old_size;
            if within && (old_exts.contains(e) || same_bytes(&old_exts, e, size, old_size)) {
                continue;
            }
            let end = (e.off + e.num_bytes).min(size);
            match e.ty {
                BTRFS_FILE_EXTENT_PREALLOC if e.disk_bytenr != 0 => {
                    if self.opts.version >= 2 && !self.opts.no_data {
                        let keep = e.off + e.num_bytes > size;
                        if e.off < size {
                            self.put(Command::Fallocate {
                                path: path.clone(),
                                mode: 0,
                                offset: e.off,
                                len: end - e.off,
                            })?;
                        }
                        if keep {
                            let a = e.off.max(size);
                            self.put(Command::Fallocate {
                                path: path.clone(),
                                mode: 1,
                                offset: a,
                                len: e.off + e.num_bytes - a,
                            })?;
                        }
                    }
                }
                _ if !data_of(e) => {}
                _ => {
                    self.extent(ino, &path, e, end, size)?;
                    // UPDATE_EXTENT writes nothing: the size comes from
                    // the truncate.
                    if !self.opts.no_data {
                        sent_end = sent_end.max(end);
                    }
                }
            }
        }
        if old.is_some() {
            if size != old_size {
                self.put(Command::Truncate { path, size })?;
            }
        } else if size > sent_end {
            self.put(Command::Truncate { path, size })?;
        }
        // Now the snapshot's own extents of this file may be cloned from.
        for e in exts
            .iter()
            .filter(|e| e.ty == BTRFS_FILE_EXTENT_REG && e.disk_bytenr != 0)
        {
            self.clones
                .entry(e.disk_bytenr)
                .or_default()
                .push(CloneSrc {
                    root: 0,
                    ino,
                    off: e.off,
                    ext_off: e.ext_off,
                    len: e.num_bytes,
                });
        }
        Ok(())
    }

    /// `[a, b)` of the file reads as zeros (it was data in the parent).
    fn hole(&mut self, path: &[u8], a: u64, b: u64) -> Result<()> {
        if a >= b {
            return Ok(());
        }
        if self.opts.no_data {
            return self.put(Command::UpdateExtent {
                path: path.to_vec(),
                offset: a,
                len: b - a,
            });
        }
        if self.opts.version >= 2 {
            return self.put(Command::Fallocate {
                path: path.to_vec(),
                mode: 0x03,
                offset: a,
                len: b - a,
            });
        }
        let max = self.w.max_write() as u64;
        let mut pos = a;
        while pos < b {
            let n = (b - pos).min(max);
            self.put(Command::Write {
                path: path.to_vec(),
                offset: pos,
                data: vec![0; n as usize],
            })?;
            pos += n;
        }
        Ok(())
    }

    /// File bytes `[e.off, end)` of extent `e`: a clone, an encoded write
    /// or writes.
    fn extent(&mut self, ino: u64, path: &[u8], e: &Ext, end: u64, size: u64) -> Result<()> {
        if self.opts.no_data {
            return self.put(Command::UpdateExtent {
                path: path.to_vec(),
                offset: e.off,
                len: end - e.off,
            });
        }
        let len = end - e.off;
        if e.ty == BTRFS_FILE_EXTENT_REG {
            if let Some(done) = self.try_clone(ino, path, e, len, size)? {
                if done >= len {
                    return Ok(());
                }
                return self.write_plain(ino, path, e.off + done, end, Some(e));
            }
            if self.opts.compressed_data && e.compression != BTRFS_COMPRESS_NONE {
                return self.encoded(ino, path, e, len);
            }
        }
        self.write_plain(
            ino,
            path,
            e.off,
            end,
            (e.ty == BTRFS_FILE_EXTENT_REG).then_some(e),
        )
    }

    /// Clone what a clone root shares of the extent: the bytes done (all
    /// but an unaligned tail a reflink cannot take), None when nothing.
    fn try_clone(
        &mut self,
        ino: u64,
        path: &[u8],
        e: &Ext,
        len: u64,
        size: u64,
    ) -> Result<Option<u64>> {
        let Some(cands) = self.clones.get(&e.disk_bytenr) else {
            return Ok(None);
        };
        let want = (e.ext_off, e.ext_off + len);
        let Some(c) = cands
            .iter()
            .find(|c| {
                c.ext_off <= want.0
                    && want.1 <= c.ext_off + c.len
                    && !(c.root == 0 && c.ino == ino && c.off + (want.0 - c.ext_off) >= e.off)
            })
            .copied()
        else {
            return Ok(None);
        };
        let src_off = c.off + (e.ext_off - c.ext_off);
        let (uuid, ctransid, src_path, src_size) = if c.root == 0 {
            let s = self.snap.inodes[&c.ino].size();
            (
                self.snap.uuid,
                self.snap.ctransid,
                self.path(self.id_of(c.ino))?,
                s,
            )
        } else {
            let r = &self.others[c.root - 1];
            let Some(p) = r.path_of(c.ino) else {
                return Ok(None);
            };
            (r.uuid, r.ctransid, p, r.inodes[&c.ino].size())
        };
        let mut n = len;
        // A reflink of an unaligned length must end both files.
        let ends_both = src_off + n == src_size && e.off + n == size;
        if !(n.is_multiple_of(self.ss) || ends_both) {
            n = n / self.ss * self.ss;
        }
        if n == 0 || src_off + n > src_size {
            return Ok(None);
        }
        self.put(Command::Clone {
            path: path.to_vec(),
            offset: e.off,
            len: n,
            clone_uuid: uuid,
            clone_ctransid: ctransid,
            clone_path: src_path,
            clone_offset: src_off,
        })?;
        self.report.cloned_bytes += n;
        Ok(Some(n))
    }

    fn encoded(&mut self, ino: u64, path: &[u8], e: &Ext, len: u64) -> Result<()> {
        let raw = match self.stored(ino, e) {
            Some(r) => r,
            None => {
                let mut raw = vec![0u8; e.disk_num_bytes as usize];
                self.read_raw(e.disk_bytenr, &mut raw)?;
                raw
            }
        };
        let compression = match e.compression {
            BTRFS_COMPRESS_ZLIB => stream::encoded::ZLIB,
            BTRFS_COMPRESS_ZSTD => stream::encoded::ZSTD,
            _ => stream::encoded::LZO_4K + self.ss.trailing_zeros().saturating_sub(12),
        };
        self.report.encoded_bytes += len;
        self.put(Command::EncodedWrite {
            path: path.to_vec(),
            offset: e.off,
            unencoded_file_len: len,
            unencoded_len: e.ram_bytes,
            unencoded_offset: e.ext_off,
            compression,
            encryption: 0,
            data: raw,
        })
    }

    /// The extent's bytes as stored, checked against their checksums.
    fn read_raw(&mut self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.fs.store.data().read_data(bytenr, buf)?;
        self.verify(bytenr, buf)
    }

    /// Stored bytes at `bytenr` against their checksums.
    fn verify(&mut self, bytenr: u64, buf: &[u8]) -> Result<()> {
        let st = &mut self.fs.store;
        let csum = st.image().csum;
        let cs = csum.size();
        let ss = self.ss as usize;
        let sums = st.csums().csum_lookup(bytenr, buf.len() as u64)?;
        for (i, (sector, want)) in buf.chunks(ss).zip(sums.iter()).enumerate() {
            if let Some(w) = want {
                if csum.compute(sector)[..cs] != *w {
                    return Err(Error::io(
                        format!(
                            "data at logical {}: checksum mismatch",
                            bytenr + (i * ss) as u64
                        ),
                        std::io::Error::from_raw_os_error(libc::EIO),
                    ));
                }
            }
        }
        Ok(())
    }

    /// File bytes `[a, b)`, of extent `e` when given (regular): commands
    /// of WRITE.
    fn write_plain(
        &mut self,
        ino: u64,
        path: &[u8],
        a: u64,
        b: u64,
        e: Option<&Ext>,
    ) -> Result<()> {
        let max = self.w.max_write() as u64;
        if let Some(e) = e {
            if let Some(data) = self.decoded(ino, e, a, b) {
                for (i, piece) in data.chunks(max as usize).enumerate() {
                    self.report.data_bytes += piece.len() as u64;
                    self.put(Command::Write {
                        path: path.to_vec(),
                        offset: a + i as u64 * max,
                        data: piece.to_vec(),
                    })?;
                }
                return Ok(());
            }
        }
        let l = Loc::new(self.snap.id, ino);
        let mut pos = a;
        while pos < b {
            let chunk = (b - pos).min(4 << 20);
            let data = self.fs.read(l, pos, chunk)?;
            if data.len() as u64 != chunk {
                return Err(Error::Internal(format!(
                    "send: inode {ino} read {} bytes at {pos}, wanted {chunk}",
                    data.len()
                )));
            }
            for (i, piece) in data.chunks(max as usize).enumerate() {
                self.report.data_bytes += piece.len() as u64;
                self.put(Command::Write {
                    path: path.to_vec(),
                    offset: pos + i as u64 * max,
                    data: piece.to_vec(),
                })?;
            }
            pos += chunk;
        }
        Ok(())
    }
}

impl<W: Write> Sender<'_, W> {
    /// File bytes `[a, b)` of extent `e` decoded from what the reader
    /// read; None to read them the ordinary way.
    fn decoded(&mut self, ino: u64, e: &Ext, a: u64, b: u64) -> Option<Vec<u8>> {
        let raw = self.stored(ino, e)?;
        let from = (e.ext_off + (a - e.off)) as usize;
        let to = from + (b - a) as usize;
        if e.compression == BTRFS_COMPRESS_NONE {
            return raw.get(from..to).map(<[u8]>::to_vec);
        }
        let plain = crate::fs::compress::decompress(
            e.compression,
            &raw,
            e.ram_bytes as usize,
            self.ss as usize,
        )
        .ok()?;
        plain.get(from..to).map(<[u8]>::to_vec)
    }
}

/// Whether the parent's extents `old` map every byte of extent `e` (below
/// the file's `size`) to the same place on disk, all below the parent's
/// `old_size` (the kernel's is_extent_unchanged): an extent item split or
/// trimmed since holds the same data.
fn same_bytes(old: &[Ext], e: &Ext, size: u64, old_size: u64) -> bool {
    if e.ty != BTRFS_FILE_EXTENT_REG || e.disk_bytenr == 0 {
        return false;
    }
    let end = (e.off + e.num_bytes).min(size);
    if end > old_size {
        return false;
    }
    let mut pos = e.off;
    for o in old {
        if o.off + o.num_bytes <= pos || o.off >= end {
            continue;
        }
        let same = o.ty == BTRFS_FILE_EXTENT_REG
            && o.disk_bytenr == e.disk_bytenr
            && o.compression == e.compression
            && o.off <= pos
            && o.ext_off.wrapping_sub(o.off) == e.ext_off.wrapping_sub(e.off);
        if !same {
            return false;
        }
        pos = o.off + o.num_bytes;
        if pos >= end {
            return true;
        }
    }
    pos >= end
}

fn join(path: &mut Vec<u8>, name: &[u8]) {
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
}

fn is_orphan(n: &[u8], id: Id) -> bool {
    n.starts_with(format!("o{}-{}-", id.0, id.1).as_bytes())
}
