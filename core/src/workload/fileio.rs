//! sysbench 1.0's fileio test on btrkit's engine: the same file layout
//! (`test_file.N`, `--file-total-size` spread over `--file-num` files), the
//! same request mix per test mode, fsync every `--file-fsync-freq` writes
//! (or after every write, or only at the end), O_SYNC / O_DSYNC / O_DIRECT
//! writes, several threads, a time or event limit, and its report.
//!
//! Clients are threads on one filesystem ([`SharedFs`]): each request
//! takes the filesystem for itself, and fsyncs batch their log syncs as
//! the kernel's do.

use super::content::Prng;
use super::durable::Ledger;
use crate::fs::{EngineStats, Filesystem, Loc};
use crate::log::batch::SharedFs;
use crate::{Error, Result};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `--file-test-mode`: which requests a run makes. Sequential modes walk
/// all files block by block once (one position shared by the threads) and
/// stop there; random modes pick a file and block for each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TestMode {
    /// `seqwr`: sequential writes.
    Seqwr,
    /// `seqrewr`: sequential rewrites (of the prepared files, as `seqwr` here).
    Seqrewr,
    /// `seqrd`: sequential reads.
    Seqrd,
    /// `rndrd`: random reads.
    Rndrd,
    /// `rndwr`: random writes.
    Rndwr,
    /// `rndrw`: random reads and writes, `rw_ratio` reads per write on average.
    Rndrw,
}

impl TestMode {
    /// The mode named by a `--file-test-mode` value (`seqwr`, `rndrw`...).
    pub fn parse(s: &str) -> Result<TestMode> {
        Ok(match s {
            "seqwr" => TestMode::Seqwr,
            "seqrewr" => TestMode::Seqrewr,
            "seqrd" => TestMode::Seqrd,
            "rndrd" => TestMode::Rndrd,
            "rndwr" => TestMode::Rndwr,
            "rndrw" => TestMode::Rndrw,
            o => {
                return Err(Error::Invalid(format!(
                    "unknown --file-test-mode {o} (seqwr, seqrewr, seqrd, rndrd, rndwr, rndrw)"
                )))
            }
        })
    }
    fn sequential(self) -> bool {
        matches!(self, TestMode::Seqwr | TestMode::Seqrewr | TestMode::Seqrd)
    }
}

/// `--file-extra-flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum ExtraFlag {
    /// Plain buffered writes (the default).
    #[default]
    None,
    /// `sync`: O_SYNC writes, each durable (data and metadata) when it returns.
    Sync,
    /// `dsync`: O_DSYNC writes, each durable when it returns (metadata only as
    /// needed to read the data back).
    Dsync,
    /// `direct`: O_DIRECT writes, bypassing the page cache; the block size
    /// must be a multiple of 4096.
    Direct,
}

impl ExtraFlag {
    /// The flag named by a `--file-extra-flags` value; the empty string is
    /// [`ExtraFlag::None`].
    pub fn parse(s: &str) -> Result<ExtraFlag> {
        Ok(match s {
            "" => ExtraFlag::None,
            "sync" => ExtraFlag::Sync,
            "dsync" => ExtraFlag::Dsync,
            "direct" => ExtraFlag::Direct,
            o => {
                return Err(Error::Invalid(format!(
                    "unknown --file-extra-flags {o} (sync, dsync, direct)"
                )))
            }
        })
    }
}

/// sysbench's options, its defaults.
#[derive(Clone, Debug, Serialize)]
pub struct FileioOptions {
    /// `--file-num`: number of files `test_file.0`... (default 128).
    pub file_num: u64,
    /// `--file-block-size`: bytes per read or write request (default 16 KiB).
    pub block_size: u64,
    /// `--file-total-size`: bytes over all files, split evenly (default 2 GiB).
    pub total_size: u64,
    /// `--file-test-mode` (default `rndwr`).
    pub mode: TestMode,
    /// `--file-fsync-freq`: after every this many writes (counted over all
    /// threads) every file is fsynced in turn, one request each; 0 = never
    /// (default 100).
    pub fsync_freq: u64,
    /// `--file-fsync-all`: fsync the written file after every write, instead
    /// of the `fsync_freq` passes.
    pub fsync_all: bool,
    /// `--file-fsync-end`: fsync every file once when the run ends, outside
    /// the timed requests (default on).
    pub fsync_end: bool,
    /// `--file-extra-flags`: how writes are opened (default none).
    pub extra: ExtraFlag,
    /// `--file-rw-ratio`: reads per write in `rndrw` (default 1.5).
    pub rw_ratio: f64,
    /// `--threads`: client threads making requests at once (default 1).
    pub threads: u64,
    /// Seconds; 0: no limit.
    pub time: f64,
    /// Requests in all; 0: no limit.
    pub events: u64,
    /// Prepare the files with fallocate instead of writing them.
    pub prealloc: bool,
    /// Seed of the random file and block choices (each thread's generator is
    /// derived from it and the thread number), so a run can be repeated.
    pub seed: u64,
}

