//! Crash exploration: run a script once on a device that records every
//! write and flush, then rebuild the disk as a power failure would have
//! left it after each flush (and, optionally, with random subsets of the
//! writes not yet flushed, some of them torn), recover each such image as
//! a mount does (log replay), check it, and check that every file fsynced
//! before that moment has a state it really had since its fsync.
//!
//! The promise an fsync makes is about one inode: from the flush that
//! completed it on, a crash must recover that inode's data and size as
//! they were at the fsync or as some later operation left them (a later
//! write, truncate or unlink may have reached the disk too, but nothing
//! older and nothing that never was). States are taken after every step,
//! so a crash during step `j` may show the state before or after it.

use super::content::Prng;
use super::script::{Script, Step};
use super::session::Session;
use crate::fs::{Filesystem, Loc, MountOptions};
use crate::io::{BlockDevice, FileDevice, Journal, JournalDevice, JournalEvent, OverlayDevice};
use crate::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PAGE: usize = 4096;

/// How [`explore`] varies the crash images beyond the plain one at each
/// flush point. The default tries only the plain images and saves none.
#[derive(Clone, Debug, Default)]
pub struct ExploreOptions {
    /// Random subsets of the unflushed writes tried at each flush point.
    pub random: u32,
    /// Seed of those subsets.
    pub seed: u64,
    /// Save each crash image that shows a violation here, as it was before
    /// recovery (`point-K.img`, `point-K-subset-S.img`).
    pub save_dir: Option<std::path::PathBuf>,
}

/// What one inode looked like: None when it did not exist.
type State = Option<(u64, u64)>;

/// One broken promise or damaged recovery.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// Flushes before the power failure.
    pub flush_point: usize,
    /// Which random subset of the unflushed writes was kept (None: none).
    pub subset: Option<u32>,
    /// What is wrong, one line: a failed recovery, a checker error, or an
    /// fsynced file whose size or content was never its state since the fsync.
    pub what: String,
}

/// The result of [`explore`]: what was run, how many crash images were
/// checked, and every violation found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExploreReport {
    /// Steps run, warm-up included, up to the script's first `crash`.
    pub steps: usize,
    /// Device writes the run made, as the recording device saw them.
    pub writes: usize,
    /// Crash points explored: one per flush the run made, plus the point
    /// before the first flush.
    pub flush_points: usize,
    /// Crash images recovered and checked.
    pub states_checked: usize,
    /// fsyncs of regular files whose promise was checked.
    pub promises: usize,
    /// Every violation found, in the order the crash images were checked.
    pub violations: Vec<Violation>,
}

/// An fsync's promise: inode, the step that made it, its path then.
struct Promise {
    inode: Loc,
    step: usize,
    path: String,
}

