//! `btrkit-fsck --repair` against `btrfs check --repair` (btrfs-progs
//! 6.14) on damage made fresh: for every recipe class of
//! `btrkit_tests::corrupt::recipes` (one per class of btrfs-progs'
//! fsck-tests), N cases (`BTRKIT_GEN_CASES`, default 4), each a fresh
//! base image (`corrupt::base`, made by mkfs.btrfs 6.2 and filled by the
//! kernel at the start of the run) damaged by the recipe with its own
//! seed. Each damaged image is copied twice; one copy is repaired by
//! `btrkit-fsck --repair --yes`, the other by `btrfs check --repair
//! --force` 6.14; each is then judged.
//!
//! - **detected**: btrfs check 6.2 or 6.14 (`--readonly`, original mode)
//!   exits non-zero on the damaged image or prints an error line (the
//!   original mode prints some damage, out-of-order inline refs or a dev
//!   extent without a chunk, without failing). Undetected cases are not
//!   counted (the table says how many there were).
//! - **clean** after a repair: btrfs check 6.2 and 6.14 both exit 0 and
//!   print no error line.
//! - **worse** after a repair, against the damaged image: the kernel
//!   mounted it (`ro,rescue=nologreplay`) before and refuses it after; a
//!   file that read before (through that mount) reads differently or not
//!   at all after (a file moved, to lost+found or back to its name, counts
//!   as read when its contents are found under another path); btrfs check
//!   6.14 ran to its end before and does not after; or it prints more
//!   error lines after than before.
//! - **died**: the repair panicked, died by a signal or ran past
//!   `REPAIR_LIMIT` and was killed (the image is judged as it was left).
//!
//! An "error line" is any line of btrfs check's output but the progress
//! and summary lines (`[1/7] ...`, `Opening filesystem...`, `found N bytes
//! used...`, the totals). A base image must have none.
//!
//! Per class the test asserts: btrkit clean >= btrfs check clean,
//! btrkit worse == 0, and no btrkit-fsck repair died. Failures name each
//! case (class, base, seed, target) with what btrkit-fsck left (refused,
//! not repairable, findings after) and what btrfs check 6.14 still says.
//! A case the recipe finds no target for in its base is not counted
//! either ("no target").
//!
//! Environment: `BTRKIT_GEN_CASES` (cases per class), `BTRKIT_GEN_SEED`
//! (the run's seed, default 1), `BTRKIT_GEN_CLASSES` (comma list of class
//! prefixes, e.g. `016,045`), `BTRKIT_GEN_JOBS` (cases at once, default
//! 2), `BTRKIT_GEN_TABLE` (write the table there as markdown),
//! `BTRKIT_GEN_KEEP` (a directory: keep the base images and every case
//! that failed). The long run is the ignored test
//! `generated_damage_long` (20 cases per class unless
//! `BTRKIT_GEN_CASES` says otherwise).

use btrkit_core::util::prng::Prng;
use btrkit_tests::corrupt::base::{self, BaseSpec, BASES};
use btrkit_tests::corrupt::recipes::{self, RecipeError};
use btrkit_tests::fsck_support::{run_with_limit, FsckRun};
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::repair_support::lost_files;
use btrkit_tests::LoopMount;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CHECK_LIMIT: Duration = Duration::from_secs(300);
/// A repair of these small images takes a second or two; one that runs
/// this long is looping (btrfs check --repair 6.14 does on some shifted
/// leaves) and is killed, and the image judged as it is.
const REPAIR_LIMIT: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------
// Judges.

/// What one `btrfs check --readonly` said.
#[derive(Clone, Debug)]
struct Check {
    code: i32,
    /// Error lines (see the module documentation).
    errors: Vec<String>,
    /// It ran to its summary line.
    completed: bool,
}

impl Check {
    fn clean(&self) -> bool {
        self.code == 0 && self.errors.is_empty()
    }
    fn detected(&self) -> bool {
        !self.clean()
    }
}

/// Progress and summary lines of btrfs check (6.2 and 6.14).
fn informational(l: &str) -> bool {
    let t = l.trim();
    t.is_empty()
        || t.starts_with('[')
        || t.starts_with("Opening filesystem to check")
        || t.starts_with("Checking filesystem on")
        || t.starts_with("UUID:")
        || (t.starts_with("found ") && t.contains("bytes used"))
        || t.starts_with("total csum bytes")
        || t.starts_with("total tree bytes")
        || t.starts_with("total fs tree bytes")
        || t.starts_with("total extent tree bytes")
        || t.starts_with("btree space waste bytes")
        || t.starts_with("file data blocks allocated")
        || t.starts_with("referenced ")
        || t.starts_with("cache and super generation don't match")
        || t.starts_with("checking ")
        || t.starts_with("btrfs-progs v")
}

