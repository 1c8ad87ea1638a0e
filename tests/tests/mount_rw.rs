//! `btrkit-mount --rw`: ordinary programs on btrkit's engine.
//!
//! - pjdfstest (the POSIX suite in `../shared/pjdfstest`) on the kernel's
//!   btrfs and on btrkit-mount --rw, side by side: every test the kernel
//!   passes passes on btrkit (both counts printed). The suite picks
//!   expectations by filesystem type; both runs are told it is btrfs.
//! - Real programs (a tarball of thousands of files extracted, git init,
//!   add and commit, SQLite in WAL mode with synchronous=FULL, dbench,
//!   `rm -rf`) run to completion on both; after unmount the image is clean
//!   to `btrfs check`, the kernel mounts it and sees what its own run
//!   made.
//! - Crashes: a workload that reports each SQLite commit and each fsynced
//!   record as it is made, with the server killed (SIGKILL) or the plug
//!   pulled (unflushed writes undone) mid-run: the kernel's replay of the
//!   image and btrkit-replay's agree, every commit and record reported
//!   durable is there, SQLite's integrity_check passes, btrfs check clean.
//!
//! Sizes: `BTRKIT_RW_FILES` (files in the tarball, default 5,000; the
//! issue's figure is 50,000), `BTRKIT_RW_CRASHES` (crash runs of each
//! kind, default 2).

