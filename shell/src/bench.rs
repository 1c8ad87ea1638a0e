//! `btrkit-shell bench fileio IMAGE [sysbench fileio options]`: sysbench
//! 1.0's fileio test on btrkit's engine (core's workload::fileio does it).

use btrkit_core::fs::{Filesystem, MountOptions, Switches};
use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_core::log::batch::SharedFs;
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
pub struct DbenchArgs {
    /// The image (made by btrkit's mkfs, `--size` bytes, when missing).
    pub image: PathBuf,
    /// The loadfile, e.g. /usr/share/dbench/client.txt.
    pub loadfile: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub clients: u64,
    /// Seconds (0: until --passes).
    #[arg(long, default_value_t = 60.0)]
    pub time: f64,
    /// Passes of the loadfile per client (0: until --time).
    #[arg(long, default_value_t = 0)]
    pub passes: u64,
    /// Only the first N lines of the loadfile (0: all).
    #[arg(long, default_value_t = 0)]
    pub lines: usize,
    /// Engine switch: fast-fsync-skip, log-conflicting-inodes, sync-io-first.
    #[arg(long = "set", value_name = "NAME=on|off")]
    pub set: Vec<String>,
    #[arg(long, default_value = "")]
    pub mount: String,
    #[arg(long, default_value = "8G", value_parser = size)]
    pub size: u64,
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
pub struct FileioArgs {
    /// The image (made by btrkit's mkfs, `--size` bytes, when missing).
    pub image: PathBuf,
    #[arg(long = "file-num", default_value_t = 128)]
    pub file_num: u64,
    #[arg(long = "file-block-size", default_value = "16384", value_parser = size)]
    pub block_size: u64,
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
    #[arg(long = "file-fsync-all", default_value = "off", value_parser = on_off, num_args = 0..=1, default_missing_value = "on")]
    pub fsync_all: bool,
    #[arg(long = "file-fsync-end", default_value = "on", value_parser = on_off, num_args = 0..=1, default_missing_value = "on")]
    pub fsync_end: bool,
    /// sync, dsync or direct
    #[arg(long = "file-extra-flags", default_value = "")]
    pub extra: String,
    #[arg(long = "file-rw-ratio", default_value_t = 1.5)]
    pub rw_ratio: f64,
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
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
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
    let text = std::fs::read_to_string(&a.loadfile).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", a.loadfile.display()))?;
    let mut load = dbench::parse_loadfile(&text)?;
    if a.lines > 0 {
        load.retain(|l| l.line <= a.lines);
    }
    let sw = switches(&a.set)?;
    let o = dbench::DbenchOptions { clients: a.clients, time: a.time, passes: a.passes };
    let mut fs = open(&a.image, a.size, &a.mount)?;
    fs.switches = sw;
    let shared = SharedFs::new(fs);
    let r = dbench::run(&shared, &load, &o)?;
    let mut fs = shared.into_inner();
    fs.close_all()?;
    fs.sync()?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.set_header(vec!["operation", "count", "avg lat (ms)", "max lat (ms)"]);
    for (k, v) in &r.ops {
        t.add_row(vec![k.clone(), v.count.to_string(), format!("{:.3}", v.avg_ms), format!("{:.3}", v.max_ms)]);
    }
    println!("{t}");
    println!(
        "Throughput {:.3} MB/sec  {} clients  max latency {:.3} ms  ({} loadfile passes in {:.1} s, {} unexpected statuses; {} fsyncs: {} log syncs, {} joined, {} full commits)",
        r.mb_per_s, r.clients, r.max_latency_ms, r.loadfile_passes, r.seconds, r.unexpected, r.stats.fsyncs, r.stats.log_syncs, r.stats.log_syncs_joined, r.stats.full_commits
    );
    for e in &r.unexpected_examples {
        eprintln!("unexpected: {e}");
    }
    Ok(())
}

fn switches(set: &[String]) -> anyhow::Result<Switches> {
    let mut sw = Switches::default();
    for s in set {
        let (name, v) = s.split_once('=').ok_or_else(|| anyhow::anyhow!("--set {s}: NAME=on|off"))?;
        let on = on_off(v).map_err(|e| anyhow::anyhow!("--set {name}: {e}"))?;
        match name {
            "fast-fsync-skip" => sw.fast_fsync_skip = on,
            "log-conflicting-inodes" => sw.log_conflicting_inodes = on,
            "sync-io-first" => sw.sync_io_first = on,
            o => anyhow::bail!("unknown switch {o:?} (fast-fsync-skip, log-conflicting-inodes, sync-io-first)"),
        }
    }
    Ok(sw)
}

fn open(image: &Path, size: u64, mount: &str) -> anyhow::Result<Filesystem> {
    if !image.exists() {
        btrkit_core::mkfs::make_image(image, size, &Default::default()).map_err(|e| anyhow::anyhow!("{}: {e}", image.display()))?;
    }
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(image, true).map_err(|e| anyhow::anyhow!("{}: {e}", image.display()))?);
    let sb = btrkit_core::image::read_superblock(dev.as_ref(), 0)?;
    if sb.log_root.get() != 0 {
        let mut st = btrkit_core::trans::Store::open_for_replay(dev.clone())?;
        btrkit_core::log::replay::replay(&mut st, Default::default())?;
    }
    let opts = if mount.is_empty() { MountOptions::default() } else { MountOptions::parse(&[mount.to_string()])? };
    Ok(Filesystem::mount(dev, opts)?)
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
    let mut fs = open(&a.image, a.size, &a.mount)?;
    fs.switches = sw;
    if !a.json {
        eprintln!("prepare: {} files of {} bytes{}", o.file_num, o.file_size(), if o.prealloc { " (fallocated)" } else { "" });
    }
    let root = fs.root();
    let files = fileio::prepare(&mut fs, root, &o)?;
    let shared = SharedFs::new(fs);
    let r = fileio::run(&shared, &files, &o)?;
    let mut fs = shared.into_inner();
    fs.close_all()?;
    fs.sync()?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_report(&o, &r);
    }
    Ok(())
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
        ("latency min/avg/max (ms)", format!("{:.2} / {:.2} / {:.2}", r.latency_ms.min, r.latency_ms.avg, r.latency_ms.max)),
        ("latency 95th percentile (ms)", format!("{:.2}", r.latency_ms.p95)),
        ("events per thread", r.events_per_thread.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")),
        ("log syncs (skipped, joined)", format!("{} ({}, {})", r.stats.log_syncs, r.stats.log_syncs_skipped, r.stats.log_syncs_joined)),
        ("full commits", r.stats.full_commits.to_string()),
    ];
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    println!("fileio {:?}, {} threads, {} files, block {}", o.mode, o.threads, o.file_num, o.block_size);
    println!("{t}");
}
