//! Data checksum verification (`--check-data-csum`): read every sector the
//! checksum tree covers, every copy of it, and compare.
//!
//! Reading the data is the whole cost, so the reads are shaped for the
//! device: the csum tree is walked in logical order, a window of it is mapped
//! to physical ranges (every copy), sorted by physical offset and merged into
//! large requests (small gaps are read through), and eight workers take the
//! requests in turn (`BlockDevice::read_once`: direct reads into huge-page
//! buffers, so each is one request to the device and no page cache).
//! The tree walk and the metadata phases go on meanwhile.
//!
//! RAID5/6: each sector has one copy, its data stripe; a sector that fails
//! there is rebuilt from parity and checked again, and a data stripe on a
//! missing device is rebuilt from the rest of its row and verified (the
//! segments of a missing device go to the workers as requests of their
//! own, read through the parity).

use crate::format::consts::*;
use crate::format::key::Key;
use crate::image::Image;
use crate::io::IoBuf;
use crate::tree::TreeIter;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};

/// Checksummed data mapped to the window before the window is read.
const WINDOW_BYTES: u64 = 32 << 20;
/// Largest read request: one huge page of buffer.
const REQUEST_BYTES: u64 = 2 << 20;
/// Unchecksummed bytes read through to join two ranges into one request.
const GAP_BYTES: u64 = 64 << 10;
/// Largest segment (one copy of one run of sectors); requests are built from
/// whole segments, so this bounds how far one can overshoot REQUEST_BYTES.
const SEGMENT_BYTES: u64 = 1 << 20;
/// Readers, each with one request in flight: the device is kept busy with
/// several requests while finished ones are verified (16 MiB of buffers).
const WORKERS: usize = 8;

/// One copy of a run of checksummed sectors.
#[derive(Clone, Copy, Debug)]
struct Segment {
    /// The device the copy lies on.
    devid: u64,
    phys: u64,
    len: u64,
    logical: u64,
    /// Offset of the run's first checksum in the window's `sums`.
    sum_off: usize,
    copies: u8,
    /// The copy is a RAID5/6 data stripe: a bad sector is rebuilt from
    /// parity (and on a missing device every sector is).
    parity: bool,
}

struct Window {
    sums: Vec<u8>,
    /// Sorted by device and physical offset.
    segs: Vec<Segment>,
}

struct Request {
    window: Arc<Window>,
    segs: Range<usize>,
    devid: u64,
    phys: u64,
    len: u64,
}

/// What verification found: sectors checked, and each bad sector (logical
/// address, message), in logical order.
pub(crate) type DataResult = (u64, Vec<(u64, String)>);

/// A bad copy of a sector.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BadCopy {
    /// Logical address of the sector.
    pub logical: u64,
    /// Copies of the sector.
    pub copies: u8,
    /// The device of the bad copy.
    pub devid: u64,
    /// Its physical offset there.
    pub phys: u64,
    /// For a RAID5/6 stripe: whether parity rebuilds the sector right.
    pub rebuilt: Option<bool>,
    /// The checksum the csum tree records for the sector (`csum size`
    /// bytes used).
    pub want: [u8; BTRFS_CSUM_SIZE],
}

/// Every checksummed sector read and verified: how many, each bad copy
/// (unordered), and the checksummed ranges that could not be read at all
/// (logical address, why).
pub(crate) struct DataScan {
    pub sectors: u64,
    pub bad: Vec<BadCopy>,
    pub unmapped: Vec<(u64, String)>,
}

/// Read and verify every checksummed sector of the image.
pub(crate) fn verify_all(img: &Image) -> DataResult {
    let DataScan {
        sectors,
        bad: bad_copies,
        unmapped,
    } = scan(img);
    report(img, sectors, bad_copies, unmapped)
}