/// Run `script` on a copy-on-write view of `image` (the image itself is
/// not changed), then explore every flush point. `progress(done, total)`
/// is called as crash images are checked. A script on several devices
/// (`devices N`) uses the files [`super::session::device_paths`] names.
pub fn explore(
    image: &Path,
    script: &Script,
    o: &ExploreOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ExploreReport> {
    let paths = super::session::device_paths(image, script.devices);
    explore_set(&paths, script, o, progress)
}

/// [`explore`] on the image files `paths` (devid order), made by mkfs when
/// none exists. Each device keeps its own history: a crash point is the
/// moment before any device's flush (and the end); each device then holds
/// what its own last flush made durable, and a random subset keeps or
/// tears each device's unflushed writes on its own, so one device may
/// keep what another lost.
pub fn explore_set(
    paths: &[PathBuf],
    script: &Script,
    o: &ExploreOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ExploreReport> {
    if paths.len() != script.devices {
        return Err(Error::Invalid(format!(
            "the script's filesystem spans {} device(s), {} given",
            script.devices,
            paths.len()
        )));
    }
    match paths.iter().filter(|p| p.exists()).count() {
        0 => {
            let mk = crate::mkfs::MkfsOptions::from_mkfs_args(&script.mkfs)?;
            crate::mkfs::make_images(paths, script.fssize, &mk)?;
        }
        n if n < paths.len() => {
            return Err(Error::Invalid(format!(
                "{n} of the filesystem's {} devices exist",
                paths.len()
            )))
        }
        _ => {}
    }
    let mut bases: Vec<Arc<dyn BlockDevice>> = Vec::with_capacity(paths.len());
    for p in paths {
        bases.push(Arc::new(FileDevice::open(p, false)?));
    }
    let journal = Arc::new(Journal::default());
    let recorded: Vec<Arc<dyn BlockDevice>> = bases
        .iter()
        .enumerate()
        .map(|(i, b)| {
            Arc::new(JournalDevice::in_journal(
                Arc::new(OverlayDevice::new(b.clone())),
                journal.clone(),
                i,
            )) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut session = Session::on_devices(recorded, script)?;
    let mut steps: Vec<Step> = Vec::new();
    if script.warmup == Some(true) {
        steps.extend(super::content::warmup_steps());
    }
    for (_, st) in &script.steps {
        if st.is_crash() {
            // Every flush point is a crash here; the script's own crash
            // ends the run.
            break;
        }
        steps.push(st.clone());
    }

    // Run, taking the states of promised inodes after every step.
    let mut promises: Vec<Promise> = Vec::new();
    // states[j][inode]: after step j (index 0: before the first step).
    let mut states: Vec<BTreeMap<Loc, State>> = vec![BTreeMap::new()];
    let mut flushes_after: Vec<usize> = vec![journal.flushes()?];
    for (i, st) in steps.iter().enumerate() {
        let pre = match st {
            Step::Fsync(p) | Step::Fdatasync(p) => Some(p.clone()),
            _ => None,
        };
        let before = pre
            .as_ref()
            .and_then(|p| session.fs().ok()?.resolve(p, true).ok());
        session
            .apply(st)
            .map_err(|e| Error::Invalid(format!("step {} ({}): {e}", i + 1, st.verb())))?;
        if let (Some(p), Some(l)) = (pre, before) {
            let fs = session.fs()?;
            if crate::fs::inode::is_reg(fs.item(l)?.mode.get()) {
                promises.push(Promise {
                    inode: l,
                    step: i + 1,
                    path: p,
                });
            }
        }
        let fs = session.fs()?;
        let mut now = BTreeMap::new();
        for p in &promises {
            if let std::collections::btree_map::Entry::Vacant(e) = now.entry(p.inode) {
                e.insert(state_of(fs, p.inode)?);
            }
        }
        states.push(now);
        flushes_after.push(journal.flushes()?);
    }
    drop(session);
    let events = journal.events()?;

    let flushes = events
        .iter()
        .filter(|e| matches!(e.1, JournalEvent::Flush))
        .count();
    let points = flushes + 1;
    let mut report = ExploreReport {
        steps: steps.len(),
        writes: events.len() - flushes,
        flush_points: points,
        promises: promises.len(),
        ..Default::default()
    };
    let mount = MountOptions::parse(&[script.mount_options()])?;
    let total = points * (1 + o.random as usize);
    let ctx = PointCheck {
        paths,
        mount: &mount,
        promises: &promises,
        states: &states,
        flushes_after: &flushes_after,
        o,
    };
    // What each device's flushes made durable, and its writes since.
    let durable: Vec<OverlayDevice> = bases
        .iter()
        .map(|b| OverlayDevice::new(b.clone()))
        .collect();
    let mut pending: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); bases.len()];
    let mut done = 0;
    let mut k = 0;
    // Each flush event (and the end) closes crash point k: the power fails
    // before it, after k flushes.
    for ev in events.into_iter().map(Some).chain([None]) {
        match ev {
            Some((d, JournalEvent::Write { offset, data })) => pending[d].push((offset, data)),
            ev => {
                let found = ctx.check_point(k, &durable, &pending, &mut |n| {
                    done += n;
                    progress(done, total);
                })?;
                report.states_checked += found.0;
                report.violations.extend(found.1);
                k += 1;
                if let Some((d, _)) = ev {
                    for (off, data) in pending[d].drain(..) {
                        durable[d].write_at(off, &data)?;
                    }
                }
            }
        }
    }
    Ok(report)
}

/// What checking one crash point needs.
struct PointCheck<'a> {
    paths: &'a [PathBuf],
    mount: &'a MountOptions,
    promises: &'a [Promise],
    states: &'a [BTreeMap<Loc, State>],
    flushes_after: &'a [usize],
    o: &'a ExploreOptions,
}

impl PointCheck<'_> {
    /// Check crash point `k`: the durable state of every device, then
    /// random subsets of the unflushed writes `pending` (each device's).
    /// Returns the images checked and the violations.
    fn check_point(
        &self,
        k: usize,
        durable: &[OverlayDevice],
        pending: &[Vec<(u64, Vec<u8>)>],
        tick: &mut dyn FnMut(usize),
    ) -> Result<(usize, Vec<Violation>)> {
        // The last step that may have run when flush k+1 had not happened.
        let upto = self
            .flushes_after
            .iter()
            .position(|&f| f > k)
            .unwrap_or(self.states.len() - 1);
        let mut subsets: Vec<Option<u32>> = vec![None];
        if pending.iter().any(|p| !p.is_empty()) {
            subsets.extend((0..self.o.random).map(Some));
        }
        let mut checked = 0;
        let mut violations = Vec::new();
        for subset in subsets {
            let devs: Vec<OverlayDevice> = durable.iter().map(OverlayDevice::fork).collect();
            if let Some(r) = subset {
                let mut rng =
                    Prng::new(self.o.seed ^ ((k as u64) << 20) ^ r as u64 ^ 0x9e37_79b9_7f4a_7c15);
                for (dev, writes) in devs.iter().zip(pending) {
                    for (off, data) in writes {
                        match rng.below(4) {
                            0 => {}
                            1 => {
                                // Torn: some of its 4 KiB pages reach the disk.
                                for (j, chunk) in data.chunks(PAGE).enumerate() {
                                    if rng.below(2) == 1 {
                                        dev.write_at(off + (j * PAGE) as u64, chunk)?;
                                    }
                                }
                            }
                            _ => dev.write_at(*off, data)?,
                        }
                    }
                }
            }
            let unrecovered: Option<Vec<OverlayDevice>> = self
                .o
                .save_dir
                .as_ref()
                .map(|_| devs.iter().map(OverlayDevice::fork).collect());
            let devs: Vec<Arc<dyn BlockDevice>> = devs
                .into_iter()
                .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
                .collect();
            let found = check_crash_image(
                devs,
                self.mount,
                self.promises,
                self.states,
                self.flushes_after,
                k,
                upto,
            )?;
            if let (Some(dir), Some(imgs), false) =
                (&self.o.save_dir, unrecovered, found.is_empty())
            {
                let name = match subset {
                    Some(s) => format!("point-{k}-subset-{s}.img"),
                    None => format!("point-{k}.img"),
                };
                let dsts = super::session::device_paths(&dir.join(name), imgs.len());
                for ((img, src), dst) in imgs.iter().zip(self.paths).zip(&dsts) {
                    crate::io::sparse_copy(src, dst)?;
                    img.write_pages_to(&FileDevice::open(dst, true)?)?;
                }
            }
            violations.extend(found.into_iter().map(|what| Violation {
                flush_point: k,
                subset,
                what,
            }));
            checked += 1;
            tick(1);
        }
        Ok((checked, violations))
    }
}

