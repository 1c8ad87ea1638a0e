//! Model-based test of the whole write path: random sequences of file
//! operations (create, mkdir, writes at random offsets, truncate,
//! fallocate with and without keep-size, punch, zero-range, clone within
//! and across files, link, unlink, rmdir, rename over files and
//! directories, symlink, xattrs, fsync, sync, remount, evict, subvolume
//! create, snapshot and delete, quota enable) run through the script runner
//! (`EngineRunner`) on a `Filesystem` mounted on an image core's mkfs made
//! in memory, and on a plain in-memory model (paths -> type, contents, link
//! count, xattrs, symlink target, subvolume). Every step must succeed or
//! fail as the model (Linux's rules) says, with the same errno; after every
//! `sync`, every `remount` and at the end, what the engine shows equals the
//! model (inode numbers shared exactly by the names of one file), and the
//! checker finds the image clean (data checksums, and qgroups once quotas
//! are on). At the end the image is mounted afresh and must show the same
//! again.
//!
//! Cases vary the node size (4 KiB, 16 KiB), mkfs features (`^no-holes`,
//! `^skinny-metadata`, `^block-group-tree`) and mount options
//! (`compress=zstd`, `compress-force=lzo`, `nodatacow`, `max_inline=0`).
//!
//! `BTRKIT_MODEL_CASES=N` runs N generated cases (24 by default),
//! `BTRKIT_MODEL_OPS=N` allows up to N operations per case (48 by default).
//! Failing seeds are kept by proptest beside this file
//! (`engine_model.proptest-regressions`, run first every time); shrunk failures worth keeping
//! are also written out as scripts in `regressions()` below, so they stay
//! meaningful when the generator changes.

mod common;

use btrkit_core::check::{Finding, Severity};
use btrkit_core::fs::Filesystem;
use btrkit_core::io::BlockDevice;
use btrkit_core::workload::content::fill_bytes;
use btrkit_core::workload::engine::EngineRunner;
use btrkit_core::workload::manifest::content_hash;
use btrkit_core::workload::{Fill, Manifest, Step};
use common::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const ENOENT: i32 = libc::ENOENT;
const EEXIST: i32 = libc::EEXIST;
const ENOTDIR: i32 = libc::ENOTDIR;
const EISDIR: i32 = libc::EISDIR;
const EINVAL: i32 = libc::EINVAL;
const ENOTEMPTY: i32 = libc::ENOTEMPTY;
const ENODATA: i32 = libc::ENODATA;
const EPERM: i32 = libc::EPERM;
const EXDEV: i32 = libc::EXDEV;
const EACCES: i32 = libc::EACCES;
const ENOTTY: i32 = libc::ENOTTY;
const EOPNOTSUPP: i32 = libc::EOPNOTSUPP;

const BS: u64 = 4096;

// ---------------------------------------------------------------------------
// The model

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(String),
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    xattrs: BTreeMap<String, Vec<u8>>,
    /// The subvolume holding the node (the model's numbering, 0 the top
    /// level); a subvolume's root directory belongs to its own subvolume.
    subvol: u64,
    /// The root directory of subvolume `subvol`.
    root: bool,
    /// The empty placeholder a snapshot shows where its source held
    /// another subvolume (no ROOT_REF links that one under the snapshot):
    /// an empty directory, inode 2, that takes no entries.
    placeholder: bool,
}

/// Paths (normalised, `/` the root) to nodes; a node with several paths is
/// a hard-linked file.
#[derive(Clone, Debug)]
struct Model {
    paths: BTreeMap<String, u64>,
    nodes: BTreeMap<u64, Node>,
    next: u64,
    next_subvol: u64,
}

fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &p[..i],
    }
}