/// Read every checksummed sector of the image, every copy, and keep the
/// bad ones.
pub(crate) fn scan(img: &Image) -> DataScan {
    let mut unmapped: Vec<(u64, String)> = Vec::new();
    let empty = |unmapped| DataScan {
        sectors: 0,
        bad: Vec::new(),
        unmapped,
    };
    let Ok(Some(root)) = img.find_root(BTRFS_CSUM_TREE_OBJECTID) else {
        return empty(unmapped);
    };
    let Ok(mut it) = TreeIter::new(
        img,
        root,
        Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0),
    ) else {
        return empty(unmapped);
    };
    let cs = img.csum.size().max(1);
    let ss = (img.sectorsize as u64).max(1);
    let per_seg = (SEGMENT_BYTES / ss).max(1);
    let mut sectors = 0u64;

    let (tx, rx) = sync_channel::<Request>(2 * WORKERS);
    let rx = Mutex::new(rx);
    let bad_copies: Vec<BadCopy> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| scope.spawn(|| worker(img, &rx)))
            .collect();
        let mut win = Window {
            sums: Vec::new(),
            segs: Vec::new(),
        };
        let mut win_bytes = 0u64;
        loop {
            let item = match it.next_item() {
                Some(Ok(item)) => Some(item),
                // A damaged csum leaf is phase 3's finding; verify what was read.
                Some(Err(_)) | None => None,
            };
            let done = item.is_none();
            if let Some(item) = item {
                if item.key.objectid != BTRFS_EXTENT_CSUM_OBJECTID
                    || item.key.ty != BTRFS_EXTENT_CSUM_KEY
                {
                    if item.key.objectid > BTRFS_EXTENT_CSUM_OBJECTID {
                        break_window(&tx, &mut win, &mut win_bytes);
                        break;
                    }
                    continue;
                }
                let Ok(data) = item.data() else { continue };
                let n = (data.len() / cs) as u64;
                sectors += n;
                let base = win.sums.len();
                win.sums.extend_from_slice(&data[..n as usize * cs]);
                add_segments(
                    img,
                    item.key.offset,
                    n,
                    base,
                    per_seg,
                    &mut win.segs,
                    &mut unmapped,
                );
                win_bytes = win_bytes.saturating_add(n.saturating_mul(ss));
            }
            if done || win_bytes >= WINDOW_BYTES {
                break_window(&tx, &mut win, &mut win_bytes);
            }
            if done {
                break;
            }
        }
        drop(tx);
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    DataScan {
        sectors,
        bad: bad_copies,
        unmapped,
    }
}

/// The findings' messages for what [`scan`] found.
fn report(
    img: &Image,
    sectors: u64,
    bad_copies: Vec<BadCopy>,
    unmapped: Vec<(u64, String)>,
) -> DataResult {
    // A sector is bad when any copy of it is; say how many.
    // On several devices, each bad copy is named by device and offset (a
    // scrub's report).
    let mut by_sector: BTreeMap<u64, (u8, u8, Vec<(u64, u64)>)> = BTreeMap::new();
    let mut parity_bad: Vec<(u64, String)> = Vec::new();
    for b in bad_copies {
        let BadCopy {
            logical,
            copies,
            devid,
            phys,
            rebuilt,
            ..
        } = b;
        if let Some(ok) = rebuilt {
            let missing = img.device_of(devid).is_none();
            let m = match (missing, ok) {
                (true, _) => format!(
                    "data at logical {logical} lies on missing {} (physical {phys}) and does not rebuild from parity to its checksum",
                    img.device_name(devid)
                ),
                (false, true) => format!(
                    "data checksum mismatch at logical {logical}: its RAID5/6 stripe at physical {phys} on {} is damaged; parity rebuilds it (`btrfs scrub` rewrites it)",
                    img.device_name(devid)
                ),
                (false, false) => format!(
                    "data checksum mismatch at logical {logical}: its RAID5/6 stripe at physical {phys} on {} is damaged and parity does not rebuild it",
                    img.device_name(devid)
                ),
            };
            parity_bad.push((logical, m));
            continue;
        }
        let e = by_sector.entry(logical).or_insert((0, copies, Vec::new()));
        // Overlapping csum items (a finding of their own) can name a copy twice.
        if !e.2.contains(&(devid, phys)) {
            e.0 = e.0.saturating_add(1).min(e.1);
            e.2.push((devid, phys));
        }
    }
    let multi = img.multi_device();
    let mut bad: Vec<(u64, String)> = by_sector
        .into_iter()
        .map(|(l, (b, n, at))| {
            let mut m = format!("data checksum mismatch at logical {l} ({b} of {n} copies bad");
            if multi {
                for (d, p) in at {
                    m.push_str(&format!("; physical {p} on {}", img.device_name(d)));
                }
            }
            m.push(')');
            (l, m)
        })
        .collect();
    bad.extend(unmapped);
    bad.extend(parity_bad);
    bad.sort_by_key(|b| b.0);
    (sectors, bad)
}

