//! Making the log durable without committing (btrfs_sync_log): the data
//! the logged extents point to, every dirty block of the log trees and of
//! the log root tree, a flush, then the primary superblock as the last
//! commit wrote it but with `log_root` naming the log root tree, and a
//! flush. The running transaction's own trees stay in memory.
//!
//! Log trees are kept under `TreeId::Log(subvolume)`; each has a root item
//! in the log root tree keyed (TREE_LOG, ROOT_ITEM, subvolume). A block a
//! log sync wrote is copied before it changes again, so the log the
//! superblock names stays whole until the next log sync or commit replaces
//! it.

use super::{RootState, Store, TreeId};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::io::BlockDevice;
use crate::tree::node::Expect;
use crate::{Error, Result};
use std::sync::Arc;
use zerocopy::IntoBytes;

/// The fsync log trees of the running transaction: started per subvolume, written and made durable by a log sync (their blocks, then a superblock naming the log root), dropped by the commit. Obtained from [`Store::log_trees`].
pub struct LogTrees<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`LogTrees`].
    pub fn log_trees(&mut self) -> LogTrees<'_> {
        LogTrees { st: self }
    }
}

/// The root item of a new log tree (btrfs_add_log_tree): an inode of a
/// directory, everything else zero until the log is synced.
fn log_root_item(nodesize: u32) -> RootItem {
    let mut ri: RootItem = zerocopy::FromZeros::new_zeroed();
    ri.inode.generation.set(1);
    ri.inode.size.set(3);
    ri.inode.nlink.set(1);
    ri.inode.nbytes.set(nodesize as u64);
    ri.inode.mode.set(0o040755);
    ri
}

/// Tree blocks of a log sync that lie in RAID5/6 chunks.
struct ParityBlocks {
    writer: std::sync::Arc<crate::chunk::rmw::ParityWriter>,
    chunks: crate::chunk::ChunkMap,
    /// (bytenr, bytes).
    blocks: Vec<(u64, Vec<u8>)>,
    degraded: bool,
}

/// The writes of one log sync (see [`Store::prepare_log_sync`]): the log's
/// blocks, a flush, the superblock naming the log, a flush. The superblock
/// goes out only after the blocks it leads to are durable.
pub struct LogSyncIo {
    /// The data writes submitted before the sync (the logged extents'
    /// data among them), waited for before the flush.
    data: Option<super::datawrite::DataWait>,
    /// (devid, physical, bytes) of the log's blocks, every copy.
    runs: Vec<(u64, u64, Vec<u8>)>,
    /// The log's blocks in RAID5/6 chunks.
    parity: Option<ParityBlocks>,
    /// Every device, by devid.
    devices: Vec<(u64, Arc<dyn BlockDevice>)>,
    /// Each device's primary superblock naming the log.
    supers: Vec<(Arc<dyn BlockDevice>, Vec<u8>)>,
}

impl LogSyncIo {
    /// Write the log's blocks, wait for the data writes submitted before the
    /// sync, flush every device, write each device's primary superblock
    /// naming the log, and flush again. The first error stops it.
    pub fn run(&self) -> Result<()> {
        for (devid, p, run) in &self.runs {
            let dev = self.devices.iter().find(|d| d.0 == *devid).ok_or_else(|| {
                Error::MissingDevice {
                    devids: vec![*devid],
                    what: format!("device {devid} is missing: a log block copy cannot be written"),
                }
            })?;
            dev.1.write_at(*p, run)?;
        }
        if let Some(pb) = &self.parity {
            let refs: Vec<(u64, &[u8])> =
                pb.blocks.iter().map(|(b, v)| (*b, v.as_slice())).collect();
            pb.writer
                .write(&pb.chunks, &refs, &self.devices, pb.degraded)?;
        }
        if let Some(d) = &self.data {
            d.wait()?;
        }
        for (_, dev) in &self.devices {
            dev.flush()?;
        }
        for (dev, bytes) in &self.supers {
            dev.write_at(btrfs_sb_offset(0), bytes)?;
        }
        for (_, dev) in &self.devices {
            dev.flush()?;
        }
        Ok(())
    }
}