use btrkit_tests::kcrash::{self, Manifest};
use btrkit_tests::oracle::{assert_btrfs_check_clean, Progs};
use btrkit_tests::{require_fuse, require_kernel_mount, require_shared, skip_unless, LoopMount};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mkfs(img: &Path, size: &str) {
    let _ = std::fs::remove_file(img);
    let f = std::fs::File::create(img).unwrap();
    f.set_len(kcrash::parse_num(size).unwrap()).unwrap();
    let o = Command::new("mkfs.btrfs")
        .arg("-q")
        .arg("-f")
        .arg(img)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// btrkit-mount --rw in the foreground (our child), its stderr in a file.
struct RwMount {
    child: Option<Child>,
    mnt: PathBuf,
    img: PathBuf,
    log: PathBuf,
}

impl RwMount {
    fn start(img: &Path, mnt: &Path, extra: &[&str]) -> RwMount {
        std::fs::create_dir_all(mnt).unwrap();
        let log = img.with_extension("mount.log");
        let child = Command::new(btrkit_tests::bin_path("btrkit-mount"))
            .arg("--rw")
            .arg("-f")
            .arg("--allow-other")
            .args(extra)
            .arg(img)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("btrkit-mount");
        let mut m = RwMount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            img: img.to_path_buf(),
            log,
        };
        let t0 = Instant::now();
        while !btrkit_tests::mount::is_mount_point(mnt) {
            if let Some(st) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("btrkit-mount --rw exited {st}: {}", m.said());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "not mounted: {}",
                m.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmount as a user does and wait for the server to commit and exit
    /// (it holds the image locked until then).
    fn unmount(mut self) {
        let mut tries = 0;
        loop {
            let o = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output()
                .unwrap();
            if o.status.success() {
                break;
            }
            tries += 1;
            assert!(
                tries < 100,
                "fusermount3 -u: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut child = self.child.take().unwrap();
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "the server did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            st.success(),
            "btrkit-mount --rw exited {st}: {}",
            self.said()
        );
        // The lock is gone with the process: the image is free.
        let f = std::fs::File::open(&self.img).unwrap();
        f.try_lock()
            .expect("the image is still locked after the server exited");
    }

    /// Stop the server with `sig` (no unmount, no commit), then detach the
    /// dead mount.
    fn crash(mut self, sig: &str) {
        let mut child = self.child.take().unwrap();
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status();
        let _ = child.wait();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .status();
    }
}

impl Drop for RwMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// pjdfstest

/// Build pjdfstest from `../shared/pjdfstest` in `dir`; the suite's conf
/// learns to take its filesystem type from PJDFSTEST_FS.
fn build_pjdfstest(shared: &Path, dir: &Path) -> Result<PathBuf, String> {
    let src = shared.join("pjdfstest");
    let to = dir.join("pjdfstest");
    let st = Command::new("cp").arg("-r").arg(&src).arg(&to).status();
    if !st.is_ok_and(|s| s.success()) {
        return Err(format!("cannot copy {}", src.display()));
    }
    for (what, args) in [
        ("autoreconf", vec!["-ifs"]),
        ("./configure", vec![]),
        ("make", vec!["pjdfstest"]),
    ] {
        let o = Command::new(what)
            .args(&args)
            .current_dir(&to)
            .output()
            .map_err(|e| {
                format!("{what}: {e} (autoconf, automake and a C compiler build pjdfstest)")
            })?;
        if !o.status.success() {
            return Err(format!("{what}: {}", String::from_utf8_lossy(&o.stderr)));
        }
    }
    let mut conf = std::fs::OpenOptions::new()
        .append(true)
        .open(to.join("tests/conf"))
        .map_err(|e| e.to_string())?;
    writeln!(
        conf,
        "if [ -n \"${{PJDFSTEST_FS:-}}\" ]; then fs=\"$PJDFSTEST_FS\"; fi"
    )
    .map_err(|e| e.to_string())?;
    Ok(to)
}

/// Every `.t` file under `dir`, sorted.
fn test_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "t") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// What one run of the suite gave: per file, its planned count and the
/// numbers of the tests that passed (a TODO test counts as prove counts
/// it: passed).
type Results = BTreeMap<String, (usize, BTreeSet<usize>)>;

/// Run every test file in `cwd` (the mount), as prove does, one after the
/// other.
fn run_suite(suite: &Path, cwd: &Path) -> Results {
    let tests = suite.join("tests");
    let mut out = Results::new();
    for t in test_files(&tests) {
        let name = t.strip_prefix(&tests).unwrap().display().to_string();
        let o = Command::new("timeout")
            .arg("120")
            .arg("sh")
            .arg(&t)
            .current_dir(cwd)
            .env("PJDFSTEST_FS", "BTRFS")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        let mut planned = 0;
        let mut passed = BTreeSet::new();
        for line in text.lines() {
            if let Some(p) = line.strip_prefix("1..") {
                planned = p.trim().parse().unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("ok ") {
                if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                    passed.insert(n);
                }
            } else if let Some(rest) = line.strip_prefix("not ok ") {
                if rest.contains("# TODO") {
                    if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                        passed.insert(n);
                    }
                }
            }
        }
        out.insert(name, (planned, passed));
    }
    out
}

fn passed_count(r: &Results) -> usize {
    r.values().map(|(_, p)| p.len()).sum()
}

/// pjdfstest on the kernel's btrfs and on btrkit-mount --rw: every test
/// the kernel passes passes here.
#[test]
fn pjdfstest_passes_where_the_kernel_passes() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let Some(shared) = require_shared() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let suite = match build_pjdfstest(&shared, tmp.path()) {
        Ok(s) => s,
        Err(e) => {
            btrkit_tests::skip_part("pjdfstest", &e);
            return;
        }
    };
    let kimg = tmp.path().join("kernel.img");
    let oimg = tmp.path().join("ours.img");
    mkfs(&kimg, "2G");
    mkfs(&oimg, "2G");
    let kmnt = LoopMount::mount(&kimg, &tmp.path().join("k"), "").unwrap();
    let ours = RwMount::start(&oimg, &tmp.path().join("o"), &[]);
    let (k, o) = std::thread::scope(|s| {
        let kt = s.spawn(|| run_suite(&suite, kmnt.path()));
        let ot = s.spawn(|| run_suite(&suite, &ours.mnt));
        (kt.join().unwrap(), ot.join().unwrap())
    });
    kmnt.unmount().unwrap();
    ours.unmount();
    let total: usize = k.values().map(|(n, _)| *n).sum();
    eprintln!(
        "pjdfstest: {} files, {total} tests; the kernel's btrfs passes {}, btrkit-mount --rw {}",
        k.len(),
        passed_count(&k),
        passed_count(&o)
    );
    let mut missing = Vec::new();
    for (file, (_, kp)) in &k {
        let op = o.get(file).map(|(_, p)| p.clone()).unwrap_or_default();
        let lost: Vec<&usize> = kp.difference(&op).collect();
        if !lost.is_empty() {
            missing.push(format!("{file}: {lost:?}"));
        }
    }
    assert!(
        missing.is_empty(),
        "tests the kernel passes and btrkit-mount --rw does not:\n{}",
        missing.join("\n")
    );
    assert!(
        passed_count(&k) > 8000,
        "the kernel's run passed too few: {}",
        passed_count(&k)
    );
    assert_btrfs_check_clean(&[&oimg], Progs::Distro, "after pjdfstest");
}

// ---------------------------------------------------------------------------
// Programs

