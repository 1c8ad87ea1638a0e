//! Offline replay of the fsync log, with the kernel's semantics
//! (`fs/btrfs/tree-log.c`, replay side), in the kernel's stages:
//!
//! 1. pin: every block of the log root tree and the log trees, and every
//!    data extent the logs reference that the extent tree does not know yet,
//!    is kept out of allocation;
//! 2. inodes: each logged inode item is copied in (directories first lose
//!    the names the log says are gone, xattrs the log lacks are removed,
//!    regular files are truncated to their logged size);
//! 3. dir indexes: logged names are added where their inode exists;
//! 4. everything else: xattrs, inode refs (adding missing names, removing
//!    names the log says are gone), file extents (with extent refs and
//!    checksums);
//! 5. link counts are recounted for every inode touched, inodes left with
//!    no link are removed (orphan cleanup);
//! 6. one commit clears `log_root`; the log's blocks become free.
//!
//! A crash during replay leaves the previous superblock, which still points
//! to the intact log, so replay can simply be run again.

pub use super::reader::LogTree;
use super::reader::{read_log, uncovered, OnDamage, ReadOptions};
use crate::format::consts::*;
use crate::format::dir::parse_dir_items;
use crate::format::file_extent::{parse_file_extent, FileExtent, FileExtentItem};
use crate::format::inode::{parse_inode_extrefs, parse_inode_refs, InodeItem, Timespec};
use crate::format::key::Key;
use crate::fs::{extents, inode as finode, names};
use crate::trans::delayed::BackRef;
use crate::trans::{Store, TreeId};
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use zerocopy::{FromBytes, IntoBytes};

/// How [`replay`] treats a log it cannot fully trust.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// Replay even when logged data extents lack checksums in the log.
    pub force: bool,
    /// Replay what a damaged log still proves ([`super::salvage`]) instead
    /// of refusing a log with a damaged block.
    pub salvage: bool,
}

/// What replay changed, for `--dry-run` and the summary.
#[derive(Clone, Debug, serde::Serialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A logged inode the subvolume did not have was created from its logged item.
    InodeCreated {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// Mode of the logged inode item.
        mode: u32,
        /// Size of the inode item written (bytes; 0 for a directory, whose size comes
        /// from the names replayed).
        size: u64,
    },
    /// An existing inode's item was overwritten with the logged one (nbytes kept).
    InodeUpdated {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// Mode of the logged inode item.
        mode: u32,
        /// Size of the inode item written (bytes).
        size: u64,
    },
    /// A logged name was added (DIR_ITEM, DIR_INDEX and INODE_REF/EXTREF).
    NameAdded {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Directory inode holding the name.
        dir: u64,
        /// The name, lossily decoded as UTF-8.
        name: String,
        /// Inode the name points to.
        ino: u64,
    },
    /// A name the log says is gone was removed, and its inode's link count lowered.
    NameRemoved {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Directory inode that held the name.
        dir: u64,
        /// The name, lossily decoded as UTF-8.
        name: String,
        /// Inode the name pointed to.
        ino: u64,
    },
    /// A file range was replaced by a logged file extent item
    /// (replay_one_extent): old extents dropped, references and checksums added.
    DataReplaced {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// File offset of the range (bytes).
        offset: u64,
        /// Length of the range (bytes).
        len: u64,
        /// Kind of the logged extent: `inline`, `regular`, `compressed`, `prealloc` or `hole`.
        kind: String,
    },
    /// Extents past the logged size were dropped (committed prealloc past EOF
    /// the log does not have).
    Truncated {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// The file's size once its item replayed (bytes); extents from its next
        /// sector boundary on went.
        size: u64,
    },
    /// A logged xattr was set.
    XattrSet {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// Attribute name, lossily decoded as UTF-8.
        name: String,
    },
    /// An xattr of a logged inode that the log lacks was removed.
    XattrRemoved {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// Attribute name, lossily decoded as UTF-8.
        name: String,
    },
    /// An inode left with no links after the link-count fixups was removed
    /// (orphan cleanup).
    InodeRemoved {
        /// Subvolume (root objectid).
        subvol: u64,
        /// Inode number.
        ino: u64,
    },
}

/// What a replay did: counts, the events, and the generation it committed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReplaySummary {
    /// Subvolume log trees replayed.
    pub log_trees: usize,
    /// Log blocks read (and pinned until the commit).
    pub log_blocks: usize,
    /// Items in the log trees replayed.
    pub log_items: usize,
    /// Number of [`Event::InodeCreated`].
    pub inodes_created: usize,
    /// Number of [`Event::InodeUpdated`].
    pub inodes_updated: usize,
    /// Number of [`Event::NameAdded`].
    pub names_added: usize,
    /// Number of [`Event::NameRemoved`].
    pub names_removed: usize,
    /// Sum of the lengths of [`Event::DataReplaced`] (bytes).
    pub data_bytes_replaced: u64,
    /// Number of [`Event::InodeRemoved`].
    pub inodes_removed: usize,
    /// Superblock generation after replay's commit (the commit that clears `log_root`).
    pub generation: u64,
    /// Every change, in replay order per subvolume.
    pub events: Vec<Event>,
    /// With `salvage`: what was lost, and per inode what was recovered.
    pub salvage: Option<super::salvage::SalvageReport>,
    /// Per replayed subvolume, the free inode number the kernel's mount
    /// goes on with (btrfs_init_root_free_objectid after the link-count
    /// fixups): one past the highest objectid before the inodes replay
    /// left without links are deleted, which the kernel does later, at
    /// orphan cleanup. See [`mount`].
    pub free_objectids: std::collections::BTreeMap<u64, u64>,
}

