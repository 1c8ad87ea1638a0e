//! What a heatmap of a filesystem shows, as btrfs-heatmap draws it: an
//! address space (one device's physical bytes, or the logical space of
//! all chunks) cut into equal cells, each with the bytes of it that
//! block groups of each type take and the bytes of it that extents use.
//! Drawing the cells (on a Hilbert curve, as PNG or on a terminal) is the
//! caller's part.
//!
//! Memory is bounded by the number of cells and chunks whatever the size
//! of the filesystem: allocation comes from the chunk map, use from one
//! pass over the extent tree's keys, each range spread over the cells it
//! covers.

use crate::chunk::{stripe_length, ChunkMapping};
use crate::format::consts::*;
use crate::format::item::ItemBody;
use crate::format::key::Key;
use crate::image::Image;
use crate::tree::search::TreeIter;
use crate::{Error, Result};

/// Most cells a heatmap may have: 1024 x 1024 pixels (btrfs-heatmap's
/// default picture), 40 MiB of cells.
pub const MAX_CELLS: u64 = 1 << 20;

/// The address space a heatmap covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// One device's bytes from 0 to its device item's `total_bytes`: where
    /// its dev extents lie, every copy of every chunk on it.
    Physical(u64),
    /// The logical bytes of every chunk, the chunks laid end to end in
    /// logical order without the holes between them (as btrfs-heatmap's
    /// virtual view does): each byte once, whatever its copies.
    Logical,
}

/// A block group's type, from its chunk's type flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// DATA.
    Data = 0,
    /// METADATA.
    Metadata = 1,
    /// SYSTEM (the chunk tree's).
    System = 2,
    /// DATA and METADATA together (mixed block groups).
    Mixed = 3,
}

impl Kind {
    /// The type of a chunk with block group flags `flags`.
    pub fn of(flags: u64) -> Kind {
        if flags & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
            Kind::System
        } else if flags & BTRFS_BLOCK_GROUP_DATA != 0 && flags & BTRFS_BLOCK_GROUP_METADATA != 0 {
            Kind::Mixed
        } else if flags & BTRFS_BLOCK_GROUP_METADATA != 0 {
            Kind::Metadata
        } else {
            Kind::Data
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Data => "data",
            Kind::Metadata => "metadata",
            Kind::System => "system",
            Kind::Mixed => "mixed",
        }
    }

    const ALL: [Kind; 4] = [Kind::Data, Kind::Metadata, Kind::System, Kind::Mixed];
}

/// One cell: bytes of it allocated to block groups of each type (indexed
/// by [`Kind`]) and bytes of it used by extents. `used` never exceeds the
/// allocated sum: use outside any allocation is not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    /// Allocated bytes by [`Kind`] as index.
    pub allocated: [u64; 4],
    /// Used bytes.
    pub used: u64,
}

impl Cell {
    /// Allocated bytes of every type.
    pub fn allocated_total(&self) -> u64 {
        self.allocated.iter().sum()
    }

    /// The type taking most of the cell's allocated bytes (ties to the
    /// lower [`Kind`]), None when nothing of it is allocated.
    pub fn kind(&self) -> Option<Kind> {
        let mut best: Option<Kind> = None;
        for k in Kind::ALL {
            let b = self.allocated[k as usize];
            if b > 0 && best.is_none_or(|c| b > self.allocated[c as usize]) {
                best = Some(k);
            }
        }
        best
    }
}

/// A heatmap: `cells[i]` covers bytes `[i * bytes_per_cell, (i + 1) *
/// bytes_per_cell)` of the space, the last one up to `total`.
#[derive(Clone, Debug)]
pub struct Heatmap {
    /// The space covered.
    pub space: Space,
    /// Bytes of the space.
    pub total: u64,
    /// Bytes per cell (the last cell may have fewer): `total` over the
    /// cells asked for, rounded up, at least 1.
    pub bytes_per_cell: u64,
    /// The cells; as many as asked for (those past `total` empty).
    pub cells: Vec<Cell>,
    /// Allocated bytes of the space by [`Kind`] as index.
    pub allocated: [u64; 4],
    /// Used bytes of the space.
    pub used: u64,
    /// What could not be placed: extents outside every chunk, ranges past
    /// the end of the space, an extent tree that could not be read to its
    /// end (the map then shows what was read before).
    pub warnings: Vec<String>,
}