impl Default for FileioOptions {
    fn default() -> FileioOptions {
        FileioOptions {
            file_num: 128,
            block_size: 16384,
            total_size: 2 << 30,
            mode: TestMode::Rndwr,
            fsync_freq: 100,
            fsync_all: false,
            fsync_end: true,
            extra: ExtraFlag::None,
            rw_ratio: 1.5,
            threads: 1,
            time: 10.0,
            events: 0,
            prealloc: false,
            seed: 1,
        }
    }
}

impl FileioOptions {
    /// Bytes per file: `total_size / file_num`, rounded down.
    pub fn file_size(&self) -> u64 {
        self.total_size / self.file_num.max(1)
    }
    /// Refuse options that cannot run: zero files, block size or threads,
    /// files smaller than a block, O_DIRECT with a block size not a multiple
    /// of 4096, or neither a time nor an event limit.
    pub fn validate(&self) -> Result<()> {
        if self.file_num == 0 || self.block_size == 0 || self.threads == 0 {
            return Err(Error::Invalid(
                "--file-num, --file-block-size and --threads must be at least 1".into(),
            ));
        }
        if self.file_size() < self.block_size {
            return Err(Error::Invalid(format!(
                "files of {} bytes are smaller than a block of {}",
                self.file_size(),
                self.block_size
            )));
        }
        if self.extra == ExtraFlag::Direct && !self.block_size.is_multiple_of(4096) {
            return Err(Error::Invalid(
                "--file-extra-flags=direct needs a block size that is a multiple of 4096".into(),
            ));
        }
        if self.time <= 0.0 && self.events == 0 {
            return Err(Error::Invalid(
                "set --time or --events: the test would never end".into(),
            ));
        }
        Ok(())
    }
}

/// sysbench's `prepare`: the files, written in blocks (or fallocated), each
/// fsynced, then a commit so the run starts from a settled filesystem.
pub fn prepare(fs: &mut Filesystem, dir: Loc, o: &FileioOptions) -> Result<Vec<Loc>> {
    o.validate()?;
    let size = o.file_size();
    let block: Vec<u8> = (0..o.block_size).map(|i| (i * 13 + 7) as u8).collect();
    let mut files = Vec::new();
    for n in 0..o.file_num {
        let name = format!("test_file.{n}");
        let l = match fs.lookup(dir, name.as_bytes())? {
            Some(l) => l,
            None => fs.create(dir, name.as_bytes(), 0o600)?,
        };
        if o.prealloc {
            fs.ranges().fallocate(l, 0, size, false)?;
        } else {
            let mut off = 0;
            while off < size {
                let n = (size - off).min(o.block_size) as usize;
                fs.write(l, off, &block[..n])?;
                off += n as u64;
                fs.periodic()?;
            }
        }
        fs.fsync(l, false, None)?;
        files.push(l);
    }
    fs.sync()?;
    Ok(files)
}

/// Request latency over the run, in milliseconds (sysbench's figures).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Fastest request.
    pub min: f64,
    /// Mean over all requests.
    pub avg: f64,
    /// Slowest request.
    pub max: f64,
    /// 95th percentile: 95% of requests took at most this long.
    pub p95: f64,
}

