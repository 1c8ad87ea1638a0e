//! What a benchmark's clients were told is durable, and the check after a
//! crash that it is there (`btrkit-shell bench ... --crash-check`).
//!
//! Every block a client writes carries a stamp (file, block, sequence
//! number) and a body derived from the sequence number, so after a crash
//! each block names the write it holds, and a block mixed from two writes
//! (torn) matches none. A file's writes are recorded in the order the
//! engine applied them; an fsync acknowledges the prefix of that order that
//! existed when it started, an O_SYNC write itself and everything before it.
//!
//! After the crash and recovery, a block is right when it holds the last
//! acknowledged write to it or a later write (a later commit or log sync
//! may have carried it), or, with no acknowledged write to it, its content
//! at the start of the run or any of the run's writes.

use crate::fs::{Filesystem, Loc, MountOptions};
use crate::io::{BlockDevice, FileDevice, VolatileFile};
use crate::{Error, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const MAGIC: &[u8; 8] = b"BTRKDURA";
/// magic, file, block, sequence number.
const STAMP_LEN: usize = 32;
/// The smallest block that holds a stamp and enough body to tell writes apart.
pub const MIN_BLOCK: u64 = 64;

/// Fill `buf` as write `seq` of `block` of `file`.
pub fn stamp(buf: &mut [u8], file: u64, block: u64, seq: u64) {
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&file.to_le_bytes());
    buf[16..24].copy_from_slice(&block.to_le_bytes());
    buf[24..32].copy_from_slice(&seq.to_le_bytes());
    fill_body(&mut buf[STAMP_LEN..], seq);
}

