//! `btrkit send` and `btrkit receive` against the kernel's send and
//! btrfs-progs' receive: streams of the kernel received into images by
//! btrkit, streams of btrkit received by the kernel, full and incremental
//! chains of a random workload (a snapshot after each step), protocol 1
//! and protocol 2 with compressed data; every received snapshot equal to
//! its source (names, types, data, holes, xattrs, modes, owners, mtimes),
//! clones shared and compressed extents kept compressed, `btrfs check`
//! clean; `--dump` as btrfs-progs 6.14 prints it; truncated, damaged and
//! hostile streams an error, never a panic, the image clean after.

use btrkit_core::util::prng::Prng;
use btrkit_tests::kcrash::manifest_of_tree;
use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, env, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;

const STEPS: usize = 10;

fn mkfs(img: &Path, size: u64) {
    std::fs::File::create(img).unwrap().set_len(size).unwrap();
    must_run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(img));
}

fn sh(dir: &Path, script: &str) {
    must_run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
}

/// One step of a random workload in `root`: files written, extended,
/// overwritten in the middle, truncated, punched, preallocated, cloned;
/// names added, moved across directories, replaced, removed; directories
/// made, moved into others and removed; xattrs, modes, owners, symlinks,
/// fifos, device nodes.
fn step(root: &Path, g: &mut Prng, n: usize) {
    let pick = |g: &mut Prng, v: &[PathBuf]| -> Option<PathBuf> {
        (!v.is_empty()).then(|| v[g.below(v.len() as u64) as usize].clone())
    };
    for op in 0..40 {
        let mut files = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        for e in walkdir(root) {
            let m = std::fs::symlink_metadata(&e).unwrap();
            if m.is_dir() {
                dirs.push(e);
            } else if m.is_file() {
                files.push(e);
            }
        }
        let dir = pick(g, &dirs).unwrap();
        let name = format!("n{n}-{op}-{}", g.below(1000));
        let data = |g: &mut Prng, len: usize| -> Vec<u8> {
            if g.below(2) == 0 {
                (0..len).map(|i| b"abcdefgh\n"[(i / 7) % 9]).collect()
            } else {
                (0..len).map(|_| g.below(256) as u8).collect()
            }
        };
        match g.below(20) {
            0..=3 => {
                let len = [0usize, 100, 3000, 4096, 70_000, 300_000][g.below(6) as usize];
                let d = data(g, len);
                std::fs::write(dir.join(&name), d).unwrap();
            }
            4 | 5 => {
                if let Some(f) = pick(g, &files) {
                    use std::os::unix::fs::FileExt;
                    let fh = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                    let off = g.below(400_000);
                    let len = 1 + g.below(20_000) as usize;
                    fh.write_all_at(&data(g, len), off).unwrap();
                }
            }
            6 => {
                if let Some(f) = pick(g, &files) {
                    let fh = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                    fh.set_len(g.below(200_000)).unwrap();
                }
            }
            7 => {
                if let Some(f) = pick(g, &files) {
                    let (o, l) = (g.below(64) * 4096, (1 + g.below(16)) * 4096);
                    let mode = if g.below(2) == 0 { "-p" } else { "-n" };
                    must_run(
                        Command::new("fallocate")
                            .args([mode, "-o", &o.to_string(), "-l", &l.to_string()])
                            .arg(&f),
                    );
                }
            }
            8 => {
                if let Some(f) = pick(g, &files) {
                    must_run(
                        Command::new("cp")
                            .arg("--reflink=always")
                            .arg(&f)
                            .arg(dir.join(&name)),
                    );
                }
            }
            9 => {
                if let Some(f) = pick(g, &files) {
                    let _ = std::fs::hard_link(&f, dir.join(&name));
                }
            }
            10 | 11 => {
                // A move: a file or a directory (not into itself).
                let src = if g.below(2) == 0 {
                    pick(g, &files)
                } else {
                    pick(g, &dirs[1..])
                };
                if let Some(s) = src {
                    if !dir.starts_with(&s) {
                        let to = if g.below(3) == 0 {
                            // Over an existing file of the target directory.
                            files
                                .iter()
                                .find(|f| {
                                    f.parent() == Some(&dir)
                                        && std::fs::symlink_metadata(&s).unwrap().is_file()
                                })
                                .cloned()
                                .unwrap_or_else(|| dir.join(&name))
                        } else {
                            dir.join(&name)
                        };
                        let _ = std::fs::rename(&s, &to);
                    }
                }
            }
            12 => {
                if let Some(f) = pick(g, &files) {
                    std::fs::remove_file(&f).unwrap();
                }
            }
            13 => std::fs::create_dir(dir.join(&name)).unwrap(),
            14 => {
                if let Some(d) = pick(g, &dirs[1..]) {
                    let _ = std::fs::remove_dir_all(&d);
                }
            }
            15 => {
                if let Some(f) = pick(g, &files) {
                    let v = format!("v{}", g.below(100));
                    must_run(
                        Command::new("setfattr")
                            .args(["-n", &format!("user.{}", g.below(3)), "-v", &v])
                            .arg(&f),
                    );
                }
            }
            16 => {
                if let Some(f) = pick(g, &files) {
                    let mode = [0o600, 0o644, 0o755, 0o4755, 0o640][g.below(5) as usize];
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
                    if g.below(2) == 0 {
                        std::os::unix::fs::lchown(&f, Some(g.below(3) as u32 * 1000), Some(7))
                            .unwrap();
                    }
                }
            }
            17 => {
                std::os::unix::fs::symlink(format!("../t{}", g.below(9)), dir.join(&name)).unwrap();
            }
            18 => {
                let kind = if g.below(2) == 0 { "p" } else { "c" };
                let mut c = Command::new("mknod");
                c.arg(dir.join(&name)).arg(kind);
                if kind == "c" {
                    c.args(["1", "3"]);
                }
                must_run(&mut c);
            }
            _ => {
                if let Some(f) = pick(g, &files) {
                    must_run(
                        Command::new("truncate")
                            .args(["-s", &format!("+{}", g.below(3) * 65536)])
                            .arg(&f),
                    );
                }
            }
        }
    }
}

