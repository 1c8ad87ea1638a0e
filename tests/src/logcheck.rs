//! One scenario's log, judged against the kernel: the scenario runs
//! through `btrkit-shell` up to its final crash, which leaves the image as
//! the power failure would, log and all. Then:
//! - the kernel mounts a copy of it, replaying **our** log; every
//!   expectation of the scenario must hold on what it recovers, and
//!   `btrfs check` must find the result clean;
//! - what the kernel recovers from our log must equal what it recovers
//!   from its own run of the same script (its own crash image); the
//!   kernel's own outcome can vary between runs (work its workers finish
//!   before or after a later commit), so a difference is checked against
//!   further kernel runs, and ours must equal one of them;
//! - `btrkit-replay` of our crash image must give the tree the kernel's
//!   replay of it gives;
//! - every fsync of a regular file must have kept its promise in both
//!   (when the model of [`crate::fsmodel`] knows every step).
//!
//! `log_kernel.rs` runs the written corpus and the seeded families through
//! it, `log_sweep.rs` the random differential sweeps.

use crate::fsmodel;
use crate::kcrash::{self, Manifest, Scenario, Step};
use crate::oracle::{self, Progs};
use crate::shellrun::{self, last_line};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to judge a scenario.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Cache of the kernel's own crash images (None: made afresh, in the
    /// work directory, and not kept).
    pub cache: Option<PathBuf>,
    /// Kernel runs of the script at most (the first included) before a
    /// difference counts; at least 1.
    pub kernel_runs: usize,
    /// Keep the script and images in this directory.
    pub keep: Option<PathBuf>,
    /// The kernel's result may differ from ours (a named exception): the
    /// other checks still apply.
    pub may_differ: bool,
}

/// What one scenario came to.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Scenario name.
    pub name: String,
    /// The kernel recovered from our log what it recovers from its own run.
    pub equal: bool,
    /// What is wrong (empty: nothing beyond a difference).
    pub problems: Vec<String>,
    /// What else was seen (the difference itself, among others).
    pub notes: Vec<String>,
    /// Our crash image held a log.
    pub had_log: bool,
    /// fsync promises checked.
    pub promises: usize,
    /// Promises the kernel's own run breaks too (its behaviour, not ours).
    pub kernel_broken_promises: usize,
    /// The kernel could not mount its own crash image (it cannot replay the
    /// log it wrote): nothing to compare with; ours must still replay
    /// cleanly, with every promise kept.
    pub kernel_own_failed: bool,
}

impl Verdict {
    /// Nothing wrong and equal to the kernel's own run.
    pub fn clean(&self) -> bool {
        self.problems.is_empty() && (self.equal || self.kernel_own_failed)
    }
    /// Everything wrong with it, one block.
    pub fn report(&self) -> String {
        format!("{}\n{}", self.problems.join("\n"), self.notes.join("\n"))
    }
}

/// The kernel's own run of `scn`: its crash image (cached or in `work`).
fn kernel_crash_image(scn: &Scenario, opts: &Options, work: &Path) -> Result<PathBuf, String> {
    match &opts.cache {
        Some(c) => kcrash::cached_crash_image(scn, c).map(|c| c.path),
        None => {
            let _s = kcrash::slot();
            let dir = work.join("kernel");
            let c = kcrash::generate(scn, &dir)?;
            let keep = work.join("kernel-crash.img");
            std::fs::rename(&c.path, &keep).map_err(|e| e.to_string())?;
            let _ = std::fs::remove_dir_all(&dir);
            Ok(keep)
        }
    }
}

/// Judge `scn` (see the module text).
pub fn check(scn: &Scenario, opts: &Options) -> Verdict {
    let mut v = Verdict {
        name: scn.name.clone(),
        ..Default::default()
    };
    let tmp = match tempfile::Builder::new()
        .prefix(&format!("log-{}-", scn.name))
        .tempdir()
    {
        Ok(w) => w,
        Err(e) => {
            v.problems.push(e.to_string());
            return v;
        }
    };
    if let Some(k) = &opts.keep {
        let _ = std::fs::remove_dir_all(k);
        let _ = std::fs::create_dir_all(k);
    }
    let w = opts.keep.as_deref().unwrap_or(tmp.path());
    if let Err(e) = check_in(scn, opts, w, &mut v) {
        v.problems.push(e);
    }
    v
}

