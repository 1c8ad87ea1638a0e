//! Space allocation: block groups with their free space, kept exact in
//! memory during a transaction and written back to the extent tree (block
//! group `used`) and the free space tree at commit.
//!
//! Per block group, the bytes are in exactly one of: `free` (allocatable),
//! `pinned` (freed in the running transaction but still referenced by the
//! committed trees, so not reusable until the commit is durable), excluded
//! (superblock stripes, never allocatable and never free in the free space
//! tree), or allocated. The free space tree after commit lists
//! `free ∪ pinned`.

pub mod rangeset;

use crate::chunk::ChunkMap;
use crate::format::consts::*;
use crate::CorruptKind;
use crate::{Error, Result};
pub use rangeset::RangeSet;
use std::collections::BTreeMap;

/// One block group, the in-memory counterpart of the kernel's `struct
/// btrfs_block_group`, with its free space kept as exact logical byte ranges
/// instead of a free space cache. Every byte of `[start, end())` is in
/// exactly one of `free`, `pinned`, `excluded` or allocated (see the module
/// docs); `used` counts the allocated bytes that extent items describe.
#[derive(Clone, Debug)]
pub struct BlockGroup {
    /// Logical address of the first byte (the block group item's key objectid).
    pub start: u64,
    /// Size in bytes (the item's key offset); the length of its chunk.
    pub length: u64,
    /// `BTRFS_BLOCK_GROUP_*` type (DATA, METADATA, SYSTEM; DATA|METADATA when
    /// mixed) and profile bits, as in the block group item and its chunk.
    pub flags: u64,
    /// Bytes allocated (the block group item's `used`).
    pub used: u64,
    /// Allocatable ranges, logical byte addresses.
    pub free: RangeSet,
    /// Freed in the running transaction but still referenced by the committed
    /// trees; becomes `free` in [`Allocator::unpin_all`] once the commit is
    /// durable (the kernel's pinned extents, released by
    /// `btrfs_finish_extent_commit`).
    pub pinned: RangeSet,
    /// The 64 KiB stripes holding superblock copies, and logical addresses
    /// below 64 KiB ([`super_stripes`]): never allocatable and never free in
    /// the free space tree (the kernel's `exclude_super_stripes`).
    pub excluded: RangeSet,
    /// Block group item or free space tree must be rewritten at commit.
    pub dirty: bool,
    /// Free space tree format of this group (bitmaps or extents).
    pub fst_bitmaps: bool,
    /// Block group item found on disk (false for groups created this transaction).
    pub on_disk: bool,
    /// Takes no new allocations (being emptied by a balance).
    pub read_only: bool,
    /// The size of the extents a data-only group takes (block-group.c's
    /// size classes, runtime only): set by its first allocation, or at
    /// mount from a sample of its extents.
    pub size_class: SizeClass,
}

/// The size classes of data extents (btrfs_block_group_size_class): a data
/// block group holds extents of one class, so small and large files do not
/// fragment each other's space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SizeClass {
    /// No extent allocated yet (any class may claim it).
    #[default]
    None,
    /// At most 128 KiB.
    Small,
    /// At most 8 MiB.
    Medium,
    /// Larger.
    Large,
}

impl SizeClass {
    /// The class of an extent of `len` bytes (btrfs_calc_block_group_size_class).
    pub fn of(len: u64) -> SizeClass {
        if len <= 128 << 10 {
            SizeClass::Small
        } else if len <= 8 << 20 {
            SizeClass::Medium
        } else {
            SizeClass::Large
        }
    }
}

/// Which data block groups an allocation may use, in the order
/// find_free_extent widens its search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassPass {
    /// Groups of the extent's own class (and groups classes do not apply to).
    Same,
    /// Also groups without a class yet (LOOP_UNSET_SIZE_CLASS).
    Unset,
    /// Any group (LOOP_WRONG_SIZE_CLASS, after a new chunk was refused).
    Any,
}

impl BlockGroup {
    /// Logical address one past the group's last byte.
    pub fn end(&self) -> u64 {
        self.start + self.length
    }
    /// Holds data (`BTRFS_BLOCK_GROUP_DATA`, also set on a mixed group).
    pub fn is_data(&self) -> bool {
        self.flags & BTRFS_BLOCK_GROUP_DATA != 0
    }
    /// Holds tree blocks (`BTRFS_BLOCK_GROUP_METADATA`, also set on a mixed group).
    pub fn is_metadata(&self) -> bool {
        self.flags & BTRFS_BLOCK_GROUP_METADATA != 0
    }
    /// Holds chunk tree blocks (`BTRFS_BLOCK_GROUP_SYSTEM`).
    pub fn is_system(&self) -> bool {
        self.flags & BTRFS_BLOCK_GROUP_SYSTEM != 0
    }
    /// Whether size classes apply: a data-only group
    /// (btrfs_block_group_should_use_size_class).
    pub fn uses_size_class(&self) -> bool {
        self.flags & BTRFS_BLOCK_GROUP_TYPE_MASK == BTRFS_BLOCK_GROUP_DATA
    }