fn walkdir(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        for p in v {
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Access and modification times of every path under `root`
/// (directories' too).
type Times = (PathBuf, (i64, i64), (i64, i64));
fn mtimes(root: &Path) -> Vec<Times> {
    use std::os::unix::fs::MetadataExt;
    let of = |p: &Path, name: PathBuf| -> Times {
        let m = std::fs::symlink_metadata(p).unwrap();
        (
            name,
            (m.mtime(), m.mtime_nsec()),
            (m.atime(), m.atime_nsec()),
        )
    };
    let mut v: Vec<Times> = walkdir(root)
        .into_iter()
        .map(|p| of(&p, p.strip_prefix(root).unwrap().to_path_buf()))
        .collect();
    v.push(of(root, PathBuf::from(".")));
    v.sort();
    v
}

/// filefrag -v of `p`.
fn frag(p: &Path) -> String {
    String::from_utf8_lossy(&must_run(Command::new("filefrag").arg("-v").arg(p)).stdout)
        .into_owned()
}

/// The physical ranges of `p`'s extents (equal for files sharing them).
fn physical(p: &Path) -> Vec<String> {
    frag(p)
        .lines()
        .filter(|l| l.contains("..") && l.contains(':'))
        .map(|l| l.split(':').nth(2).unwrap_or("").trim().to_string())
        .collect()
}

/// `btrkit receive --dump` of the stream file `s`.
fn dump_of(s: &Path) -> String {
    String::from_utf8_lossy(
        &must_run(
            Command::new(bin_path("btrkit"))
                .args(["receive", "--dump", "-f"])
                .arg(s),
        )
        .stdout,
    )
    .into_owned()
}

/// Source image: subvolume `vol` worked on in STEPS steps, read-only
/// snapshot `sI` after each, plus a reflinked pair and a compressible
/// file in the first.
fn source(dir: &Path, seed: u64) -> PathBuf {
    let img = dir.join("src.img");
    mkfs(&img, 1 << 30);
    let m = LoopMount::new(&img, "compress=zstd").unwrap();
    let r = m.path();
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "create"])
            .arg(r.join("vol")),
    );
    let vol = r.join("vol");
    std::fs::create_dir(vol.join("base")).unwrap();
    let text: Vec<u8> = (0..600_000)
        .map(|i| b"compressible text\n"[i % 18])
        .collect();
    std::fs::write(vol.join("base/text"), &text).unwrap();
    let mut g = Prng::new(seed);
    let rnd: Vec<u8> = (0..262_144).map(|_| g.below(256) as u8).collect();
    std::fs::write(vol.join("base/big"), &rnd).unwrap();
    sh(&vol, "cp --reflink=always base/big base/big.ref && sync");
    for i in 0..STEPS {
        if i > 0 {
            step(&vol, &mut g, i);
        }
        must_run(
            Command::new("btrfs")
                .args(["-q", "subvolume", "snapshot", "-r"])
                .arg(&vol)
                .arg(r.join(format!("s{i}"))),
        );
    }
    drop(m);
    img
}

/// The kernel's streams of the snapshots: s0 full, then each relative to
/// the one before; `v2` with --proto 2 --compressed-data.
fn kernel_streams(img: &Path, out: &Path, v2: bool) -> Vec<PathBuf> {
    let m = LoopMount::new(img, "ro").unwrap();
    let mut v = Vec::new();
    for i in 0..STEPS {
        let f = out.join(format!("k{}-{i}.stream", if v2 { 2 } else { 1 }));
        let mut c = Command::new("btrfs");
        c.args(["send", "-q", "-f"]).arg(&f);
        if v2 {
            c.args(["--proto", "2", "--compressed-data"]);
        }
        if i > 0 {
            c.arg("-p").arg(m.path().join(format!("s{}", i - 1)));
        }
        c.arg(m.path().join(format!("s{i}")));
        must_run(&mut c);
        v.push(f);
    }
    v
}

