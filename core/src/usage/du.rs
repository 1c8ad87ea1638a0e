//! `btrfs filesystem du`: per file and directory the bytes of its extents
//! (total), those no other file or subvolume references (exclusive), and
//! for each argument the bytes of its shared extents counted once (set
//! shared).
//!
//! btrfs-progs asks the kernel's FIEMAP, so this follows what FIEMAP
//! reports: one extent per file extent item that has disk space (inline
//! extents and holes left out, preallocated ones counted), its length the
//! file range, its physical start the disk extent's start plus the item's
//! offset (the start alone when compressed), and shared as the kernel's
//! `btrfs_is_data_extent_shared` decides: referenced by another inode or
//! through more than one back reference, or, when written before the
//! subvolume's last snapshot, through a tree block that is itself
//! referenced more than once.

use crate::format::consts::*;
use crate::format::extent::{parse_extent_item, InlineRef};
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::fs::{Filesystem, Loc};
use crate::image::{Image, OpenOptions};
use crate::tree::search::TreeIter;
use crate::tree::TreeRoot;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// One line of `btrfs filesystem du`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DuEntry {
    /// Path in the filesystem.
    pub path: String,
    /// Bytes of its extents.
    pub total: u64,
    /// Of those, in extents nothing else references.
    pub exclusive: u64,
    /// For an argument: its shared extents' bytes, overlaps counted once.
    pub set_shared: Option<u64>,
}

/// The lines, in btrfs' order (a directory after its contents).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DuReport {
    /// Every line printed.
    pub entries: Vec<DuEntry>,
}

/// A subvolume's tree and its last snapshot generation.
#[derive(Clone, Copy)]
pub(crate) struct Subvol {
    pub root: TreeRoot,
    pub last_snapshot: u64,
}

/// Read-only access to the trees, beside the [`Filesystem`] that resolves
/// names: the same (replayed, in memory) state, opened again.
pub(crate) struct Trees {
    pub img: Image,
    subvols: HashMap<u64, Subvol>,
    extent_root: Option<TreeRoot>,
    block_refs: HashMap<u64, u64>,
}

impl Trees {
    pub fn new(fs: &Filesystem) -> Result<Trees> {
        let img = fs.store.image().reopen(OpenOptions {
            trust_bad_csum: true,
            ..Default::default()
        })?;
        let extent_root = img.find_root(BTRFS_EXTENT_TREE_OBJECTID)?;
        Ok(Trees {
            img,
            subvols: HashMap::new(),
            extent_root,
            block_refs: HashMap::new(),
        })
    }

    pub fn subvol(&mut self, id: u64) -> Result<Subvol> {
        if let Some(s) = self.subvols.get(&id) {
            return Ok(*s);
        }
        let mut it = TreeIter::new(
            &self.img,
            self.img.root_tree(),
            Key::new(id, BTRFS_ROOT_ITEM_KEY, 0),
        )?;
        let mut found = None;
        while let Some(r) = it.next_item() {
            let item = r?;
            if item.key.objectid != id || item.key.ty != BTRFS_ROOT_ITEM_KEY {
                break;
            }
            let ri = RootItem::parse(item.data()?).map_err(|e| e.at(item.node.bytenr, item.key))?;
            found = Some(Subvol {
                root: crate::image::tree_root_of(id, &ri),
                last_snapshot: ri.last_snapshot.get(),
            });
        }
        let s = found.ok_or_else(|| Error::Invalid(format!("subvolume {id} has no root item")))?;
        self.subvols.insert(id, s);
        Ok(s)
    }

    /// Visit the file extent items of inode `ino` of `subvol` in file
    /// order: (key, item bytes, blocks from the root to its leaf).
    pub fn file_extents(
        &mut self,
        subvol: u64,
        ino: u64,
        mut f: impl FnMut(&mut Trees, Key, &[u8], &[u64]) -> Result<()>,
    ) -> Result<()> {
        let root = self.subvol(subvol)?.root;
        let items: Vec<(Key, Vec<u8>, Vec<u64>)> = {
            let mut it = TreeIter::new(&self.img, root, Key::new(ino, BTRFS_EXTENT_DATA_KEY, 0))?;
            let mut v = Vec::new();
            while let Some(r) = it.next_item() {
                let item = r?;
                if item.key.objectid != ino || item.key.ty != BTRFS_EXTENT_DATA_KEY {
                    break;
                }
                v.push((item.key, item.data()?.to_vec(), it.path_blocks()));
            }
            v
        };
        for (k, d, p) in items {
            f(self, k, &d, &p)?;
        }
        Ok(())
    }

