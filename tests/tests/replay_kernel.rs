//! `btrkit-replay` against the kernel's own log replay, scenario by scenario
//! (`tests/scenarios/*.scn`, see `btrkit_tests::kcrash` for the language).
//!
//! For each scenario: a real crash image made by the kernel; the kernel's
//! result is the manifest of a copy it mounted (and so replayed); then
//! `btrkit-replay CRASH -o OUT` must exit 0, leave CRASH untouched, write an
//! OUT without a log that `btrfs check --readonly` passes and whose manifest
//! (mounted read-only, so the kernel changes nothing) is exactly the
//! kernel's. Every third scenario also replays a copy in place (after a
//! `--dry-run` that must change nothing), and replays it again (nothing left).
//!
//! Crash images are cached under `target/<profile>/kcrash-cache`, keyed by the
//! scenario text and the kernel release; `BTRKIT_KCRASH_FRESH=1` regenerates.
//! `BTRKIT_SCENARIOS=a,b,c*` runs only the named scenarios (`c*`: names
//! starting with `c`); `BTRKIT_REPLAY_BIN`
//! replaces the binary under test (relative to the repository root).

use btrkit_tests::kcrash::{self, Manifest, Scenario};
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::LoopMount;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "common/families.rs"]
mod families;

fn scenarios() -> Vec<Scenario> {
    let mut all = families::corpus();
    all.extend(families::all_families());
    if let Ok(only) = std::env::var("BTRKIT_SCENARIOS") {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        // `name*` keeps every scenario whose name starts with `name`.
        all.retain(|s| {
            names.iter().any(|n| match n.strip_suffix('*') {
                Some(pre) => s.name.starts_with(pre),
                None => *n == s.name,
            })
        });
    }
    all
}

/// Longest first, so two workers finish together.
fn by_cost(mut v: Vec<Scenario>) -> Vec<Scenario> {
    let cost = |s: &Scenario| {
        s.steps
            .iter()
            .map(|(_, st)| match st {
                kcrash::Step::WriteFiles { count, .. } => *count as u64,
                _ => 1,
            })
            .sum::<u64>()
    };
    v.sort_by_key(|s| std::cmp::Reverse(cost(s)));
    v
}

fn skip_reason() -> Option<String> {
    kcrash::can_run().err()
}

struct Run {
    status: i32,
    stderr: String,
}

fn replay(bin: &Path, args: &[&Path], flags: &[&str]) -> Result<Run, String> {
    let mut c = Command::new(bin);
    c.args(flags);
    for a in args {
        c.arg(a);
    }
    let o = c.output().map_err(|e| format!("{}: {e}", bin.display()))?;
    Ok(Run {
        status: o.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
    })
}

fn last_line(s: &str) -> &str {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// The kernel's replayed manifest, notes, and the damage btrfs check finds
/// in the kernel's result (its damage lines), if any.
type KernelSide = (Manifest, Vec<String>, Option<Vec<String>>);

/// The kernel's result for a crash image: replayed by mounting a copy
/// read-write, then the replayed copy mounted again read-only must show the
/// same (the manifest is stable and the replay was committed).
fn kernel_side(scn: &Scenario, crash: &Path, work: &Path) -> Result<KernelSide, String> {
    let mut notes = Vec::new();
    let kcopy = work.join("kernel.img");
    let kernel =
        kcrash::manifest_via_copy(crash, &kcopy, "rw").map_err(|e| format!("kernel mount: {e}"))?;
    let (_, log_after) = kcrash::super_log_root(&kcopy)?;
    if log_after != 0 {
        return Err(format!(
            "kernel: log_root still {log_after} after the replaying mount"
        ));
    }
    let again =
        kcrash::manifest_in_place(&kcopy, "ro").map_err(|e| format!("kernel remount: {e}"))?;
    if again != kernel {
        return Err(format!(
            "kernel manifest unstable across mounts:\n{}",
            kernel.short_diff(&again, 8)
        ));
    }
    let kernel_damage = match oracle::check_clean(&[&kcopy], Progs::Distro) {
        Ok(()) => None,
        Err(e) => {
            notes.push(format!(
                "the kernel's own result fails btrfs check: {}",
                last_line(&e)
            ));
            Some(damage_lines(&e))
        }
    };
    let progs_ok = kernel_damage.is_none();
    // Where btrfs check finds the kernel's result clean, so must btrkit-fsck.
    match fsck_clean(&kcopy) {
        Err(e) if progs_ok => return Err(format!("kernel's replayed image: {e}")),
        Err(e) => notes.push(format!("the kernel's own result: {e}")),
        Ok(()) => {}
    }
    let consistent = Some(match &kernel_damage {
        None => Ok(()),
        Some(d) => Err(d.join(" | ")),
    });
    let posts_img = work.join("kernel-posts.img");
    kcrash::copy_sparse(&kcopy, &posts_img)?;
    let posts = kcrash::run_posts(&posts_img, scn)?;
    let _ = std::fs::remove_file(&posts_img);
    let fails = kcrash::check_expectations(scn, &kernel, &kcrash::Outcome { consistent, posts });
    if !fails.is_empty() {
        return Err(format!(
            "kernel result breaks the scenario's expectations: {}",
            fails.join("; ")
        ));
    }
    let _ = std::fs::remove_file(&kcopy);
    Ok((kernel, notes, kernel_damage))
}

/// The lines of a btrfs check report that name damage (`root 5 inode 264
/// errors 100, file extent discount`), sorted: what two images with the same
/// damage share.
fn damage_lines(report: &str) -> Vec<String> {
    let mut v: Vec<String> = report
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("root ") && l.contains(" errors "))
        .map(String::from)
        .collect();
    v.sort();
    v
}