fn btrkit_streams(img: &Path, out: &Path, v2: bool) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for i in 0..STEPS {
        let f = out.join(format!("b{}-{i}.stream", if v2 { 2 } else { 1 }));
        let mut c = Command::new(bin_path("btrkit"));
        c.args(["send", "-q", "-f"]).arg(&f);
        if v2 {
            c.args(["--proto", "2", "--compressed-data"]);
        }
        if i > 0 {
            c.args(["-p", &format!("/s{}", i - 1)]);
        }
        c.arg(img).arg(format!("/s{i}"));
        must_run(&mut c);
        v.push(f);
    }
    v
}

/// Every received snapshot equals its source.
/// `space`: the image whose snapshots' files allocate at least as much
/// (holes stay holes: a stream that punches them makes a receiver punch
/// them; one that writes zeros makes the kernel's receive write them too);
/// `compressed`: the stream kept compressed extents compressed.
fn same_snapshots(src: &Path, dst: &Path, space: &Path, compressed: bool, what: &str) {
    let a = LoopMount::new(src, "ro").unwrap();
    let b = LoopMount::new(dst, "ro").unwrap();
    let k = (space != src).then(|| LoopMount::new(space, "ro").unwrap());
    let kp = k.as_ref().map_or(a.path(), |k| k.path()).to_path_buf();
    for i in 0..STEPS {
        let s = format!("s{i}");
        let ma = manifest_of_tree(&a.path().join(&s)).unwrap();
        let mb = manifest_of_tree(&b.path().join(&s)).unwrap();
        let d = ma.diff_ignoring(&mb, &["ino", "alloc"]);
        assert!(d.is_empty(), "{what}: {s} differs:\n{}", d.join("\n"));
        assert_eq!(
            mtimes(&a.path().join(&s)),
            mtimes(&b.path().join(&s)),
            "{what}: {s}: mtimes and atimes"
        );
        let used = |p: &Path| -> u64 {
            use std::os::unix::fs::MetadataExt;
            walkdir(p)
                .iter()
                .map(|f| std::fs::symlink_metadata(f).unwrap())
                .filter(|m| m.is_file())
                .map(|m| m.blocks())
                .sum()
        };
        let (ua, ub) = (used(&kp.join(&s)), used(&b.path().join(&s)));
        assert!(
            ub <= ua + ua / 4 + 64,
            "{what}: {s}: {ub} blocks received, {ua} in {}",
            space.display()
        );
    }
    // The reflinked pair shares its extents; the text stays compressed.
    let base = b.path().join("s0/base");
    assert_eq!(
        physical(&base.join("big")),
        physical(&base.join("big.ref")),
        "{what}: the clone is not shared"
    );
    if compressed {
        assert!(
            frag(&base.join("text")).contains("encoded"),
            "{what}: base/text is not compressed:\n{}",
            frag(&base.join("text"))
        );
    }
    // Received: read-only with the received uuid.
    let list = String::from_utf8_lossy(
        &must_run(
            Command::new("btrfs")
                .args(["subvolume", "list", "-R", "-r"])
                .arg(b.path()),
        )
        .stdout,
    )
    .into_owned();
    for i in 0..STEPS {
        let l = list
            .lines()
            .find(|l| l.ends_with(&format!("path s{i}")))
            .unwrap_or_else(|| panic!("{what}: s{i} not read-only:\n{list}"));
        assert!(
            !l.contains("received_uuid -"),
            "{what}: s{i} has no received uuid: {l}"
        );
    }
}

fn clean(img: &Path, what: &str) {
    let v = oracle::btrfs_check(&[img], Progs::Distro).unwrap();
    assert!(v.no_error_found(), "{what}: {}", v.output);
}