impl LogTrees<'_> {
    /// Whether the subvolume has a log tree in this transaction.
    pub fn has_log(&self, subvol: u64) -> bool {
        self.st.roots.contains_key(&TreeId::Log(subvol))
    }

    /// Subvolumes with a log tree in this transaction.
    pub fn logged_subvols(&self) -> Vec<u64> {
        self.st
            .roots
            .keys()
            .filter_map(|t| {
                if let TreeId::Log(s) = t {
                    Some(*s)
                } else {
                    None
                }
            })
            .collect()
    }

    /// The log tree of `subvol`, created (with the log root tree) on first
    /// use in a transaction. Returns whether it was created.
    pub fn start_log(&mut self, subvol: u64) -> Result<bool> {
        if !self.st.roots.contains_key(&TreeId::LogRoot) {
            self.st.log_trees().create_log_tree(TreeId::LogRoot, None)?;
        }
        if self.has_log(subvol) {
            return Ok(false);
        }
        let key = Key::new(BTRFS_TREE_LOG_OBJECTID, BTRFS_ROOT_ITEM_KEY, subvol);
        let ri = log_root_item(self.st.nodesize());
        self.st
            .log_trees()
            .create_log_tree(TreeId::Log(subvol), Some((key, ri)))?;
        Ok(true)
    }

    /// A log sync's writes, taken out of the store so they can run while
    /// the filesystem goes on (btrfs_sync_log does its I/O with only the
    /// log mutexes held): the log's blocks are checksummed, marked written
    /// and clean (the next change to one copies it), the superblock naming
    /// the log is built. Nothing reaches the device until [`LogSyncIo::run`];
    /// one may run at a time, and no commit may write its superblocks
    /// while one runs.
    ///
    /// None when a chunk was allocated in this transaction, however late
    /// (the log's own blocks, the log root item's copy-on-write just now,
    /// another client's write): its chunk item is not on disk until the
    /// commit, so a log whose blocks or extents may lie in it cannot be
    /// mounted or replayed. The caller commits instead, as btrfs_sync_log
    /// does when btrfs_make_block_group has asked for a full commit.
    pub fn prepare_log_sync(&mut self, subvol: u64) -> Result<Option<LogSyncIo>> {
        if !self.st.roots.contains_key(&TreeId::LogRoot) || !self.has_log(subvol) {
            return Err(Error::Invalid("log sync without a log".into()));
        }
        // The log tree's root item, as it stands now, in the log root tree.
        for t in [TreeId::Log(subvol)] {
            let Some(st) = self.st.roots.get(&t).cloned() else {
                continue;
            };
            let RootState {
                bytenr,
                level,
                item: Some((key, mut ri)),
                ..
            } = st
            else {
                continue;
            };
            let node_gen = self
                .st
                .cache
                .get(bytenr)
                .map(|b| u64::from_le_bytes(b[0x50..0x58].try_into().unwrap_or([0; 8])))
                .unwrap_or(self.st.transid);
            ri.bytenr.set(bytenr);
            ri.level = level;
            ri.generation.set(node_gen);
            ri.generation_v2.set(node_gen);
            if let Some(RootState {
                item: Some((_, r)), ..
            }) = self.st.roots.get_mut(&t)
            {
                *r = ri;
            }
            self.st.update_item(TreeId::LogRoot, &key, ri.as_bytes())?;
        }
        if self.st.space.chunk_allocated {
            return Ok(None);
        }
        // The logged data is on disk already (the caller wrote what the
        // logged extents need).
        let mut runs: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        let mut parity_blocks = Vec::new();
        self.st.committer().emit_dirty_blocks(
            &|t: TreeId| t == TreeId::Log(subvol) || t == TreeId::LogRoot,
            &mut |devid, p, run| {
                runs.push((devid, p, run.to_vec()));
                Ok(())
            },
            &mut parity_blocks,
        )?;
        // RAID5/6 blocks are written with their rows' parity when the sync
        // runs, under the parity writer's lock (the rows' other blocks are
        // then what is on the devices).
        let parity = (!parity_blocks.is_empty()).then(|| ParityBlocks {
            writer: self.st.img.parity.clone(),
            chunks: self.st.img.chunks.clone(),
            blocks: parity_blocks,
            degraded: self.st.img.degraded,
        });
        let (log_root, log_level) = {
            let st = self
                .st
                .roots
                .get(&TreeId::LogRoot)
                .ok_or_else(|| Error::Internal("log root tree".into()))?;
            (st.bytenr, st.level)
        };
        // The superblock of the last commit, naming the log, for every
        // device with its own device item; only the primary copies
        // (write_all_supers with one mirror).
        let mut supers = Vec::new();
        for (devid, dev) in self.st.img.device_list() {
            // The last commit's superblock, each device's own item in it.
            let mut sb = *self.st.img.sb;
            if devid != sb.dev_item.devid.get() {
                if let Some(d) = self.st.space.dev_item_of(&self.st.sb, devid) {
                    sb.dev_item = d;
                }
            }
            sb.log_root.set(log_root);
            sb.log_root_level = log_level;
            let bytes = super::commit::super_bytes(&sb, btrfs_sb_offset(0), self.st.img.csum);
            self.st.stats.super_bytes += bytes.len() as u64;
            supers.push((dev, bytes));
        }
        let devices = self.st.img.device_list();
        self.st.stats.flushes += 2;
        self.st.stats.log_syncs += 1;
        Ok(Some(LogSyncIo {
            data: self.st.data().data_wait(),
            runs,
            parity,
            devices,
            supers,
        }))
    }
}