impl Heatmap {
    /// Bytes of the space in cell `i`.
    pub fn cell_bytes(&self, i: usize) -> u64 {
        let start = (i as u64).saturating_mul(self.bytes_per_cell);
        self.total.saturating_sub(start).min(self.bytes_per_cell)
    }

    /// How full cell `i` is: used bytes over the bytes of the space in it
    /// (0 to 1; unallocated bytes count as empty, as btrfs-heatmap does).
    pub fn fill(&self, i: usize) -> f64 {
        let b = self.cell_bytes(i);
        if b == 0 {
            return 0.0;
        }
        (self.cells[i].used.min(b) as f64) / (b as f64)
    }

    /// The same space in `cells.len() / factor` cells, each the sum of
    /// `factor` consecutive ones (a smaller picture of one scan).
    pub fn merged(&self, factor: usize) -> Heatmap {
        let factor = factor.max(1);
        let cells = self
            .cells
            .chunks(factor)
            .map(|g| {
                let mut c = Cell::default();
                for x in g {
                    for k in 0..4 {
                        c.allocated[k] += x.allocated[k];
                    }
                    c.used += x.used;
                }
                c
            })
            .collect();
        Heatmap {
            space: self.space,
            total: self.total,
            bytes_per_cell: self.bytes_per_cell.saturating_mul(factor as u64),
            cells,
            allocated: self.allocated,
            used: self.used,
            warnings: self.warnings.clone(),
        }
    }

    fn new(space: Space, total: u64, ncells: u64) -> Heatmap {
        Heatmap {
            space,
            total,
            bytes_per_cell: total.div_ceil(ncells).max(1),
            cells: vec![Cell::default(); ncells as usize],
            allocated: [0; 4],
            used: 0,
            warnings: Vec::new(),
        }
    }

    /// Spread `[start, start + len)` of the space over its cells with
    /// `add(cell, bytes)`; the part past `total` is dropped and returned.
    /// The work is one step per cell covered, at most the cell count.
    fn spread(&mut self, start: u64, len: u64, mut add: impl FnMut(&mut Cell, u64)) -> u64 {
        let end = start.saturating_add(len).min(self.total);
        if start >= end {
            return len;
        }
        let bpc = self.bytes_per_cell;
        let mut at = start;
        while at < end {
            let i = (at / bpc) as usize;
            let upto = ((i as u64 + 1).saturating_mul(bpc)).min(end);
            if let Some(c) = self.cells.get_mut(i) {
                add(c, upto - at);
            }
            at = upto;
        }
        len - (end - start)
    }

    fn add_allocated(&mut self, start: u64, len: u64, kind: Kind) -> u64 {
        let k = kind as usize;
        let lost = self.spread(start, len, |c, b| c.allocated[k] += b);
        self.allocated[k] += len - lost;
        lost
    }

    fn add_used(&mut self, start: u64, len: u64) {
        let mut added = 0;
        self.spread(start, len, |c, b| {
            // Overlapping extents (damage) or parity shares must not make
            // a cell fuller than what is allocated of it.
            let room = c.allocated_total().saturating_sub(c.used);
            let b = b.min(room);
            c.used += b;
            added += b;
        });
        self.used += added;
    }
}

/// Every device of the filesystem with its size, from the chunk tree's
/// device items: (devid, total_bytes), ascending.
pub fn device_sizes(img: &Image) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut it = TreeIter::new(
        img,
        img.chunk_tree(),
        Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, 0),
    )?;
    while let Some(r) = it.next_item() {
        let item = r?;
        if item.key.objectid != BTRFS_DEV_ITEMS_OBJECTID || item.key.ty != BTRFS_DEV_ITEM_KEY {
            break;
        }
        let (_, body) = item
            .decode(img.csum.size())
            .map_err(|e| e.at(item.node.bytenr, item.key))?;
        if let ItemBody::DevItem(d) = body {
            out.push((item.key.offset, d.total_bytes.get()));
        }
    }
    if out.is_empty() {
        return Err(Error::Invalid("the chunk tree has no device item".into()));
    }
    Ok(out)
}