/// The result of a fileio [`run`], as sysbench reports it, plus the
/// engine's counters and device I/O for the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FileioReport {
    /// Read requests done.
    pub reads: u64,
    /// Write requests done.
    pub writes: u64,
    /// fsync requests done during the run (not the final `fsync_end` pass).
    pub fsyncs: u64,
    /// Wall-clock length of the run in seconds, not counting the final
    /// `fsync_end` pass.
    pub seconds: f64,
    /// Read requests per second.
    pub reads_per_s: f64,
    /// Write requests per second.
    pub writes_per_s: f64,
    /// fsync requests per second.
    pub fsyncs_per_s: f64,
    /// Read throughput, MiB (2^20 bytes) per second.
    pub read_mib_per_s: f64,
    /// Write throughput, MiB (2^20 bytes) per second.
    pub written_mib_per_s: f64,
    /// Every request, as sysbench counts events (reads, writes, fsyncs).
    pub events: u64,
    /// Requests made by each client thread, in thread order (sysbench's
    /// fairness figures).
    pub events_per_thread: Vec<u64>,
    /// Latency of every request (reads, writes and fsyncs).
    pub latency_ms: Latency,
    /// Engine counters (commits, fsyncs, log syncs...) for the run alone, the
    /// final fsyncs included.
    pub stats: EngineStats,
    /// Device writes and flushes of the run, the final fsyncs included.
    pub io: IoSummary,
}

/// What the run wrote to the device, and how many flushes it asked for.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct IoSummary {
    /// Device cache flushes issued.
    pub flushes: u64,
    /// All bytes written: the sum of the four kinds below.
    pub bytes_written: u64,
    /// File data written (data extents).
    pub data_bytes: u64,
    /// Log tree and log root tree blocks written (the fsync log).
    pub log_bytes: u64,
    /// All other tree blocks written.
    pub metadata_bytes: u64,
    /// Superblock copies written, by commits and log syncs.
    pub super_bytes: u64,
}

impl IoSummary {
    /// The device totals of `fs` since it was mounted.
    pub fn of(fs: &Filesystem) -> IoSummary {
        let s = fs.store.stats();
        IoSummary {
            flushes: s.flushes,
            bytes_written: s.data_bytes + s.log_bytes + s.metadata_bytes + s.super_bytes,
            data_bytes: s.data_bytes,
            log_bytes: s.log_bytes,
            metadata_bytes: s.metadata_bytes,
            super_bytes: s.super_bytes,
        }
    }
    /// The difference `self - a` for each counter (`a` taken earlier), floored
    /// at zero.
    pub fn since(self, a: IoSummary) -> IoSummary {
        IoSummary {
            flushes: self.flushes - a.flushes.min(self.flushes),
            bytes_written: self.bytes_written - a.bytes_written.min(self.bytes_written),
            data_bytes: self.data_bytes - a.data_bytes.min(self.data_bytes),
            log_bytes: self.log_bytes - a.log_bytes.min(self.log_bytes),
            metadata_bytes: self.metadata_bytes - a.metadata_bytes.min(self.metadata_bytes),
            super_bytes: self.super_bytes - a.super_bytes.min(self.super_bytes),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

/// Shared request bookkeeping: the global request and write counters
/// sysbench keeps, and the sequential position.
struct Plan {
    requests: AtomicU64,
    writes: AtomicU64,
    seq: Mutex<(u64, u64)>,
    /// The fsync pass under way: the next file to fsync. Every
    /// `--file-fsync-freq` writes sysbench fsyncs every file in turn, one
    /// request each, whether the file changed or not.
    fsync_next: Mutex<Option<usize>>,
    stop: AtomicBool,
}

/// sysbench's `run` over prepared files. Latency covers each request,
/// waiting for the filesystem included.
pub fn run(shared: &SharedFs, files: &[Loc], o: &FileioOptions) -> Result<FileioReport> {
    run_with(shared, files, o, None)
}

/// [`run`], with every write stamped and recorded in `ledger` and every
/// fsync's acknowledgement with it, for a crash check after the run.
pub fn run_with(
    shared: &SharedFs,
    files: &[Loc],
    o: &FileioOptions,
    ledger: Option<&Ledger>,
) -> Result<FileioReport> {
    o.validate()?;
    let plan = Arc::new(Plan {
        requests: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        seq: Mutex::new((0, 0)),
        fsync_next: Mutex::new(None),
        stop: AtomicBool::new(false),
    });
    let before = shared.lock().stats.clone();
    let io0 = IoSummary::of(&shared.lock());
    let started = Instant::now();
    let deadline = (o.time > 0.0).then(|| started + Duration::from_secs_f64(o.time));
    let results: Vec<Result<(u64, u64, u64, Vec<f64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..o.threads)
            .map(|t| {
                let plan = plan.clone();
                s.spawn(move || client(shared, files, o, &plan, t, deadline, ledger))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Internal("a client thread panicked".into())))
            })
            .collect()
    });
    let mut r = FileioReport::default();
    let mut lat: Vec<f64> = Vec::new();
    for x in results {
        let (reads, writes, fsyncs, l) = x?;
        r.reads += reads;
        r.writes += writes;
        r.fsyncs += fsyncs;
        r.events_per_thread.push(reads + writes + fsyncs);
        lat.extend(l);
    }
    r.seconds = started.elapsed().as_secs_f64();
    if o.fsync_end {
        for (i, &l) in files.iter().enumerate() {
            fsync(shared, ledger, i, l)?;
        }
    }
    r.events = r.reads + r.writes + r.fsyncs;
    let secs = r.seconds.max(1e-9);
    r.reads_per_s = r.reads as f64 / secs;
    r.writes_per_s = r.writes as f64 / secs;
    r.fsyncs_per_s = r.fsyncs as f64 / secs;
    r.read_mib_per_s = (r.reads * o.block_size) as f64 / secs / (1 << 20) as f64;
    r.written_mib_per_s = (r.writes * o.block_size) as f64 / secs / (1 << 20) as f64;
    lat.sort_by(|a, b| a.total_cmp(b));
    if !lat.is_empty() {
        r.latency_ms = Latency {
            min: lat[0],
            avg: lat.iter().sum::<f64>() / lat.len() as f64,
            max: lat[lat.len() - 1],
            p95: lat[((lat.len() as f64 * 0.95).ceil() as usize).clamp(1, lat.len()) - 1],
        };
    }
    r.stats = diff_stats(&before, &shared.lock().stats);
    r.io = IoSummary::of(&shared.lock()).since(io0);
    Ok(r)
}

