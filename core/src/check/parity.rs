//! Parity scrub of RAID5/6 chunks (`--check-mirrors --check-data-csum`):
//! P and Q recomputed for every full stripe that holds an extent, and
//! compared with what is on disk, sector by sector, in the columns where
//! some data stripe of the row is allocated (as the kernel's
//! `scrub_raid56_parity_stripe` checks only such sectors: the others were
//! never written through the parity). A mismatch is reported with its
//! logical full stripe and the parity's device and physical offset; where
//! every allocated data sector of the column passes its checksum, the
//! parity is named as the bad one.
//!
//! The reads go device by device in runs of rows (a stripe's rows follow
//! each other on its device), and the runs are checked in parallel.

use super::findings::{Category, Phase};
use super::Ctx;
use crate::chunk::parity::gen_parity;
use crate::chunk::ChunkMapping;
use crate::format::consts::*;
use rayon::prelude::*;
use std::collections::HashSet;

/// Rows read and checked together: 32 rows of 64 KiB units, 2 MiB per
/// device.
const BATCH_ROWS: u64 = 32;

/// A sector column of one row whose parity does not match its data.
struct Mismatch {
    chunk: usize,
    row: u64,
    /// First sector of the column run in the stripe unit, and how many.
    sector: u64,
    count: u64,
    /// Which parity stripes are wrong: 0 = P, 1 = Q.
    which: Vec<usize>,
}

pub(super) fn check(cx: &mut Ctx) {
    if !(cx.opts.check_mirrors && cx.opts.check_data_csum) {
        return;
    }
    let img = cx.img;
    let chunks: Vec<&ChunkMapping> = img.chunks.iter().filter(|m| m.nparity() > 0).collect();
    if chunks.is_empty() {
        return;
    }
    if !img.missing.is_empty() {
        cx.report(
            super::findings::F::warn(Phase::Checksums, Category::Parity).msg(format!(
                "the parity of {} RAID5/6 chunks was not checked: devices are missing",
                chunks.len()
            )),
        );
        return;
    }
    let ss = img.sectorsize as u64;
    // Per chunk, per row: the sectors of the stripe unit where some data
    // stripe of the row holds an extent.
    let mut masks: Vec<Vec<u64>> = Vec::with_capacity(chunks.len());
    for m in &chunks {
        let unit = m.stripe_len;
        if unit == 0 || unit / ss > 64 || unit % ss != 0 || m.stripes.len() <= m.nparity() {
            // Not a layout this check can take (the chunk checks report
            // it); nothing marked, nothing read.
            masks.push(Vec::new());
            continue;
        }
        let rows = m.length.div_ceil(m.full_stripe_len());
        // The mask has a word per row, and the chunk's length comes from
        // disk: only a chunk whose stripes fit on its devices (their real
        // sizes) is looked at; a longer one is the chunk checks' to report.
        let fits = m.stripes.iter().all(|&(devid, phys)| {
            img.device_of(devid).is_some_and(|d| {
                rows.checked_mul(unit)
                    .and_then(|l| phys.checked_add(l))
                    .is_some_and(|e| e <= d.size())
            })
        });
        if !fits {
            masks.push(Vec::new());
            continue;
        }
        let mut mask = vec![0u64; rows as usize];
        let first = cx.ext.recs.partition_point(|r| r.bytenr < m.logical);
        for r in &cx.ext.recs[first..] {
            if r.bytenr >= m.end() {
                break;
            }
            let (mut at, end) = (r.bytenr, r.bytenr.saturating_add(r.len).min(m.end()));
            while at < end {
                let off = at - m.logical;
                let in_unit = off % unit;
                let piece = (unit - in_unit).min(end - at);
                let row = (off / unit) / (m.stripes.len() - m.nparity()) as u64;
                let a = in_unit / ss;
                let b = (in_unit + piece).div_ceil(ss);
                let bits = if b - a >= 64 {
                    u64::MAX
                } else {
                    ((1u64 << (b - a)) - 1) << a
                };
                if let Some(x) = mask.get_mut(row as usize) {
                    *x |= bits;
                }
                at += piece;
            }
        }
        masks.push(mask);
    }
    // Runs of rows with something in them, at most BATCH_ROWS long.
    let mut batches: Vec<(usize, u64, u64)> = Vec::new();
    for (c, mask) in masks.iter().enumerate() {
        let mut r = 0u64;
        while (r as usize) < mask.len() {
            if mask[r as usize] == 0 {
                r += 1;
                continue;
            }
            let end = (r + BATCH_ROWS).min(mask.len() as u64);
            batches.push((c, r, end));
            r = end;
        }
    }
    let checked: u64 = masks.iter().flatten().map(|m| m.count_ones() as u64).sum();
    let found: Vec<Result<Vec<Mismatch>, String>> = batches
        .par_iter()
        .map(|&(c, r0, r1)| check_rows(img, c, chunks[c], &masks[c], r0, r1))
        .collect();
    cx.sink.checked(Phase::Checksums, checked);
    let data_bad: HashSet<u64> = cx
        .data_verified
        .as_ref()
        .map(|(_, bad)| bad.iter().map(|b| b.0).collect())
        .unwrap_or_default();
    for r in found {
        match r {
            Err(e) => cx.report(super::findings::F::err(Phase::Checksums, Category::Parity).msg(e)),
            Ok(list) => {
                for mm in list {
                    let f = describe(cx, &chunks, &data_bad, &mm);
                    cx.report(f);
                }
            }
        }
    }
}

