//! The seeded random workload families shared by the replay corpus and the
//! engine's differential test. Each family's size comes from its
//! environment variable (16 by default); regression seeds stay in.

#![allow(dead_code)]

use btrkit_tests::kcrash::{self, Scenario};

/// `r(n)`: a reproducible number below `n` (xorshift64 seeded from `seed`).
pub fn xorshift(seed: u64, mul: u64) -> impl FnMut(u64) -> u64 {
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
pub fn random_scenario(seed: u64) -> String {
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
        out.push(format!(
            "write {f} 0 {} {}",
            [100, 3000, 5000, 70000][r(4) as usize],
            1 + r(249)
        ));
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
            out.push(format!(
                "write {f} {} {} {}",
                [0, 4096, 10000, 65536][r(4) as usize],
                [10, 4096, 20000][r(3) as usize],
                1 + r(249)
            ));
        } else if op < 35 {
            out.push(format!(
                "truncate {f} {}",
                [0, 1000, 4096, 100000][r(4) as usize]
            ));
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
            out.push(format!(
                "punch {f} {} {}",
                [0, 4096][r(2) as usize],
                [4096, 8192][r(2) as usize]
            ));
        } else if op < 80 {
            let keep = if r(2) == 0 { " keep" } else { "" };
            out.push(format!(
                "fallocate {f} {} {}{keep}",
                [0, 8192, 100000][r(3) as usize],
                [4096, 65536][r(2) as usize]
            ));
        } else if op < 92 {
            out.push(format!("fsync {f}"));
        } else if op < 96 {
            out.push(format!("fdatasync {f}"));
        } else {
            out.push(format!(
                "fsync {}",
                ["/a", "/b", "/a/c", "/"][r(4) as usize]
            ));
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
pub fn random_ns_scenario(seed: u64) -> String {
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
        out.push(format!(
            "write {f} 0 {} {}",
            [100, 3000, 5000, 70000][r(4) as usize],
            1 + r(249)
        ));
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
            let mut inside: Vec<String> = files
                .iter()
                .chain(others.iter())
                .filter(|f| f.starts_with(&d))
                .cloned()
                .collect();
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
            let n = format!(
                "{}{}",
                ["/", "/a/", "/b/"][r(3) as usize],
                fresh(&vec!["".into()], &mut r, "r")
            );
            out.push(format!("rename {} {n}", d.trim_end_matches('/')));
            let nd = format!("{n}/");
            for f in files
                .iter_mut()
                .chain(others.iter_mut())
                .filter(|f| f.starts_with(&d))
            {
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
            out.push(format!(
                "fsync {}",
                if d == "/" {
                    "/"
                } else {
                    d.trim_end_matches('/')
                }
            ));
        } else if files.is_empty() {
            let f = fresh(&dirs, &mut r, "f");
            out.push(format!("create {f}"));
            files.push(f);
        } else {
            let f = files[r(files.len() as u64) as usize].clone();
            let op = r(100);
            if op < 22 {
                out.push(format!(
                    "write {f} {} {} {}",
                    [0, 4096, 10000, 65536][r(4) as usize],
                    [10, 4096, 20000][r(3) as usize],
                    1 + r(249)
                ));
            } else if op < 30 {
                out.push(format!(
                    "truncate {f} {}",
                    [0, 1000, 4096, 100000][r(4) as usize]
                ));
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
                out.push(format!(
                    "chmod {f} {}",
                    ["600", "644", "755"][r(3) as usize]
                ));
            } else if op < 71 {
                out.push(format!(
                    "zero-range {f} {} {}{}",
                    [0, 4096][r(2) as usize],
                    [4096, 8192][r(2) as usize],
                    if r(2) == 0 { " keep" } else { "" }
                ));
            } else if op < 76 {
                out.push(format!(
                    "punch {f} {} {}",
                    [0, 4096][r(2) as usize],
                    [4096, 8192][r(2) as usize]
                ));
            } else if op < 81 {
                let keep = if r(2) == 0 { " keep" } else { "" };
                out.push(format!(
                    "fallocate {f} {} {}{keep}",
                    [0, 8192, 100000][r(3) as usize],
                    [4096, 65536][r(2) as usize]
                ));
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
pub fn random_clone_scenario(seed: u64) -> String {
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
            let j = if r(2) == 0 {
                i
            } else {
                r(names.len() as u64) as usize
            };
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
pub fn random_quota_scenario(seed: u64) -> String {
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
        out.extend(
            [
                "subvol-create /gone",
                "write /gone/x 0 200K 7",
                "sync",
                "subvol-delete /gone",
            ]
            .map(String::from),
        );
    }
    out.push("snapshot /sv /snap".into());
    let snap: Vec<(String, u64)> = files
        .iter()
        .filter(|(f, _)| f.starts_with("/sv/"))
        .map(|(f, n)| (f.replacen("/sv/", "/snap/", 1), *n))
        .collect();
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
/// 35: a rename out of a logged directory logs its old parent at the
/// rename, while a file there that is unlinked later is still an old entry
/// (its name survives replay); logging the rename at the next fsync instead
/// took the unlink along.
pub const REGRESSION_SEEDS: &[u64] = &[35, 72, 467, 1900];

/// Seeded scenarios named `{prefix}{seed:03}`: seeds 1 to N (the number in
/// the environment variable `env`, 16 by default), then the `extra` seeds
/// beyond N.
pub fn seeded(prefix: &str, env: &str, extra: &[u64], make: fn(u64) -> String) -> Vec<Scenario> {
    let n: u64 = std::env::var(env)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
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

/// Every family, as the corpus runs them.
pub fn all_families() -> Vec<Scenario> {
    let mut all = Vec::new();
    all.extend(seeded(
        "random-",
        "BTRKIT_RANDOM_SCENARIOS",
        REGRESSION_SEEDS,
        random_scenario,
    ));
    all.extend(seeded(
        "random-ns-",
        "BTRKIT_RANDOM_NS_SCENARIOS",
        // 73: as random 35, through renames of directories and links.
        // 41: a fully logged directory logs the targets of its entries
        // that no earlier logging in the transaction logged (an xattr set
        // since on an already logged target stays out).
        // 164: a file fsynced after a truncate to 0, then logged as
        // existing (a rename): the fsynced size survives replay.
        &[41, 73, 126, 164],
        random_ns_scenario,
    ));
    all.extend(seeded(
        "random-clone-",
        "BTRKIT_RANDOM_CLONE_SCENARIOS",
        &[74],
        random_clone_scenario,
    ));
    all.extend(seeded(
        "random-quota-",
        "BTRKIT_RANDOM_QUOTA_SCENARIOS",
        &[],
        random_quota_scenario,
    ));
    all
}

/// The written scenarios: `tests/scenarios/*.scn` and the README's example
/// workload (`examples/*.scn`), which the kernel must run as it says.
pub fn corpus() -> Vec<Scenario> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = kcrash::load_dir(&root.join("scenarios")).unwrap_or_else(|e| panic!("{e}"));
    let examples = kcrash::load_dir(&root.join("../examples")).unwrap_or_else(|e| panic!("{e}"));
    all.extend(examples.into_iter().map(|mut s| {
        s.name = format!("example-{}", s.name);
        s
    }));
    all
}