fn base(p: &str) -> &str {
    &p[p.rfind('/').map_or(0, |i| i + 1)..]
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether `p` is `anc` or below it.
fn within(p: &str, anc: &str) -> bool {
    p == anc || anc == "/" || p.starts_with(&format!("{anc}/"))
}

impl Model {
    fn new() -> Model {
        let mut m = Model {
            paths: BTreeMap::new(),
            nodes: BTreeMap::new(),
            next: 1,
            next_subvol: 1,
        };
        m.paths.insert("/".into(), 0);
        m.nodes.insert(
            0,
            Node {
                kind: Kind::Dir,
                xattrs: BTreeMap::new(),
                subvol: 0,
                root: true,
                placeholder: false,
            },
        );
        m
    }

    fn node(&self, p: &str) -> Option<&Node> {
        self.paths.get(p).and_then(|id| self.nodes.get(id))
    }
    fn is_dir(&self, p: &str) -> bool {
        matches!(self.node(p).map(|n| &n.kind), Some(Kind::Dir))
    }
    fn is_file(&self, p: &str) -> bool {
        matches!(self.node(p).map(|n| &n.kind), Some(Kind::File(_)))
    }
    fn children(&self, dir: &str) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| p.as_str() != "/" && parent(p) == dir)
            .cloned()
            .collect()
    }
    fn nlink(&self, id: u64) -> u64 {
        self.paths.values().filter(|x| **x == id).count() as u64
    }

    fn dirs(&self) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| self.is_dir(p))
            .cloned()
            .collect()
    }
    fn files(&self) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| self.is_file(p))
            .cloned()
            .collect()
    }
    fn non_root(&self) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| p.as_str() != "/")
            .cloned()
            .collect()
    }

    /// A new node named `p`, in its parent's subvolume.
    fn add(&mut self, p: &str, kind: Kind) {
        let subvol = self.subvol_of(parent(p));
        self.add_node(
            p,
            Node {
                kind,
                xattrs: BTreeMap::new(),
                subvol,
                root: false,
                placeholder: false,
            },
        );
    }

    fn add_node(&mut self, p: &str, n: Node) -> u64 {
        let id = self.next;
        self.next += 1;
        self.nodes.insert(id, n);
        self.paths.insert(p.to_string(), id);
        id
    }

    fn subvol_of(&self, p: &str) -> u64 {
        self.node(p).map_or(0, |n| n.subvol)
    }
    fn is_subvol_root(&self, p: &str) -> bool {
        self.node(p).is_some_and(|n| n.root)
    }
    /// Subvolume roots strictly below `p`.
    fn nested_subvols(&self, p: &str) -> Vec<String> {
        self.paths
            .keys()
            .filter(|q| q.as_str() != p && within(q, p) && self.is_subvol_root(q))
            .cloned()
            .collect()
    }
    fn subvol_roots(&self) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| self.is_subvol_root(p))
            .cloned()
            .collect()
    }

    /// Remove one name; the node goes with its last name.
    fn remove_name(&mut self, p: &str) {
        if let Some(id) = self.paths.remove(p) {
            if self.nlink(id) == 0 {
                self.nodes.remove(&id);
            }
        }
    }

    /// The parent directory of a new name must exist and be a directory.
    fn check_parent(&self, p: &str) -> Result<(), i32> {
        match self.node(parent(p)).map(|n| &n.kind) {
            None => Err(ENOENT),
            Some(Kind::Dir) => Ok(()),
            Some(_) => Err(ENOTDIR),
        }
    }
    fn is_placeholder(&self, p: &str) -> bool {
        self.node(p).is_some_and(|n| n.placeholder)
    }
    /// check_parent, and a placeholder parent refuses the new name with
    /// `in_placeholder` (its inode has no directory operations).
    fn check_new(&self, p: &str, in_placeholder: i32) -> Result<(), i32> {
        self.check_parent(p)?;
        if self.is_placeholder(parent(p)) {
            return Err(in_placeholder);
        }
        Ok(())
    }

    fn file_mut(&mut self, p: &str) -> Result<&mut Vec<u8>, i32> {
        let id = *self.paths.get(p).ok_or(ENOENT)?;
        match &mut self.nodes.get_mut(&id).ok_or(ENOENT)?.kind {
            Kind::File(d) => Ok(d),
            Kind::Dir => Err(EISDIR),
            Kind::Symlink(_) => Err(EINVAL),
        }
    }

    /// What a step does to the model: Ok, or the errno Linux returns.
    fn apply(&mut self, st: &Step) -> Result<(), i32> {
        match st {
            Step::Mkdir(p) => {
                self.check_new(p, EPERM)?;
                if self.paths.contains_key(p) {
                    return Err(EEXIST);
                }
                self.add(p, Kind::Dir);
            }
            Step::Create(p) => {
                self.check_new(p, EACCES)?;
                match self.node(p).map(|n| &n.kind) {
                    None => self.add(p, Kind::File(Vec::new())),
                    Some(Kind::Dir) => return Err(EISDIR),
                    Some(_) => {}
                }
            }
            Step::Write {
                path,
                off,
                len,
                fill,
                ..
            } => {
                if !self.paths.contains_key(path) {
                    self.check_new(path, EACCES)?;
                    self.add(path, Kind::File(Vec::new()));
                }
                let bytes = fill_bytes(fill, *len);
                let d = self.file_mut(path)?;
                let end = (*off + *len) as usize;
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[*off as usize..end].copy_from_slice(&bytes);
            }
            Step::Truncate(p, size) => {
                self.file_mut(p)?.resize(*size as usize, 0);
            }
            Step::Fallocate {
                path,
                off,
                len,
                keep,
                ..
            } => {
                let d = self.file_mut(path)?;
                if *len == 0 {
                    return Err(EINVAL);
                }
                if !keep && d.len() < (off + len) as usize {
                    d.resize((off + len) as usize, 0);
                }
            }
            Step::Punch { path, off, len } => {
                let d = self.file_mut(path)?;
                if *len == 0 {
                    return Err(EINVAL);
                }
                let (a, b) = (
                    (*off as usize).min(d.len()),
                    ((off + len) as usize).min(d.len()),
                );
                d[a..b].fill(0);
            }
            Step::ZeroRange {
                path,
                off,
                len,
                keep,
            } => {
                let d = self.file_mut(path)?;
                if *len == 0 {
                    return Err(EINVAL);
                }
                if !keep && d.len() < (off + len) as usize {
                    d.resize((off + len) as usize, 0);
                }
                let (a, b) = (
                    (*off as usize).min(d.len()),
                    ((off + len) as usize).min(d.len()),
                );
                d[a..b].fill(0);
            }
            Step::Clone {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                let s = self.file_mut(src)?.clone();
                let same = self.paths.get(src) == self.paths.get(dst);
                let d = self.file_mut(dst)?;
                let (soff, doff, ssize, dsize) =
                    (*src_off, *dst_off, s.len() as u64, d.len() as u64);
                // FICLONERANGE: len 0 is "to the source's end"; the range must
                // lie within the source; offsets block aligned, the length
                // too unless it ends at the source's end, and then it must
                // also reach (or pass) the destination's end; no overlap
                // within one file.
                let len = if *len == 0 {
                    if soff == ssize {
                        return Ok(());
                    }
                    if soff > ssize {
                        return Err(EINVAL);
                    }
                    ssize - soff
                } else {
                    *len
                };
                if soff >= ssize || soff + len > ssize {
                    return Err(EINVAL);
                }
                let to_eof = soff + len == ssize;
                if soff % BS != 0 || doff % BS != 0 || (len % BS != 0 && !to_eof) {
                    return Err(EINVAL);
                }
                if len % BS != 0 && doff + len < dsize {
                    return Err(EINVAL);
                }
                let alen = len.div_ceil(BS) * BS;
                if same && soff < doff + alen && doff < soff + alen {
                    return Err(EINVAL);
                }
                let end = (doff + len) as usize;
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[doff as usize..end].copy_from_slice(&s[soff as usize..(soff + len) as usize]);
            }
            Step::Link(a, b) => {
                let id = *self.paths.get(a).ok_or(ENOENT)?;
                self.check_parent(b)?;
                if self.paths.contains_key(b) {
                    return Err(EEXIST);
                }
                if self.is_dir(a) || self.is_placeholder(parent(b)) {
                    return Err(EPERM);
                }
                if self.subvol_of(a) != self.subvol_of(parent(b)) {
                    return Err(EXDEV);
                }
                self.paths.insert(b.clone(), id);
            }
            Step::Symlink { target, path } => {
                self.check_new(path, EPERM)?;
                if self.paths.contains_key(path) {
                    return Err(EEXIST);
                }
                self.add(path, Kind::Symlink(target.clone()));
            }
            Step::Unlink(p) => {
                if !self.paths.contains_key(p) {
                    return Err(ENOENT);
                }
                if self.is_dir(p) {
                    return Err(EISDIR);
                }
                self.remove_name(p);
            }
            Step::Rmdir(p) => {
                if !self.paths.contains_key(p) {
                    return Err(ENOENT);
                }
                if !self.is_dir(p) {
                    return Err(ENOTDIR);
                }
                if !self.children(p).is_empty() {
                    return Err(ENOTEMPTY);
                }
                // An empty subvolume goes with rmdir too.
                self.remove_name(p);
            }
            Step::SubvolCreate(p) => {
                self.check_new(p, ENOTTY)?;
                if self.paths.contains_key(p) {
                    return Err(EEXIST);
                }
                let sv = self.next_subvol;
                self.next_subvol += 1;
                self.add_node(
                    p,
                    Node {
                        kind: Kind::Dir,
                        xattrs: BTreeMap::new(),
                        subvol: sv,
                        root: true,
                        placeholder: false,
                    },
                );
            }
            Step::Snapshot(src, p) => {
                let root = self.node(src).ok_or(ENOENT)?.clone();
                if !root.root {
                    return Err(EINVAL);
                }
                self.check_new(p, ENOTTY)?;
                if self.paths.contains_key(p) {
                    return Err(EEXIST);
                }
                let sv = self.next_subvol;
                self.next_subvol += 1;
                // The source as it is now (each of this subvolume's nodes
                // copied once, so hard links stay hard links); a subvolume
                // nested in it becomes an empty placeholder, what is in
                // that subvolume is not copied.
                let inside: Vec<(String, u64)> = self
                    .paths
                    .iter()
                    .filter(|(q, id)| {
                        q.as_str() != src
                            && within(q, src)
                            && (self.nodes[*id].subvol == root.subvol
                                || (self.nodes[*id].root
                                    && self.subvol_of(parent(q)) == root.subvol))
                    })
                    .map(|(q, id)| (q.clone(), *id))
                    .collect();
                self.add_node(p, Node { subvol: sv, ..root });
                let mut copies: BTreeMap<u64, u64> = BTreeMap::new();
                for (q, id) in inside {
                    let to = if src == "/" {
                        format!("{p}{q}")
                    } else {
                        format!("{p}{}", &q[src.len()..])
                    };
                    match copies.get(&id) {
                        Some(&c) => {
                            self.paths.insert(to, c);
                        }
                        None if self.nodes[&id].root => {
                            let n = Node {
                                kind: Kind::Dir,
                                xattrs: BTreeMap::new(),
                                subvol: sv,
                                root: false,
                                placeholder: true,
                            };
                            self.add_node(&to, n);
                        }
                        None => {
                            let n = Node {
                                subvol: sv,
                                ..self.nodes[&id].clone()
                            };
                            let c = self.add_node(&to, n);
                            copies.insert(id, c);
                        }
                    }
                }
            }
            Step::SubvolDelete(p) => {
                if !self.paths.contains_key(p) {
                    return Err(ENOENT);
                }
                if !self.is_subvol_root(p) {
                    return Err(EINVAL);
                }
                if !self.nested_subvols(p).is_empty() {
                    return Err(ENOTEMPTY);
                }
                let gone: Vec<String> = self
                    .paths
                    .keys()
                    .filter(|q| within(q, p))
                    .cloned()
                    .collect();
                for q in gone {
                    self.remove_name(&q);
                }
            }
            Step::QuotaEnable => {}
            Step::Rename(a, b) => self.rename(a, b)?,
            Step::SetXattr { path, name, value } => {
                let id = *self.paths.get(path).ok_or(ENOENT)?;
                let n = self.nodes.get_mut(&id).ok_or(ENOENT)?;
                if n.placeholder {
                    return Err(EOPNOTSUPP);
                }
                if matches!(n.kind, Kind::Symlink(_)) {
                    return Err(EPERM);
                }
                n.xattrs.insert(name.clone(), value.clone());
            }
            Step::RemoveXattr { path, name } => {
                let id = *self.paths.get(path).ok_or(ENOENT)?;
                let n = self.nodes.get_mut(&id).ok_or(ENOENT)?;
                if n.placeholder {
                    return Err(EOPNOTSUPP);
                }
                if matches!(n.kind, Kind::Symlink(_)) {
                    return Err(EPERM);
                }
                n.xattrs.remove(name).ok_or(ENODATA)?;
            }
            Step::Fsync(p) | Step::Fdatasync(p) => {
                self.paths.get(p).ok_or(ENOENT)?;
            }
            Step::Sync | Step::Remount | Step::Evict => {}
            other => panic!("the model does not know {other:?}"),
        }
        Ok(())
    }

    /// rename(2) with Linux's checks in Linux's order.
    fn rename(&mut self, a: &str, b: &str) -> Result<(), i32> {
        let sid = *self.paths.get(a).ok_or(ENOENT)?;
        self.check_parent(b)?;
        let sdir = self.is_dir(a);
        // The source may not be an ancestor of the new parent (EINVAL), the
        // target not an ancestor of the source (ENOTEMPTY).
        if sdir && within(parent(b), a) {
            return Err(EINVAL);
        }
        if let Some(&did) = self.paths.get(b) {
            if b != a && within(a, b) {
                return Err(ENOTEMPTY);
            }
            if did == sid {
                return Ok(());
            }
            match (sdir, self.is_dir(b)) {
                (true, false) => return Err(ENOTDIR),
                (false, true) => return Err(EISDIR),
                _ => {}
            }
        }
        // btrfs_rename: nothing goes into a placeholder; only a
        // subvolume's own entry may move to another subvolume; a
        // placeholder does not move; a subvolume root or a non-empty
        // directory is not replaced.
        if self.is_placeholder(parent(b)) {
            return Err(EPERM);
        }
        if !self.is_subvol_root(a) && self.subvol_of(a) != self.subvol_of(parent(b)) {
            return Err(EXDEV);
        }
        if self.is_placeholder(a) {
            return Err(ENOTEMPTY);
        }
        if self.paths.contains_key(b) {
            if self.is_subvol_root(b) || (sdir && !self.children(b).is_empty()) {
                return Err(ENOTEMPTY);
            }
            self.remove_name(b);
        }
        let moved: Vec<(String, u64)> = self
            .paths
            .iter()
            .filter(|(p, _)| within(p, a))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        for (p, _) in &moved {
            self.paths.remove(p);
        }
        for (p, id) in moved {
            self.paths.insert(format!("{b}{}", &p[a.len()..]), id);
        }
        Ok(())
    }

    /// The model against what the engine shows: the same paths, and for
    /// each the same type, size, link count, contents, xattrs and symlink
    /// target; paths of one node share an inode number, others do not.
    fn compare(&self, got: &Manifest) -> Result<(), String> {
        let mut diffs = Vec::new();
        let want: BTreeSet<&String> = self.paths.keys().collect();
        let have: BTreeSet<&String> = got.entries.keys().collect();
        for p in want.difference(&have) {
            diffs.push(format!("missing {p}"));
        }
        for p in have.difference(&want) {
            diffs.push(format!("unexpected {p}"));
        }
        let mut ino_of: BTreeMap<u64, u64> = BTreeMap::new();
        let mut node_of: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for (p, id) in &self.paths {
            let Some(e) = got.entries.get(p) else {
                continue;
            };
            let n = &self.nodes[id];
            let (kind, mode, size, nlink) = match &n.kind {
                Kind::File(d) => ('f', 0o644, d.len() as u64, self.nlink(*id)),
                Kind::Dir => (
                    'd',
                    0o755,
                    self.children(p)
                        .iter()
                        .map(|c| 2 * base(c).len() as u64)
                        .sum(),
                    1,
                ),
                Kind::Symlink(t) => ('l', 0o777, t.len() as u64, self.nlink(*id)),
            };
            let mut d = Vec::new();
            if e.kind != kind {
                d.push(format!("type {} want {kind}", e.kind));
            }
            if e.mode != mode {
                d.push(format!("mode {:o} want {mode:o}", e.mode));
            }
            if e.size != size {
                d.push(format!("size {} want {size}", e.size));
            }
            if e.nlink != nlink {
                d.push(format!("nlink {} want {nlink}", e.nlink));
            }
            if let Kind::File(data) = &n.kind {
                if e.hash.as_deref() != Some(content_hash(data).as_str()) {
                    d.push(format!("contents differ ({} bytes)", data.len()));
                }
            }
            if let Kind::Symlink(t) = &n.kind {
                if e.target.as_deref() != Some(t.as_str()) {
                    d.push(format!("target {:?} want {t:?}", e.target));
                }
            }
            if e.xattrs != n.xattrs {
                d.push(format!(
                    "xattrs {:?} want {:?}",
                    e.xattrs.keys().collect::<Vec<_>>(),
                    n.xattrs.keys().collect::<Vec<_>>()
                ));
            }
            if n.placeholder {
                // Every placeholder is inode 2, in whatever subvolume.
                if e.ino != 2 {
                    d.push(format!("inode {} want 2 (a placeholder)", e.ino));
                }
                if !d.is_empty() {
                    diffs.push(format!("{p}: {}", d.join("; ")));
                }
                continue;
            }
            match ino_of.insert(*id, e.ino) {
                Some(i) if i != e.ino => {
                    d.push(format!("inode {} but another name of it has {i}", e.ino))
                }
                _ => {}
            }
            match node_of.insert((n.subvol, e.ino), *id) {
                Some(o) if o != *id => {
                    d.push(format!("inode {} shared with an unrelated path", e.ino))
                }
                _ => {}
            }
            if !d.is_empty() {
                diffs.push(format!("{p}: {}", d.join("; ")));
            }
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(diffs.join("\n"))
        }
    }
}