    /// Whether an extent of class `c` may go here in `pass`
    /// (find_free_extent_check_size_class).
    pub fn takes_class(&self, c: SizeClass, pass: ClassPass) -> bool {
        if !self.uses_size_class() || pass == ClassPass::Any {
            return true;
        }
        self.size_class == c || (pass == ClassPass::Unset && self.size_class == SizeClass::None)
    }

    /// What the free space tree must say is free.
    pub fn fst_free(&self) -> RangeSet {
        let mut f = self.free.clone();
        for (s, e) in self.pinned.iter() {
            f.insert(s, e);
        }
        f
    }
}

/// Logical ranges of `[start, start+length)` that hold superblock copies,
/// one stripe unit (64 KiB) each, on any device of the chunk, plus any
/// logical address below 64 KiB (`BTRFS_SUPER_INFO_OFFSET`): the ranges the
/// kernel's `exclude_super_stripes` takes out of a block group, found by
/// `btrfs_rmap_block`'s arithmetic (for RAID5/6 the whole full stripe of
/// the row the copy sits in).
/// `dev_size(devid)` is a device's size (None: unknown, every copy counts).
pub fn super_stripes(
    chunks: &ChunkMap,
    start: u64,
    length: u64,
    dev_size: &dyn Fn(u64) -> Option<u64>,
) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let end = start + length;
    if start < BTRFS_SUPER_INFO_OFFSET {
        out.push((start, BTRFS_SUPER_INFO_OFFSET.min(end)));
    }
    let Some(m) = chunks.lookup(start) else {
        return out;
    };
    let profile = m.type_flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    let n = m.stripes.len().max(1) as u64;
    let sub = u64::from(m.sub_stripes.max(1));
    // How much of each stripe the chunk fills, and which stripe unit of the
    // chunk the `nr`th unit of stripe `i` is.
    let per_stripe = crate::chunk::stripe_length(m.type_flags, m.length, n);
    let sets = (n / sub).max(1);
    let np = m.nparity() as u64;
    let unit_of = |nr: u64, i: u64| {
        if np > 0 {
            nr * n.saturating_sub(np).max(1)
        } else if profile & BTRFS_BLOCK_GROUP_RAID0 != 0 {
            nr * n + i
        } else if profile & BTRFS_BLOCK_GROUP_RAID10 != 0 {
            nr * sets + i / sub
        } else {
            nr
        }
    };
    let unit = BTRFS_STRIPE_LEN;
    for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
        let phys = btrfs_sb_offset(mirror);
        for (i, &(devid, pstart)) in m.stripes.iter().enumerate() {
            if mirror > 0 && dev_size(devid).is_some_and(|z| phys >= z) {
                continue;
            }
            if phys < pstart || phys >= pstart.saturating_add(per_stripe) {
                continue;
            }
            let nr = (phys - pstart) / unit;
            let l = m.logical + unit_of(nr, i as u64) * unit;
            let span = if np > 0 { m.full_stripe_len() } else { unit };
            let e = (l + span).min(m.end());
            let (a, b) = (l.max(start), e.min(end));
            if a < b {
                out.push((a, b));
            }
        }
    }
    out
}

/// Every block group of the filesystem and the extent allocator over them:
/// the part of the kernel's `find_free_extent` and block group cache a
/// single-device engine needs. Allocation is next fit per group type, so a
/// transaction's blocks come out contiguous.
#[derive(Clone, Debug, Default)]
pub struct Allocator {
    /// Every block group, keyed by its logical start.
    pub groups: BTreeMap<u64, BlockGroup>,
    /// Next-fit cursors per group type, so consecutive allocations are
    /// contiguous and searches do not restart from the front.
    cursor: BTreeMap<u64, u64>,
    /// Data extents go by size class (the kernel's find_free_extent; a
    /// mount sets it). Off, as in btrfs-progs, for mkfs and offline tools.
    pub size_classes: bool,
}

impl Allocator {
    /// The block group holding logical address `bytenr`, if any (the kernel's
    /// `btrfs_lookup_block_group`).
    pub fn group_of(&self, bytenr: u64) -> Option<&BlockGroup> {
        let (_, g) = self.groups.range(..=bytenr).next_back()?;
        (bytenr < g.end()).then_some(g)
    }
    /// Mutable [`group_of`](Self::group_of).
    pub fn group_of_mut(&mut self, bytenr: u64) -> Option<&mut BlockGroup> {
        let (_, g) = self.groups.range_mut(..=bytenr).next_back()?;
        (bytenr < g.end()).then_some(g)
    }

