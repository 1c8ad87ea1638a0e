//! `btrkit-mount --rw`: the devices opened for writing and locked, the
//! engine mounted, served until unmounted; the commit interval's tick and
//! the test switch that pulls the plug.

use crate::{fuse_rw, say, Args};
use anyhow::{bail, Context};
use btrkit_core::io::{BlockDevice, FileDevice, VolatileFile};
use btrkit_core::mount_rw::{RwOptions, WritableView};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `-o` lists: whether they ask for rw, and the engine's options (ro and
/// rw taken out; the last of them wins, as mount(8)).
pub fn split_options(given: &[String]) -> anyhow::Result<(bool, Vec<String>)> {
    let mut rw = false;
    let mut rest = Vec::new();
    for o in given.iter().flat_map(|g| g.split(',')) {
        match o.trim() {
            "" => {}
            "rw" => rw = true,
            "ro" => rw = false,
            // Options of FUSE or the VFS that change nothing here.
            "defaults"
            | "noatime"
            | "relatime"
            | "dev"
            | "suid"
            | "exec"
            | "nodev"
            | "nosuid"
            | "noexec"
            | "default_permissions" => {}
            other => rest.push(other.to_string()),
        }
    }
    Ok((rw, rest))
}

/// Serve the read-write mount until it is unmounted (a signal or
/// `fusermount3 -u`); then everything is committed.
pub fn run(
    a: &Args,
    mountpoint: &Path,
    images: &[PathBuf],
    options: Vec<String>,
) -> anyhow::Result<()> {
    let paths = a.read.paths(images);
    if a.read.no_log || a.read.salvage || a.read.backup.is_some() || a.read.tree_root.is_some() {
        bail!("--no-log, --salvage, --backup and --tree-root are for read-only mounts");
    }
    let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::with_capacity(paths.len());
    let mut volatile: Vec<Arc<VolatileFile>> = Vec::new();
    let mut locks = Vec::with_capacity(paths.len());
    for p in &paths {
        if let Some(why) = btrkit_core::tune::guard::in_use(p)? {
            bail!("{} is in use ({why})", p.display());
        }
        let file = FileDevice::open(p, true)
            .with_context(|| format!("cannot open {} for writing", p.display()))?;
        // Held for the life of the mount: other btrkit writers see it
        // (guard::in_use) and refuse.
        let lock = file
            .file()
            .try_clone()
            .with_context(|| format!("locking {}", p.display()))?;
        if lock.try_lock().is_err() {
            bail!(
                "{} is in use (another btrkit process holds it)",
                p.display()
            );
        }
        locks.push(lock);
        let dev: Arc<dyn BlockDevice> = if a.volatile_cache {
            let v = Arc::new(VolatileFile::new(file, false)?);
            volatile.push(v.clone());
            v
        } else {
            Arc::new(file)
        };
        devs.push((p.display().to_string(), dev));
    }
    let view = WritableView::mount(
        devs,
        &RwOptions {
            subvol: a.subvol.clone(),
            options,
            degraded: a.read.degraded,
        },
    )
    .context("mounting the filesystem read-write")?;
    let shared: fuse_rw::Shared = Arc::new(Mutex::new(Some(view)));
    let source = std::fs::canonicalize(&images[0])
        .unwrap_or_else(|_| images[0].clone())
        .display()
        .to_string();
    let session = fuse_rw::mount(
        shared.clone(),
        mountpoint,
        &source,
        a.allow_other,
        a.threads.unwrap_or(32),
    )
    .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("signal handler")?;
    }
    let plug = Arc::new(AtomicBool::new(false));
    if a.volatile_cache {
        signal_hook::flag::register(signal_hook::consts::SIGUSR1, plug.clone())
            .context("signal handler")?;
    }
    let mut last_tick = Instant::now();
    let mut failed: Option<anyhow::Error> = None;
    while !stop.load(Ordering::Relaxed) && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        if plug.load(Ordering::Relaxed) {
            // Between two operations: what the disk had flushed stays,
            // nothing else. A log sync running without the lock may be
            // writing: the devices take nothing more first.
            let _held = shared.lock();
            for v in &volatile {
                v.cut_off();
            }
            for v in &volatile {
                if let Err(e) = v.power_fail(None) {
                    say(format_args!("pulling the plug: {e}"));
                }
            }
            std::process::exit(137);
        }
        if last_tick.elapsed() >= Duration::from_secs(1) {
            last_tick = Instant::now();
            let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = g.as_mut() {
                if let Err(e) = v.tick() {
                    // As the kernel aborts a transaction that cannot commit:
                    // nothing more is written, every request fails.
                    say(format_args!(
                        "error: a commit failed ({e}); the filesystem is no longer written"
                    ));
                    *g = None;
                    failed = Some(anyhow::anyhow!("a commit failed: {e}"));
                }
            }
        }
    }
    let served = if session.guard.is_finished() {
        session.join().context("the FUSE session")
    } else {
        session
            .umount_and_join()
            .with_context(|| format!("unmounting {}", mountpoint.display()))
    };
    let view = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(v) = view {
        v.unmount().context("committing at unmount")?;
    }
    drop(locks);
    if let Some(e) = failed {
        return Err(e);
    }
    served
}
