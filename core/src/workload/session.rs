//! A workload session on an image: the device (with a volatile write cache
//! when the session may crash), the mounted filesystem, the steps that act
//! on the session rather than the filesystem (`crash`, `remount`, `set`,
//! `stats`), and the final check of a script's expectations.

use super::engine::{manifest, EngineRunner, StepOutput};
use super::manifest::{check_expectations, Manifest, Outcome};
use super::script::{Expect, Script, Step};
use crate::fs::{Filesystem, MountOptions};
use crate::io::{BlockDevice, FileDevice, VolatileFile};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The device under a session.
enum Dev {
    /// Crashes possible: writes can be taken back until flushed.
    Volatile(Arc<VolatileFile>),
    /// No crash support (benchmarks): writes go to the file, carried out
    /// behind the engine's back.
    Plain(Arc<crate::io::WriteBehind>),
    /// After the final crash: the image stays as the power failure left it;
    /// recovery and what follows happen in memory over it.
    Overlay(Arc<crate::io::OverlayDevice>),
    /// A device the caller made (crash exploration records on one).
    Other(Arc<dyn BlockDevice>),
}

impl Dev {
    fn block(&self) -> Arc<dyn BlockDevice> {
        match self {
            Dev::Volatile(d) => d.clone(),
            Dev::Plain(d) => d.clone(),
            Dev::Overlay(d) => d.clone(),
            Dev::Other(d) => d.clone(),
        }
    }
}

/// How a session opens its image.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// Support `crash` (a volatile write cache over the file).
    pub crashable: bool,
    /// Keep written bytes too, for `crash --keep-random`.
    pub record_writes: bool,
}

/// The image files of a script's filesystem of `n` devices: `image`
/// itself for devid 1, then `NAME-2.EXT`, `NAME-3.EXT`... beside it.
pub fn device_paths(image: &Path, n: usize) -> Vec<PathBuf> {
    let mut out = vec![image.to_path_buf()];
    let stem = image
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    for i in 2..=n {
        let name = match image.extension() {
            Some(e) => format!("{stem}-{i}.{}", e.to_string_lossy()),
            None => format!("{stem}-{i}"),
        };
        out.push(image.with_file_name(name));
    }
    out
}

/// A script running on the engine: its image files, their devices, the
/// mounted filesystem and the descriptors steps hold. Crash steps unmount,
/// cut power to every device and mount again (log replay included) within
/// the session.
pub struct Session {
    paths: Vec<PathBuf>,
    /// One per device, devid order.
    devs: Vec<Dev>,
    fs: Option<Filesystem>,
    /// Runs the filesystem steps and holds their descriptors (`open-fd`,
    /// `tmpfile`); emptied by a crash.
    pub runner: EngineRunner,
    mount: MountOptions,
    switches: crate::fs::Switches,
    /// Replays done by mounts after crashes.
    pub replays: u64,
}

impl Session {
    /// Open `path` for `script`: made by mkfs from the script's `mkfs` and
    /// `fssize` when it does not exist, its log replayed when it has one,
    /// mounted with the script's options. A script on several devices
    /// (`devices N`) uses the files [`device_paths`] names.
    pub fn open(path: &Path, script: &Script, o: &SessionOptions) -> Result<Session> {
        Session::open_set(&device_paths(path, script.devices), script, o)
    }

    /// [`Session::open`] on the image files `paths` (devid order), as
    /// many as the script's `devices`. When none exists they are made by
    /// mkfs; some existing and some not is an error.
    pub fn open_set(paths: &[PathBuf], script: &Script, o: &SessionOptions) -> Result<Session> {
        if paths.len() != script.devices {
            return Err(Error::Invalid(format!(
                "the script's filesystem spans {} device(s), {} given",
                script.devices,
                paths.len()
            )));
        }
        let exist = paths.iter().filter(|p| p.exists()).count();
        if exist == 0 {
            let mk = crate::mkfs::MkfsOptions::from_mkfs_args(&script.mkfs)?;
            crate::mkfs::make_images(paths, script.fssize, &mk)?;
        } else if exist < paths.len() {
            let missing: Vec<String> = paths
                .iter()
                .filter(|p| !p.exists())
                .map(|p| p.display().to_string())
                .collect();
            return Err(Error::Invalid(format!(
                "{} of the filesystem's devices exist and {} not: {}",
                exist,
                missing.len(),
                missing.join(", ")
            )));
        }
        let mount = MountOptions::parse(&[script.mount_options()])?;
        let mut devs = Vec::with_capacity(paths.len());
        for path in paths {
            let file = FileDevice::open(path, true)?;
            devs.push(if o.crashable {
                Dev::Volatile(Arc::new(VolatileFile::new(file, o.record_writes)?))
            } else {
                Dev::Plain(Arc::new(crate::io::WriteBehind::new(Arc::new(file))?))
            });
        }
        let mut s = Session {
            paths: paths.to_vec(),
            devs,
            fs: None,
            runner: EngineRunner::new(),
            mount,
            switches: Default::default(),
            replays: 0,
        };
        s.mount_now()?;
        Ok(s)
    }

