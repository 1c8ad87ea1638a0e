//! Phase A of a checksum conversion: the csum tree's EXTENT_CSUM items
//! rewritten in the new algorithm, a range of logical addresses per
//! transaction of the engine.
//!
//! Invariant between commits: every EXTENT_CSUM item whose key offset is
//! below the marker's `boundary` holds checksums of the new algorithm,
//! every one at or above it of the old one. A batch deletes the old items
//! of `[boundary, next)` (whole items: `next` is the end of the last one
//! taken, so no old item straddles it), inserts their new ones (keyed
//! inside the same range, so below `next`), and moves the boundary to
//! `next`, all in one commit: a crash leaves the boundary and the items
//! agreeing, and a rerun starts at the boundary.
//!
//! Reading: each batch's runs of checksummed sectors are cut into
//! requests of a few MiB at most, read from their first copy in large
//! direct reads by a pool of workers that verify the old checksum and
//! compute the new one as each request arrives. A sector whose first copy
//! fails (or cannot be read) is read again every other way (the other
//! copies, a RAID5/6 rebuild) until one matches; when none does, it is
//! reported and given the complement of its new checksum, so that it still
//! fails to read after the conversion instead of being blessed.

use super::Marker;
use crate::csum::CsumType;
use crate::format::consts::*;
use crate::format::header::{HEADER_SIZE, ITEM_SIZE};
use crate::format::key::Key;
use crate::image::Image;
use crate::io::IoBuf;
use crate::trans::{next_key, Store, TreeId};
use crate::{CorruptKind, Error, Result};
use rayon::prelude::*;

const CSUM_TREE: TreeId = TreeId::Tree(BTRFS_CSUM_TREE_OBJECTID);

/// Data (bytes of checksummed sectors) converted per commit: the memory a
/// batch holds is its checksums (at most 8 MiB of sha256 or blake2 sums
/// for 1 GiB of data) and the csum leaves it dirties, whatever the size of
/// the filesystem.
const BATCH_BYTES: u64 = 1 << 30;
/// Items per commit at most (many tiny items would otherwise make one
/// commit's dirty leaves many).
const BATCH_ITEMS: usize = 1 << 16;
/// Largest read request of a worker: large enough for the device to
/// stream, small enough that the workers share a batch evenly.
const REQUEST_BYTES: u64 = 4 << 20;
/// Reads in flight: a device (or a set) serves several requests at once
/// while finished ones are hashed.
const WORKERS: usize = 8;

/// What the data phase did.
#[derive(Debug, Default)]
pub(super) struct DataOutcome {
    /// Checksummed sectors converted in this run.
    pub sectors: u64,
    /// Commits made.
    pub commits: u64,
    /// Sectors no copy of which matched its old checksum (logical
    /// addresses, this run only), in logical order.
    pub bad: Vec<u64>,
}

/// One batch: the old items taken, in key order, and whether the csum
/// tree has no old item after them.
struct Batch {
    items: Vec<(Key, Vec<u8>)>,
    end: bool,
}

/// A run of contiguous checksummed sectors, the old sums concatenated.
struct Run {
    start: u64,
    old: Vec<u8>,
}

/// Convert every old EXTENT_CSUM item at or above `marker.boundary`, batch
/// by batch, then flip CHANGING_DATA_CSUM to CHANGING_META_CSUM in the
/// last batch's commit. `st` is open on the filesystem with the temporary
/// item `key` already committed.
pub(super) fn run(
    st: &mut Store,
    key: &Key,
    marker: &mut Marker,
    to: CsumType,
    progress: &dyn crate::check::Progress,
) -> Result<DataOutcome> {
    let from = marker.old;
    let mut out = DataOutcome::default();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(WORKERS)
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the checksum workers: {e}")))?;
    // Each round either ends the loop or moves the boundary forward past
    // at least one item (keys strictly increase), so it ends.
    loop {
        let batch = collect(st, marker.boundary, from)?;
        let runs = runs_of(&batch.items, from, st.sectorsize() as u64);
        let img = st.image();
        let (new_sums, bad) = pool.install(|| convert_runs(img, from, to, &runs))?;
        let ss = st.sectorsize() as u64;
        let sectors: u64 = runs
            .iter()
            .map(|r| (r.old.len() / from.size()) as u64)
            .sum();
        let next = match batch.items.last() {
            Some((k, d)) => k.offset + (d.len() / from.size()) as u64 * ss,
            None => marker.boundary,
        };
        for (k, _) in &batch.items {
            if !st.delete_item(CSUM_TREE, k)? {
                return Err(Error::Internal(format!(
                    "csum item at {} vanished during the conversion",
                    k.offset
                )));
            }
        }
        let per_item = max_csum_sums(st.nodesize() as usize, to.size());
        for (r, sums) in runs.iter().zip(&new_sums) {
            for (i, piece) in sums.chunks(per_item * to.size()).enumerate() {
                let at = r.start + (i * per_item) as u64 * ss;
                st.insert_item(
                    CSUM_TREE,
                    &Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, at),
                    piece,
                )?;
            }
        }
        marker.boundary = next;
        marker.bad = marker.bad.saturating_add(bad.len() as u64);
        st.update_item(TreeId::Root, key, &marker.encode())?;
        if batch.end {
            st.update_superblock(|sb| {
                let f = sb.flags.get();
                sb.flags.set(
                    (f & !BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM)
                        | BTRFS_SUPER_FLAG_CHANGING_META_CSUM,
                )
            });
        }
        st.commit()?;
        st.cache_control().trim();
        out.commits += 1;
        out.sectors += sectors;
        out.bad.extend(bad);
        progress.advance(sectors * ss);
        if batch.end {
            return Ok(out);
        }
    }
}

