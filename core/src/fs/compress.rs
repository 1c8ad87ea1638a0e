//! Compressed extents in the kernel's formats: zlib (one zlib stream per
//! extent), zstd (one frame, window at most 128 KiB so the kernel's
//! workspace can decode it) and lzo (a 4-byte total length, then per
//! uncompressed sector a 4-byte segment length and an LZO1X block; a
//! segment header never straddles a sector boundary).

use crate::format::consts::*;
use crate::format::file_extent::{MAX_COMPRESSED, MAX_UNCOMPRESSED};
use crate::{Error, Result};
use std::io::{Read, Write};

/// Largest zstd window the kernel decodes (ZSTD_BTRFS_MAX_WINDOWLOG).
const ZSTD_WINDOW_LOG: u32 = 17;

/// A compression method and level as the mount options name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Method {
    /// BTRFS_COMPRESS_ZLIB, _LZO or _ZSTD.
    pub kind: u8,
    /// Compression level: zlib 1..=9, zstd 1..=15 (default 3); always 0 for lzo.
    pub level: i32,
}

impl Method {
    /// `zlib`, `zlib:5`, `lzo`, `zstd`, `zstd:9` (`yes`/empty: zlib).
    pub fn parse(s: &str) -> Option<Method> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l.parse::<i32>().ok()?)),
            None => (s, None),
        };
        let (kind, def, range) = match name {
            "" | "yes" | "zlib" => (BTRFS_COMPRESS_ZLIB, 3, 1..=9),
            "lzo" => (BTRFS_COMPRESS_LZO, 0, 0..=0),
            "zstd" => (BTRFS_COMPRESS_ZSTD, 3, 1..=15),
            _ => return None,
        };
        let level = level.unwrap_or(def);
        range.contains(&level).then_some(Method { kind, level })
    }

    /// `kind` at `level` as btrfs_compress_set_level makes it: 0 is the
    /// type's default, anything else is clamped to the type's range.
    pub fn with_level(kind: u8, level: i32) -> Method {
        let (def, lo, hi) = match kind {
            BTRFS_COMPRESS_ZLIB => (3, 1, 9),
            BTRFS_COMPRESS_ZSTD => (3, 1, 15),
            _ => (0, 0, 0),
        };
        Method {
            kind,
            level: if level == 0 { def } else { level.clamp(lo, hi) },
        }
    }
}

fn bad(what: &str) -> Error {
    Error::corrupt_as(
        crate::CorruptKind::Data,
        format!("compressed extent: {what}"),
        0,
    )
}

/// Decompress `src` (an extent's on-disk bytes) to `ram_bytes` bytes. A
/// stream that ends early is zero-filled, as the kernel does; a stream
/// with more to give stops at `ram_bytes` (each decoder writes into the
/// output buffer and nowhere else). Both sizes come from disk: an extent
/// claiming more than [`MAX_UNCOMPRESSED`] bytes of data or more than
/// [`MAX_COMPRESSED`] on disk is `Corrupt` before anything is allocated.
pub fn decompress(kind: u8, src: &[u8], ram_bytes: usize, sectorsize: usize) -> Result<Vec<u8>> {
    if ram_bytes as u64 > MAX_UNCOMPRESSED {
        return Err(bad(&format!(
            "{ram_bytes} bytes of data claimed, more than the {MAX_UNCOMPRESSED} a compressed extent holds"
        )));
    }
    if src.len() as u64 > MAX_COMPRESSED {
        return Err(bad(&format!(
            "{} bytes on disk, more than the {MAX_COMPRESSED} a compressed extent takes",
            src.len()
        )));
    }
    if sectorsize == 0 {
        return Err(Error::Invalid("decompress: sector size 0".into()));
    }
    let mut out = vec![0u8; ram_bytes];
    match kind {
        BTRFS_COMPRESS_ZLIB => {
            let mut d = flate2::read::ZlibDecoder::new(src);
            read_up_to(&mut d, &mut out).map_err(|e| bad(&format!("zlib: {e}")))?;
        }
        BTRFS_COMPRESS_ZSTD => {
            // One frame; the sector padding after it is not another frame.
            let flen = zstd::zstd_safe::find_frame_compressed_size(src)
                .map_err(|e| bad(&format!("zstd: {}", zstd::zstd_safe::get_error_name(e))))?;
            let frame = src
                .get(..flen)
                .ok_or_else(|| bad("zstd frame past the end"))?;
            let mut d = zstd::stream::read::Decoder::with_buffer(frame)
                .map_err(|e| bad(&format!("zstd: {e}")))?
                .single_frame();
            d.window_log_max(ZSTD_WINDOW_LOG + 1)
                .map_err(|e| bad(&format!("zstd: {e}")))?;
            read_up_to(&mut d, &mut out).map_err(|e| bad(&format!("zstd: {e}")))?;
        }
        BTRFS_COMPRESS_LZO => lzo_decompress(src, &mut out, sectorsize)?,
        k => return Err(Error::Unsupported(format!("compression type {k}"))),
    }
    Ok(out)
}