fn lossy(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

fn read_inode(d: &[u8], key: Key) -> Result<InodeItem> {
    InodeItem::read_from_bytes(d).map_err(|_| Error::corrupt_item("inode item size", 0, Some(key)))
}

fn is_dir(mode: u32) -> bool {
    mode & 0o170000 == 0o040000
}
fn is_reg(mode: u32) -> bool {
    mode & 0o170000 == 0o100000
}

/// Read every log tree with the shared reader; any damage is an error
/// (replay must not guess). Returns the trees and every log block to pin.
fn read_logs(fs: &Store) -> Result<(Vec<LogTree>, Vec<u64>)> {
    let read = read_log(fs.image(), ReadOptions::new(OnDamage::Fail))?
        .ok_or_else(|| Error::Invalid("no log to replay".into()))?;
    let mut blocks: Vec<u64> = read.root_tree.blocks.iter().map(|b| b.bytenr).collect();
    blocks.extend(
        read.trees
            .iter()
            .flat_map(|t| t.read.blocks.iter().map(|b| b.bytenr)),
    );
    Ok((read.trees, blocks))
}

/// Logged data extents whose checksums neither the log nor the csum tree
/// holds (the shared rule of [`LogTree::csum_needs`]), one line each.
fn missing_csums(fs: &mut Store, logs: &[LogTree]) -> Result<Vec<String>> {
    let (cs, ss) = (fs.image().csum.size(), fs.sectorsize());
    let mut out = Vec::new();
    for log in logs {
        let have = log.csum_ranges(cs, ss);
        for n in log.csum_needs() {
            for (a, b) in uncovered(&have, n.start, n.end) {
                // Checksums committed before the crash count too.
                if fs.csums().csums_missing(a, b)? {
                    out.push(format!(
                        "inode {} offset {} (disk bytes {}..{})",
                        n.ino, n.file_offset, n.start, n.end
                    ));
                    break;
                }
            }
        }
    }
    Ok(out)
}

struct Replayer<'a> {
    fs: &'a mut Store,
    subvol: u64,
    /// Inodes whose link count must be recounted at the end.
    fixups: BTreeSet<u64>,
    events: Vec<Event>,
    no_holes: bool,
    now: Timespec,
}

