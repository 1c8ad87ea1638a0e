//! Logical -> physical mapping. Bootstrapped from the superblock's
//! sys_chunk_array (enough to read the chunk tree), then filled from the
//! chunk tree. Every profile maps a logical range to where it lies on the
//! devices ([`ChunkMapping::map_range`]): the copies of the mirrored and
//! striped profiles, and for RAID5/6 the data stripe with the column of its
//! full stripe that rebuilds it ([`ParityColumn`], arithmetic in
//! [`parity`], writes in [`rmw`]).

pub mod parity;
pub mod rmw;

use crate::format::chunk::{parse_chunk, ChunkItem, Stripe, CHUNK_ITEM_SIZE, STRIPE_SIZE};
use crate::format::consts::*;
use crate::format::key::{DiskKey, Key};
use crate::format::superblock::Superblock;
use crate::CorruptKind;
use crate::{Error, Result};
use std::collections::BTreeMap;
use zerocopy::FromBytes;

/// One chunk's logical-to-physical mapping, built from a CHUNK_ITEM:
/// btrfs-progs' `struct map_lookup`, the kernel's `struct btrfs_chunk_map`.
/// Mirrored profiles keep a whole copy of the chunk on each stripe; RAID0
/// and RAID10 spread it over the stripes in units of `stripe_len`; RAID5
/// and RAID6 spread it over all but one (two) stripes of each row, the
/// parity rotating from row to row.
#[derive(Clone, Debug)]
pub struct ChunkMapping {
    /// Logical address of the chunk's first byte (the CHUNK_ITEM key offset).
    pub logical: u64,
    /// Size of the logical range in bytes (DUP takes twice this on disk).
    pub length: u64,
    /// `BTRFS_BLOCK_GROUP_*` type and profile bits (the chunk item's `type`).
    pub type_flags: u64,
    /// The chunk item's `stripe_len` in bytes (`BTRFS_STRIPE_LEN`, 64 KiB,
    /// when written by mkfs or the kernel): the unit RAID0 and RAID10
    /// stripe by; the mirrored profiles do not use it.
    pub stripe_len: u64,
    /// (devid, physical offset) of each stripe.
    pub stripes: Vec<(u64, u64)>,
    /// Stripes per mirrored set of RAID10 (2); 1 for the other profiles.
    pub sub_stripes: u16,
}

/// A piece of a logical range that lies in one stripe unit: every copy of
/// it, as (devid, physical offset), in mirror order (what
/// `btrfs_map_block` gives for a range inside one stripe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripePiece {
    /// Offset of the piece in the chunk.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Every copy of the piece: (devid, physical offset). RAID5/6 have one,
    /// the data stripe's, and the column in `parity`.
    pub copies: Vec<(u64, u64)>,
    /// RAID5/6: the piece's column of its full stripe (None for the other
    /// profiles). A write of the piece must go through [`rmw`], never to
    /// `copies` alone.
    pub parity: Option<ParityColumn>,
}

/// One column of a RAID5/6 full stripe: the same byte range of each stripe
/// of one row. Parity is computed column by column, so this is all a read
/// needs to rebuild the piece and all a write needs to keep P and Q right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParityColumn {
    /// (devid, physical offset) of the column on each stripe of the row:
    /// the data stripes in data order, then P, then Q (RAID6).
    pub stripes: Vec<(u64, u64)>,
    /// Parity stripes: 1 (RAID5) or 2 (RAID6).
    pub nparity: usize,
    /// Which data stripe holds the piece.
    pub index: usize,
    /// The row (full stripe number) in the chunk.
    pub row: u64,
}

impl ParityColumn {
    /// Data stripes of the row.
    pub fn ndata(&self) -> usize {
        self.stripes.len() - self.nparity
    }
}

impl ChunkMapping {
    /// Logical address one past the chunk's last byte.
    pub fn end(&self) -> u64 {
        self.logical + self.length
    }

    /// Parity stripes per row: 1 for RAID5, 2 for RAID6, 0 otherwise.
    pub fn nparity(&self) -> usize {
        nparity(self.type_flags)
    }

    /// Logical bytes of one full stripe (a row of data stripe units) of a
    /// RAID5/6 chunk; one stripe unit for the other profiles.
    pub fn full_stripe_len(&self) -> u64 {
        let n = self.stripes.len() as u64;
        self.stripe_len * n.saturating_sub(self.nparity() as u64).max(1)
    }

