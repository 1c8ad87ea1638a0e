//! The commit protocol.

use super::{Store, TreeId};
use crate::format::block_group::BlockGroupItem;
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::superblock::{RootBackup, Superblock};
use crate::tree::edit;
use crate::{Error, Result};
use zerocopy::IntoBytes;

/// Commit and superblocks: delayed refs run, block group, free space and
/// root items written until they settle, every dirty block written and
/// flushed, then every superblock copy. Only [`Store::commit`] (and a log
/// sync, for its blocks) starts one.
pub(super) struct Commit<'a> {
    pub(super) st: &'a mut Store,
}

impl Store {
    /// Commit the running transaction and start the next one: a crash at
    /// any point leaves the previous or the new generation (see the
    /// module docs).
    pub fn commit(&mut self) -> Result<()> {
        Commit { st: self }.run()
    }

    pub(super) fn committer(&mut self) -> Commit<'_> {
        Commit { st: self }
    }
}

/// Passes of the commit loop before giving up: each pass only CoWs blocks
/// not yet copied in this transaction, so real trees settle in a few.
const MAX_COMMIT_PASSES: usize = 64;

/// Superblock `sb` as written at byte `off`: its `bytenr` set, checksummed.
pub(crate) fn super_bytes(sb: &Superblock, off: u64, csum: crate::csum::CsumType) -> Vec<u8> {
    let mut copy = *sb;
    copy.bytenr.set(off);
    let mut bytes = copy.as_bytes().to_vec();
    let c = crate::csum::block_csum(csum, &bytes);
    bytes[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
    bytes
}

/// A write error on one device of several names the device.
pub(super) fn on_device(e: Error, name: &str, devices: usize) -> Error {
    match e {
        Error::Io { context, err } if devices > 1 => Error::Io {
            context: format!("{name}: {context}"),
            err,
        },
        e => e,
    }
}

impl Commit<'_> {
    /// Apply every queued back reference change to the extent tree, each
    /// extent noted for qgroup accounting. Returns whether there was
    /// anything to run (running can queue more).
    pub(super) fn run_delayed_refs(&mut self) -> Result<bool> {
        if self.st.delayed.is_empty() {
            return Ok(false);
        }
        for (bytenr, head) in self.st.delayed.take_all() {
            self.st.quotas().qgroup_note_extent(bytenr, &head);
            self.st.extent_refs().run_ref_head(bytenr, head)?;
        }
        Ok(true)
    }

    fn update_block_group_items(&mut self) -> Result<bool> {
        let dirty: Vec<u64> = self
            .st
            .space
            .alloc
            .groups
            .values()
            .filter(|g| g.dirty)
            .map(|g| g.start)
            .collect();
        for &s in &dirty {
            let Some(g) = self.st.space.alloc.groups.get_mut(&s) else {
                continue;
            };
            g.dirty = false;
            g.on_disk = true;
            let (len, item) = (
                g.length,
                BlockGroupItem {
                    used: g.used.into(),
                    chunk_objectid: BTRFS_FIRST_CHUNK_TREE_OBJECTID.into(),
                    flags: g.flags.into(),
                },
            );
            let bgt = TreeId::Tree(self.st.bg_tree);
            self.st.update_item(
                bgt,
                &Key::new(s, BTRFS_BLOCK_GROUP_ITEM_KEY, len),
                item.as_bytes(),
            )?;
            if self.st.has_fst() {
                self.update_fst_group(s)?;
            }
        }
        Ok(!dirty.is_empty())
    }

    fn update_root_items(&mut self) -> Result<bool> {
        // Root items of log trees live in the log root tree, written by a
        // log sync; the commit drops the log trees.
        let dirty: Vec<TreeId> = self
            .st
            .roots
            .values()
            .filter(|r| r.dirty && r.item.is_some() && !r.id.is_log())
            .map(|r| r.id)
            .collect();
        for &id in &dirty {
            let Some(bytenr) = self.st.roots.get(&id).map(|st| st.bytenr) else {
                continue;
            };
            // The item's generation is its root node's (btrfs_set_root_node),
            // which did not change when only the item's fields did.
            let node_gen = self
                .st
                .cache
                .get(bytenr)
                .map(|b| u64::from_le_bytes(b[0x50..0x58].try_into().unwrap_or([0; 8])));
            let Some(st) = self.st.roots.get_mut(&id) else {
                continue;
            };
            st.dirty = false;
            let level = st.level;
            let Some((key, ri)) = st.item.as_mut() else {
                continue;
            };
            ri.bytenr.set(bytenr);
            ri.level = level;
            if let Some(g) = node_gen {
                ri.generation.set(g);
            }
            ri.generation_v2.set(ri.generation.get());
            let (key, ri) = (*key, *ri);
            self.st.update_item(TreeId::Root, &key, ri.as_bytes())?;
        }
        Ok(!dirty.is_empty())
    }

    /// Commit the running transaction and start the next one (see
    /// [`Store::commit`]).
    fn run(&mut self) -> Result<()> {
        // The log trees of this transaction go: the commit makes everything
        // they recorded durable, and the new superblock has no log.
        let logs: Vec<TreeId> = self
            .st
            .roots
            .keys()
            .copied()
            .filter(|t| t.is_log())
            .collect();
        for t in logs {
            self.st.log_trees().drop_log_tree(t)?;
        }
        self.st.log_trees().clear_log_root();
        // The superblock's root tree generation must be the new one, so the
        // root tree is always copied even when nothing else touched it.
        self.st.search_mut(TreeId::Root, &Key::MIN, None)?;
        let mut settled = false;
        for _ in 0..MAX_COMMIT_PASSES {
            let p = self.st.chunks().create_pending_chunks()?;
            let a = self.run_delayed_refs()? || p;
            let q = if !a {
                self.st.quotas().account_qgroups()?
            } else {
                true
            };
            let b = self.update_block_group_items()?;
            let c = self.update_root_items()?;
            if !a && !q && !b && !c && self.st.delayed.is_empty() {
                settled = true;
                break;
            }
        }
        if !settled {
            return Err(Error::Internal(
                "commit did not settle: extent, free space and root trees kept changing".into(),
            ));
        }
        self.st.data().flush_data()?;
        self.write_blocks(&|t: TreeId| !t.is_log())?;
        self.flush_device()?;
        self.write_superblocks()?;
        self.flush_device()?;
        // The new generation is durable: pinned space is free again (and
        // blocks cached from it are stale).
        self.st
            .cache
            .drop_ranges(&self.st.space.alloc.pinned_ranges());
        self.st.space.alloc.unpin_all();
        self.st.quotas().qgroups_committed();
        self.st.log_blocks.clear();
        self.st.space.chunk_allocated = false;
        *self.st.img.sb = self.st.sb;
        self.st.transid += 1;
        self.st.stats.commits += 1;
        self.st.cache.trim();
        Ok(())
    }

    /// Flush every device's write cache, counted once.
    pub fn flush_device(&mut self) -> Result<()> {
        self.st.stats.flushes += 1;
        for (_, d) in self.st.img.devices() {
            d.flush()?;
        }
        Ok(())
    }

    /// Write every dirty block of the trees `which` selects (every copy on
    /// every device, adjacent blocks coalesced into one write); they are
    /// clean after. Returns how many blocks were written. A failed write
    /// names its device.
    pub fn write_blocks(&mut self, which: &dyn Fn(TreeId) -> bool) -> Result<usize> {
        let devs = self.st.img.device_list();
        let names: Vec<String> = devs.iter().map(|d| self.st.img.device_name(d.0)).collect();
        let degraded = self.st.img.degraded;
        let mut parity = Vec::new();
        let n = self.emit_dirty_blocks(
            which,
            &mut |devid, p, run| {
                let Some(i) = devs.iter().position(|d| d.0 == devid) else {
                    // Opened degraded: the copies on a missing device are not
                    // written, as the kernel's degraded mount leaves them
                    // (every block keeps a copy on a device present, see
                    // emit_dirty_blocks).
                    if degraded {
                        return Ok(());
                    }
                    return Err(Error::MissingDevice {
                        devids: vec![devid],
                        what: format!(
                            "device {devid} is missing: a tree block copy cannot be written"
                        ),
                    });
                };
                devs[i]
                    .1
                    .write_at(p, run)
                    .map_err(|e| on_device(e, &names[i], devs.len()))
            },
            &mut parity,
        )?;
        if !parity.is_empty() {
            let refs: Vec<(u64, &[u8])> = parity.iter().map(|(b, v)| (*b, v.as_slice())).collect();
            self.st.img.parity.write(
                &self.st.img.chunks,
                &refs,
                self.st.img.device_map(),
                degraded,
            )?;
        }
        Ok(n)
    }

    /// Every dirty block of the trees `which` selects, checksummed and
    /// marked written, handed to `sink` as (devid, physical offset, bytes)
    /// runs in ascending order; they are clean after (the next change
    /// copies them).
    ///
    /// Blocks in RAID5/6 chunks are not handed to `sink`: they go to
    /// `parity` as (bytenr, bytes), for the parity writer.
    pub(super) fn emit_dirty_blocks(
        &mut self,
        which: &dyn Fn(TreeId) -> bool,
        sink: &mut dyn FnMut(u64, u64, &[u8]) -> Result<()>,
        parity: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<usize> {
        let list = self.st.cache.dirty_blocks(which);
        let csum = self.st.img.csum;
        // ((devid, physical), bytenr) of every copy, then written in
        // ascending order.
        let mut writes: Vec<((u64, u64), u64)> = Vec::with_capacity(list.len() * 2);
        let mut log_bytes = 0u64;
        let mut parity_bytes = 0u64;
        for &b in &list {
            let is_log = self.st.cache.dirty_tree(b).is_some_and(|t| t.is_log());
            let buf = self
                .st
                .cache
                .get_dirty_mut(b)
                .ok_or_else(|| Error::Internal("dirty block not cached".into()))?;
            edit::mark_written(buf);
            let c = crate::csum::block_csum(csum, buf);
            buf[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
            let len = buf.len() as u64;
            if self
                .st
                .img
                .chunks
                .lookup(b)
                .is_some_and(|m| m.nparity() > 0)
            {
                parity.push((b, buf.to_vec()));
                parity_bytes += len;
                if is_log {
                    log_bytes += len;
                    self.st.log_blocks.insert(b, true);
                }
                continue;
            }
            let copies = self.st.img.chunks.copies(b, len)?;
            if !copies.iter().any(|c| self.st.img.device_of(c.0).is_some()) {
                return Err(Error::MissingDevice {
                    devids: copies.iter().map(|c| c.0).collect(),
                    what: format!("tree block {b} has no copy on a device present"),
                });
            }
            for c in copies {
                writes.push((c, b));
                if is_log {
                    log_bytes += len;
                }
            }
            if is_log {
                self.st.log_blocks.insert(b, true);
            }
        }
        writes.sort_unstable();
        let ns = self.st.nodesize() as u64;
        let mut i = 0;
        let mut run: Vec<u8> = Vec::new();
        let mut total = parity_bytes;
        while i < writes.len() {
            let (devid, start) = writes[i].0;
            run.clear();
            let mut j = i;
            while j < writes.len()
                && writes[j].0 == (devid, start + (j - i) as u64 * ns)
                && run.len() < (8 << 20)
            {
                run.extend_from_slice(
                    self.st
                        .cache
                        .get(writes[j].1)
                        .ok_or_else(|| Error::Internal("dirty block not cached".into()))?,
                );
                j += 1;
            }
            sink(devid, start, &run)?;
            total += run.len() as u64;
            i = j;
        }
        self.st.stats.log_bytes += log_bytes;
        self.st.stats.metadata_bytes += total - log_bytes;
        for &b in &list {
            self.st.cache.mark_clean(b);
        }
        Ok(list.len())
    }

    fn write_superblocks(&mut self) -> Result<()> {
        let root = self.st.roots.get(&TreeId::Root).cloned();
        let sb = &mut self.st.sb;
        sb.generation.set(self.st.transid);
        if let Some(r) = root {
            sb.root.set(r.bytenr);
            sb.root_level = r.level;
        }
        let chunk = self.st.roots.get(&TreeId::Chunk).cloned();
        if let Some(c) = chunk {
            if c.dirty {
                sb.chunk_root.set(c.bytenr);
                sb.chunk_root_level = c.level;
                sb.chunk_root_generation.set(self.st.transid);
            }
        }
        sb.bytes_used.set(self.st.space.alloc.total_used());
        // Backup roots: the slot after the newest one.
        let newest = (0..BTRFS_NUM_BACKUP_ROOTS)
            .max_by_key(|&i| sb.super_roots[i].tree_root_gen.get())
            .unwrap_or(0);
        let slot = if sb.super_roots[newest].tree_root_gen.get() == self.st.transid {
            newest
        } else {
            (newest + 1) % BTRFS_NUM_BACKUP_ROOTS
        };
        let mut b: RootBackup = sb.super_roots[slot];
        b.tree_root.set(sb.root.get());
        b.tree_root_gen.set(self.st.transid);
        b.tree_root_level = sb.root_level;
        b.chunk_root.set(sb.chunk_root.get());
        b.chunk_root_gen.set(sb.chunk_root_generation.get());
        b.chunk_root_level = sb.chunk_root_level;
        b.total_bytes.set(sb.total_bytes.get());
        b.bytes_used.set(sb.bytes_used.get());
        b.num_devices.set(sb.num_devices.get());
        let backups = self.backup_tree_roots()?;
        let mut b2 = b;
        for (id, bytenr, gen, level) in backups {
            match id {
                BTRFS_EXTENT_TREE_OBJECTID => {
                    b2.extent_root.set(bytenr);
                    b2.extent_root_gen.set(gen);
                    b2.extent_root_level = level;
                }
                BTRFS_FS_TREE_OBJECTID => {
                    b2.fs_root.set(bytenr);
                    b2.fs_root_gen.set(gen);
                    b2.fs_root_level = level;
                }
                BTRFS_DEV_TREE_OBJECTID => {
                    b2.dev_root.set(bytenr);
                    b2.dev_root_gen.set(gen);
                    b2.dev_root_level = level;
                }
                BTRFS_CSUM_TREE_OBJECTID => {
                    b2.csum_root.set(bytenr);
                    b2.csum_root_gen.set(gen);
                    b2.csum_root_level = level;
                }
                _ => {}
            }
        }
        self.st.sb.super_roots[slot] = b2;
        // Every device, each copy that fits it, with the device's own
        // device item (write_all_supers).
        let devs = self.st.img.device_list();
        for (devid, dev) in &devs {
            let sb = self.device_superblock(*devid);
            let name = self.st.img.device_name(*devid);
            let size = dev.size();
            for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
                let off = btrfs_sb_offset(mirror);
                if off + BTRFS_SUPER_INFO_SIZE as u64 > size {
                    break;
                }
                let bytes = super_bytes(&sb, off, self.st.img.csum);
                dev.write_at(off, &bytes)
                    .map_err(|e| on_device(e, &name, devs.len()))?;
                self.st.stats.super_bytes += bytes.len() as u64;
            }
        }
        if let Some(c) = self.st.roots.get_mut(&TreeId::Chunk) {
            c.dirty = false;
        }
        Ok(())
    }

    /// The superblock device `devid` gets: the filesystem's, with that
    /// device's own device item (the superblock's device has it already).
    pub(super) fn device_superblock(&self, devid: u64) -> Superblock {
        let mut sb = self.st.sb;
        if let Some(d) = self.st.space.dev_item_of(&self.st.sb, devid) {
            sb.dev_item = d;
        }
        sb
    }

    /// (tree id, bytenr, generation, level) of the trees backup roots record.
    fn backup_tree_roots(&mut self) -> Result<Vec<(u64, u64, u64, u8)>> {
        let mut out = Vec::new();
        for id in [
            BTRFS_EXTENT_TREE_OBJECTID,
            BTRFS_FS_TREE_OBJECTID,
            BTRFS_DEV_TREE_OBJECTID,
            BTRFS_CSUM_TREE_OBJECTID,
        ] {
            if !self.st.tree_exists(id)? {
                continue;
            }
            let st = self.st.root_state(TreeId::Tree(id))?;
            if let Some((_, ri)) = &st.item {
                out.push((id, ri.bytenr.get(), ri.generation.get(), ri.level));
            }
        }
        Ok(out)
    }
}
