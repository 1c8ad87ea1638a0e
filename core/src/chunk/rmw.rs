//! Reads and writes of RAID5/6 chunks that go through parity.
//!
//! Writes: every write to a parity chunk, tree block or data, goes through
//! one [`ParityWriter`] per filesystem. It cuts the writes into rows (full
//! stripes), and for each row computes P (and Q) over the column range the
//! writes touch, from the new data and, where a data stripe of the row is
//! not wholly rewritten, its current contents read back (read-modify-write;
//! a row wholly rewritten reads nothing). Only the bytes written and the
//! parity columns go to the devices: data the writes did not cover is never
//! rewritten (the kernel's rule against the write hole for what is already
//! on disk). A stripe on a missing device is rebuilt from the others before
//! the parity is recomputed, and not written (a degraded write, as the
//! kernel's). The writer's lock is held from the first read of a row to its
//! last write, so two writers (the commit, a log sync off the filesystem
//! lock, the data writer thread) never compute parity from each other's
//! half-written rows.
//!
//! Reads: [`read_column`] reads one piece of a data stripe rebuilt from the
//! rest of its column, assuming its own stripe (and one more, for RAID6)
//! bad; [`rebuild_attempts`] lists the ways to try, in the kernel's mirror
//! order (P first, then Q, then each other data stripe as the second loss).

use super::parity::{self, rebuild, RebuildError};
use super::{ChunkMap, ParityColumn};
use crate::io::BlockDevice;
use crate::CorruptKind;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The devices present, by devid (a missing device is None).
pub trait DeviceLookup {
    /// The device `devid`, if present.
    fn device(&self, devid: u64) -> Option<&dyn BlockDevice>;
}

impl DeviceLookup for BTreeMap<u64, Arc<dyn BlockDevice>> {
    fn device(&self, devid: u64) -> Option<&dyn BlockDevice> {
        self.get(&devid).map(|d| d.as_ref())
    }
}

impl DeviceLookup for Vec<(u64, Arc<dyn BlockDevice>)> {
    fn device(&self, devid: u64) -> Option<&dyn BlockDevice> {
        self.iter().find(|d| d.0 == devid).map(|d| d.1.as_ref())
    }
}

/// One way to read a piece of a parity chunk other than its own stripe:
/// rebuild it from its column, assuming its own stripe bad and, for RAID6,
/// also the stripe `also` (its index in the column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebuild {
    /// A second stripe of the column assumed bad (RAID6).
    pub also: Option<usize>,
}

/// The rebuilds to try for a piece in `col`, after its own stripe, in the
/// kernel's mirror order: from P (RAID5's only way); RAID6 then from Q (P
/// assumed bad too), then from P and Q with each other data stripe assumed
/// bad. With its own stripe, as many ways as RAID6 has stripes
/// (`btrfs_num_copies`).
pub fn rebuild_attempts(col: &ParityColumn) -> Vec<Rebuild> {
    let mut v = vec![Rebuild { also: None }];
    if col.nparity == 2 {
        v.push(Rebuild {
            also: Some(col.ndata()),
        });
        v.extend(
            (0..col.ndata())
                .filter(|&j| j != col.index)
                .map(|j| Rebuild { also: Some(j) }),
        );
    }
    v
}

/// Read `out.len()` bytes of the piece whose column is `col`, rebuilt from
/// the other stripes of the column as `how` says. Stripes on missing
/// devices and stripes that fail to read count as lost too; more lost than
/// the parity covers is an error naming them.
pub fn read_column(
    col: &ParityColumn,
    how: Rebuild,
    devs: &dyn DeviceLookup,
    out: &mut [u8],
) -> Result<()> {
    let n = col.stripes.len();
    let mut lost = vec![false; n];
    lost[col.index] = true;
    if let Some(a) = how.also {
        if a < n {
            lost[a] = true;
        }
    }
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; out.len()]; n];
    let mut why = Vec::new();
    for (k, &(devid, phys)) in col.stripes.iter().enumerate() {
        if lost[k] {
            continue;
        }
        match devs.device(devid) {
            None => {
                lost[k] = true;
                why.push(format!("device {devid} is missing"));
            }
            Some(d) => {
                if let Err(e) = d.read_at(phys, &mut bufs[k]) {
                    lost[k] = true;
                    why.push(format!("device {devid} at {phys}: {e}"));
                }
            }
        }
    }
    rebuild(&mut bufs, &lost, col.nparity).map_err(|e| rebuild_error(col, e, &why))?;
    out.copy_from_slice(&bufs[col.index]);
    Ok(())
}