impl Replayer<'_> {
    fn ev(&mut self, e: Event) {
        self.events.push(e);
    }

    fn get_inode(&mut self, ino: u64) -> Result<Option<InodeItem>> {
        finode::get_inode(self.fs, self.subvol, ino)
    }

    fn put_inode(&mut self, ino: u64, item: &InodeItem) -> Result<()> {
        finode::put_inode(self.fs, self.subvol, ino, item)
    }

    /// (ino, type) of the entry `name` in directory `dir`.
    fn dir_lookup(&mut self, dir: u64, name: &[u8]) -> Result<Option<(u64, u8)>> {
        Ok(names::lookup_name(self.fs, self.subvol, dir, name)?.map(|(loc, t)| (loc.objectid, t)))
    }

    /// (name, ino) of the entry with index `index` in `dir`.
    fn dir_index(&mut self, dir: u64, index: u64) -> Result<Option<(Vec<u8>, u64)>> {
        Ok(names::entry_at(self.fs, self.subvol, dir, index)?.map(|(n, loc, _)| (n, loc.objectid)))
    }

    /// Names (index, name) inode `ino` has in directory `dir`.
    fn names_in(&mut self, ino: u64, dir: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        names::links_in(self.fs, self.subvol, ino, dir)
    }

    /// Remove the name `name` (dir index `index`) of `ino` from `dir`; the
    /// inode's link count is recounted later.
    fn unlink_name(&mut self, dir: u64, ino: u64, name: &[u8], index: u64) -> Result<()> {
        let t = self.fs.transid();
        names::remove_name(
            self.fs,
            self.subvol,
            dir,
            finode::inode_key(ino),
            name,
            index,
            t,
        )?;
        if let Some(mut i) = self.get_inode(ino)? {
            i.nlink.set(i.nlink.get().saturating_sub(1));
            self.put_inode(ino, &i)?;
        }
        self.fixups.insert(ino);
        let sv = self.subvol;
        self.ev(Event::NameRemoved {
            subvol: sv,
            dir,
            name: lossy(name),
            ino,
        });
        Ok(())
    }

    /// Add name `name` for `ino` in `dir` at `index`.
    fn add_name(&mut self, dir: u64, ino: u64, name: &[u8], index: u64) -> Result<()> {
        let inode = self
            .get_inode(ino)?
            .ok_or_else(|| Error::Internal("add_name on missing inode".into()))?;
        let ftype = finode::ftype_of_mode(inode.mode.get());
        let (sv, t) = (self.subvol, self.fs.transid());
        names::add_name(
            self.fs,
            sv,
            dir,
            finode::inode_key(ino),
            name,
            ftype,
            index,
            t,
        )?;
        self.fixups.insert(ino);
        self.ev(Event::NameAdded {
            subvol: sv,
            dir,
            name: lossy(name),
            ino,
        });
        Ok(())
    }

    /// Delete the names of `dir` that the log says are gone: every dir
    /// index in a logged DIR_LOG_INDEX range that the log does not hold
    /// (all of them with `del_all`).
    fn replay_dir_deletes(&mut self, log: Option<&LogTree>, dir: u64, del_all: bool) -> Result<()> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        if del_all {
            ranges.push((0, u64::MAX));
        } else if let Some(log) = log {
            for (k, d) in log.range(
                Key::new(dir, BTRFS_DIR_LOG_INDEX_KEY, 0),
                Key::new(dir, BTRFS_DIR_LOG_INDEX_KEY, u64::MAX),
            ) {
                let end = d
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(k.offset);
                ranges.push((k.offset, end));
            }
        }
        for (lo, hi) in ranges {
            let items = self.fs.items_in(
                TreeId::Tree(self.subvol),
                Key::new(dir, BTRFS_DIR_INDEX_KEY, lo),
                Key::new(dir, BTRFS_DIR_INDEX_KEY, hi),
            )?;
            for (k, d) in items {
                let ents = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
                let Some(e) = ents.first() else { continue };
                let name = e.name.to_vec();
                let ino = Key::from(&e.item.location).objectid;
                let in_log = !del_all
                    && log.is_some_and(|l| {
                        l.find(&k)
                            .and_then(|ld| parse_dir_items(ld).ok())
                            .is_some_and(|le| le.iter().any(|x| x.name == name))
                    });
                if in_log {
                    continue;
                }
                if e.item.location.type_ == BTRFS_ROOT_ITEM_KEY {
                    // A subvolume entry: removing it needs the root ref too;
                    // the kernel leaves those to the subvolume code.
                    continue;
                }
                self.unlink_name(dir, ino, &name, k.offset)?;
            }
        }
        Ok(())
    }

    fn replay_xattr_deletes(&mut self, log: &LogTree, ino: u64) -> Result<()> {
        let items = self.fs.items_in(
            TreeId::Tree(self.subvol),
            Key::new(ino, BTRFS_XATTR_ITEM_KEY, 0),
            Key::new(ino, BTRFS_XATTR_ITEM_KEY, u64::MAX),
        )?;
        for (k, d) in items {
            for e in parse_dir_items(&d).map_err(|e| e.at(0, k))? {
                let logged = log
                    .find(&k)
                    .and_then(|ld| parse_dir_items(ld).ok())
                    .is_some_and(|le| le.iter().any(|x| x.name == e.name));
                if !logged {
                    let name = e.name.to_vec();
                    names::remove_packed(self.fs, self.subvol, &k, &name, 0)?;
                    let sv = self.subvol;
                    self.ev(Event::XattrRemoved {
                        subvol: sv,
                        ino,
                        name: lossy(&name),
                    });
                }
            }
        }
        Ok(())
    }

    /// Stage "inodes" for one logged inode item.
    fn replay_inode(&mut self, log: &LogTree, key: Key, data: &[u8]) -> Result<()> {
        let ino = key.objectid;
        let mut src = read_inode(data, key)?;
        let mode = src.mode.get();
        self.replay_xattr_deletes(log, ino)?;
        if is_dir(mode) {
            self.replay_dir_deletes(Some(log), ino, false)?;
        }
        let existing = self.get_inode(ino)?;
        let sv = self.subvol;
        // The file's size once the item is replayed: what the truncation
        // below cuts at.
        let mut size = src.size.get();
        match existing {
            Some(dst) if src.generation.get() == 0 => {
                // Logged only to say the inode exists: the subvolume's item
                // stays, except a regular file takes a logged size that is
                // not 0 (0 means it was never fsynced).
                size = dst.size.get();
                if is_reg(mode) && is_reg(dst.mode.get()) && src.size.get() != 0 {
                    let mut d = dst;
                    d.size.set(src.size.get());
                    self.put_inode(ino, &d)?;
                    size = src.size.get();
                }
            }
            Some(dst) => {
                src.nbytes = dst.nbytes;
                if is_dir(mode) && is_dir(dst.mode.get()) {
                    src.size = dst.size;
                }
                if src.as_bytes() != dst.as_bytes() {
                    self.put_inode(ino, &src)?;
                    self.ev(Event::InodeUpdated {
                        subvol: sv,
                        ino,
                        mode,
                        size: src.size.get(),
                    });
                }
            }
            None => {
                src.nbytes.set(0);
                if is_dir(mode) {
                    src.size.set(0);
                }
                if src.generation.get() == 0 {
                    src.generation.set(self.fs.transid());
                }
                self.put_inode(ino, &src)?;
                self.ev(Event::InodeCreated {
                    subvol: sv,
                    ino,
                    mode,
                    size: src.size.get(),
                });
            }
        }
        // Extents past the size go, as the kernel does before replaying
        // the logged extents (prealloc past EOF that was committed but is
        // not in the log), for an inode logged only as existing too.
        if is_reg(mode) {
            let ss = self.fs.sectorsize() as u64;
            let from = size.div_ceil(ss).saturating_mul(ss);
            if self.drop_extents(ino, from, u64::MAX)? {
                self.ev(Event::Truncated {
                    subvol: sv,
                    ino,
                    size,
                });
            }
        }
        self.fixups.insert(ino);
        Ok(())
    }

    /// Stage "dir indexes": add a logged name where its inode exists and the
    /// log holds no inode ref for it (a ref adds the name itself later).
    fn replay_dir_index(&mut self, log: &LogTree, key: Key, data: &[u8]) -> Result<()> {
        let dir = key.objectid;
        let index = key.offset;
        let ents = parse_dir_items(data).map_err(|e| e.at(0, key))?;
        let Some(e) = ents.first() else { return Ok(()) };
        let name = e.name.to_vec();
        let loc = Key::from(&e.item.location);
        if loc.ty == BTRFS_ROOT_ITEM_KEY {
            return Ok(());
        }
        let ino = loc.objectid;
        if self.get_inode(dir)?.is_none() {
            return Ok(());
        }
        // An existing entry at this index or with this name.
        if let Some((n, i)) = self.dir_index(dir, index)? {
            if n == name && i == ino {
                return Ok(());
            }
            self.unlink_name(dir, i, &n, index)?;
        }
        if let Some((i, _)) = self.dir_lookup(dir, &name)? {
            if i == ino {
                // Same name and inode under another index: keep the log's.
                let old: Vec<(u64, Vec<u8>)> = self
                    .names_in(ino, dir)?
                    .into_iter()
                    .filter(|(_, n)| *n == name)
                    .collect();
                for (idx, n) in old {
                    self.unlink_name(dir, ino, &n, idx)?;
                }
            } else {
                let victim: Vec<(u64, Vec<u8>)> = self
                    .names_in(i, dir)?
                    .into_iter()
                    .filter(|(_, n)| *n == name)
                    .collect();
                for (idx, n) in victim {
                    self.unlink_name(dir, i, &n, idx)?;
                }
            }
        }
        // The log's inode ref for this name adds it during the last stage.
        if log_has_ref(log, ino, dir, &name) {
            return Ok(());
        }
        if self.get_inode(ino)?.is_none() {
            return Ok(());
        }
        self.add_name(dir, ino, &name, index)
    }

    /// Stage "all": an INODE_REF or INODE_EXTREF item of the log.
    fn replay_inode_ref(&mut self, log: &LogTree, key: Key, data: &[u8]) -> Result<()> {
        let ino = key.objectid;
        let entries: Vec<(u64, u64, Vec<u8>)> = if key.ty == BTRFS_INODE_REF_KEY {
            parse_inode_refs(data)
                .map_err(|e| e.at(0, key))?
                .iter()
                .map(|e| (key.offset, e.index, e.name.to_vec()))
                .collect()
        } else {
            parse_inode_extrefs(data)
                .map_err(|e| e.at(0, key))?
                .iter()
                .map(|e| (e.parent, e.index, e.name.to_vec()))
                .collect()
        };
        if self.get_inode(ino)?.is_none() {
            return Ok(());
        }
        let mut parents: BTreeSet<u64> = BTreeSet::new();
        for (dir, index, name) in &entries {
            let (dir, index) = (*dir, *index);
            // A subvolume root's ".." ref names itself; it is not a link.
            if dir == ino || self.get_inode(dir)?.is_none() {
                continue;
            }
            parents.insert(dir);
            // Another inode holding this name in the directory loses it.
            if let Some((i, _)) = self.dir_lookup(dir, name)? {
                if i != ino {
                    let victim: Vec<(u64, Vec<u8>)> = self
                        .names_in(i, dir)?
                        .into_iter()
                        .filter(|(_, n)| n == name)
                        .collect();
                    for (idx, n) in victim {
                        self.unlink_name(dir, i, &n, idx)?;
                    }
                }
            }
            // A different entry at this index goes.
            if let Some((n, i)) = self.dir_index(dir, index)? {
                if !(n == *name && i == ino) {
                    self.unlink_name(dir, i, &n, index)?;
                }
            }
            let present = self
                .dir_index(dir, index)?
                .is_some_and(|(n, i)| n == *name && i == ino)
                && self.dir_lookup(dir, name)?.is_some_and(|(i, _)| i == ino);
            if !present {
                // The same name under another index is replaced.
                let stale: Vec<(u64, Vec<u8>)> = self
                    .names_in(ino, dir)?
                    .into_iter()
                    .filter(|(idx, n)| n == name && *idx != index)
                    .collect();
                for (idx, n) in stale {
                    self.unlink_name(dir, ino, &n, idx)?;
                }
                self.add_name(dir, ino, name, index)?;
            }
        }
        // Names of this inode in these directories that the log lacks are gone.
        for dir in parents {
            for (idx, n) in self.names_in(ino, dir)? {
                if !log_has_ref(log, ino, dir, &n) {
                    self.unlink_name(dir, ino, &n, idx)?;
                }
            }
        }
        self.fixups.insert(ino);
        Ok(())
    }

    fn replay_xattr(&mut self, key: Key, data: &[u8]) -> Result<()> {
        let ino = key.objectid;
        if self.get_inode(ino)?.is_none() {
            return Ok(());
        }
        let t = TreeId::Tree(self.subvol);
        let cur = self.fs.lookup(t, &key)?;
        if cur.as_deref() != Some(data) {
            self.fs.update_item(t, &key, data)?;
            if let Ok(ents) = parse_dir_items(data) {
                let sv = self.subvol;
                for e in ents {
                    self.ev(Event::XattrSet {
                        subvol: sv,
                        ino,
                        name: lossy(e.name),
                    });
                }
            }
        }
        Ok(())
    }

    /// File range covered by a file extent item at `off`.
    fn extent_span(&self, off: u64, d: &[u8]) -> Option<(u64, u64)> {
        extents::extent_span(self.fs.sectorsize() as u64, off, d)
    }

    /// Remove file data of `ino` in `[start, end)` (the filesystem's one
    /// rule). Returns whether anything changed.
    fn drop_extents(&mut self, ino: u64, start: u64, end: u64) -> Result<bool> {
        Ok(extents::drop_extents(self.fs, self.subvol, ino, start, end)?.changed)
    }

    /// Add a reference from (subvol, ino, ref_off) to a data extent,
    /// creating its extent item when the extent tree does not know it (an
    /// extent written in the crashed transaction).
    fn add_data_ref(
        &mut self,
        ino: u64,
        ref_off: u64,
        bytenr: u64,
        len: u64,
        generation: Option<u64>,
    ) -> Result<()> {
        let r = BackRef::Data {
            root: self.subvol,
            objectid: ino,
            offset: ref_off,
        };
        if self.fs.extent_refs().data_extent_exists(bytenr, len)? {
            self.fs.extent_refs().queue_data_ref(bytenr, len, r, 1);
        } else {
            self.fs.chunks().account_data_extent(bytenr, len)?;
            let gen = generation.unwrap_or(self.fs.transid());
            self.fs
                .extent_refs()
                .queue_new_data_extent(bytenr, len, gen, r);
        }
        Ok(())
    }

    /// Stage "all": one logged file extent item.
    fn replay_extent(&mut self, log: &LogTree, key: Key, data: &[u8]) -> Result<()> {
        let ino = key.objectid;
        let sv = self.subvol;
        if self.get_inode(ino)?.is_none() {
            return Ok(());
        }
        if self.fs.lookup(TreeId::Tree(sv), &key)?.as_deref() == Some(data) {
            return Ok(());
        }
        let Some((start, end)) = self.extent_span(key.offset, data) else {
            return Err(Error::corrupt_item(
                "logged file extent does not parse",
                0,
                Some(key),
            ));
        };
        let fe = parse_file_extent(data).map_err(|e| e.at(0, key))?;
        // The reader refused such an item already; checked again here as
        // the sums below rest on it (no overflow).
        fe.check_bounds(&key)?;
        self.drop_extents(ino, start, end)?;
        let kind;
        match fe {
            FileExtent::Inline { .. } => {
                kind = "inline";
                self.fs.insert_item(TreeId::Tree(sv), &key, data)?;
            }
            FileExtent::Disk { head, item } => {
                let item: FileExtentItem = *item;
                let bytenr = item.disk_bytenr.get();
                if bytenr == 0 {
                    kind = "hole";
                    if !self.no_holes {
                        self.fs.insert_item(TreeId::Tree(sv), &key, data)?;
                    }
                } else {
                    kind = if head.type_ == BTRFS_FILE_EXTENT_PREALLOC {
                        "prealloc"
                    } else if head.compression != 0 {
                        "compressed"
                    } else {
                        "regular"
                    };
                    let ref_off = key.offset.wrapping_sub(item.offset.get());
                    self.add_data_ref(
                        ino,
                        ref_off,
                        bytenr,
                        item.disk_num_bytes.get(),
                        Some(head.generation.get()),
                    )?;
                    if head.type_ == BTRFS_FILE_EXTENT_REG {
                        let (cs, ce) = if head.compression != 0 {
                            (bytenr, bytenr + item.disk_num_bytes.get())
                        } else {
                            let s = bytenr + item.offset.get();
                            (s, s + item.num_bytes.get())
                        };
                        self.copy_csums(log, cs, ce)?;
                    }
                    self.fs.insert_item(TreeId::Tree(sv), &key, data)?;
                }
            }
        }
        self.ev(Event::DataReplaced {
            subvol: sv,
            ino,
            offset: start,
            len: end - start,
            kind: kind.into(),
        });
        Ok(())
    }

    /// Make the csum tree hold exactly the log's checksums for `[s, e)`.
    fn copy_csums(&mut self, log: &LogTree, s: u64, e: u64) -> Result<()> {
        let cs = self.fs.image().csum.size();
        let ss = self.fs.sectorsize() as u64;
        // Only ranges the log has checksums for are replaced: an extent
        // whose checksums were committed earlier keeps them.
        let lo = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0);
        let hi = Key::new(
            BTRFS_EXTENT_CSUM_OBJECTID,
            BTRFS_EXTENT_CSUM_KEY,
            e.saturating_sub(1),
        );
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (k, d) in log.range(lo, hi) {
            let n = d.len() / cs.max(1);
            let (is, ie) = (k.offset, k.offset.saturating_add(n as u64 * ss));
            let (a, b) = (is.max(s), ie.min(e));
            if a >= b {
                continue;
            }
            let from = ((a - is) / ss) as usize * cs;
            let to = ((b - is) / ss) as usize * cs;
            runs.push((a, d[from..to].to_vec()));
        }
        for (a, sums) in runs {
            self.fs
                .csums()
                .csum_delete(a, (sums.len() / cs) as u64 * ss)?;
            self.fs.csums().csum_insert(a, &sums)?;
        }
        Ok(())
    }

    /// Recount nbytes of a regular file or symlink from its extents.
    fn fix_nbytes(&mut self, ino: u64) -> Result<()> {
        let Some(mut inode) = self.get_inode(ino)? else {
            return Ok(());
        };
        if is_dir(inode.mode.get()) {
            return Ok(());
        }
        let n = extents::count_nbytes(self.fs, self.subvol, ino)?;
        if inode.nbytes.get() != n {
            inode.nbytes.set(n);
            self.put_inode(ino, &inode)?;
        }
        Ok(())
    }

    /// Link-count fixup and orphan cleanup for every inode touched.
    fn fixup_links(&mut self) -> Result<()> {
        let mut guard = 0usize;
        while let Some(ino) = self.fixups.pop_first() {
            guard += 1;
            if guard > 10_000_000 {
                return Err(Error::Internal(
                    "link count fixup does not terminate".into(),
                ));
            }
            let Some(mut inode) = self.get_inode(ino)? else {
                continue;
            };
            let mut count = names::count_links(self.fs, self.subvol, ino)?;
            if ino == BTRFS_FIRST_FREE_OBJECTID && is_dir(inode.mode.get()) {
                // A subvolume's root directory is named by its root ref.
                count = count.max(1);
            }
            if inode.nlink.get() != count {
                inode.nlink.set(count);
                self.put_inode(ino, &inode)?;
            }
            if count == 0 {
                if is_dir(inode.mode.get()) {
                    let items = self.fs.items_in(
                        TreeId::Tree(self.subvol),
                        Key::new(ino, BTRFS_DIR_INDEX_KEY, 0),
                        Key::new(ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
                    )?;
                    for (k, d) in items {
                        if let Some(e) = parse_dir_items(&d).ok().and_then(|v| {
                            v.first()
                                .map(|e| (e.name.to_vec(), Key::from(&e.item.location)))
                        }) {
                            if e.1.ty == BTRFS_INODE_ITEM_KEY {
                                self.unlink_name(ino, e.1.objectid, &e.0, k.offset)?;
                            }
                        }
                    }
                }
                extents::drop_inode_items(self.fs, self.subvol, ino)?;
                let sv = self.subvol;
                self.ev(Event::InodeRemoved { subvol: sv, ino });
                continue;
            }
            self.fix_nbytes(ino)?;
        }
        // Orphans the log recorded or earlier crashes left: finish them.
        let orphans = self.fs.items_in(
            TreeId::Tree(self.subvol),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, u64::MAX),
        )?;
        for (k, _) in orphans {
            let ino = k.offset;
            if let Some(i) = self.get_inode(ino)? {
                if i.nlink.get() != 0 {
                    continue;
                }
                extents::drop_inode_items(self.fs, self.subvol, ino)?;
                let sv = self.subvol;
                self.ev(Event::InodeRemoved { subvol: sv, ino });
            }
            self.fs.delete_item(TreeId::Tree(self.subvol), &k)?;
        }
        let _ = self.now;
        Ok(())
    }
}

