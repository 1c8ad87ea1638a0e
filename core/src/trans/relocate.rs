//! Metadata balance (`btrfs balance start -m`): every metadata and system
//! block group is emptied into new chunks and removed. Every tree block of
//! every tree is copied into new space (the old groups take no new
//! allocation), one commit makes the copies durable, then the empty groups
//! lose their items everywhere the kernel keeps them: block group item,
//! free space tree, chunk item (and the superblock's system chunk array),
//! dev extents and the device's used bytes.

use super::{Store, TreeId};
use crate::format::chunk::ChunkItem;
use crate::format::consts::*;
use crate::format::key::Key;
use crate::{Error, Result};

/// Relocation of a block group's tree blocks (balance of metadata): every block in the group copied out, the group and its chunk removed. Obtained from [`Store::relocation`].
pub struct Relocation<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Relocation`].
    pub fn relocation(&mut self) -> Relocation<'_> {
        Relocation { st: self }
    }
}

/// Most leaves one tree's rewrite visits (bounds a damaged tree).
const MAX_LEAVES: usize = 1 << 26;

impl Relocation<'_> {
    /// Relocate every metadata and system block group. The caller commits
    /// nothing before; this commits twice.
    pub fn relocate_metadata(&mut self) -> Result<()> {
        let old: Vec<u64> = self
            .st
            .space
            .alloc
            .groups
            .values()
            .filter(|g| g.is_metadata() || g.is_system())
            .map(|g| g.start)
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        for s in &old {
            if let Some(g) = self.st.space.alloc.groups.get_mut(s) {
                g.read_only = true;
            }
        }
        // Room for the copies first: a system chunk (the chunk tree moves
        // too), then a metadata chunk.
        self.st.chunks().alloc_chunk(BTRFS_BLOCK_GROUP_SYSTEM)?;
        self.st.chunks().alloc_chunk(BTRFS_BLOCK_GROUP_METADATA)?;
        // Every tree that exists: root, chunk and those the root tree lists.
        let mut trees = vec![TreeId::Root, TreeId::Chunk];
        let mut k = Key::new(0, BTRFS_ROOT_ITEM_KEY, 0);
        while let Some((key, _)) = self.st.next_item(TreeId::Root, &k)? {
            if key == Key::MAX {
                break;
            }
            k = super::btree::next_key(&key);
            if key.ty == BTRFS_ROOT_ITEM_KEY
                && key.objectid != BTRFS_TREE_LOG_OBJECTID
                && !trees.contains(&TreeId::Tree(key.objectid))
            {
                trees.push(TreeId::Tree(key.objectid));
            }
            if key.ty < BTRFS_ROOT_ITEM_KEY {
                k = Key::new(key.objectid, BTRFS_ROOT_ITEM_KEY, 0);
            } else if key.ty > BTRFS_ROOT_ITEM_KEY {
                k = Key::new(key.objectid.saturating_add(1), BTRFS_ROOT_ITEM_KEY, 0);
            }
        }
        for t in trees {
            self.rewrite_tree(t)?;
        }
        self.st.commit()?;
        // Blocks copied while the commit ran (extent, free space, root
        // trees changed by it) may still sit in the old groups: once more.
        for _ in 0..4 {
            let used: u64 = old
                .iter()
                .filter_map(|s| self.st.space.alloc.groups.get(s))
                .map(|g| g.used)
                .sum();
            if used == 0 {
                break;
            }
            for t in [
                TreeId::Root,
                TreeId::Chunk,
                TreeId::Tree(BTRFS_EXTENT_TREE_OBJECTID),
                TreeId::Tree(BTRFS_FREE_SPACE_TREE_OBJECTID),
                TreeId::Tree(BTRFS_DEV_TREE_OBJECTID),
                TreeId::Tree(BTRFS_BLOCK_GROUP_TREE_OBJECTID),
                TreeId::Tree(BTRFS_QUOTA_TREE_OBJECTID),
            ] {
                if self.st.tree_exists(t)? {
                    self.rewrite_tree(t)?;
                }
            }
            self.st.commit()?;
        }
        for s in old {
            let Some(g) = self.st.space.alloc.groups.get(&s) else {
                continue;
            };
            if g.used != 0 {
                return Err(Error::NoSpace(format!(
                    "block group {s} still holds {} bytes after relocation",
                    g.used
                )));
            }
            self.remove_block_group(s)?;
        }
        self.st.commit()
    }

    /// Copy every block of tree `t` (a search path to every leaf, copied
    /// on the way down).
    fn rewrite_tree(&mut self, t: TreeId) -> Result<()> {
        let mut k = Key::MIN;
        for _ in 0..MAX_LEAVES {
            let (path, _) = self.st.search_mut(t, &k, None)?;
            let leaf = path
                .last()
                .map(|s| s.bytenr)
                .ok_or_else(|| Error::Internal("empty path".into()))?;
            let buf = self.st.buf(leaf)?;
            let n = crate::tree::edit::nritems(buf);
            if n == 0 {
                return Ok(());
            }
            let last = crate::tree::edit::leaf_key(buf, n - 1);
            if last == Key::MAX {
                return Ok(());
            }
            let next = super::btree::next_key(&last);
            match self.st.next_item(t, &next)? {
                Some((nk, _)) => k = nk,
                None => return Ok(()),
            }
        }
        Err(Error::Internal("tree rewrite does not end".into()))
    }

    /// Remove an empty block group and its chunk.
    fn remove_block_group(&mut self, start: u64) -> Result<()> {
        let g = self
            .st
            .space
            .alloc
            .groups
            .remove(&start)
            .ok_or_else(|| Error::Invalid(format!("block group {start} not found")))?;
        let bgt = TreeId::Tree(self.st.bg_tree);
        self.st
            .delete_item(bgt, &Key::new(start, BTRFS_BLOCK_GROUP_ITEM_KEY, g.length))?;
        if self.st.has_fst() {
            let items = self.st.items_in(
                BTRFS_FREE_SPACE_TREE_OBJECTID,
                Key::new(start, 0, 0),
                Key::new(start + g.length - 1, u8::MAX, u64::MAX),
            )?;
            for (k, _) in items {
                if k.objectid >= start && k.objectid < start + g.length {
                    self.st.delete_item(BTRFS_FREE_SPACE_TREE_OBJECTID, &k)?;
                }
            }
        }
        let ckey = Key::new(BTRFS_FIRST_CHUNK_TREE_OBJECTID, BTRFS_CHUNK_ITEM_KEY, start);
        let cdata = self.st.lookup(TreeId::Chunk, &ckey)?.ok_or_else(|| {
            Error::corrupt_key_as(
                crate::CorruptKind::Reference,
                "block group without chunk item",
                start,
                ckey,
            )
        })?;
        let (chunk, stripes) =
            crate::format::chunk::parse_chunk(&cdata).map_err(|e| e.at(start, ckey))?;
        let (chunk, stripes): (ChunkItem, Vec<crate::format::chunk::Stripe>) =
            (*chunk, stripes.to_vec());
        self.st.delete_item(TreeId::Chunk, &ckey)?;
        let stripe = crate::chunk::stripe_length(
            chunk.type_.get(),
            chunk.length.get(),
            stripes.len() as u64,
        );
        let mut touched: Vec<u64> = Vec::new();
        for s in &stripes {
            let devid = s.devid.get();
            self.st.delete_item(
                BTRFS_DEV_TREE_OBJECTID,
                &Key::new(devid, BTRFS_DEV_EXTENT_KEY, s.offset.get()),
            )?;
            if let Some(mut di) = self.st.space.dev_item_of(&self.st.sb, devid) {
                di.bytes_used
                    .set(di.bytes_used.get().saturating_sub(stripe));
                self.st.space.set_dev_item(&mut self.st.sb, devid, di);
            }
            if !touched.contains(&devid) {
                touched.push(devid);
            }
        }
        self.st.chunks().write_dev_items_used(&touched)?;
        if g.is_system() {
            self.remove_sys_chunk(start)?;
        }
        self.st.img.chunks.remove(start);
        Ok(())
    }

    /// Drop chunk `logical` from the superblock's system chunk array.
    fn remove_sys_chunk(&mut self, logical: u64) -> Result<()> {
        let n = self.st.sb.sys_chunk_array_size.get() as usize;
        let arr = self.st.sb.sys_chunk_array[..n].to_vec();
        let mut out = Vec::with_capacity(n);
        let mut p = 0usize;
        while p + 17 <= arr.len() {
            let key = Key::from(crate::format::view::<crate::format::key::DiskKey>(
                &arr[p..p + 17],
                "sys chunk key",
            )?);
            let body = &arr[p + 17..];
            let (_, stripes) = crate::format::chunk::parse_chunk(body).map_err(|e| e.at(0, key))?;
            let len = crate::format::chunk::CHUNK_ITEM_SIZE
                + stripes.len() * crate::format::chunk::STRIPE_SIZE;
            if key.offset != logical {
                out.extend_from_slice(&arr[p..p + 17 + len]);
            }
            p += 17 + len;
        }
        self.st.sb.sys_chunk_array[..n].fill(0);
        self.st.sb.sys_chunk_array[..out.len()].copy_from_slice(&out);
        self.st.sb.sys_chunk_array_size.set(out.len() as u32);
        Ok(())
    }
}