fn fill_body(body: &mut [u8], seq: u64) {
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in body.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// (file, block, seq) of a whole, untorn stamped block.
pub fn read_stamp(buf: &[u8]) -> Option<(u64, u64, u64)> {
    if buf.len() < STAMP_LEN || &buf[..8] != MAGIC {
        return None;
    }
    let u = |r: std::ops::Range<usize>| u64::from_le_bytes(buf[r].try_into().unwrap_or([0; 8]));
    let (file, block, seq) = (u(8..16), u(16..24), u(24..32));
    let mut body = vec![0u8; buf.len() - STAMP_LEN];
    fill_body(&mut body, seq);
    (body == buf[STAMP_LEN..]).then_some((file, block, seq))
}

/// The bytes `[off, off + len)` of a file whose every byte is a function of
/// its inode and position (so any write to a place writes the same bytes,
/// and a byte from elsewhere or a hole does not match).
pub fn position_pattern(ino: u64, off: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut w = off / 8;
    let skip = (off % 8) as usize;
    while out.len() < len + skip {
        let mut z =
            (ino.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
        w += 1;
    }
    out.drain(..skip);
    out.truncate(len);
    out
}

/// Content identity of a block that carries no stamp.
pub fn content_hash(buf: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(buf, 0)
}

struct FileLedger {
    /// Every write as (block, seq), in the order the engine applied them
    /// (a write and its entry happen under this lock).
    log: Vec<(u64, u64)>,
    /// The prefix of `log` a sync acknowledged.
    durable: usize,
}

/// The writes of one run, per file, and what was acknowledged.
pub struct Ledger {
    block_size: u64,
    next_seq: AtomicU64,
    files: Vec<Mutex<FileLedger>>,
    /// Per file, per block: the content hash at the start of the run.
    initial: Vec<Vec<u64>>,
}

impl Ledger {
    /// A ledger over files whose blocks had these contents when the run
    /// started ([`initial_hashes`]).
    pub fn new(block_size: u64, initial: Vec<Vec<u64>>) -> Result<Ledger> {
        if block_size < MIN_BLOCK {
            return Err(Error::Invalid(format!("a crash check needs blocks of at least {MIN_BLOCK} bytes (the stamp of each write)")));
        }
        let files = initial
            .iter()
            .map(|_| {
                Mutex::new(FileLedger {
                    log: Vec::new(),
                    durable: 0,
                })
            })
            .collect();
        Ok(Ledger {
            block_size,
            next_seq: AtomicU64::new(1),
            files,
            initial,
        })
    }

    fn file(&self, f: usize) -> Result<MutexGuard<'_, FileLedger>> {
        let m = self
            .files
            .get(f)
            .ok_or_else(|| Error::Invalid(format!("file {f} is not in the ledger")))?;
        m.lock()
            .map_err(|_| Error::Internal("crash-check ledger lock poisoned".into()))
    }

    /// Write a stamped block `block` of file `f` through `write`; with
    /// `synced` (O_SYNC/O_DSYNC) it is acknowledged when `write` returns.
    pub fn write(
        &self,
        f: usize,
        block: u64,
        synced: bool,
        write: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut fl = self.file(f)?;
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let mut buf = vec![0u8; self.block_size as usize];
        stamp(&mut buf, f as u64, block, seq);
        write(&buf)?;
        fl.log.push((block, seq));
        if synced {
            fl.durable = fl.log.len();
        }
        Ok(())
    }

    /// fsync file `f` through `sync`: what was written before it started
    /// is acknowledged when it returns.
    pub fn fsync(&self, f: usize, sync: impl FnOnce() -> Result<()>) -> Result<()> {
        let n = self.file(f)?.log.len();
        sync()?;
        let mut fl = self.file(f)?;
        fl.durable = fl.durable.max(n);
        Ok(())
    }

    /// Writes recorded and writes acknowledged, over all files.
    pub fn counts(&self) -> Result<(u64, u64)> {
        let mut w = 0;
        let mut d = 0;
        for i in 0..self.files.len() {
            let fl = self.file(i)?;
            w += fl.log.len() as u64;
            d += fl.durable as u64;
        }
        Ok((w, d))
    }

    /// Check every block after a crash; `read(file, block)` gives its
    /// content as the recovered filesystem has it.
    pub fn verify(
        &self,
        mut read: impl FnMut(usize, u64) -> Result<Vec<u8>>,
    ) -> Result<CrashCheck> {
        let mut r = CrashCheck {
            unit: "block",
            ..Default::default()
        };
        (r.writes, r.acknowledged) = self.counts()?;
        for f in 0..self.files.len() {
            let fl = self.file(f)?;
            // block -> [(log index, seq)], and the log index of the last
            // acknowledged write to it.
            let mut per_block: HashMap<u64, Vec<(usize, u64)>> = HashMap::new();
            for (i, &(b, s)) in fl.log.iter().enumerate() {
                per_block.entry(b).or_default().push((i, s));
            }
            let blocks = self.initial[f].len() as u64;
            for b in 0..blocks {
                let writes = per_block.get(&b).map(Vec::as_slice).unwrap_or(&[]);
                let required = writes
                    .iter()
                    .filter(|(i, _)| *i < fl.durable)
                    .map(|(i, _)| *i)
                    .max();
                r.checked += 1;
                if required.is_some() {
                    r.checked_acknowledged += 1;
                }
                // A block that no longer reads (its checksum fails) is a
                // finding, not the end of the check.
                let got = match read(f, b) {
                    Ok(g) => Ok(g),
                    Err(e) if e.as_errno() == libc::EIO => Err(format!("unreadable: {e}")),
                    Err(e) => return Err(e),
                };
                // Which version the block holds: Some(log index) for a
                // write of this run, None for the start content.
                let version = got.and_then(|got| match read_stamp(&got) {
                    Some((gf, gb, s)) if gf == f as u64 && gb == b => {
                        match writes.iter().find(|(_, ws)| *ws == s) {
                            Some(&(i, _)) => Ok(Some(i)),
                            None => Err(format!(
                                "a stamp of write {s}, which this run did not make to this block"
                            )),
                        }
                    }
                    Some((gf, gb, s)) => Err(format!("write {s} of file {gf} block {gb}")),
                    None if got.len() as u64 == self.block_size
                        && content_hash(&got) == self.initial[f][b as usize] =>
                    {
                        Ok(None)
                    }
                    None if got.len() as u64 != self.block_size => Err(format!(
                        "{} bytes where a block of {} was",
                        got.len(),
                        self.block_size
                    )),
                    None => Err("content that no write made (torn or foreign)".to_string()),
                });
                let problem = match (version, required) {
                    (Err(e), _) => {
                        r.garbage += 1;
                        Some(e)
                    }
                    (Ok(None), Some(_)) => {
                        r.lost += 1;
                        Some("its content from before the run, though a write to it was acknowledged".to_string())
                    }
                    (Ok(Some(i)), Some(req)) if i < req => {
                        r.lost += 1;
                        Some(format!(
                            "an older write than the one acknowledged (write {} of {})",
                            i + 1,
                            req + 1
                        ))
                    }
                    _ => None,
                };
                if let Some(p) = problem {
                    if r.examples.len() < 8 {
                        r.examples.push(format!(
                            "file {f} block {b} (offset {}): {p}",
                            b * self.block_size
                        ));
                    }
                }
            }
        }
        Ok(r)
    }
}

/// What `--crash-check` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CrashCheck {
    /// The recovery replayed an fsync log.
    pub replayed_log: bool,
    /// Errors the checker found in the recovered image.
    pub checker_errors: u64,
    /// What is checked: fileio checks blocks, dbench files.
    pub unit: &'static str,
    /// Writes the clients made, over all files.
    pub writes: u64,
    /// Acknowledgements of durability: fileio counts the writes an fsync or
    /// an O_SYNC/O_DSYNC write covered, dbench the Flushes that covered a
    /// file.
    pub acknowledged: u64,
    /// Units examined (blocks of every file, or files).
    pub checked: u64,
    /// Units with an acknowledged write.
    pub checked_acknowledged: u64,
    /// Units that lost an acknowledged write.
    pub lost: u64,
    /// Units whose content matches no write and not the start content.
    pub garbage: u64,
    /// Up to eight descriptions of the problems found (unit, offset, what it
    /// held), for the report.
    pub examples: Vec<String>,
}