    /// `[offset, offset + len)` of the chunk, cut where it crosses from
    /// one stripe unit to the next, with every copy of each piece on
    /// every device, for the profiles SINGLE, DUP, RAID0, RAID1,
    /// RAID1C3, RAID1C4 and RAID10 (the kernel's `btrfs_map_block`:
    /// RAID0 puts stripe unit `n` on stripe `n % num_stripes`, row
    /// `n / num_stripes`; RAID10 puts it on the mirrored set
    /// `n % (num_stripes / sub_stripes)`; the others keep a whole copy of
    /// the chunk on each stripe). RAID5/6 put stripe unit `n` in row
    /// `r = n / d` (d data stripes) as data stripe `i = n % d`, on stripe
    /// `(r + i) % num_stripes`, P on `(r + d) % num_stripes` and Q on the
    /// next (the kernel's rotation in `btrfs_map_block`), each at `r`
    /// stripe units into its stripe.
    pub fn map_range(&self, offset: u64, len: u64) -> Result<Vec<StripePiece>> {
        let bad = |what: String| Error::corrupt_as(CorruptKind::ChunkMap, what, self.logical);
        if offset.checked_add(len).is_none_or(|e| e > self.length) {
            return Err(bad(format!(
                "range {offset}+{len} is outside chunk {}+{}",
                self.logical, self.length
            )));
        }
        let n = self.stripes.len() as u64;
        if n == 0 {
            return Err(bad(format!("chunk at {} has no stripe", self.logical)));
        }
        let phys = |s: (u64, u64), at: u64| {
            s.1.checked_add(at).map(|p| (s.0, p)).ok_or_else(|| {
                bad(format!(
                    "chunk at {} has a stripe at physical {} past any device",
                    self.logical, s.1
                ))
            })
        };
        let profile = self.type_flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        let np = self.nparity();
        let striped = np > 0 || profile & (BTRFS_BLOCK_GROUP_RAID0 | BTRFS_BLOCK_GROUP_RAID10) != 0;
        if np > 0 && n < np as u64 + 1 {
            return Err(bad(format!(
                "chunk at {} is {} with {n} stripes",
                self.logical,
                crate::format::names::block_group_flags_str(self.type_flags)
            )));
        }
        if !striped {
            let copies = self
                .stripes
                .iter()
                .map(|&s| phys(s, offset))
                .collect::<Result<Vec<_>>>()?;
            return Ok(vec![StripePiece {
                offset,
                len,
                copies,
                parity: None,
            }]);
        }
        let unit = self.stripe_len;
        if !unit.is_power_of_two() || unit < 4096 {
            return Err(bad(format!(
                "chunk at {} has stripe_len {unit}, not a power of two of at least 4096",
                self.logical
            )));
        }
        // Stripes per mirrored set: RAID10 keeps sub_stripes copies of each
        // unit side by side; RAID0 one.
        let sub = if profile & BTRFS_BLOCK_GROUP_RAID10 != 0 {
            u64::from(self.sub_stripes.max(1))
        } else {
            1
        };
        if !n.is_multiple_of(sub) {
            return Err(bad(format!(
                "chunk at {} has {n} stripes, not a multiple of sub_stripes {sub}",
                self.logical
            )));
        }
        let sets = n / sub;
        let mut out = Vec::new();
        let (mut at, end) = (offset, offset + len);
        let ndata = n - np as u64;
        while at < end {
            let unit_nr = at / unit;
            let in_unit = at % unit;
            let piece = (unit - in_unit).min(end - at);
            if np > 0 {
                let row = unit_nr / ndata;
                let index = unit_nr % ndata;
                let at_phys = row * unit + in_unit;
                let stripes = (0..n)
                    .map(|i| phys(self.stripes[((row + i) % n) as usize], at_phys))
                    .collect::<Result<Vec<_>>>()?;
                out.push(StripePiece {
                    offset: at,
                    len: piece,
                    copies: vec![stripes[index as usize]],
                    parity: Some(ParityColumn {
                        stripes,
                        nparity: np,
                        index: index as usize,
                        row,
                    }),
                });
                at += piece;
                continue;
            }
            let set = unit_nr % sets;
            let row = unit_nr / sets;
            let at_phys = row * unit + in_unit;
            let first = (set * sub) as usize;
            let copies = self.stripes[first..first + sub as usize]
                .iter()
                .map(|&s| phys(s, at_phys))
                .collect::<Result<Vec<_>>>()?;
            out.push(StripePiece {
                offset: at,
                len: piece,
                copies,
                parity: None,
            });
            at += piece;
        }
        Ok(out)
    }
}

