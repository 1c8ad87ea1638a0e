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
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `r(n)`: a reproducible number below `n` (xorshift64 seeded from `seed`).
fn xorshift(seed: u64, mul: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed.wrapping_mul(mul) | 1;
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    }
}

/// A random but reproducible workload: files in a few directories, then
/// writes, truncates, links, renames, unlinks, xattrs, punches, fallocates
/// and fsyncs in random order, a few files fsynced at the end. The kernel may
/// log or commit; whichever it does, replay must agree with it.
fn random_scenario(seed: u64) -> String {
    let mut r = xorshift(seed, 0x9e37_79b9_7f4a_7c15);
    let mut out = vec!["expect-log any".to_string()];
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    if r(10) < 2 {
        out.push("mkfs -O ^no-holes".into());
    }
    if r(10) < 2 {
        out.push("mount compress=zstd".into());
    }
    let dirs = ["/", "/a/", "/b/", "/a/c/"];
    out.extend(["mkdir /a", "mkdir /b", "mkdir /a/c"].map(String::from));
    let mut files: Vec<String> = Vec::new();
    let mut xattrs: Vec<(String, u64)> = Vec::new();
    let newname = |files: &Vec<String>, r: &mut dyn FnMut(u64) -> u64| loop {
        let n = format!("{}f{}", dirs[r(dirs.len() as u64) as usize], r(40));
        if !files.contains(&n) {
            return n;
        }
    };
    for _ in 0..8 {
        let f = newname(&files, &mut r);
        out.push(format!("write {f} 0 {} {}", [100, 3000, 5000, 70000][r(4) as usize], 1 + r(249)));
        files.push(f);
    }
    out.push("sync".into());
    for _ in 0..10 + r(40) {
        if files.is_empty() {
            break;
        }
        let f = files[r(files.len() as u64) as usize].clone();
        let op = r(100);
        if op < 25 {
            out.push(format!("write {f} {} {} {}", [0, 4096, 10000, 65536][r(4) as usize], [10, 4096, 20000][r(3) as usize], 1 + r(249)));
        } else if op < 35 {
            out.push(format!("truncate {f} {}", [0, 1000, 4096, 100000][r(4) as usize]));
        } else if op < 42 {
            let g = newname(&files, &mut r);
            out.push(format!("link {f} {g}"));
            files.push(g);
        } else if op < 52 {
            let g = newname(&files, &mut r);
            out.push(format!("rename {f} {g}"));
            files.retain(|x| *x != f);
            xattrs.retain(|(p, _)| *p != f);
            files.push(g);
        } else if op < 60 {
            out.push(format!("unlink {f}"));
            files.retain(|x| *x != f);
            xattrs.retain(|(p, _)| *p != f);
        } else if op < 66 {
            let k = r(3);
            out.push(format!("setxattr {f} user.k{k} v{}", r(100)));
            xattrs.push((f.clone(), k));
        } else if op < 70 {
            if let Some(i) = xattrs.iter().position(|(p, _)| *p == f) {
                let (_, k) = xattrs.remove(i);
                xattrs.retain(|(p, kk)| !(*p == f && *kk == k));
                out.push(format!("removexattr {f} user.k{k}"));
            }
        } else if op < 75 {
            out.push(format!("punch {f} {} {}", [0, 4096][r(2) as usize], [4096, 8192][r(2) as usize]));
        } else if op < 80 {
            let keep = if r(2) == 0 { " keep" } else { "" };
            out.push(format!("fallocate {f} {} {}{keep}", [0, 8192, 100000][r(3) as usize], [4096, 65536][r(2) as usize]));
        } else if op < 92 {
            out.push(format!("fsync {f}"));
        } else if op < 96 {
            out.push(format!("fdatasync {f}"));
        } else {
            out.push(format!("fsync {}", ["/a", "/b", "/a/c", "/"][r(4) as usize]));
        }
    }
    let n = files.len();
    for f in &files[n.saturating_sub(3)..] {
        out.push(format!("fsync {f}"));
    }
    out.push("crash".into());
    out.join("\n") + "\n"
}