/// A tree like a small source checkout: nested directories, text and
/// binary files of spread sizes, symlinks and hard links.
fn make_tree(root: &Path, files: usize) {
    let mut rng = kcrash::Prng::new(0x5eed_f11e_7a11);
    std::fs::create_dir_all(root).unwrap();
    let mut dirs = vec![root.to_path_buf()];
    for i in 0..files {
        if i % 40 == 0 {
            let parent = dirs[rng.below(dirs.len() as u64) as usize].clone();
            let d = parent.join(format!("dir{i}"));
            std::fs::create_dir_all(&d).unwrap();
            dirs.push(d);
        }
        let d = &dirs[rng.below(dirs.len() as u64) as usize];
        let p = d.join(format!("f{i}.{}", ["c", "h", "txt", "bin", "o"][i % 5]));
        let size = match rng.below(100) {
            0..=59 => rng.below(2048),
            60..=94 => rng.below(64 << 10),
            _ => rng.below(2 << 20),
        } as usize;
        let data: Vec<u8> = if i % 5 == 3 {
            (0..size).map(|_| rng.below(256) as u8).collect()
        } else {
            (0..size).map(|j| b"abcdefgh ijk\n"[(j + i) % 13]).collect()
        };
        std::fs::write(&p, data).unwrap();
        if i % 97 == 0 {
            std::os::unix::fs::symlink(p.file_name().unwrap(), d.join(format!("link{i}"))).unwrap();
        }
        if i % 131 == 0 {
            std::fs::hard_link(&p, d.join(format!("hard{i}"))).unwrap();
        }
    }
}

fn sh(cwd: &Path, script: &str) -> String {
    let o = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(cwd)
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_AUTHOR_NAME", "btrkit")
        .env("GIT_AUTHOR_EMAIL", "btrkit@example.org")
        .env("GIT_COMMITTER_NAME", "btrkit")
        .env("GIT_COMMITTER_EMAIL", "btrkit@example.org")
        .env("HOME", cwd)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const SQLITE_WORK: &str = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("pragma journal_mode=wal")
db.execute("pragma synchronous=full")
db.execute("create table t (id integer primary key, v text)")
for i in range(int(sys.argv[2])):
    db.execute("begin")
    for j in range(20):
        db.execute("insert into t (v) values (?)", ("row %d %d " % (i, j) * 8,))
    if i % 7 == 3:
        db.execute("delete from t where id % 5 = ?", (i % 5,))
    db.execute("commit")
print(db.execute("pragma integrity_check").fetchone()[0])
print(db.execute("select count(*), sum(length(v)) from t").fetchone())
db.close()
"#;

/// The same programs on `dir` (a mount); what they printed.
fn run_programs(dir: &Path, tarball: &Path, git: bool) -> String {
    let mut said = String::new();
    said += &sh(
        dir,
        &format!("mkdir x && tar -xf {} -C x", tarball.display()),
    );
    if git {
        said += &sh(
            &dir.join("x"),
            "git init -q . && git config gc.auto 0 && git add -A && git commit -q -m import && git rev-parse HEAD && git fsck --no-progress 2>&1 && rm -f .git/index",
        );
    }
    std::fs::write(dir.join("work.py"), SQLITE_WORK).unwrap();
    said += &sh(dir, "python3 work.py db.sqlite 200");
    said += &sh(
        dir,
        "mkdir -p dbench && dbench -t 5 -D dbench 2 >/dev/null 2>&1; rm -rf dbench",
    );
    // fio: random writes with an fsync every 8, then a verifying read.
    said += &sh(
        dir,
        "fio --name=w --directory=. --rw=randwrite --bs=4k --size=16M --fsync=8 \
             --randrepeat=1 --verify=crc32c --do_verify=1 --output=/dev/null && ls -l w.0.0 | awk '{print $5}'",
    );
    // Half the tree goes again.
    said += &sh(
        dir,
        "for d in x/dir*; do case $d in *0) rm -rf $d;; esac; done; ls x | wc -l",
    );
    said
}

/// Real programs run to completion on btrkit-mount --rw, as on the
/// kernel: the same output, and after unmount the same files.
#[test]
fn programs_run_as_on_the_kernel() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let git = Command::new("git").arg("--version").output().is_ok();
    if !git {
        btrkit_tests::skip_part("git", "git is not installed");
    }
    let tmp = tempfile::tempdir().unwrap();
    let files = env_num("BTRKIT_RW_FILES", 5000);
    let src = tmp.path().join("src");
    make_tree(&src, files);
    let tarball = tmp.path().join("src.tar");
    sh(
        tmp.path(),
        &format!("tar -cf {} -C src .", tarball.display()),
    );
    let kimg = tmp.path().join("kernel.img");
    let oimg = tmp.path().join("ours.img");
    // The tree averages about 64 KiB a file; git's objects come on top.
    let size = format!("{}", (files as u64 * (192 << 10)).max(4 << 30));
    mkfs(&kimg, &size);
    mkfs(&oimg, &size);
    let kmnt = LoopMount::mount(&kimg, &tmp.path().join("k"), "").unwrap();
    let ours = RwMount::start(&oimg, &tmp.path().join("o"), &[]);
    let said_k = run_programs(kmnt.path(), &tarball, git);
    let said_o = run_programs(&ours.mnt, &tarball, git);
    assert_eq!(
        said_o, said_k,
        "the programs printed otherwise on btrkit-mount --rw"
    );
    assert!(said_o.contains("ok\n"), "{said_o}");
    kmnt.unmount().unwrap();
    ours.unmount();
    assert_btrfs_check_clean(&[&oimg], Progs::Distro, "after the programs");
    assert_btrfs_check_clean(
        &[&oimg],
        Progs::New,
        "after the programs (btrfs check 6.14)",
    );
    // What the kernel sees on our image is what its own run made
    // (inode numbers, extent layout and the SQLite file's bytes aside).
    let strip = |m: Manifest| -> Manifest {
        let mut m = m;
        // fio's file holds its random data and verify headers as written
        // by this run (timestamps among them).
        m.entries
            .retain(|p, _| !p.starts_with("/db.sqlite") && p != "/w.0.0");
        m
    };
    let mk = strip(kcrash::manifest_in_place(&kimg, "ro").unwrap());
    let mo = strip(kcrash::manifest_in_place(&oimg, "ro").unwrap());
    let d = mk.diff_ignoring(&mo, &["ino", "alloc"]);
    assert!(
        d.is_empty(),
        "the kernel sees another tree on btrkit's image:\n{}",
        d.join("\n")
    );
    // And the kernel goes on writing on it.
    let m = LoopMount::mount(&oimg, &tmp.path().join("k2"), "").unwrap();
    sh(m.path(), "python3 work.py db2.sqlite 20 && rm -rf x");
    m.unmount().unwrap();
    assert_btrfs_check_clean(&[&oimg], Progs::Distro, "after the kernel wrote on it");
}