/// Counters of the run alone.
pub(super) fn diff_stats(a: &EngineStats, b: &EngineStats) -> EngineStats {
    let mut d = b.clone();
    d.commits -= a.commits.min(d.commits);
    d.fsyncs -= a.fsyncs.min(d.fsyncs);
    d.log_syncs -= a.log_syncs.min(d.log_syncs);
    d.log_syncs_skipped -= a.log_syncs_skipped.min(d.log_syncs_skipped);
    d.log_syncs_joined -= a.log_syncs_joined.min(d.log_syncs_joined);
    d.full_commits -= a.full_commits.min(d.full_commits);
    d.conflicting_inodes_logged -= a.conflicting_inodes_logged.min(d.conflicting_inodes_logged);
    d.ordered_extents -= a.ordered_extents.min(d.ordered_extents);
    d.writeback_bytes -= a.writeback_bytes.min(d.writeback_bytes);
    for (k, v) in d.commit_reasons.iter_mut() {
        *v -= a.commit_reasons.get(k).copied().unwrap_or(0).min(*v);
    }
    for (k, v) in d.full_commit_reasons.iter_mut() {
        *v -= a.full_commit_reasons.get(k).copied().unwrap_or(0).min(*v);
    }
    d
}

/// One client thread: requests until the time or the events run out.
/// fsync file `i`, acknowledged in the ledger when there is one.
fn fsync(shared: &SharedFs, ledger: Option<&Ledger>, i: usize, l: Loc) -> Result<()> {
    match ledger {
        Some(lg) => lg.fsync(i, || shared.fsync(l, false, None)),
        None => shared.fsync(l, false, None),
    }
}