/// Map `n` sectors from `logical` to segments, one per copy, split at chunk
/// ends and at SEGMENT_BYTES.
fn add_segments(
    img: &Image,
    logical: u64,
    n: u64,
    sum_base: usize,
    per_seg: u64,
    segs: &mut Vec<Segment>,
    unmapped: &mut Vec<(u64, String)>,
) {
    let ss = img.sectorsize as u64;
    let cs = img.csum.size().max(1);
    let mut i = 0u64;
    while i < n {
        let at = logical.saturating_add(i * ss);
        let Some(chunk) = img.chunks.lookup(at) else {
            // Skip to the next chunk or the end of the run.
            let next = img.chunks.iter().map(|c| c.logical).find(|&l| l > at);
            let skip = match next {
                Some(l) => ((l - at).div_ceil(ss)).min(n - i),
                None => n - i,
            };
            unmapped.push((
                at,
                format!(
                    "checksummed data [{at}, +{}) is outside every chunk",
                    skip * ss
                ),
            ));
            i += skip;
            continue;
        };
        let in_chunk = (chunk.end() - at) / ss;
        if in_chunk == 0 {
            // A chunk whose end is not sector aligned: nothing to map here.
            unmapped.push((
                at,
                format!(
                    "checksummed sector {at} crosses the end of chunk {}",
                    chunk.logical
                ),
            ));
            i += 1;
            continue;
        }
        let k = in_chunk.min(n - i).min(per_seg);
        // Striped profiles cut the run at stripe units; each piece has its
        // own copies. Copies on a missing device are not read: the open
        // says the device is missing, and a piece with no copy left is lost.
        match chunk.map_range(at - chunk.logical, k * ss) {
            Ok(pieces) => {
                for piece in pieces {
                    let logical = chunk.logical + piece.offset;
                    let sum_off = sum_base + (i + (logical - at) / ss) as usize * cs;
                    if piece.parity.is_some() {
                        // One copy, read directly or (missing device)
                        // rebuilt by the worker.
                        let (devid, p) = piece.copies[0];
                        segs.push(Segment {
                            devid,
                            phys: p,
                            len: piece.len,
                            logical,
                            sum_off,
                            copies: 1,
                            parity: true,
                        });
                        continue;
                    }
                    let present: Vec<(u64, u64)> = piece
                        .copies
                        .iter()
                        .copied()
                        .filter(|c| img.device_of(c.0).is_some())
                        .collect();
                    if present.is_empty() {
                        unmapped.push((
                            logical,
                            format!(
                                "checksummed data [{logical}, +{}) lies only on missing devices",
                                piece.len
                            ),
                        ));
                        continue;
                    }
                    let copies = present.len().min(u8::MAX as usize) as u8;
                    for (devid, p) in present {
                        segs.push(Segment {
                            devid,
                            phys: p,
                            len: piece.len,
                            logical,
                            sum_off,
                            copies,
                            parity: false,
                        });
                    }
                }
            }
            Err(e) => unmapped.push((
                at,
                format!("checksummed data [{at}, +{}) cannot be mapped: {e}", k * ss),
            )),
        }
        i += k;
    }
}

/// Sort the window's segments by physical offset, merge them into requests
/// and hand them to the workers.
fn break_window(tx: &std::sync::mpsc::SyncSender<Request>, win: &mut Window, win_bytes: &mut u64) {
    *win_bytes = 0;
    if win.segs.is_empty() {
        win.sums.clear();
        return;
    }
    let mut w = std::mem::replace(
        win,
        Window {
            sums: Vec::new(),
            segs: Vec::new(),
        },
    );
    w.segs.sort_unstable_by_key(|s| (s.devid, s.phys));
    let w = Arc::new(w);
    let mut start = 0usize;
    let mut devid = w.segs[0].devid;
    let (mut phys, mut end) = (w.segs[0].phys, w.segs[0].phys.saturating_add(w.segs[0].len));
    for (i, s) in w.segs.iter().enumerate().skip(1) {
        let s_end = s.phys.saturating_add(s.len);
        if s.devid == devid
            && s.phys >= end
            && s.phys - end <= GAP_BYTES
            && s_end - phys <= REQUEST_BYTES
        {
            end = s_end;
            continue;
        }
        if tx
            .send(Request {
                window: w.clone(),
                segs: start..i,
                devid,
                phys,
                len: end - phys,
            })
            .is_err()
        {
            return;
        }
        start = i;
        devid = s.devid;
        phys = s.phys;
        end = s_end;
    }
    let _ = tx.send(Request {
        window: w.clone(),
        segs: start..w.segs.len(),
        devid,
        phys,
        len: end - phys,
    });
}

fn worker(img: &Image, rx: &Mutex<Receiver<Request>>) -> Vec<BadCopy> {
    let mut bad = Vec::new();
    let mut buf = IoBuf::new();
    loop {
        let req = match rx.lock() {
            Ok(r) => match r.recv() {
                Ok(req) => req,
                Err(_) => break,
            },
            Err(_) => break,
        };
        verify_request(img, &req, &mut buf, &mut bad);
    }
    bad
}

