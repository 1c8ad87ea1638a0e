//! Chunk allocation: when no block group of a type has room, carve a new
//! chunk out of unallocated device space and record it everywhere the
//! kernel does: chunk item (and the superblock's sys_chunk_array for system
//! chunks), dev extents, the device item's `bytes_used`, and a new block
//! group whose item and free space entries are written at commit.

use super::Store;
use crate::alloc::{super_stripes, BlockGroup, RangeSet};
use crate::format::chunk::{ChunkItem, Stripe};
use crate::format::consts::*;
use crate::format::dev::{DevExtent, DevItem};
use crate::format::key::Key;
use crate::{Error, Result};
use zerocopy::{FromBytes, IntoBytes};

const MIB: u64 = 1 << 20;

/// A chunk allocated in the running transaction whose tree items the
/// commit writes.
pub(super) struct PendingChunk {
    key: Key,
    item: Vec<u8>,
    placements: Vec<u64>,
    stripe: u64,
}

impl Store {
    /// Unallocated device space: `[1 MiB, total_bytes)` minus dev extents.
    fn unallocated(&mut self) -> Result<RangeSet> {
        let total = self.sb.dev_item.total_bytes.get().min(self.device().size());
        let mut free = RangeSet::new();
        free.insert(MIB, total);
        let devid = self.sb.dev_item.devid.get();
        for (k, d) in self.items_in(
            BTRFS_DEV_TREE_OBJECTID,
            Key::new(devid, BTRFS_DEV_EXTENT_KEY, 0),
            Key::new(devid, BTRFS_DEV_EXTENT_KEY, u64::MAX),
        )? {
            let de: &DevExtent = crate::format::view(&d, "dev extent").map_err(|e| e.at(0, k))?;
            free.remove(k.offset, k.offset + de.length.get());
        }
        for p in &self.pending_chunks {
            for &x in &p.placements {
                free.remove(x, x + p.stripe);
            }
        }
        Ok(free)
    }

    /// The profile new chunks of type `ty` get: the one existing groups of
    /// that type use, else DUP for metadata and system and SINGLE for data.
    fn profile_for(&self, ty: u64) -> u64 {
        if let Some(g) = self
            .alloc
            .groups
            .values()
            .find(|g| g.flags & BTRFS_BLOCK_GROUP_TYPE_MASK == ty)
        {
            return g.flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        }
        if ty == BTRFS_BLOCK_GROUP_DATA {
            0
        } else {
            BTRFS_BLOCK_GROUP_DUP
        }
    }

    /// Where a new chunk of type `ty` goes on the device and its stripe
    /// size, by the kernel's rules for one device (gather_device_info,
    /// decide_stripe_size_regular): the type's largest stripe (1 GiB for
    /// data, 256 MiB for metadata, 1 GiB above 50 GiB, 32 MiB for system)
    /// times `copies` is looked for in the first hole from 1 MiB that has
    /// it, else the largest hole is taken; a chunk is at most a tenth of
    /// the device, rounded up to 16 MiB, and its stripe is a whole number
    /// of 64 KiB. DUP puts both stripes in the one hole, one after the
    /// other.
    fn chunk_geometry(&mut self, ty: u64, copies: u64) -> Result<(u64, u64)> {
        const SZ_16M: u64 = 16 * MIB;
        const SZ_1G: u64 = 1 << 30;
        let total = self.sb.total_bytes.get();
        let type_size = match ty {
            BTRFS_BLOCK_GROUP_DATA => 10 * SZ_1G,
            BTRFS_BLOCK_GROUP_METADATA if total > 50 * SZ_1G => SZ_1G,
            BTRFS_BLOCK_GROUP_METADATA => 256 * MIB,
            _ => 32 * MIB,
        };
        let max_stripe = type_size.min(SZ_1G);
        let max_chunk = type_size.min(total / 10);
        let want = max_stripe * copies;
        let free = self.unallocated()?;
        let holes: Vec<(u64, u64)> = free.iter().collect();
        let (at, avail) = match holes.iter().find(|(s, e)| e - s >= want) {
            Some(&(s, _)) => (s, want),
            None => holes
                .iter()
                .map(|&(s, e)| (s, e - s))
                // The first of the largest holes.
                .fold((0, 0), |best, h| if h.1 > best.1 { h } else { best }),
        };
        if avail < BTRFS_STRIPE_LEN * copies {
            return Err(Error::NoSpace(format!(
                "no unallocated device space for a new {} chunk",
                crate::format::names::block_group_flags_str(ty | self.profile_for(ty))
            )));
        }
        // One data stripe for SINGLE and DUP alike.
        let mut stripe = avail / copies;
        if stripe > max_chunk {
            stripe = max_chunk
                .div_ceil(SZ_16M)
                .saturating_mul(SZ_16M)
                .min(stripe);
        }
        let stripe = stripe.min(SZ_1G) / BTRFS_STRIPE_LEN * BTRFS_STRIPE_LEN;
        Ok((at, stripe))
    }