    /// The back references of the data extent at `bytenr`, inline and
    /// keyed.
    fn data_refs(&self, bytenr: u64) -> Result<Vec<InlineRef>> {
        let Some(root) = self.extent_root else {
            return Ok(Vec::new());
        };
        let mut it = TreeIter::new(&self.img, root, Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0))?;
        let mut refs = Vec::new();
        while let Some(r) = it.next_item() {
            let item = r?;
            if item.key.objectid != bytenr {
                break;
            }
            let d = item.data()?;
            match item.key.ty {
                BTRFS_EXTENT_ITEM_KEY => {
                    let v = parse_extent_item(&item.key, d)
                        .map_err(|e| e.at(item.node.bytenr, item.key))?;
                    refs.extend(v.refs);
                }
                BTRFS_EXTENT_DATA_REF_KEY if d.len() >= 28 => {
                    let u = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().unwrap_or([0; 8]));
                    refs.push(InlineRef::ExtentData {
                        root: u(0),
                        objectid: u(8),
                        offset: u(16),
                        count: u32::from_le_bytes(d[24..28].try_into().unwrap_or([0; 4])),
                    });
                }
                BTRFS_SHARED_DATA_REF_KEY if d.len() >= 4 => refs.push(InlineRef::SharedData {
                    parent: item.key.offset,
                    count: u32::from_le_bytes(d[0..4].try_into().unwrap_or([0; 4])),
                }),
                _ => {}
            }
        }
        Ok(refs)
    }

    /// References to the tree block at `bytenr` (its extent item's count).
    fn block_refs(&mut self, bytenr: u64) -> Result<u64> {
        if let Some(&n) = self.block_refs.get(&bytenr) {
            return Ok(n);
        }
        let mut n = 0;
        if let Some(root) = self.extent_root {
            let mut it =
                TreeIter::new(&self.img, root, Key::new(bytenr, BTRFS_EXTENT_ITEM_KEY, 0))?;
            while let Some(r) = it.next_item() {
                let item = r?;
                if item.key.objectid != bytenr {
                    break;
                }
                if matches!(item.key.ty, BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY) {
                    let v = parse_extent_item(&item.key, item.data()?)
                        .map_err(|e| e.at(item.node.bytenr, item.key))?;
                    n = v.item.refs.get();
                    break;
                }
            }
        }
        self.block_refs.insert(bytenr, n);
        Ok(n)
    }

    /// Whether FIEMAP flags the extent at `bytenr`, referenced by inode
    /// `ino` of `subvol` through an item of generation `gen` in the leaf
    /// reached by `path`, as shared.
    pub fn shared(
        &mut self,
        subvol: u64,
        ino: u64,
        gen: u64,
        bytenr: u64,
        path: &[u64],
    ) -> Result<bool> {
        let refs = self.data_refs(bytenr)?;
        // Distinct references, as the kernel merges identical ones.
        let mut distinct = HashSet::new();
        for r in &refs {
            match *r {
                InlineRef::ExtentData {
                    root,
                    objectid,
                    offset,
                    count,
                } => {
                    if objectid != ino {
                        return Ok(true);
                    }
                    if count > 0 {
                        distinct.insert((0u8, root, objectid, offset));
                    }
                }
                InlineRef::SharedData { parent, count } if count > 0 => {
                    distinct.insert((1u8, parent, 0, 0));
                }
                _ => {}
            }
        }
        if distinct.len() > 1 {
            return Ok(true);
        }
        // Shared through a subtree only when a snapshot was taken since.
        if gen > self.subvol(subvol)?.last_snapshot {
            return Ok(false);
        }
        for &b in path {
            if self.block_refs(b)? > 1 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn is_reg(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFREG
}
fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

struct Du<'a> {
    fs: &'a mut Filesystem,
    trees: Trees,
    seen: HashSet<(u64, u64)>,
    summarize: bool,
    out: Vec<DuEntry>,
    /// Directories and files visited, a bound on a looping directory tree.
    visited: u64,
}

impl Du<'_> {
    /// One file's (total, shared) bytes; its shared extents' physical
    /// ranges (start, last byte) added to `set`.
    fn file_space(&mut self, l: Loc, set: &mut Vec<(u64, u64)>) -> Result<(u64, u64)> {
        let (mut total, mut shared) = (0u64, 0u64);
        self.trees.file_extents(l.subvol, l.ino, |t, k, d, path| {
            let FileExtent::Disk { head, item } = parse_file_extent(d).map_err(|e| e.at(0, k))?
            else {
                return Ok(());
            };
            let disk = item.disk_bytenr.get();
            let len = item.num_bytes.get();
            if disk == 0 || len == 0 {
                return Ok(());
            }
            let phys = if head.compression != 0 {
                disk
            } else {
                disk.saturating_add(item.offset.get())
            };
            total = total.saturating_add(len);
            if t.shared(l.subvol, l.ino, head.generation.get(), disk, path)? {
                shared = shared.saturating_add(len);
                set.push((phys, phys.saturating_add(len - 1)));
            }
            Ok(())
        })?;
        Ok((total, shared))
    }

    fn add(
        &mut self,
        l: Loc,
        path: String,
        top: bool,
        set: &mut Vec<(u64, u64)>,
    ) -> Result<(u64, u64)> {
        self.visited += 1;
        if self.visited > u32::MAX as u64 {
            return Err(Error::Invalid("directory tree too large or looping".into()));
        }
        let (mode, ino) = if l.is_placeholder() {
            (libc::S_IFDIR, BTRFS_EMPTY_SUBVOL_DIR_OBJECTID)
        } else {
            let s = self.fs.stat(l)?;
            (s.mode, s.ino)
        };
        if !is_reg(mode) && !is_dir(mode) {
            return Ok((0, 0));
        }
        if ino != BTRFS_EMPTY_SUBVOL_DIR_OBJECTID && !self.seen.insert((l.subvol, ino)) {
            return Ok((0, 0));
        }
        let mut own = Vec::new();
        let (total, shared) = if is_reg(mode) {
            self.file_space(l, if top { &mut own } else { set })?
        } else if l.is_placeholder() {
            (0, 0)
        } else {
            let mut t = (0u64, 0u64);
            for (name, child, ftype) in self.fs.readdir(l)? {
                if ftype != BTRFS_FT_REG_FILE && ftype != BTRFS_FT_DIR {
                    continue;
                }
                let name = String::from_utf8_lossy(&name);
                let p = if path.ends_with('/') {
                    format!("{path}{name}")
                } else {
                    format!("{path}/{name}")
                };
                let target = if top { &mut own } else { &mut *set };
                let (a, b) = self.add(child, p, false, target)?;
                t.0 = t.0.saturating_add(a);
                t.1 = t.1.saturating_add(b);
            }
            t
        };
        if !self.summarize || top {
            self.out.push(DuEntry {
                path,
                total,
                exclusive: total - shared.min(total),
                set_shared: top.then(|| {
                    if is_dir(mode) {
                        union_len(&mut own)
                    } else {
                        shared
                    }
                }),
            });
        }
        Ok((total, shared))
    }
}