// ---------------------------------------------------------------------------
// Crashes

/// Reports each SQLite commit (`c N`: rows 1..=N are committed) and each
/// fsynced record of a plain file (`r N`) on stdout as it is made, until
/// the filesystem goes away.
const CRASH_WORK: &str = r#"
import os, sqlite3, sys
d = sys.argv[1]
db = sqlite3.connect(os.path.join(d, "db.sqlite"), isolation_level=None)
db.execute("pragma journal_mode=wal")
db.execute("pragma synchronous=full")
db.execute("create table if not exists t (id integer primary key, v text)")
fd = os.open(os.path.join(d, "records"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
n = 0
try:
    while True:
        n += 1
        db.execute("begin")
        db.execute("insert into t (id, v) values (?, ?)", (n, "v%d" % n * 50))
        db.execute("commit")
        print("c", n, flush=True)
        os.write(fd, b"record %08d\n" % n)
        if n % 3 == 0:
            os.fdatasync(fd)
        else:
            os.fsync(fd)
        print("r", n, flush=True)
        if n % 10 == 0:
            f = os.path.join(d, "f%d" % n)
            with open(f, "wb") as x:
                x.write(os.urandom(5000))
                x.flush()
                os.fsync(x.fileno())
            print("f", n, flush=True)
except Exception as e:
    print("stopped", e, flush=True)
"#;

/// What the workload promised: the last commit, record and file reported.
fn promised(out: &str) -> (u64, u64, u64) {
    let mut p = (0, 0, 0);
    for line in out.lines() {
        let mut w = line.split_whitespace();
        let (Some(k), Some(n)) = (w.next(), w.next().and_then(|n| n.parse::<u64>().ok())) else {
            continue;
        };
        match k {
            "c" => p.0 = n,
            "r" => p.1 = n,
            "f" => p.2 = n,
            _ => {}
        }
    }
    p
}

/// Check a replayed filesystem mounted at `dir` against the promises.
/// SQLite reads copies of the database files (opening them in place
/// would checkpoint the WAL into the image).
fn check_promises(dir: &Path, p: (u64, u64, u64), what: &str) {
    let scratch = tempfile::tempdir().unwrap();
    for f in ["db.sqlite", "db.sqlite-wal", "db.sqlite-shm"] {
        if dir.join(f).exists() {
            std::fs::copy(dir.join(f), scratch.path().join(f)).unwrap();
        }
    }
    let dir_db = scratch.path();
    let o = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; db=sqlite3.connect(sys.argv[1]); \
             print(db.execute('pragma integrity_check').fetchone()[0]); \
             print(db.execute('select coalesce(max(id),0), count(*) from t').fetchone())",
        )
        .arg(dir_db.join("db.sqlite"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("ok"),
        "{what}: integrity_check: {out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let nums: Vec<u64> = lines
        .next()
        .unwrap_or_default()
        .trim_matches(|c| c == '(' || c == ')')
        .split(", ")
        .filter_map(|x| x.parse().ok())
        .collect();
    assert_eq!(nums.len(), 2, "{what}: {out}");
    assert!(
        nums[0] >= p.0,
        "{what}: SQLite reported commit {} and the replay has {}",
        p.0,
        nums[0]
    );
    assert_eq!(nums[0], nums[1], "{what}: rows missing below the last");
    let recs = std::fs::read_to_string(dir.join("records")).unwrap_or_default();
    let have = recs.lines().count() as u64;
    assert!(
        have >= p.1,
        "{what}: record {} was fsynced and the replay has {have}",
        p.1
    );
    for (i, l) in recs.lines().enumerate() {
        assert_eq!(
            l,
            format!("record {:08}", i + 1),
            "{what}: record {} damaged",
            i + 1
        );
    }
    let mut f = 10;
    while f <= p.2 {
        let m = std::fs::metadata(dir.join(format!("f{f}")));
        assert!(
            m.is_ok_and(|m| m.len() == 5000),
            "{what}: f{f} was fsynced and is not whole"
        );
        f += 10;
    }
}

/// One crash run: the workload on a fresh image, the server stopped with
/// `sig` after `after`, then both replays.
fn crash_once(tmp: &Path, sig: &str, after: Duration, round: usize) {
    let img = tmp.join(format!("crash-{sig}-{round}.img"));
    mkfs(&img, "1G");
    let extra: &[&str] = if sig == "USR1" {
        &["--volatile-cache", "-o", "commit=2"]
    } else {
        &["-o", "commit=2"]
    };
    let m = RwMount::start(&img, &tmp.join(format!("m-{sig}-{round}")), extra);
    let mut work = Command::new("python3")
        .arg("-c")
        .arg(CRASH_WORK)
        .arg(&m.mnt)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    m.crash(sig);
    let out = {
        use std::io::Read;
        let mut s = String::new();
        let _ = work.stdout.take().unwrap().read_to_string(&mut s);
        let _ = work.wait();
        s
    };
    let p = promised(&out);
    assert!(
        p.0 > 0,
        "the workload made no commit before the crash: {out}"
    );
    let what = format!("signal {sig}, round {round}, promised {p:?}");
    // The kernel's replay.
    let kcopy = tmp.join("kcopy.img");
    kcrash::copy_sparse(&img, &kcopy).unwrap();
    let km = LoopMount::mount(&kcopy, &tmp.join("kr"), "").unwrap();
    check_promises(km.path(), p, &format!("{what}, kernel replay"));
    km.unmount().unwrap();
    let kman = kcrash::manifest_in_place(&kcopy, "ro").unwrap();
    assert_btrfs_check_clean(&[&kcopy], Progs::Distro, &format!("{what}, kernel replay"));
    // btrkit-replay's.
    let bout = tmp.join("breplayed.img");
    let o = Command::new(btrkit_tests::bin_path("btrkit-replay"))
        .arg(&img)
        .arg("-o")
        .arg(&bout)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{what}: btrkit-replay: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_btrfs_check_clean(&[&bout], Progs::Distro, &format!("{what}, btrkit-replay"));
    let bm = LoopMount::mount(&bout, &tmp.join("br"), "ro").unwrap();
    check_promises(bm.path(), p, &format!("{what}, btrkit-replay"));
    bm.unmount().unwrap();
    let bman = kcrash::manifest_in_place(&bout, "ro").unwrap();
    assert!(
        kman == bman,
        "{what}: btrkit-replay and the kernel's replay differ:\n{}",
        kman.short_diff(&bman, 12)
    );
    for f in [&img, &kcopy, &bout] {
        let _ = std::fs::remove_file(f);
    }
}

/// Programs killed mid-run, the server by SIGKILL and by pulling the
/// plug: both replays keep every promise and agree.
#[test]
fn crash_replays_keep_every_promise() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let tmp = tempfile::tempdir().unwrap();
    let rounds = env_num("BTRKIT_RW_CRASHES", 2);
    for round in 0..rounds {
        let after = Duration::from_millis(1500 + 1300 * round as u64);
        crash_once(tmp.path(), "KILL", after, round);
        crash_once(tmp.path(), "USR1", after, round);
    }
}

/// Refusals in one line: an image a mount uses, a second read-write
/// mount of the same image, a read-only image file, mount options without
/// --rw.
#[test]
fn refusals() {
    skip_unless!(require_fuse(), btrkit_tests::require_loop());
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("a.img");
    mkfs(&img, "512M");
    let m = RwMount::start(&img, &tmp.path().join("m"), &[]);
    let run = |args: &[&str], mnt: &str| {
        let dir = tmp.path().join(mnt);
        std::fs::create_dir_all(&dir).unwrap();
        Command::new(btrkit_tests::bin_path("btrkit-mount"))
            .args(args)
            .arg(&img)
            .arg(&dir)
            .output()
            .unwrap()
    };
    let o = run(&["--rw"], "m2");
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("in use") && e.lines().count() == 1, "{e}");
    // Offline btrkit writers refuse it too.
    let o = Command::new(btrkit_tests::bin_path("btrkit"))
        .args(["filesystem", "label"])
        .arg(&img)
        .arg("x")
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "btrkit filesystem label wrote a served image"
    );
    m.unmount();
    let o = run(&["-o", "commit=5"], "m3");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("need a read-write mount"));
    // A read-only device.
    let o = Command::new("losetup")
        .args(["-r", "-f", "--show"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "losetup -r: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let dir = tmp.path().join("m4");
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(btrkit_tests::bin_path("btrkit-mount"))
        .args(["--rw", &dev])
        .arg(&dir)
        .output()
        .unwrap();
    if o.status.success() {
        let _ = Command::new("fusermount3").arg("-u").arg(&dir).status();
    }
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("for writing") && e.lines().count() == 1, "{e}");
    // A compat_ro feature the engine does not know: the kernel would
    // mount it read-only only; refused before anything is written.
    let dev = btrkit_core::io::FileDevice::open(&img, true).unwrap();
    for mirror in 0..2 {
        btrkit_tests::repair_support::patch_superblock(&dev, mirror, false, &|b| {
            let v = u64::from_le_bytes(b[180..188].try_into().unwrap()) | 1 << 40;
            b[180..188].copy_from_slice(&v.to_le_bytes());
        });
    }
    drop(dev);
    let before = std::fs::read(&img).unwrap();
    let o = run(&["--rw"], "m5");
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("compat_ro") && e.lines().count() == 1, "{e}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused image was written"
    );
}

