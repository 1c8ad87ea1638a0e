//! Chunk allocation: when no block group of a type has room, carve a new
//! chunk out of unallocated device space and record it everywhere the
//! kernel does: chunk item (and the superblock's sys_chunk_array for system
//! chunks), dev extents, the device item's `bytes_used`, and a new block
//! group whose item and free space entries are written at commit.

use super::Store;
use crate::alloc::{super_stripes, Allocator, BlockGroup, RangeSet};
use crate::chunk::RaidAttr;
use crate::format::chunk::{ChunkItem, Stripe};
use crate::format::consts::*;
use crate::format::dev::{DevExtent, DevItem};
use crate::format::key::Key;
use crate::format::superblock::Superblock;
use crate::{Error, Result};
use zerocopy::{FromBytes, IntoBytes};

/// What the store knows of its space: block groups with their free, pinned
/// and used space (kept exact in memory, written back at commit), the
/// chunks allocated in this transaction, the device items. The store owns
/// it; [`Chunks`] changes it together with the trees.
pub struct Space {
    /// Block groups and their free, pinned and used space.
    pub(super) alloc: Allocator,
    /// Chunks allocated in this transaction, their tree items not yet in.
    pub(super) pending_chunks: Vec<PendingChunk>,
    /// The device items of the devices other than the superblock's (whose
    /// item is `sb.dev_item`), as each device's superblocks carry them.
    pub(super) other_dev_items: std::collections::BTreeMap<u64, DevItem>,
    /// A chunk was allocated in this transaction: a log must not depend on
    /// it (btrfs_make_block_group forces a full commit).
    pub(super) chunk_allocated: bool,
    /// The largest new chunk, below the kernel's sizes (mkfs `--shrink`:
    /// a filesystem that ends where its last chunk does wastes at most a
    /// chunk); None: the kernel's sizes.
    pub(super) chunk_cap: Option<u64>,
    /// Profiles a running conversion puts new chunks of a type in (the
    /// kernel's restripe target, get_restripe_target), by type bit.
    pub(super) restripe_target: std::collections::BTreeMap<u64, u64>,
    /// Devices being shrunk: no new dev extent reaches past this (the
    /// kernel lowers the device's in-memory total_bytes first; the device
    /// item changes only once everything beyond is moved).
    pub(super) alloc_limit: std::collections::BTreeMap<u64, u64>,
    /// Stripes being added to an existing chunk whose dev extents are not
    /// in the dev tree yet, (devid, start, length): taken for any chunk
    /// allocated meanwhile (a tree change on the way may need one).
    pub(super) pending_stripes: Vec<(u64, u64, u64)>,
}

impl Space {
    /// Every device's own device item (the superblock's device's is in
    /// `sb`), as the next commit writes it.
    pub(super) fn dev_item_of(&self, sb: &Superblock, devid: u64) -> Option<DevItem> {
        if devid == sb.dev_item.devid.get() {
            return Some(sb.dev_item);
        }
        self.other_dev_items.get(&devid).copied()
    }

    pub(super) fn set_dev_item(&mut self, sb: &mut Superblock, devid: u64, di: DevItem) {
        if devid == sb.dev_item.devid.get() {
            sb.dev_item = di;
        } else {
            self.other_dev_items.insert(devid, di);
        }
    }
}