fn log_has_ref(log: &LogTree, ino: u64, dir: u64, name: &[u8]) -> bool {
    if let Some(d) = log.find(&Key::new(ino, BTRFS_INODE_REF_KEY, dir)) {
        if parse_inode_refs(d).is_ok_and(|v| v.iter().any(|e| e.name == name)) {
            return true;
        }
    }
    if let Some(d) = log.find(&Key::new(
        ino,
        BTRFS_INODE_EXTREF_KEY,
        crate::format::dir::extref_hash(dir, name),
    )) {
        if parse_inode_extrefs(d).is_ok_and(|v| v.iter().any(|e| e.name == name && e.parent == dir))
        {
            return true;
        }
    }
    false
}

/// Replay the log of the filesystem open in `fs` and commit. Returns what
/// changed. On error nothing has been committed.
pub fn replay(fs: &mut Store, opts: ReplayOptions) -> Result<ReplaySummary> {
    replay_with_progress(fs, opts, &mut |_, _, _| {})
}

/// Mount as the kernel does: a log the superblock names is replayed
/// first, and the filesystem goes on with the free inode numbers the
/// replay left (inodes it unlinked still count until they are deleted).
pub fn mount(
    dev: std::sync::Arc<dyn crate::io::BlockDevice>,
    opts: crate::fs::MountOptions,
) -> Result<crate::fs::Filesystem> {
    let sb = crate::image::read_superblock(dev.as_ref(), 0)?;
    let mut free = std::collections::BTreeMap::new();
    if sb.log_root.get() != 0 {
        let mut st = Store::open_for_replay(dev.clone())?;
        free = replay(&mut st, Default::default())?.free_objectids;
    }
    let mut fs = crate::fs::Filesystem::mount(dev, opts, super::writer::LogState::boxed())?;
    for (subvol, next) in free {
        fs.raise_free_ino(subvol, next)?;
    }
    Ok(fs)
}