impl LogTrees<'_> {
    /// Clear the superblock's log pointer; the next commit drops the log.
    pub fn clear_log_root(&mut self) {
        self.st.sb.log_root.set(0);
        self.st.sb.log_root_level = 0;
        self.st.sb.log_root_transid.set(0);
    }

    /// Create an empty log tree (`TreeId::Log`, with the root item it gets
    /// in the log root tree) or the log root tree. Its blocks have no
    /// extent items; the commit drops it.
    pub fn create_log_tree(
        &mut self,
        id: TreeId,
        root_item: Option<(Key, RootItem)>,
    ) -> Result<()> {
        if !id.is_log() {
            return Err(Error::Invalid(format!("{id:?} is not a log tree")));
        }
        if self.st.roots.contains_key(&id) {
            return Err(Error::Invalid(format!("{id:?} exists")));
        }
        self.st.roots.insert(
            id,
            RootState {
                id,
                bytenr: 0,
                level: 0,
                item: root_item,
                dirty: true,
            },
        );
        let b = self.st.new_block(id, 0, Key::MIN)?;
        self.st.set_root(id, b, 0)
    }

    /// Forget a log tree: its blocks go back to free space (pinned until
    /// the commit when a log sync wrote them).
    pub fn drop_log_tree(&mut self, id: TreeId) -> Result<()> {
        if !id.is_log() {
            return Err(Error::Invalid(format!("{id:?} is not a log tree")));
        }
        let Some(st) = self.st.roots.remove(&id) else {
            return Ok(());
        };
        // Every reachable block of the tree: dirty ones are in the cache,
        // written ones are read back to find their children.
        let ns = self.st.nodesize() as u64;
        let mut stack = vec![(st.bytenr, Expect::root_block(st.level, None))];
        let mut guard = 0usize;
        while let Some((b, expect)) = stack.pop() {
            guard += 1;
            if guard > 1 << 24 {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "log tree does not end",
                    b,
                ));
            }
            if expect.level.is_some_and(|l| l > 0) {
                self.st.load(id, b, expect)?;
                let buf = self.st.buf(b)?;
                for i in 0..crate::tree::edit::nritems(buf) {
                    if let Some(c) = crate::tree::node::child_in(buf, i, id.owner()) {
                        stack.push((c.bytenr, c.expect));
                    }
                }
            }
            let written = self.st.log_blocks.remove(&b).unwrap_or(true);
            self.st.space.alloc.release_unaccounted(b, ns, written)?;
            self.st.cache.remove(b);
        }
        Ok(())
    }
}
