//! `btrkit-restore` and `btrkit-mount` against the kernel on crash images
//! of the replay corpus: what it copies out (with `-m`: names, types, modes, owners,
//! sizes, contents, `user.*` xattrs, symlink targets, device numbers, link
//! counts of files) equals what the kernel shows after its own log replay
//! of the same image, and with `--no-log` what it shows after `btrfs
//! rescue zero-log`; the image's bytes are unchanged. A `btrkit-mount` of the
//! image shows the kernel's tree (all but inode numbers and extent maps). `btrfs restore`
//! (which ignores the log) gets no path our `--no-log` restore misses.
//! Bad input gets one line and exit 16; an image that is not btrfs exit 2.
//!
//! `BTRKIT_RESTORE_SCENARIOS=N` runs every Nth corpus scenario (default 3).

use btrkit_tests::kcrash::{self, Manifest, Scenario};
use btrkit_tests::{require_kernel_mount, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "common/families.rs"]
mod families;

fn restore_bin() -> PathBuf {
    btrkit_tests::bin_path("btrkit-restore")
}

/// What a restore to a host directory keeps: inode numbers, extent maps
/// and a directory's size and link count belong to the host filesystem.
fn comparable(m: &Manifest) -> Manifest {
    let mut out = m.clone();
    for e in out.entries.values_mut() {
        e.ino = 0;
        e.alloc.clear();
        if e.kind == 'd' {
            e.size = 0;
            e.nlink = 0;
        }
    }
    out
}

/// What a FUSE mount keeps: all but inode numbers (its own, one `st_dev`
/// for every subvolume) and extent maps (FUSE has no FIEMAP).
fn without_inodes(m: &Manifest) -> Manifest {
    let mut out = m.clone();
    for e in out.entries.values_mut() {
        e.ino = 0;
        e.alloc.clear();
    }
    out
}

fn restore(img: &Path, dest: &Path, extra: &[&str]) -> Result<serde_json::Value, String> {
    let o = Command::new(restore_bin())
        .arg(img)
        .arg(dest)
        // The corpus makes device nodes and compares their numbers.
        .args(["-m", "--json", "--device-nodes"])
        .args(extra)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "btrkit-restore {extra:?} exit {:?}: {}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("report: {e}"))
}