/// [`mount`] on the devices of a set, (name, device) each, matched by
/// their superblocks ([`crate::devices::DeviceSet`]); `degraded` as
/// `mount -o degraded`. One device is [`mount`].
pub fn mount_devices(
    mut devs: Vec<(String, std::sync::Arc<dyn crate::io::BlockDevice>)>,
    mut opts: crate::fs::MountOptions,
    degraded: bool,
) -> Result<crate::fs::Filesystem> {
    if devs.len() == 1 && !degraded {
        let (_, dev) = devs.remove(0);
        return mount(dev, opts);
    }
    // open_ctree: a filesystem mounts as ssd when no device spins.
    if !opts.ssd_given {
        opts.ssd = devs.iter().all(|(_, d)| d.rotational() == Some(false));
    }
    let set = crate::devices::DeviceSet::assemble(devs)?;
    let open = || {
        set.open(crate::image::OpenOptions {
            writable: true,
            degraded,
            ..Default::default()
        })
    };
    let mut img = open()?;
    let mut free = std::collections::BTreeMap::new();
    if img.sb.log_root.get() != 0 {
        let mut st = Store::from_image_for_replay(img)?;
        free = replay(&mut st, Default::default())?.free_objectids;
        drop(st);
        img = open()?;
    }
    let store = Store::from_image(img)?;
    let mut fs = crate::fs::Filesystem::with_store(store, opts, super::writer::LogState::boxed())?;
    for (subvol, next) in free {
        fs.raise_free_ino(subvol, next)?;
    }
    Ok(fs)
}

