//! Phase 7: the checksum tree. Csum items must not overlap and must cover
//! only data extents; every data range a file extent needs checksummed must
//! be covered. With `check_data_csum`, every covered sector is read and
//! verified, in parallel.

use super::findings::F;
use super::Ctx;
use crate::format::consts::*;
use crate::tree::{Node, TreeIter};
use rayon::prelude::*;
use crate::image::Image;

const P: u8 = 7;

/// A data range a file extent needs checksums for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Need {
    pub start: u64,
    pub len: u64,
    pub root: u64,
    pub ino: u64,
}

#[derive(Default)]
pub(crate) struct Facts {
    /// (start, len, leaf) of each csum item, in key order.
    pub items: Vec<(u64, u64, u64)>,
    /// Union of the csum items: sorted, disjoint, merged.
    pub union: Vec<(u64, u64)>,
}

impl Facts {
    /// Is all of `[start, start+len)` covered by checksums?
    pub fn covered(&self, start: u64, len: u64) -> bool {
        covered(&self.union, start, len)
    }
}

pub(crate) fn covered(union: &[(u64, u64)], start: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let i = union.partition_point(|&(s, _)| s <= start);
    let Some(&(s, e)) = i.checked_sub(1).and_then(|i| union.get(i)) else { return false };
    s <= start && start.saturating_add(len) <= e
}

pub(super) fn on_leaf(cx: &mut Ctx, node: &Node) {
    let cs = cx.img.csum.size() as u64;
    let ss = cx.img.sectorsize as u64;
    for slot in 0..node.nr_safe() {
        let Some(k) = node.key(slot) else { continue };
        if k.objectid != BTRFS_EXTENT_CSUM_OBJECTID || k.ty != BTRFS_EXTENT_CSUM_KEY {
            cx.report(F::err(P, "csum-item").tree(7).at(node.bytenr).key(k).msg("unexpected key in the checksum tree"));
            continue;
        }
        let Some(it) = node.item(slot) else { continue };
        let size = it.size.get() as u64;
        if size % cs != 0 || k.offset % ss != 0 {
            cx.report(F::err(P, "csum-item").tree(7).at(node.bytenr).key(k).msg("csum item size or start misaligned"));
            continue;
        }
        cx.csum.items.push((k.offset, size / cs * ss, node.bytenr));
    }
}

/// Merge sorted (start, len) ranges into disjoint [start, end) intervals.
pub(crate) fn union_of(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, l) in v {
        let e = s.saturating_add(l);
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

pub(super) fn check(cx: &mut Ctx) {
    let items = std::mem::take(&mut cx.csum.items);
    cx.sink.checked(P, items.len() as u64);
    for w in items.windows(2) {
        let ((s0, l0, _), (s1, _, leaf)) = (w[0], w[1]);
        if s0.saturating_add(l0) > s1 {
            cx.report(F::err(P, "csum-overlap").tree(7).at(leaf).msg(format!("csum item at {s1} overlaps the one at {s0} (ends {})", s0.saturating_add(l0))));
        }
    }
    cx.csum.union = union_of(items.iter().map(|&(s, l, _)| (s, l)).collect());

    // Checksums only where data extents are.
    let data: Vec<(u64, u64)> = union_of(
        cx.ext.recs.iter().filter(|r| r.flags & BTRFS_EXTENT_FLAG_DATA != 0).map(|r| (r.bytenr, r.len)).collect(),
    );
    if cx.ext.loaded {
        let mut reported = 0;
        for &(s, e) in &cx.csum.union.clone() {
            if !covered(&data, s, e - s) && reported < 100 {
                // Find the first uncovered point for the message.
                reported += 1;
                cx.report(F::warn(P, "csum-orphan").tree(7).at(s).msg(format!("checksums for [{s}, {e}) cover space that is not a data extent")));
            }
        }
    }

    // Every range a file extent needs checksummed has them.
    let mut needs = std::mem::take(&mut cx.csum_needed);
    needs.sort_unstable_by_key(|n| n.start);
    let mut last = None;
    for n in &needs {
        if last == Some((n.start, n.len)) {
            continue;
        }
        last = Some((n.start, n.len));
        if !cx.csum.covered(n.start, n.len) {
            cx.report(F::err(P, "csum-missing").tree(n.root).at(n.start).msg(format!(
                "inode {} data [{}, +{}) has no checksums (or only some)",
                n.ino, n.start, n.len
            )));
        }
    }

    if cx.opts.check_data_csum {
        let sbf = cx.img.sb.flags.get();
        if sbf & (BTRFS_SUPER_FLAG_METADUMP | BTRFS_SUPER_FLAG_METADUMP_V2) != 0 {
            cx.report(F::warn(P, "data-csum").msg("metadump image holds no data: data checksums not verified"));
        } else {
            let (sectors, bad) = match cx.data_verified.take() {
                Some(r) => r,
                None => verify_all(cx.img),
            };
            cx.progress.phase(P, "data checksums", sectors);
            cx.progress.advance(sectors);
            cx.sink.checked(P, sectors);
            for (b, m) in bad {
                cx.report(F::err(P, "data-csum").tree(7).at(b).msg(m));
            }
        }
    }
    cx.csum.items = items;
}

/// Reading data is bound by I/O, not CPU: more reads in flight than cores
/// keep the device's queue full.
fn io_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(8).thread_name(|i| format!("csum-io-{i}")).build().ok()).as_ref()
}