/// Read rows `[r0, r1)` of chunk `m` on every stripe and compare parity in
/// the marked columns.
fn check_rows(
    img: &crate::image::Image,
    c: usize,
    m: &ChunkMapping,
    mask: &[u64],
    r0: u64,
    r1: u64,
) -> Result<Vec<Mismatch>, String> {
    let unit = m.stripe_len;
    let ss = img.sectorsize as u64;
    let n = m.stripes.len();
    let np = m.nparity();
    let ndata = n - np;
    let len = ((r1 - r0) * unit) as usize;
    let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(n);
    for &(devid, phys) in &m.stripes {
        let mut b = vec![0u8; len];
        let dev = img
            .device_of(devid)
            .ok_or_else(|| format!("device {devid} of chunk {} is missing", m.logical))?;
        let at = phys + r0 * unit;
        dev.read_at(at, &mut b).map_err(|e| {
            format!(
                "RAID5/6 chunk {} rows {r0}..{r1}: cannot read {} at physical {at}: {e}",
                m.logical,
                img.device_name(devid)
            )
        })?;
        bufs.push(b);
    }
    let mut out = Vec::new();
    let mut p = vec![0u8; unit as usize];
    let mut q = vec![0u8; unit as usize];
    for row in r0..r1 {
        let bits = mask.get(row as usize).copied().unwrap_or(0);
        if bits == 0 {
            continue;
        }
        let o = ((row - r0) * unit) as usize;
        let col = |k: usize| &bufs[(row as usize + k) % n][o..o + unit as usize];
        let data: Vec<&[u8]> = (0..ndata).map(col).collect();
        gen_parity(&data, &mut p, (np == 2).then_some(&mut q[..]));
        let mut run: Option<Mismatch> = None;
        for s in 0..unit / ss {
            if bits & (1u64 << s) == 0 {
                continue;
            }
            let r = (s * ss) as usize..((s + 1) * ss) as usize;
            let mut which = Vec::new();
            if p[r.clone()] != col(ndata)[r.clone()] {
                which.push(0);
            }
            if np == 2 && q[r.clone()] != col(ndata + 1)[r] {
                which.push(1);
            }
            if which.is_empty() {
                continue;
            }
            match &mut run {
                Some(x) if x.sector + x.count == s && x.which == which => x.count += 1,
                _ => {
                    if let Some(x) = run.take() {
                        out.push(x);
                    }
                    run = Some(Mismatch {
                        chunk: c,
                        row,
                        sector: s,
                        count: 1,
                        which,
                    });
                }
            }
        }
        out.extend(run);
    }
    Ok(out)
}

/// The finding for a mismatch: where the parity lies, and whether the data
/// of its column passes its checksums (then the parity is the bad one).
fn describe(
    cx: &Ctx,
    chunks: &[&ChunkMapping],
    data_bad: &HashSet<u64>,
    mm: &Mismatch,
) -> super::Finding {
    let img = cx.img;
    let m = chunks[mm.chunk];
    let ss = img.sectorsize as u64;
    let unit = m.stripe_len;
    let n = m.stripes.len() as u64;
    let ndata = n - m.nparity() as u64;
    let full = m.logical + mm.row * m.full_stripe_len();
    let mut data_good = true;
    for i in 0..ndata {
        for s in mm.sector..mm.sector + mm.count {
            let l = full + i * unit + s * ss;
            let k = cx.ext.recs.partition_point(|r| r.bytenr <= l);
            let Some(r) = k.checked_sub(1).map(|k| cx.ext.recs[k]) else {
                continue;
            };
            if l >= r.bytenr + r.len {
                continue; // unallocated: nothing to verify it by
            }
            // A tree block is a node (its record's length from disk is
            // not trusted to size the read).
            let good = if r.flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
                if r.len != u64::from(img.nodesize) {
                    continue;
                }
                let mut b = vec![0u8; r.len as usize];
                img.read_logical(r.bytenr, &mut b).is_ok()
                    && crate::csum::verify_block(img.csum, &b)
            } else {
                !data_bad.contains(&l)
            };
            data_good &= good;
        }
    }
    let names: Vec<String> = mm
        .which
        .iter()
        .map(|&w| {
            let (devid, phys) = m.stripes[((mm.row + ndata + w as u64) % n) as usize];
            format!(
                "{} at physical {} on {}",
                if w == 0 { "P" } else { "Q" },
                phys + mm.row * unit + mm.sector * ss,
                img.device_name(devid)
            )
        })
        .collect();
    let what = format!(
        "RAID5/6 parity mismatch in the full stripe at logical {full} (chunk {}, row {}), sectors {}..{} of the stripe unit: {}",
        m.logical,
        mm.row,
        mm.sector,
        mm.sector + mm.count,
        names.join(", ")
    );
    let msg = if data_good {
        format!("{what}: the parity is wrong (the data of the column passes its checksums; `btrfs scrub` rewrites it)")
    } else {
        format!("{what}: data of the column fails its checksums too")
    };
    super::findings::F::err(Phase::Checksums, Category::Parity)
        .at(full)
        .msg(msg)
}