fn client(
    shared: &SharedFs,
    files: &[Loc],
    o: &FileioOptions,
    plan: &Plan,
    t: u64,
    deadline: Option<Instant>,
    ledger: Option<&Ledger>,
) -> Result<(u64, u64, u64, Vec<f64>)> {
    let _seat = shared.seat();
    let mut rng = Prng::new(o.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t + 1));
    let size = o.file_size();
    let blocks = size / o.block_size;
    let wbuf: Vec<u8> = (0..o.block_size).map(|i| (i ^ t) as u8).collect();
    let (mut reads, mut writes, mut fsyncs) = (0u64, 0u64, 0u64);
    let mut lat = Vec::new();
    loop {
        if plan.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if o.events > 0 && plan.requests.fetch_add(1, Ordering::Relaxed) >= o.events {
            plan.stop.store(true, Ordering::Relaxed);
            break;
        }
        // A request of the fsync pass under way, if there is one.
        let pass = {
            let mut next = plan
                .fsync_next
                .lock()
                .map_err(|_| Error::Internal("fsync pass lock poisoned".into()))?;
            match *next {
                Some(i) if i < files.len() => {
                    *next = if i + 1 < files.len() {
                        Some(i + 1)
                    } else {
                        None
                    };
                    Some(i)
                }
                _ => None,
            }
        };
        if let Some(i) = pass {
            let t1 = Instant::now();
            fsync(shared, ledger, i, files[i])?;
            lat.push(t1.elapsed().as_secs_f64() * 1000.0);
            fsyncs += 1;
            continue;
        }
        // What and where: sequential modes walk the files in order (one
        // shared position), random ones pick a file and a block.
        let (fi, off, op) = if o.mode.sequential() {
            let mut p = plan
                .seq
                .lock()
                .map_err(|_| Error::Internal("sequence lock poisoned".into()))?;
            let (f, b) = *p;
            if f >= files.len() as u64 {
                plan.stop.store(true, Ordering::Relaxed);
                break;
            }
            *p = if b + 1 >= blocks {
                (f + 1, 0)
            } else {
                (f, b + 1)
            };
            (
                f as usize,
                b * o.block_size,
                if o.mode == TestMode::Seqrd {
                    Op::Read
                } else {
                    Op::Write
                },
            )
        } else {
            let f = rng.below(files.len() as u64) as usize;
            let b = rng.below(blocks);
            let op = match o.mode {
                TestMode::Rndrd => Op::Read,
                TestMode::Rndwr => Op::Write,
                _ => {
                    // rw-ratio reads for each write.
                    let p_read = o.rw_ratio / (1.0 + o.rw_ratio);
                    if (rng.below(1_000_000) as f64) < p_read * 1_000_000.0 {
                        Op::Read
                    } else {
                        Op::Write
                    }
                }
            };
            (f, b * o.block_size, op)
        };
        let l = files[fi];
        let t0 = Instant::now();
        match op {
            Op::Read => {
                let data = shared.lock().read(l, off, o.block_size)?;
                if data.len() as u64 != o.block_size {
                    return Err(Error::Invalid(format!(
                        "test_file.{fi}: short read at {off}"
                    )));
                }
                reads += 1;
            }
            Op::Write => {
                let write = |buf: &[u8]| match o.extra {
                    ExtraFlag::None => shared.lock().write(l, off, buf),
                    ExtraFlag::Direct => shared.lock().direct_write(l, off, buf),
                    ExtraFlag::Sync | ExtraFlag::Dsync => {
                        shared.write_sync(l, off, buf, o.extra == ExtraFlag::Dsync)
                    }
                };
                match ledger {
                    Some(lg) => lg.write(
                        fi,
                        off / o.block_size,
                        matches!(o.extra, ExtraFlag::Sync | ExtraFlag::Dsync),
                        write,
                    )?,
                    None => write(&wbuf)?,
                }
                shared.lock().periodic()?;
                writes += 1;
            }
        }
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        if op == Op::Write {
            let n = plan.writes.fetch_add(1, Ordering::Relaxed) + 1;
            if o.fsync_all {
                // --file-fsync-all: the written file, after every write.
                let t1 = Instant::now();
                fsync(shared, ledger, fi, l)?;
                lat.push(t1.elapsed().as_secs_f64() * 1000.0);
                fsyncs += 1;
            } else if o.fsync_freq > 0 && n.is_multiple_of(o.fsync_freq) {
                let mut next = plan
                    .fsync_next
                    .lock()
                    .map_err(|_| Error::Internal("fsync pass lock poisoned".into()))?;
                if next.is_none() {
                    *next = Some(0);
                }
            }
        }
    }
    Ok((reads, writes, fsyncs, lat))
}
