//! Helpers for the `btrkit-replay --salvage` tests: the blocks of a crash
//! image's log, damaging one block in every copy, and comparing what a
//! salvaged image shows with the kernel's replay and with zero-log.

use crate::kcrash::{Entry, Manifest};
use btrkit_core::format::consts::BTRFS_TREE_LOG_OBJECTID;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::log::reader::{read_log, OnDamage, ReadOptions};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// One block of an image's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBlock {
    pub bytenr: u64,
    pub level: u8,
    /// Subvolume whose log holds it; `TREE_LOG` for the log root tree.
    pub subvol: u64,
    /// Physical offsets of every copy (DUP metadata has two).
    pub copies: Vec<u64>,
    /// Key of its first item or pointer.
    pub first_key: Option<btrkit_core::format::key::Key>,
}

impl LogBlock {
    pub fn in_root_tree(&self) -> bool {
        self.subvol == BTRFS_TREE_LOG_OBJECTID
    }
    /// A leaf of data checksums (EXTENT_CSUM items).
    pub fn is_csum_leaf(&self) -> bool {
        self.level == 0
            && self.first_key.is_some_and(|k| {
                k.objectid == btrkit_core::format::consts::BTRFS_EXTENT_CSUM_OBJECTID
            })
    }
    pub fn describe(&self) -> String {
        let tree = if self.in_root_tree() {
            "log root tree".to_string()
        } else {
            format!("log of subvol {}", self.subvol)
        };
        format!("block {} (level {}, {tree})", self.bytenr, self.level)
    }
}

/// Every block of the log of `img`, in walk order: the log root tree, then
/// each subvolume log.
pub fn log_blocks(img: &Path) -> Result<Vec<LogBlock>, String> {
    let image = Image::open_path(
        img,
        OpenOptions {
            lenient: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", img.display()))?;
    let read = read_log(&image, ReadOptions::new(OnDamage::Keep))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{}: no log", img.display()))?;
    let mut out = Vec::new();
    let trees = std::iter::once((BTRFS_TREE_LOG_OBJECTID, &read.root_tree))
        .chain(read.trees.iter().map(|t| (t.subvol, &t.read)));
    for (subvol, t) in trees {
        for b in &t.blocks {
            let copies = image
                .chunks
                .map(b.bytenr, image.nodesize as u64, image.devid)
                .map_err(|e| e.to_string())?;
            out.push(LogBlock {
                bytenr: b.bytenr,
                level: b.level,
                subvol,
                copies,
                first_key: b.first_key,
            });
        }
    }
    Ok(out)
}

/// Make `b` unreadable in `img`: every copy gets a wrong checksum (its
/// first checksum byte inverted), as a bad sector on both mirrors would.
pub fn damage_block(img: &Path, b: &LogBlock) -> Result<(), String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .map_err(|e| e.to_string())?;
    for &p in &b.copies {
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, p).map_err(|e| e.to_string())?;
        byte[0] ^= 0xff;
        f.write_all_at(&byte, p).map_err(|e| e.to_string())?;
    }
    f.sync_all().map_err(|e| e.to_string())
}

/// Paths grouped by the subvolume they are in, so inode numbers can be
/// compared: (subvolume root path, inode) -> entry. A subvolume's root
/// directory is inode 256 (the top level's too).
pub fn by_inode(m: &Manifest) -> BTreeMap<(String, u64), (String, Entry)> {
    let mut roots: Vec<&String> = m
        .entries
        .iter()
        .filter(|(_, e)| e.kind == 'd' && e.ino == 256)
        .map(|(p, _)| p)
        .collect();
    roots.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let mut out = BTreeMap::new();
    for (p, e) in &m.entries {
        let root = roots
            .iter()
            .find(|r| p == **r || r.as_str() == "/" || p.starts_with(&format!("{r}/")))
            .map(|r| (*r).clone())
            .unwrap_or_else(|| "/".into());
        // A subvolume root belongs to itself, not to its parent.
        out.entry((root, e.ino))
            .or_insert_with(|| (p.clone(), e.clone()));
    }
    out
}

/// What an inode holds, apart from its names: for a directory the entries
/// (and so its size and link count) are the names of others.
pub fn same_content(a: &Entry, b: &Entry) -> bool {
    let common = a.kind == b.kind
        && a.mode == b.mode
        && a.uid == b.uid
        && a.gid == b.gid
        && a.xattrs == b.xattrs;
    if a.kind == 'd' {
        return common;
    }
    common && a.size == b.size && a.hash == b.hash && a.target == b.target && a.alloc == b.alloc
}