/// How much of each device a chunk of `length` bytes over `num_stripes`
/// stripes takes (its dev extents' length): the whole chunk per copy for
/// the mirrored profiles, a share of it for the striped and parity ones
/// (the kernel's `btrfs_calc_stripe_length`).
pub fn stripe_length(flags: u64, length: u64, num_stripes: u64) -> u64 {
    let n = num_stripes.max(1);
    let p = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    let data_stripes = if p & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0 {
        n.saturating_sub(nparity(flags) as u64)
    } else {
        match RaidAttr::of(flags) {
            Some(a) => n / a.ncopies.max(1),
            None => 1,
        }
    };
    length / data_stripes.max(1)
}

/// Parity stripes per row of a chunk of block group `flags`: 1 for RAID5, 2
/// for RAID6, 0 for the other profiles.
pub fn nparity(flags: u64) -> usize {
    let p = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    if p & BTRFS_BLOCK_GROUP_RAID6 != 0 {
        2
    } else if p & BTRFS_BLOCK_GROUP_RAID5 != 0 {
        1
    } else {
        0
    }
}

/// What a profile asks of the devices a chunk is spread over (the kernel's
/// `btrfs_raid_array`): how many devices at least and at most (0: as many
/// as there are), in steps of `devs_increment`, stripes per device, copies
/// of each byte, stripes per mirrored set and parity stripes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaidAttr {
    /// Fewest devices a chunk can use.
    pub devs_min: u64,
    /// Most devices a chunk uses (0: every device with room).
    pub devs_max: u64,
    /// The device count is a multiple of this.
    pub devs_increment: u64,
    /// Stripes on each device (DUP: 2).
    pub dev_stripes: u64,
    /// Copies of every byte.
    pub ncopies: u64,
    /// Stripes of one mirrored set (RAID10: 2).
    pub sub_stripes: u64,
    /// Parity stripes (RAID5: 1, RAID6: 2).
    pub nparity: u64,
}

impl RaidAttr {
    /// The attributes of the profile in block group `flags` (SINGLE when no
    /// profile bit is set). Always Some; an Option for the callers that
    /// once had to refuse RAID5/6.
    pub fn of(flags: u64) -> Option<RaidAttr> {
        let a = |devs_min, devs_max, devs_increment, dev_stripes, ncopies, sub_stripes| RaidAttr {
            devs_min,
            devs_max,
            devs_increment,
            dev_stripes,
            ncopies,
            sub_stripes,
            nparity: 0,
        };
        let p = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        Some(if p & BTRFS_BLOCK_GROUP_RAID10 != 0 {
            a(2, 0, 2, 1, 2, 2)
        } else if p & BTRFS_BLOCK_GROUP_RAID1C4 != 0 {
            a(4, 4, 4, 1, 4, 1)
        } else if p & BTRFS_BLOCK_GROUP_RAID1C3 != 0 {
            a(3, 3, 3, 1, 3, 1)
        } else if p & BTRFS_BLOCK_GROUP_RAID1 != 0 {
            a(2, 2, 2, 1, 2, 1)
        } else if p & BTRFS_BLOCK_GROUP_DUP != 0 {
            a(1, 1, 1, 2, 2, 1)
        } else if p & BTRFS_BLOCK_GROUP_RAID0 != 0 {
            a(1, 0, 1, 1, 1, 1)
        } else if p & BTRFS_BLOCK_GROUP_RAID6 != 0 {
            RaidAttr {
                nparity: 2,
                ..a(3, 0, 1, 1, 1, 1)
            }
        } else if p & BTRFS_BLOCK_GROUP_RAID5 != 0 {
            RaidAttr {
                nparity: 1,
                ..a(2, 0, 1, 1, 1, 1)
            }
        } else {
            a(1, 1, 1, 1, 1, 1)
        })
    }
}

