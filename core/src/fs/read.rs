//! Reading file data from its extents: inline (compressed or not),
//! regular (compressed or not, checksums verified as the kernel verifies
//! them), preallocated (zeros) and holes (zeros).

use super::compress;
use super::extents::{extent_key, extents_in};
use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::trans::Store;
use crate::{Error, Result};

/// One run of a file's extent map, as FIEMAP reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// Written data: an inline or regular extent.
    Data,
    /// Preallocated space not yet written (FIEMAP_EXTENT_UNWRITTEN); reads as zeros.
    Unwritten,
}

/// Read `[off, off+len)` of inode `ino` as the filesystem holds it (no
/// page cache), clipped to `size`. Checksums are verified unless the inode
/// is nodatasum: a mismatch is an I/O error, as the kernel returns EIO.
///
/// The caller's range sizes the result (callers read in pieces: a FUSE
/// read, a restore chunk, a page); nothing is sized by a field of an
/// extent item. Every extent is checked against the bounds the format
/// gives ([`FileExtent::check_bounds`]) first, so a compressed extent
/// costs at most 128 KiB on disk and 128 KiB decompressed, and only the
/// part of an uncompressed extent inside the range is read.
pub fn read_range(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    size: u64,
    off: u64,
    len: u64,
    datasum: bool,
) -> Result<Vec<u8>> {
    let end = off.saturating_add(len).min(size);
    if off >= end {
        return Ok(Vec::new());
    }
    let want = usize::try_from(end - off)
        .map_err(|_| Error::Invalid(format!("read of {} bytes", end - off)))?;
    let mut out = vec![0u8; want];
    let ss = st.sectorsize() as u64;
    for (k, d) in extents_in(st, subvol, ino, off, end)? {
        let fe = parse_file_extent(&d).map_err(|e| e.at(0, k))?;
        fe.check_bounds(&k)?;
        match fe {
            FileExtent::Inline { head, data } => {
                let ram = head.ram_bytes.get() as usize;
                let bytes = if head.compression != BTRFS_COMPRESS_NONE {
                    compress::decompress(head.compression, data, ram, ss as usize)
                        .map_err(|e| e.at(0, k))?
                } else {
                    data.to_vec()
                };
                copy_in(&mut out, off, k.offset, &bytes);
            }
            FileExtent::Disk { head, item } => {
                let bytenr = item.disk_bytenr.get();
                if bytenr == 0 || head.type_ == BTRFS_FILE_EXTENT_PREALLOC {
                    continue;
                }
                // check_bounds: the key offset plus num_bytes, and offset
                // plus num_bytes, do not overflow; [a, b) is inside both
                // the extent and the read.
                let (es, ee) = (k.offset, k.offset + item.num_bytes.get());
                let (a, b) = (es.max(off), ee.min(end));
                if a >= b {
                    continue;
                }
                let dst = (a - off) as usize..(b - off) as usize;
                if head.compression != BTRFS_COMPRESS_NONE {
                    // Both at most 128 KiB (check_bounds).
                    let dlen = item.disk_num_bytes.get();
                    let mut disk = vec![0u8; dlen as usize];
                    read_verified(st, bytenr, &mut disk, datasum, ino, k.offset)?;
                    let ram = compress::decompress(
                        head.compression,
                        &disk,
                        item.ram_bytes.get() as usize,
                        ss as usize,
                    )
                    .map_err(|e| e.at(0, k))?;
                    let from = (item.offset.get() + (a - es)) as usize;
                    let src = ram.get(from..from + dst.len()).ok_or_else(|| {
                        Error::corrupt_key_as(
                            crate::CorruptKind::Data,
                            "compressed extent shorter than its reference",
                            0,
                            k,
                        )
                    })?;
                    out[dst].copy_from_slice(src);
                } else {
                    // Whole sectors, so checksums can be verified: at most
                    // the read plus a sector at each end. check_bounds:
                    // bytenr + offset + num_bytes does not overflow.
                    let lo = bytenr + item.offset.get() + (a - es);
                    let slo = lo / ss * ss;
                    let shi = (lo + (b - a)).div_ceil(ss).checked_mul(ss).ok_or_else(|| {
                        Error::corrupt_key_as(
                            crate::CorruptKind::Data,
                            "file extent data at the end of the address space",
                            0,
                            k,
                        )
                    })?;
                    let mut buf = vec![0u8; (shi - slo) as usize];
                    read_verified(st, slo, &mut buf, datasum, ino, k.offset)?;
                    let from = (lo - slo) as usize;
                    out[dst.clone()].copy_from_slice(&buf[from..from + dst.len()]);
                }
            }
        }
    }
    Ok(out)
}