    /// Allocate a chunk for block group type `ty` (DATA, METADATA or SYSTEM).
    pub fn alloc_chunk(&mut self, ty: u64) -> Result<u64> {
        if self.img.multi_device() {
            // The allocator knows one device's free space and profiles
            // whose copies share it.
            return Err(Error::NoSpace(format!(
                "a new {} chunk is needed, and chunks are not allocated on a filesystem of \
                 several devices yet (nothing was committed)",
                crate::format::names::block_group_flags_str(ty)
            )));
        }
        let profile = self.profile_for(ty);
        let copies: u64 = if profile & BTRFS_BLOCK_GROUP_DUP != 0 {
            2
        } else {
            1
        };
        let (at, stripe) = self.chunk_geometry(ty, copies)?;
        let placements: Vec<u64> = (0..copies).map(|i| at + i * stripe).collect();
        let logical = self
            .img
            .chunks
            .iter()
            .map(|m| m.end())
            .max()
            .unwrap_or(MIB)
            .max(MIB);
        let flags = ty | profile;
        let dev_uuid = self.sb.dev_item.uuid;
        let devid = self.sb.dev_item.devid.get();
        let chunk = ChunkItem {
            length: stripe.into(),
            owner: BTRFS_EXTENT_TREE_OBJECTID.into(),
            stripe_len: BTRFS_STRIPE_LEN.into(),
            type_: flags.into(),
            io_align: (BTRFS_STRIPE_LEN as u32).into(),
            io_width: (BTRFS_STRIPE_LEN as u32).into(),
            sector_size: self.sectorsize().into(),
            num_stripes: (copies as u16).into(),
            sub_stripes: 1.into(),
        };
        let stripes: Vec<Stripe> = placements
            .iter()
            .map(|&p| Stripe {
                devid: devid.into(),
                offset: p.into(),
                dev_uuid,
            })
            .collect();
        let mut item = chunk.as_bytes().to_vec();
        for s in &stripes {
            item.extend_from_slice(s.as_bytes());
        }
        // Map and allocator first, so CoW of the chunk tree below can use a
        // new system chunk for itself.
        self.img.chunks.insert(logical, &chunk, &stripes)?;
        let mut g = BlockGroup {
            start: logical,
            length: stripe,
            flags,
            used: 0,
            free: RangeSet::new(),
            pinned: RangeSet::new(),
            excluded: RangeSet::new(),
            dirty: true,
            fst_bitmaps: false,
            on_disk: false,
            read_only: false,
        };
        g.free.insert(logical, logical + stripe);
        let size = self.device().size();
        for (a, b) in super_stripes(&self.img.chunks, logical, stripe, &|_| Some(size)) {
            g.excluded.insert(a, b);
            g.free.remove(a, b);
        }
        self.alloc.groups.insert(logical, g);

        let key = Key::new(
            BTRFS_FIRST_CHUNK_TREE_OBJECTID,
            BTRFS_CHUNK_ITEM_KEY,
            logical,
        );
        if ty == BTRFS_BLOCK_GROUP_SYSTEM {
            let n = self.sb.sys_chunk_array_size.get() as usize;
            let add = 17 + item.len();
            if n + add > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE {
                return Err(Error::NoSpace("superblock sys_chunk_array is full".into()));
            }
            self.sb.sys_chunk_array[n..n + 17].copy_from_slice(key.to_disk().as_bytes());
            self.sb.sys_chunk_array[n + 17..n + add].copy_from_slice(&item);
            self.sb.sys_chunk_array_size.set((n + add) as u32);
        }
        let used = self.sb.dev_item.bytes_used.get() + stripe * copies;
        self.sb.dev_item.bytes_used.set(used);
        // The chunk's tree items are written at commit: inserting them here
        // could copy a tree block that a copy-on-write in progress is
        // replacing (this runs when an allocation finds no room).
        self.pending_chunks.push(PendingChunk {
            key,
            item,
            placements,
            stripe,
        });
        self.chunk_allocated = true;
        Ok(logical)
    }