/// Fill `out` from `r` until it ends or `out` is full; what the stream
/// did not fill is zeros (a reader may scribble past what it returns).
fn read_up_to(r: &mut dyn Read, out: &mut [u8]) -> std::io::Result<()> {
    let mut n = 0;
    while n < out.len() {
        match r.read(&mut out[n..])? {
            0 => break,
            k => n += k,
        }
    }
    out[n..].fill(0);
    Ok(())
}

fn le32(b: &[u8], at: usize) -> Result<usize> {
    at.checked_add(4)
        .and_then(|end| b.get(at..end))
        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as usize)
        .ok_or_else(|| bad("lzo header past the end"))
}

/// The most bytes LZO1X turns `n` input bytes into (lzo1x_worst_compress):
/// a segment of one sector longer than this is damage (the kernel refuses
/// it too, "unexpectedly large lzo segment len").
fn lzo_worst(n: usize) -> usize {
    n + n / 16 + 64 + 3
}

/// The kernel's lzo layout: a 4-byte total length, then per sector of
/// output a 4-byte segment length and the segment. Every length is
/// checked against what is left before it is used, so the loop moves
/// forward by at least 4 bytes a round and ends within `total`.
fn lzo_decompress(src: &[u8], out: &mut [u8], ss: usize) -> Result<()> {
    let total = le32(src, 0)?;
    if total > src.len() || total < 8 {
        return Err(bad(&format!(
            "lzo total length {total} of {} bytes",
            src.len()
        )));
    }
    let mut pos = 4usize;
    let mut done = 0usize;
    while done < out.len() && pos < total {
        // A header that would straddle a sector starts at the next one.
        if ss - pos % ss < 4 {
            pos = pos.div_ceil(ss) * ss;
            if pos >= total {
                break;
            }
        }
        let seg = le32(src, pos)?;
        pos += 4;
        if seg > lzo_worst(ss) {
            return Err(bad(&format!(
                "lzo segment of {seg} bytes at byte {}, more than a sector compresses to ({})",
                pos - 4,
                lzo_worst(ss)
            )));
        }
        let body = pos
            .checked_add(seg)
            .filter(|&end| end <= total)
            .and_then(|end| src.get(pos..end))
            .ok_or_else(|| bad("lzo segment past the end"))?;
        // A segment holds up to one sector (the last one may be shorter).
        let room = ss.min(out.len() - done);
        lzo::decompress_into(body, &mut out[done..done + room])
            .map_err(|e| bad(&format!("lzo: {e:?}")))?;
        done += room;
        pos += seg;
    }
    Ok(())
}

