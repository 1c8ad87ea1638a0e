//! btrkit-mount: a read-only FUSE mount of a Btrfs image that never writes
//! it, with the fsync log applied in memory first: what the kernel would
//! show after its replay, on an image the kernel cannot (or should not)
//! mount.

mod fuse;
mod fuse_rw;
mod rw;

use anyhow::{bail, Context};
use btrkit_cli::ReadArgs;
use btrkit_core::io::FileDevice;
use btrkit_core::mount_view::ReadOnlyView;
use btrkit_core::restore::LogMode;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "btrkit-mount",
    version,
    about = "Mount a Btrfs image through FUSE: read-only without writing to it (the fsync log applied in memory), or read-write through btrkit's engine",
    after_help = "Examples:\n  btrkit-mount crash.img /mnt                 as the kernel shows it after its log replay\n  btrkit-mount crash.img /mnt --no-log        the state of the last commit\n  btrkit-mount a.img b.img /mnt --degraded    a filesystem on several devices, some missing\n  btrkit-mount crash.img /mnt -f              in the foreground; Ctrl-C unmounts\n  btrkit-mount --rw disk.img /mnt             read-write: fsyncs go to the log, commits every 30 s and at unmount\n  btrkit-mount -o rw,commit=5 disk.img /mnt   the same, committing every 5 s\n  fusermount3 -u /mnt                         unmount\n\nExit status: 0 mounted (and, in the foreground, unmounted cleanly), 1 the filesystem cannot be read, 16 usage."
)]
pub(crate) struct Args {
    /// The image (and the other devices of a filesystem on several
    /// devices, in any order), then the mount point.
    #[arg(required = true, num_args = 2.., value_name = "IMAGE... MOUNTPOINT")]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    read: ReadArgs,
    /// Mount this subvolume (its path in the filesystem or its id) instead
    /// of the default one.
    #[arg(long, value_name = "PATH|ID")]
    subvol: Option<String>,
    /// Stay in the foreground; Ctrl-C (or SIGTERM) unmounts.
    #[arg(short, long)]
    foreground: bool,
    /// Let other users than the one mounting read the files.
    #[arg(long)]
    allow_other: bool,
    /// Threads answering the kernel [default: 4, 32 with --rw]. They take
    /// turns on the filesystem, but with --rw an fsync waits for its log
    /// sync (batching window and I/O) without it, holding only its thread:
    /// many clients fsyncing at once want about as many threads.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Do not read the subvolume's metadata ahead at mount (a faster
    /// mount of a big filesystem when only a few files are wanted).
    #[arg(long)]
    no_warm: bool,
    /// Mount read-write: programs change the filesystem through btrkit's
    /// engine; fsync, fdatasync and fsyncdir write the fsync log the
    /// kernel replays; a commit every 30 s (commit=) and at unmount. A
    /// pending log is replayed first, as the kernel's mount does.
    #[arg(long)]
    rw: bool,
    /// Mount options, as mount(8)'s -o: rw (the same as --rw), ro, and
    /// the kernel's btrfs options a read-write mount takes (commit=N,
    /// compress=..., flushoncommit, ...).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// For crash tests (read-write): the image's writes act as a disk's
    /// volatile write cache, and SIGUSR1 pulls the plug: everything
    /// written since the last flush is undone and the server exits at
    /// once (status 137) without unmounting (then `fusermount3 -uz`).
    /// SIGKILL instead models a crash of the server alone.
    #[arg(long, requires = "rw")]
    volatile_cache: bool,
}

fn main() {
    btrkit_cli::generate::handle::<Args>();
    let a = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let usage = !matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            let _ = e.print();
            std::process::exit(if usage { 16 } else { 0 });
        }
    };
    if let Err(e) = run(&a) {
        say(format_args!(
            "error: {}",
            format!("{e:#}").replace('\n', " ")
        ));
        std::process::exit(1);
    }
}

fn run(a: &Args) -> anyhow::Result<()> {
    let (mountpoint, images) = match a.paths.split_last() {
        Some((m, i)) if !i.is_empty() => (m.clone(), i.to_vec()),
        _ => bail!("give the image and the mount point"),
    };
    if !mountpoint.is_dir() {
        bail!("{}: not a directory", mountpoint.display());
    }
    let (rw_wanted, options) = rw::split_options(&a.options)?;
    let rw = a.rw || rw_wanted;
    if !rw && !options.is_empty() {
        bail!(
            "mount options {} need a read-write mount (--rw or -o rw)",
            options.join(",")
        );
    }
    if !a.foreground {
        return daemonize(&mountpoint);
    }
    if rw {
        return rw::run(a, &mountpoint, &images, options);
    }
    let paths = a.read.paths(&images);
    let open = |log: LogMode, warm: bool| -> anyhow::Result<ReadOnlyView> {
        let devs = FileDevice::open_all_mmap(&paths)?;
        Ok(ReadOnlyView::open(
            devs,
            &a.read.read_options(log),
            a.subvol.as_deref(),
            warm,
        )?)
    };
    let mode = a.read.log_mode();
    let view = match open(mode, !a.no_warm) {
        Ok(v) => v,
        Err(e) => {
            // Whether the log is what cannot be read: the same filesystem
            // without it opens. Then say so, and what to do.
            let log_at_fault = mode != LogMode::Ignore && open(LogMode::Ignore, false).is_ok();
            let e = e.context("opening the filesystem");
            if !log_at_fault {
                return Err(e);
            }
            let hint = if mode == LogMode::Salvage {
                "nothing of the fsync log could be applied; --no-log mounts the state of the last commit"
            } else {
                "the fsync log could not be replayed; mount with --salvage to apply what the rest of it still proves, or --no-log for the state of the last commit"
            };
            return Err(e.context(hint));
        }
    };
    for b in view.bad_csum_blocks() {
        say(format_args!(
            "warning: tree block {b} fails its checksum on every copy; read as it stands"
        ));
    }
    let source = std::fs::canonicalize(&images[0])
        .unwrap_or_else(|_| images[0].clone())
        .display()
        .to_string();
    let session = fuse::mount(
        view,
        &mountpoint,
        &source,
        a.allow_other,
        a.threads.unwrap_or(4),
    )
    .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    // Until a signal asks to unmount or the mount goes away (fusermount3 -u).
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("signal handler")?;
    }
    while !stop.load(Ordering::Relaxed) && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    if session.guard.is_finished() {
        return session.join().context("the FUSE session");
    }
    session
        .umount_and_join()
        .with_context(|| format!("unmounting {}", mountpoint.display()))
}

/// Run this program again in the foreground, in its own process group,
/// and return once its mount is up (or with its error when it fails
/// first): the usual way of mount helpers, without forking a process
/// that may already hold threads.
fn daemonize(mountpoint: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding this program")?;
    let target = std::fs::canonicalize(mountpoint)?;
    let before = fuse::mounts_at(&target);
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("--foreground")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("starting the mount")?;
    // What it says before the mount is up is passed on; after, it writes
    // into a pipe nobody reads (and ignores that it cannot).
    let relay = child.stderr.take().map(|mut from| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut std::io::stderr());
        })
    });
    loop {
        if let Some(st) = child.try_wait()? {
            if let Some(t) = relay {
                let _ = t.join();
            }
            // It printed why.
            std::process::exit(st.code().unwrap_or(1));
        }
        if fuse::mounts_at(&target) > before {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A line on stderr that never fails the program (a daemon's stderr is a
/// pipe whose reader is gone once the mount is up).
pub fn say(msg: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "btrkit-mount: {msg}");
}