fn rebuild_error(col: &ParityColumn, e: RebuildError, why: &[String]) -> Error {
    let (devid, phys) = col.stripes[col.index];
    Error::corrupt_as(
        CorruptKind::Lost,
        format!(
            "cannot rebuild data stripe {} of row {} (device {devid}, physical {phys}): {e}{}{}",
            col.index,
            col.row,
            if why.is_empty() { "" } else { "; " },
            why.join("; ")
        ),
        phys,
    )
}

/// The one writer of a filesystem's RAID5/6 chunks (see the module).
#[derive(Default)]
pub struct ParityWriter {
    lock: Mutex<()>,
}

/// The pieces of one row that a batch of writes rewrites.
struct RowWrites<'a> {
    /// (devid, physical offset of the row's start) of each stripe of the row.
    base: Vec<(u64, u64)>,
    nparity: usize,
    /// (data stripe, offset in the stripe unit, bytes).
    pieces: Vec<(usize, u64, &'a [u8])>,
}

impl ParityWriter {
    /// A writer with its own lock.
    pub fn new() -> ParityWriter {
        ParityWriter::default()
    }

    /// Write `writes` (logical address, bytes), all in RAID5/6 chunks of
    /// `map`, with the parity of every row they touch. `degraded`: stripes
    /// on missing devices are left (else a missing device is an error).
    /// Later writes of the batch win where they overlap earlier ones.
    /// Returns the bytes written to the devices, parity included.
    pub fn write(
        &self,
        map: &ChunkMap,
        writes: &[(u64, &[u8])],
        devs: &dyn DeviceLookup,
        degraded: bool,
    ) -> Result<u64> {
        let mut rows: BTreeMap<(u64, u64), RowWrites> = BTreeMap::new();
        for &(logical, data) in writes {
            for p in map.pieces(logical, data.len() as u64)? {
                let col = p.parity.ok_or_else(|| {
                    Error::Internal(format!(
                        "parity write at logical {} outside a RAID5/6 chunk",
                        p.offset
                    ))
                })?;
                let chunk = map.lookup(p.offset).map(|m| m.logical).unwrap_or(0);
                let unit = map.lookup(p.offset).map(|m| m.stripe_len).unwrap_or(1);
                let in_unit = (p.offset - chunk) % unit;
                let from = (p.offset - logical) as usize;
                let r = rows.entry((chunk, col.row)).or_insert_with(|| RowWrites {
                    base: col
                        .stripes
                        .iter()
                        .map(|&(d, ph)| (d, ph - in_unit))
                        .collect(),
                    nparity: col.nparity,
                    pieces: Vec::new(),
                });
                r.pieces
                    .push((col.index, in_unit, &data[from..from + p.len as usize]));
            }
        }
        let _held = crate::util::sync::lock(&self.lock);
        let mut out: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        for row in rows.values() {
            self.row(row, devs, degraded, &mut out)?;
        }
        // Adjacent writes on a device (a stripe's rows follow each other)
        // go as one.
        out.sort_unstable_by_key(|w| (w.0, w.1));
        let mut total = 0u64;
        let mut i = 0;
        while i < out.len() {
            let (devid, start) = (out[i].0, out[i].1);
            let mut run = std::mem::take(&mut out[i].2);
            let mut j = i + 1;
            while j < out.len()
                && out[j].0 == devid
                && out[j].1 == start + run.len() as u64
                && run.len() < (8 << 20)
            {
                run.extend_from_slice(&out[j].2);
                j += 1;
            }
            let d = devs.device(devid).ok_or_else(|| {
                Error::Internal(format!("parity write planned for missing device {devid}"))
            })?;
            d.write_at(start, &run)?;
            total += run.len() as u64;
            i = j;
        }
        Ok(total)
    }