/// The seeds of the random chains: `first`, then
/// `BTRKIT_SEND_SEEDS` more (an on-demand sweep; see the README).
fn seeds(first: u64) -> Vec<u64> {
    let more: u64 = std::env::var("BTRKIT_SEND_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::iter::once(first)
        .chain((1..=more).map(|i| first.wrapping_mul(31).wrapping_add(i * 0x9e37)))
        .collect()
}

#[test]
fn kernel_streams_received_into_images() {
    skip_unless!(env::require_kernel_mount());
    let only: Option<u64> = std::env::var("BTRKIT_SEND_SEED")
        .ok()
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    for seed in only.map_or_else(|| seeds(0x5e4d), |s| vec![s]) {
        eprintln!("seed {seed:#x}");
        kernel_chain(seed);
    }
}

fn kernel_chain(seed: u64) {
    let t = scratch();
    let src = source(t.path(), seed);
    for v2 in [false, true] {
        let streams = kernel_streams(&src, t.path(), v2);
        let dst = t.path().join(format!("dst{}.img", v2 as u8));
        mkfs(&dst, 1 << 30);
        for s in &streams {
            let o = Command::new(bin_path("btrkit"))
                .args(["receive", "-q", "-f"])
                .arg(s)
                .arg(&dst)
                .arg("/")
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "receive {}: {}",
                s.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let what = if v2 {
            "kernel v2 streams"
        } else {
            "kernel v1 streams"
        };
        clean(&dst, what);
        // The kernel's own receive of the same streams, for the space the
        // files take.
        let kdst = t.path().join(format!("kdst{}.img", v2 as u8));
        mkfs(&kdst, 1 << 30);
        let m = LoopMount::new(&kdst, "").unwrap();
        for s in &streams {
            must_run(
                Command::new("btrfs")
                    .args(["receive", "-q", "-f"])
                    .arg(s)
                    .arg(m.path()),
            );
        }
        drop(m);
        same_snapshots(&src, &dst, &kdst, v2, what);
        // And the kernel's receive of the same streams, holes and
        // preallocated ranges included (the extent map of every file).
        let a = LoopMount::new(&kdst, "ro").unwrap();
        let b = LoopMount::new(&dst, "ro").unwrap();
        for i in 0..STEPS {
            let s = format!("s{i}");
            let ma = manifest_of_tree(&a.path().join(&s)).unwrap();
            let mb = manifest_of_tree(&b.path().join(&s)).unwrap();
            let d = ma.diff_ignoring(&mb, &["ino"]);
            assert!(
                d.is_empty(),
                "{what}: {s}: btrfs receive and btrkit receive differ:\n{}",
                d.join("\n")
            );
        }
        drop((a, b));
        // The kernel writes on what btrkit received.
        let m = LoopMount::new(&dst, "").unwrap();
        std::fs::write(m.path().join("after"), b"x").unwrap();
        drop(m);
        clean(&dst, what);
    }
}

#[test]
fn btrkit_streams_received_by_the_kernel() {
    skip_unless!(env::require_kernel_mount());
    let only: Option<u64> = std::env::var("BTRKIT_SEND_SEED")
        .ok()
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    for seed in only.map_or_else(|| seeds(0x77a1), |s| vec![s]) {
        eprintln!("seed {seed:#x}");
        btrkit_chain(seed);
    }
}

/// A scratch directory, kept (and named on stderr) with BTRKIT_KEEP_TMP
/// set, for looking at a failure.
fn scratch() -> tempfile::TempDir {
    let keep = std::env::var_os("BTRKIT_KEEP_TMP").is_some();
    let t = tempfile::Builder::new()
        .disable_cleanup(keep)
        .tempdir()
        .unwrap();
    if keep {
        eprintln!("keeping {}", t.path().display());
    }
    t
}

fn btrkit_chain(seed: u64) {
    let t = scratch();
    let src = source(t.path(), seed);
    for v2 in [false, true] {
        let streams = btrkit_streams(&src, t.path(), v2);
        let dst = t.path().join(format!("dst{}.img", v2 as u8));
        mkfs(&dst, 1 << 30);
        let m = LoopMount::new(&dst, "").unwrap();
        for s in &streams {
            let o = Command::new("btrfs")
                .args(["receive", "-f"])
                .arg(s)
                .arg(m.path())
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "btrfs receive {}: {}",
                s.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        drop(m);
        let what = if v2 {
            "btrkit v2 streams"
        } else {
            "btrkit v1 streams"
        };
        clean(&dst, what);
        // v1 has no hole punching: holes come as zeros, as the kernel's.
        same_snapshots(&src, &dst, if v2 { &src } else { &dst }, v2, what);
        // btrkit's --dump prints our streams as btrfs-progs 6.14 does.
        if let Some(dir) = env::progs_new_dir() {
            for s in &streams {
                let ours = must_run(
                    Command::new(bin_path("btrkit"))
                        .env("TZ", "UTC")
                        .args(["receive", "--dump", "-f"])
                        .arg(s),
                )
                .stdout;
                let theirs = must_run(
                    Command::new(dir.join("btrfs"))
                        .env("TZ", "UTC")
                        .args(["receive", "--dump", "-f"])
                        .arg(s),
                )
                .stdout;
                assert_eq!(
                    String::from_utf8_lossy(&ours),
                    String::from_utf8_lossy(&theirs),
                    "--dump of {}",
                    s.display()
                );
            }
        }
    }
    // And btrkit receives its own streams.
    let streams = btrkit_streams(&src, t.path(), true);
    let dst = t.path().join("own.img");
    mkfs(&dst, 1 << 30);
    let mut all = Vec::new();
    for s in &streams {
        all.extend(std::fs::read(s).unwrap());
    }
    let cat = t.path().join("all.streams");
    std::fs::write(&cat, all).unwrap();
    must_run(
        Command::new(bin_path("btrkit"))
            .args(["receive", "-q", "-f"])
            .arg(&cat)
            .arg(&dst)
            .arg("/"),
    );
    clean(&dst, "btrkit's own streams, several in one file");
    same_snapshots(&src, &dst, &src, true, "btrkit's own streams");
}

/// A stream of one small subvolume from btrkit.
fn small_stream(t: &Path) -> (PathBuf, Vec<u8>) {
    let img = t.join("small.img");
    mkfs(&img, 256 << 20);
    let m = LoopMount::new(&img, "").unwrap();
    let r = m.path();
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "create"])
            .arg(r.join("v")),
    );
    sh(&r.join("v"), "mkdir -p a/b && head -c 200000 /dev/urandom > a/f && ln a/f a/b/g && ln -s a x && setfattr -n user.q -v 1 a/f");
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(r.join("v"))
            .arg(r.join("snap")),
    );
    drop(m);
    let f = t.join("small.stream");
    must_run(
        Command::new(bin_path("btrkit"))
            .args(["send", "-q", "-f"])
            .arg(&f)
            .arg(&img)
            .arg("/snap"),
    );
    (img, std::fs::read(&f).unwrap())
}