/// Size and content hash of an inode, None when it does not exist.
fn state_of(fs: &mut Filesystem, l: Loc) -> Result<State> {
    let it = match fs.item(l) {
        Ok(it) => it,
        Err(Error::Errno { errno, .. }) if errno == libc::ENOENT => return Ok(None),
        Err(e) => return Err(e),
    };
    if it.nlink.get() == 0 {
        return Ok(None);
    }
    let size = if crate::fs::inode::is_reg(it.mode.get()) {
        fs.rt(l)?.i_size
    } else {
        it.size.get()
    };
    let data = fs.read_untracked(l, 0, size)?;
    Ok(Some((size, content_hash(&data))))
}

fn content_hash(data: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(data, 0)
}

/// Recover one crash image as a mount does and check it: the log replays,
/// the checker finds nothing, and every promise made by flush `k` holds.
/// Returns what is wrong, one line each.
fn check_crash_image(
    devs: Vec<Arc<dyn BlockDevice>>,
    mount: &MountOptions,
    promises: &[Promise],
    states: &[BTreeMap<Loc, State>],
    flushes_after: &[usize],
    k: usize,
    upto: usize,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let named: Vec<(String, Arc<dyn BlockDevice>)> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("device {}", i + 1), d.clone()))
        .collect();
    let set = match crate::devices::DeviceSet::assemble(named.clone()) {
        Ok(s) => s,
        Err(e) => return Ok(vec![format!("no valid superblock: {e}")]),
    };
    let open = |writable: bool| {
        set.open(crate::image::OpenOptions {
            writable,
            ..Default::default()
        })
    };
    if set.primary().is_some_and(|m| m.sb.log_root.get() != 0) {
        let replayed = open(true)
            .and_then(crate::trans::Store::from_image_for_replay)
            .and_then(|mut st| crate::log::replay::replay(&mut st, Default::default()));
        if let Err(e) = replayed {
            return Ok(vec![format!("log replay fails: {e}")]);
        }
    }
    match open(false) {
        Ok(img) => {
            let r = crate::check::check_image(
                &img,
                crate::check::CheckOptions::own_writes(),
                &crate::check::NoProgress,
            );
            if !r.is_pristine() {
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
                out.push(format!(
                    "the checker finds {} error(s): {}",
                    r.errors,
                    first.join(" | ")
                ));
            }
        }
        Err(e) => out.push(format!("the recovered image does not open: {e}")),
    }
    let mut fs = match crate::log::replay::mount_devices(named, mount.clone(), false) {
        Ok(fs) => fs,
        Err(e) => {
            out.push(format!("the recovered image does not mount: {e}"));
            return Ok(out);
        }
    };
    for p in promises {
        // Made durable by flush k: the fsync's step ended by then.
        if flushes_after[p.step] > k {
            continue;
        }
        let got = match state_of(&mut fs, p.inode) {
            Ok(s) => s,
            Err(e) => {
                out.push(format!(
                    "{} (fsynced at step {}): cannot be read back: {e}",
                    p.path, p.step
                ));
                continue;
            }
        };
        let window: Vec<State> = (p.step..=upto.max(p.step))
            .filter_map(|j| states.get(j).and_then(|m| m.get(&p.inode)).copied())
            .collect();
        if let Some(v) = broken_promise(&got, &window) {
            out.push(format!("{} (fsynced at step {}): {v}", p.path, p.step));
        }
    }
    Ok(out)
}