/// A two-device raid1 set mounted read-write (`--device`), written, and
/// mounted by the kernel afterwards with both devices and with one.
#[test]
fn device_sets_read_write() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.img");
    let b = tmp.path().join("b.img");
    for p in [&a, &b] {
        std::fs::File::create(p).unwrap().set_len(1 << 30).unwrap();
    }
    let o = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-m", "raid1", "-d", "raid1"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let b_arg = b.display().to_string();
    let m = RwMount::start(&a, &tmp.path().join("m"), &["--device", &b_arg]);
    make_tree(&m.mnt.join("t"), 300);
    sh(&m.mnt, "python3 -c 'import os; fd=os.open(\"f\", os.O_CREAT|os.O_WRONLY); os.write(fd, b\"x\"*100000); os.fsync(fd)'");
    m.unmount();
    let mut want = Manifest::default();
    let src = tmp.path().join("src");
    make_tree(&src.join("t"), 300);
    sh(&src, "python3 -c 'import os; fd=os.open(\"f\", os.O_CREAT|os.O_WRONLY); os.write(fd, b\"x\"*100000); os.fsync(fd)'");
    want.entries = kcrash::manifest_of_tree(&src).unwrap().entries;
    let bdev = btrkit_tests::mount::attach_loop(&b).unwrap();
    let got = kcrash::manifest_in_place(&a, &format!("ro,device={}", bdev.display()));
    btrkit_tests::mount::detach_loop(&bdev).unwrap();
    let got = got.unwrap();
    // Directory sizes and link counts are the host filesystem's in `want`;
    // contents (hashes), types, modes and owners are compared.
    let d = want.diff_ignoring(&got, &["ino", "alloc", "nlink", "size"]);
    let d: Vec<String> = d
        .into_iter()
        .filter(|l| !l.starts_with("differs /:"))
        .collect();
    assert!(
        d.is_empty(),
        "the kernel sees another tree on the set:\n{}",
        d.join("\n")
    );
    btrkit_tests::oracle::check_set_clean(&[&a, &b]).unwrap();
}