#[test]
fn cut_and_damaged_streams_are_errors_and_the_image_stays_clean() {
    skip_unless!(env::require_btrfs_progs());
    let t = tempfile::tempdir().unwrap();
    let (_, good) = small_stream(t.path());
    let empty = t.path().join("empty.img");
    mkfs(&empty, 256 << 20);
    let mut g = Prng::new(99);
    for round in 0..12 {
        let mut b = good.clone();
        let cut = round % 2 == 0;
        if cut {
            b.truncate(17 + g.below(b.len() as u64 - 40) as usize);
        } else {
            let i = 17 + g.below(b.len() as u64 - 17) as usize;
            b[i] ^= 1 << g.below(8);
        }
        let s = t.path().join("bad.stream");
        std::fs::write(&s, &b).unwrap();
        let img = t.path().join("r.img");
        std::fs::copy(&empty, &img).unwrap();
        let o = Command::new(bin_path("btrkit"))
            .args(["receive", "-q", "-f"])
            .arg(&s)
            .arg(&img)
            .arg("/")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "round {round}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        clean(&img, &format!("round {round} ({err})"));
        // What was received is left writable, without a received uuid.
        let list = String::from_utf8_lossy(
            &must_run(
                Command::new(bin_path("btrkit"))
                    .args(["subvolume", "list", "-R", "-r"])
                    .arg(&img),
            )
            .stdout,
        )
        .into_owned();
        assert!(
            list.trim().is_empty(),
            "round {round}: a read-only subvolume after a failed receive: {list}"
        );
    }
}

#[test]
fn a_stream_cannot_name_anything_outside_its_subvolume() {
    skip_unless!(env::require_btrfs_progs());
    use btrkit_core::send::stream::{Command as C, StreamWriter};
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("h.img");
    mkfs(&img, 256 << 20);
    let evil: Vec<Vec<C>> = vec![
        vec![
            C::Subvol {
                path: b"s".to_vec(),
                uuid: [1; 16],
                ctransid: 1,
            },
            C::Mkfile {
                path: b"../evil".to_vec(),
                ino: 257,
            },
        ],
        vec![C::Subvol {
            path: b"../s".to_vec(),
            uuid: [2; 16],
            ctransid: 1,
        }],
        vec![
            C::Subvol {
                path: b"s2".to_vec(),
                uuid: [3; 16],
                ctransid: 1,
            },
            C::Symlink {
                path: b"l".to_vec(),
                ino: 257,
                target: b"/".to_vec(),
            },
            C::Mkfile {
                path: b"l/evil".to_vec(),
                ino: 258,
            },
        ],
        vec![
            C::Subvol {
                path: b"s3".to_vec(),
                uuid: [4; 16],
                ctransid: 1,
            },
            C::Rename {
                from: b"".to_vec(),
                to: b"x".to_vec(),
            },
        ],
        vec![C::Mkfile {
            path: b"evil".to_vec(),
            ino: 257,
        }],
    ];
    for (i, cmds) in evil.iter().enumerate() {
        let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
        for c in cmds {
            w.put(c).unwrap();
        }
        w.put(&C::End).unwrap();
        let s = t.path().join(format!("evil{i}.stream"));
        std::fs::write(&s, w.finish().unwrap()).unwrap();
        let o = Command::new(bin_path("btrkit"))
            .args(["receive", "-q", "-f"])
            .arg(&s)
            .arg(&img)
            .arg("/")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "stream {i} accepted");
    }
    clean(&img, "after the hostile streams");
    let m = LoopMount::new(&img, "ro").unwrap();
    let top: Vec<String> = std::fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!top.iter().any(|n| n == "evil" || n == "x"), "{top:?}");
    assert!(!m.path().join("s2/l/evil").exists());
}

