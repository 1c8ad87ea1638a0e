//! Replacing the chunk tree as a whole (`chunk-recover`): the old tree's
//! blocks are given up without being read (they may be gone), a new tree
//! is built from the items given, and the superblock's sys_chunk_array is
//! written again from the SYSTEM chunks. The commit that follows writes
//! the new tree and points every superblock copy at it; until then the
//! image is what it was.

use super::{RootState, Store, TreeId};
use crate::format::consts::*;
use crate::format::dev::DevItem;
use crate::format::key::Key;
use crate::{Error, Result};

const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;

/// What [`Store::replace_chunk_tree`] did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ChunkTreeReplaced {
    /// Tree blocks of the old chunk tree whose extent items went (their
    /// space is free once the commit is durable).
    pub old_blocks_freed: u64,
    /// Items in the new tree.
    pub items: u64,
    /// Bytes of the new sys_chunk_array.
    pub sys_chunk_array_size: u32,
}

impl Store {
    /// Replace the chunk tree with one holding `items` (DEV_ITEMs and
    /// CHUNK_ITEMs with their bodies, any order), and the superblock's
    /// sys_chunk_array with `sys_chunk_array` (the SYSTEM chunks as the
    /// array packs them). `dev_items` become the devices' own items in
    /// their superblocks. Every tree block in a SYSTEM block group is a
    /// chunk tree block: their extent items go (the blocks are never read),
    /// and the new tree's blocks are allocated from what that leaves free,
    /// never from the old blocks (pinned until the commit is durable).
    /// Nothing may have read or changed the chunk tree in this
    /// transaction before. The commit writes the new root into the
    /// superblocks.
    pub fn replace_chunk_tree(
        &mut self,
        items: &[(Key, Vec<u8>)],
        sys_chunk_array: &[u8],
        dev_items: &[DevItem],
    ) -> Result<ChunkTreeReplaced> {
        if sys_chunk_array.len() > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE {
            return Err(Error::NoSpace(format!(
                "the SYSTEM chunks take {} bytes, the superblock's sys_chunk_array holds {BTRFS_SYSTEM_CHUNK_ARRAY_SIZE}",
                sys_chunk_array.len()
            )));
        }
        if self.roots.contains_key(&TreeId::Chunk)
            || !self.cache.dirty_blocks(&|t| t == TreeId::Chunk).is_empty()
        {
            return Err(Error::Internal(
                "the chunk tree was used before it was replaced".into(),
            ));
        }
        let mut out = ChunkTreeReplaced::default();
        let system: Vec<(u64, u64)> = self
            .space
            .alloc
            .groups
            .values()
            .filter(|g| g.is_system())
            .map(|g| (g.start, g.end()))
            .collect();
        for (start, end) in system {
            if end <= start {
                continue;
            }
            let found = self.items_in(
                EXTENT,
                Key::new(start, 0, 0),
                Key::new(end - 1, u8::MAX, u64::MAX),
            )?;
            for (k, _) in found {
                if matches!(k.ty, BTRFS_EXTENT_ITEM_KEY | BTRFS_METADATA_ITEM_KEY) {
                    self.repair().rewrite_extent_refs(k.objectid, &[])?;
                    out.old_blocks_freed += 1;
                }
            }
        }
        self.items.forget_tree(TreeId::Chunk);
        self.roots.insert(
            TreeId::Chunk,
            RootState {
                id: TreeId::Chunk,
                bytenr: 0,
                level: 0,
                item: None,
                dirty: true,
            },
        );
        let b = self.new_block(TreeId::Chunk, 0, Key::MIN)?;
        self.set_root(TreeId::Chunk, b, 0)?;
        let mut sorted: Vec<&(Key, Vec<u8>)> = items.iter().collect();
        sorted.sort_by_key(|(k, _)| *k);
        for (k, d) in sorted {
            self.insert_item(TreeId::Chunk, k, d)?;
            out.items += 1;
        }
        for di in dev_items {
            if self.space.dev_item_of(&self.sb, di.devid.get()).is_some() {
                self.space.set_dev_item(&mut self.sb, di.devid.get(), *di);
            }
        }
        self.sb.sys_chunk_array = [0; BTRFS_SYSTEM_CHUNK_ARRAY_SIZE];
        self.sb.sys_chunk_array[..sys_chunk_array.len()].copy_from_slice(sys_chunk_array);
        self.sb
            .sys_chunk_array_size
            .set(sys_chunk_array.len() as u32);
        out.sys_chunk_array_size = sys_chunk_array.len() as u32;
        Ok(out)
    }
}