/// The kernel's compressibility heuristic (btrfs_compress_heuristic) on
/// the first 128 KiB of a range: samples of 16 bytes every 256 bytes;
/// repeated data, few distinct bytes, a small core byte set or low entropy
/// say compress.
pub fn heuristic(data: &[u8]) -> bool {
    const SAMPLE: usize = 16;
    const STEP: usize = 256;
    let data = &data[..data.len().min(128 << 10)];
    let mut sample = Vec::with_capacity(data.len() / STEP * SAMPLE + SAMPLE);
    for page in data.chunks(4096) {
        let mut i = 0;
        while i + SAMPLE < page.len() {
            sample.extend_from_slice(&page[i..i + SAMPLE]);
            i += STEP;
        }
    }
    let n = sample.len();
    if n == 0 || sample[..n / 2] == sample[n - n / 2..] {
        return true;
    }
    let mut count = [0u32; 256];
    for &b in &sample {
        count[b as usize] += 1;
    }
    if count.iter().filter(|&&c| c > 0).count() < 64 {
        return true;
    }
    let mut sorted = count;
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let threshold = n as u64 * 90 / 100;
    let mut sum = 0u64;
    let mut core = 0;
    for &c in sorted.iter() {
        sum += c as u64;
        core += 1;
        if sum > threshold {
            break;
        }
    }
    if core <= 64 {
        return true;
    }
    if core >= 200 {
        return false;
    }
    // Shannon entropy as a percentage of 8 bits per byte.
    let mut h = 0f64;
    for &c in count.iter().filter(|&&c| c > 0) {
        let p = c as f64 / n as f64;
        h -= p * p.log2();
    }
    (h / 8.0 * 100.0) < 80.0
}

/// Compress `src` (whole sectors, or a whole small file for an inline
/// extent). None when the algorithm gives up as the kernel's does: zlib
/// and zstd when the output is not smaller, lzo when it grew past two
/// sectors of input. Whether a regular extent keeps the result (it must
/// save a sector) is the caller's rule.
pub fn compress(m: Method, src: &[u8], sectorsize: usize) -> Option<Vec<u8>> {
    let out = match m.kind {
        BTRFS_COMPRESS_ZLIB => {
            let mut e = flate2::write::ZlibEncoder::new(
                Vec::new(),
                flate2::Compression::new(m.level as u32),
            );
            e.write_all(src).ok()?;
            e.finish().ok()?
        }
        BTRFS_COMPRESS_ZSTD => zstd_compress(src, m.level)?,
        BTRFS_COMPRESS_LZO => {
            // The kernel's lzo gives up only on growth past two sectors of
            // input (lzo_compress_folios), so a tiny file may store a
            // larger compressed inline extent.
            let out = lzo_compress(src, sectorsize);
            let grew = out.len() > src.len();
            return (!grew || src.len() <= 2 * sectorsize).then_some(out);
        }
        _ => return None,
    };
    (out.len() < src.len()).then_some(out)
}

thread_local! {
    /// One zstd compression context per thread and level: making one is a
    /// tenth of the work of compressing 128 KiB.
    static ZSTD_CCTX: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// A zstd frame as the kernel writes one: window log 17, no checksum, the
/// content size in the header.
fn zstd_compress(src: &[u8], level: i32) -> Option<Vec<u8>> {
    use zstd::zstd_safe::CParameter;
    ZSTD_CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            let mut z = zstd::bulk::Compressor::new(level).ok()?;
            z.set_parameter(CParameter::WindowLog(ZSTD_WINDOW_LOG))
                .ok()?;
            z.set_parameter(CParameter::ChecksumFlag(false)).ok()?;
            z.set_parameter(CParameter::ContentSizeFlag(true)).ok()?;
            *c = Some((level, z));
        }
        let (_, z) = c.as_mut()?;
        z.compress(src).ok()
    })
}

/// Whether `compressed` bytes standing for `total_in` bytes of input (whole
/// sectors) are kept: stored in whole sectors they must save at least one
/// (compress_file_range's test; the writeback and mkfs --compress both
/// decide by it).
pub fn saves_a_sector(compressed: usize, total_in: u64, ss: u64) -> bool {
    (compressed as u64).div_ceil(ss) * ss + ss <= total_in
}