    /// Insert the items of chunks allocated since the last commit: chunk
    /// item, dev extents, the device item's used bytes (as the kernel's
    /// btrfs_create_pending_block_groups). Returns whether there were any.
    pub(super) fn create_pending_chunks(&mut self) -> Result<bool> {
        if self.pending_chunks.is_empty() {
            return Ok(false);
        }
        let devid = self.sb.dev_item.devid.get();
        let chunk_tree_uuid = self.chunk_tree_uuid;
        while let Some(p) = self.pending_chunks.pop() {
            self.insert_item(BTRFS_CHUNK_TREE_OBJECTID, &p.key, &p.item)?;
            for &x in &p.placements {
                let de = DevExtent {
                    chunk_tree: BTRFS_CHUNK_TREE_OBJECTID.into(),
                    chunk_objectid: BTRFS_FIRST_CHUNK_TREE_OBJECTID.into(),
                    chunk_offset: p.key.offset.into(),
                    length: p.stripe.into(),
                    chunk_tree_uuid,
                };
                self.insert_item(
                    BTRFS_DEV_TREE_OBJECTID,
                    &Key::new(devid, BTRFS_DEV_EXTENT_KEY, x),
                    de.as_bytes(),
                )?;
            }
        }
        let used = self.sb.dev_item.bytes_used.get();
        let dkey = Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid);
        if let Some(d) = self.lookup(BTRFS_CHUNK_TREE_OBJECTID, &dkey)? {
            let mut di = DevItem::read_from_bytes(&d)
                .map_err(|_| Error::corrupt_key("dev item size", 0, dkey))?;
            di.bytes_used.set(used);
            self.update_item(BTRFS_CHUNK_TREE_OBJECTID, &dkey, di.as_bytes())?;
        }
        Ok(true)
    }

    /// Allocate `len` bytes of type `ty`, adding a chunk when every group is full.
    /// `account`: the space counts as used (false for log tree blocks,
    /// which have no extent items).
    pub fn alloc_space(&mut self, ty: u64, len: u64, align: u64, account: bool) -> Result<u64> {
        match self.alloc.alloc(ty, len, align, account) {
            Ok(b) => Ok(b),
            Err(Error::NoSpace(_)) => {
                // A new chunk needs system space for its chunk item first.
                if ty != BTRFS_BLOCK_GROUP_SYSTEM && !self.system_has_room()? {
                    self.alloc_chunk(BTRFS_BLOCK_GROUP_SYSTEM)?;
                }
                self.alloc_chunk(ty)?;
                self.alloc.alloc(ty, len, align, account)
            }
            Err(e) => Err(e),
        }
    }

    /// Bytes new data can take in the writable data block groups (space
    /// freed in this transaction is pinned until the commit and does not
    /// count).
    pub fn data_room(&mut self) -> Result<u64> {
        Ok(self
            .alloc
            .groups
            .values()
            .filter(|g| g.flags & BTRFS_BLOCK_GROUP_DATA != 0 && !g.read_only)
            .map(|g| g.free.total())
            .sum())
    }

    /// One new data chunk, whether or not the data block groups have room
    /// (ALLOC_CHUNK_FORCE); false when the device has no room for one.
    pub fn force_data_chunk(&mut self) -> Result<bool> {
        if !self.system_has_room()? {
            match self.alloc_chunk(BTRFS_BLOCK_GROUP_SYSTEM) {
                Err(Error::NoSpace(_)) => return Ok(false),
                r => r?,
            };
        }
        match self.alloc_chunk(BTRFS_BLOCK_GROUP_DATA) {
            Ok(_) => Ok(true),
            Err(Error::NoSpace(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The longest free piece in the writable groups of type `ty`.
    pub fn largest_free(&self, ty: u64) -> u64 {
        self.alloc.largest_free(ty)
    }

    fn system_has_room(&self) -> Result<bool> {
        let ns = self.nodesize() as u64;
        let free: u64 = self
            .alloc
            .groups
            .values()
            .filter(|g| g.is_system() && !g.read_only)
            .map(|g| g.free.total())
            .sum();
        Ok(free >= 8 * ns)
    }
}