/// Space and chunks: allocation of extents from block groups, new chunks placed on the devices, their chunk, dev extent and device items. Obtained from [`Store::chunks`].
pub struct Chunks<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Chunks`].
    pub fn chunks(&mut self) -> Chunks<'_> {
        Chunks { st: self }
    }
}

const MIB: u64 = 1 << 20;

/// A chunk allocated in the running transaction whose tree items the
/// commit writes.
pub(super) struct PendingChunk {
    key: Key,
    item: Vec<u8>,
    /// (devid, physical) of every stripe.
    placements: Vec<(u64, u64)>,
    stripe: u64,
}

/// A device a new chunk may use: its largest suitable hole and its
/// unallocated total (the kernel's `btrfs_device_info`).
pub(crate) struct Candidate {
    pub devid: u64,
    pub uuid: [u8; 16],
    pub dev_offset: u64,
    pub max_avail: u64,
    pub total_avail: u64,
}

/// Stripes (devid, device uuid, physical offset) in stripe order, the
/// stripe size on each device, and the chunk's logical length.
pub(crate) type ChunkPlacement = (Vec<(u64, [u8; 16], u64)>, u64, u64);

/// The largest stripe and the largest chunk of block group type `ty` on a
/// filesystem of `total` bytes (the kernel's init_alloc_chunk_ctl_policy_regular):
/// data 1 GiB stripes, chunks up to 10 GiB; metadata 256 MiB (1 GiB above
/// 50 GiB); system 32 MiB; no chunk above a tenth of the filesystem.
pub(crate) fn type_limits(ty: u64, total: u64) -> (u64, u64) {
    const SZ_1G: u64 = 1 << 30;
    // Mixed groups (DATA|METADATA) size as data (calc_chunk_size).
    let type_size = if ty & BTRFS_BLOCK_GROUP_DATA != 0 {
        10 * SZ_1G
    } else if ty & BTRFS_BLOCK_GROUP_METADATA != 0 && total > 50 * SZ_1G {
        SZ_1G
    } else if ty & BTRFS_BLOCK_GROUP_METADATA != 0 {
        256 * MIB
    } else {
        32 * MIB
    };
    (type_size.min(SZ_1G), type_size.min(total / 10))
}

/// The hole on a device a chunk of `ty` and `attr` would use, among the
/// device's unallocated `holes` (ascending): the first that holds the
/// type's largest stripe times the stripes per device, else the first of
/// the largest (gather_device_info). None when it is below the minimum.
pub(crate) fn pick_hole(
    holes: &[(u64, u64)],
    ty: u64,
    attr: RaidAttr,
    total: u64,
) -> Option<(u64, u64)> {
    let (max_stripe, _) = type_limits(ty, total);
    let want = max_stripe * attr.dev_stripes;
    let min = BTRFS_STRIPE_LEN * attr.dev_stripes;
    let (at, avail) = match holes.iter().find(|(s, e)| e - s >= want) {
        Some(&(s, e)) => (s, e - s),
        None => holes
            .iter()
            .map(|&(s, e)| (s, e - s))
            .fold((0, 0), |best, h| if h.1 > best.1 { h } else { best }),
    };
    (avail >= min).then_some((at, avail))
}

/// Where a new chunk of type `ty` and profile `attr` goes among the
/// devices `cands`, by the kernel's rules (gather_device_info,
/// decide_stripe_size_regular): devices sorted by their hole, then by
/// unallocated space, as many as the profile takes; the stripe is the
/// smallest chosen hole over the stripes per device, the chunk at most a
/// tenth of the filesystem (stripe rounded up to 16 MiB) and a stripe at
/// most 1 GiB, a whole number of 64 KiB. `devices`: how many the
/// filesystem has, for the error. `cap`: the largest chunk wanted (mkfs
/// `--shrink`, whose filesystem ends where its last chunk does), below
/// the kernel's limits.
pub(crate) fn place_chunk(
    mut cands: Vec<Candidate>,
    ty: u64,
    attr: RaidAttr,
    total: u64,
    what: &str,
    devices: usize,
    cap: Option<u64>,
) -> Result<ChunkPlacement> {
    const SZ_16M: u64 = 16 * MIB;
    const SZ_1G: u64 = 1 << 30;
    let (_, max_chunk) = type_limits(ty, total);
    // Most room first (btrfs_cmp_device_info); stable, so devid order
    // breaks ties.
    cands.sort_by_key(|c| std::cmp::Reverse((c.max_avail, c.total_avail)));
    let mut ndevs = cands.len() as u64;
    if attr.devs_max > 0 {
        ndevs = ndevs.min(attr.devs_max);
    }
    ndevs -= ndevs % attr.devs_increment.max(1);
    if ndevs < attr.devs_min || ndevs == 0 {
        return Err(Error::NoSpace(format!(
            "no unallocated device space for a new {what} chunk ({} of the {devices} devices have room, it needs {})",
            cands.len(),
            attr.devs_min
        )));
    }
    let chosen = &cands[..ndevs as usize];
    let mut stripe = chosen[chosen.len() - 1].max_avail / attr.dev_stripes;
    let num_stripes = ndevs * attr.dev_stripes;
    let data_stripes = (num_stripes.saturating_sub(attr.nparity) / attr.ncopies).max(1);
    if stripe.saturating_mul(data_stripes) > max_chunk {
        stripe = (max_chunk / data_stripes)
            .div_ceil(SZ_16M)
            .saturating_mul(SZ_16M)
            .min(stripe);
    }
    if let Some(cap) = cap {
        stripe = stripe.min((cap / data_stripes).max(BTRFS_STRIPE_LEN));
    }
    let stripe = stripe.min(SZ_1G) / BTRFS_STRIPE_LEN * BTRFS_STRIPE_LEN;
    let mut stripes = Vec::with_capacity(num_stripes as usize);
    for c in chosen {
        for j in 0..attr.dev_stripes {
            stripes.push((c.devid, c.uuid, c.dev_offset + j * stripe));
        }
    }
    Ok((stripes, stripe, stripe * data_stripes))
}

impl Chunks<'_> {
    /// Write every block group item again at commit, with the used bytes
    /// the extent tree gives (and so the superblock's bytes_used, which the
    /// commit sums from them).
    pub fn rewrite_block_groups(&mut self) {
        for g in self.st.space.alloc.groups.values_mut() {
            g.dirty = true;
        }
    }

    /// Take `[bytenr, bytenr + len)` from the free space (an extent in use
    /// that the extent tree does not account yet).
    pub fn reserve(&mut self, bytenr: u64, len: u64) -> Result<()> {
        self.st.space.alloc.reserve(bytenr, len)
    }

    /// Keep the free part of `[start, end)` from allocation until the
    /// commit, without accounting it as used.
    pub fn pin_free(&mut self, start: u64, end: u64) {
        self.st.space.alloc.pin_free(start, end)
    }

    /// The largest new chunk (see [`Space`]'s `chunk_cap`); None: the
    /// kernel's sizes.
    pub fn cap(&self) -> Option<u64> {
        self.st.space.chunk_cap
    }

    /// Set the largest new chunk.
    pub fn set_cap(&mut self, cap: Option<u64>) {
        self.st.space.chunk_cap = cap;
    }

    /// Let block groups `starts` take new extents (`false`) or not
    /// (`true`); nothing on disk changes.
    pub fn set_read_only(&mut self, starts: &[u64], read_only: bool) {
        for s in starts {
            if let Some(g) = self.st.space.alloc.groups.get_mut(s) {
                g.read_only = read_only;
            }
        }
    }

    /// The incompat bits the block groups' profiles call for: RAID56 while
    /// a RAID5/6 group exists, RAID1C34 while a RAID1C3/4 one does (set
    /// when the first such group appears, cleared with the last, as
    /// the kernel's btrfs_remove_block_group does).
    pub fn update_profile_features(&mut self) {
        let all = self
            .st
            .space
            .alloc
            .groups
            .values()
            .fold(0u64, |a, g| a | g.flags);
        let mut f = self.st.sb.incompat_flags.get();
        for (bits, feature) in [
            (
                BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6,
                BTRFS_FEATURE_INCOMPAT_RAID56,
            ),
            (
                BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4,
                BTRFS_FEATURE_INCOMPAT_RAID1C34,
            ),
        ] {
            if all & bits != 0 {
                f |= feature;
            } else {
                f &= !feature;
            }
        }
        self.st.sb.incompat_flags.set(f);
    }

    /// No new chunk reaches past byte `limit` of device `devid` (None: up
    /// to its size again): a shrink in progress.
    pub fn set_alloc_limit(&mut self, devid: u64, limit: Option<u64>) {
        match limit {
            Some(l) => self.st.space.alloc_limit.insert(devid, l),
            None => self.st.space.alloc_limit.remove(&devid),
        };
    }

    /// New chunks of type `ty` (DATA, METADATA or SYSTEM) go in profile
    /// `profile` (its profile bits; 0 SINGLE) while it is set, whatever
    /// the existing groups use: a balance converting them. None: back to
    /// the profiles of the existing groups.
    pub fn set_restripe_target(&mut self, ty: u64, profile: Option<u64>) {
        match profile {
            Some(p) => self
                .st
                .space
                .restripe_target
                .insert(ty, p & BTRFS_BLOCK_GROUP_PROFILE_MASK),
            None => self.st.space.restripe_target.remove(&ty),
        };
    }

    /// Unallocated space of device `devid`: `[1 MiB, total_bytes)` minus
    /// its dev extents and the stripes of chunks not yet in the trees.
    fn unallocated(&mut self, devid: u64, total_bytes: u64) -> Result<RangeSet> {
        let size = self.st.img.device_of(devid).map_or(0, |d| d.size());
        let limit = self
            .st
            .space
            .alloc_limit
            .get(&devid)
            .copied()
            .unwrap_or(u64::MAX);
        let total = total_bytes.min(size).min(limit);
        let mut free = RangeSet::new();
        free.insert(MIB, total.max(MIB));
        for (k, d) in self.st.items_in(
            BTRFS_DEV_TREE_OBJECTID,
            Key::new(devid, BTRFS_DEV_EXTENT_KEY, 0),
            Key::new(devid, BTRFS_DEV_EXTENT_KEY, u64::MAX),
        )? {
            let de: &DevExtent = crate::format::view(&d, "dev extent").map_err(|e| e.at(0, k))?;
            free.remove(k.offset, k.offset + de.length.get());
        }
        for p in &self.st.space.pending_chunks {
            for &(d, x) in &p.placements {
                if d == devid {
                    free.remove(x, x + p.stripe);
                }
            }
        }
        for &(d, x, l) in &self.st.space.pending_stripes {
            if d == devid {
                free.remove(x, x + l);
            }
        }
        Ok(free)
    }

    /// The profile new chunks of type `ty` get (btrfs_get_alloc_profile):
    /// the profiles existing groups of that type use, reduced to what the
    /// devices present allow ([`crate::chunk::reduce_profile`]: SINGLE on a
    /// RAID1 set mounted degraded on one device); with no group of the
    /// type yet, mkfs.btrfs's defaults (DUP metadata and system on one
    /// device, RAID1 on several, SINGLE data).
    fn profile_for(&self, ty: u64) -> u64 {
        if let Some(&p) = self.st.space.restripe_target.get(&ty) {
            return p;
        }
        let groups: Vec<u64> = self
            .st
            .space
            .alloc
            .groups
            .values()
            .filter(|g| g.flags & BTRFS_BLOCK_GROUP_TYPE_MASK == ty)
            .map(|g| g.flags & BTRFS_BLOCK_GROUP_PROFILE_MASK)
            .collect();
        let avail = if groups.is_empty() {
            if ty == BTRFS_BLOCK_GROUP_DATA {
                0
            } else if self.st.img.multi_device() {
                BTRFS_BLOCK_GROUP_RAID1
            } else {
                BTRFS_BLOCK_GROUP_DUP
            }
        } else {
            groups.iter().fold(0, |a, p| a | p)
        };
        let present = self.st.img.devices().count() as u64;
        crate::chunk::reduce_profile(avail, present)
    }

    /// Where a new chunk of type `ty` and profile `attr` goes (see
    /// [`place_chunk`]), from each present device's unallocated space.
    fn chunk_geometry(&mut self, ty: u64, attr: RaidAttr) -> Result<ChunkPlacement> {
        let total = self.st.sb.total_bytes.get();
        let devids: Vec<u64> = self.st.img.devices().map(|(id, _)| id).collect();
        let mut cands = Vec::new();
        for devid in devids {
            let Some(di) = self.st.space.dev_item_of(&self.st.sb, devid) else {
                continue;
            };
            let free = self.unallocated(devid, di.total_bytes.get())?;
            let holes: Vec<(u64, u64)> = free.iter().collect();
            let Some((at, avail)) = pick_hole(&holes, ty, attr, total) else {
                continue;
            };
            cands.push(Candidate {
                devid,
                uuid: di.uuid,
                dev_offset: at,
                max_avail: avail,
                total_avail: di.total_bytes.get().saturating_sub(di.bytes_used.get()),
            });
        }
        let what = crate::format::names::block_group_flags_str(ty | self.profile_for(ty));
        place_chunk(
            cands,
            ty,
            attr,
            total,
            &what,
            self.st.img.devices().count(),
            self.st.space.chunk_cap,
        )
    }

    /// Allocate a chunk for block group type `ty` (DATA, METADATA or SYSTEM)
    /// on the devices present.
    pub fn alloc_chunk(&mut self, ty: u64) -> Result<u64> {
        // With mixed block groups, data and tree blocks get one kind of
        // chunk.
        let ty = if self.st.sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS != 0
            && ty & (BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA) != 0
        {
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA
        } else {
            ty
        };
        // Opened degraded, chunks go to the devices present in the profile
        // they allow (profile_for), as at the kernel's degraded mount.
        if !self.st.img.missing.is_empty() && !self.st.img.degraded {
            return Err(Error::MissingDevice {
                devids: self.st.img.missing.clone(),
                what: format!(
                    "a new {} chunk is needed and devices of the filesystem are missing \
                     (nothing was committed; open degraded to write what the others allow)",
                    crate::format::names::block_group_flags_str(ty)
                ),
            });
        }
        let profile = self.profile_for(ty);
        let attr = RaidAttr::of(profile).ok_or_else(|| {
            Error::Unsupported(format!(
                "allocating a {} chunk",
                crate::format::names::block_group_flags_str(ty | profile)
            ))
        })?;
        let (placed, stripe, length) = self.chunk_geometry(ty, attr)?;
        let logical = self
            .st
            .img
            .chunks
            .iter()
            .map(|m| m.end())
            .max()
            .unwrap_or(MIB)
            .max(MIB);
        let flags = ty | profile;
        let chunk = ChunkItem {
            length: length.into(),
            owner: BTRFS_EXTENT_TREE_OBJECTID.into(),
            stripe_len: BTRFS_STRIPE_LEN.into(),
            type_: flags.into(),
            io_align: (BTRFS_STRIPE_LEN as u32).into(),
            io_width: (BTRFS_STRIPE_LEN as u32).into(),
            sector_size: self.st.sectorsize().into(),
            num_stripes: (placed.len() as u16).into(),
            sub_stripes: (attr.sub_stripes as u16).into(),
        };
        let stripes: Vec<Stripe> = placed
            .iter()
            .map(|&(devid, dev_uuid, p)| Stripe {
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
        self.st.img.chunks.insert(logical, &chunk, &stripes)?;
        let mut g = BlockGroup {
            start: logical,
            length,
            flags,
            used: 0,
            free: RangeSet::new(),
            pinned: RangeSet::new(),
            excluded: RangeSet::new(),
            dirty: true,
            fst_bitmaps: false,
            on_disk: false,
            read_only: false,
            size_class: crate::alloc::SizeClass::None,
        };
        g.free.insert(logical, logical + length);
        let sizes: Vec<(u64, u64)> = self
            .st
            .img
            .devices()
            .map(|(id, d)| (id, d.size()))
            .collect();
        let size_of = |devid: u64| sizes.iter().find(|s| s.0 == devid).map(|s| s.1);
        for (a, b) in super_stripes(&self.st.img.chunks, logical, length, &size_of) {
            g.excluded.insert(a, b);
            g.free.remove(a, b);
        }
        self.st.space.alloc.groups.insert(logical, g);
        // The first RAID5/6 chunk marks the filesystem (the kernel's
        // check_raid56_incompat_flag).
        if crate::chunk::nparity(flags) > 0 {
            let f = self.st.sb.incompat_flags.get();
            self.st
                .sb
                .incompat_flags
                .set(f | BTRFS_FEATURE_INCOMPAT_RAID56);
        }

        let key = Key::new(
            BTRFS_FIRST_CHUNK_TREE_OBJECTID,
            BTRFS_CHUNK_ITEM_KEY,
            logical,
        );
        if ty == BTRFS_BLOCK_GROUP_SYSTEM {
            let n = self.st.sb.sys_chunk_array_size.get() as usize;
            let add = 17 + item.len();
            if n + add > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE {
                return Err(Error::NoSpace("superblock sys_chunk_array is full".into()));
            }
            self.st.sb.sys_chunk_array[n..n + 17].copy_from_slice(key.to_disk().as_bytes());
            self.st.sb.sys_chunk_array[n + 17..n + add].copy_from_slice(&item);
            self.st.sb.sys_chunk_array_size.set((n + add) as u32);
        }
        for &(devid, _, _) in &placed {
            if let Some(mut di) = self.st.space.dev_item_of(&self.st.sb, devid) {
                di.bytes_used.set(di.bytes_used.get() + stripe);
                self.st.space.set_dev_item(&mut self.st.sb, devid, di);
            }
        }
        // The chunk's tree items are written at commit: inserting them here
        // could copy a tree block that a copy-on-write in progress is
        // replacing (this runs when an allocation finds no room).
        self.st.space.pending_chunks.push(PendingChunk {
            key,
            item,
            placements: placed.iter().map(|&(d, _, p)| (d, p)).collect(),
            stripe,
        });
        self.st.space.chunk_allocated = true;
        Ok(logical)
    }

    /// Insert the items of chunks allocated since the last commit: chunk
    /// item, dev extents, each device item's used bytes (as the kernel's
    /// btrfs_create_pending_block_groups). Returns whether there were any.
    pub(super) fn create_pending_chunks(&mut self) -> Result<bool> {
        if self.st.space.pending_chunks.is_empty() {
            return Ok(false);
        }
        let chunk_tree_uuid = self.st.chunk_tree_uuid;
        let mut touched = Vec::new();
        while let Some(p) = self.st.space.pending_chunks.pop() {
            self.st
                .insert_item(BTRFS_CHUNK_TREE_OBJECTID, &p.key, &p.item)?;
            for &(devid, x) in &p.placements {
                let de = DevExtent {
                    chunk_tree: BTRFS_CHUNK_TREE_OBJECTID.into(),
                    chunk_objectid: BTRFS_FIRST_CHUNK_TREE_OBJECTID.into(),
                    chunk_offset: p.key.offset.into(),
                    length: p.stripe.into(),
                    chunk_tree_uuid,
                };
                self.st.insert_item(
                    BTRFS_DEV_TREE_OBJECTID,
                    &Key::new(devid, BTRFS_DEV_EXTENT_KEY, x),
                    de.as_bytes(),
                )?;
                if !touched.contains(&devid) {
                    touched.push(devid);
                }
            }
        }
        self.write_dev_items_used(&touched)?;
        Ok(true)
    }

    /// Carry the in-memory `bytes_used` of each device in `devids` into
    /// its DEV_ITEM in the chunk tree, after chunks were added to or
    /// removed from it (the superblock's copy follows at commit).
    /// Give block group `start`, SINGLE or DUP, the mirrored profile
    /// `target` (DUP, RAID1, RAID1C3 or RAID1C4) where it lies: its first
    /// stripe stays as one copy, the others are written on new dev
    /// extents (a DUP group's second stripe goes), and the chunk item,
    /// dev extents, device usage and block group flags change in the
    /// caller's next commit. Logical addresses stay, so no tree changes:
    /// half the I/O of a relocation. Until that commit the new stripes
    /// lie in unallocated space, so a cut leaves the group as it was.
    /// Returns false, changing nothing, when it cannot be done in place
    /// (another profile, a system group, no room for a stripe).
    pub fn add_mirrors(&mut self, start: u64, target: u64) -> Result<bool> {
        let Some(g) = self.st.space.alloc.groups.get(&start) else {
            return Ok(false);
        };
        let (flags, len) = (g.flags, g.length);
        let old = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        let target = target & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        let mirrored = BTRFS_BLOCK_GROUP_DUP
            | BTRFS_BLOCK_GROUP_RAID1
            | BTRFS_BLOCK_GROUP_RAID1C3
            | BTRFS_BLOCK_GROUP_RAID1C4;
        if flags & BTRFS_BLOCK_GROUP_SYSTEM != 0
            || !(old == 0 || old == BTRFS_BLOCK_GROUP_DUP)
            || target & mirrored == 0
            || target.count_ones() != 1
            || old == target
            || (target == BTRFS_BLOCK_GROUP_DUP && old != 0)
        {
            return Ok(false);
        }
        let Some(m) = self.st.img.chunks.lookup(start).cloned() else {
            return Ok(false);
        };
        if m.logical != start || m.length != len || m.stripes.is_empty() {
            return Ok(false);
        }
        let (d0, _) = m.stripes[0];
        let Some(attr) = RaidAttr::of(target) else {
            return Ok(false);
        };
        let copies = attr.ncopies as usize;
        // Where the new stripes go: on the same device for DUP, else on as
        // many other devices, those with the most unallocated space first.
        let mut devids: Vec<(u64, u64)> = Vec::new();
        for (devid, _) in self.st.img.devices() {
            let Some(di) = self.st.space.dev_item_of(&self.st.sb, devid) else {
                continue;
            };
            let room = di.total_bytes.get().saturating_sub(di.bytes_used.get());
            devids.push((devid, room));
        }
        let wanted: Vec<u64> = if target == BTRFS_BLOCK_GROUP_DUP {
            vec![d0]
        } else {
            devids.sort_by_key(|&(d, room)| (std::cmp::Reverse(room), d));
            devids
                .iter()
                .map(|&(d, _)| d)
                .filter(|&d| d != d0)
                .collect()
        };
        let mut placed: Vec<(u64, u64)> = Vec::new();
        for devid in wanted {
            if placed.len() + 1 == copies {
                break;
            }
            let Some(di) = self.st.space.dev_item_of(&self.st.sb, devid) else {
                continue;
            };
            let free = self.unallocated(devid, di.total_bytes.get())?;
            if let Some(at) = stripe_hole(&free, len) {
                placed.push((devid, at));
            }
        }
        if placed.len() + 1 != copies {
            return Ok(false);
        }
        let r = self.write_mirrors(start, len, flags, target, &m, &placed);
        self.st.space.pending_stripes.clear();
        r.map(|_| true)
    }

    /// [`Chunks::add_mirrors`] once the new stripes are placed.
    fn write_mirrors(
        &mut self,
        start: u64,
        len: u64,
        flags: u64,
        target: u64,
        m: &crate::chunk::ChunkMapping,
        placed: &[(u64, u64)],
    ) -> Result<()> {
        self.st
            .space
            .pending_stripes
            .extend(placed.iter().map(|&(d, p)| (d, p, len)));
        let (d0, p0) = m.stripes[0];
        let copies = placed.len() + 1;
        // The copy: every allocated range of the group, from the kept
        // stripe to each new one.
        let src = self
            .st
            .img
            .device_of(d0)
            .cloned()
            .ok_or_else(|| Error::MissingDevice {
                devids: vec![d0],
                what: format!("the only copy of block group {start}"),
            })?;
        let free = self
            .st
            .space
            .alloc
            .groups
            .get(&start)
            .map(|g| g.free.clone())
            .unwrap_or_default();
        let mut used = RangeSet::new();
        used.insert(start, start + len);
        for (a, b) in free.iter() {
            used.remove(a, b);
        }
        src.prefetch(p0, len);
        const PIECE: u64 = 4 << 20;
        let mut buf = Vec::new();
        for (a, b) in used.iter() {
            let mut at = a;
            while at < b {
                let n = (b - at).min(PIECE);
                buf.resize(n as usize, 0);
                src.read_at(p0 + (at - start), &mut buf)?;
                for &(devid, phys) in placed {
                    let dev = self
                        .st
                        .img
                        .device_of(devid)
                        .ok_or_else(|| Error::Internal(format!("device {devid} vanished")))?;
                    dev.write_at(phys + (at - start), &buf)?;
                }
                at += n;
            }
        }
        for &(devid, _) in placed {
            if let Some(dev) = self.st.img.device_of(devid) {
                dev.flush()?;
            }
        }
        // The items.
        let ckey = Key::new(BTRFS_FIRST_CHUNK_TREE_OBJECTID, BTRFS_CHUNK_ITEM_KEY, start);
        let cdata = self
            .st
            .lookup(BTRFS_CHUNK_TREE_OBJECTID, &ckey)?
            .ok_or_else(|| {
                Error::corrupt_key_as(
                    crate::CorruptKind::ChunkMap,
                    "block group without chunk item",
                    start,
                    ckey,
                )
            })?;
        let (chunk, stripes) =
            crate::format::chunk::parse_chunk(&cdata).map_err(|e| e.at(start, ckey))?;
        let mut chunk: ChunkItem = *chunk;
        let kept: Stripe = stripes[0];
        let dropped: Vec<(u64, u64)> = m.stripes[1..].to_vec();
        let new_flags = (flags & !BTRFS_BLOCK_GROUP_PROFILE_MASK) | target;
        chunk.type_.set(new_flags);
        chunk.num_stripes.set(copies as u16);
        chunk.sub_stripes.set(1);
        let mut all = vec![kept];
        for &(devid, phys) in placed {
            let uuid = self
                .st
                .space
                .dev_item_of(&self.st.sb, devid)
                .map(|d| d.uuid)
                .unwrap_or_default();
            all.push(Stripe {
                devid: devid.into(),
                offset: phys.into(),
                dev_uuid: uuid,
            });
        }
        let mut item = chunk.as_bytes().to_vec();
        for st in &all {
            item.extend_from_slice(st.as_bytes());
        }
        self.st
            .update_item(BTRFS_CHUNK_TREE_OBJECTID, &ckey, &item)?;
        let chunk_tree_uuid = self.st.chunk_tree_uuid;
        let mut touched = Vec::new();
        for &(devid, phys) in placed {
            let de = DevExtent {
                chunk_tree: BTRFS_CHUNK_TREE_OBJECTID.into(),
                chunk_objectid: BTRFS_FIRST_CHUNK_TREE_OBJECTID.into(),
                chunk_offset: start.into(),
                length: len.into(),
                chunk_tree_uuid,
            };
            self.st.insert_item(
                BTRFS_DEV_TREE_OBJECTID,
                &Key::new(devid, BTRFS_DEV_EXTENT_KEY, phys),
                de.as_bytes(),
            )?;
            if let Some(mut di) = self.st.space.dev_item_of(&self.st.sb, devid) {
                di.bytes_used.set(di.bytes_used.get() + len);
                self.st.space.set_dev_item(&mut self.st.sb, devid, di);
            }
            touched.push(devid);
        }
        for &(devid, phys) in &dropped {
            self.st.delete_item(
                BTRFS_DEV_TREE_OBJECTID,
                &Key::new(devid, BTRFS_DEV_EXTENT_KEY, phys),
            )?;
            if let Some(mut di) = self.st.space.dev_item_of(&self.st.sb, devid) {
                di.bytes_used.set(di.bytes_used.get().saturating_sub(len));
                self.st.space.set_dev_item(&mut self.st.sb, devid, di);
            }
            touched.push(devid);
        }
        touched.sort_unstable();
        touched.dedup();
        self.write_dev_items_used(&touched)?;
        self.st.img.chunks.remove(start);
        self.st.img.chunks.insert(start, &chunk, &all)?;
        if let Some(g) = self.st.space.alloc.groups.get_mut(&start) {
            g.flags = new_flags;
            g.dirty = true;
        }
        Ok(())
    }

    /// Device `devid`'s size becomes `total_bytes` (btrfs_grow_device, the
    /// end of btrfs_shrink_device): its device item in the chunk tree and
    /// in the superblocks, and the superblock's total_bytes by the
    /// difference. Nothing past the new size may be allocated.
    pub fn set_device_size(&mut self, devid: u64, total_bytes: u64) -> Result<()> {
        let mut di = self
            .st
            .space
            .dev_item_of(&self.st.sb, devid)
            .ok_or_else(|| Error::Invalid(format!("no device {devid}")))?;
        let old = di.total_bytes.get();
        di.total_bytes.set(total_bytes);
        self.st.space.set_dev_item(&mut self.st.sb, devid, di);
        let t = self.st.sb.total_bytes.get();
        self.st
            .sb
            .total_bytes
            .set(t.saturating_add(total_bytes).saturating_sub(old));
        let dkey = Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid);
        let d = self
            .st
            .lookup(BTRFS_CHUNK_TREE_OBJECTID, &dkey)?
            .ok_or_else(|| {
                Error::corrupt_key_as(crate::CorruptKind::Device, "no device item", 0, dkey)
            })?;
        let mut item = DevItem::read_from_bytes(&d).map_err(|_| {
            Error::corrupt_key_as(crate::CorruptKind::Device, "dev item size", 0, dkey)
        })?;
        item.total_bytes.set(total_bytes);
        self.st
            .update_item(BTRFS_CHUNK_TREE_OBJECTID, &dkey, item.as_bytes())
    }

    /// Device `devid`'s item as the next commit writes it.
    pub fn device_item(&self, devid: u64) -> Option<DevItem> {
        self.st.space.dev_item_of(&self.st.sb, devid)
    }

    pub(super) fn write_dev_items_used(&mut self, devids: &[u64]) -> Result<()> {
        for &devid in devids {
            let Some(used) = self
                .st
                .space
                .dev_item_of(&self.st.sb, devid)
                .map(|d| d.bytes_used.get())
            else {
                continue;
            };
            let dkey = Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid);
            if let Some(d) = self.st.lookup(BTRFS_CHUNK_TREE_OBJECTID, &dkey)? {
                let mut di = DevItem::read_from_bytes(&d).map_err(|_| {
                    Error::corrupt_key_as(crate::CorruptKind::Device, "dev item size", 0, dkey)
                })?;
                di.bytes_used.set(used);
                self.st
                    .update_item(BTRFS_CHUNK_TREE_OBJECTID, &dkey, di.as_bytes())?;
            }
        }
        Ok(())
    }

    /// Allocate `len` bytes of type `ty`, adding a chunk when every group is full.
    /// `account`: the space counts as used (false for log tree blocks,
    /// which have no extent items).
    ///
    /// Data goes by size class as find_free_extent places it: a group of the
    /// extent's class, then one without a class, then a new chunk, and only
    /// when no chunk can be made a group of another class.
    pub fn alloc_space(&mut self, ty: u64, len: u64, align: u64, account: bool) -> Result<u64> {
        if ty == BTRFS_BLOCK_GROUP_DATA && self.st.space.alloc.size_classes {
            return self.alloc_data_space(len, align);
        }
        match self.st.space.alloc.alloc(ty, len, align, account) {
            Ok(b) => Ok(b),
            Err(Error::NoSpace(_)) => {
                // A new chunk needs system space for its chunk item first.
                if ty != BTRFS_BLOCK_GROUP_SYSTEM && !self.system_has_room()? {
                    self.alloc_chunk(BTRFS_BLOCK_GROUP_SYSTEM)?;
                }
                self.alloc_chunk(ty)?;
                self.st.space.alloc.alloc(ty, len, align, account)
            }
            Err(e) => Err(e),
        }
    }

    fn alloc_data_space(&mut self, len: u64, align: u64) -> Result<u64> {
        use crate::alloc::ClassPass;
        let ty = BTRFS_BLOCK_GROUP_DATA;
        for pass in [ClassPass::Same, ClassPass::Unset] {
            match self
                .st
                .space
                .alloc
                .alloc_in_class(ty, len, align, true, pass)
            {
                Err(Error::NoSpace(_)) => {}
                r => return r,
            }
        }
        // LOOP_ALLOC_CHUNK: a new chunk, whose group takes the class; a
        // device without room for one moves on to the wrong classes.
        if self.force_data_chunk()? {
            match self
                .st
                .space
                .alloc
                .alloc_in_class(ty, len, align, true, ClassPass::Unset)
            {
                Err(Error::NoSpace(_)) => {}
                r => return r,
            }
        }
        self.st
            .space
            .alloc
            .alloc_in_class(ty, len, align, true, ClassPass::Any)
    }

    /// Place data by size class from now on (what a mount does).
    pub fn use_size_classes(&mut self) {
        self.st.space.alloc.size_classes = true;
    }

    /// Bytes new data can take in the writable data block groups (space
    /// freed in this transaction is pinned until the commit and does not
    /// count).
    pub fn data_room(&mut self) -> Result<u64> {
        Ok(self
            .st
            .space
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
        self.st.space.alloc.largest_free(ty)
    }

    fn system_has_room(&self) -> Result<bool> {
        let ns = self.st.nodesize() as u64;
        let free: u64 = self
            .st
            .space
            .alloc
            .groups
            .values()
            .filter(|g| g.is_system() && !g.read_only)
            .map(|g| g.free.total())
            .sum();
        Ok(free >= 8 * ns)
    }
}

impl Chunks<'_> {
    /// Keep `[start, start+len)` out of allocation until the next commit is
    /// durable, without an extent item (log blocks during replay). Fails when
    /// the range is not free space of a block group.
    pub fn pin_range(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.st.space.alloc.group_of_mut(start).ok_or_else(|| {
            Error::corrupt_as(
                crate::CorruptKind::Allocation,
                format!("log block {start} outside every block group"),
                start,
            )
        })?;
        // Lengths come from the log: checked, never wrapped.
        if start.checked_add(len).is_none_or(|end| end > g.end()) {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Allocation,
                format!("log block {start}+{len} crosses the end of its block group"),
                start,
            ));
        }
        if g.pinned.contains(start, start + len) {
            return Ok(());
        }
        if !g.free.contains(start, start + len) {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Allocation,
                format!("log block {start} overlaps allocated space"),
                start,
            ));
        }
        g.free.remove(start, start + len);
        g.pinned.insert(start, start + len);
        Ok(())
    }

    /// A data extent written in the crashed transaction becomes allocated:
    /// it was pinned while the log was read, or is still free.
    pub fn account_data_extent(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.st.space.alloc.group_of_mut(start).ok_or_else(|| {
            Error::corrupt_as(
                crate::CorruptKind::Allocation,
                format!("logged data extent {start}+{len} outside every block group"),
                start,
            )
        })?;
        if start.checked_add(len).is_none_or(|end| end > g.end()) {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Allocation,
                format!("logged data extent {start}+{len} crosses the end of its block group"),
                start,
            ));
        }
        if g.pinned.contains(start, start + len) {
            g.pinned.remove(start, start + len);
        } else if g.free.contains(start, start + len) {
            g.free.remove(start, start + len);
        } else {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Allocation,
                format!("logged data extent {start}+{len} overlaps allocated space"),
                start,
            ));
        }
        g.used += len;
        g.dirty = true;
        Ok(())
    }
}

/// The first place in `free` (physical ranges of one device) for a
/// stripe of `len` bytes that holds no superblock copy (those bytes are
/// the superblock's, and the logical range over them may hold data).
fn stripe_hole(free: &RangeSet, len: u64) -> Option<u64> {
    const MIB: u64 = 1 << 20;
    for (a, b) in free.iter() {
        let mut at = a.div_ceil(MIB) * MIB;
        while at.checked_add(len).is_some_and(|e| e <= b) {
            let clash = (0..BTRFS_SUPER_MIRROR_MAX)
                .map(btrfs_sb_offset)
                .find(|&o| o < at + len && o + BTRFS_SUPER_INFO_SIZE as u64 > at);
            match clash {
                None => return Some(at),
                Some(o) => at = (o + BTRFS_SUPER_INFO_SIZE as u64).div_ceil(MIB) * MIB,
            }
        }
    }
    None
}