/// Sums one csum item holds at most: the kernel's MAX_CSUM_ITEMS, a leaf's
/// data area less two item headers, less one sum.
pub(super) fn max_csum_sums(nodesize: usize, csum_size: usize) -> usize {
    ((nodesize - HEADER_SIZE - 2 * ITEM_SIZE) / csum_size.max(1))
        .saturating_sub(1)
        .max(1)
}

/// The old items from `boundary` on, up to a batch's worth, checked:
/// sizes a non-zero multiple of the old checksum size, sector-aligned
/// starts, no overlap.
fn collect(st: &mut Store, boundary: u64, from: CsumType) -> Result<Batch> {
    let cs = from.size();
    let ss = st.sectorsize() as u64;
    let mut k = Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, boundary);
    let mut items: Vec<(Key, Vec<u8>)> = Vec::new();
    let mut bytes = 0u64;
    let mut prev_end = boundary;
    // Each round reads one leaf and moves `k` past its last item.
    loop {
        let Some((_, leaf)) = st.leaf_from(CSUM_TREE, &k)? else {
            return Ok(Batch { items, end: true });
        };
        if leaf.is_empty() {
            return Ok(Batch { items, end: true });
        }
        for (key, d) in leaf {
            if key.objectid != BTRFS_EXTENT_CSUM_OBJECTID || key.ty != BTRFS_EXTENT_CSUM_KEY {
                return Ok(Batch { items, end: true });
            }
            let bad = |what: String| Error::corrupt_as(CorruptKind::Item, what, key.offset);
            if d.is_empty() || !d.len().is_multiple_of(cs) {
                return Err(bad(format!(
                    "csum item at logical {} of {} bytes: not a multiple of the {}-byte {} checksum",
                    key.offset,
                    d.len(),
                    cs,
                    from.name()
                )));
            }
            if !key.offset.is_multiple_of(ss) {
                return Err(bad(format!(
                    "csum item at logical {} is not sector aligned",
                    key.offset
                )));
            }
            if key.offset < prev_end {
                return Err(bad(format!(
                    "csum item at logical {} overlaps the one before (ending at {prev_end})",
                    key.offset
                )));
            }
            let n = (d.len() / cs) as u64;
            let end = key.offset.checked_add(n * ss).ok_or_else(|| {
                bad(format!(
                    "csum item at logical {} ends past 2^64",
                    key.offset
                ))
            })?;
            prev_end = end;
            bytes += n * ss;
            k = next_key(&key);
            items.push((key, d));
            if bytes >= BATCH_BYTES || items.len() >= BATCH_ITEMS {
                return Ok(Batch { items, end: false });
            }
        }
    }
}

/// The items' sums joined into runs of contiguous sectors.
fn runs_of(items: &[(Key, Vec<u8>)], from: CsumType, ss: u64) -> Vec<Run> {
    let cs = from.size();
    let mut runs: Vec<Run> = Vec::new();
    for (k, d) in items {
        if let Some(r) = runs.last_mut() {
            if r.start + (r.old.len() / cs) as u64 * ss == k.offset {
                r.old.extend_from_slice(d);
                continue;
            }
        }
        runs.push(Run {
            start: k.offset,
            old: d.clone(),
        });
    }
    runs
}

/// One worker's share: `n` sectors from `logical`, their old sums.
struct Task<'a> {
    run: usize,
    first: usize,
    logical: u64,
    n: usize,
    old: &'a [u8],
}