    /// A session on a device the caller made, holding an image already
    /// (its log replayed first, as at any mount). It cannot `crash`.
    pub fn on_device(dev: Arc<dyn BlockDevice>, script: &Script) -> Result<Session> {
        Session::on_devices(vec![dev], script)
    }

    /// [`Session::on_device`] on the devices of a set, devid order.
    pub fn on_devices(devs: Vec<Arc<dyn BlockDevice>>, script: &Script) -> Result<Session> {
        let mount = MountOptions::parse(&[script.mount_options()])?;
        let mut s = Session {
            paths: Vec::new(),
            devs: devs.into_iter().map(Dev::Other).collect(),
            fs: None,
            runner: EngineRunner::new(),
            mount,
            switches: Default::default(),
            replays: 0,
        };
        s.mount_now()?;
        Ok(s)
    }

    /// The image file the session was opened on (devid 1's); empty for a
    /// session made by [`Session::on_device`].
    pub fn path(&self) -> &Path {
        self.paths.first().map_or(Path::new(""), |p| p.as_path())
    }

    /// Every image file of the session, devid order.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The devices (devid order) with names for messages.
    fn blocks(&self) -> Vec<(String, Arc<dyn BlockDevice>)> {
        self.devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let name = match self.paths.get(i) {
                    Some(p) => p.display().to_string(),
                    None => format!("device {}", i + 1),
                };
                (name, d.block())
            })
            .collect()
    }

    /// Mount: replay a log first, as the kernel's mount does.
    fn mount_now(&mut self) -> Result<()> {
        let first = self
            .devs
            .first()
            .ok_or_else(|| Error::Invalid("no device".into()))?
            .block();
        if crate::image::read_superblock(first.as_ref(), 0)?
            .log_root
            .get()
            != 0
        {
            self.replays += 1;
        }
        let mut fs = crate::log::replay::mount_devices(self.blocks(), self.mount.clone(), false)?;
        if matches!(self.devs[0], Dev::Plain(_)) {
            fs.store.data().start_data_writer()?;
        }
        fs.switches = self.switches;
        self.fs = Some(fs);
        Ok(())
    }

    /// The mounted filesystem; an error if none is mounted (a mount after a
    /// crash failed).
    pub fn fs(&mut self) -> Result<&mut Filesystem> {
        self.fs
            .as_mut()
            .ok_or_else(|| Error::Invalid("no filesystem mounted".into()))
    }

    /// Run one step.
    pub fn apply(&mut self, st: &Step) -> Result<StepOutput> {
        self.apply_prepared(st, None)
    }

    /// [`Session::apply`] with the step's payload made ahead (see
    /// [`super::content::prepared_payload`]).
    pub fn apply_prepared(&mut self, st: &Step, payload: Option<&[u8]>) -> Result<StepOutput> {
        match st {
            Step::Crash { keep_random } => {
                self.crash(*keep_random)?;
                Ok(StepOutput::default())
            }
            Step::Remount => {
                let fs = self
                    .fs
                    .as_mut()
                    .ok_or_else(|| Error::Invalid("no filesystem mounted".into()))?;
                self.runner.close_all(fs)?;
                fs.remount()?;
                Ok(StepOutput::default())
            }
            Step::Set { name, on } => {
                match name.as_str() {
                    "fast-fsync-skip" => self.switches.fast_fsync_skip = *on,
                    "log-conflicting-inodes" => self.switches.log_conflicting_inodes = *on,
                    "sync-io-first" => self.switches.sync_io_first = *on,
                    o => return Err(Error::Invalid(format!("unknown switch {o:?} (fast-fsync-skip, log-conflicting-inodes, sync-io-first)"))),
                }
                let sw = self.switches;
                self.fs()?.switches = sw;
                Ok(StepOutput::default())
            }
            Step::Stats { json } => {
                let text = self.stats_text(*json)?;
                Ok(StepOutput { text: Some(text) })
            }
            _ => {
                let fs = self
                    .fs
                    .as_mut()
                    .ok_or_else(|| Error::Invalid("no filesystem mounted".into()))?;
                self.runner.apply_prepared(fs, st, payload)
            }
        }
    }

    /// The volatile devices of a crashable session.
    fn volatile(&self) -> Result<Vec<Arc<VolatileFile>>> {
        self.devs
            .iter()
            .map(|d| match d {
                Dev::Volatile(v) => Ok(v.clone()),
                _ => Err(Error::Invalid(
                    "this session cannot crash (opened without crash support)".into(),
                )),
            })
            .collect()
    }

    /// Power failure: nothing more is written, each device keeps what was
    /// flushed to it (and with `keep_random` a random subset of the rest,
    /// chosen for each device on its own: one may keep what another
    /// lost), and the filesystem is mounted again (its log replayed).
    pub fn crash(&mut self, keep_random: Option<u64>) -> Result<()> {
        let devs = self.volatile()?;
        self.runner.drop_all();
        self.fs = None;
        power_fail_all(&devs, keep_random)?;
        self.mount_now()
    }

    /// The power failure that ends a workload: the images keep what it
    /// left (its log not replayed, for the kernel or btrkit-replay to
    /// recover); the session goes on, for expectations, on a recovery made
    /// in memory over them.
    pub fn crash_final(&mut self, keep_random: Option<u64>) -> Result<()> {
        let devs = self.volatile()?;
        self.runner.drop_all();
        self.fs = None;
        power_fail_all(&devs, keep_random)?;
        self.devs = devs
            .into_iter()
            .map(|d| Dev::Overlay(Arc::new(crate::io::OverlayDevice::new(d))))
            .collect();
        self.mount_now()
    }

    /// The engine's counters as text or one line of JSON.
    pub fn stats_text(&mut self, json: bool) -> Result<String> {
        let fs = self.fs()?;
        let (clean, dirty_meta, dirty_data) = fs.cache_sizes();
        let io = fs.store.stats();
        let st = fs.stats.clone();
        let v = serde_json::json!({
            "commits": st.commits,
            "commit_reasons": st.commit_reasons,
            "fsyncs": st.fsyncs,
            "log_syncs": st.log_syncs,
            "log_syncs_skipped": st.log_syncs_skipped,
            "log_syncs_joined": st.log_syncs_joined,
            "full_commits": st.full_commits,
            "full_commit_reasons": st.full_commit_reasons,
            "conflicting_inodes_logged": st.conflicting_inodes_logged,
            "flushes": io.flushes,
            "bytes_written": {"data": io.data_bytes, "log": io.log_bytes, "metadata": io.metadata_bytes, "super": io.super_bytes},
            "ordered_extents": st.ordered_extents,
            "writeback_bytes": st.writeback_bytes,
            "compressed_extents": st.compressed_extents,
            "inline_extents": st.inline_extents,
            "nocow_writes": st.nocow_writes,
            "cache": {"clean_tree_bytes": clean, "dirty_tree_bytes": dirty_meta, "dirty_data_bytes": dirty_data},
            "switches": fs.switches,
        });
        if json {
            return Ok(v.to_string());
        }
        let mut lines = Vec::new();
        if let Some(o) = v.as_object() {
            for (k, x) in o {
                lines.push(format!("{k:<26} {x}"));
            }
        }
        Ok(lines.join("\n"))
    }

    /// Check a script's expectations against the filesystem as it stands
    /// (after the final crash and recovery, if the script ended with one).
    pub fn check(&mut self, script: &Script) -> Result<Vec<String>> {
        if script.expects.is_empty() {
            return Ok(Vec::new());
        }
        let m = self.manifest()?;
        let mut out = Outcome::default();
        if script
            .expects
            .iter()
            .any(|(_, e)| matches!(e, Expect::Consistent))
        {
            out.consistent = Some(self.consistent()?);
        }
        for (_, e) in &script.expects {
            if let Expect::Post(st) = e {
                out.posts
                    .push(self.apply(st).map(drop).map_err(|e| e.to_string()));
            }
        }
        Ok(check_expectations(script, &m, &out))
    }

    /// What a user sees of the mounted filesystem now, every path.
    pub fn manifest(&mut self) -> Result<Manifest> {
        manifest(self.fs()?)
    }

    /// Commit, then run the checker on the image: Err with the first errors.
    pub fn consistent(&mut self) -> Result<std::result::Result<(), String>> {
        self.fs()?.sync()?;
        let img = crate::devices::DeviceSet::assemble(self.blocks())?.open(Default::default())?;
        let r = crate::check::check_image(
            &img,
            crate::check::CheckOptions::own_writes(),
            &crate::check::NoProgress,
        );
        if r.is_pristine() {
            return Ok(Ok(()));
        }
        let first: Vec<String> = r
            .findings
            .iter()
            .filter(|f| {
                f.severity == crate::check::findings::Severity::Error
                    || f.category.is_damaged_copy()
            })
            .take(3)
            .map(|f| f.message.clone())
            .collect();
        Ok(Err(format!("{} error(s): {}", r.errors, first.join(" | "))))
    }

    /// Unmount: close every file and commit (`clean`), or leave the last
    /// commit as it is (after an internal error, nothing half-done is
    /// committed).
    pub fn close(mut self, clean: bool) -> Result<()> {
        if let Some(mut fs) = self.fs.take() {
            if clean {
                self.runner.close_all(&mut fs)?;
                fs.close_all()?;
                fs.sync()?;
            }
        }
        for d in &self.devs {
            match d {
                Dev::Volatile(d) => d.flush()?,
                Dev::Plain(d) => d.flush()?,
                Dev::Overlay(_) => {}
                Dev::Other(d) => d.flush()?,
            }
        }
        Ok(())
    }
}

/// Cut power to every device at once; with `keep_random`, each device
/// keeps its own random subset of its unflushed writes (seeded apart).
fn power_fail_all(devs: &[Arc<VolatileFile>], keep_random: Option<u64>) -> Result<()> {
    for (i, d) in devs.iter().enumerate() {
        d.power_fail(keep_random.map(|s| s.wrapping_add(i as u64 * 0x9e37_79b9)))?;
    }
    Ok(())
}