/// btrkit-fsck with data checksums finds no error, apart from the
/// free-space entries mkfs.btrfs 6.2 leaves for its temporary chunks (every
/// image here starts from it; upstream btrfs check also calls them errors).
fn fsck_clean(img: &Path) -> Result<(), String> {
    let r = btrkit_tests::fsck_support::run_fsck(
        img,
        &["--check-data-csum", "--check-mirrors"],
        Duration::from_secs(300),
    );
    if r.code != 0 && r.code != 4 {
        return Err(format!(
            "btrkit-fsck: exit {}: {}",
            r.code,
            last_line(&r.stderr)
        ));
    }
    let errors: Vec<String> = r
        .errors()
        .into_iter()
        .filter(|(_, cat, _)| cat != "free-space-stale")
        .map(|(phase, cat, msg)| format!("phase {phase} {cat}: {msg}"))
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    Err(format!(
        "btrkit-fsck finds {} error(s): {}",
        errors.len(),
        errors
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    ))
}

/// Checks of one replayed image against the kernel's manifest.
/// `kernel_damage`: what btrfs check finds wrong with the kernel's own
/// replayed image (its damage lines), if anything. Then ours must have the
/// same damage, not none: the kernel is the reference, and some logs leave
/// it with, for example, a missing hole item on a filesystem without
/// no-holes.
fn check_replayed(
    what: &str,
    img: &Path,
    kernel: &Manifest,
    kernel_damage: Option<&Vec<String>>,
    work: &Path,
) -> Result<(), String> {
    // Every check runs, so one failure report says all that is wrong.
    let mut problems = Vec::new();
    match kcrash::super_log_root(img) {
        Ok((_, 0)) => {}
        Ok((_, l)) => problems.push(format!("log_root is {l}, not 0")),
        Err(e) => return Err(format!("{what}: {e}")),
    }
    match (oracle::check_clean(&[img], Progs::Distro), kernel_damage) {
        (Ok(()), None) => {}
        (Ok(()), Some(k)) => problems.push(format!(
            "btrfs check finds nothing, but on the kernel's result: {}",
            k.join(" | ")
        )),
        (Err(e), None) => problems.push(e),
        (Err(e), Some(k)) => {
            let ours = damage_lines(&e);
            if &ours != k {
                problems.push(format!(
                    "btrfs check damage differs from the kernel's: ours {ours:?}, kernel's {k:?}"
                ));
            }
        }
    }
    // btrkit-fsck must agree: clean where the kernel's result is clean,
    // and finding the damage btrfs check finds where it is not.
    match (fsck_clean(img), kernel_damage) {
        (Err(e), None) => problems.push(e),
        (Ok(()), Some(k)) => problems.push(format!(
            "btrkit-fsck finds nothing, where btrfs check finds {}",
            k.join(" | ")
        )),
        _ => {}
    }
    let copy = work.join("check-copy.img");
    match kcrash::manifest_via_copy(img, &copy, "ro") {
        Ok(mine) if &mine != kernel => problems.push(format!(
            "differs from the kernel (A = kernel, B = btrkit):\n{}",
            kernel.short_diff(&mine, 10)
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("mount: {e}")),
    }
    let _ = std::fs::remove_file(&copy);
    if problems.is_empty() {
        return Ok(());
    }
    // The table shows the first line: the first line of each problem, joined.
    let heads: Vec<&str> = problems
        .iter()
        .map(|p| p.lines().next().unwrap_or(""))
        .collect();
    Err(format!(
        "{what}: {}\n{}",
        heads.join(" | "),
        problems.join("\n")
    ))
}

struct Outcome {
    name: String,
    log_root: u64,
    result: Result<(), String>,
    notes: Vec<String>,
    secs: f64,
}

fn run_one(i: usize, scn: &Scenario, bin: &Path, cache: &Path) -> Outcome {
    let t = Instant::now();
    let mut notes = Vec::new();
    let mut log_root = 0;
    let result = (|| -> Result<(), String> {
        let cached =
            kcrash::cached_crash_image(scn, cache).map_err(|e| format!("crash image: {e}"))?;
        log_root = cached.log_root;
        let _slot = kcrash::slot();
        let work = tempfile::Builder::new()
            .prefix(&format!("replay-{}-", scn.name))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let w = work.path();
        let crash = w.join("crash.img");
        kcrash::copy_sparse(&cached.path, &crash)?;
        let before = kcrash::image_digest(&crash)?;
        // The kernel's crash image, log included, is consistent: btrkit-fsck
        // (phase 8 checks the log) must not call it damaged.
        fsck_clean(&crash).map_err(|e| format!("crash image: {e}"))?;

        let (kernel, kn, kernel_damage) = kernel_side(scn, &crash, w)?;
        notes.extend(kn);

        let out = w.join("out.img");
        let r = replay(bin, &[&crash, Path::new("-o"), &out], &[])?;
        if r.status != 0 {
            return Err(format!(
                "btrkit-replay -o: exit {}: {}",
                r.status,
                last_line(&r.stderr)
            ));
        }
        if kcrash::image_digest(&crash)? != before {
            return Err("btrkit-replay -o changed the input image".into());
        }
        if !out.exists() {
            if log_root == 0 {
                notes.push("no log: -o wrote no output".into());
            } else {
                return Err("btrkit-replay -o exited 0 but wrote no output".into());
            }
        } else {
            check_replayed("-o OUT", &out, &kernel, kernel_damage.as_ref(), w)?;
            let _ = std::fs::remove_file(&out);
        }

        #[allow(clippy::manual_is_multiple_of)] // is_multiple_of needs Rust 1.87; MSRV is 1.80
        let every_third = i % 3 == 0;
        if every_third {
            let inplace = w.join("inplace.img");
            kcrash::copy_sparse(&crash, &inplace)?;
            let d0 = kcrash::image_digest(&inplace)?;
            let r = replay(bin, &[&inplace], &["--dry-run"])?;
            if r.status != 0 {
                return Err(format!(
                    "btrkit-replay --dry-run: exit {}: {}",
                    r.status,
                    last_line(&r.stderr)
                ));
            }
            if kcrash::image_digest(&inplace)? != d0 {
                return Err("btrkit-replay --dry-run changed the image".into());
            }
            let r = replay(bin, &[&inplace], &[])?;
            if r.status != 0 {
                return Err(format!(
                    "btrkit-replay in place: exit {}: {}",
                    r.status,
                    last_line(&r.stderr)
                ));
            }
            check_replayed("in place", &inplace, &kernel, kernel_damage.as_ref(), w)?;
            let d1 = kcrash::image_digest(&inplace)?;
            let r = replay(bin, &[&inplace], &[])?;
            if r.status != 0 {
                return Err(format!(
                    "btrkit-replay a second time: exit {}: {}",
                    r.status,
                    last_line(&r.stderr)
                ));
            }
            if kcrash::image_digest(&inplace)? != d1 {
                return Err("btrkit-replay on an image without a log changed it".into());
            }
        }
        Ok(())
    })();
    Outcome {
        name: scn.name.clone(),
        log_root,
        result,
        notes,
        secs: t.elapsed().as_secs_f64(),
    }
}

#[test]
fn replay_equals_kernel_on_every_scenario() {
    if let Some(why) = skip_reason() {
        btrkit_tests::skip(&why);
        return;
    }
    let t = Instant::now();
    let bin = kcrash::replay_bin();
    let cache = kcrash::default_cache_dir();
    let all = by_cost(scenarios());
    assert!(!all.is_empty(), "no scenarios");
    let outcomes = kcrash::parallel_map(&all, kcrash::max_jobs(), |i, s| {
        let o = run_one(i, s, &bin, &cache);
        eprintln!(
            "{:<40} {} ({:.1}s)",
            o.name,
            if o.result.is_ok() { "pass" } else { "FAIL" },
            o.secs
        );
        o
    });
    let mut table = format!("\n{:<40} {:<4} {:>7}  result\n", "scenario", "log", "time");
    let mut failed = Vec::new();
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for o in &sorted {
        let res = match &o.result {
            Ok(()) => "pass".to_string(),
            Err(e) => {
                let mut l = e.lines();
                let first = l.next().unwrap_or("");
                match l.next() {
                    Some(second) if first.ends_with(':') => format!("FAIL: {first} {second}"),
                    _ => format!("FAIL: {first}"),
                }
            }
        };
        let res: String = res.chars().take(160).collect();
        table += &format!(
            "{:<40} {:<4} {:>6.1}s  {res}\n",
            o.name,
            if o.log_root != 0 { "yes" } else { "no" },
            o.secs
        );
        for n in &o.notes {
            table += &format!("    note: {n}\n");
        }
        if let Err(e) = &o.result {
            failed.push(format!("--- {}\n{e}", o.name));
        }
    }
    let passed = outcomes.len() - failed.len();
    table += &format!(
        "{passed}/{} scenarios pass, {:.0}s\n",
        outcomes.len(),
        t.elapsed().as_secs_f64()
    );
    eprintln!("{table}");
    if !failed.is_empty() {
        let names: Vec<&str> = sorted
            .iter()
            .filter(|o| o.result.is_err())
            .map(|o| o.name.as_str())
            .collect();
        let detail: String = failed
            .join("\n")
            .lines()
            .take(400)
            .collect::<Vec<_>>()
            .join("\n");
        panic!(
            "{} of {} scenarios fail: {}\n{detail}",
            failed.len(),
            outcomes.len(),
            names.join(" ")
        );
    }
}

/// `btrkit-dump tree` reads every crash image, log trees included.
#[test]
fn dump_log_on_every_scenario() {
    if let Some(why) = skip_reason() {
        btrkit_tests::skip(&why);
        return;
    }
    let bin = btrkit_tests::bin_path("btrkit-dump");
    let cache = kcrash::default_cache_dir();
    let all = by_cost(scenarios());
    let fails: Vec<String> =
        kcrash::parallel_map(&all, kcrash::max_jobs(), |_, s| -> Option<String> {
            let c = match kcrash::cached_crash_image(s, &cache) {
                Ok(c) => c,
                Err(e) => return Some(format!("{}: crash image: {e}", s.name)),
            };
            let o = match Command::new(&bin).arg("tree").arg(&c.path).output() {
                Ok(o) => o,
                Err(e) => return Some(format!("{}: {e}", s.name)),
            };
            let out = String::from_utf8_lossy(&o.stdout);
            if !o.status.success() {
                return Some(format!(
                    "{}: btrkit-dump tree exit {:?}: {}",
                    s.name,
                    o.status.code(),
                    last_line(&String::from_utf8_lossy(&o.stderr))
                ));
            }
            if c.log_root != 0 && !out.contains("log root tree") && !out.contains("TREE_LOG") {
                return Some(format!(
                    "{}: btrkit-dump tree shows no log tree although log_root is {}",
                    s.name, c.log_root
                ));
            }
            None
        })
        .into_iter()
        .flatten()
        .collect();
    assert!(
        fails.is_empty(),
        "btrkit-dump tree fails on {} crash images:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// Loose cross-check of our generator and manifest against the project's
/// reference script on its own examples: same paths, types, sizes, link
/// counts, modes, symlink targets and xattrs.
#[test]
fn kcrash_py_agrees_on_the_examples() {
    if let Some(why) = skip_reason() {
        btrkit_tests::skip(&why);
        return;
    }
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/oracle");
    let script = shared.join("kcrash.py");
    if !script.exists() || Command::new("python3").arg("--version").output().is_err() {
        btrkit_tests::skip("needs python3 and ../shared/oracle/kcrash.py");
        return;
    }
    for name in ["rename-then-new-name", "double-fsync"] {
        let mut ours_scn = kcrash::load_scenario(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/{name}.scn")),
        )
        .unwrap();
        // kcrash.py has no warm-up files.
        ours_scn.warmup = Some(false);
        let example: PathBuf = shared.join(format!("examples/{name}.scn"));
        let _slot = kcrash::slot();
        let work = tempfile::tempdir().unwrap();
        let out = work.path().join("py");
        btrkit_tests::sys::must_run(
            Command::new("python3")
                .arg(&script)
                .arg("run")
                .arg(&example)
                .arg(&out),
        );
        let theirs: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("kernel.json")).unwrap()).unwrap();
        let c = kcrash::generate(&ours_scn, &work.path().join("rs")).unwrap();
        let ours = kcrash::manifest_of_image(&c.path, work.path()).unwrap();
        let theirs = theirs.as_object().unwrap();
        let their_paths: Vec<&String> = theirs.keys().filter(|k| !k.starts_with("__")).collect();
        let our_paths: Vec<&String> = ours.entries.keys().filter(|k| *k != "/").collect();
        assert_eq!(their_paths, our_paths, "{name}: paths");
        for p in our_paths {
            let (e, t) = (&ours.entries[p], &theirs[p.as_str()]);
            let mode = u32::from_str_radix(t["mode"].as_str().unwrap().trim_start_matches("0o"), 8)
                .unwrap();
            assert_eq!(e.mode, mode & 0o7777, "{name}: mode of {p}");
            assert_eq!(
                e.nlink,
                t["nlink"].as_u64().unwrap(),
                "{name}: nlink of {p}"
            );
            assert_eq!(e.ino, t["ino"].as_u64().unwrap(), "{name}: ino of {p}");
            if e.kind == 'f' {
                assert_eq!(e.size, t["size"].as_u64().unwrap(), "{name}: size of {p}");
                let alloc: Vec<(u64, u64, String)> = t["alloc"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| {
                        (
                            r[0].as_u64().unwrap(),
                            r[1].as_u64().unwrap(),
                            r[2].as_str().unwrap().to_string(),
                        )
                    })
                    .collect();
                let mine: Vec<(u64, u64, String)> = e
                    .alloc
                    .iter()
                    .map(|(a, b, k)| (*a, *b, k.to_string()))
                    .collect();
                assert_eq!(mine, alloc, "{name}: extent map of {p}");
            }
            assert_eq!(
                e.target.as_deref(),
                t.get("target").and_then(|x| x.as_str()),
                "{name}: target of {p}"
            );
            let xs = t
                .get("xattrs")
                .and_then(|x| x.as_object())
                .map(|o| o.len())
                .unwrap_or(0);
            assert_eq!(e.xattrs.len(), xs, "{name}: xattrs of {p}");
        }
    }
}

/// A test that panics while an image is mounted leaves no mount and no loop
/// device behind: the guard's Drop runs during unwinding.
#[test]
fn loop_mount_guard_cleans_up_after_a_panic() {
    if let Some(why) = skip_reason() {
        btrkit_tests::skip(&why);
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("guard.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let o = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mnt = work.path().join("mnt");
    let (img2, mnt2) = (img.clone(), mnt.clone());
    let r = std::thread::spawn(move || {
        let m = LoopMount::mount(&img2, &mnt2, "commit=600").unwrap();
        // Keep a file open too: the guard must still get the mount away.
        std::fs::write(m.path().join("f"), b"x").unwrap();
        panic!("deliberate panic with {} mounted", m.device().display());
    })
    .join();
    assert!(r.is_err(), "the thread was meant to panic");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(mnt.to_str().unwrap()),
        "still mounted at {}",
        mnt.display()
    );
    assert!(!btrkit_tests::mount::is_mount_point(&mnt));
    let left = btrkit_tests::mount::loop_devices_of(&img);
    assert!(left.is_empty(), "loop device left attached: {left:?}");
}

/// Print the text of the scenarios `BTRKIT_SCENARIOS` selects (random ones
/// included), to rerun or study one by hand:
/// `BTRKIT_SCENARIOS=random-clone-028 cargo test -p btrkit-tests --test replay_kernel show_scenarios -- --ignored --nocapture`
#[test]
#[ignore]
fn show_scenarios() {
    for s in scenarios() {
        println!("### {}\n{}", s.name, s.text);
    }
}