// ---------------------------------------------------------------------------
// Generated operations: indexes into what exists when the operation runs

#[derive(Clone, Debug)]
enum Op {
    Create {
        dir: u8,
        name: u8,
    },
    Mkdir {
        dir: u8,
        name: u8,
    },
    Write {
        file: u8,
        off: u64,
        len: u64,
        fill: u16,
    },
    Truncate {
        file: u8,
        size: u64,
    },
    Fallocate {
        file: u8,
        off: u64,
        len: u64,
        keep: bool,
    },
    Punch {
        file: u8,
        off: u64,
        len: u64,
    },
    ZeroRange {
        file: u8,
        off: u64,
        len: u64,
        keep: bool,
    },
    Clone {
        src: u8,
        dst: u8,
        soff: u8,
        doff: u8,
        len: u8,
    },
    Link {
        src: u8,
        dir: u8,
        name: u8,
    },
    Symlink {
        dir: u8,
        name: u8,
        target: u8,
    },
    Unlink {
        path: u8,
    },
    Rmdir {
        path: u8,
    },
    Rename {
        src: u8,
        dir: u8,
        name: u8,
    },
    SetXattr {
        path: u8,
        name: u8,
        len: u16,
        seed: u8,
    },
    RemoveXattr {
        path: u8,
        name: u8,
    },
    Fsync {
        file: u8,
    },
    SubvolCreate {
        dir: u8,
        name: u8,
    },
    Snapshot {
        src: u8,
        dir: u8,
        name: u8,
    },
    SubvolDelete {
        path: u8,
    },
    QuotaEnable,
    Sync,
    Remount,
    Evict,
}