/// The new sums of every run (same order) and the sectors no copy of
/// which matched its old sum.
fn convert_runs(
    img: &Image,
    from: CsumType,
    to: CsumType,
    runs: &[Run],
) -> Result<(Vec<Vec<u8>>, Vec<u64>)> {
    let ss = img.sectorsize as usize;
    let cs = from.size();
    let per_task = (REQUEST_BYTES as usize / ss).max(1);
    let mut tasks = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let n = r.old.len() / cs;
        let mut first = 0;
        while first < n {
            let k = per_task.min(n - first);
            tasks.push(Task {
                run: i,
                first,
                logical: r.start + (first * ss) as u64,
                n: k,
                old: &r.old[first * cs..(first + k) * cs],
            });
            first += k;
        }
    }
    let done: Vec<Result<(Vec<u8>, Vec<u64>)>> = tasks
        .par_iter()
        .map_init(IoBuf::new, |buf, t| convert_task(img, from, to, t, buf))
        .collect();
    let mut out: Vec<Vec<u8>> = runs
        .iter()
        .map(|r| vec![0u8; r.old.len() / cs * to.size()])
        .collect();
    let mut bad = Vec::new();
    for (t, r) in tasks.iter().zip(done) {
        let (sums, b) = r?;
        let at = t.first * to.size();
        out[t.run][at..at + sums.len()].copy_from_slice(&sums);
        bad.extend(b);
    }
    Ok((out, bad))
}

/// Verify and convert one task's sectors: its first copies in one read
/// per stripe piece, then each sector that failed there every other way.
fn convert_task(
    img: &Image,
    from: CsumType,
    to: CsumType,
    t: &Task,
    buf: &mut IoBuf,
) -> Result<(Vec<u8>, Vec<u64>)> {
    let ss = img.sectorsize as usize;
    let (fs, ts) = (from.size(), to.size());
    let mut out = vec![0u8; t.n * ts];
    let mut retry: Vec<usize> = Vec::new();
    let mut at = 0usize;
    for p in img.pieces(t.logical, (t.n * ss) as u64)? {
        let len = p.len as usize;
        if !len.is_multiple_of(ss) || at + len / ss > t.n {
            return Err(Error::corrupt_as(
                CorruptKind::Structure,
                format!("stripe piece of {len} bytes is not whole sectors"),
                t.logical + (at * ss) as u64,
            ));
        }
        let k = len / ss;
        let first = p
            .copies
            .first()
            .and_then(|&(d, phys)| img.copy_device(d).ok().map(|dev| (dev, phys)));
        let read = match first {
            Some((dev, phys)) => dev
                .read_once(phys, len, buf, &mut |b| {
                    for i in 0..k {
                        let s = &b[i * ss..(i + 1) * ss];
                        let j = at + i;
                        if from.verify(s, &t.old[j * fs..(j + 1) * fs]) {
                            out[j * ts..(j + 1) * ts].copy_from_slice(&to.compute(s)[..ts]);
                        } else {
                            retry.push(j);
                        }
                    }
                })
                .is_ok(),
            None => false,
        };
        if !read {
            retry.extend(at..at + k);
        }
        at += k;
    }
    let mut bad = Vec::new();
    let mut s = vec![0u8; ss];
    for j in retry {
        let logical = t.logical + (j * ss) as u64;
        let want = &t.old[j * fs..(j + 1) * fs];
        // A sector no way reads (I/O errors on every copy) is bad too: the
        // conversion goes on and the sector keeps failing.
        let failed =
            match img.read_logical_checked(logical, &mut s, &mut |_, b| from.verify(b, want)) {
                Ok(f) => !f.is_empty(),
                Err(_) => {
                    s.fill(0);
                    true
                }
            };
        let mut c = to.compute(&s);
        if failed {
            // Not blessed: a checksum the data cannot match, so a read of
            // it still fails after the conversion.
            for x in &mut c[..ts] {
                *x = !*x;
            }
            bad.push(logical);
        }
        out[j * ts..(j + 1) * ts].copy_from_slice(&c[..ts]);
    }
    Ok((out, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_sums_as_the_kernel() {
        // 16 KiB leaf: (16384 - 101 - 50) / 4 - 1 crc32c sums.
        assert_eq!(max_csum_sums(16384, 4), 4057);
        assert_eq!(max_csum_sums(4096, 32), 122);
    }

    #[test]
    fn runs_join_contiguous_items() {
        let k = |o| Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, o);
        let items = vec![
            (k(0), vec![1; 8]),
            (k(8192), vec![2; 4]),
            (k(16384), vec![3; 4]),
        ];
        let r = runs_of(&items, CsumType::Crc32c, 4096);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].old.len(), 12);
        assert_eq!(r[1].start, 16384);
    }
}