fn check_in(scn: &Scenario, opts: &Options, w: &Path, v: &mut Verdict) -> Result<(), String> {
    let theirs_img = kernel_crash_image(scn, opts, w).map_err(|e| format!("kernel run: {e}"))?;
    let _slot = kcrash::slot();
    // The kernel's own replay, kept until the promises are checked on it.
    let theirs_copy = w.join("kernel-replays-its-own.img");
    let theirs = match kcrash::manifest_via_copy(&theirs_img, &theirs_copy, "rw") {
        Ok(m) => m,
        Err(e) => {
            v.kernel_own_failed = true;
            v.notes
                .push(format!("the kernel cannot replay its own log: {e}"));
            Manifest::default()
        }
    };
    if opts.cache.is_none() && opts.keep.is_none() {
        let _ = std::fs::remove_file(&theirs_img);
    }
    // Our run, up to the crash.
    let r = shellrun::run(scn, w, "ours")?;
    if !r.ok {
        if !r.only_expectations_failed() {
            return Err(r.failure());
        }
        v.notes.push(format!(
            "btrkit-shell's own recovery breaks expectations: {}",
            r.stderr.lines().take(3).collect::<Vec<_>>().join(" | ")
        ));
    }
    let ours = r.devices[0].clone();
    v.had_log = kcrash::super_log_root(&ours)
        .map(|(_, l)| l != 0)
        .unwrap_or(false);
    // What the fsyncs promised, where the model knows every step.
    let steps: Vec<Step> = scn.steps.iter().map(|(_, s)| s.clone()).collect();
    let first = if scn.warmup.unwrap_or(true) {
        fsmodel::FIRST_INO_AFTER_WARMUP
    } else {
        257
    };
    let promises = fsmodel::promises(&steps, first).ok();
    v.promises = promises.as_ref().map_or(0, Vec::len);
    // The kernel replays our log.
    let kcopy = w.join("kernel-replays-ours.img");
    let k_ours: Manifest = kcrash::manifest_via_copy(&ours, &kcopy, "rw")
        .map_err(|e| format!("the kernel cannot mount our crash image: {e}"))?;
    let consistent = match oracle::check_clean(&[&kcopy], Progs::Distro) {
        Ok(()) => Ok(()),
        Err(e) => {
            v.problems.push(format!(
                "btrfs check after the kernel replayed our log: {}",
                e.lines().take(12).collect::<Vec<_>>().join(" | ")
            ));
            Err(last_line(&e).to_string())
        }
    };
    if let Some(p) = &promises {
        // A promise the kernel's own run breaks as well is the kernel's
        // behaviour (the contract), noted; one only ours breaks is ours.
        let theirs_broken = if v.kernel_own_failed {
            Vec::new()
        } else {
            broken_promises_in(&theirs_copy, &theirs, p, &steps, first)
        };
        let (shared, ours_only): (Vec<String>, Vec<String>) =
            broken_promises_in(&kcopy, &k_ours, p, &steps, first)
                .into_iter()
                .partition(|b| theirs_broken.contains(b));
        if !ours_only.is_empty() {
            v.problems.push(format!(
                "the kernel's replay of our log breaks fsync promises: {}",
                ours_only.join("; ")
            ));
        }
        if !shared.is_empty() {
            v.kernel_broken_promises = shared.len();
            v.notes.push(format!(
                "the kernel's own run breaks these fsync promises too: {}",
                shared.join("; ")
            ));
        }
    }
    if opts.keep.is_none() {
        let _ = std::fs::remove_file(&theirs_copy);
    }
    let posts_img = w.join("posts.img");
    let posts =
        kcrash::copy_sparse(&kcopy, &posts_img).and_then(|_| kcrash::run_posts(&posts_img, scn));
    let _ = std::fs::remove_file(&posts_img);
    if opts.keep.is_none() {
        let _ = std::fs::remove_file(&kcopy);
    }
    match posts {
        Ok(posts) => {
            let fails = kcrash::check_expectations(
                scn,
                &k_ours,
                &kcrash::Outcome {
                    consistent: Some(consistent),
                    posts,
                },
            );
            if !fails.is_empty() {
                v.problems.push(format!(
                    "the kernel's replay of our log breaks expectations: {}",
                    fails.join("; ")
                ));
            }
        }
        Err(e) => v.problems.push(format!("post steps: {e}")),
    }
    v.equal = !v.kernel_own_failed && k_ours == theirs;
    if !v.equal && !opts.may_differ && !v.kernel_own_failed {
        for run in 1..opts.kernel_runs.max(1) {
            let again = w.join(format!("kernel-again-{run}"));
            let other = std::fs::create_dir_all(&again)
                .map_err(|e| e.to_string())
                .and_then(|_| kcrash::generate(scn, &again))
                .and_then(|c| kcrash::manifest_of_image(&c.path, &again));
            let _ = std::fs::remove_dir_all(&again);
            match other {
                Ok(m) if m == k_ours => {
                    v.equal = true;
                    v.notes.push(format!(
                        "the kernel's runs differ; ours equals run {}:\n{}",
                        run + 1,
                        theirs.short_diff(&m, 12)
                    ));
                    break;
                }
                Ok(_) => {}
                Err(e) => v.notes.push(format!("kernel run {}: {e}", run + 1)),
            }
        }
    }
    if !v.equal && !v.kernel_own_failed {
        v.notes.push(format!(
            "the kernel recovers from our log (B) other than from its own (A):\n{}",
            theirs.short_diff(&k_ours, 12)
        ));
    }
    // btrkit-replay of our crash image agrees with the kernel's replay.
    let out = w.join("btrkit-replayed.img");
    let o = Command::new(crate::bin_path("btrkit-replay"))
        .arg(&ours)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("btrkit-replay: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "btrkit-replay exit {:?}: {}",
            o.status.code(),
            last_line(&String::from_utf8_lossy(&o.stderr))
        ));
    }
    let copy = w.join("btrkit-replayed-copy.img");
    match kcrash::manifest_via_copy(&out, &copy, "ro") {
        Ok(m) if m != k_ours => v.problems.push(format!(
            "btrkit-replay of our log (B) differs from the kernel's replay of it (A):\n{}",
            k_ours.short_diff(&m, 12)
        )),
        Ok(_) => {}
        Err(e) => v
            .problems
            .push(format!("mount of btrkit-replay's result: {e}")),
    }
    if opts.keep.is_none() {
        for f in [&out, &copy, &ours] {
            let _ = std::fs::remove_file(f);
        }
    }
    Ok(())
}