const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "a-name-of-a-hundred-and-twenty-bytes-------------------------------------------------------------------------------end"];
const XATTRS: [&str; 4] = [
    "user.a",
    "user.b",
    "user.checksum",
    "user.x-long-attribute-name",
];

fn pick(v: &[String], i: u8) -> Option<&String> {
    if v.is_empty() {
        None
    } else {
        Some(&v[i as usize % v.len()])
    }
}

/// Steer around engine bugs that have an ignored test below (each fails
/// until the bug is fixed), so the generated cases keep finding new ones.
/// `BTRKIT_MODEL_KNOWN_BUGS=1` generates them again. No bug is steered
/// around at present; the switch stays for the next one found.
#[allow(dead_code)]
fn avoid_known_bugs() -> bool {
    env_num("BTRKIT_MODEL_KNOWN_BUGS", 0) == 0
}

impl Op {
    /// The step this operation stands for in the model's current state
    /// (None: nothing sensible to do).
    fn step(&self, m: &Model) -> Option<Step> {
        let dirs = m.dirs();
        let files = m.files();
        let all = m.non_root();
        let dir = |i: u8| pick(&dirs, i).cloned().unwrap_or_else(|| "/".into());
        let name = |i: u8| NAMES[i as usize % NAMES.len()];
        let file = |i: u8| pick(&files, i).cloned();
        Some(match *self {
            Op::Create { dir: d, name: n } => {
                let p = join(&dir(d), name(n));
                if matches!(m.node(&p).map(|x| &x.kind), Some(Kind::Symlink(_))) {
                    return None;
                }
                Step::Create(p)
            }
            Op::Mkdir { dir: d, name: n } => Step::Mkdir(join(&dir(d), name(n))),
            Op::Write {
                file: f,
                off,
                len,
                fill,
            } => {
                let path = file(f).unwrap_or_else(|| join(&dir(f), name(f)));
                if m.paths.contains_key(&path) && !m.is_file(&path) {
                    return None;
                }
                let fill = if fill % 3 == 0 {
                    Fill::Byte(fill as u8)
                } else {
                    Fill::Random(fill as u64)
                };
                Step::Write {
                    path,
                    off,
                    len,
                    fill,
                    enospc_ok: false,
                }
            }
            Op::Truncate { file: f, size } => Step::Truncate(file(f)?, size),
            Op::Fallocate {
                file: f,
                off,
                len,
                keep,
            } => Step::Fallocate {
                path: file(f)?,
                off,
                len,
                keep,
                enospc_ok: false,
            },
            Op::Punch { file: f, off, len } => Step::Punch {
                path: file(f)?,
                off,
                len,
            },
            Op::ZeroRange {
                file: f,
                off,
                len,
                keep,
            } => Step::ZeroRange {
                path: file(f)?,
                off,
                len,
                keep,
            },
            Op::Clone {
                src,
                dst,
                soff,
                doff,
                len,
            } => {
                let s = file(src)?;
                let d = file(dst)?;
                let ssize = m
                    .node(&s)
                    .map(|n| {
                        if let Kind::File(v) = &n.kind {
                            v.len() as u64
                        } else {
                            0
                        }
                    })
                    .unwrap_or(0);
                let dsize = m
                    .node(&d)
                    .map(|n| {
                        if let Kind::File(v) = &n.kind {
                            v.len() as u64
                        } else {
                            0
                        }
                    })
                    .unwrap_or(0);
                // Mostly valid ranges: a block inside the source, a block
                // at most two past the destination's end; length 0 (to the
                // end) or a few blocks.
                let sb = ssize.div_ceil(BS).max(1);
                let src_off = (soff as u64 % (sb + 1)) * BS;
                let dst_off = (doff as u64 % (dsize.div_ceil(BS) + 3)) * BS;
                let len = match len % 4 {
                    0 => 0,
                    1 => ssize.saturating_sub(src_off),
                    _ => (len as u64 % 16 + 1) * BS,
                };
                Step::Clone {
                    src: s,
                    src_off,
                    dst: d,
                    dst_off,
                    len,
                }
            }
            Op::Link {
                src,
                dir: d,
                name: n,
            } => {
                let nondir: Vec<String> = all.iter().filter(|p| !m.is_dir(p)).cloned().collect();
                let (a, b) = (pick(&nondir, src)?.clone(), join(&dir(d), name(n)));
                Step::Link(a, b)
            }
            Op::Symlink {
                dir: d,
                name: n,
                target,
            } => Step::Symlink {
                target: format!("../nowhere/t{target}"),
                path: join(&dir(d), name(n)),
            },
            Op::Unlink { path } => Step::Unlink(pick(&all, path)?.clone()),
            Op::Rmdir { path } => Step::Rmdir(pick(&all, path)?.clone()),
            Op::Rename {
                src,
                dir: d,
                name: n,
            } => {
                let (a, b) = (pick(&all, src)?.clone(), join(&dir(d), name(n)));
                Step::Rename(a, b)
            }
            Op::SetXattr {
                path,
                name: n,
                len,
                seed,
            } => {
                let mut paths = all.clone();
                paths.push("/".into());
                // Short values vary byte by byte, long ones repeat one letter
                // (so failing scripts stay readable).
                let value: Vec<u8> = if len <= 64 {
                    (0..len as usize)
                        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                        .collect()
                } else {
                    vec![b'a' + seed % 26; len as usize]
                };
                Step::SetXattr {
                    path: pick(&paths, path)?.clone(),
                    name: XATTRS[n as usize % XATTRS.len()].into(),
                    value,
                }
            }
            Op::RemoveXattr { path, name: n } => {
                let mut paths = all.clone();
                paths.push("/".into());
                Step::RemoveXattr {
                    path: pick(&paths, path)?.clone(),
                    name: XATTRS[n as usize % XATTRS.len()].into(),
                }
            }
            Op::Fsync { file: f } => Step::Fsync(file(f)?),
            Op::SubvolCreate { dir: d, name: n } => Step::SubvolCreate(join(&dir(d), name(n))),
            Op::Snapshot {
                src,
                dir: d,
                name: n,
            } => {
                let roots = m.subvol_roots();
                let src = pick(&roots, src)?.clone();
                Step::Snapshot(src, join(&dir(d), name(n)))
            }
            Op::SubvolDelete { path } => {
                let mut paths = m.subvol_roots();
                paths.retain(|p| p != "/");
                paths.extend(all.iter().take(2).cloned());
                Step::SubvolDelete(pick(&paths, path)?.clone())
            }
            Op::QuotaEnable => Step::QuotaEnable,
            Op::Sync => Step::Sync,
            Op::Remount => Step::Remount,
            Op::Evict => Step::Evict,
        })
    }
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..9000,
        (0u64..300).prop_map(|k| k * BS),
        0u64..(1 << 20)
    ]
}

