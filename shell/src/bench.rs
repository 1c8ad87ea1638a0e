//! `btrkit-shell bench fileio IMAGE [sysbench fileio options]`: sysbench
//! 1.0's fileio test on btrkit's engine (core's workload::fileio does it).

use btrkit_core::fs::{Filesystem, MountOptions, Switches};
use btrkit_core::io::{BlockDevice, FileDevice, VolatileFile};
use btrkit_core::log::batch::SharedFs;
use btrkit_core::workload::durable;
use btrkit_core::workload::fileio::{self, ExtraFlag, FileioOptions, FileioReport, TestMode};
use btrkit_core::workload::script::parse_num;
use clap::{Args, Subcommand};
use comfy_table::Table;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// sysbench 1.0 fileio: prepare the files, run the test, report.
    Fileio(FileioArgs),
    /// dbench: N clients replay an NBENCH loadfile (dbench's client.txt).
    Dbench(DbenchArgs),
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  btrkit-shell bench dbench d.img /usr/share/dbench/client.txt --clients 4 --time 30\n  \
btrkit-shell bench dbench d.img client.txt --passes 1 --crash-check --json\n\n\
Exit status: 0 done (and, with --crash-check, every flushed file there), 1 failed or a file lost, 2 usage."
)]
pub struct DbenchArgs {
    /// The image (made by btrkit's mkfs, `--size` bytes, when missing).
    pub image: PathBuf,
    /// The loadfile, e.g. /usr/share/dbench/client.txt.
    pub loadfile: PathBuf,
    /// Clients replaying the loadfile at once.
    #[arg(long, default_value_t = 1)]
    pub clients: u64,
    /// Seconds (0: until --passes).
    #[arg(long, default_value_t = 60.0)]
    pub time: f64,
    /// Passes of the loadfile per client (0: until --time).
    #[arg(long, default_value_t = 0)]
    pub passes: u64,
    /// Seconds of warmup before --time starts, not counted (dbench's
    /// default: a fifth of --time).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Only the first N lines of the loadfile (0: all).
    #[arg(long, default_value_t = 0)]
    pub lines: usize,
    /// Engine switch: fast-fsync-skip, log-conflicting-inodes, sync-io-first.
    #[arg(long = "set", value_name = "NAME=on|off")]
    pub set: Vec<String>,
    /// Mount options (comma separated).
    #[arg(long, default_value = "")]
    pub mount: String,
    /// Size of a new image.
    #[arg(long, default_value = "8G", value_parser = size)]
    pub size: u64,
    /// End with a power failure instead of an unmount, recover (log
    /// replay), run the checker and check that every file a Flush
    /// acknowledged is there; exit 1 when one is not.
    #[arg(long = "crash-check")]
    pub crash_check: bool,
    /// One line of JSON.
    #[arg(long)]
    pub json: bool,
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        o => Err(format!("{o}: on or off")),
    }
}