/// The promises `img` (its manifest `got`) breaks: those whose file is in
/// no state it had since its fsync are read back from the image and checked
/// byte by byte ([`fsmodel::bytes_within`]).
fn broken_promises_in(
    img: &Path,
    got: &Manifest,
    promises: &[fsmodel::Promise],
    steps: &[Step],
    first: u64,
) -> Vec<String> {
    let coarse = fsmodel::broken_promises(promises, got);
    if coarse.is_empty() {
        return coarse;
    }
    let mnt = match tempfile::Builder::new().prefix("promise-").tempdir() {
        Ok(d) => d,
        Err(e) => return vec![e.to_string()],
    };
    let m = match crate::LoopMount::mount(img, &mnt.path().join("m"), "ro") {
        Ok(m) => m,
        Err(e) => return vec![format!("mount for the promise check: {e}")],
    };
    let mut out = Vec::new();
    for p in promises {
        if fsmodel::broken_promises(std::slice::from_ref(p), got).is_empty() {
            continue;
        }
        let path = got
            .entries
            .iter()
            .find(|(_, e)| e.kind == 'f' && e.ino == p.ino)
            .map(|(path, _)| path.clone());
        let ok = match (&path, fsmodel::window_contents(steps, first, p)) {
            (Some(path), Ok(window)) => std::fs::read(m.path().join(&path[1..]))
                .is_ok_and(|data| fsmodel::bytes_within(&data, &window)),
            _ => false,
        };
        if !ok {
            out.extend(fsmodel::broken_promises(std::slice::from_ref(p), got));
        }
    }
    let _ = m.unmount();
    out
}