fn length() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..5000, (1u64..64).prop_map(|k| k * BS), 1u64..300_000]
}

fn op() -> impl Strategy<Value = Op> {
    let u = any::<u8>;
    prop_oneof![
        3 => (u(), u()).prop_map(|(dir, name)| Op::Create { dir, name }),
        2 => (u(), u()).prop_map(|(dir, name)| Op::Mkdir { dir, name }),
        9 => (u(), offset(), length(), any::<u16>()).prop_map(|(file, off, len, fill)| Op::Write { file, off, len, fill }),
        2 => (u(), prop_oneof![0u64..9000, 0u64..(3 << 19)]).prop_map(|(file, size)| Op::Truncate { file, size }),
        2 => (u(), offset(), length(), any::<bool>()).prop_map(|(file, off, len, keep)| Op::Fallocate { file, off, len, keep }),
        2 => (u(), offset(), length()).prop_map(|(file, off, len)| Op::Punch { file, off, len }),
        1 => (u(), offset(), length(), any::<bool>()).prop_map(|(file, off, len, keep)| Op::ZeroRange { file, off, len, keep }),
        3 => (u(), u(), u(), u(), u()).prop_map(|(src, dst, soff, doff, len)| Op::Clone { src, dst, soff, doff, len }),
        2 => (u(), u(), u()).prop_map(|(src, dir, name)| Op::Link { src, dir, name }),
        1 => (u(), u(), u()).prop_map(|(dir, name, target)| Op::Symlink { dir, name, target }),
        2 => u().prop_map(|path| Op::Unlink { path }),
        1 => u().prop_map(|path| Op::Rmdir { path }),
        3 => (u(), u(), u()).prop_map(|(src, dir, name)| Op::Rename { src, dir, name }),
        2 => (u(), u(), prop_oneof![0u16..64, 0u16..1200, Just(3000u16)], u()).prop_map(|(path, name, len, seed)| Op::SetXattr { path, name, len, seed }),
        1 => (u(), u()).prop_map(|(path, name)| Op::RemoveXattr { path, name }),
        1 => u().prop_map(|file| Op::Fsync { file }),
        1 => (u(), u()).prop_map(|(dir, name)| Op::SubvolCreate { dir, name }),
        1 => (u(), u(), u()).prop_map(|(src, dir, name)| Op::Snapshot { src, dir, name }),
        1 => u().prop_map(|path| Op::SubvolDelete { path }),
        1 => Just(Op::QuotaEnable),
        1 => Just(Op::Sync),
        1 => Just(Op::Remount),
        1 => Just(Op::Evict),
    ]
}