/// A second random family with the namespace in play as well: new and
/// removed directories, directory renames, symlinks, fifos, mode changes,
/// zero-range, evicted caches and fsyncs of directories, on top of the file
/// operations of [`random_scenario`].
fn random_ns_scenario(seed: u64) -> String {
    let mut r = xorshift(seed, 0xd1b5_4a32_d192_ed03);
    let mut out = vec!["expect-log any".to_string()];
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    if r(10) < 2 {
        out.push("mount compress=zstd".into());
    }
    // Directories: fixed ones that stay, and made ones that may go.
    let mut dirs: Vec<String> = vec!["/".into(), "/a/".into(), "/b/".into()];
    out.extend(["mkdir /a", "mkdir /b"].map(String::from));
    let mut files: Vec<String> = Vec::new();
    // Symlinks and fifos: only removed or moved with their directory.
    let mut others: Vec<String> = Vec::new();
    let mut counter = 0u64;
    let mut fresh = |dirs: &Vec<String>, r: &mut dyn FnMut(u64) -> u64, p: &str| {
        counter += 1;
        format!("{}{p}{counter}", dirs[r(dirs.len() as u64) as usize])
    };
    for _ in 0..6 {
        let f = fresh(&dirs, &mut r, "f");
        out.push(format!("write {f} 0 {} {}", [100, 3000, 5000, 70000][r(4) as usize], 1 + r(249)));
        files.push(f);
    }
    out.push("sync".into());
    for _ in 0..15 + r(40) {
        let op = r(100);
        let made: Vec<String> = dirs.iter().skip(3).cloned().collect();
        if op < 8 {
            let d = fresh(&dirs, &mut r, "d");
            out.push(format!("mkdir {d}"));
            dirs.push(format!("{d}/"));
        } else if op < 12 && !made.is_empty() {
            // Remove a made directory with everything in it, deepest first.
            let d = made[r(made.len() as u64) as usize].clone();
            let mut inside: Vec<String> = files.iter().chain(others.iter()).filter(|f| f.starts_with(&d)).cloned().collect();
            inside.sort();
            for f in &inside {
                out.push(format!("unlink {f}"));
            }
            files.retain(|f| !f.starts_with(&d));
            others.retain(|f| !f.starts_with(&d));
            let mut sub: Vec<String> = dirs.iter().filter(|x| x.starts_with(&d)).cloned().collect();
            sub.sort_by_key(|x| std::cmp::Reverse(x.len()));
            for s in &sub {
                out.push(format!("rmdir {}", s.trim_end_matches('/')));
            }
            dirs.retain(|x| !x.starts_with(&d));
        } else if op < 16 && !made.is_empty() {
            // Rename a made directory under a fixed one (never into itself).
            let d = made[r(made.len() as u64) as usize].clone();
            let n = format!("{}{}", ["/", "/a/", "/b/"][r(3) as usize], fresh(&vec!["".into()], &mut r, "r"));
            out.push(format!("rename {} {n}", d.trim_end_matches('/')));
            let nd = format!("{n}/");
            for f in files.iter_mut().chain(others.iter_mut()).filter(|f| f.starts_with(&d)) {
                *f = format!("{nd}{}", &f[d.len()..]);
            }
            for x in dirs.iter_mut().filter(|x| x.starts_with(&d)) {
                *x = format!("{nd}{}", &x[d.len()..]);
            }
        } else if op < 20 {
            let t = fresh(&dirs, &mut r, "s");
            out.push(format!("symlink target{} {t}", r(1000)));
            others.push(t);
        } else if op < 22 {
            let t = fresh(&dirs, &mut r, "p");
            out.push(format!("mkfifo {t}"));
            others.push(t);
        } else if op < 26 {
            out.push("evict".into());
        } else if op < 32 {
            let d = &dirs[r(dirs.len() as u64) as usize];
            out.push(format!("fsync {}", if d == "/" { "/" } else { d.trim_end_matches('/') }));
        } else if files.is_empty() {
            let f = fresh(&dirs, &mut r, "f");
            out.push(format!("create {f}"));
            files.push(f);
        } else {
            let f = files[r(files.len() as u64) as usize].clone();
            let op = r(100);
            if op < 22 {
                out.push(format!("write {f} {} {} {}", [0, 4096, 10000, 65536][r(4) as usize], [10, 4096, 20000][r(3) as usize], 1 + r(249)));
            } else if op < 30 {
                out.push(format!("truncate {f} {}", [0, 1000, 4096, 100000][r(4) as usize]));
            } else if op < 38 {
                let g = fresh(&dirs, &mut r, "f");
                out.push(format!("link {f} {g}"));
                files.push(g);
            } else if op < 48 {
                let g = fresh(&dirs, &mut r, "f");
                out.push(format!("rename {f} {g}"));
                files.retain(|x| *x != f);
                files.push(g);
            } else if op < 56 {
                out.push(format!("unlink {f}"));
                files.retain(|x| *x != f);
            } else if op < 62 {
                out.push(format!("setxattr {f} user.k{} v{}", r(3), r(100)));
            } else if op < 66 {
                out.push(format!("chmod {f} {}", ["600", "644", "755"][r(3) as usize]));
            } else if op < 71 {
                out.push(format!("zero-range {f} {} {}{}", [0, 4096][r(2) as usize], [4096, 8192][r(2) as usize], if r(2) == 0 { " keep" } else { "" }));
            } else if op < 76 {
                out.push(format!("punch {f} {} {}", [0, 4096][r(2) as usize], [4096, 8192][r(2) as usize]));
            } else if op < 81 {
                let keep = if r(2) == 0 { " keep" } else { "" };
                out.push(format!("fallocate {f} {} {}{keep}", [0, 8192, 100000][r(3) as usize], [4096, 65536][r(2) as usize]));
            } else if op < 94 {
                out.push(format!("fsync {f}"));
            } else {
                out.push(format!("fdatasync {f}"));
            }
        }
    }
    let n = files.len();
    for f in &files[n.saturating_sub(2)..] {
        out.push(format!("fsync {f}"));
    }
    out.push("crash".into());
    out.join("\n") + "\n"
}