fn progs_check(progs: Progs, img: &Path) -> Check {
    let r = oracle::btrfs_check_with(&[img], progs, &[], Some(CHECK_LIMIT))
        .unwrap_or_else(|e| panic!("{e}"));
    let text = format!("{}\n{}", r.stderr, r.stdout);
    Check {
        code: r.code,
        errors: text
            .lines()
            .filter(|l| !informational(l))
            .map(|l| l.trim().to_string())
            .collect(),
        completed: text
            .lines()
            .any(|l| l.starts_with("found ") && l.contains("bytes used")),
    }
}

type Files = BTreeMap<String, Result<u64, String>>;

/// Every file under a read-only kernel mount of `img` (no log replay),
/// path -> a digest of its first 16 MiB and size, or the read error.
/// Err with the mount's error when the kernel refuses to mount it.
/// Bounded walk.
///
/// Every image of a run is a copy of one of a few bases, so many share an
/// fsid: one mount at a time, so that two copies of one filesystem are
/// never being mounted at once.
fn kernel_files(img: &Path) -> Result<Files, String> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let m = LoopMount::new(img, "ro,rescue=nologreplay")?;
    let mut out = BTreeMap::new();
    let mut stack = vec![(m.path().to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                let rel = dir.strip_prefix(m.path()).unwrap_or(&dir);
                out.insert(format!("{}/", rel.display()), Err(e.to_string()));
                continue;
            }
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > 200_000 {
                return Ok(out);
            }
            let p = e.path();
            let rel = p.strip_prefix(m.path()).unwrap_or(&p).display().to_string();
            let Ok(ft) = e.file_type() else {
                out.insert(rel, Err("file type unreadable".into()));
                continue;
            };
            if ft.is_dir() {
                if depth < 64 {
                    stack.push((p, depth + 1));
                }
            } else if ft.is_file() {
                let r = std::fs::File::open(&p)
                    .and_then(|f| {
                        use std::io::Read;
                        let len = f.metadata()?.len();
                        let mut d = Vec::new();
                        f.take(16 << 20).read_to_end(&mut d)?;
                        Ok(d.iter().fold(0xcbf29ce484222325u64, |h, &b| {
                            (h ^ b as u64).wrapping_mul(0x100000001b3)
                        }) ^ len)
                    })
                    .map_err(|e| e.to_string());
                out.insert(rel, r);
            }
        }
    }
    Ok(out)
}

/// One image judged.
#[derive(Clone, Debug)]
struct Judged {
    c62: Check,
    c614: Check,
    files: Result<Files, String>,
}

fn judge(img: &Path) -> Judged {
    Judged {
        c62: progs_check(Progs::Distro, img),
        c614: progs_check(Progs::New, img),
        files: kernel_files(img),
    }
}