/// `script` in a fresh filesystem on the kernel's btrfs (a loop mount)
/// and on btrkit-mount --rw, one after the other: both outputs, and our
/// image (unmounted, committed) for btrfs check.
fn on_both(tmp: &Path, script: &str) -> (String, String, PathBuf) {
    let kimg = tmp.join("kernel.img");
    let oimg = tmp.join("ours.img");
    mkfs(&kimg, "512M");
    mkfs(&oimg, "512M");
    let kmnt = LoopMount::mount(&kimg, &tmp.join("k"), "").unwrap();
    let ours = RwMount::start(&oimg, &tmp.join("o"), &[]);
    let k = sh(kmnt.path(), script);
    let o = sh(&ours.mnt, script);
    kmnt.unmount().unwrap();
    ours.unmount();
    (k, o, oimg)
}

/// POSIX ACLs: set, inherited through default ACLs, rewritten by chmod,
/// and enforced for another user: the same as on the kernel's btrfs.
#[test]
fn acls_as_on_the_kernel() {
    skip_unless!(require_kernel_mount(), require_fuse());
    if Command::new("setfacl").arg("--version").output().is_err() {
        btrkit_tests::skip_part("ACLs", "setfacl is not installed (package acl)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = "umask 022
mkdir d
setfacl -d -m u:1000:rwx,g:50:rx d
setfacl -m u:1000:rx d
touch d/f; mkdir d/sub; mknod d/p p
echo secret > s; chmod 600 s; setfacl -m u:1000:r s
setpriv --reuid 1000 --regid 1000 --clear-groups cat s || echo denied
chmod 640 s
setfacl -x u:1000 s
setpriv --reuid 1000 --regid 1000 --clear-groups cat s 2>/dev/null || echo denied
setfacl -m u::rwx,g::r,o::- s
setfacl -b d/f
setpriv --reuid 1000 --regid 1000 --clear-groups touch d/sub/new || echo denied
getfacl -n -R d s | grep -v '^# owner\\|^# group'
stat -c '%n %a %U %G' d d/f d/sub d/p s d/sub/new 2>&1 | sort";
    let (k, o, oimg) = on_both(tmp.path(), script);
    assert!(
        k.contains("secret") && k.contains("default:user:1000:rwx"),
        "{k}"
    );
    assert_eq!(o, k, "ACLs on btrkit-mount --rw differ from the kernel's");
    assert_btrfs_check_clean(&[&oimg], Progs::Distro, "after ACLs");
}

/// renameat2's flags through ctypes (no coreutils here has `mv
/// --exchange`): each call's result, then the tree.
const RENAME2: &str = r#"
import ctypes, errno, os, stat
libc = ctypes.CDLL(None, use_errno=True)
def r2(a, b, flags):
    rc = libc.renameat2(-100, a.encode(), -100, b.encode(), flags)
    e = ctypes.get_errno()
    print(a, b, flags, "ok" if rc == 0 else errno.errorcode[e])
os.umask(0o022)
for d in ["a", "b", "a/d", "a/d/e"]:
    os.mkdir(d)
for p, c in [("a/f", "one"), ("b/g", "two"), ("a/d/x", "three"), ("a/h", "four")]:
    with open(p, "w") as f:
        f.write(c)
os.link("a/f", "b/f2")
os.symlink("a/f", "sl")
os.mkfifo("b/fifo")
r2("a/f", "b/g", 2)       # files across directories
r2("a/d", "b/fifo", 2)    # a directory and a fifo
r2("a/h", "a/h", 2)       # the same name
r2("a/f", "b/f2", 2)      # another name of the same inode? (a/f is now "two")
r2("b/fifo", "b/fifo/e", 2)   # into itself: EINVAL
r2("b/fifo/e", "b/fifo", 2)   # the other way: EINVAL
r2("a/none", "b/g", 2)    # ENOENT
r2("a/h", "b/none", 2)    # ENOENT
r2("a/h", "sl", 2)        # a file and a symlink
r2("a/h", "b/g", 1)       # RENAME_NOREPLACE: EEXIST
r2("a/h", "b/new", 1)
r2("b/new", "b/g", 3)     # EXCHANGE|NOREPLACE: EINVAL
r2("b/new", "b/w", 4)     # RENAME_WHITEOUT
r2("b/w", "b/g", 8)       # unknown flag: EINVAL
for top, dirs, files in sorted(os.walk(".")):
    dirs.sort()
    for n in sorted(dirs + files):
        p = os.path.join(top, n)
        st = os.lstat(p)
        what = stat.filemode(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            what += " " + open(p).read()
        elif stat.S_ISLNK(st.st_mode):
            what += " -> " + os.readlink(p)
        elif stat.S_ISCHR(st.st_mode):
            what += " %d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
        print(p, what, st.st_nlink if not stat.S_ISDIR(st.st_mode) else "")
os.sync()
"#;

/// renameat2 with RENAME_EXCHANGE, RENAME_NOREPLACE and RENAME_WHITEOUT:
/// the same calls on the kernel's btrfs and on the mount give the same
/// results and the same tree; btrfs check is clean after.
#[test]
fn renameat2_as_on_the_kernel() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let tmp = tempfile::tempdir().unwrap();
    let py = tmp.path().join("rename2.py");
    std::fs::write(&py, RENAME2).unwrap();
    let script = format!("python3 {}", py.display());
    let (k, o, oimg) = on_both(tmp.path(), &script);
    assert!(
        k.contains("a/f b/g 2 ok") && k.contains("c--------- 0:0"),
        "{k}"
    );
    assert_eq!(
        o, k,
        "renameat2 on btrkit-mount --rw differs from the kernel's"
    );
    assert_btrfs_check_clean(&[&oimg], Progs::Distro, "after renameat2");
}

/// `btrkit filesystem sync` (BTRFS_IOC_SYNC through FUSE) commits: a
/// file written before it survives the server's SIGKILL, one written
/// after it (no fsync, well inside the 30 s commit interval) does not.
/// The same command on the kernel's btrfs works too; elsewhere it fails.
#[test]
fn sync_ioctl_commits() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("ours.img");
    mkfs(&img, "512M");
    let ours = RwMount::start(&img, &tmp.path().join("o"), &[]);
    std::fs::write(ours.mnt.join("before"), b"committed").unwrap();
    let btrkit = btrkit_tests::bin_path("btrkit");
    let st = Command::new(&btrkit)
        .args(["filesystem", "sync"])
        .arg(&ours.mnt)
        .status()
        .unwrap();
    assert!(st.success(), "btrkit filesystem sync on the mount");
    std::fs::write(ours.mnt.join("after"), b"not committed").unwrap();
    ours.crash("KILL");
    let kmnt = LoopMount::mount(&img, &tmp.path().join("k"), "").unwrap();
    assert_eq!(
        std::fs::read(kmnt.path().join("before")).unwrap(),
        b"committed"
    );
    assert!(
        !kmnt.path().join("after").exists(),
        "written after the sync"
    );
    let st = Command::new(&btrkit)
        .args(["filesystem", "sync"])
        .arg(kmnt.path())
        .status()
        .unwrap();
    assert!(st.success(), "btrkit filesystem sync on the kernel's btrfs");
    kmnt.unmount().unwrap();
    let o = Command::new(&btrkit)
        .args(["filesystem", "sync"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    assert_btrfs_check_clean(&[&img], Progs::Distro, "after sync and a crash");
}

/// Puts /dev/fuse's mode back when dropped.
struct DevFuseMode(Option<u32>);

impl Drop for DevFuseMode {
    fn drop(&mut self) {
        if let Some(m) = self.0 {
            let mut p = std::fs::metadata("/dev/fuse").unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut p, m);
            let _ = std::fs::set_permissions("/dev/fuse", p);
        }
    }
}

/// Unprivileged use: a user mounts an image of their own read-write
/// through fusermount3, writes and fsyncs, unmounts; the kernel sees the
/// files, owned by that user. Distributions give /dev/fuse mode 0666; where
/// it is not (this machine: 0600) the test opens it for its run and puts
/// the mode back.
#[test]
fn unprivileged_through_fusermount3() {
    skip_unless!(require_kernel_mount(), require_fuse());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o777;
    let _restore = if mode & 0o006 != 0o006 {
        let mut p = std::fs::metadata("/dev/fuse").unwrap().permissions();
        p.set_mode(0o666);
        std::fs::set_permissions("/dev/fuse", p).unwrap();
        DevFuseMode(Some(mode))
    } else {
        DevFuseMode(None)
    };
    let tmp = tempfile::Builder::new()
        .prefix("btrkit-unpriv-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut p = std::fs::metadata(tmp.path()).unwrap().permissions();
    p.set_mode(0o755);
    std::fs::set_permissions(tmp.path(), p).unwrap();
    let img = tmp.path().join("u.img");
    mkfs(&img, "512M");
    // The filesystem's root belongs to the user, as a user's image would.
    let k = LoopMount::mount(&img, &tmp.path().join("k"), "").unwrap();
    sh(
        tmp.path(),
        &format!("chown 1000:1000 {}", k.path().display()),
    );
    k.unmount().unwrap();
    let mnt = tmp.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    sh(
        tmp.path(),
        &format!(
            "chown 1000:1000 {} {} {}",
            img.display(),
            mnt.display(),
            tmp.path().display()
        ),
    );
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid", "1000", "--regid", "1000", "--clear-groups"])
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let bin = btrkit_tests::bin_path("btrkit-mount");
    let o = as_user(&[bin.to_str().unwrap(), "--rw", "u.img", "m"]);
    assert!(
        o.status.success(),
        "unprivileged mount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = as_user(&[
        "sh",
        "-ec",
        "cd m; mkdir d; echo hello > d/f; python3 -c 'import os; fd=os.open(\"d/f\", os.O_RDWR); os.fsync(fd)'; ln d/f g; stat -c '%n %u %g %h' d d/f g",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "d 1000 1000 1\nd/f 1000 1000 2\ng 1000 1000 2\n"
    );
    let o = as_user(&["fusermount3", "-u", "m"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The server commits, then lets the image go.
    let t0 = Instant::now();
    loop {
        let f = std::fs::File::open(&img).unwrap();
        if f.try_lock().is_ok() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the server did not let the image go"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_btrfs_check_clean(&[&img], Progs::Distro, "after an unprivileged mount");
    let k = LoopMount::mount(&img, &tmp.path().join("k2"), "ro").unwrap();
    let out = sh(k.path(), "cat d/f; stat -c '%n %u %g %h' d d/f g");
    k.unmount().unwrap();
    assert_eq!(
        out,
        "hello\nd 1000 1000 1\nd/f 1000 1000 2\ng 1000 1000 2\n"
    );
}