/// A third random family around reflinks: clones of block-aligned ranges
/// within one file (never overlapping) and across files, over extents
/// written, overwritten, punched and truncated in the same transaction, so
/// that logged file extent items drop and take back references to extents
/// that other items of the same file still use. Sizes are tracked so every
/// clone is one the kernel accepts.
fn random_clone_scenario(seed: u64) -> String {
    const B: u64 = 4096;
    let mut r = xorshift(seed, 0xa076_1d64_78bd_642f);
    let mut out = vec!["expect-log any".to_string()];
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    if r(10) < 2 {
        out.push("mkfs -O ^no-holes".into());
    }
    if r(10) < 2 {
        out.push("mount compress=zstd".into());
    }
    out.push("mkdir /d".into());
    let names: Vec<String> = (0..4).map(|i| format!("/d/f{i}")).collect();
    let mut size = vec![0u64; names.len()];
    for (i, f) in names.iter().enumerate() {
        let n = [16, 32, 64, 256][r(4) as usize] * B;
        out.push(format!("write {f} 0 {n} {}", 1 + r(249)));
        size[i] = n;
    }
    if r(2) == 0 {
        out.push("sync".into());
    }
    for _ in 0..8 + r(24) {
        let i = r(names.len() as u64) as usize;
        let f = &names[i];
        let op = r(100);
        if op < 40 {
            // A clone: within the file (disjoint ranges) or from another.
            let j = if r(2) == 0 { i } else { r(names.len() as u64) as usize };
            let blocks = size[j] / B;
            if blocks == 0 {
                continue;
            }
            let so = r(blocks) * B;
            let mut len = (1 + r((blocks - so / B).min(16))) * B;
            if r(6) == 0 {
                len = 0; // to the end of the source
            }
            let span = if len == 0 { size[j] - so } else { len };
            let dst_blocks = (size[i] / B + 4).max(1);
            let mut doff = r(dst_blocks) * B;
            if j == i && doff < so + span && so < doff + span {
                // Overlap within one file is refused: move past the source.
                doff = (so + span).div_ceil(B) * B;
            }
            if len == 0 && span % B != 0 && doff + span < size[i] {
                // An unaligned tail may only land at or past the
                // destination's end; clone whole blocks instead.
                len = span / B * B;
                if len == 0 {
                    continue;
                }
            }
            let span = if len == 0 { span } else { len };
            out.push(format!("clone {} {so} {f} {doff} {len}", names[j]));
            size[i] = size[i].max(doff + span);
        } else if op < 60 {
            let off = r(size[i] / B + 2) * B + [0, 100][r(2) as usize];
            let len = [100, B, 3 * B, 16 * B][r(4) as usize];
            out.push(format!("write {f} {off} {len} {}", 1 + r(249)));
            size[i] = size[i].max(off + len);
        } else if op < 68 {
            let off = r(size[i] / B + 1) * B;
            out.push(format!("punch {f} {off} {}", [B, 4 * B][r(2) as usize]));
        } else if op < 74 {
            let n = r(size[i] / B + 2) * B + [0, 1000][r(2) as usize];
            out.push(format!("truncate {f} {n}"));
            size[i] = n;
        } else if op < 77 {
            out.push("sync".into());
        } else if op < 92 {
            out.push(format!("fsync {f}"));
        } else {
            out.push(format!("fdatasync {f}"));
        }
    }
    for f in &names {
        if r(2) == 0 {
            out.push(format!("fsync {f}"));
        }
    }
    out.push(format!("fsync {}", names[r(names.len() as u64) as usize]));
    out.push("crash".into());
    out.join("\n") + "\n"
}