impl Judged {
    fn clean(&self) -> bool {
        self.c62.clean() && self.c614.clean()
    }
    /// Why `self` (after a repair) is worse than `before`, if it is.
    fn worse_than(&self, before: &Judged) -> Vec<String> {
        let mut why = Vec::new();
        match (&before.files, &self.files) {
            (Ok(_), Err(e)) => why.push(format!(
                "the kernel mounted it before and refuses it after: {e}"
            )),
            (Ok(b), Ok(a)) => {
                let lost = lost_files(b, a);
                if !lost.is_empty() {
                    why.push(format!(
                        "{} files read before and not the same after: {}",
                        lost.len(),
                        lost.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            _ => {}
        }
        let (b, a) = (&before.c614, &self.c614);
        if b.completed && !a.completed {
            why.push(format!(
                "btrfs check 6.14 ran to its end before and not after (exit {}): {}",
                a.code,
                a.errors
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" / ")
            ));
        } else if b.completed && a.errors.len() > b.errors.len() {
            why.push(format!(
                "btrfs check 6.14: {} error lines after, {} before: {}",
                a.errors.len(),
                b.errors.len(),
                a.errors
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" / ")
            ));
        }
        why
    }
}

// ---------------------------------------------------------------------------
// Cases.

#[derive(Debug)]
enum Outcome {
    /// The base has nothing the recipe can damage.
    NoTarget(String),
    /// The recipe failed (a generator bug).
    RecipeFailed(String),
    /// The harness could not run the case (a copy failed: no space).
    Harness(String),
    /// btrfs check does not see the damage.
    Undetected,
    Counted {
        btrkit_clean: bool,
        progs_clean: bool,
        btrkit_worse: Vec<String>,
        progs_worse: Vec<String>,
        /// How the repair died, if it did.
        btrkit_died: Option<String>,
        progs_died: Option<String>,
        /// What btrkit-fsck did and left, for the report.
        btrkit_note: String,
        /// Files the kernel read on the damaged image (None: it refused
        /// to mount it).
        files_before: Option<usize>,
        /// What btrfs check 6.14 says after each repair.
        btrkit_left: Vec<String>,
        progs_left: Vec<String>,
    },
}

struct CaseResult {
    class: String,
    base: &'static str,
    seed: u64,
    target: String,
    outcome: Outcome,
    secs: f64,
}

fn cp(from: &Path, to: &Path) -> Result<(), String> {
    let o = Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .output()
        .map_err(|e| format!("cp: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cp {} {}: {}",
            from.display(),
            to.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

fn summarize_btrkit(r: &FsckRun) -> String {
    let v = r.json();
    let mut s = format!("btrkit-fsck exit {}", r.code);
    if r.stderr.contains("panicked") {
        s.push_str(&format!(
            "; PANIC: {}",
            r.stderr
                .lines()
                .find(|l| l.contains("panicked"))
                .unwrap_or("")
        ));
    } else if v.is_null() {
        s.push_str(&format!(
            "; {}",
            r.stderr.trim().lines().last().unwrap_or("")
        ));
    }
    if let Some(a) = v["refused"].as_array().filter(|a| !a.is_empty()) {
        s.push_str(&format!(
            "; refused: {}",
            serde_json::Value::Array(a.clone())
        ));
    } else if !v["refused"].is_null() && !v["refused"].is_array() {
        s.push_str(&format!("; refused: {}", v["refused"]));
    }
    if let Some(a) = v["not_repairable"].as_array().filter(|a| !a.is_empty()) {
        let items: Vec<String> = a
            .iter()
            .take(4)
            .map(|u| {
                format!(
                    "{}: {} ({})",
                    u["finding"]["category"].as_str().unwrap_or("?"),
                    u["finding"]["message"].as_str().unwrap_or("?"),
                    u["reason"].as_str().unwrap_or("?")
                )
            })
            .collect();
        s.push_str(&format!("; not repairable: {}", items.join(" | ")));
    }
    if let Some(a) = v["findings_after"].as_array() {
        let errs: Vec<String> = a
            .iter()
            .filter(|f| f["severity"] == "error")
            .take(4)
            .map(|f| {
                format!(
                    "{}: {}",
                    f["category"].as_str().unwrap_or("?"),
                    f["message"].as_str().unwrap_or("?")
                )
            })
            .collect();
        if !errs.is_empty() {
            s.push_str(&format!("; left after: {}", errs.join(" | ")));
        }
    }
    s
}

struct Run {
    bases: Vec<(BaseSpec, PathBuf)>,
    progs_new: PathBuf,
    work: PathBuf,
    keep: Option<PathBuf>,
}

fn run_case(run: &Run, class: &str, base_i: usize, seed: u64) -> CaseResult {
    let t0 = Instant::now();
    let mut res = CaseResult {
        class: class.to_string(),
        base: run.bases[base_i].0.name,
        seed,
        target: String::new(),
        outcome: Outcome::Undetected,
        secs: 0.0,
    };
    if let Err(e) = case(run, class, base_i, seed, &mut res) {
        res.outcome = Outcome::Harness(e);
    }
    res.secs = t0.elapsed().as_secs_f64();
    res
}

fn case(
    run: &Run,
    class: &str,
    base_i: usize,
    seed: u64,
    res: &mut CaseResult,
) -> Result<(), String> {
    let (spec, base_img) = &run.bases[base_i];
    let dir = tempfile::Builder::new()
        .prefix("gen-")
        .tempdir_in(&run.work)
        .map_err(|e| format!("case directory: {e}"))?;
    let dmg = dir.path().join("damaged.img");
    cp(base_img, &dmg)?;
    match recipes::apply(&dmg, class, seed) {
        Ok(a) => res.target = a.target,
        Err(RecipeError::NoTarget(s)) => {
            res.outcome = Outcome::NoTarget(s);
            return Ok(());
        }
        Err(RecipeError::Failed(s)) => {
            res.outcome = Outcome::RecipeFailed(s);
            return Ok(());
        }
    }
    let before = judge(&dmg);
    if !before.c62.detected() && !before.c614.detected() {
        return Ok(());
    }
    let a = dir.path().join("btrkit.img");
    let b = dir.path().join("progs.img");
    cp(&dmg, &a)?;
    cp(&dmg, &b)?;
    let mut c = Command::new(btrkit_tests::bin_path("btrkit-fsck"));
    c.args(["--json", "--repair", "--yes"]).arg(&a);
    let br = run_with_limit(c, REPAIR_LIMIT);
    let mut c = Command::new(run.progs_new.join("btrfs"));
    c.args(["check", "--repair", "--force"]).arg(&b);
    let pr = run_with_limit(c, REPAIR_LIMIT);
    let mut progs_left: Vec<String> = Vec::new();
    if pr.code == -2 {
        progs_left.push(format!(
            "(btrfs check --repair killed after {REPAIR_LIMIT:?})"
        ));
    }
    let ja = judge(&a);
    let jb = judge(&b);
    let died = |r: &FsckRun| match r.code {
        -2 => Some(format!("killed past {REPAIR_LIMIT:?}")),
        c if c < 0 => Some(format!(
            "died by a signal: {}",
            r.stderr
                .lines()
                .find(|l| l.contains("assert") || l.contains("BUG") || l.contains("failed"))
                .or_else(|| r.stderr.trim().lines().last())
                .unwrap_or("")
        )),
        101 if r.stderr.contains("panicked") => Some(format!(
            "panicked: {}",
            r.stderr
                .lines()
                .find(|l| l.contains("panicked"))
                .unwrap_or("")
        )),
        _ => None,
    };
    let btrkit_worse = ja.worse_than(&before);
    let progs_worse = jb.worse_than(&before);
    let outcome = Outcome::Counted {
        btrkit_died: died(&br),
        progs_died: died(&pr),
        files_before: before.files.as_ref().ok().map(|f| f.len()),
        btrkit_clean: ja.clean(),
        progs_clean: jb.clean(),
        progs_worse,
        btrkit_note: summarize_btrkit(&br),
        btrkit_left: ja
            .c614
            .errors
            .iter()
            .chain(ja.c62.errors.iter())
            .take(4)
            .cloned()
            .collect(),
        progs_left: progs_left
            .into_iter()
            .chain(jb.c614.errors.iter().take(4).cloned())
            .collect(),
        btrkit_worse,
    };
    let bad = matches!(&outcome, Outcome::Counted { btrkit_clean, progs_clean, btrkit_worse, btrkit_died, .. }
        if !btrkit_worse.is_empty() || btrkit_died.is_some() || (!btrkit_clean && *progs_clean));
    if bad {
        if let Some(k) = &run.keep {
            let d = k.join(format!("{class}-{}-{seed}", spec.name));
            let _ = std::fs::create_dir_all(&d);
            for f in [&dmg, &a, &b] {
                let _ = Command::new("cp")
                    .arg("--sparse=always")
                    .arg(f)
                    .arg(&d)
                    .status();
            }
        }
    }
    res.outcome = outcome;
    Ok(())
}

// ---------------------------------------------------------------------------
// The table.

#[derive(Default, Clone)]
struct Row {
    cases: usize,
    undetected: usize,
    no_target: usize,
    btrkit_clean: usize,
    progs_clean: usize,
    btrkit_worse: usize,
    progs_worse: usize,
    btrkit_died: usize,
    progs_died: usize,
}

fn table(rows: &BTreeMap<String, Row>, cases_per_class: usize, seed: u64) -> String {
    let mut s = format!(
        "{cases_per_class} cases per class (run seed {seed}); \"cases\" counts those btrfs check detects\n\n\
         | class | cases | clean after btrkit | clean after btrfs check --repair 6.14 | worse after btrkit | worse after progs | repair died: btrkit / progs | undetected | no target |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    let mut tot = Row::default();
    for (class, r) in rows {
        s.push_str(&format!(
            "| {class} | {} | {} | {} | {} | {} | {} / {} | {} | {} |\n",
            r.cases,
            r.btrkit_clean,
            r.progs_clean,
            r.btrkit_worse,
            r.progs_worse,
            r.btrkit_died,
            r.progs_died,
            r.undetected,
            r.no_target
        ));
        tot.cases += r.cases;
        tot.btrkit_clean += r.btrkit_clean;
        tot.progs_clean += r.progs_clean;
        tot.btrkit_worse += r.btrkit_worse;
        tot.progs_worse += r.progs_worse;
        tot.btrkit_died += r.btrkit_died;
        tot.progs_died += r.progs_died;
        tot.undetected += r.undetected;
        tot.no_target += r.no_target;
    }
    s.push_str(&format!(
        "| **all** | {} | {} | {} | {} | {} | {} / {} | {} | {} |\n",
        tot.cases,
        tot.btrkit_clean,
        tot.progs_clean,
        tot.btrkit_worse,
        tot.progs_worse,
        tot.btrkit_died,
        tot.progs_died,
        tot.undetected,
        tot.no_target
    ));
    s
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn generated(default_cases: usize) {
    if !btrkit_tests::require_kernel_mount() {
        return;
    }
    for p in ["xfs_io", "cp"] {
        if !btrkit_tests::fixtures::have_cmd(p) {
            btrkit_tests::skip(&format!("{p} not installed"));
            return;
        }
    }
    let Some(progs_new) = btrkit_tests::progs_new_dir() else {
        return;
    };
    let cases = env_u64("BTRKIT_GEN_CASES").map_or(default_cases, |v| v as usize);
    let seed = env_u64("BTRKIT_GEN_SEED").unwrap_or(1);
    let jobs = env_u64("BTRKIT_GEN_JOBS").unwrap_or(2).max(1) as usize;
    let filter: Vec<String> = std::env::var("BTRKIT_GEN_CLASSES")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let classes: Vec<&str> = recipes::recipes()
        .iter()
        .map(|r| r.class)
        .filter(|c| filter.is_empty() || filter.iter().any(|f| c.starts_with(f.as_str())))
        .collect();
    assert!(!classes.is_empty(), "BTRKIT_GEN_CLASSES matches no class");
    let keep = std::env::var_os("BTRKIT_GEN_KEEP").map(PathBuf::from);
    let work = tempfile::Builder::new()
        .prefix("btrkit-gen-")
        .tempdir()
        .expect("tempdir");
    // Build the btrkit binary before the clock starts.
    let _ = btrkit_tests::bin_path("btrkit-fsck");

    // The bases, each checked clean by both btrfs checks.
    let t0 = Instant::now();
    let mut bases = Vec::new();
    for spec in BASES {
        let img = base::make_base(work.path(), spec)
            .unwrap_or_else(|e| panic!("base image {}: {e}", spec.name));
        for progs in [Progs::Distro, Progs::New] {
            let c = progs_check(progs, &img);
            assert!(
                c.clean(),
                "base image {} is not clean for {}: exit {} {:?}",
                spec.name,
                progs.name(),
                c.code,
                c.errors
            );
        }
        if !base::has_dead_root(&img) {
            eprintln!(
                "note: base {} holds no deleted subvolume (the cleaner's drop committed first): class 066 has no target in it",
                spec.name
            );
        }
        if let Some(k) = &keep {
            let _ = std::fs::create_dir_all(k);
            cp(&img, &k.join(format!("base-{}.img", spec.name))).unwrap_or_else(|e| panic!("{e}"));
        }
        bases.push((*spec, img));
    }
    eprintln!("{} base images in {:.0?}", bases.len(), t0.elapsed());

    let run = Run {
        bases,
        progs_new,
        work: work.path().to_path_buf(),
        keep,
    };
    let mut todo = Vec::new();
    for (ci, class) in classes.iter().enumerate() {
        for i in 0..cases {
            let s = Prng::derive(seed, (ci as u64) << 32 | i as u64);
            todo.push((class.to_string(), (ci + i) % run.bases.len(), s));
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<CaseResult>> = Mutex::new(Vec::new());
    let t1 = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..jobs {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((class, b, s)) = todo.get(i) else {
                    break;
                };
                let r = run_case(&run, class, *b, *s);
                eprintln!(
                    "[{}/{}] {} base {} seed {:#x}: {} ({:.1}s) {}",
                    i + 1,
                    todo.len(),
                    r.class,
                    r.base,
                    r.seed,
                    match &r.outcome {
                        Outcome::NoTarget(_) => "no target".to_string(),
                        Outcome::RecipeFailed(_) => "RECIPE FAILED".to_string(),
                        Outcome::Harness(e) => format!("HARNESS ERROR: {e}"),
                        Outcome::Undetected => "undetected".to_string(),
                        Outcome::Counted {
                            btrkit_clean,
                            progs_clean,
                            btrkit_worse,
                            progs_worse,
                            files_before,
                            ..
                        } => format!(
                            "{} files read before; btrkit {}{}, progs {}{}",
                            files_before
                                .map_or("kernel refused, no".to_string(), |n| n.to_string()),
                            if *btrkit_clean { "clean" } else { "not clean" },
                            if btrkit_worse.is_empty() {
                                ""
                            } else {
                                " WORSE"
                            },
                            if *progs_clean { "clean" } else { "not clean" },
                            if progs_worse.is_empty() { "" } else { " worse" },
                        ),
                    },
                    r.secs,
                    r.target
                );
                results.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by(|a, b| (&a.class, a.seed).cmp(&(&b.class, b.seed)));

    let mut rows: BTreeMap<String, Row> = classes
        .iter()
        .map(|c| (c.to_string(), Row::default()))
        .collect();
    let mut failures = Vec::new();
    for r in &results {
        let row = rows.entry(r.class.clone()).or_default();
        let id = format!(
            "{} base {} seed {:#x} ({})",
            r.class, r.base, r.seed, r.target
        );
        match &r.outcome {
            Outcome::NoTarget(why) => {
                row.no_target += 1;
                eprintln!("no target: {id}: {why}");
            }
            Outcome::RecipeFailed(why) => failures.push(format!("{id}: the recipe failed: {why}")),
            Outcome::Harness(why) => failures.push(format!("{id}: not run: {why}")),
            Outcome::Undetected => row.undetected += 1,
            Outcome::Counted {
                btrkit_clean,
                progs_clean,
                btrkit_worse,
                progs_worse,
                btrkit_note,
                btrkit_left,
                progs_left,
                btrkit_died,
                progs_died,
                ..
            } => {
                row.cases += 1;
                row.btrkit_died += btrkit_died.is_some() as usize;
                row.progs_died += progs_died.is_some() as usize;
                if let Some(d) = btrkit_died {
                    eprintln!("btrkit-fsck --repair {d}: {id}");
                }
                if let Some(d) = progs_died {
                    eprintln!("btrfs check --repair {d}: {id}");
                }
                row.btrkit_clean += *btrkit_clean as usize;
                row.progs_clean += *progs_clean as usize;
                row.btrkit_worse += !btrkit_worse.is_empty() as usize;
                row.progs_worse += !progs_worse.is_empty() as usize;
                if !btrkit_clean || !btrkit_worse.is_empty() {
                    eprintln!(
                        "btrkit not clean{}: {id}\n    {btrkit_note}\n    btrfs check after btrkit: {}\n    btrfs check 6.14 after its own repair{}: {}",
                        if btrkit_worse.is_empty() { String::new() } else { format!(" and WORSE ({})", btrkit_worse.join("; ")) },
                        btrkit_left.join(" / "),
                        if *progs_clean { " (clean)" } else { "" },
                        progs_left.join(" / "),
                    );
                }
                if !progs_worse.is_empty() {
                    eprintln!("progs worse: {id}: {}", progs_worse.join("; "));
                }
            }
        }
    }
    let t = table(&rows, cases, seed);
    eprintln!("\n{} cases in {:.0?}\n\n{t}", results.len(), t1.elapsed());
    if let Some(p) = std::env::var_os("BTRKIT_GEN_TABLE") {
        std::fs::write(&p, &t).unwrap_or_else(|e| panic!("write {p:?}: {e}"));
    }
    for (class, r) in &rows {
        if r.btrkit_clean < r.progs_clean {
            failures.push(format!(
                "{class}: btrkit-fsck repaired {} of {} cases to clean, btrfs check --repair 6.14 {}",
                r.btrkit_clean, r.cases, r.progs_clean
            ));
        }
        if r.btrkit_died > 0 {
            failures.push(format!(
                "{class}: btrkit-fsck --repair died in {} of {} cases",
                r.btrkit_died, r.cases
            ));
        }
        if r.btrkit_worse > 0 {
            failures.push(format!(
                "{class}: btrkit-fsck left {} of {} cases worse",
                r.btrkit_worse, r.cases
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The CI run: `BTRKIT_GEN_CASES` cases per class (default 4).
#[test]
fn generated_damage_repair_table() {
    generated(4);
}

/// The long run: 20 cases per class unless `BTRKIT_GEN_CASES` says.
#[test]
#[ignore]
fn generated_damage_long() {
    generated(20);
}