fn size(s: &str) -> Result<u64, String> {
    parse_num(s)
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  btrkit-shell bench fileio f.img --file-test-mode rndwr --time 10\n  \
btrkit-shell bench fileio f.img --file-num 16 --file-total-size 1G --file-fsync-freq 0 --json\n\n\
Exit status: 0 done (and, with --crash-check, every acknowledged write there), 1 failed or a write lost, 2 usage."
)]
pub struct FileioArgs {
    /// The image (made by btrkit's mkfs, `--size` bytes, when missing).
    pub image: PathBuf,
    /// Number of files.
    #[arg(long = "file-num", default_value_t = 128)]
    pub file_num: u64,
    /// Bytes per request.
    #[arg(long = "file-block-size", default_value = "16384", value_parser = size)]
    pub block_size: u64,
    /// Bytes of all the files together.
    #[arg(long = "file-total-size", default_value = "2G", value_parser = size)]
    pub total_size: u64,
    /// seqwr, seqrewr, seqrd, rndrd, rndwr, rndrw
    #[arg(long = "file-test-mode", default_value = "rndwr")]
    pub mode: String,
    /// Only `sync` (the engine has no asynchronous I/O).
    #[arg(long = "file-io-mode", default_value = "sync")]
    pub io_mode: String,
    /// fsync after this many writes (0: never).
    #[arg(long = "file-fsync-freq", default_value_t = 100)]
    pub fsync_freq: u64,
    /// fsync after every write (on|off).
    #[arg(long = "file-fsync-all", default_value = "off", value_parser = on_off, num_args = 0..=1, default_missing_value = "on")]
    pub fsync_all: bool,
    /// fsync every file at the end (on|off).
    #[arg(long = "file-fsync-end", default_value = "on", value_parser = on_off, num_args = 0..=1, default_missing_value = "on")]
    pub fsync_end: bool,
    /// sync, dsync or direct
    #[arg(long = "file-extra-flags", default_value = "")]
    pub extra: String,
    /// Reads per write in rndrw.
    #[arg(long = "file-rw-ratio", default_value_t = 1.5)]
    pub rw_ratio: f64,
    /// Threads issuing requests.
    #[arg(long, default_value_t = 1)]
    pub threads: u64,
    /// Seconds (0: until --events).
    #[arg(long, default_value_t = 10.0)]
    pub time: f64,
    /// Requests in all (0: until --time).
    #[arg(long, default_value_t = 0)]
    pub events: u64,
    /// Prepare the files with fallocate instead of writing them.
    #[arg(long)]
    pub prealloc: bool,
    /// Engine switch: fast-fsync-skip, log-conflicting-inodes, sync-io-first.
    #[arg(long = "set", value_name = "NAME=on|off")]
    pub set: Vec<String>,
    /// Mount options (comma separated).
    #[arg(long, default_value = "")]
    pub mount: String,
    /// Size of a new image.
    #[arg(long, default_value = "8G", value_parser = size)]
    pub size: u64,
    /// Seed of the random requests.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// End with a power failure instead of an unmount, recover (log
    /// replay), run the checker and check that every acknowledged write is
    /// there; exit 1 when one is not.
    #[arg(long = "crash-check")]
    pub crash_check: bool,
    /// One line of JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: &BenchCmd) -> i32 {
    let (what, r) = match cmd {
        BenchCmd::Fileio(a) => ("fileio", fileio_cmd(a)),
        BenchCmd::Dbench(a) => ("dbench", dbench_cmd(a)),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("btrkit-shell: bench {what}: {e}");
            1
        }
    }
}

fn dbench_cmd(a: &DbenchArgs) -> anyhow::Result<()> {
    use btrkit_core::workload::dbench;
    let text = std::fs::read_to_string(&a.loadfile)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", a.loadfile.display()))?;
    let mut load = dbench::parse_loadfile(&text)?;
    if a.lines > 0 {
        load.retain(|l| l.line <= a.lines);
    }
    let sw = switches(&a.set)?;
    let o = dbench::DbenchOptions {
        clients: a.clients,
        time: a.time,
        passes: a.passes,
        warmup: a.warmup.unwrap_or(a.time / 5.0),
    };
    let (mut fs, vol) = open_on(&a.image, a.size, &a.mount, a.crash_check)?;
    fs.switches = sw;
    let shared = SharedFs::new(fs);
    let (r, tracked) = with_progress(
        &format!("dbench, {} clients", a.clients),
        if a.time > 0.0 { a.time + o.warmup } else { 0.0 },
        a.json,
        || dbench::run_with(&shared, &load, &o, a.crash_check),
    )?;
    let mut fs = shared.into_inner();
    let check = match vol {
        Some(vol) => {
            drop(fs);
            let mut cc = durable::CrashCheck::default();
            let mut fs =
                durable::crash_and_recover(&vol, &a.image, mount_options(&a.mount)?, &mut cc)?;
            cc.absorb(dbench::verify_durable(&mut fs, &tracked)?);
            Some(cc)
        }
        None => {
            fs.close_all()?;
            fs.sync()?;
            None
        }
    };
    let verdict = match &check {
        Some(cc) if !cc.ok() => Err(anyhow::anyhow!(
            "crash check failed: {} files lost acknowledged data, {} checker errors",
            cc.lost,
            cc.checker_errors
        )),
        _ => Ok(()),
    };
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        if let (Some(cc), Some(m)) = (&check, v.as_object_mut()) {
            m.insert("crash_check".into(), serde_json::to_value(cc)?);
        }
        println!("{v}");
        return verdict;
    }
    let mut t = Table::new();
    t.set_header(vec!["operation", "count", "avg lat (ms)", "max lat (ms)"]);
    for (k, v) in &r.ops {
        t.add_row(vec![
            k.clone(),
            v.count.to_string(),
            format!("{:.3}", v.avg_ms),
            format!("{:.3}", v.max_ms),
        ]);
    }
    println!("{t}");
    println!(
        "Throughput {:.3} MB/sec  {} clients  max latency {:.3} ms  ({} loadfile passes in {:.1} s after {:.1} s of warmup, {} unexpected statuses; {} fsyncs: {} log syncs, {} joined, {} full commits)",
        r.mb_per_s, r.clients, r.max_latency_ms, r.loadfile_passes, r.seconds, r.warmup_seconds, r.unexpected, r.stats.fsyncs, r.stats.log_syncs, r.stats.log_syncs_joined, r.stats.full_commits
    );
    for e in &r.unexpected_examples {
        eprintln!("unexpected: {e}");
    }
    if let Some(cc) = &check {
        print_crash_check(cc);
    }
    verdict
}