    /// Plan one row: old contents where needed, new data over them, parity.
    fn row(
        &self,
        r: &RowWrites,
        devs: &dyn DeviceLookup,
        degraded: bool,
        out: &mut Vec<(u64, u64, Vec<u8>)>,
    ) -> Result<()> {
        let n = r.base.len();
        let ndata = n - r.nparity;
        let lo = r.pieces.iter().map(|p| p.1).min().unwrap_or(0);
        let hi = r
            .pieces
            .iter()
            .map(|p| p.1 + p.2.len() as u64)
            .max()
            .unwrap_or(0);
        let w = (hi - lo) as usize;
        let present: Vec<bool> = r.base.iter().map(|b| devs.device(b.0).is_some()).collect();
        if !degraded {
            if let Some(k) = present.iter().position(|p| !p) {
                return Err(Error::MissingDevice {
                    devids: vec![r.base[k].0],
                    what: format!(
                        "device {} is missing: a RAID5/6 row on it cannot be written",
                        r.base[k].0
                    ),
                });
            }
        }
        // Which data stripes the writes cover wholly in [lo, hi).
        let mut cover: Vec<Vec<(u64, u64)>> = vec![Vec::new(); ndata];
        for &(i, at, d) in &r.pieces {
            cover[i].push((at, at + d.len() as u64));
        }
        let whole: Vec<bool> = cover
            .iter_mut()
            .map(|c| {
                c.sort_unstable();
                let mut reach = lo;
                for &(a, b) in c.iter() {
                    if a > reach {
                        return false;
                    }
                    reach = reach.max(b);
                }
                reach >= hi
            })
            .collect();
        let mut cols: Vec<Vec<u8>> = vec![vec![0u8; w]; n];
        let read = |k: usize, buf: &mut [u8]| -> bool {
            let (devid, base) = r.base[k];
            devs.device(devid)
                .is_some_and(|d| d.read_at(base + lo, buf).is_ok())
        };
        // The old contents are needed where a data stripe is only partly
        // rewritten. If one of those cannot be read, the old column is
        // rebuilt from everything readable first.
        let mut lost = vec![false; n];
        let mut ok = true;
        for k in 0..ndata {
            if !whole[k] && !read(k, &mut cols[k]) {
                lost[k] = true;
                ok = false;
            }
        }
        if !ok {
            let mut why = Vec::new();
            for k in 0..n {
                if lost[k] || (k < ndata && !whole[k]) {
                    continue;
                }
                if !read(k, &mut cols[k]) {
                    lost[k] = true;
                    why.push(format!("stripe {k} on device {} unreadable", r.base[k].0));
                }
            }
            rebuild(&mut cols, &lost, r.nparity).map_err(|e| {
                Error::corrupt_as(CorruptKind::Lost, format!(
                        "a RAID5/6 row at device {} physical {} cannot be rewritten: its old contents cannot be rebuilt: {e}{}{}",
                        r.base[0].0,
                        r.base[0].1,
                        if why.is_empty() { "" } else { "; " },
                        why.join("; ")
                    ), r.base[0].1)
            })?;
        }
        for &(i, at, d) in &r.pieces {
            let o = (at - lo) as usize;
            cols[i][o..o + d.len()].copy_from_slice(d);
        }
        {
            let (data, par) = cols.split_at_mut(ndata);
            let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
            let (p, q) = par.split_at_mut(1);
            parity::gen_parity(&refs, &mut p[0], q.first_mut().map(|v| v.as_mut_slice()));
        }
        // The data written, from the overlaid columns (a later write of the
        // batch over an earlier one is what goes out), range by range.
        for (i, c) in cover.iter().enumerate() {
            let (devid, base) = r.base[i];
            if !present[i] {
                continue;
            }
            let mut k = 0;
            while k < c.len() {
                let (a, mut b) = c[k];
                k += 1;
                while k < c.len() && c[k].0 <= b {
                    b = b.max(c[k].1);
                    k += 1;
                }
                let (x, y) = ((a - lo) as usize, (b - lo) as usize);
                out.push((devid, base + a, cols[i][x..y].to_vec()));
            }
        }
        for k in ndata..n {
            let (devid, base) = r.base[k];
            if present[k] {
                out.push((devid, base + lo, std::mem::take(&mut cols[k])));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ChunkMapping;
    use crate::format::consts::*;
    use crate::io::MemDevice;

    const UNIT: u64 = 65536;
    const DEV: usize = 4 << 20;
    const LOGICAL: u64 = 1 << 30;

    use crate::util::prng::Prng;

    fn set(profile: u64, n: u64) -> (ChunkMap, BTreeMap<u64, Arc<dyn BlockDevice>>) {
        let np = crate::chunk::nparity(profile) as u64;
        let m = ChunkMapping {
            logical: LOGICAL,
            // Each stripe 2 MiB from 1 MiB on its device.
            length: (n - np) * (2 << 20),
            type_flags: BTRFS_BLOCK_GROUP_DATA | profile,
            stripe_len: UNIT,
            stripes: (1..=n).map(|d| (d, 1 << 20)).collect(),
            sub_stripes: 1,
        };
        let devs = (1..=n)
            .map(|d| {
                (
                    d,
                    Arc::new(MemDevice::new(vec![0u8; DEV])) as Arc<dyn BlockDevice>,
                )
            })
            .collect();
        (ChunkMap::of_one(m), devs)
    }

    /// Every row's parity, by the definition, against what is on the
    /// devices (all of it: the devices start zeroed, so untouched columns
    /// are consistent too).
    fn parity_consistent(map: &ChunkMap, devs: &BTreeMap<u64, Arc<dyn BlockDevice>>) {
        let m = map.iter().next().unwrap();
        let rows = m.length / m.full_stripe_len();
        for row in 0..rows {
            let piece = &m.map_range(row * m.full_stripe_len(), 4096).unwrap()[0];
            let col = piece.parity.as_ref().unwrap();
            let read = |k: usize| {
                let (d, p) = col.stripes[k];
                devs[&d].read_vec(p, UNIT as usize).unwrap()
            };
            let data: Vec<Vec<u8>> = (0..col.ndata()).map(read).collect();
            let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
            let mut p = vec![0u8; UNIT as usize];
            let mut q = vec![0u8; UNIT as usize];
            parity::gen_parity(&refs, &mut p, (col.nparity == 2).then_some(&mut q[..]));
            assert!(p == read(col.ndata()), "P of row {row}");
            if col.nparity == 2 {
                assert!(q == read(col.ndata() + 1), "Q of row {row}");
            }
        }
    }

    fn read_all(map: &ChunkMap, devs: &BTreeMap<u64, Arc<dyn BlockDevice>>, len: u64) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        let mut at = 0usize;
        for p in map.pieces(LOGICAL, len).unwrap() {
            let buf = &mut out[at..at + p.len as usize];
            let (d, ph) = p.copies[0];
            match devs.get(&d) {
                Some(dev) => dev.read_at(ph, buf).unwrap(),
                None => read_column(
                    p.parity.as_ref().unwrap(),
                    Rebuild { also: None },
                    devs,
                    buf,
                )
                .unwrap(),
            }
            at += p.len as usize;
        }
        out
    }

    #[test]
    fn random_writes_keep_parity_and_data() {
        for (profile, n) in [
            (BTRFS_BLOCK_GROUP_RAID5, 2),
            (BTRFS_BLOCK_GROUP_RAID5, 3),
            (BTRFS_BLOCK_GROUP_RAID6, 3),
            (BTRFS_BLOCK_GROUP_RAID6, 5),
        ] {
            let (map, devs) = set(profile, n);
            let len = map.iter().next().unwrap().length;
            let mut model = vec![0u8; len as usize];
            let mut rng = Prng::new(0x1234_5678 + n);
            let w = ParityWriter::new();
            for i in 0..60 {
                // Sector-aligned writes from a sector to several rows,
                // some batches of two overlapping writes.
                let at = (rng.next_u64() % (len / 4096)) * 4096;
                let max = (len - at) / 4096;
                let sectors = 1 + rng.next_u64() % max.min(if i % 3 == 0 { 64 } else { 8 });
                let data: Vec<u8> = (0..sectors * 4096).map(|_| rng.next_u64() as u8).collect();
                let mut batch = vec![(LOGICAL + at, data.as_slice())];
                let second: Vec<u8> = vec![i as u8; 4096];
                if i % 4 == 1 {
                    batch.push((LOGICAL + at, second.as_slice()));
                }
                w.write(&map, &batch, &devs, false).unwrap();
                for (l, d) in &batch {
                    let o = (l - LOGICAL) as usize;
                    model[o..o + d.len()].copy_from_slice(d);
                }
            }
            assert!(read_all(&map, &devs, len) == model, "{profile:x} on {n}");
            parity_consistent(&map, &devs);
        }
    }

    #[test]
    fn a_partial_write_leaves_the_rest_of_the_row_alone() {
        let (map, devs) = set(BTRFS_BLOCK_GROUP_RAID5, 3);
        // Row 0: data 0 on device 1, data 1 on device 2, P on device 3.
        // Something on data 1 that the parity does not know about.
        devs[&2].write_at(1 << 20, &[7u8; 4096]).unwrap();
        let w = ParityWriter::new();
        w.write(&map, &[(LOGICAL, &[9u8; 4096][..])], &devs, false)
            .unwrap();
        assert_eq!(devs[&2].read_vec(1 << 20, 4096).unwrap(), vec![7u8; 4096]);
        // The new parity covers what is there: 9 ^ 7.
        assert_eq!(devs[&3].read_vec(1 << 20, 4096).unwrap(), vec![9 ^ 7; 4096]);
        // Past the column written, the parity is untouched.
        assert_eq!(
            devs[&3].read_vec((1 << 20) + 4096, 4096).unwrap(),
            vec![0; 4096]
        );
    }

    #[test]
    fn degraded_writes_rebuild_through_the_missing_stripes() {
        for (profile, n, lose) in [
            (BTRFS_BLOCK_GROUP_RAID5, 3, vec![2u64]),
            (BTRFS_BLOCK_GROUP_RAID6, 4, vec![1, 4]),
            (BTRFS_BLOCK_GROUP_RAID6, 5, vec![3]),
        ] {
            let (map, mut devs) = set(profile, n);
            let len = map.iter().next().unwrap().length;
            let w = ParityWriter::new();
            let mut rng = Prng::new(99 + n);
            let first: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            w.write(&map, &[(LOGICAL, &first[..])], &devs, false)
                .unwrap();
            let mut model = first.clone();
            for d in &lose {
                devs.remove(d);
            }
            assert!(
                w.write(&map, &[(LOGICAL, &[1u8; 4096][..])], &devs, false)
                    .is_err(),
                "a missing device is refused unless degraded"
            );
            for i in 0..40u64 {
                let at = (rng.next_u64() % (len / 4096)) * 4096;
                let sectors = 1 + rng.next_u64() % ((len - at) / 4096).min(40);
                let data = vec![i as u8 + 1; (sectors * 4096) as usize];
                w.write(&map, &[(LOGICAL + at, &data[..])], &devs, true)
                    .unwrap();
                model[at as usize..(at + sectors * 4096) as usize].copy_from_slice(&data);
            }
            assert!(
                read_all(&map, &devs, len) == model,
                "{profile:x} on {n} without {lose:?}"
            );
        }
    }

    #[test]
    fn every_rebuild_attempt_of_raid6_reads_the_piece() {
        let (map, devs) = set(BTRFS_BLOCK_GROUP_RAID6, 5);
        let len = map.iter().next().unwrap().length;
        let mut rng = Prng::new(7);
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        ParityWriter::new()
            .write(&map, &[(LOGICAL, &data[..])], &devs, false)
            .unwrap();
        for p in map.pieces(LOGICAL + 5 * UNIT + 4096, 8192).unwrap() {
            let col = p.parity.unwrap();
            let attempts = rebuild_attempts(&col);
            assert_eq!(attempts.len() + 1, 5, "as many ways as stripes");
            for how in attempts {
                let mut b = vec![0u8; p.len as usize];
                read_column(&col, how, &devs, &mut b).unwrap();
                let o = (p.offset - LOGICAL) as usize;
                assert!(b == data[o..o + p.len as usize], "{how:?}");
            }
        }
    }
}