/// Clone sources (`-c`): data a snapshot shares with another goes as
/// CLONE commands naming it, the receiver (the kernel's and btrkit's)
/// shares it again; the kernel's own `-c` stream into btrkit too.
#[test]
fn clone_sources_shared_both_ways() {
    skip_unless!(env::require_kernel_mount());
    let t = scratch();
    let src = t.path().join("c.img");
    mkfs(&src, 512 << 20);
    let m = LoopMount::new(&src, "").unwrap();
    let r = m.path();
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "create"])
            .arg(r.join("a")),
    );
    sh(
        &r.join("a"),
        "head -c 1048576 /dev/urandom > big && head -c 300000 /dev/urandom > mid && sync",
    );
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(r.join("a"))
            .arg(r.join("A")),
    );
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "create"])
            .arg(r.join("b")),
    );
    sh(r, "cp --reflink=always A/big b/big2 && cp --reflink=always A/mid b/mid2 && echo own > b/own && sync");
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(r.join("b"))
            .arg(r.join("B")),
    );
    let ks = t.path().join("kB.stream");
    let ka = t.path().join("kA.stream");
    must_run(
        Command::new("btrfs")
            .args(["send", "-q", "-f"])
            .arg(&ka)
            .arg(r.join("A")),
    );
    // btrfs send wants a parent with -c (it looks for one among the
    // clone sources and fails for an unrelated subvolume): A.
    must_run(
        Command::new("btrfs")
            .args(["send", "-q", "-f"])
            .arg(&ks)
            .arg("-p")
            .arg(r.join("A"))
            .arg("-c")
            .arg(r.join("A"))
            .arg(r.join("B")),
    );
    drop(m);
    let ba = t.path().join("bA.stream");
    let bs = t.path().join("bB.stream");
    must_run(
        Command::new(bin_path("btrkit"))
            .args(["send", "-q", "-f"])
            .arg(&ba)
            .arg(&src)
            .arg("/A"),
    );
    must_run(
        Command::new(bin_path("btrkit"))
            .args(["send", "-q", "-c", "/A", "-f"])
            .arg(&bs)
            .arg(&src)
            .arg("/B"),
    );
    let dump = dump_of(&bs);
    assert_eq!(
        dump.lines().filter(|l| l.starts_with("clone")).count(),
        2,
        "{dump}"
    );
    assert!(
        !dump
            .lines()
            .any(|l| l.starts_with("write") && (l.contains("/big2") || l.contains("/mid2"))),
        "{dump}"
    );
    // Kernel receive of ours, btrkit receive of the kernel's and of ours.
    for (who, a, b) in [
        ("kernel", &ba, &bs),
        ("btrkit", &ka, &ks),
        ("btrkit", &ba, &bs),
    ] {
        let dst = t.path().join("d.img");
        mkfs(&dst, 512 << 20);
        if who == "kernel" {
            let m = LoopMount::new(&dst, "").unwrap();
            for s in [a, b] {
                must_run(
                    Command::new("btrfs")
                        .args(["receive", "-q", "-f"])
                        .arg(s)
                        .arg(m.path()),
                );
            }
        } else {
            for s in [a, b] {
                must_run(
                    Command::new(bin_path("btrkit"))
                        .args(["receive", "-q", "-f"])
                        .arg(s)
                        .arg(&dst)
                        .arg("/"),
                );
            }
        }
        clean(&dst, &format!("{who} receive of {}", b.display()));
        let srcm = LoopMount::new(&src, "ro").unwrap();
        let m = LoopMount::new(&dst, "ro").unwrap();
        for s in ["A", "B"] {
            let d = manifest_of_tree(&srcm.path().join(s))
                .unwrap()
                .diff_ignoring(
                    &manifest_of_tree(&m.path().join(s)).unwrap(),
                    &["ino", "alloc"],
                );
            assert!(d.is_empty(), "{who}: {s}: {}", d.join("\n"));
        }
        assert_eq!(
            physical(&m.path().join("A/big")),
            physical(&m.path().join("B/big2")),
            "{who}: {}: not shared",
            b.display()
        );
        assert_eq!(
            physical(&m.path().join("A/mid")),
            physical(&m.path().join("B/mid2")),
            "{who}: {}: not shared",
            b.display()
        );
    }
}

/// `--no-data`: sizes and names without data (UPDATE_EXTENT), which
/// btrfs receive takes; `-e` stops at the first END; `--max-errors`.
#[test]
fn no_data_end_and_max_errors() {
    skip_unless!(env::require_kernel_mount());
    let t = scratch();
    let (img, good) = small_stream(t.path());
    let nd = t.path().join("nd.stream");
    must_run(
        Command::new(bin_path("btrkit"))
            .args(["send", "-q", "--no-data", "-f"])
            .arg(&nd)
            .arg(&img)
            .arg("/snap"),
    );
    let dump = dump_of(&nd);
    assert!(
        dump.contains("update_extent") && !dump.contains("\nwrite"),
        "{dump}"
    );
    let dst = t.path().join("nd.img");
    mkfs(&dst, 256 << 20);
    let m = LoopMount::new(&dst, "").unwrap();
    must_run(
        Command::new("btrfs")
            .args(["receive", "-q", "-f"])
            .arg(&nd)
            .arg(m.path()),
    );
    assert_eq!(
        std::fs::metadata(m.path().join("snap/a/f")).unwrap().len(),
        200_000
    );
    drop(m);
    // Two streams in one file: -e takes the first only.
    let two = t.path().join("two.stream");
    let mut both = good.clone();
    both.extend_from_slice(&good);
    std::fs::write(&two, &both).unwrap();
    let dst = t.path().join("e.img");
    mkfs(&dst, 256 << 20);
    must_run(
        Command::new(bin_path("btrkit"))
            .args(["receive", "-q", "-e", "-f"])
            .arg(&two)
            .arg(&dst)
            .arg("/"),
    );
    clean(&dst, "-e");
    // Without -e the second stream's subvolume exists already: an error.
    let o = Command::new(bin_path("btrkit"))
        .args(["receive", "-q", "-f"])
        .arg(&two)
        .arg(&dst)
        .arg("/")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    // A stream with a failing command: stops at it by default, goes on
    // with --max-errors 0 (and still fails at the end, as btrfs-progs).
    use btrkit_core::send::stream::{Command as C, StreamWriter};
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    for c in [
        C::Subvol {
            path: b"m".to_vec(),
            uuid: [9; 16],
            ctransid: 3,
        },
        C::Chmod {
            path: b"missing".to_vec(),
            mode: 0o600,
        },
        C::Mkdir {
            path: b"after".to_vec(),
            ino: 257,
        },
        C::End,
    ] {
        w.put(&c).unwrap();
    }
    let s = t.path().join("err.stream");
    std::fs::write(&s, w.finish().unwrap()).unwrap();
    for (flag, made) in [("1", false), ("0", true)] {
        let dst = t.path().join(format!("me{flag}.img"));
        mkfs(&dst, 256 << 20);
        let o = Command::new(bin_path("btrkit"))
            .args(["receive", "-q", "--max-errors", flag, "-f"])
            .arg(&s)
            .arg(&dst)
            .arg("/")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "--max-errors {flag}");
        clean(&dst, &format!("--max-errors {flag}"));
        let m = LoopMount::new(&dst, "ro").unwrap();
        assert_eq!(
            m.path().join("m/after").exists(),
            made,
            "--max-errors {flag}"
        );
    }
}