/// mkfs arguments of a case.
const MKFS: [&[&str]; 5] = [
    &["-n", "4096"],
    &["-n", "16384"],
    &["-n", "4096", "-O", "^no-holes"],
    &["-n", "16384", "-O", "^no-holes,^skinny-metadata"],
    // Block group items in the extent tree (the default has a block
    // group tree).
    &["-n", "4096", "-O", "^block-group-tree"],
];

/// Mount options of a case.
const MOUNT: [&[&str]; 6] = [
    &[],
    &["compress=zstd"],
    &["compress-force=lzo"],
    &["nodatacow"],
    &["max_inline=0"],
    &["compress=zlib", "max_inline=0"],
];

// ---------------------------------------------------------------------------
// Running a case

/// A step as a script line (for failure reports and regression scripts).
fn line(st: &Step) -> String {
    let q = |v: &[u8]| {
        if v.len() > 8 && v.iter().all(|&b| b == v[0] && b.is_ascii_alphanumeric()) {
            format!("<{} x '{}'>", v.len(), v[0] as char)
        } else {
            format!(
                "\"{}\"",
                v.iter().map(|b| format!("\\x{b:02x}")).collect::<String>()
            )
        }
    };
    match st {
        Step::Create(p) => format!("create {p}"),
        Step::Mkdir(p) => format!("mkdir {p}"),
        Step::Write {
            path,
            off,
            len,
            fill,
            ..
        } => match fill {
            Fill::Byte(b) => format!("write {path} {off} {len} {b}"),
            Fill::Random(s) => format!("write {path} {off} {len} random:{s}"),
            Fill::Text(t) => format!("write {path} {off} {len} {}", q(t)),
        },
        Step::Truncate(p, s) => format!("truncate {p} {s}"),
        Step::Fallocate {
            path,
            off,
            len,
            keep,
            ..
        } => format!(
            "fallocate {path} {off} {len}{}",
            if *keep { " keep" } else { "" }
        ),
        Step::ZeroRange {
            path,
            off,
            len,
            keep,
        } => format!(
            "zero-range {path} {off} {len}{}",
            if *keep { " keep" } else { "" }
        ),
        Step::Punch { path, off, len } => format!("punch {path} {off} {len}"),
        Step::Clone {
            src,
            src_off,
            dst,
            dst_off,
            len,
        } => format!("clone {src} {src_off} {dst} {dst_off} {len}"),
        Step::Link(a, b) => format!("link {a} {b}"),
        Step::Symlink { target, path } => format!("symlink {target} {path}"),
        Step::Unlink(p) => format!("unlink {p}"),
        Step::Rmdir(p) => format!("rmdir {p}"),
        Step::Rename(a, b) => format!("rename {a} {b}"),
        Step::SetXattr { path, name, value } => format!("setxattr {path} {name} {}", q(value)),
        Step::RemoveXattr { path, name } => format!("removexattr {path} {name}"),
        Step::Fsync(p) => format!("fsync {p}"),
        Step::Sync => "sync".into(),
        Step::Remount => "remount".into(),
        Step::Evict => "evict".into(),
        Step::SubvolCreate(p) => format!("subvol-create {p}"),
        Step::Snapshot(a, b) => format!("snapshot {a} {b}"),
        Step::SubvolDelete(p) => format!("subvol-delete {p}"),
        Step::QuotaEnable => "quota-enable".into(),
        other => format!("{other:?}"),
    }
}