/// A fourth random family on filesystems with quotas: subvolumes,
/// snapshots (sharing every block with their source), a deleted subvolume,
/// then writes, overwrites, clones, truncates and unlinks in all of them
/// after the last commit, fsynced. Replay must leave the qgroup counters
/// exactly as the kernel's replay does (btrfs check verifies them).
fn random_quota_scenario(seed: u64) -> String {
    const B: u64 = 4096;
    let mut r = xorshift(seed, 0xe703_7ed1_a0b4_28db);
    let mut out = vec!["expect-log any".to_string()];
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    if r(10) < 2 {
        out.push("mount compress=zstd".into());
    }
    out.push("quota-enable".into());
    out.extend(["subvol-create /sv", "mkdir /d", "mkdir /sv/e"].map(String::from));
    let mut files: Vec<(String, u64)> = Vec::new();
    for (i, dir) in ["/d", "/sv/e", "/sv", "/"].iter().enumerate() {
        for j in 0..2 {
            let f = format!("{}/f{i}{j}", dir.trim_end_matches('/'));
            let n = [3000, 16 * B, 64 * B, 300 * B][r(4) as usize];
            out.push(format!("write {f} 0 {n} {}", 1 + r(249)));
            files.push((f, n));
        }
    }
    if r(3) != 0 {
        // A deleted subvolume: its tree stays until the cleaner drops it.
        out.extend(["subvol-create /gone", "write /gone/x 0 200K 7", "sync", "subvol-delete /gone"].map(String::from));
    }
    out.push("snapshot /sv /snap".into());
    let snap: Vec<(String, u64)> = files.iter().filter(|(f, _)| f.starts_with("/sv/")).map(|(f, n)| (f.replacen("/sv/", "/snap/", 1), *n)).collect();
    files.extend(snap);
    if r(2) == 0 {
        out.push("snapshot / /rootsnap".into());
    }
    out.push("sync".into());
    for _ in 0..6 + r(20) {
        let i = r(files.len() as u64) as usize;
        let (f, size) = files[i].clone();
        let op = r(100);
        if op < 35 {
            let off = r(size / B + 2) * B;
            let len = [100, B, 8 * B, 40 * B][r(4) as usize];
            out.push(format!("write {f} {off} {len} {}", 1 + r(249)));
            files[i].1 = size.max(off + len);
        } else if op < 45 {
            let n = r(size / B + 1) * B;
            out.push(format!("truncate {f} {n}"));
            files[i].1 = n;
        } else if op < 52 {
            out.push(format!("punch {f} {} {}", r(size / B + 1) * B, 4 * B));
        } else if op < 62 {
            // Clone within one subvolume (clones across subvolumes are
            // allowed too, on one filesystem).
            let (g, gsize) = files[r(files.len() as u64) as usize].clone();
            if gsize >= B && g != f {
                let so = r(gsize / B) * B;
                let len = (1 + r((gsize - so) / B).min(8)) * B;
                let len = len.min(gsize / B * B - so);
                if len > 0 {
                    let doff = r(size / B + 1) * B;
                    out.push(format!("clone {g} {so} {f} {doff} {len}"));
                    files[i].1 = size.max(doff + len);
                }
            }
        } else if op < 68 {
            out.push(format!("unlink {f}"));
            files.remove(i);
            if files.is_empty() {
                break;
            }
        } else {
            out.push(format!("fsync {f}"));
        }
    }
    for (f, _) in files.iter().rev().take(3) {
        out.push(format!("fsync {f}"));
    }
    out.push("crash".into());
    out.join("\n") + "\n"
}