    /// Allocate `len` bytes in a group whose type is `ty` (DATA, METADATA
    /// or SYSTEM); mixed groups serve both data and metadata. Space not
    /// `account`ed (log tree blocks) is taken from the free space without
    /// counting as used: no extent item will describe it.
    pub fn alloc(&mut self, ty: u64, len: u64, align: u64, account: bool) -> Result<u64> {
        self.alloc_in_class(ty, len, align, account, ClassPass::Any)
    }

    /// [`alloc`](Self::alloc) among the groups `pass` allows an extent of
    /// `len` bytes; a data-only group without a class takes the extent's.
    pub fn alloc_in_class(
        &mut self,
        ty: u64,
        len: u64,
        align: u64,
        account: bool,
        pass: ClassPass,
    ) -> Result<u64> {
        let class = SizeClass::of(len);
        let hint = self.cursor.get(&ty).copied().unwrap_or(0);
        let starts: Vec<u64> = self
            .groups
            .values()
            .filter(|g| g.flags & ty != 0)
            .map(|g| g.start)
            .collect();
        // Next fit: begin in the group holding the cursor, then wrap around.
        let first = starts
            .iter()
            .position(|&s| self.groups.get(&s).is_some_and(|g| g.end() > hint))
            .unwrap_or(0);
        for i in 0..starts.len() {
            let s = starts[(first + i) % starts.len()];
            let g = self
                .groups
                .get_mut(&s)
                .ok_or_else(|| Error::Internal("block group vanished".into()))?;
            if g.read_only || g.length - g.used < len || !g.takes_class(class, pass) {
                continue;
            }
            let h = if i == 0 { hint } else { g.start };
            if let Some(at) = g.free.find(g.start, g.end(), len, align, h) {
                g.free.remove(at, at + len);
                if g.uses_size_class() && g.size_class == SizeClass::None {
                    g.size_class = class;
                }
                if account {
                    g.used += len;
                    g.dirty = true;
                }
                self.cursor.insert(ty, at + len);
                return Ok(at);
            }
        }
        Err(Error::NoSpace(format!(
            "no free {len}-byte extent in any {} block group",
            crate::format::names::block_group_flags_str(ty)
                .split('|')
                .next()
                .unwrap_or("?")
        )))
    }

    /// The longest free piece, in bytes, any writable group of type `ty`
    /// has (what find_free_extent reports as max_extent_size).
    pub fn largest_free(&self, ty: u64) -> u64 {
        self.groups
            .values()
            .filter(|g| g.flags & ty != 0 && !g.read_only)
            .flat_map(|g| g.free.iter_in(g.start, g.end()))
            .map(|(s, e)| e - s)
            .max()
            .unwrap_or(0)
    }