/// The profile new chunks get when block groups of a type use the
/// profiles `flags` (their union) and `num_devices` devices can be written
/// (the kernel's `btrfs_reduce_alloc_profile`): of the profiles those
/// devices allow, the most redundant one among `flags`; SINGLE (0) when
/// none is left, as on a RAID1 filesystem mounted degraded on one device.
pub fn reduce_profile(flags: u64, num_devices: u64) -> u64 {
    const ORDER: [u64; 8] = [
        BTRFS_BLOCK_GROUP_RAID1C4,
        BTRFS_BLOCK_GROUP_RAID6,
        BTRFS_BLOCK_GROUP_RAID1C3,
        BTRFS_BLOCK_GROUP_RAID5,
        BTRFS_BLOCK_GROUP_RAID10,
        BTRFS_BLOCK_GROUP_RAID1,
        BTRFS_BLOCK_GROUP_DUP,
        BTRFS_BLOCK_GROUP_RAID0,
    ];
    let devs_min = |p: u64| RaidAttr::of(p).map_or(u64::MAX, |a| a.devs_min);
    ORDER
        .into_iter()
        .find(|&p| flags & p != 0 && devs_min(p) <= num_devices)
        .unwrap_or(0)
}

/// Every chunk of the filesystem, keyed by logical start: the mapping tree
/// (`fs_info->mapping_tree` in btrfs-progs and the kernel). Chunks never
/// overlap.
#[derive(Clone, Debug, Default)]
pub struct ChunkMap {
    map: BTreeMap<u64, ChunkMapping>,
}

impl ChunkMap {
    /// An empty map.
    pub fn new() -> ChunkMap {
        ChunkMap::default()
    }

    /// Build the bootstrap map from the superblock's system chunk array:
    /// a sequence of (disk key, chunk item with stripes).
    pub fn from_sys_chunk_array(sb: &Superblock) -> Result<ChunkMap> {
        let arr = sb.sys_chunk_array();
        if sb.sys_chunk_array_size.get() as usize > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE {
            return Err(Error::corrupt_as(
                CorruptKind::Superblock,
                format!(
                    "superblock sys_chunk_array_size {} exceeds {BTRFS_SYSTEM_CHUNK_ARRAY_SIZE}",
                    sb.sys_chunk_array_size.get()
                ),
                BTRFS_SUPER_INFO_OFFSET,
            ));
        }
        let mut map = ChunkMap::new();
        let mut p = 0usize;
        while p < arr.len() {
            let dk = DiskKey::read_from_prefix(&arr[p..])
                .map_err(|_| {
                    Error::corrupt_as(
                        CorruptKind::Superblock,
                        format!("sys_chunk_array truncated key at offset {p}"),
                        BTRFS_SUPER_INFO_OFFSET,
                    )
                })?
                .0;
            let key = Key::from(dk);
            p += 17;
            if key.ty != BTRFS_CHUNK_ITEM_KEY {
                return Err(Error::corrupt_key_as(
                    CorruptKind::Superblock,
                    format!(
                        "sys_chunk_array entry at offset {} is not a chunk item",
                        p - 17
                    ),
                    BTRFS_SUPER_INFO_OFFSET,
                    key,
                ));
            }
            let rest = &arr[p..];
            let (c, s) = parse_chunk(rest).map_err(|e| e.at(BTRFS_SUPER_INFO_OFFSET, key))?;
            p += CHUNK_ITEM_SIZE + s.len() * STRIPE_SIZE;
            map.insert(key.offset, c, s)
                .map_err(|e| e.at(BTRFS_SUPER_INFO_OFFSET, key))?;
        }
        if map.map.is_empty() {
            return Err(Error::corrupt_as(
                CorruptKind::Superblock,
                "superblock sys_chunk_array holds no chunk",
                BTRFS_SUPER_INFO_OFFSET,
            ));
        }
        Ok(map)
    }

    /// A map of the one chunk `m`.
    pub fn of_one(m: ChunkMapping) -> ChunkMap {
        let mut map = BTreeMap::new();
        map.insert(m.logical, m);
        ChunkMap { map }
    }

    /// Forget the chunk at `logical` (removed by a balance).
    pub fn remove(&mut self, logical: u64) {
        self.map.remove(&logical);
    }