fn verify_request(img: &Image, req: &Request, buf: &mut IoBuf, bad: &mut Vec<BadCopy>) {
    let segs = &req.window.segs[req.segs.clone()];
    let sums = &req.window.sums;
    let Some(dev) = img.device_of(req.devid) else {
        // Only RAID5/6 stripes of a missing device are asked for: each is
        // rebuilt from its row.
        for s in segs.iter().filter(|s| s.parity) {
            rebuild_segment(img, sums, s, bad);
        }
        return;
    };
    let whole = dev.read_once(req.phys, req.len as usize, buf, &mut |data| {
        for s in segs {
            let o = (s.phys - req.phys) as usize;
            check_segment(img, sums, s, &data[o..o + s.len as usize], bad);
        }
    });
    if whole.is_ok() {
        return;
    }
    // The request failed as a whole: read segment by segment, then sector
    // by sector, so only the unreadable sectors count as bad.
    let ss = img.sectorsize as u64;
    let cs = img.csum.size().max(1);
    let mut sector = vec![0u8; ss as usize];
    for s in segs {
        if dev
            .read_once(s.phys, s.len as usize, buf, &mut |data| {
                check_segment(img, sums, s, data, bad)
            })
            .is_ok()
        {
            continue;
        }
        for k in 0..s.len / ss {
            let want = sums.get(s.sum_off + k as usize * cs..s.sum_off + (k as usize + 1) * cs);
            let good = dev.read_at(s.phys + k * ss, &mut sector).is_ok()
                && want.is_some_and(|w| img.csum.verify(&sector, w));
            if !good {
                bad_sector(img, sums, s, k as usize, bad);
            }
        }
    }
}

fn check_segment(img: &Image, sums: &[u8], s: &Segment, data: &[u8], bad: &mut Vec<BadCopy>) {
    let ss = img.sectorsize as usize;
    let cs = img.csum.size().max(1);
    for (k, sector) in data.chunks_exact(ss).enumerate() {
        let want = sums.get(s.sum_off + k * cs..s.sum_off + (k + 1) * cs);
        if !want.is_some_and(|w| img.csum.verify(sector, w)) {
            bad_sector(img, sums, s, k, bad);
        }
    }
}

/// Whether every sector of `data`, the sectors of segment `s` from its
/// `first`th on, matches its checksum.
fn sectors_ok(img: &Image, sums: &[u8], s: &Segment, first: usize, data: &[u8]) -> bool {
    let ss = img.sectorsize as usize;
    let cs = img.csum.size().max(1);
    data.chunks_exact(ss).enumerate().all(|(j, sector)| {
        let k = first + j;
        sums.get(s.sum_off + k * cs..s.sum_off + (k + 1) * cs)
            .is_some_and(|w| img.csum.verify(sector, w))
    })
}

/// Record sector `k` of segment `s` as bad; on a RAID5/6 stripe, with
/// whether parity rebuilds it.
fn bad_sector(img: &Image, sums: &[u8], s: &Segment, k: usize, bad: &mut Vec<BadCopy>) {
    let ss = img.sectorsize as u64;
    let logical = s.logical + k as u64 * ss;
    let rebuilt = s.parity.then(|| {
        let mut b = vec![0u8; ss as usize];
        img.read_logical_checked(logical, &mut b, &mut |_, d| sectors_ok(img, sums, s, k, d))
            .is_ok_and(|failed| failed.is_empty())
    });
    bad.push(BadCopy {
        logical,
        copies: s.copies,
        devid: s.devid,
        phys: s.phys + k as u64 * ss,
        rebuilt,
        want: want_of(img, sums, s, k),
    });
}

/// The checksum recorded for sector `k` of segment `s`.
fn want_of(img: &Image, sums: &[u8], s: &Segment, k: usize) -> [u8; BTRFS_CSUM_SIZE] {
    let cs = img.csum.size().max(1);
    let mut w = [0u8; BTRFS_CSUM_SIZE];
    if let Some(b) = sums.get(s.sum_off + k * cs..s.sum_off + (k + 1) * cs) {
        w[..b.len()].copy_from_slice(b);
    }
    w
}

/// Rebuild segment `s` (a RAID5/6 stripe on a missing device) from its row
/// and verify it; sectors that do not rebuild to their checksum are bad.
fn rebuild_segment(img: &Image, sums: &[u8], s: &Segment, bad: &mut Vec<BadCopy>) {
    let ss = img.sectorsize as usize;
    let mut data = vec![0u8; s.len as usize];
    let ok = img
        .read_logical_checked(s.logical, &mut data, &mut |_, d| {
            sectors_ok(img, sums, s, 0, d)
        })
        .is_ok_and(|failed| failed.is_empty());
    if ok {
        return;
    }
    for (k, sector) in data.chunks_exact(ss).enumerate() {
        if !sectors_ok(img, sums, s, k, sector) {
            bad.push(BadCopy {
                logical: s.logical + (k * ss) as u64,
                copies: 1,
                devid: s.devid,
                phys: s.phys + (k * ss) as u64,
                rebuilt: Some(false),
                want: want_of(img, sums, s, k),
            });
        }
    }
}