/// A scratch btrfs mounted for the restored trees: it takes every xattr
/// the corpus sets (ext4 keeps a file's in one block) and answers FIEMAP
/// (tmpfs does not); unmounted on drop.
fn scratch(w: &Path) -> Result<btrkit_tests::LoopMount, String> {
    let img = w.join("scratch.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(2 << 30))
        .map_err(|e| e.to_string())?;
    let o = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(&img)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "mkfs scratch: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    btrkit_tests::LoopMount::mount(&img, &w.join("t"), "")
}

fn one(scn: &Scenario) -> Result<(), String> {
    let crash = kcrash::cached_crash_image(scn, &kcrash::default_cache_dir())?;
    let work = tempfile::Builder::new()
        .prefix(&format!("restore-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let t = scratch(w)?;
    let digest = kcrash::image_digest(&crash.path)?;

    // With the log, against the kernel's replay.
    let kernel_raw = kcrash::manifest_of_image(&crash.path, w)?;
    let kernel = comparable(&kernel_raw);
    let dest = t.path().join("out");
    restore(&crash.path, &dest, &["--snapshots"])?;
    let ours = comparable(&kcrash::manifest_of_tree(&dest)?);
    if ours != kernel {
        return Err(format!(
            "restored (B) differs from the kernel's replay (A):\n{}",
            kernel.short_diff(&ours, 10)
        ));
    }

    // The same through btrkit-mount: what the kernel's mount shows
    // (directory sizes and link counts as Btrfs keeps them).
    let m = btrkit_tests::FuseMount::mount(&[&crash.path], &w.join("fuse"), &[])?;
    let mounted = kcrash::manifest_of_tree(m.path());
    m.unmount()?;
    let mounted = without_inodes(&mounted?);
    let kernel_full = without_inodes(&kernel_raw);
    if mounted != kernel_full {
        return Err(format!(
            "btrkit-mount (B) differs from the kernel's replay (A):\n{}",
            kernel_full.short_diff(&mounted, 10)
        ));
    }

    // Without it, against the kernel's mount after zero-log.
    let z = w.join("zero.img");
    kcrash::copy_sparse(&crash.path, &z)?;
    let o = Command::new("btrfs")
        .args(["rescue", "zero-log"])
        .arg(&z)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!("zero-log: {}", String::from_utf8_lossy(&o.stderr)));
    }
    let zeroed = comparable(&kcrash::manifest_via_copy(
        &z,
        &w.join("zero-copy.img"),
        "ro",
    )?);
    let dest2 = t.path().join("out-nolog");
    restore(&crash.path, &dest2, &["--no-log", "--snapshots"])?;
    let ours2 = comparable(&kcrash::manifest_of_tree(&dest2)?);
    if ours2 != zeroed {
        return Err(format!(
            "--no-log (B) differs from the kernel after zero-log (A):\n{}",
            zeroed.short_diff(&ours2, 10)
        ));
    }

    // btrfs restore (no log) gets nothing our --no-log restore does not.
    let dest3 = t.path().join("progs");
    std::fs::create_dir_all(&dest3).map_err(|e| e.to_string())?;
    let _ = Command::new("btrfs")
        .args(["restore", "-i", "-x", "-S"])
        .arg(&crash.path)
        .arg(&dest3)
        .output();
    let theirs = kcrash::manifest_of_tree(&dest3)?;
    let missing: Vec<&String> = theirs
        .entries
        .keys()
        .filter(|p| !ours2.entries.contains_key(*p))
        .collect();
    if !missing.is_empty() {
        return Err(format!("btrfs restore gets what we miss: {missing:?}"));
    }
    if kcrash::image_digest(&crash.path)? != digest {
        return Err("btrkit-restore changed the image".into());
    }
    Ok(())
}

#[test]
fn restored_trees_equal_the_kernels_view() {
    skip_unless!(require_kernel_mount() && btrkit_tests::require_fuse());
    let every: usize = std::env::var("BTRKIT_RESTORE_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let corpus: Vec<Scenario> = families::corpus()
        .into_iter()
        .filter(|s| s.devices == 1)
        .step_by(every)
        .collect();
    let results = kcrash::parallel_map(&corpus, kcrash::max_jobs(), |_, s| {
        let r = one(s);
        eprintln!("{:<44} {}", s.name, if r.is_ok() { "pass" } else { "FAIL" });
        (s.name.clone(), r)
    });
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|(n, r)| r.err().map(|e| format!("--- {n}\n{e}")))
        .collect();
    eprintln!(
        "restore: {} scenarios, {} failed",
        corpus.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn bad_input_gets_one_line() {
    let t = tempfile::tempdir().unwrap();
    let junk = t.path().join("junk.img");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    for (args, code, want) in [
        (vec![junk.to_str().unwrap().to_string()], 16, "required"),
        (
            vec![
                junk.to_str().unwrap().to_string(),
                t.path().join("d").to_str().unwrap().to_string(),
            ],
            2,
            "not a btrfs",
        ),
        (
            vec![
                "/nonexistent.img".into(),
                t.path().join("d").to_str().unwrap().to_string(),
            ],
            2,
            "nonexistent",
        ),
        (vec!["--bogus".into()], 16, "bogus"),
    ] {
        let o = Command::new(restore_bin()).args(&args).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {e}");
        assert!(e.to_lowercase().contains(want), "{args:?}: {e}");
        if code == 2 {
            assert_eq!(e.trim().lines().count(), 1, "{args:?}: {e}");
        }
    }
}

#[test]
fn mount_bad_input_gets_one_line() {
    let t = tempfile::tempdir().unwrap();
    let junk = t.path().join("junk.img");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let mnt = t.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let (j, m) = (junk.to_str().unwrap(), mnt.to_str().unwrap());
    for (args, code, want) in [
        (vec![j], 16, "required"),
        (vec![j, m], 1, "not a btrfs"),
        (vec!["/nonexistent.img", m], 1, "nonexistent"),
        (vec![j, "/nonexistent-dir"], 1, "not a directory"),
        (vec![j, m, "--no-log", "--salvage"], 16, "cannot be used"),
        (vec!["--bogus"], 16, "bogus"),
    ] {
        let o = Command::new(btrkit_tests::bin_path("btrkit-mount"))
            .args(&args)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {e}");
        assert!(e.to_lowercase().contains(want), "{args:?}: {e}");
        if code == 1 {
            assert_eq!(e.trim().lines().count(), 1, "{args:?}: {e}");
        }
    }
    // Nothing was left mounted.
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!info.contains(m), "{info}");
}

/// A kernel image with one fs-tree leaf damaged on every copy. A bad
/// checksum alone: the leaf is read as it stands (as btrfs restore reads
/// it), reported, and everything is restored. Destroyed (its items
/// garbage): the files it held are lost (listed, the block named, exit 1),
/// every other file is restored with the contents the kernel showed
/// before the damage. Either way `btrfs restore -i` gets no file we do not.
#[test]
fn a_destroyed_leaf_loses_only_what_it_held() {
    skip_unless!(require_kernel_mount());
    use btrkit_core::format::consts::*;
    use btrkit_tests::fsck_support::{find_item, kernel_image, patch_block};
    let t = tempfile::tempdir().unwrap();
    let img = kernel_image(
        t.path(),
        "d.img",
        "-n 4096",
        "",
        "for d in 0 1 2 3; do mkdir d$d; for f in $(seq 1 150); do \
         head -c $((f * 37)) /dev/urandom > d$d/f$f; done; done; sync",
    );
    let before = {
        let m = btrkit_tests::LoopMount::new(&img, "ro").unwrap();
        comparable(&kcrash::manifest_of_tree(m.path()).unwrap())
    };
    // A leaf in the middle of the fs tree: the one holding the inode item
    // of the 300th inode.
    let at = find_item(&img, BTRFS_FS_TREE_OBJECTID, 300, &|k, _| {
        k.ty == BTRFS_INODE_ITEM_KEY
    })
    .expect("an inode item");
    // A flipped byte in the reserved bytes of that inode item (offset 80
    // to 112 of btrfs_inode_item): only the checksum notices.
    let off = at.data_off + 90;
    patch_block(&img, at.bytenr, true, false, &|b| b[off] ^= 0xff);
    let files = |m: &Manifest| -> Vec<String> {
        m.entries
            .iter()
            .filter(|(_, e)| e.kind == 'f')
            .map(|(p, _)| p.clone())
            .collect()
    };
    let run = |out: &Path, code: i32| -> serde_json::Value {
        let o = Command::new(restore_bin())
            .arg(&img)
            .arg(out)
            .args(["-m", "--json"])
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(code),
            "{}{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
                .chars()
                .take(1500)
                .collect::<String>()
        );
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let progs = |out: &Path| -> Manifest {
        std::fs::create_dir_all(out).unwrap();
        let _ = Command::new("btrfs")
            .args(["restore", "-i"])
            .arg(&img)
            .arg(out)
            .output()
            .unwrap();
        kcrash::manifest_of_tree(out).unwrap()
    };
    let r = run(&t.path().join("csum"), 0);
    assert_eq!(r["bad_csum_blocks"][0], at.bytenr, "{r}");
    let ours = comparable(&kcrash::manifest_of_tree(&t.path().join("csum")).unwrap());
    assert_eq!(files(&ours).len(), files(&before).len());

    // Now garbage over its items: nothing in it can be trusted.
    patch_block(&img, at.bytenr, true, true, &|b| {
        for (i, x) in b[101..].iter_mut().enumerate() {
            *x = (i * 7) as u8;
        }
    });
    let out = t.path().join("out");
    let r = run(&out, 1);
    let lost = r["lost"].as_array().cloned().unwrap_or_default();
    assert!(
        lost.iter().any(|l| l["what"]
            .as_str()
            .unwrap_or("")
            .contains(&at.bytenr.to_string())),
        "no loss names block {}: {r}",
        at.bytenr
    );
    let ours = comparable(&kcrash::manifest_of_tree(&out).unwrap());
    for p in files(&ours) {
        assert_eq!(ours.entries.get(&p), before.entries.get(&p), "{p}");
    }
    let theirs = comparable(&progs(&t.path().join("progs")));
    // Their files with the right contents (btrfs restore also writes files
    // it could not read right).
    let right = |m: &Manifest| -> Vec<String> {
        files(m)
            .into_iter()
            .filter(|p| m.entries.get(p) == before.entries.get(p))
            .collect()
    };
    let (n_ours, n_theirs, n_all) = (
        files(&ours).len(),
        right(&theirs).len(),
        files(&before).len(),
    );
    eprintln!(
        "destroyed leaf: btrkit-restore {n_ours} of {n_all} files right, btrfs restore -i {n_theirs} right of {}",
        files(&theirs).len()
    );
    let missing: Vec<String> = right(&theirs)
        .into_iter()
        .filter(|p| !ours.entries.contains_key(p))
        .collect();
    assert!(
        missing.is_empty(),
        "btrfs restore -i gets right what we miss: {missing:?}"
    );
    assert!(n_ours < n_all, "{n_ours} of {n_all} restored");

    // btrkit-mount of the same image: the same files readable, each with
    // the contents the kernel showed; the image unchanged.
    if !btrkit_tests::require_fuse() {
        return;
    }
    let digest = kcrash::image_digest(&img).unwrap();
    let m = btrkit_tests::FuseMount::mount(&[&img], &t.path().join("fuse"), &[]).unwrap();
    let readable = readable_files(m.path());
    m.unmount().unwrap();
    let right_mounted: Vec<&String> = readable
        .iter()
        .filter(|(p, md5)| before.entries.get(*p).and_then(|e| e.md5.as_ref()) == Some(md5))
        .map(|(p, _)| p)
        .collect();
    eprintln!(
        "destroyed leaf: btrkit-mount {} of {n_all} files readable and right",
        right_mounted.len()
    );
    assert_eq!(
        right_mounted.len(),
        n_ours,
        "mount and restore read the same files"
    );
    assert_eq!(
        readable.len(),
        n_ours,
        "a file read through the mount is wrong"
    );
    assert_eq!(
        kcrash::image_digest(&img).unwrap(),
        digest,
        "btrkit-mount changed the image"
    );
}

/// Regular files under `root` that can be listed and read whole, with
/// their md5: what a user gets out of a damaged mount by copying it.
fn readable_files(root: &Path) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    // Bounded: a tool may write a tree that nests without end.
    let mut budget = 1_000_000u32;
    while let Some((dir, rel)) = stack.pop() {
        budget = budget.saturating_sub(1);
        if budget == 0 {
            break;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for d in rd.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let (p, r) = (d.path(), format!("{rel}/{name}"));
            match std::fs::symlink_metadata(&p) {
                Ok(md) if md.is_dir() => stack.push((p, r)),
                // A damaged image may give a file an absurd size (sparse
                // on the host): those are told apart by size alone.
                Ok(md) if md.is_file() && md.len() > 64 << 20 => {
                    out.insert(r, format!("size {}", md.len()));
                }
                Ok(md) if md.is_file() => {
                    if let Ok(data) = std::fs::read(&p) {
                        out.insert(r, btrkit_tests::kcrash::md5_hex(&data));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Regular files under `root` with their md5 (whatever could be read).
fn files_md5(root: &Path) -> std::collections::BTreeMap<String, String> {
    readable_files(root)
}

/// The btrfs-progs fsck fixtures (clean and corrupt images): btrkit-restore
/// never crashes or hangs on them, never writes them, and gets every file
/// right that `btrfs restore -i` gets right. "Right" is what the kernel
/// shows of the image (a read-only mount of a copy) where it mounts; where
/// it does not, a file both tools restore must have the same contents, and
/// every file btrfs restore writes must be restored by us too, but for
/// files whose data fails its checksum (btrfs restore verifies none; we
/// list them as lost: metadump images hold no data).
#[test]
fn progs_fixtures_restore_at_least_what_btrfs_restore_does() {
    use btrkit_tests::fixtures::{fsck_fixture, fsck_fixture_names, run_bounded};
    use std::time::Duration;
    skip_unless!(
        require_kernel_mount(),
        btrkit_tests::require_shared().is_some()
    );
    let names = fsck_fixture_names();
    assert!(
        !names.is_empty(),
        "no btrfs-progs fsck fixtures in ../shared"
    );
    let mut problems = Vec::new();
    let (mut ours_total, mut theirs_total, mut with_truth) = (0usize, 0usize, 0usize);
    for name in &names {
        let Ok(img) = fsck_fixture(name) else {
            continue;
        };
        let t = tempfile::tempdir().unwrap();
        let digest = kcrash::image_digest(&img).unwrap();
        let ours_dir = t.path().join("ours");
        let mut c = Command::new(restore_bin());
        c.arg(&img).arg(&ours_dir).arg("--json");
        let o = run_bounded(c, Duration::from_secs(120));
        if o.timed_out || o.crashed() || !matches!(o.code(), Some(0..=2)) {
            problems.push(format!("{name}: btrkit-restore {}", o.describe()));
            continue;
        }
        if kcrash::image_digest(&img).unwrap() != digest {
            problems.push(format!("{name}: btrkit-restore changed the image"));
        }
        let theirs_dir = t.path().join("theirs");
        std::fs::create_dir_all(&theirs_dir).unwrap();
        let mut c = Command::new("btrfs");
        c.args(["restore", "-i"]).arg(&img).arg(&theirs_dir);
        let _ = run_bounded(c, Duration::from_secs(120));
        let (ours, theirs) = (files_md5(&ours_dir), files_md5(&theirs_dir));
        // Files we refused because their data fails its checksum: what
        // btrfs restore (which checks none) writes of them is not right.
        let report: serde_json::Value = serde_json::from_str(&o.stdout).unwrap_or_default();
        let bad_data: std::collections::BTreeSet<String> = report["lost"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| {
                l["what"]
                    .as_str()
                    .unwrap_or("")
                    .contains("checksum mismatch")
            })
            .filter_map(|l| l["path"].as_str().map(str::to_string))
            .collect();
        // The kernel's view, where a copy mounts read-only.
        let copy = t.path().join("copy.img");
        kcrash::copy_sparse(&img, &copy).unwrap();
        let truth = btrkit_tests::LoopMount::new(&copy, "ro")
            .ok()
            .map(|m| files_md5(m.path()));
        let right = |got: &std::collections::BTreeMap<String, String>| -> usize {
            match &truth {
                Some(k) => got.iter().filter(|(p, s)| k.get(*p) == Some(*s)).count(),
                None => got.len(),
            }
        };
        ours_total += right(&ours);
        theirs_total += match &truth {
            Some(_) => right(&theirs),
            None => theirs.keys().filter(|p| !bad_data.contains(*p)).count(),
        };
        with_truth += usize::from(truth.is_some());
        let missed: Vec<&String> = theirs
            .iter()
            .filter(|(p, s)| match &truth {
                Some(k) => k.get(*p) == Some(*s) && ours.get(*p) != Some(*s),
                None => !ours.contains_key(*p) && !bad_data.contains(*p),
            })
            .map(|(p, _)| p)
            .collect();
        if !missed.is_empty() {
            problems.push(format!(
                "{name}: btrfs restore -i gets right what btrkit-restore misses: {missed:?}"
            ));
        }
        if truth.is_none() {
            let differ: Vec<&String> = theirs
                .iter()
                .filter(|(p, s)| ours.get(*p).is_some_and(|o| o != *s))
                .map(|(p, _)| p)
                .collect();
            if !differ.is_empty() {
                problems.push(format!(
                    "{name}: contents differ from btrfs restore's (no kernel view): {differ:?}"
                ));
            }
        }
    }
    eprintln!(
        "progs fixtures: {} images ({with_truth} with a kernel view): btrkit-restore {ours_total} files right, btrfs restore -i {theirs_total}",
        names.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `btrkit-mount -f` serves until Ctrl-C (SIGINT), then unmounts and
/// exits 0; what it serves is the image's tree.
#[test]
fn mount_in_the_foreground_unmounts_on_ctrl_c() {
    skip_unless!(require_kernel_mount() && btrkit_tests::require_fuse());
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"contents").unwrap();
    let img = t.path().join("img");
    let o = Command::new(btrkit_tests::bin_path("btrkit-mkfs"))
        .arg("-q")
        .args(["-b", "256M", "-r"])
        .arg(&src)
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mnt = t.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let mut child = Command::new(btrkit_tests::bin_path("btrkit-mount"))
        .arg(&img)
        .arg(&mnt)
        .arg("-f")
        .spawn()
        .unwrap();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&format!(" {} ", mnt.display()))
    };
    let start = std::time::Instant::now();
    while !mounted() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "btrkit-mount -f exited"
        );
        assert!(start.elapsed().as_secs() < 60, "not mounted after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let read = std::fs::read(mnt.join("d/f"));
    let o = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(o.success());
    let st = child.wait().unwrap();
    assert_eq!(read.unwrap(), b"contents");
    assert!(st.success(), "{st:?}");
    assert!(!mounted(), "still mounted after Ctrl-C");
}

/// Peak resident set (KiB: anonymous and mapped pages, `ru_maxrss`) of
/// `args` run to its end, and whether it succeeded: measured by a python3
/// parent whose only child it is (this test process has other children).
fn peak_rss_kib(args: &[&std::ffi::OsStr]) -> (bool, i64) {
    let o = Command::new("python3")
        .arg("-c")
        .arg(
            "import resource, subprocess, sys\n\
             r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n\
             print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
        )
        .args(args)
        .output()
        .expect("python3");
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut w = t.split_whitespace();
    let rc: i32 = w.next().and_then(|x| x.parse().ok()).unwrap_or(-1);
    let kib: i64 = w.next().and_then(|x| x.parse().ok()).unwrap_or(i64::MAX);
    (rc == 0, kib)
}

/// A restore's memory is bounded whatever the image holds: the engine's
/// caches are trimmed as it goes, the reader's lead is bounded and the
/// image's mapped pages are let go. An image holding four times the bound
/// in file data (and thousands of files) restores in less than the bound;
/// before, the whole image ended up mapped into the process.
#[test]
fn restore_memory_is_bounded() {
    if !btrkit_tests::fixtures::have_cmd("python3") {
        btrkit_tests::env::skip("python3 is not installed");
        return;
    }
    const BOUND_KIB: i64 = 96 << 10;
    let d = tempfile::tempdir().expect("tempdir");
    let src = d.path().join("src");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut total = 0u64;
    for dir in 0..40 {
        let sub = src.join(format!("d{dir:02}"));
        std::fs::create_dir_all(&sub).expect("mkdir");
        for f in 0..250 {
            // 16-80 KiB of bytes no compression would shrink.
            let len = 16384 + (seed % 65536) as usize;
            let mut data = vec![0u8; len];
            for b in data.chunks_mut(8) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let w = seed.to_le_bytes();
                b.copy_from_slice(&w[..b.len()]);
            }
            total += len as u64;
            std::fs::write(sub.join(format!("f{f:03}")), &data).expect("write");
        }
    }
    assert!(
        total > 4 * (BOUND_KIB as u64) * 1024,
        "{total} bytes of data"
    );
    let img = d.path().join("i.img");
    btrkit_tests::hostile::mkfs_rootdir_image(&src, &img, "1G").expect("mkfs");
    let out = d.path().join("out");
    let bin = restore_bin();
    let (ok, kib) = peak_rss_kib(&[
        bin.as_os_str(),
        "-q".as_ref(),
        img.as_os_str(),
        out.as_os_str(),
    ]);
    assert!(ok, "restore failed");
    let files = walkdir_count(&out);
    assert_eq!(files, 40 * 250, "files restored");
    assert!(
        kib < BOUND_KIB,
        "peak RSS {kib} KiB for {total} bytes of data: not bounded by {BOUND_KIB} KiB"
    );
}

fn walkdir_count(p: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(p).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            n += walkdir_count(&e.path());
        } else {
            n += 1;
        }
    }
    n
}