/// Both ends on device sets: a two-device raid1 set sends, a three-device
/// raid1c3/raid5 set receives; the kernel mounts the result.
#[test]
fn sets_send_and_receive() {
    skip_unless!(env::require_kernel_mount());
    let t = scratch();
    let set = btrkit_tests::sets::KernelSet::new(2, &["-m", "raid1", "-d", "raid1"]);
    let m = LoopMount::new(
        &set.paths[0],
        &btrkit_tests::sets::device_opts(&set.paths)[1..],
    )
    .unwrap();
    must_run(
        Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(m.path())
            .arg(m.path().join("snap")),
    );
    drop(m);
    let s = t.path().join("set.stream");
    let mut c = Command::new(bin_path("btrkit"));
    c.args(["send", "-q", "-f"])
        .arg(&s)
        .args(&set.paths)
        .arg("/snap");
    must_run(&mut c);
    let dst: Vec<PathBuf> = (0..3).map(|i| t.path().join(format!("r{i}.img"))).collect();
    for d in &dst {
        std::fs::File::create(d)
            .unwrap()
            .set_len(512 << 20)
            .unwrap();
    }
    must_run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-m", "raid1c3", "-d", "raid5"])
            .args(&dst),
    );
    let mut c = Command::new(bin_path("btrkit"));
    c.args(["receive", "-q", "-f"]).arg(&s).args(&dst).arg("/");
    must_run(&mut c);
    oracle::check_set_clean(&dst).unwrap();
    let want = btrkit_tests::sets::manifest(&set.paths, "ro").unwrap();
    let got = btrkit_tests::sets::manifest(&dst, "ro").unwrap();
    // The received subvolume holds what the source's top level held (the
    // top directory itself aside: it also names the snapshot).
    let sub = |m: &btrkit_core::workload::manifest::Manifest,
               prefix: &str|
     -> Vec<(String, Vec<(&'static str, String)>)> {
        m.entries
            .iter()
            .filter_map(|(k, e)| {
                let rest = k.strip_prefix(prefix)?;
                (rest.len() > 1 && !rest.starts_with("/snap")).then(|| {
                    (
                        rest.to_string(),
                        e.fields()
                            .into_iter()
                            .filter(|(f, _)| *f != "ino" && *f != "alloc")
                            .collect(),
                    )
                })
            })
            .collect()
    };
    let (a, b) = (sub(&want, ""), sub(&got, "/snap"));
    assert!(a.len() > 100, "{} entries", a.len());
    assert_eq!(a, b);
}