/// Run steps on a fresh image with the engine and the model side by side.
/// `next` yields the next step from the model's state (None: done).
fn run_case(
    mkfs: &[&str],
    mount_opts: &[&str],
    mut next: impl FnMut(&Model) -> Option<Option<Step>>,
) -> Result<(), String> {
    let dev = new_image(IMAGE_SIZE, mkfs);
    let d: Arc<dyn BlockDevice> = dev.clone();
    let mut fs = mount(d.clone(), mount_opts).map_err(|e| format!("mount: {e}"))?;
    let mut runner = EngineRunner::new();
    let mut model = Model::new();
    let mut script: Vec<String> = Vec::new();
    let fail = |script: &[String], msg: String| -> String {
        format!(
            "mkfs {}\nmount {}\n{}\n# ^ {msg}",
            mkfs.join(" "),
            mount_opts.join(","),
            script.join("\n")
        )
    };
    let verify =
        |fs: &mut Filesystem, model: &Model, script: &[String], when: &str| -> Result<(), String> {
            let got = btrkit_core::workload::engine::manifest(fs)
                .map_err(|e| fail(script, format!("{when}: manifest: {e}")))?;
            model.compare(&got).map_err(|e| {
                fail(
                    script,
                    format!("{when}: engine differs from the model:\n{e}"),
                )
            })?;
            let r = check(d.clone());
            let real: Vec<&Finding> = r
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            if real.is_empty()
                && r.errors as usize
                    == r.findings
                        .iter()
                        .filter(|f| f.severity == Severity::Error)
                        .count()
            {
                return Ok(());
            }
            Err(fail(script, format!("{when}: checker: {}", errors_of(&r))))
        };
    while let Some(st) = next(&model) {
        let Some(st) = st else { continue };
        script.push(line(&st));
        let want = model.apply(&st);
        let got = apply(&mut fs, &mut runner, &d, mount_opts, &st);
        match (&want, &got) {
            (Ok(()), Ok(())) => {}
            (Err(w), Err(e)) if e.as_errno() == *w => {}
            _ => {
                let g = got
                    .as_ref()
                    .map(|_| "ok".to_string())
                    .unwrap_or_else(|e| format!("{e} (errno {})", e.as_errno()));
                let w = want
                    .map(|_| "ok".to_string())
                    .unwrap_or_else(|e| format!("errno {e}"));
                return Err(fail(&script, format!("engine: {g}; model: {w}")));
            }
        }
        if matches!(st, Step::Sync | Step::Remount) {
            verify(&mut fs, &model, &script, "after sync")?;
        }
    }
    runner
        .close_all(&mut fs)
        .map_err(|e| fail(&script, format!("close: {e}")))?;
    fs.sync()
        .map_err(|e| fail(&script, format!("final sync: {e}")))?;
    verify(&mut fs, &model, &script, "at the end")?;
    drop(fs);
    let mut fresh = mount(d.clone(), mount_opts)
        .map_err(|e| fail(&script, format!("mount at the end: {e}")))?;
    let got = btrkit_core::workload::engine::manifest(&mut fresh)
        .map_err(|e| fail(&script, format!("manifest after mount: {e}")))?;
    model.compare(&got).map_err(|e| {
        fail(
            &script,
            format!("a fresh mount differs from the model:\n{e}"),
        )
    })
}

/// Run a fixed script (a kept regression) against the model.
fn run_script(mkfs: &[&str], mount_opts: &[&str], text: &str) -> Result<(), String> {
    let mut it = steps(text).into_iter();
    run_case(mkfs, mount_opts, move |_| it.next().map(Some))
}

#[derive(Clone, Debug)]
struct Case {
    mkfs: usize,
    mount: usize,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    let max = env_num("BTRKIT_MODEL_OPS", 48) as usize;
    (
        0..MKFS.len(),
        0..MOUNT.len(),
        proptest::collection::vec(op(), 1..max.max(2)),
    )
        .prop_map(|(mkfs, mount, ops)| Case { mkfs, mount, ops })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: env_num("BTRKIT_MODEL_CASES", 24) as u32,
        max_shrink_iters: 400,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("tests/engine_model.proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_the_model(c in case()) {
        let mut ops = c.ops.iter();
        let r = run_case(MKFS[c.mkfs], MOUNT[c.mount], |m| ops.next().map(|o| o.step(m)));
        prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
    }
}

// ---------------------------------------------------------------------------
// Kept regressions and fixed cases

/// A fixed script must pass.
#[track_caller]
fn must_pass(mkfs: &[&str], mount_opts: &[&str], text: &str) {
    if let Err(e) = run_script(mkfs, mount_opts, text) {
        panic!("{e}");
    }
}

/// A fixed script must pass (once findings of known bugs were let
/// through [`must_pass`]; now the same).
#[track_caller]
fn must_pass_strictly(mkfs: &[&str], mount_opts: &[&str], text: &str) {
    if let Err(e) = run_script(mkfs, mount_opts, text) {
        panic!("{e}");
    }
}

/// Every operation at least once, on every mkfs and mount variant.
#[test]
fn every_operation_on_every_variant() {
    let text = "mkdir /d\n\
        write /d/f 0 100000 random:1\n\
        write /d/f 5000 3000 7\n\
        write /s 0 700 9\n\
        link /d/f /d/g\n\
        setxattr /d/f user.a \"hello\"\n\
        setxattr /d user.b \"\"\n\
        symlink ../nowhere/t1 /d/l\n\
        sync\n\
        clone /d/f 0 /s 8192 0\n\
        clone /d/f 0 /d/f 200704 8192\n\
        truncate /d/f 5\n\
        fallocate /s 1048576 65536 keep\n\
        fallocate /s 200000 4096\n\
        punch /s 4096 8192\n\
        zero-range /s 100 10000\n\
        zero-range /s 300000 5000 keep\n\
        rename /d/g /h\n\
        mkdir /d/e\n\
        rename /d/e /e\n\
        rename /s /h\n\
        removexattr /d/f user.a\n\
        fsync /h\n\
        remount\n\
        evict\n\
        unlink /d/l\n\
        rmdir /e\n\
        write /d/f 0 3 1\n\
        quota-enable\n\
        snapshot / /top\n\
        subvol-create /sv\n\
        write /sv/x 0 70000 random:3\n\
        snapshot /sv /d/snap\n\
        write /d/snap/x 4096 4096 5\n\
        subvol-delete /sv\n\
        sync\n\
        write /top/d/f 0 5000 2\n\
        sync\n";
    for mkfs in MKFS {
        for mount_opts in MOUNT {
            must_pass(mkfs, mount_opts, text);
        }
    }
}