impl CrashCheck {
    /// Take the verdict of a verification into a check that holds the
    /// recovery's facts (log replayed, checker errors) and maybe examples.
    pub fn absorb(&mut self, v: CrashCheck) {
        let examples = std::mem::take(&mut self.examples);
        *self = CrashCheck {
            replayed_log: self.replayed_log,
            checker_errors: self.checker_errors,
            examples,
            ..v
        };
        self.examples.extend(v.examples);
        self.examples.truncate(8);
    }

    /// Nothing acknowledged was lost, nothing unrecognisable was found, and the
    /// checker found no error in the recovered image.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.garbage == 0 && self.checker_errors == 0
    }
}

/// Per file, per `block_size` block: the content hash as `fs` has it.
pub fn initial_hashes(
    fs: &mut Filesystem,
    files: &[Loc],
    size: u64,
    block_size: u64,
) -> Result<Vec<Vec<u64>>> {
    let mut out = Vec::with_capacity(files.len());
    for &l in files {
        let mut h = Vec::with_capacity((size / block_size) as usize);
        let mut off = 0;
        while off + block_size <= size {
            let d = fs.read(l, off, block_size)?;
            h.push(content_hash(&d));
            off += block_size;
        }
        out.push(h);
    }
    Ok(out)
}

/// The power failure that ends a checked run: every write since the last
/// flush is taken back, then the image is opened again as a mount would
/// (its log replayed by btrkit's replay) and the checker runs on it.
pub fn crash_and_recover(
    dev: &VolatileFile,
    image: &Path,
    mount: MountOptions,
    r: &mut CrashCheck,
) -> Result<Filesystem> {
    dev.power_fail(None)?;
    let file: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(image, true)?);
    let sb = crate::image::read_superblock(file.as_ref(), 0)?;
    if sb.log_root.get() != 0 {
        let mut st = crate::trans::Store::open_for_replay(file.clone())?;
        crate::log::replay::replay(&mut st, Default::default())?;
        r.replayed_log = true;
    }
    let img = crate::image::Image::open(file.clone(), Default::default())?;
    let report = crate::check::check_image(
        &img,
        crate::check::CheckOptions::own_writes(),
        &crate::check::NoProgress,
    );
    // A damaged DUP copy counts: the engine wrote both.
    r.checker_errors = report.errors
        + report
            .findings
            .iter()
            .filter(|f| f.category.is_damaged_copy())
            .count() as u64;
    drop(img);
    Filesystem::mount(file, mount, crate::log::LogState::boxed())
}

