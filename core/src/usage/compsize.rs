//! compsize's report: for the regular files under some paths, the disk
//! space of their extents (each disk extent once), its uncompressed size
//! and the bytes the files reference, by compression algorithm.
//!
//! As compsize counts: every regular file reached by name (a hard link
//! again each time), its file extent items; inline extents by their
//! stored bytes and decoded size, disk extents (preallocated ones too, by
//! their own row) once per disk address for disk and
//! uncompressed bytes, every reference for referenced bytes; holes not.

use super::du::Trees;
use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent, FILE_EXTENT_INLINE_DATA_START};
use crate::fs::{Filesystem, Loc};
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// Bytes of one compression type (or of all).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CompBytes {
    /// `none`, `zlib`, `lzo`, `zstd` (`?N` unknown), or `TOTAL`.
    pub kind: String,
    /// Disk usage.
    pub disk: u64,
    /// Uncompressed size of the same extents.
    pub uncompressed: u64,
    /// Bytes the files reference.
    pub referenced: u64,
}

impl CompBytes {
    /// compsize's "Perc": disk over uncompressed, in whole percent.
    pub fn percent(&self) -> u64 {
        self.disk
            .saturating_mul(100)
            .checked_div(self.uncompressed)
            .unwrap_or(0)
    }
}

/// compsize's report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompsizeReport {
    /// Regular files processed.
    pub files: u64,
    /// Distinct disk extents.
    pub extents: u64,
    /// References to disk extents.
    pub refs: u64,
    /// Inline extents.
    pub inline: u64,
    /// All types together.
    pub total: CompBytes,
    /// Per type with bytes, in compression type order.
    pub types: Vec<CompBytes>,
}

/// compsize 1.5's row of preallocated extents, after the algorithms.
const PREALLOC: u16 = 256;

fn type_name(t: u16) -> String {
    match t {
        PREALLOC => "prealloc".into(),
        0 => "none".into(),
        1 => "zlib".into(),
        2 => "lzo".into(),
        3 => "zstd".into(),
        t => format!("?{t}"),
    }
}

struct Walk<'a> {
    fs: &'a mut Filesystem,
    trees: Trees,
    seen: HashSet<u64>,
    /// By compression type; [`PREALLOC`] for preallocated extents.
    by_type: BTreeMap<u16, CompBytes>,
    r: CompsizeReport,
    visited: u64,
}

impl Walk<'_> {
    fn file(&mut self, l: Loc) -> Result<()> {
        self.r.files += 1;
        let Walk {
            trees,
            seen,
            by_type,
            r,
            ..
        } = self;
        trees.file_extents(l.subvol, l.ino, |_, k, d, _| {
            let fe = parse_file_extent(d).map_err(|e| e.at(0, k))?;
            let head = fe.head();
            let kind = match &fe {
                FileExtent::Disk { head, .. } if head.type_ == BTRFS_FILE_EXTENT_PREALLOC => {
                    PREALLOC
                }
                _ => head.compression as u16,
            };
            let b = by_type.entry(kind).or_default();
            match fe {
                FileExtent::Inline { .. } => {
                    let stored = d.len().saturating_sub(FILE_EXTENT_INLINE_DATA_START) as u64;
                    b.disk += stored;
                    b.uncompressed += head.ram_bytes.get();
                    b.referenced += head.ram_bytes.get();
                    r.inline += 1;
                }
                FileExtent::Disk { item, .. } => {
                    let disk = item.disk_bytenr.get();
                    if disk == 0 {
                        return Ok(());
                    }
                    if seen.insert(disk) {
                        b.disk += item.disk_num_bytes.get();
                        b.uncompressed += head.ram_bytes.get();
                        r.extents += 1;
                    }
                    b.referenced += item.num_bytes.get();
                    r.refs += 1;
                }
            }
            Ok(())
        })
    }

    fn walk(&mut self, l: Loc) -> Result<()> {
        self.visited += 1;
        if self.visited > u32::MAX as u64 {
            return Err(Error::Invalid("directory tree too large or looping".into()));
        }
        if l.is_placeholder() {
            return Ok(());
        }
        let mode = self.fs.stat(l)?.mode & libc::S_IFMT;
        if mode == libc::S_IFDIR {
            for (_, child, ftype) in self.fs.readdir(l)? {
                if ftype == BTRFS_FT_REG_FILE || ftype == BTRFS_FT_DIR {
                    self.walk(child)?;
                }
            }
        } else if mode == libc::S_IFREG {
            self.file(l)?;
        }
        Ok(())
    }
}

/// compsize of paths in the filesystem (a symlink named is not followed,
/// as compsize opens with O_NOFOLLOW).
pub fn compsize(fs: &mut Filesystem, paths: &[String]) -> Result<CompsizeReport> {
    let trees = Trees::new(fs)?;
    let mut w = Walk {
        fs,
        trees,
        seen: HashSet::new(),
        by_type: BTreeMap::new(),
        r: CompsizeReport::default(),
        visited: 0,
    };
    for p in paths {
        let l = w.fs.resolve(p, false)?;
        w.walk(l)?;
    }
    let mut r = w.r;
    r.total.kind = "TOTAL".into();
    for (t, mut b) in w.by_type {
        r.total.disk += b.disk;
        r.total.uncompressed += b.uncompressed;
        r.total.referenced += b.referenced;
        if b.uncompressed != 0 {
            b.kind = type_name(t);
            r.types.push(b);
        }
    }
    Ok(r)
}