fn copy_in(out: &mut [u8], off: u64, at: u64, bytes: &[u8]) {
    let end = off.saturating_add(out.len() as u64);
    let (a, b) = (at.max(off), at.saturating_add(bytes.len() as u64).min(end));
    if a < b {
        out[(a - off) as usize..(b - off) as usize]
            .copy_from_slice(&bytes[(a - at) as usize..(b - at) as usize]);
    }
}

/// Read data at `bytenr` (whole sectors) and, unless `datasum` is false,
/// verify it. Data that fails its checksums is read again from its other
/// copies, or rebuilt from parity on RAID5/6, stripe unit by stripe unit,
/// until each passes (the kernel's read repair, without the rewrite); a
/// unit no copy gets right is an I/O error.
fn read_verified(
    st: &mut Store,
    bytenr: u64,
    buf: &mut [u8],
    datasum: bool,
    ino: u64,
    file_off: u64,
) -> Result<()> {
    st.data().read_data(bytenr, buf)?;
    if !datasum || verify(st, bytenr, buf, ino, file_off).is_ok() {
        return Ok(());
    }
    let ss = st.sectorsize() as u64;
    let csum = st.image().csum;
    let cs = csum.size();
    let sums = st.csums().csum_lookup(bytenr, buf.len() as u64)?;
    st.data().read_data_checked(bytenr, buf, &mut |at, bytes| {
        let first = ((at - bytenr) / ss) as usize;
        bytes
            .chunks(ss as usize)
            .enumerate()
            .all(|(j, sector)| match sums.get(first + j) {
                Some(w) => csum.compute(sector)[..cs] == *w,
                None => true,
            })
    })?;
    verify(st, bytenr, buf, ino, file_off)
}

/// Compare data read at `bytenr` with its stored checksums; sectors
/// without a checksum pass (nodatasum data, or written before checksums).
fn verify(st: &mut Store, bytenr: u64, data: &[u8], ino: u64, file_off: u64) -> Result<()> {
    let ss = st.sectorsize() as usize;
    let csum = st.image().csum;
    let cs = csum.size();
    let sums = st.csums().csum_lookup(bytenr, data.len() as u64)?;
    for (i, (sector, want)) in data.chunks(ss).zip(sums.iter()).enumerate() {
        if let Some(w) = want {
            if csum.compute(sector)[..cs] != *w {
                return Err(Error::io(
                    format!("inode {ino} data at file offset {file_off}: checksum mismatch at logical {}", bytenr + (i * ss) as u64),
                    std::io::Error::from_raw_os_error(libc::EIO),
                ));
            }
        }
    }
    Ok(())
}

/// The file's extent map as FIEMAP shows it: data and unwritten runs,
/// adjacent runs of one kind merged, holes left out.
pub fn extent_map(st: &mut Store, subvol: u64, ino: u64) -> Result<Vec<(u64, u64, MapKind)>> {
    let mut out: Vec<(u64, u64, MapKind)> = Vec::new();
    let ss = st.sectorsize() as u64;
    for (k, d) in st.items_in(
        crate::trans::TreeId::Tree(subvol),
        extent_key(ino, 0),
        extent_key(ino, u64::MAX),
    )? {
        let fe = parse_file_extent(&d).map_err(|e| e.at(0, k))?;
        // Bounds the ends below: no overflow.
        fe.check_bounds(&k)?;
        let (s, e, kind) = match fe {
            FileExtent::Inline { .. } => (
                k.offset,
                crate::fs::extents::extent_span(ss, k.offset, &d).map_or(u64::MAX, |(_, e)| e),
                MapKind::Data,
            ),
            FileExtent::Disk { head, item } => {
                if item.disk_bytenr.get() == 0 {
                    continue;
                }
                let kind = if head.type_ == BTRFS_FILE_EXTENT_PREALLOC {
                    MapKind::Unwritten
                } else {
                    MapKind::Data
                };
                (k.offset, k.offset + item.num_bytes.get(), kind)
            }
        };
        match out.last_mut() {
            Some(l) if l.1 == s && l.2 == kind => l.1 = e,
            _ => out.push((s, e, kind)),
        }
    }
    Ok(out)
}