/// Cells of at most [`MAX_CELLS`], or an error naming the limit.
fn check_cells(ncells: u64) -> Result<()> {
    if ncells == 0 || ncells > MAX_CELLS {
        return Err(Error::Invalid(format!(
            "a heatmap has 1 to {MAX_CELLS} cells, not {ncells}"
        )));
    }
    Ok(())
}

/// Logical bytes of a chunk are placed at `chunk start + offset` of the
/// logical space: where each chunk starts there, in logical order.
fn logical_starts(img: &Image) -> Vec<(u64, u64)> {
    let mut at = 0u64;
    img.chunks
        .iter()
        .map(|m| {
            let s = (m.logical, at);
            at = at.saturating_add(m.length);
            s
        })
        .collect()
}

/// The heatmap of `space` in `ncells` cells.
pub fn scan(img: &Image, space: Space, ncells: u64) -> Result<Heatmap> {
    check_cells(ncells)?;
    let mut map = match space {
        Space::Physical(devid) => {
            let sizes = device_sizes(img)?;
            let Some(&(_, total)) = sizes.iter().find(|d| d.0 == devid) else {
                return Err(Error::Invalid(format!(
                    "the filesystem has no device {devid} (its devices: {})",
                    sizes
                        .iter()
                        .map(|d| d.0.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            Heatmap::new(space, total, ncells)
        }
        Space::Logical => {
            let total = img
                .chunks
                .iter()
                .fold(0u64, |a, m| a.saturating_add(m.length));
            Heatmap::new(space, total, ncells)
        }
    };
    let starts = logical_starts(img);

    // Allocation: each chunk's stripes on the device, or its logical range.
    let mut outside = 0u64;
    for (m, &(_, lstart)) in img.chunks.iter().zip(&starts) {
        let kind = Kind::of(m.type_flags);
        match space {
            Space::Physical(devid) => {
                let per_dev = stripe_length(m.type_flags, m.length, m.stripes.len() as u64);
                for &(d, phys) in &m.stripes {
                    if d == devid {
                        outside += map.add_allocated(phys, per_dev, kind);
                    }
                }
            }
            Space::Logical => {
                map.add_allocated(lstart, m.length, kind);
            }
        }
    }
    if outside > 0 {
        map.warnings.push(format!(
            "{outside} bytes of dev extents lie past the end of the device"
        ));
    }

    // Use: every extent item of the extent tree, each byte of it where
    // the space holds it.
    let root = match img.find_root(BTRFS_EXTENT_TREE_OBJECTID) {
        Ok(Some(r)) => Some(r),
        Ok(None) => {
            map.warnings
                .push("the filesystem has no extent tree: nothing shown as used".into());
            None
        }
        Err(e) => {
            map.warnings
                .push(format!("the extent tree cannot be found: {e}"));
            None
        }
    };
    let Some(root) = root else {
        return Ok(map);
    };
    let mut unmapped = 0u64;
    let mut it = match TreeIter::new(img, root, Key::MIN) {
        Ok(it) => it,
        Err(e) => {
            map.warnings
                .push(format!("the extent tree cannot be read: {e}"));
            return Ok(map);
        }
    };
    while let Some(r) = it.next_item() {
        let item = match r {
            Ok(i) => i,
            Err(e) => {
                map.warnings.push(format!(
                    "the extent tree cannot be read past this point, the rest is shown as free: {e}"
                ));
                break;
            }
        };
        let len = match item.key.ty {
            BTRFS_EXTENT_ITEM_KEY => item.key.offset,
            BTRFS_METADATA_ITEM_KEY => u64::from(img.nodesize),
            _ => continue,
        };
        let bytenr = item.key.objectid;
        let end = bytenr.saturating_add(len);
        let mut at = bytenr;
        // Each turn consumes one chunk's part of the extent.
        while at < end {
            let Some(m) = img.chunks.lookup(at) else {
                unmapped += 1;
                break;
            };
            let upto = end.min(m.end());
            match space {
                Space::Logical => {
                    let i = starts.partition_point(|s| s.0 < m.logical);
                    if let Some(&(_, lstart)) = starts.get(i) {
                        map.add_used(lstart + (at - m.logical), upto - at);
                    }
                }
                Space::Physical(devid) => {
                    used_on_device(&mut map, m, at - m.logical, upto - at, devid)?
                }
            }
            at = upto;
        }
    }
    if unmapped > 0 {
        map.warnings.push(format!(
            "{unmapped} extents lie outside every chunk and are not shown"
        ));
    }
    Ok(map)
}

/// Add `[offset, offset + len)` of chunk `m` as used where its copies lie
/// on `devid`. RAID5/6 parity counts each data byte of its row divided by
/// the row's data stripes: a parity stripe shows its row's average fill.
fn used_on_device(
    map: &mut Heatmap,
    m: &ChunkMapping,
    offset: u64,
    len: u64,
    devid: u64,
) -> Result<()> {
    if !m.stripes.iter().any(|s| s.0 == devid) {
        return Ok(());
    }
    // Striped chunks are cut into stripe units: a window of at most 256
    // rows at a time keeps the pieces of one call bounded.
    let window = m
        .stripe_len
        .max(4096)
        .saturating_mul(m.stripes.len().max(1) as u64)
        .saturating_mul(256);
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let upto = end.min(at.saturating_add(window));
        let pieces = match m.map_range(at, upto - at) {
            Ok(p) => p,
            Err(e) => {
                map.warnings.push(format!("chunk {}: {e}", m.logical));
                return Ok(());
            }
        };
        for p in pieces {
            for &(d, phys) in &p.copies {
                if d == devid {
                    map.add_used(phys, p.len);
                }
            }
            if let Some(col) = &p.parity {
                let share = p.len.div_ceil(col.ndata().max(1) as u64);
                for &(d, phys) in col.stripes.iter().skip(col.ndata()) {
                    if d == devid {
                        map.add_used(phys, share);
                    }
                }
            }
        }
        at = upto;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(total: u64, n: u64) -> Heatmap {
        Heatmap::new(Space::Logical, total, n)
    }

    #[test]
    fn ranges_spread_over_the_cells_they_cover() {
        let mut h = map(1000, 10);
        assert_eq!(h.bytes_per_cell, 100);
        assert_eq!(h.add_allocated(150, 200, Kind::Metadata), 0);
        assert_eq!(h.cells[1].allocated[1], 50);
        assert_eq!(h.cells[2].allocated[1], 100);
        assert_eq!(h.cells[3].allocated[1], 50);
        assert_eq!(h.cells[1].kind(), Some(Kind::Metadata));
        assert_eq!(h.cells[0].kind(), None);
        // Use is capped by what is allocated in each cell.
        h.add_used(100, 300);
        assert_eq!(h.cells[1].used, 50);
        assert_eq!(h.cells[2].used, 100);
        assert_eq!(h.used, 200);
        assert!((h.fill(2) - 1.0).abs() < 1e-9);
        assert!((h.fill(1) - 0.5).abs() < 1e-9);
        // Past the end is returned, not placed.
        assert_eq!(h.add_allocated(950, 100, Kind::Data), 50);
        assert_eq!(h.add_allocated(u64::MAX - 5, 100, Kind::Data), 100);
    }

    #[test]
    fn a_huge_space_costs_only_its_cells() {
        // 16 TiB in 64 cells: one step per cell, nothing per sector.
        let mut h = map(16 << 40, 64);
        assert_eq!(h.bytes_per_cell, 1 << 38);
        assert_eq!(h.add_allocated(0, 16 << 40, Kind::Data), 0);
        h.add_used(0, u64::MAX);
        assert_eq!(h.used, 16 << 40);
        assert!(h.cells.iter().all(|c| c.used == 1 << 38));
        let m = h.merged(16);
        assert_eq!(m.cells.len(), 4);
        assert_eq!(m.cells[0].used, 1 << 42);
    }

    #[test]
    fn kinds_come_from_the_flags() {
        assert_eq!(Kind::of(BTRFS_BLOCK_GROUP_DATA), Kind::Data);
        assert_eq!(
            Kind::of(BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP),
            Kind::Metadata
        );
        assert_eq!(
            Kind::of(BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_DUP),
            Kind::System
        );
        assert_eq!(
            Kind::of(BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA),
            Kind::Mixed
        );
        assert!(check_cells(0).is_err());
        assert!(check_cells(MAX_CELLS + 1).is_err());
    }
}