/// Streams that are well formed (checksums right) and say anything:
/// random commands on random paths (`..`, empty, long names), offsets and
/// lengths up to 2^64, clones from unknown subvolumes. btrkit receive
/// refuses what it must, never panics, and leaves an image btrfs check
/// finds clean.
#[test]
fn random_well_formed_streams_never_panic() {
    skip_unless!(env::require_btrfs_progs());
    use btrkit_core::send::stream::{Command as C, StreamWriter, Time};
    let t = scratch();
    let empty = t.path().join("empty.img");
    mkfs(&empty, 256 << 20);
    let mut g = Prng::new(0xf022);
    let names: [&[u8]; 9] = [
        b"a", b"b", b"a/c", b"b/d", b"..", b"a/../b", b"", b"x/y/z", b"a/b/c/d",
    ];
    let rounds: u64 = std::env::var("BTRKIT_SEND_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    for round in 0..rounds {
        let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
        w.put(&C::Subvol {
            path: format!("s{round}").into_bytes(),
            uuid: [round as u8; 16],
            ctransid: 5,
        })
        .unwrap();
        for _ in 0..200 {
            let pick = |g: &mut Prng| -> Vec<u8> {
                if g.below(20) == 0 {
                    vec![b'n'; 300]
                } else {
                    names[g.below(names.len() as u64) as usize].to_vec()
                }
            };
            // Two paths drawn up front: each command takes at most two.
            let (p1, p2) = (pick(&mut g), pick(&mut g));
            let mut pp = [p2, p1];
            let mut i = 0;
            let mut p = || -> Vec<u8> {
                i += 1;
                std::mem::take(&mut pp[i % 2])
            };
            let big = |g: &mut Prng| -> u64 {
                match g.below(4) {
                    0 => g.below(1 << 20),
                    1 => u64::MAX - g.below(1 << 12),
                    2 => 1 << g.below(64),
                    _ => g.below(300_000),
                }
            };
            let c = match g.below(16) {
                0 => C::Mkfile {
                    path: p(),
                    ino: 257,
                },
                1 => C::Mkdir {
                    path: p(),
                    ino: 258,
                },
                2 => C::Symlink {
                    path: p(),
                    ino: 259,
                    target: p(),
                },
                3 => C::Rename { from: p(), to: p() },
                4 => C::Link {
                    path: p(),
                    target: p(),
                },
                5 => C::Unlink { path: p() },
                6 => C::Rmdir { path: p() },
                7 => C::Write {
                    path: p(),
                    offset: big(&mut g),
                    data: vec![7; g.below(9000) as usize],
                },
                8 => C::Clone {
                    path: p(),
                    offset: big(&mut g),
                    len: big(&mut g),
                    clone_uuid: [round as u8; 16],
                    clone_ctransid: 5,
                    clone_path: p(),
                    clone_offset: big(&mut g),
                },
                9 => C::Truncate {
                    path: p(),
                    size: big(&mut g),
                },
                10 => C::SetXattr {
                    path: p(),
                    name: b"user.x".to_vec(),
                    data: vec![1; g.below(5000) as usize],
                },
                11 => C::Fallocate {
                    path: p(),
                    mode: g.below(32) as u32,
                    offset: big(&mut g),
                    len: big(&mut g),
                },
                12 => C::EncodedWrite {
                    path: p(),
                    offset: big(&mut g),
                    unencoded_file_len: big(&mut g),
                    unencoded_len: big(&mut g),
                    unencoded_offset: big(&mut g),
                    compression: g.below(9) as u32,
                    encryption: 0,
                    data: vec![0x28; g.below(3000) as usize],
                },
                13 => C::Mknod {
                    path: p(),
                    ino: 260,
                    mode: g.below(1 << 16),
                    rdev: big(&mut g),
                },
                14 => C::Utimes {
                    path: p(),
                    atime: Time {
                        sec: big(&mut g) as i64,
                        nsec: g.below(2_000_000_000) as u32,
                    },
                    mtime: Time::default(),
                    ctime: Time::default(),
                },
                _ => C::Chown {
                    path: p(),
                    uid: big(&mut g),
                    gid: big(&mut g),
                },
            };
            w.put(&c).unwrap();
        }
        w.put(&C::End).unwrap();
        let s = t.path().join("r.stream");
        std::fs::write(&s, w.finish().unwrap()).unwrap();
        let img = t.path().join("r.img");
        std::fs::copy(&empty, &img).unwrap();
        let o = Command::new(bin_path("btrkit"))
            .args(["receive", "-q", "--max-errors", "0", "-f"])
            .arg(&s)
            .arg(&img)
            .arg("/")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            matches!(o.status.code(), Some(0) | Some(1)),
            "round {round}: {:?} {err}",
            o.status
        );
        assert!(!err.contains("panicked"), "round {round}: {err}");
        clean(&img, &format!("round {round}"));
    }
}

/// Sends of damaged snapshots: bytes of the snapshot tree's leaves
/// flipped, checksums made right again, so the checks have to find it. A
/// send ends with a stream or one line of error, never a panic or a
/// signal, within a time bound.
#[test]
fn send_of_damaged_snapshots_never_panics() {
    skip_unless!(env::require_kernel_mount());
    use btrkit_tests::hostile::{Patcher, TreeSel};
    let t = scratch();
    let (img, _) = small_stream(t.path());
    let leaves = {
        let p = Patcher::open(&img).unwrap();
        let root = p
            .tree_root(TreeSel::Tree(257))
            .or_else(|| p.tree_root(TreeSel::Tree(258)))
            .expect("snapshot tree");
        p.leaves(root)
    };
    assert!(!leaves.is_empty());
    let mut g = Prng::new(0x5e4d_0001);
    let cases: u64 = std::env::var("BTRKIT_SEND_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    for case in 0..cases {
        let copy = t.path().join("d.img");
        std::fs::copy(&img, &copy).unwrap();
        let p = Patcher::open(&copy).unwrap();
        let leaf = leaves[g.below(leaves.len() as u64) as usize];
        let mut b = p.read_block(leaf).unwrap();
        for _ in 0..1 + g.below(4) {
            // Past the header: item heads and bodies.
            let i = 101 + g.below(b.len() as u64 - 101) as usize;
            b[i] ^= 1 << g.below(8);
        }
        p.write_block(leaf, &mut b, true).unwrap();
        drop(p);
        let mut c = Command::new(bin_path("btrkit"));
        c.args(["send", "-q", "-f"])
            .arg(t.path().join("o.stream"))
            .arg(&copy)
            .arg("/snap");
        let r = btrkit_tests::fsck_support::run_with_limit(c, std::time::Duration::from_secs(60));
        assert!(
            matches!(r.code, 0 | 1),
            "case {case}: exit {} {}",
            r.code,
            r.stderr
        );
        assert!(!r.stderr.contains("panicked"), "case {case}: {}", r.stderr);
    }
}