fn verify_batch(img: &Image, batch: &[(u64, Vec<u8>)]) -> Vec<(u64, Vec<(u64, String)>)> {
    let run = || batch.par_iter().map(|(start, sums)| verify_item(img, *start, sums)).collect();
    match io_pool() {
        Some(p) => p.install(run),
        None => run(),
    }
}

/// Read every checksummed sector and compare: (sectors checked, bad
/// sectors with their message). Runs on its own thread beside the metadata
/// phases, so reading the data overlaps with them.
pub(crate) fn verify_all(img: &Image) -> (u64, Vec<(u64, String)>) {
    let mut bad: Vec<(u64, String)> = Vec::new();
    let mut sectors = 0u64;
    let Ok(Some(root)) = img.find_root(BTRFS_CSUM_TREE_OBJECTID) else { return (0, bad) };
    let Ok(mut it) = TreeIter::new(img, root, crate::format::key::Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0)) else {
        return (0, bad);
    };
    let cs = img.csum.size().max(1);
    let prefetch = |batch: &[(u64, Vec<u8>)]| {
        for (start, sums) in batch {
            let len = (sums.len() / cs) as u64 * img.sectorsize as u64;
            if let Ok(phys) = img.chunks.map(*start, len, img.devid) {
                for p in phys {
                    img.device().prefetch(p, len);
                }
            }
        }
    };
    // Two batches in flight: the next one is being read by the kernel
    // (prefetched) while the current one is verified.
    let mut filling: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut ready: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut filled = 0usize;
    loop {
        let next = it.next_item();
        let done = next.is_none();
        if let Some(Ok(item)) = next {
            if item.key.objectid == BTRFS_EXTENT_CSUM_OBJECTID && item.key.ty == BTRFS_EXTENT_CSUM_KEY {
                if let Ok(d) = item.data() {
                    // Pieces of at most 256 sectors keep each read buffer at 1 MiB (4 KiB sectors).
                    for (i, piece) in d.chunks(256 * cs).enumerate() {
                        let at = item.key.offset.saturating_add(i as u64 * 256 * img.sectorsize as u64);
                        filled += piece.len();
                        filling.push((at, piece.to_vec()));
                    }
                }
            }
        }
        if done || filled >= 64 << 10 {
            prefetch(&filling);
            let current = std::mem::replace(&mut ready, std::mem::take(&mut filling));
            filled = 0;
            for (n, b) in verify_batch(img, &current) {
                sectors += n;
                bad.extend(b);
            }
        }
        if done {
            let last = std::mem::take(&mut ready);
            for (n, b) in verify_batch(img, &last) {
                sectors += n;
                bad.extend(b);
            }
            break;
        }
    }
    (sectors, bad)
}

fn verify_item(img: &Image, start: u64, sums: &[u8]) -> (u64, Vec<(u64, String)>) {
    let cs = img.csum.size().max(1);
    let ss = img.sectorsize as u64;
    let n = (sums.len() / cs) as u64;
    let len = n.saturating_mul(ss);
    // One read per copy of the whole range when it lies in one chunk.
    if let Ok(phys) = img.chunks.map(start, len, img.devid) {
        let dev = img.device();
        let mut copies: Vec<Option<Vec<u8>>> = Vec::with_capacity(phys.len());
        for &p in &phys {
            let mut buf = vec![0u8; len as usize];
            copies.push(dev.read_at(p, &mut buf).ok().map(|_| buf));
        }
        let mut bad = Vec::new();
        for (i, want) in sums.chunks_exact(cs).enumerate() {
            let o = i * ss as usize;
            let good = copies
                .iter()
                .filter(|c| c.as_ref().and_then(|b| b.get(o..o + ss as usize)).is_some_and(|d| img.csum.verify(d, want)))
                .count();
            if good < copies.len() {
                let logical = start.saturating_add(o as u64);
                bad.push((logical, format!("data checksum mismatch at logical {logical} ({} of {} copies bad)", copies.len() - good, copies.len())));
            }
        }
        return (n, bad);
    }
    verify_sectors(img, start, sums)
}

/// Sector by sector, for a range that crosses chunks or cannot be mapped.
fn verify_sectors(img: &Image, start: u64, sums: &[u8]) -> (u64, Vec<(u64, String)>) {
    let cs = img.csum.size();
    let ss = img.sectorsize as u64;
    let dev = img.device();
    let mut bad = Vec::new();
    let mut buf = vec![0u8; ss as usize];
    let mut n = 0;
    for (i, want) in sums.chunks_exact(cs).enumerate() {
        let logical = start.saturating_add(i as u64 * ss);
        n += 1;
        let phys = match img.chunks.map(logical, ss, img.devid) {
            Ok(p) => p,
            Err(e) => {
                bad.push((logical, format!("checksummed sector {logical} cannot be mapped: {e}")));
                continue;
            }
        };
        let mut ok_copies = 0;
        for &p in &phys {
            let data: &[u8] = match dev.slice(p, ss as usize) {
                Some(s) => s,
                None => {
                    if dev.read_at(p, &mut buf).is_err() {
                        continue;
                    }
                    &buf
                }
            };
            if img.csum.verify(data, want) {
                ok_copies += 1;
            }
        }
        if ok_copies < phys.len() {
            bad.push((logical, format!("data checksum mismatch at logical {logical} ({} of {} copies bad)", phys.len() - ok_copies, phys.len())));
        }
    }
    (n, bad)
}