    /// Add a chunk. Chunks must not overlap, must have a sane length and a
    /// profile this engine can map (the insert of `read_one_chunk`). The same
    /// chunk added again with the same length (from the sys_chunk_array, then
    /// the chunk tree) replaces the first. A zero or overflowing length, no
    /// stripe, too few stripes for a parity profile, or an overlap is
    /// `Corrupt`.
    pub fn insert(&mut self, logical: u64, c: &ChunkItem, stripes: &[Stripe]) -> Result<()> {
        let length = c.length.get();
        if length == 0 || logical.checked_add(length).is_none() {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("chunk at {logical} has invalid length {length}"),
                0,
            ));
        }
        let ty = c.type_.get();
        if stripes.len() <= nparity(ty) {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!(
                    "chunk at {logical} is {} with {} stripes",
                    crate::format::names::block_group_flags_str(ty),
                    stripes.len()
                ),
                0,
            ));
        }
        if stripes.is_empty() {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("chunk at {logical} has no stripe"),
                0,
            ));
        }
        let m = ChunkMapping {
            logical,
            length,
            type_flags: ty,
            stripe_len: c.stripe_len.get(),
            stripes: stripes
                .iter()
                .map(|s| (s.devid.get(), s.offset.get()))
                .collect(),
            sub_stripes: c.sub_stripes.get(),
        };
        if let Some((_, prev)) = self.map.range(..=logical).next_back() {
            if prev.logical == logical {
                // The same chunk seen in sys_chunk_array and the chunk tree.
                if prev.length == length {
                    self.map.insert(logical, m);
                    return Ok(());
                }
            }
            if prev.end() > logical {
                return Err(Error::corrupt_as(
                    CorruptKind::ChunkMap,
                    format!("chunk at {logical} overlaps chunk at {}", prev.logical),
                    0,
                ));
            }
        }
        if let Some((&next, _)) = self.map.range(logical + 1..).next() {
            if next < logical + length {
                return Err(Error::corrupt_as(
                    CorruptKind::ChunkMap,
                    format!("chunk at {logical} overlaps chunk at {next}"),
                    0,
                ));
            }
        }
        self.map.insert(logical, m);
        Ok(())
    }

    /// The chunk holding logical address `logical`, if any (the kernel's
    /// `btrfs_find_chunk_map`).
    pub fn lookup(&self, logical: u64) -> Option<&ChunkMapping> {
        let (_, m) = self.map.range(..=logical).next_back()?;
        (logical < m.end()).then_some(m)
    }

    /// Every copy of `[logical, logical+len)`, as (devid, physical offset) in
    /// mirror order. The range must lie in one stripe unit of one chunk (a
    /// tree block always does; `leaf-crossing-stripes` is damage).
    pub fn copies(&self, logical: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let m = self.lookup(logical).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("logical address {logical} is outside every chunk"),
                logical,
            )
        })?;
        if logical.checked_add(len).is_none_or(|e| e > m.end()) {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!(
                    "range {logical}+{len} crosses the end of chunk {}+{}",
                    m.logical, m.length
                ),
                logical,
            ));
        }
        let mut pieces = m.map_range(logical - m.logical, len)?;
        if pieces.len() != 1 {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!(
                    "range {logical}+{len} crosses a stripe boundary of chunk {}",
                    m.logical
                ),
                logical,
            ));
        }
        Ok(pieces.swap_remove(0).copies)
    }

    /// `[logical, logical+len)` cut into pieces that each lie in one stripe
    /// unit of one chunk, with every copy of each (what a data write of any
    /// length becomes on a set of devices). Each piece's `offset` is its
    /// logical address. The range must be covered by chunks without a gap.
    pub fn pieces(&self, logical: u64, len: u64) -> Result<Vec<StripePiece>> {
        let mut out = Vec::new();
        let end = logical.checked_add(len).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("range {logical}+{len} overflows"),
                logical,
            )
        })?;
        let mut at = logical;
        // Each turn consumes a whole chunk's part of the range.
        while at < end {
            let m = self.lookup(at).ok_or_else(|| {
                Error::corrupt_as(
                    CorruptKind::ChunkMap,
                    format!("logical address {at} is outside every chunk"),
                    at,
                )
            })?;
            let upto = end.min(m.end());
            for mut p in m.map_range(at - m.logical, upto - at)? {
                p.offset += m.logical;
                out.push(p);
            }
            at = upto;
        }
        Ok(out)
    }

    /// Physical offsets of every copy of `[logical, logical+len)` on device
    /// `devid`, in mirror order (the writers of a single-device filesystem).
    /// The range must lie in one stripe unit of one chunk.
    pub fn map(&self, logical: u64, len: u64, devid: u64) -> Result<Vec<u64>> {
        let v: Vec<u64> = self
            .copies(logical, len)?
            .into_iter()
            .filter(|c| c.0 == devid)
            .map(|c| c.1)
            .collect();
        if v.is_empty() {
            return Err(Error::Unsupported(format!(
                "the chunk at logical {logical} has no copy on device {devid} (multi-device filesystem)",
            )));
        }
        Ok(v)
    }

    /// Every chunk, in ascending logical order.
    pub fn iter(&self) -> impl Iterator<Item = &ChunkMapping> {
        self.map.values()
    }
    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// True when no chunk is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn chunk(len: u64, ty: u64, stripes: &[(u64, u64)]) -> Vec<u8> {
        let c = ChunkItem {
            length: len.into(),
            owner: 2.into(),
            stripe_len: 65536.into(),
            type_: ty.into(),
            io_align: 65536.into(),
            io_width: 65536.into(),
            sector_size: 4096.into(),
            num_stripes: (stripes.len() as u16).into(),
            sub_stripes: 1.into(),
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
        v
    }

    fn mapping(ty: u64, sub: u16, stripes: &[(u64, u64)], length: u64) -> ChunkMapping {
        ChunkMapping {
            logical: 1 << 30,
            length,
            type_flags: BTRFS_BLOCK_GROUP_DATA | ty,
            stripe_len: BTRFS_STRIPE_LEN,
            stripes: stripes.to_vec(),
            sub_stripes: sub,
        }
    }

    /// Where byte `x` of the chunk lives, by the definition of each
    /// profile, one byte at a time.
    fn copies_of(m: &ChunkMapping, x: u64) -> Vec<(u64, u64)> {
        let unit = m.stripe_len;
        let n = m.stripes.len() as u64;
        let p = m.type_flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        let np = m.nparity() as u64;
        if np > 0 {
            let u = x / unit;
            let (row, i) = (u / (n - np), u % (n - np));
            let s = m.stripes[((row + i) % n) as usize];
            return vec![(s.0, s.1 + row * unit + x % unit)];
        }
        if p & BTRFS_BLOCK_GROUP_RAID0 != 0 {
            let u = x / unit;
            let s = m.stripes[(u % n) as usize];
            return vec![(s.0, s.1 + (u / n) * unit + x % unit)];
        }
        if p & BTRFS_BLOCK_GROUP_RAID10 != 0 {
            let sets = n / 2;
            let u = x / unit;
            let set = (u % sets) as usize;
            return m.stripes[set * 2..set * 2 + 2]
                .iter()
                .map(|s| (s.0, s.1 + (u / sets) * unit + x % unit))
                .collect();
        }
        m.stripes.iter().map(|s| (s.0, s.1 + x)).collect()
    }

    #[test]
    fn every_profile_maps_each_byte_where_its_definition_puts_it() {
        let mib = 1u64 << 20;
        let cases = [
            mapping(0, 1, &[(1, 10 * mib)], 8 * mib),
            mapping(
                BTRFS_BLOCK_GROUP_DUP,
                1,
                &[(1, 10 * mib), (1, 30 * mib)],
                8 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID1,
                1,
                &[(1, 10 * mib), (2, 20 * mib)],
                8 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID1C3,
                1,
                &[(3, 0), (1, mib), (2, 5 * mib)],
                8 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID1C4,
                1,
                &[(1, mib), (2, mib), (3, mib), (4, mib)],
                8 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID0,
                1,
                &[(1, mib), (2, 2 * mib), (3, 3 * mib)],
                6 * mib,
            ),
            mapping(BTRFS_BLOCK_GROUP_RAID0, 1, &[(2, 7 * mib)], 4 * mib),
            mapping(
                BTRFS_BLOCK_GROUP_RAID10,
                2,
                &[(1, mib), (2, mib), (3, 4 * mib), (4, 4 * mib)],
                4 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID10,
                2,
                &[(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0)],
                6 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID5,
                1,
                &[(1, mib), (2, 2 * mib), (3, 3 * mib)],
                8 * mib,
            ),
            mapping(BTRFS_BLOCK_GROUP_RAID5, 1, &[(1, 0), (2, 0)], 4 * mib),
            mapping(
                BTRFS_BLOCK_GROUP_RAID6,
                1,
                &[(1, 0), (2, mib), (3, 0), (4, 5 * mib), (5, 0)],
                6 * mib,
            ),
            mapping(
                BTRFS_BLOCK_GROUP_RAID6,
                1,
                &[(1, 0), (2, 0), (3, 0)],
                4 * mib,
            ),
        ];
        // Ranges inside a unit, across units, across rows, unaligned.
        let ranges = [
            (0u64, 4096u64),
            (65536 - 512, 1024),
            (3 * 65536 + 100, 5 * 65536),
            (200_000, 1_000_000),
            (mib, 2 * mib + 4096),
        ];
        for m in &cases {
            for &(off, len) in &ranges {
                let pieces = m.map_range(off, len).unwrap();
                let total: u64 = pieces.iter().map(|p| p.len).sum();
                assert_eq!(total, len, "{m:?} {off}+{len}");
                let mut at = off;
                for p in &pieces {
                    assert_eq!(p.offset, at);
                    // First, last and a middle byte of each piece.
                    for x in [p.offset, p.offset + p.len / 2, p.offset + p.len - 1] {
                        let want = copies_of(m, x);
                        let got: Vec<(u64, u64)> = p
                            .copies
                            .iter()
                            .map(|c| (c.0, c.1 + (x - p.offset)))
                            .collect();
                        assert_eq!(got, want, "{m:?} byte {x}");
                    }
                    at += p.len;
                }
            }
            assert!(m.map_range(m.length - 4096, 8192).is_err());
            assert!(m.map_range(u64::MAX - 10, 100).is_err());
        }
        // The parity of each row: the stripes the data does not use, P
        // first, rotating by one stripe per row.
        for m in &cases[9..] {
            let n = m.stripes.len() as u64;
            let np = m.nparity() as u64;
            for row in 0..6u64 {
                let off = row * m.full_stripe_len() + 4096;
                let piece = &m.map_range(off, 4096).unwrap()[0];
                let col = piece.parity.as_ref().unwrap();
                assert_eq!(col.row, row);
                assert_eq!(col.index, 0);
                assert_eq!(piece.copies, vec![col.stripes[0]]);
                let at = |k: u64| {
                    let s = m.stripes[((row + k) % n) as usize];
                    (s.0, s.1 + row * m.stripe_len + 4096)
                };
                assert_eq!(col.stripes[(n - np) as usize], at(n - np), "P of row {row}");
                if np == 2 {
                    assert_eq!(col.stripes[(n - 1) as usize], at(n - 1), "Q of row {row}");
                }
            }
        }
        let mut thin = cases[12].clone();
        thin.stripes.truncate(2);
        assert!(thin.map_range(0, 4096).is_err(), "raid6 on two stripes");
        let mut odd = cases[7].clone();
        odd.stripes.pop();
        assert!(odd.map_range(0, 4096).is_err());
        let mut unit = cases[5].clone();
        unit.stripe_len = 1000;
        assert!(unit.map_range(0, 4096).is_err());
        let mut far = cases[2].clone();
        far.stripes[1].1 = u64::MAX - 10;
        assert!(far.map_range(4096, 4096).is_err());
    }

    #[test]
    fn reduced_profiles_follow_the_devices_left() {
        use super::reduce_profile as r;
        let (r1, r10, c3, dup) = (
            BTRFS_BLOCK_GROUP_RAID1,
            BTRFS_BLOCK_GROUP_RAID10,
            BTRFS_BLOCK_GROUP_RAID1C3,
            BTRFS_BLOCK_GROUP_DUP,
        );
        assert_eq!(r(r1, 2), r1);
        assert_eq!(r(r1, 1), 0, "degraded raid1 on one device: single");
        assert_eq!(r(r10, 4), r10);
        assert_eq!(r(r10, 1), 0);
        assert_eq!(r(c3, 2), 0);
        assert_eq!(r(c3 | r1, 2), r1, "the most redundant the devices allow");
        assert_eq!(r(c3 | r1, 3), c3);
        assert_eq!(r(dup, 1), dup);
        assert_eq!(r(0, 3), 0);
        assert_eq!(r(BTRFS_BLOCK_GROUP_RAID0 | r1, 1), BTRFS_BLOCK_GROUP_RAID0);
    }

    #[test]
    fn pieces_cross_stripe_units_and_chunks_but_not_gaps() {
        let mib = 1u64 << 20;
        let mut m = ChunkMap::new();
        let a = chunk(
            4 * mib,
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0,
            &[(1, mib), (2, mib)],
        );
        let b = chunk(4 * mib, BTRFS_BLOCK_GROUP_DATA, &[(3, 9 * mib)]);
        let (ca, sa) = crate::format::chunk::parse_chunk(&a).unwrap();
        let (cb, sb) = crate::format::chunk::parse_chunk(&b).unwrap();
        m.insert(100 * mib, ca, sa).unwrap();
        m.insert(104 * mib, cb, sb).unwrap();
        // The last 96 KiB of the raid0 chunk (units 62 and 63 in part) and
        // the first 8 KiB of the single one.
        let start = 104 * mib - 96 * 1024;
        let p = m.pieces(start, 104 * 1024).unwrap();
        let got: Vec<(u64, u64, Vec<(u64, u64)>)> =
            p.into_iter().map(|p| (p.offset, p.len, p.copies)).collect();
        assert_eq!(
            got,
            vec![
                (start, 32 * 1024, vec![(1, mib + 31 * 65536 + 32 * 1024)]),
                (104 * mib - 65536, 65536, vec![(2, mib + 31 * 65536)]),
                (104 * mib, 8192, vec![(3, 9 * mib)]),
            ]
        );
        assert!(
            m.pieces(108 * mib - 4096, 8192).is_err(),
            "past the last chunk"
        );
        assert!(m.pieces(99 * mib, 8192).is_err(), "before the first");
    }

    #[test]
    fn dup_maps_to_two_copies_and_bounds() {
        let mut m = ChunkMap::new();
        let d = chunk(
            8 << 20,
            BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP,
            &[(1, 100 << 20), (1, 200 << 20)],
        );
        let (c, s) = parse_chunk(&d).unwrap();
        m.insert(30 << 20, c, s).unwrap();
        assert_eq!(
            m.map((30 << 20) + 4096, 4096, 1).unwrap(),
            vec![(100 << 20) + 4096, (200 << 20) + 4096]
        );
        assert!(m.map((38 << 20) - 4096, 8192, 1).is_err());
        assert!(m.map(1 << 20, 4096, 1).is_err());
        assert!(m.insert(31 << 20, c, s).is_err());
        // Found by fuzzing: a chunk ending at u64::MAX, or a stripe at a
        // physical offset near it, is an error and not an overflow.
        let mut top = ChunkMap::new();
        let d = chunk(1 << 20, BTRFS_BLOCK_GROUP_SYSTEM, &[(1, u64::MAX - 10)]);
        let (c, s) = parse_chunk(&d).unwrap();
        top.insert(u64::MAX - (1 << 20), c, s).unwrap();
        assert!(top.map(u64::MAX - 4096, 16384, 1).is_err());
        assert!(top.map(u64::MAX - (1 << 19), 4096, 1).is_err());
        // Striped over two devices: each device holds every other 64 KiB.
        let r = chunk(
            8 << 20,
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID0,
            &[(1, 1 << 30), (2, 2 << 30)],
        );
        let (c, s) = parse_chunk(&r).unwrap();
        m.insert(100 << 20, c, s).unwrap();
        let at = (100 << 20) + (3 << 16) + 512;
        assert_eq!(
            m.copies(at, 4096).unwrap(),
            vec![(2, (2 << 30) + (1 << 16) + 512)]
        );
        assert_eq!(
            m.map(at, 4096, 2).unwrap(),
            vec![(2 << 30) + (1 << 16) + 512]
        );
        assert!(matches!(m.map(at, 4096, 1), Err(Error::Unsupported(_))));
        // A range across a stripe unit has no single set of copies.
        assert!(m.copies((100 << 20) + (1 << 16) - 4096, 8192).is_err());
        let r6 = chunk(
            8 << 20,
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID6,
            &[(1, 0), (2, 0), (3, 0), (4, 0)],
        );
        let (c, s) = parse_chunk(&r6).unwrap();
        m.insert(200 << 20, c, s).unwrap();
        // The second unit of row 1 is data stripe 1 of that row: on stripe 2.
        assert_eq!(
            m.copies((200 << 20) + 3 * 65536, 4096).unwrap(),
            vec![(3, 65536)]
        );
        let r6 = chunk(
            8 << 20,
            BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_RAID6,
            &[(1, 0), (2, 0)],
        );
        let (c, s) = parse_chunk(&r6).unwrap();
        assert!(matches!(
            m.insert(300 << 20, c, s),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn stripe_length_per_profile() {
        use BTRFS_BLOCK_GROUP_DATA as D;
        let g = 1u64 << 30;
        assert_eq!(stripe_length(D, g, 1), g);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_DUP, g, 2), g);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_RAID1, g, 2), g);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_RAID1C3, g, 3), g);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_RAID0, g, 4), g / 4);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_RAID10, g, 4), g / 2);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_RAID5, 3 * g, 4), g);
        assert_eq!(stripe_length(D | BTRFS_BLOCK_GROUP_RAID6, 2 * g, 4), g);
        assert_eq!(
            RaidAttr::of(D | BTRFS_BLOCK_GROUP_RAID6).map(|a| a.nparity),
            Some(2)
        );
        assert_eq!(RaidAttr::of(D).map(|a| a.devs_max), Some(1));
    }
}