fn switches(set: &[String]) -> anyhow::Result<Switches> {
    let mut sw = Switches::default();
    for s in set {
        let (name, v) = s
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set {s}: NAME=on|off"))?;
        let on = on_off(v).map_err(|e| anyhow::anyhow!("--set {name}: {e}"))?;
        match name {
            "fast-fsync-skip" => sw.fast_fsync_skip = on,
            "log-conflicting-inodes" => sw.log_conflicting_inodes = on,
            "sync-io-first" => sw.sync_io_first = on,
            o => anyhow::bail!(
                "unknown switch {o:?} (fast-fsync-skip, log-conflicting-inodes, sync-io-first)"
            ),
        }
    }
    Ok(sw)
}

/// Mount `image` (made when missing, its log replayed); with `crashable`,
/// over a volatile write cache that a power failure can take back.
fn open_on(
    image: &Path,
    size: u64,
    mount: &str,
    crashable: bool,
) -> anyhow::Result<(Filesystem, Option<Arc<VolatileFile>>)> {
    if !image.exists() {
        btrkit_core::mkfs::make_image(image, size, &Default::default())
            .map_err(|e| anyhow::anyhow!("{}: {e}", image.display()))?;
    }
    let file =
        FileDevice::open(image, true).map_err(|e| anyhow::anyhow!("{}: {e}", image.display()))?;
    let (dev, vol): (Arc<dyn BlockDevice>, _) = if crashable {
        let v = Arc::new(VolatileFile::new(file, false)?);
        (v.clone(), Some(v))
    } else {
        (Arc::new(file), None)
    };
    Ok((
        btrkit_core::log::replay::mount(dev, mount_options(mount)?)?,
        vol,
    ))
}

fn mount_options(mount: &str) -> anyhow::Result<MountOptions> {
    Ok(if mount.is_empty() {
        MountOptions::default()
    } else {
        MountOptions::parse(&[mount.to_string()])?
    })
}

fn fileio_cmd(a: &FileioArgs) -> anyhow::Result<()> {
    if a.io_mode != "sync" {
        anyhow::bail!("--file-io-mode={}: only sync is supported", a.io_mode);
    }
    let o = FileioOptions {
        file_num: a.file_num,
        block_size: a.block_size,
        total_size: a.total_size,
        mode: TestMode::parse(&a.mode)?,
        fsync_freq: a.fsync_freq,
        fsync_all: a.fsync_all,
        fsync_end: a.fsync_end,
        extra: ExtraFlag::parse(&a.extra)?,
        rw_ratio: a.rw_ratio,
        threads: a.threads,
        time: a.time,
        events: a.events,
        prealloc: a.prealloc,
        seed: a.seed,
    };
    o.validate()?;
    let sw = switches(&a.set)?;
    let (mut fs, vol) = open_on(&a.image, a.size, &a.mount, a.crash_check)?;
    fs.switches = sw;
    if !a.json {
        eprintln!(
            "prepare: {} files of {} bytes{}",
            o.file_num,
            o.file_size(),
            if o.prealloc { " (fallocated)" } else { "" }
        );
    }
    let root = fs.root();
    let files = fileio::prepare(&mut fs, root, &o)?;
    let ledger = match a.crash_check {
        true => Some(durable::Ledger::new(
            o.block_size,
            durable::initial_hashes(&mut fs, &files, o.file_size(), o.block_size)?,
        )?),
        false => None,
    };
    let shared = SharedFs::new(fs);
    let r = with_progress(&format!("fileio {}", a.mode), o.time, a.json, || {
        fileio::run_with(&shared, &files, &o, ledger.as_ref())
    })?;
    let mut fs = shared.into_inner();
    let check = match (ledger, vol) {
        (Some(lg), Some(vol)) => {
            // The power failure ends the run: no close, no commit.
            drop(fs);
            let mut cc = durable::CrashCheck::default();
            let mut fs =
                durable::crash_and_recover(&vol, &a.image, mount_options(&a.mount)?, &mut cc)?;
            let names: Vec<String> = (0..o.file_num).map(|n| format!("test_file.{n}")).collect();
            let root = fs.root();
            durable::verify_files(&mut fs, root, &names, &files, &lg, &mut cc)?;
            Some(cc)
        }
        _ => {
            fs.close_all()?;
            fs.sync()?;
            None
        }
    };
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        if let (Some(cc), Some(m)) = (&check, v.as_object_mut()) {
            m.insert("crash_check".into(), serde_json::to_value(cc)?);
        }
        println!("{v}");
    } else {
        print_report(&o, &r);
        if let Some(cc) = &check {
            print_crash_check(cc);
        }
    }
    match check {
        Some(cc) if !cc.ok() => anyhow::bail!(
            "crash check failed: {} blocks lost an acknowledged write, {} hold no write's content, {} checker errors",
            cc.lost,
            cc.garbage,
            cc.checker_errors
        ),
        _ => Ok(()),
    }
}