/// Seeds beyond the default 16 that once found a bug, kept in the corpus.
/// 72: the kernel logs a deleted entry as a one-index dir log range inside
/// a range it logged before; btrkit-fsck took the overlap for damage.
/// 467: an inode logged only as existing (generation 0) whose committed
/// prealloc extent reaches past its size; replay must drop extents past the
/// size for it too, as the kernel does.
/// 1900: on a filesystem without no-holes the kernel's own replay leaves a
/// file without a hole item for a gap (btrfs check: "file extent
/// discount"); ours must leave the same, and btrkit-fsck must see it.
const REGRESSION_SEEDS: &[u64] = &[72, 467, 1900];

/// Seeded scenarios named `{prefix}{seed:03}`: seeds 1 to N (the number in
/// the environment variable `env`, 16 by default), then the `extra` seeds
/// beyond N.
fn seeded(prefix: &str, env: &str, extra: &[u64], make: fn(u64) -> String) -> Vec<Scenario> {
    let n: u64 = std::env::var(env).ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let mut seeds: Vec<u64> = (1..=n).collect();
    seeds.extend(extra.iter().filter(|&&s| s > n));
    seeds
        .into_iter()
        .map(|seed| {
            let name = format!("{prefix}{seed:03}");
            Scenario::parse(&name, &make(seed)).unwrap_or_else(|e| panic!("{name}: {e}"))
        })
        .collect()
}

