//! The seeded random workload families shared by the replay corpus and the
//! engine's differential test. Each family's size comes from its
//! environment variable (16 by default). The seeds that once found a bug
//! are written out in `tests/scenarios/regress-*.scn` (as the generator
//! before core's `Prng` made them), so a change of generator keeps them.

#![allow(dead_code)]

use btrkit_core::util::prng::Prng;
use btrkit_tests::kcrash::{self, Scenario};

/// `r(n)`: a reproducible number below `n` (0 when `n` is 0), from core's
/// `Prng` seeded with `seed` for the family numbered `family`.
pub fn numbers(seed: u64, family: u64) -> impl FnMut(u64) -> u64 {
    let mut g = Prng::new(Prng::derive(seed, family));
    move |n: u64| g.below(n)
}

/// A random but reproducible workload: files in a few directories, then
/// writes, truncates, links, renames, exchanges, unlinks, xattrs, punches, fallocates
/// and fsyncs in random order, a few files fsynced at the end. The kernel may
/// log or commit; whichever it does, replay must agree with it.
pub fn random_scenario(seed: u64) -> String {
    let mut r = numbers(seed, 0);
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
        } else if op < 48 && files.len() >= 2 {
            // Two files trade names; their xattrs go with the inodes.
            let g = files[r(files.len() as u64) as usize].clone();
            if g != f {
                out.push(format!("exchange {f} {g}"));
                for (p, _) in xattrs.iter_mut() {
                    if *p == f {
                        *p = g.clone();
                    } else if *p == g {
                        *p = f.clone();
                    }
                }
            }
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
    let mut r = numbers(seed, 1);
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
    let mut r = numbers(seed, 2);
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
    let mut r = numbers(seed, 3);
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

/// A fifth random family around large fallocates: on small filesystems
/// (256 or 512 MiB, data chunks of a tenth of that), free space cut into
/// pieces by deleting every other of many files, then fallocates of ranges
/// larger than a block group, larger than the longest free piece, and
/// larger than all the free space (ENOSPC, which must leave nothing of the
/// range behind), with and without keep-size, mixed with writes into the
/// preallocated ranges, punches, truncates, unlinks, syncs and fsyncs.
pub fn random_falloc_scenario(seed: u64) -> String {
    const M: u64 = 1 << 20;
    let mut r = numbers(seed, 4);
    let mut out = vec!["expect-log any".to_string()];
    let fs_mib = [256u64, 512][r(2) as usize];
    out.push(format!("fssize {fs_mib}M"));
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    out.push("mkdir /d".into());
    // Fragments: 1 MiB (or 256 KiB) files, every other one deleted later.
    let piece = [M, M / 4][r(2) as usize];
    let nfrag = (fs_mib * M / 4 / piece).min(200) as usize / 2 * 2;
    let mut used = 0u64;
    for i in 0..3 {
        out.push(format!("write /f{i} 0 4096 {}", 1 + r(249)));
    }
    for i in 0..nfrag {
        out.push(format!("write /d/g{i} 0 {piece} {}", 1 + i % 250));
        used += piece;
    }
    out.push("sync".into());
    for i in (0..nfrag).step_by(2) {
        out.push(format!("unlink /d/g{i}"));
        used -= piece;
    }
    out.push("sync".into());
    let files: Vec<String> = (0..3).map(|i| format!("/f{i}")).collect();
    let mut size = vec![4096u64; files.len()];
    // Room the fallocates below may take: well under what is free, so the
    // kernel and btrkit agree on which succeed (metadata and chunk slack
    // differ between them near a full filesystem).
    let budget = fs_mib * M / 2 - used;
    let mut taken = 0u64;
    for _ in 0..6 + r(10) {
        let i = r(files.len() as u64) as usize;
        let f = &files[i];
        let op = r(100);
        if op < 40 {
            let keep = if r(3) == 0 { " keep" } else { "" };
            let off = [0, size[i], size[i] + 4096, 4202496][r(4) as usize];
            let big = r(3) == 0;
            if big {
                // More than the whole filesystem: ENOSPC, nothing changes.
                let len = fs_mib * M * [2, 4][r(2) as usize];
                out.push(format!("fallocate {f} {off} {len}{keep} enospc-ok"));
                continue;
            }
            let left = budget.saturating_sub(taken);
            // Larger than a block group (a tenth of the filesystem) when
            // the budget allows, else what it allows.
            let want = [fs_mib * M / 8, fs_mib * M / 5, 3 * M, 64 * 1024][r(4) as usize];
            let len = want.min(left) / 4096 * 4096;
            if len == 0 {
                continue;
            }
            out.push(format!("fallocate {f} {off} {len}{keep}"));
            taken += len;
            if keep.is_empty() {
                size[i] = size[i].max(off + len);
            }
        } else if op < 55 {
            let off = r(size[i] / 4096 + 1) * 4096;
            let len = [4096, 100_000, M][r(3) as usize];
            if taken + len > budget {
                continue;
            }
            out.push(format!("write {f} {off} {len} {}", 1 + r(249)));
            taken += len;
            size[i] = size[i].max(off + len);
        } else if op < 62 {
            let off = r(size[i] / 4096 + 1) * 4096;
            out.push(format!("punch {f} {off} {}", [4096, M][r(2) as usize]));
        } else if op < 67 {
            let n = r(size[i] / 4096 + 1) * 4096;
            out.push(format!("truncate {f} {n}"));
            size[i] = n;
        } else if op < 72 {
            let j = 1 + 2 * r(nfrag as u64 / 2) as usize;
            out.push(format!("unlink /d/g{j}"));
        } else if op < 77 {
            out.push("sync".into());
        } else {
            out.push(format!("{} {f}", ["fsync", "fdatasync"][r(2) as usize]));
        }
    }
    for f in &files {
        out.push(format!("fsync {f}"));
    }
    out.push("crash".into());
    let mut text = out.join("\n") + "\n";
    // An unlink of a fragment twice would fail: drop repeats.
    let mut seen = std::collections::HashSet::new();
    text = text
        .lines()
        .filter(|l| !l.starts_with("unlink /d/g") || seen.insert(l.to_string()))
        .map(|l| format!("{l}\n"))
        .collect();
    text
}

/// A sixth random family around inodes that lose their last link while
/// open: files with hard links in several directories (one of them made in
/// the running transaction), descriptors opened on them, names removed one
/// by one and renamed, fsyncs through the descriptors before and after the
/// last name goes, writes through a descriptor of an unlinked file, and
/// O_TMPFILE files written and fsynced. After replay, a file fsynced
/// without names must be gone with nothing left behind.
pub fn random_unlinked_scenario(seed: u64) -> String {
    let mut r = numbers(seed, 5);
    let mut out = vec!["expect-log any".to_string()];
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    out.extend(["mkdir /a", "mkdir /b"].map(String::from));
    let mut dirs = vec!["/a".to_string(), "/b".to_string()];
    // Per file: its names, and the descriptor name (the path it was opened
    // by), once opened.
    struct F {
        names: Vec<String>,
        fd: Option<String>,
    }
    let mut files: Vec<F> = Vec::new();
    let mut n = 0u64;
    for _ in 0..3 + r(4) {
        n += 1;
        let p = format!("{}/f{n}", dirs[r(2) as usize]);
        out.push(format!(
            "write {p} 0 {} {}",
            [10, 5000, 70000][r(3) as usize],
            1 + r(249)
        ));
        let mut names = vec![p.clone()];
        for _ in 0..r(3) {
            n += 1;
            let q = format!("{}/l{n}", dirs[r(2) as usize]);
            out.push(format!("link {p} {q}"));
            names.push(q);
        }
        files.push(F { names, fd: None });
    }
    out.push("sync".into());
    if r(2) == 0 {
        out.push("mkdir /c".into());
        dirs.push("/c".into());
    }
    let mut tmp = 0u64;
    for _ in 0..8 + r(16) {
        let i = r(files.len() as u64) as usize;
        let op = r(100);
        let f = &mut files[i];
        if op < 20 {
            if f.fd.is_none() && !f.names.is_empty() {
                let p = f.names[r(f.names.len() as u64) as usize].clone();
                out.push(format!("open-fd {p}"));
                f.fd = Some(p);
            }
        } else if op < 42 {
            if !f.names.is_empty() {
                let k = r(f.names.len() as u64) as usize;
                let p = f.names.remove(k);
                out.push(format!("unlink {p}"));
            }
        } else if op < 52 {
            if !f.names.is_empty() {
                let k = r(f.names.len() as u64) as usize;
                n += 1;
                let q = format!("{}/r{n}", dirs[r(dirs.len() as u64) as usize]);
                out.push(format!("rename {} {q}", f.names[k]));
                f.names[k] = q;
            }
        } else if op < 58 {
            if !f.names.is_empty() {
                n += 1;
                let q = format!("{}/l{n}", dirs[r(dirs.len() as u64) as usize]);
                out.push(format!("link {} {q}", f.names[0]));
                f.names.push(q);
            }
        } else if op < 66 {
            let target = f.fd.clone().or_else(|| f.names.first().cloned());
            if let Some(t) = target {
                out.push(format!("write {t} {} 4096 {}", r(20) * 4096, 1 + r(249)));
            }
        } else if op < 84 {
            let target = f.fd.clone().or_else(|| f.names.first().cloned());
            if let Some(t) = target {
                out.push(format!("{} {t}", ["fsync", "fdatasync"][r(2) as usize]));
            }
        } else if op < 88 {
            if let Some(fd) = f.fd.take() {
                out.push(format!("close-fd {fd}"));
                if f.names.is_empty() {
                    files.remove(i);
                    if files.is_empty() {
                        break;
                    }
                }
            }
        } else if op < 93 {
            tmp += 1;
            out.push(format!("tmpfile t{tmp}"));
            out.push(format!(
                "write t{tmp} 0 {} {}",
                [10, 8192][r(2) as usize],
                1 + r(249)
            ));
            out.push(format!("fsync t{tmp}"));
        } else if op < 96 {
            out.push(format!("fsync {}", dirs[r(dirs.len() as u64) as usize]));
        } else {
            out.push("sync".into());
        }
    }
    // Every file still open is fsynced through its descriptor at the end.
    for f in &files {
        if let Some(fd) = &f.fd {
            out.push(format!("fsync {fd}"));
        }
    }
    out.push("crash".into());
    out.join("\n") + "\n"
}

/// A seventh random family around snapshots and subvolumes made and
/// deleted in directories that are then removed and made again under the
/// same names (fstests btrfs/120 and its relatives), with files created
/// and fsynced in them, fsyncs of the directories, syncs, and crashes in
/// the middle whose replay the rest of the script runs on.
pub fn random_snapshot_churn_scenario(seed: u64) -> String {
    let mut r = numbers(seed, 6);
    let mut out = vec!["expect-log any".to_string()];
    if r(10) < 3 {
        out.push("mkfs -n 4096".into());
    }
    // Top directories /t0../t2: whether each exists, the files and the
    // subvolumes (snapshots or new subvolumes) in it.
    #[derive(Default, Clone)]
    struct D {
        exists: bool,
        files: Vec<String>,
        subvols: Vec<String>,
    }
    let mut d: Vec<D> = vec![D::default(); 3];
    let mut n = 0u64;
    out.push("write /top 0 5000 7".into());
    for (i, x) in d.iter_mut().enumerate() {
        if r(3) != 0 {
            out.push(format!("mkdir /t{i}"));
            x.exists = true;
        }
    }
    if r(2) == 0 {
        out.push("sync".into());
    }
    let mut crashes = 0;
    for _ in 0..10 + r(20) {
        let i = r(d.len() as u64) as usize;
        let t = format!("/t{i}");
        let op = r(100);
        let x = &mut d[i];
        if !x.exists {
            if op < 70 {
                out.push(format!("mkdir {t}"));
                x.exists = true;
            }
            continue;
        }
        if op < 18 {
            n += 1;
            let s = format!("{t}/s{n}");
            if r(3) == 0 {
                out.push(format!("subvol-create {s}"));
            } else {
                out.push(format!("snapshot / {s}"));
            }
            x.subvols.push(s);
        } else if op < 34 {
            if !x.subvols.is_empty() {
                let k = r(x.subvols.len() as u64) as usize;
                let s = x.subvols.remove(k);
                out.push(format!("subvol-delete {s}"));
            }
        } else if op < 46 {
            // rmdir takes the directory's contents first.
            for f in x.files.drain(..) {
                out.push(format!("unlink {f}"));
            }
            for s in x.subvols.drain(..) {
                out.push(format!("subvol-delete {s}"));
            }
            out.push(format!("rmdir {t}"));
            x.exists = false;
            if r(2) == 0 {
                out.push(format!("mkdir {t}"));
                x.exists = true;
            }
        } else if op < 60 {
            n += 1;
            let f = format!("{t}/f{n}");
            out.push(format!(
                "write {f} 0 {} {}",
                [1, 10, 5000][r(3) as usize],
                1 + r(249)
            ));
            x.files.push(f);
        } else if op < 78 {
            if !x.files.is_empty() && r(2) == 0 {
                let f = &x.files[r(x.files.len() as u64) as usize];
                out.push(format!("fsync {f}"));
            } else {
                out.push(format!("fsync {t}"));
            }
        } else if op < 84 {
            out.push("fsync /".into());
        } else if op < 90 {
            out.push("sync".into());
        } else if op < 94 && crashes < 2 {
            // Everything fsynced first, so the rest of the script knows
            // what the replayed filesystem holds.
            for (j, y) in d.iter().enumerate() {
                if y.exists {
                    for f in &y.files {
                        out.push(format!("fsync {f}"));
                    }
                    out.push(format!("fsync /t{j}"));
                }
            }
            out.push("fsync /".into());
            out.push("crash".into());
            crashes += 1;
        } else {
            out.push("fsync /top".into());
        }
    }
    for (i, x) in d.iter().enumerate() {
        if x.exists {
            out.push(format!("fsync /t{i}"));
        }
    }
    out.push("crash".into());
    out.join("\n") + "\n"
}

/// Seeded scenarios named `{prefix}{seed:03}`: seeds 1 to N (the number in
/// the environment variable `env`, 16 by default).
pub fn seeded(prefix: &str, env: &str, make: fn(u64) -> String) -> Vec<Scenario> {
    let n: u64 = std::env::var(env)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    (1..=n)
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
        random_scenario,
    ));
    all.extend(seeded(
        "random-ns-",
        "BTRKIT_RANDOM_NS_SCENARIOS",
        random_ns_scenario,
    ));
    all.extend(seeded(
        "random-clone-",
        "BTRKIT_RANDOM_CLONE_SCENARIOS",
        random_clone_scenario,
    ));
    all.extend(seeded(
        "random-quota-",
        "BTRKIT_RANDOM_QUOTA_SCENARIOS",
        random_quota_scenario,
    ));
    all.extend(seeded(
        "random-falloc-",
        "BTRKIT_RANDOM_FALLOC_SCENARIOS",
        random_falloc_scenario,
    ));
    all.extend(seeded(
        "random-unlinked-",
        "BTRKIT_RANDOM_UNLINKED_SCENARIOS",
        random_unlinked_scenario,
    ));
    all.extend(seeded(
        "random-snapchurn-",
        "BTRKIT_RANDOM_SNAPCHURN_SCENARIOS",
        random_snapshot_churn_scenario,
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

/// Scenarios whose recovered tree may differ from the kernel's own run,
/// and why (log_kernel, engine_set). The expectations must still hold and
/// the image be clean.
pub const LOG_EXCEPTIONS: &[(&str, &str)] = &[
    (
        "nodesize64k-many-files",
        "with 64 KiB nodes the kernel runs out of metadata reservation while the \
         files are written and commits the transaction to reclaim it, so its files \
         are durable with their data; btrkit reserves no metadata space ahead and \
         commits only at its dirty-metadata limit, so its log has each file as \
         created by the fsync of its directory (empty). Both are what fsync promised",
    ),
    (
        "regress-random-1900",
        "without no-holes, a write into the middle of a prealloc extent: the kernel's \
         log drops the unwritten piece [32768, 65536) that its extent-map split leaves \
         outside the logged range, and its own replay loses it; btrkit logs the \
         piece as still unwritten, which replays to the same data (zeros) with the \
         allocation kept",
    ),
    (
        "regress-random-falloc-101",
        "a 51 MiB keep-size fallocate on a 256 MiB filesystem whose data space is \
         fragmented: data extents go by size class (the kernel's find_free_extent), \
         so a large extent, with no group of its class and a new chunk too small, \
         takes the longest free piece of any group. btrkit-mkfs makes a 64 MiB first \
         data chunk (mkfs.btrfs 6.2 an 8 MiB one) which the small files claimed and \
         left almost empty: the extent fits there whole, where the kernel's run on \
         mkfs.btrfs's layout cuts it into pieces and its log cannot keep the piece \
         that crosses the size. Both are what fsync promised",
    ),
    (
        "regress-random-013",
        "an inode logged only as existing (a new name of it in a logged directory) \
         after a truncate: the kernel updates inode items through delayed inodes, so \
         whether the item is copied from a leaf changed in the transaction (size 0: \
         keep the committed size at replay) or logged from memory (the current size) \
         depends on whether its leaf was rewritten for another reason; btrkit updates \
         items in place, its leaf always counts as changed, and it logs the exists \
         form. The kernel recovers the size at the fsync, btrkit's log the committed one",
    ),
    (
        "regress-random-ns-150",
        "a punch writes back the range it punches, and the whole run of dirty pages \
         it lies in goes along as one write; the kernel waits only for the ordered \
         extent inside the punched range, the rest completes in an end-io worker, \
         and here a full commit (an fsync of the parent directory) came before it: \
         the commit has the file's new size without that extent, which lands in the \
         next transaction and goes with the crash. btrkit completes ordered extents \
         as it writes them, so its commit has the data. The file was never fsynced \
         after the write; both are what fsync promised",
    ),
    (
        "link-over-unlinked-rename-parent",
        "a file renamed out of a directory that was logged only as a conflicting \
         inode (it held the file's new name at the last commit): the kernel's \
         btrfs_log_all_parents skips that directory as already logged, so its own \
         replay keeps the old name beside the new ones (three names, nlink 3). btrkit \
         logs such a parent in full (the rule that keeps \
         kernel-cannot-replay/dir-moved-from-conflicting-parent replayable), so the \
         old name goes as it went before the crash: the two names the file had. \
         Every name fsync made durable is in both",
    ),
    (
        "regress-random-ns-015",
        "as regress-random-013: an inode logged only as existing after a truncate (delayed inode item)",
    ),
];