/// Bytes covered by the ranges (start, last byte), overlaps once.
fn union_len(r: &mut [(u64, u64)]) -> u64 {
    r.sort_unstable();
    let mut n = 0u64;
    let mut cur: Option<(u64, u64)> = None;
    for &(s, e) in r.iter() {
        match cur {
            Some((cs, ce)) if s <= ce.saturating_add(1) => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                n += ce - cs + 1;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        n += ce - cs + 1;
    }
    n
}

/// `btrfs filesystem du [-s] PATH...` of paths in the filesystem (from its
/// top, `/` the default subvolume's root).
pub fn du(fs: &mut Filesystem, paths: &[String], summarize: bool) -> Result<DuReport> {
    let trees = Trees::new(fs)?;
    let mut d = Du {
        fs,
        trees,
        seen: HashSet::new(),
        summarize,
        out: Vec::new(),
        visited: 0,
    };
    for p in paths {
        // btrfs-progs forgets the inodes seen after each argument.
        d.seen.clear();
        let l = d.fs.resolve(p, true)?;
        let mut set = Vec::new();
        d.add(l, p.clone(), true, &mut set)?;
    }
    Ok(DuReport { entries: d.out })
}

#[cfg(test)]
mod tests {
    use super::union_len;

    #[test]
    fn union_counts_overlaps_once() {
        assert_eq!(union_len(&mut []), 0);
        assert_eq!(union_len(&mut [(0, 9), (5, 14), (20, 20)]), 16);
        assert_eq!(union_len(&mut [(10, 19), (0, 9)]), 20);
    }
}