/// Whether `got` is one of the states the inode had from its fsync on
/// (`window`, oldest first); if not, what was lost.
pub fn broken_promise(got: &State, window: &[State]) -> Option<String> {
    if window.contains(got) {
        return None;
    }
    let promised = window.first().copied().flatten();
    Some(match (got, promised) {
        (None, _) => "lost: the file is gone".to_string(),
        (Some((gs, _)), Some((ps, _))) if gs != &ps => {
            format!("size {gs}, but it was {ps} at the fsync and never {gs} since")
        }
        (Some(_), _) => "its data is not what was fsynced or written since".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promise_holds_for_the_fsynced_state_or_a_later_one() {
        let w = [Some((10, 1)), Some((20, 2)), None];
        assert_eq!(broken_promise(&Some((10, 1)), &w), None);
        assert_eq!(broken_promise(&Some((20, 2)), &w), None);
        assert_eq!(broken_promise(&None, &w), None);
    }

    #[test]
    fn older_or_invented_states_break_it() {
        let w = [Some((20, 2)), Some((30, 3))];
        assert!(broken_promise(&Some((10, 1)), &w)
            .unwrap()
            .contains("size 10"));
        assert!(broken_promise(&Some((20, 9)), &w).unwrap().contains("data"));
        assert!(broken_promise(&None, &w).unwrap().contains("gone"));
    }
}