fn lzo_compress(src: &[u8], ss: usize) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    for seg in src.chunks(ss) {
        let c = lzo1x::compress(seg, lzo1x::CompressLevel::default());
        if ss - out.len() % ss < 4 {
            let pad = out.len().div_ceil(ss) * ss;
            out.resize(pad, 0);
        }
        out.extend_from_slice(&(c.len() as u32).to_le_bytes());
        out.extend_from_slice(&c);
    }
    let total = out.len() as u32;
    out[..4].copy_from_slice(&total.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_method() {
        let mut data = vec![0u8; 128 << 10];
        for (i, b) in data.iter_mut().enumerate() {
            *b = ((i / 7) % 13) as u8;
        }
        for m in ["zlib", "zlib:9", "lzo", "zstd", "zstd:15"] {
            let m = Method::parse(m).unwrap();
            let c = compress(m, &data, 4096).unwrap();
            assert!(c.len() < data.len() / 4, "{m:?}: {}", c.len());
            assert_eq!(
                decompress(m.kind, &c, data.len(), 4096).unwrap(),
                data,
                "{m:?}"
            );
        }
        // Incompressible data is refused.
        let mut rnd = vec![0u8; 8192];
        crate::workload::content::Prng::new(3).fill(&mut rnd);
        assert!(compress(Method::parse("zstd").unwrap(), &rnd, 4096).is_none());
        assert!(Method::parse("zstd:99").is_none() && Method::parse("bogus").is_none());
        // A frame shorter than the extent (padding after it) decodes, and
        // the rest is zeros.
        for m in ["zlib", "lzo", "zstd"] {
            let m = Method::parse(m).unwrap();
            let short = &data[..70000];
            let mut c = compress(m, short, 4096).unwrap();
            c.resize(c.len().div_ceil(4096) * 4096, 0);
            let d = decompress(m.kind, &c, 73728, 4096).unwrap();
            assert_eq!(&d[..70000], short, "{m:?}");
            assert!(
                d[70000..].iter().all(|&b| b == 0),
                "{m:?} tail {:?}",
                &d[70000..70040]
            );
        }
        // Damaged input is an error, not a panic.
        let c = compress(Method::parse("lzo").unwrap(), &data, 4096).unwrap();
        assert!(decompress(BTRFS_COMPRESS_LZO, &c[..c.len() / 2], data.len(), 4096).is_err());
        assert!(decompress(BTRFS_COMPRESS_ZLIB, &[1, 2, 3], 100, 4096).is_err());
    }

    /// Sizes from disk are bounded before anything is allocated: a
    /// compressed extent claiming 2 GiB of data, or more than 128 KiB on
    /// disk, or an lzo segment longer than a sector compresses to, is a
    /// `Corrupt` error.
    #[test]
    fn claimed_sizes_are_bounded() {
        let data = vec![7u8; 8192];
        for m in ["zlib", "lzo", "zstd"] {
            let m = Method::parse(m).unwrap();
            let c = compress(m, &data, 4096).unwrap();
            let e = decompress(m.kind, &c, 2 << 30, 4096).unwrap_err();
            assert!(
                matches!(e, Error::Corrupt { .. }) && e.to_string().contains("2147483648"),
                "{m:?}: {e}"
            );
            let big = vec![0u8; (MAX_COMPRESSED + 1) as usize];
            assert!(matches!(
                decompress(m.kind, &big, 4096, 4096),
                Err(Error::Corrupt { .. })
            ));
            // The largest claim the format allows decodes (zeros past the
            // stream's end).
            let d = decompress(m.kind, &c, MAX_UNCOMPRESSED as usize, 4096).unwrap();
            assert_eq!(&d[..8192], &data[..]);
        }
        // An lzo segment length of 1 GiB, and one past the total length.
        let mut c = compress(Method::parse("lzo").unwrap(), &data, 4096).unwrap();
        let seg = u32::from_le_bytes(c[4..8].try_into().unwrap());
        c[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
        let e = decompress(BTRFS_COMPRESS_LZO, &c, 8192, 4096).unwrap_err();
        assert!(e.to_string().contains("lzo segment of 1073741824"), "{e}");
        c[4..8].copy_from_slice(&(seg + 4000).to_le_bytes());
        assert!(matches!(
            decompress(BTRFS_COMPRESS_LZO, &c, 8192, 4096),
            Err(Error::Corrupt { .. })
        ));
        // A total length past the bytes there are, or with no segment.
        for total in [u32::MAX, 3, 4] {
            let mut c = c.clone();
            c[..4].copy_from_slice(&total.to_le_bytes());
            assert!(decompress(BTRFS_COMPRESS_LZO, &c, 8192, 4096).is_err());
        }
    }
}