/// Errors as Linux returns them (rename's checks in order, rmdir of a
/// non-empty directory, links to directories, xattrs on symlinks).
#[test]
fn errors_as_linux_returns_them() {
    must_pass(
        &["-n", "4096"],
        &[],
        "mkdir /a\nmkdir /a/b\ncreate /a/b/f\nsymlink x /l\n\
         rename /a /a/b/c\nrename /a /a\nmkdir /a\nrmdir /a\nrmdir /a/b/f\nunlink /a\nlink /a /z\n\
         link /a/b/f /a/b/f\ncreate /a\nsetxattr /l user.a \"v\"\nremovexattr /a user.a\n\
         mkdir /e\ncreate /e/f\nrename /a /e\nrename /a/b /a\nrename /a/b/f /e\nmkdir /g\nrename /g /e/f\n\
         truncate /a/b/f 10\nclone /a/b/f 0 /a/b/f 0 0\nclone /a/b/f 4096 /e/f 0 0\nsync\n",
    );
}

/// A hard link renamed over another name of the same file changes nothing.
#[test]
fn rename_between_names_of_one_file() {
    must_pass(
        &["-n", "4096"],
        &[],
        "write /a 0 10 1\nlink /a /b\nrename /a /b\nsync\nrename /b /a\nsync\n",
    );
}

// ---------------------------------------------------------------------------
// Engine bugs found here: each test fails until the bug is fixed.

/// Cloning part of an explicit hole item (a filesystem without no-holes)
/// writes a hole item whose offset is kept but whose ram_bytes is cut to
/// the cloned length, so offset + num_bytes > ram_bytes (the kernel keeps
/// the source item's ram_bytes and sets the offset).
#[test]
fn clone_of_part_of_a_hole_item() {
    must_pass_strictly(
        &["-n", "4096", "-O", "^no-holes"],
        &[],
        "write /a 372736 28672 0\nclone /a 180224 /a 241664 12288\nsync\n",
    );
}

/// rename(2) of a file onto a directory that is its own ancestor: Linux
/// checks "the target is an ancestor of the source" before the types and
/// returns ENOTEMPTY; the engine returns EISDIR.
#[test]
fn rename_of_a_file_over_its_ancestor() {
    must_pass_strictly(
        &["-n", "4096"],
        &[],
        "mkdir /a\nmkdir /a/b\ncreate /a/b/f\nrename /a/b/f /a/b\nrename /a/b/f /a\nsync\n",
    );
}

/// Punching next to a hole item that an earlier fallocate split (a
/// filesystem without no-holes): fill_hole extends the hole item before
/// the punched range, setting num_bytes and ram_bytes to the new length
/// but keeping the item's offset, so offset + num_bytes > ram_bytes (the
/// kernel's fill_holes also resets the offset to 0).
#[test]
fn punch_next_to_a_split_hole_item() {
    must_pass_strictly(
        &["-n", "4096", "-O", "^no-holes"],
        &[],
        "write /a 406667 117622 0\nfallocate /a 0 1\npunch /a 278528 131072\nsync\n",
    );
}

/// An item larger than half a leaf whose key falls in the middle of a
/// leaf with enough bytes on both sides: no single split point leaves room
/// for it, and the engine fails with ENOSPC ("no leaf split point fits the
/// item") where the kernel splits twice and gives the item a leaf of its
/// own. Here: a 3000-byte xattr on a 4 KiB-node filesystem.
#[test]
fn big_item_in_the_middle_of_a_full_leaf() {
    must_pass_strictly(
        &["-n", "4096", "-O", "^no-holes"],
        &[],
        "write /b 4096 1 0\nlink /b /a\nwrite /a 12288 1 0\nmkdir /c\nwrite /a 20480 1 0\nwrite /a 28672 1 0\nfsync /a\n\
         rename /c /a-name-of-a-hundred-and-twenty-bytes-------------------------------------------------------------------------------end\n\
         setxattr /a user.b <3000 x 'o'>\nsync\n",
    );
}

/// Errors in the kernel's order across subvolumes: the VFS checks that the
/// new name is free (link: EEXIST) and that the types agree (rename:
/// EISDIR/ENOTDIR) before btrfs refuses a cross-subvolume link or rename
/// with EXDEV; the engine returns EXDEV first. Likewise link(2) of a
/// directory onto an existing name is EEXIST (the engine says EPERM), a
/// directory renamed into a subvolume below itself is EINVAL, and a
/// rename over an (empty) subvolume is ENOTEMPTY (the engine: EINVAL).
#[test]
fn errno_order_with_subvolumes() {
    must_pass_strictly(
        &["-n", "4096"],
        &[],
        "subvol-create /sv\nmkdir /sv/d\ncreate /sv/f\ncreate /f\nmkdir /d\n\
         link /f /sv/f\nrename /f /sv/d\nrename /d /sv/f\nlink /d /f\nmkdir /a\nsubvol-create /a/s\nrename /a /a/s/x\nsubvol-create /empty\nmkdir /e\nrename /e /empty\nsync\n",
    );
}

/// Snapshots over nested subvolumes: each nested one is an empty
/// placeholder in the snapshot (all of them inode 2), which takes no
/// entries, does not move, goes with rmdir and may be replaced by an empty
/// directory; subvolumes move between subvolumes, also into a snapshot.
#[test]
fn placeholders_of_nested_subvolumes() {
    must_pass(
        &["-n", "4096"],
        &[],
        "subvol-create /sv\ncreate /sv/f\nsubvol-create /sv2\nsnapshot / /t\nsnapshot / /s\n\
         mkdir /t/sv/x\ncreate /t/sv2/y\nrename /t/sv /t/z\nsetxattr /t/sv user.a 1\nsync\n\
         rename /sv /t/moved\nrmdir /s/sv\nmkdir /t/e\nrename /t/e /t/sv2\nrename /t/moved /s/sv\nsync\n\
         snapshot /t /u\nrmdir /u/sv\nremount\n",
    );
}