fn scenarios() -> Vec<Scenario> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut all = kcrash::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    // Seeded random scenarios (`BTRKIT_RANDOM_SCENARIOS` and
    // `BTRKIT_RANDOM_NS_SCENARIOS` set how many of each family).
    all.extend(seeded("random-", "BTRKIT_RANDOM_SCENARIOS", REGRESSION_SEEDS, random_scenario));
    all.extend(seeded("random-ns-", "BTRKIT_RANDOM_NS_SCENARIOS", &[], random_ns_scenario));
    all.extend(seeded("random-clone-", "BTRKIT_RANDOM_CLONE_SCENARIOS", &[], random_clone_scenario));
    all.extend(seeded("random-quota-", "BTRKIT_RANDOM_QUOTA_SCENARIOS", &[], random_quota_scenario));
    if let Ok(only) = std::env::var("BTRKIT_SCENARIOS") {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        // `name*` keeps every scenario whose name starts with `name`.
        all.retain(|s| names.iter().any(|n| match n.strip_suffix('*') {
            Some(pre) => s.name.starts_with(pre),
            None => *n == s.name,
        }));
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
fn kernel_side(
    scn: &Scenario,
    crash: &Path,
    work: &Path,
) -> Result<KernelSide, String> {
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
    let kernel_damage = match kcrash::btrfs_check(&kcopy) {
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
    let r = btrkit_tests::fsck_support::run_fsck(img, &["--check-data-csum"], Duration::from_secs(300));
    if r.code != 0 && r.code != 4 {
        return Err(format!("btrkit-fsck: exit {}: {}", r.code, last_line(&r.stderr)));
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
    Err(format!("btrkit-fsck finds {} error(s): {}", errors.len(), errors.iter().take(5).cloned().collect::<Vec<_>>().join(" | ")))
}

/// Checks of one replayed image against the kernel's manifest.
/// `kernel_damage`: what btrfs check finds wrong with the kernel's own
/// replayed image (its damage lines), if anything. Then ours must have the
/// same damage, not none: the kernel is the reference, and some logs leave
/// it with, for example, a missing hole item on a filesystem without
/// no-holes.
fn check_replayed(what: &str, img: &Path, kernel: &Manifest, kernel_damage: Option<&Vec<String>>, work: &Path) -> Result<(), String> {
    // Every check runs, so one failure report says all that is wrong.
    let mut problems = Vec::new();
    match kcrash::super_log_root(img) {
        Ok((_, 0)) => {}
        Ok((_, l)) => problems.push(format!("log_root is {l}, not 0")),
        Err(e) => return Err(format!("{what}: {e}")),
    }
    match (kcrash::btrfs_check(img), kernel_damage) {
        (Ok(()), None) => {}
        (Ok(()), Some(k)) => problems.push(format!("btrfs check finds nothing, but on the kernel's result: {}", k.join(" | "))),
        (Err(e), None) => problems.push(e),
        (Err(e), Some(k)) => {
            let ours = damage_lines(&e);
            if &ours != k {
                problems.push(format!("btrfs check damage differs from the kernel's: ours {ours:?}, kernel's {k:?}"));
            }
        }
    }
    // btrkit-fsck must agree: clean where the kernel's result is clean,
    // and finding the damage btrfs check finds where it is not.
    match (fsck_clean(img), kernel_damage) {
        (Err(e), None) => problems.push(e),
        (Ok(()), Some(k)) => problems.push(format!("btrkit-fsck finds nothing, where btrfs check finds {}", k.join(" | "))),
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
        eprintln!("SKIP: replay_equals_kernel_on_every_scenario: {why}");
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
        eprintln!("SKIP: dump_log_on_every_scenario: {why}");
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
        eprintln!("SKIP: kcrash_py_agrees_on_the_examples: {why}");
        return;
    }
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/oracle");
    let script = shared.join("kcrash.py");
    if !script.exists() || Command::new("python3").arg("--version").output().is_err() {
        eprintln!(
            "SKIP: kcrash_py_agrees_on_the_examples: needs python3 and ../shared/oracle/kcrash.py"
        );
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
        let o = Command::new("python3")
            .arg(&script)
            .arg("run")
            .arg(&example)
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "kcrash.py run {name}: {}",
            String::from_utf8_lossy(&o.stderr)
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
        eprintln!("SKIP: loop_mount_guard_cleans_up_after_a_panic: {why}");
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
        let m = kcrash::LoopMount::mount(&img2, &mnt2, "commit=600").unwrap();
        // Keep a file open too: the guard must still get the mount away.
        std::fs::write(m.path().join("f"), b"x").unwrap();
        panic!("deliberate panic with {} mounted", m.device());
    })
    .join();
    assert!(r.is_err(), "the thread was meant to panic");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(mnt.to_str().unwrap()),
        "still mounted at {}",
        mnt.display()
    );
    let o = Command::new("losetup")
        .arg("-j")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).trim().is_empty(),
        "loop device left attached: {}",
        String::from_utf8_lossy(&o.stdout)
    );
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