/// [`replay`], reporting `(stage name, items done, items in all logs)`.
pub fn replay_with_progress(
    fs: &mut Store,
    opts: ReplayOptions,
    progress: &mut dyn FnMut(&'static str, u64, u64),
) -> Result<ReplaySummary> {
    if opts.salvage {
        return salvage_with_progress(fs, progress);
    }
    let (logs, blocks) = read_logs(fs)?;
    if !opts.force {
        let missing = missing_csums(fs, &logs)?;
        if let Some(first) = missing.first() {
            return Err(Error::Corrupt {
                kind: crate::CorruptKind::Data,
                what: format!(
                    "log is missing data checksums for {} extent(s), first: {first}; replaying would leave data without checksums (use --force to replay anyway)",
                    missing.len()
                ),
                bytenr: fs.image().sb.log_root.get(),
                key: None,
            });
        }
    }
    replay_logs(fs, logs, blocks, None, progress)
}

/// Most inodes salvage leaves out, one attempt each, after their replay failed.
const SALVAGE_RETRIES: usize = 16;

/// Salvage: replay what the damaged log still proves. An error naming a
/// logged inode (an item that reads but cannot be replayed) costs that
/// inode, not the salvage: nothing is written before the commit, so the
/// filesystem is opened again and the replay starts over without it.
fn salvage_with_progress(
    fs: &mut Store,
    progress: &mut dyn FnMut(&'static str, u64, u64),
) -> Result<ReplaySummary> {
    let mut refused: BTreeMap<u64, String> = BTreeMap::new();
    loop {
        let p = super::salvage::prepare(fs, &refused)?;
        let logged: BTreeSet<u64> = p
            .logs
            .iter()
            .flat_map(|l| l.items.iter().map(|(k, _)| k.objectid))
            .filter(|&o| o <= BTRFS_LAST_FREE_OBJECTID)
            .collect();
        match replay_logs(fs, p.logs, p.blocks, Some(p.report), progress) {
            Ok(s) => return Ok(s),
            Err(e) => {
                let ino = match &e {
                    Error::Corrupt { key: Some(k), .. } if logged.contains(&k.objectid) => {
                        k.objectid
                    }
                    _ => return Err(e),
                };
                if refused.len() >= SALVAGE_RETRIES || refused.contains_key(&ino) {
                    return Err(e);
                }
                refused.insert(ino, format!("its log items could not be replayed: {e}"));
                *fs = fs.reopen_for_replay()?;
            }
        }
    }
}

/// Replay `logs` (pinning `blocks`, the log's blocks) and commit.
fn replay_logs(
    fs: &mut Store,
    logs: Vec<LogTree>,
    blocks: Vec<u64>,
    salvage: Option<super::salvage::SalvageReport>,
    progress: &mut dyn FnMut(&'static str, u64, u64),
) -> Result<ReplaySummary> {
    let mut sum = ReplaySummary {
        log_trees: logs.len(),
        log_blocks: blocks.len(),
        salvage,
        ..Default::default()
    };
    // Stage 1: pin the log and the data extents it references.
    let ns = fs.nodesize() as u64;
    for &b in &blocks {
        fs.chunks().pin_range(b, ns)?;
    }
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for log in &logs {
        sum.log_items += log.items.len();
        for (k, d) in &log.items {
            if k.ty != BTRFS_EXTENT_DATA_KEY {
                continue;
            }
            if let Ok(FileExtent::Disk { item, .. }) = parse_file_extent(d) {
                let (b, l) = (item.disk_bytenr.get(), item.disk_num_bytes.get());
                if b == 0 || seen.insert(b, l).is_some() {
                    continue;
                }
                let known = fs
                    .lookup(
                        BTRFS_EXTENT_TREE_OBJECTID,
                        &Key::new(b, BTRFS_EXTENT_ITEM_KEY, l),
                    )?
                    .is_some();
                if !known {
                    fs.chunks().pin_range(b, l).map_err(|e| e.at(0, *k))?;
                }
            }
        }
    }
    let no_holes = fs.sb().incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_NO_HOLES != 0;
    let mut reps: BTreeMap<u64, (BTreeSet<u64>, Vec<Event>)> = BTreeMap::new();
    // A log of a subvolume deleted before the crash has nothing to replay
    // into; the kernel skips it too (its blocks stay pinned until commit).
    let mut live = Vec::with_capacity(logs.len());
    for log in logs {
        if fs.tree_exists(log.subvol)? {
            live.push(log);
        }
    }
    let logs = live;
    let now = Timespec::default();
    // Stages 2-4, each over every log tree, as the kernel's walk does.
    let total: u64 = logs.iter().map(|l| l.items.len() as u64).sum::<u64>() * 3;
    let mut done = 0u64;
    let mut free_objectids = std::collections::BTreeMap::new();
    for stage in 2..=4 {
        let stage_name = match stage {
            2 => "inodes",
            3 => "directory indexes",
            _ => "names, xattrs and data",
        };
        for log in &logs {
            let entry = reps.entry(log.subvol).or_default();
            let mut r = Replayer {
                fs,
                subvol: log.subvol,
                fixups: std::mem::take(&mut entry.0),
                events: Vec::new(),
                no_holes,
                now,
            };
            let mut ignored: BTreeSet<u64> = BTreeSet::new();
            for (k, d) in &log.items {
                done += 1;
                if done.is_multiple_of(1024) {
                    progress(stage_name, done, total);
                }
                if k.objectid == BTRFS_EXTENT_CSUM_OBJECTID {
                    continue;
                }
                if k.ty == BTRFS_INODE_ITEM_KEY {
                    // An inode with no links (an O_TMPFILE, or unlinked while
                    // open) is not replayed.
                    let item = read_inode(d, *k)?;
                    if item.nlink.get() == 0 {
                        ignored.insert(k.objectid);
                        continue;
                    }
                    if stage == 2 {
                        r.replay_inode(log, *k, d)?;
                    }
                    continue;
                }
                if ignored.contains(&k.objectid) {
                    continue;
                }
                match (stage, k.ty) {
                    (3, BTRFS_DIR_INDEX_KEY) => r.replay_dir_index(log, *k, d)?,
                    (4, BTRFS_XATTR_ITEM_KEY) => r.replay_xattr(*k, d)?,
                    (4, BTRFS_INODE_REF_KEY) | (4, BTRFS_INODE_EXTREF_KEY) => {
                        r.replay_inode_ref(log, *k, d)?
                    }
                    (4, BTRFS_EXTENT_DATA_KEY) => {
                        r.replay_extent(log, *k, d)?;
                        r.fixups.insert(k.objectid);
                    }
                    _ => {}
                }
            }
            if stage == 4 {
                let hi = Key::new(BTRFS_LAST_FREE_OBJECTID, u8::MAX, u64::MAX);
                let lo = Key::new(BTRFS_FIRST_FREE_OBJECTID, 0, 0);
                let next = match r.fs.prev_item(TreeId::Tree(log.subvol), &hi, &lo)? {
                    Some((k, _)) => k.objectid + 1,
                    None => BTRFS_FIRST_FREE_OBJECTID,
                };
                free_objectids.insert(log.subvol, next);
                r.fixup_links()?;
            }
            let (f, ev) = (std::mem::take(&mut r.fixups), std::mem::take(&mut r.events));
            let entry = reps.entry(log.subvol).or_default();
            entry.0 = f;
            entry.1.extend(ev);
        }
    }
    sum.free_objectids = free_objectids;
    for (_, (_, ev)) in reps {
        for e in ev {
            match &e {
                Event::InodeCreated { .. } => sum.inodes_created += 1,
                Event::InodeUpdated { .. } => sum.inodes_updated += 1,
                Event::NameAdded { .. } => sum.names_added += 1,
                Event::NameRemoved { .. } => sum.names_removed += 1,
                Event::DataReplaced { len, .. } => sum.data_bytes_replaced += len,
                Event::InodeRemoved { .. } => sum.inodes_removed += 1,
                _ => {}
            }
            sum.events.push(e);
        }
    }
    if let Some(report) = sum.salvage.as_mut() {
        super::salvage::after_replay(fs, report, &logs)?;
    }
    progress("commit", total, total);
    fs.log_trees().clear_log_root();
    fs.commit()?;
    sum.generation = fs.image().sb.generation.get();
    Ok(sum)
}