    /// Mark `[bytenr, +len)` allocated (replaying a known allocation).
    pub fn reserve(&mut self, bytenr: u64, len: u64) -> Result<()> {
        let g = self.group_of_mut(bytenr).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Allocation,
                format!("extent {bytenr}+{len} outside every block group"),
                bytenr,
            )
        })?;
        if !g.free.contains(bytenr, bytenr + len) {
            return Err(Error::corrupt_as(
                CorruptKind::Allocation,
                format!("extent {bytenr}+{len} is not free"),
                bytenr,
            ));
        }
        g.free.remove(bytenr, bytenr + len);
        g.used += len;
        g.dirty = true;
        Ok(())
    }

    /// Keep whatever of `[start, end)` is free out of allocation until the
    /// next commit is durable, as pinned space (free again after it, so
    /// the free space tree still shows it free). Parts outside every block
    /// group, or already allocated, are left as they are.
    pub fn pin_free(&mut self, start: u64, end: u64) {
        let lo = self
            .groups
            .range(..=start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        for g in self.groups.range_mut(lo..end).map(|(_, g)| g) {
            let (a, b) = (start.max(g.start), end.min(g.end()));
            if a >= b {
                continue;
            }
            let free: Vec<(u64, u64)> = g.free.iter_in(a, b).collect();
            for (x, y) in free {
                let (x, y) = (x.max(a), y.min(b));
                if x < y {
                    g.free.remove(x, y);
                    g.pinned.insert(x, y);
                }
            }
        }
    }

    /// Release an extent. `committed` extents stay pinned until the running
    /// transaction is durable; extents allocated in it are free at once.
    pub fn release(&mut self, bytenr: u64, len: u64, committed: bool) -> Result<()> {
        let g = self.group_of_mut(bytenr).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Allocation,
                format!("freed extent {bytenr}+{len} outside every block group"),
                bytenr,
            )
        })?;
        g.used = g.used.saturating_sub(len);
        g.dirty = true;
        if committed {
            g.pinned.insert(bytenr, bytenr + len);
        } else {
            g.free.insert(bytenr, bytenr + len);
        }
        Ok(())
    }

    /// Release space taken without accounting (a log tree block): free at
    /// once, or pinned until the commit when it was written.
    pub fn release_unaccounted(&mut self, bytenr: u64, len: u64, pinned: bool) -> Result<()> {
        let g = self.group_of_mut(bytenr).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Allocation,
                format!("freed log block {bytenr}+{len} outside every block group"),
                bytenr,
            )
        })?;
        if pinned {
            // The free space tree never lost it: nothing to rewrite.
            g.pinned.insert(bytenr, bytenr + len);
        } else {
            g.free.insert(bytenr, bytenr + len);
        }
        Ok(())
    }

    /// Every pinned range.
    pub fn pinned_ranges(&self) -> Vec<(u64, u64)> {
        self.groups.values().flat_map(|g| g.pinned.iter()).collect()
    }

    /// After a commit is durable, pinned space becomes allocatable.
    pub fn unpin_all(&mut self) {
        for g in self.groups.values_mut() {
            let p = std::mem::take(&mut g.pinned);
            for (s, e) in p.iter() {
                g.free.insert(s, e);
            }
        }
    }

    /// Bytes allocated in every group together: the superblock's `bytes_used`
    /// at commit.
    pub fn total_used(&self) -> u64 {
        self.groups.values().map(|g| g.used).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::chunk::{parse_chunk, ChunkItem, Stripe};
    use zerocopy::IntoBytes;

    fn map_with(logical: u64, len: u64, ty: u64, sub: u16, stripes: &[(u64, u64)]) -> ChunkMap {
        let c = ChunkItem {
            length: len.into(),
            owner: 2.into(),
            stripe_len: BTRFS_STRIPE_LEN.into(),
            type_: ty.into(),
            io_align: 65536.into(),
            io_width: 65536.into(),
            sector_size: 4096.into(),
            num_stripes: (stripes.len() as u16).into(),
            sub_stripes: sub.into(),
        };
        let mut v = c.as_bytes().to_vec();
        for &(d, o) in stripes {
            v.extend_from_slice(
                Stripe {
                    devid: d.into(),
                    offset: o.into(),
                    dev_uuid: [0; 16],
                }
                .as_bytes(),
            );
        }
        let (c, s) = parse_chunk(&v).unwrap();
        let mut m = ChunkMap::new();
        m.insert(logical, c, s).unwrap();
        m
    }

    /// The superblock copy at 64 MiB of each device, mapped back to the
    /// logical stripe unit holding it (btrfs_rmap_block).
    #[test]
    fn superblock_copies_map_back_through_the_stripes() {
        let sb1 = btrfs_sb_offset(1);
        let l = 1 << 30;
        let none = |_| None;
        // RAID0 over two devices: device 2's stripe starts 1 MiB before the
        // copy, so it is that stripe's unit 16, the chunk's unit 33.
        let m = map_with(
            l,
            512 << 20,
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0,
            1,
            &[(1, 200 << 20), (2, sb1 - (1 << 20))],
        );
        let u = l + 33 * BTRFS_STRIPE_LEN;
        assert_eq!(
            super_stripes(&m, l, 512 << 20, &none),
            vec![(u, u + BTRFS_STRIPE_LEN)]
        );
        // RAID10 over four devices (two mirrored sets): stripes 2 and 3 are
        // the second set; both hold the copy at the same row, one unit.
        let m = map_with(
            l,
            512 << 20,
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID10,
            2,
            &[
                (1, 300 << 20),
                (2, 300 << 20),
                (3, sb1 - (2 << 20)),
                (4, sb1 - (2 << 20)),
            ],
        );
        let u = l + (32 * 2 + 1) * BTRFS_STRIPE_LEN;
        assert_eq!(
            super_stripes(&m, l, 512 << 20, &none),
            vec![(u, u + BTRFS_STRIPE_LEN), (u, u + BTRFS_STRIPE_LEN)]
        );
        // A copy past a device's end is not looked for.
        let m = map_with(
            l,
            256 << 20,
            BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_RAID1,
            1,
            &[(1, sb1 - (1 << 20)), (2, sb1 - (1 << 20))],
        );
        let small = |d: u64| Some(if d == 1 { sb1 } else { 1 << 40 });
        let u = l + 16 * BTRFS_STRIPE_LEN;
        assert_eq!(
            super_stripes(&m, l, 256 << 20, &small),
            vec![(u, u + BTRFS_STRIPE_LEN)]
        );
    }
}