fn print_crash_check(cc: &durable::CrashCheck) {
    println!(
        "crash check: {} writes, {} acknowledged as durable; after the power failure and {}: {} {}s checked, {} with an acknowledged write; {} lost one, {} torn or foreign, {} checker errors",
        cc.writes,
        cc.acknowledged,
        if cc.replayed_log { "a log replay" } else { "no log to replay" },
        cc.checked,
        cc.unit,
        cc.checked_acknowledged,
        cc.lost,
        cc.garbage,
        cc.checker_errors
    );
    for e in &cc.examples {
        println!("  {e}");
    }
}

fn print_report(o: &FileioOptions, r: &FileioReport) {
    let mut t = Table::new();
    t.set_header(vec!["", "value"]);
    let rows: Vec<(&str, String)> = vec![
        ("reads/s", format!("{:.2}", r.reads_per_s)),
        ("writes/s", format!("{:.2}", r.writes_per_s)),
        ("fsyncs/s", format!("{:.2}", r.fsyncs_per_s)),
        ("read, MiB/s", format!("{:.2}", r.read_mib_per_s)),
        ("written, MiB/s", format!("{:.2}", r.written_mib_per_s)),
        ("total time", format!("{:.4} s", r.seconds)),
        ("total number of events", r.events.to_string()),
        (
            "latency min/avg/max (ms)",
            format!(
                "{:.2} / {:.2} / {:.2}",
                r.latency_ms.min, r.latency_ms.avg, r.latency_ms.max
            ),
        ),
        (
            "latency 95th percentile (ms)",
            format!("{:.2}", r.latency_ms.p95),
        ),
        (
            "events per thread",
            r.events_per_thread
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        (
            "log syncs (skipped, joined)",
            format!(
                "{} ({}, {})",
                r.stats.log_syncs, r.stats.log_syncs_skipped, r.stats.log_syncs_joined
            ),
        ),
        ("full commits", r.stats.full_commits.to_string()),
    ];
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    println!(
        "fileio {:?}, {} threads, {} files, block {}",
        o.mode, o.threads, o.file_num, o.block_size
    );
    println!("{t}");
}

/// A progress bar over the run's seconds (a spinner when it ends by
/// passes or events) while `f` runs, on a terminal only.
fn with_progress<T>(label: &str, secs: f64, json: bool, f: impl FnOnce() -> T) -> T {
    use std::io::IsTerminal;
    if json || !std::io::stderr().is_terminal() {
        return f();
    }
    let pb = if secs > 0.0 {
        let pb = indicatif::ProgressBar::new((secs * 10.0) as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{msg} {bar:40} [{elapsed}/{duration}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{msg} {spinner} [{elapsed}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        pb
    };
    pb.set_message(label.to_string());
    let done = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            let t0 = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if secs > 0.0 {
                    pb.set_position((t0.elapsed().as_secs_f64() * 10.0) as u64);
                } else {
                    pb.tick();
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        let out = f();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    pb.finish_and_clear();
    out
}