/// Check the files of a run (the same inode numbers under the same names
/// in `dir`) on the recovered filesystem.
pub fn verify_files(
    fs: &mut Filesystem,
    dir: Loc,
    names: &[String],
    files: &[Loc],
    ledger: &Ledger,
    r: &mut CrashCheck,
) -> Result<()> {
    let mut found = Vec::with_capacity(files.len());
    for (n, l) in names.iter().zip(files) {
        match fs.lookup(dir, n.as_bytes())? {
            Some(x) if x == *l => found.push(Some(x)),
            _ => {
                if r.examples.len() < 8 {
                    r.examples.push(format!("{n}: missing after the crash"));
                }
                found.push(None);
            }
        }
    }
    let bs = ledger.block_size;
    let v = ledger.verify(|f, b| match found.get(f).copied().flatten() {
        Some(l) => fs.read(l, b * bs, bs),
        None => Ok(Vec::new()),
    })?;
    r.absorb(v);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_patterns_agree_at_any_offset() {
        let whole = position_pattern(9, 0, 100);
        assert_eq!(position_pattern(9, 13, 50), whole[13..63].to_vec());
        assert_ne!(position_pattern(10, 0, 100), whole);
    }

    #[test]
    fn stamps_name_their_write_and_torn_blocks_match_none() {
        let mut a = vec![0u8; 4096];
        stamp(&mut a, 3, 7, 42);
        assert_eq!(read_stamp(&a), Some((3, 7, 42)));
        let mut b = vec![0u8; 4096];
        stamp(&mut b, 3, 7, 43);
        let mut torn = a.clone();
        torn[2048..].copy_from_slice(&b[2048..]);
        assert_eq!(read_stamp(&torn), None);
    }

    #[test]
    fn verify_requires_the_acknowledged_write_or_a_later_one() {
        let bs = 64u64;
        let start = vec![0u8; bs as usize];
        let lg = Ledger::new(bs, vec![vec![content_hash(&start); 2]]).unwrap();
        let mut disk: Vec<Vec<u8>> = vec![start.clone(), start.clone()];
        let mut written: Vec<Vec<u8>> = Vec::new();
        lg.write(0, 0, false, |b| {
            written.push(b.to_vec());
            Ok(())
        })
        .unwrap();
        lg.fsync(0, || Ok(())).unwrap();
        lg.write(0, 0, false, |b| {
            written.push(b.to_vec());
            Ok(())
        })
        .unwrap();
        // Block 0 holds the acknowledged write, block 1 its start: right.
        disk[0] = written[0].clone();
        let r = lg.verify(|_, b| Ok(disk[b as usize].clone())).unwrap();
        assert!(r.ok() && r.checked_acknowledged == 1, "{r:?}");
        // The later, unacknowledged write: right too.
        disk[0] = written[1].clone();
        assert!(lg.verify(|_, b| Ok(disk[b as usize].clone())).unwrap().ok());
        // The start content: an acknowledged write lost.
        disk[0] = start.clone();
        let r = lg.verify(|_, b| Ok(disk[b as usize].clone())).unwrap();
        assert_eq!((r.lost, r.garbage), (1, 0));
        // Torn: garbage.
        let mut torn = written[0].clone();
        torn[40..].copy_from_slice(&written[1][40..]);
        disk[0] = torn;
        let r = lg.verify(|_, b| Ok(disk[b as usize].clone())).unwrap();
        assert_eq!((r.lost, r.garbage), (0, 1));
        // A block whose checksum fails is a finding that names it; the
        // check goes on to the next block.
        disk[0] = written[0].clone();
        let r = lg
            .verify(|_, b| {
                if b == 1 {
                    return Err(Error::io(
                        "checksum mismatch",
                        std::io::Error::from_raw_os_error(libc::EIO),
                    ));
                }
                Ok(disk[b as usize].clone())
            })
            .unwrap();
        assert_eq!((r.checked, r.lost, r.garbage), (2, 0, 1), "{r:?}");
        assert!(
            r.examples[0].contains("block 1") && r.examples[0].contains("unreadable"),
            "{:?}",
            r.examples
        );
        // Any other error ends the check.
        assert!(lg
            .verify(|_, _| Err(Error::io(
                "gone",
                std::io::Error::from_raw_os_error(libc::ENOENT)
            )))
            .is_err());
    }
}
