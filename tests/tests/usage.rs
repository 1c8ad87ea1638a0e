//! `btrkit filesystem usage|df|du|compsize` against the kernel and compsize
//! on loop mounts of the same images: kernel-made ones (zstd and lzo
//! compressed files, reflinks, a snapshot, holes, inline files, a hard link,
//! preallocation), btrkit-mkfs ones and a two-device RAID1 set. The
//! kernel's tools run on a read-only mount of the image (the image is not
//! changed), the statfs of a read-write mount on a copy. Bad input: one
//! line, a non-zero exit, no panic.

use btrkit_tests::mount::LoopMount;
use btrkit_tests::{env, sets, skip_unless};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tool` runs (`--version` or `--help`), else the test skips.
fn require_tool(tool: &str) -> bool {
    let ok = ["--version", "--help"].iter().any(|a| {
        Command::new(tool)
            .arg(a)
            .output()
            .is_ok_and(|o| o.status.success() || !o.stdout.is_empty() || !o.stderr.is_empty())
    });
    if !ok {
        env::skip(&format!("{tool} not found"));
    }
    ok
}

fn btrkit(args: &[&str], images: &[PathBuf]) -> Value {
    let mut c = Command::new(btrkit_tests::bin_path("btrkit"));
    c.args(["filesystem"])
        .arg(args[0])
        .args(images)
        .args(&args[1..]);
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "btrkit {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `btrfs filesystem usage -b`: the Overall lines by label (first number),
/// and each section's numbers in order.
fn kernel_usage(mnt: &Path) -> (BTreeMap<String, String>, Vec<(String, Vec<u64>)>) {
    let out = run(Command::new("btrfs")
        .args(["filesystem", "usage", "-b"])
        .arg(mnt));
    let mut overall = BTreeMap::new();
    let mut sections: Vec<(String, Vec<u64>)> = Vec::new();
    let mut in_overall = false;
    for line in out.lines() {
        if line == "Overall:" {
            in_overall = true;
            continue;
        }
        if line.is_empty() {
            in_overall = false;
            continue;
        }
        if in_overall {
            let (label, rest) = line.trim().split_once(':').unwrap();
            overall.insert(label.to_string(), rest.trim().to_string());
        } else if !line.starts_with(' ') {
            let nums = line
                .split_once(':')
                .unwrap()
                .1
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect::<Vec<u64>>();
            let name = line.split(':').next().unwrap().to_string();
            // Size, Used (the percentage's digits dropped).
            sections.push((name, nums.into_iter().take(2).collect()));
        } else {
            let n = line.split_whitespace().last().unwrap().parse().unwrap();
            sections.last_mut().unwrap().1.push(n);
        }
    }
    (overall, sections)
}

fn first_u64(s: &str) -> u64 {
    s.split_whitespace().next().unwrap().parse().unwrap()
}

/// Our usage report against the kernel's on `mnt`; `ro` when `mnt` is a
/// read-only mount (its statfs differs).
fn check_usage(ours: &Value, mnt: &Path, ro: bool) {
    let (k, sections) = kernel_usage(mnt);
    let u = |f: &str| {
        ours[f]
            .as_u64()
            .unwrap_or_else(|| ours[f].as_i64().unwrap() as u64)
    };
    for (label, field) in [
        ("Device size", "device_size"),
        ("Device allocated", "device_allocated"),
        ("Device unallocated", "device_unallocated"),
        ("Device missing", "device_missing"),
        ("Device slack", "device_slack"),
        ("Used", "used"),
        ("Free (estimated)", "free_estimated"),
        ("Global reserve", "global_reserve"),
    ] {
        assert_eq!(
            first_u64(&k[label]),
            u(field),
            "{label}: kernel {k:?}\nours {ours}"
        );
    }
    let min: u64 = k["Free (estimated)"]
        .split("min: ")
        .nth(1)
        .unwrap()
        .trim_end_matches(')')
        .parse()
        .unwrap();
    assert_eq!(min, u("free_min"));
    // A read-only mount's statfs leaves out the free space of block
    // groups it holds read-only, which is not modelled exactly yet: only
    // the read-write mount's (what df shows in use) is compared.
    if !ro {
        let statfs = ours["statfs"]["available"].as_u64().unwrap();
        assert_eq!(first_u64(&k["Free (statfs, df)"]), statfs, "statfs");
    }
    for (label, field) in [
        ("Data ratio", "data_ratio"),
        ("Metadata ratio", "metadata_ratio"),
    ] {
        assert_eq!(
            k[label],
            format!("{:.2}", ours[field].as_f64().unwrap()),
            "{label}"
        );
    }
    // Sections: type,profile Size Used then per device; Unallocated last.
    let mut want: Vec<(String, Vec<u64>)> = Vec::new();
    let mut profiles: Vec<&Value> = ours["profiles"].as_array().unwrap().iter().collect();
    profiles.sort_by_key(|p| {
        let f = p["flags"].as_u64().unwrap();
        (f & 7 == 2, f & 7, f)
    });
    for p in profiles {
        let mut v = vec![p["size"].as_u64().unwrap(), p["used"].as_u64().unwrap()];
        v.extend(
            p["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d[1].as_u64().unwrap()),
        );
        want.push((
            format!(
                "{},{}",
                p["kind"].as_str().unwrap(),
                p["profile"].as_str().unwrap()
            ),
            v,
        ));
    }
    want.push((
        "Unallocated".into(),
        ours["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["unallocated"].as_i64().unwrap() as u64)
            .collect(),
    ));
    assert_eq!(sections, want);
}

/// `btrfs filesystem df -b` lines against ours.
fn check_df(ours: &Value, mnt: &Path) {
    let out = run(Command::new("btrfs")
        .args(["filesystem", "df", "-b"])
        .arg(mnt));
    let want: Vec<String> = ours
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}, {}: total={}, used={}",
                p["type"].as_str().unwrap(),
                p["profile"].as_str().unwrap(),
                p["total"],
                p["used"]
            )
        })
        .collect();
    assert_eq!(out.lines().collect::<Vec<_>>(), want);
}

/// `btrfs filesystem du --raw`: (total, exclusive, set shared, path from
/// the top).
fn kernel_du(mnt: &Path, summarize: bool) -> Vec<(u64, u64, Option<u64>, String)> {
    let mut c = Command::new("btrfs");
    c.args(["filesystem", "du", "--raw"]);
    if summarize {
        c.arg("-s");
    }
    let out = run(c.arg(mnt));
    let prefix = mnt.display().to_string();
    out.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let p = f[3..].join(" ");
            let rel = p.strip_prefix(&prefix).unwrap();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().ok(),
                if rel.is_empty() {
                    "/".to_string()
                } else {
                    rel.to_string()
                },
            )
        })
        .collect()
}

fn ours_du(v: &Value) -> Vec<(u64, u64, Option<u64>, String)> {
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["total"].as_u64().unwrap(),
                e["exclusive"].as_u64().unwrap(),
                e["set_shared"].as_u64(),
                e["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// compsize -b: the "Processed" counts and each row's numbers.
fn kernel_compsize(mnt: &Path) -> Vec<Vec<String>> {
    let out = run(Command::new("compsize").arg("-b").arg(mnt));
    out.lines()
        .filter(|l| !l.starts_with("Type"))
        .map(|l| {
            l.split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

fn ours_compsize(v: &Value) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    if v["files"].as_u64().unwrap() > 1 {
        out.push(
            format!(
                "Processed {} files {} regular extents {} refs {} inline.",
                v["files"], v["extents"], v["refs"], v["inline"]
            )
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        );
    }
    for b in std::iter::once(&v["total"]).chain(v["types"].as_array().unwrap().iter()) {
        let disk = b["disk"].as_u64().unwrap();
        let unc = b["uncompressed"].as_u64().unwrap();
        out.push(vec![
            b["kind"].as_str().unwrap().to_string(),
            format!("{}%", disk * 100 / unc.max(1)),
            disk.to_string(),
            unc.to_string(),
            b["referenced"].to_string(),
        ]);
    }
    out
}

/// Every command against the kernel's tools on a read-only mount of
/// `images`, then usage's statfs against a read-write mount of a copy.
fn compare_all(images: &[PathBuf], work: &Path) {
    let usage = btrkit(&["usage", "--json"], images);
    let df = btrkit(&["df", "--json"], images);
    let du = btrkit(&["du", "--json"], images);
    let du_s = btrkit(&["du", "-s", "--json"], images);
    let comp = btrkit(&["compsize", "--json"], images);
    let mut opts = sets::device_opts(images);
    if !opts.is_empty() {
        opts.push(',');
    }
    let m = LoopMount::new(&images[0], &format!("{opts}ro")).unwrap();
    check_usage(&usage, m.path(), true);
    check_df(&df, m.path());
    assert_eq!(ours_du(&du), kernel_du(m.path(), false), "du");
    assert_eq!(ours_du(&du_s), kernel_du(m.path(), true), "du -s");
    let paths = kernel_du(m.path(), false);
    if let Some((_, _, _, sub)) = paths.iter().find(|p| p.3.matches('/').count() == 2) {
        // A path below the top, and two at once.
        let d = btrkit(
            &["du", "-s", "--json", "--path", sub, "--path", "/"],
            images,
        );
        let mut c = Command::new("btrfs");
        c.args(["filesystem", "du", "--raw", "-s"])
            .arg(m.path().join(sub.trim_start_matches('/')))
            .arg(m.path());
        let out = run(&mut c);
        let k: Vec<(u64, u64, String)> = out
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].to_string(),
                )
            })
            .collect();
        let o: Vec<(u64, u64, String)> = ours_du(&d)
            .into_iter()
            .map(|e| (e.0, e.1, e.2.map_or("-".into(), |v| v.to_string())))
            .collect();
        assert_eq!(o, k, "du -s of {sub} and /");
    }
    if comp["total"]["uncompressed"].as_u64().unwrap() > 0 {
        assert_eq!(ours_compsize(&comp), kernel_compsize(m.path()), "compsize");
    }
    m.unmount().unwrap();
    for i in images {
        // The kernel's read-only mount changed nothing our next read sees.
        assert!(i.exists());
    }
    let copies = sets::copy_set(images, &work.join("rw"), "c").unwrap();
    let m = LoopMount::new(&copies[0], &sets::device_opts(&copies)).unwrap();
    check_usage(&usage, m.path(), false);
    m.unmount().unwrap();
}

/// The files of the kernel-made images: compressed (zstd, lzo),
/// reflinked, sparse, inline, hard-linked, preallocated, snapshotted.
fn write_rich(mnt: &Path) {
    let mut g = btrkit_core::util::prng::Prng::new(52);
    let mut rnd = |n: usize| {
        let mut v = vec![0u8; n];
        g.fill(&mut v);
        v
    };
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/random"), rnd(3 << 20)).unwrap();
    std::fs::write(mnt.join("d/text"), b"hello world\n".repeat(400_000)).unwrap();
    std::fs::write(mnt.join("small"), b"tiny inline file\n").unwrap();
    std::fs::write(mnt.join("d/inline2"), b"x".repeat(2000)).unwrap();
    run(Command::new("cp")
        .arg("--reflink=always")
        .arg(mnt.join("d/random"))
        .arg(mnt.join("d/random.clone")));
    // A partial reflink into the middle of another file.
    std::fs::write(mnt.join("d/mixed"), rnd(1 << 20)).unwrap();
    run(Command::new("xfs_io")
        .arg("-c")
        .arg(format!(
            "reflink {} 65536 262144 131072",
            mnt.join("d/random").display()
        ))
        .arg(mnt.join("d/mixed")));
    // Holes: a sparse file and a punched one.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(mnt.join("d/sparse")).unwrap();
        f.write_all_at(&rnd(70000), 1 << 20).unwrap();
        f.set_len(4 << 20).unwrap();
    }
    run(Command::new("fallocate")
        .args(["-l", "1M"])
        .arg(mnt.join("d/prealloc")));
    std::fs::hard_link(mnt.join("d/text"), mnt.join("d/text.link")).unwrap();
    run(&mut Command::new("sync"));
}

fn kernel_image(dir: &Path) -> PathBuf {
    let img = dir.join("k.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    run(Command::new("mkfs.btrfs").arg("-q").arg(&img));
    {
        let m = LoopMount::new(&img, "compress=zstd").unwrap();
        write_rich(m.path());
        m.unmount().unwrap();
    }
    {
        let m = LoopMount::new(&img, "compress-force=lzo").unwrap();
        std::fs::create_dir(m.path().join("lzo")).unwrap();
        std::fs::write(m.path().join("lzo/text"), b"lzo text ".repeat(300_000)).unwrap();
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(m.path())
            .arg(m.path().join("snap")));
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.path().join("sub")));
        std::fs::write(m.path().join("sub/f"), b"in a subvolume ".repeat(10_000)).unwrap();
        // Change the original after the snapshot: its leaves are COWed.
        std::fs::write(
            m.path().join("d/after"),
            b"written after the snapshot".repeat(1000),
        )
        .unwrap();
        m.unmount().unwrap();
    }
    img
}

#[test]
fn kernel_image_matches_the_kernel_and_compsize() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        require_tool("compsize"),
        require_tool("xfs_io")
    );
    let t = tempfile::tempdir().unwrap();
    let img = kernel_image(t.path());
    let before = std::fs::read(&img).unwrap();
    compare_all(std::slice::from_ref(&img), t.path());
    assert!(
        std::fs::read(&img).unwrap() == before,
        "btrkit or the ro mount wrote the image"
    );
}

#[test]
fn btrkit_mkfs_image_matches_the_kernel() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        require_tool("compsize")
    );
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("b.img");
    let o = Command::new(btrkit_tests::bin_path("btrkit-mkfs"))
        .args(["-q", "-b", "300M"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    {
        let m = LoopMount::new(&img, "compress=zstd").unwrap();
        sets::write_files(m.path());
        m.unmount().unwrap();
    }
    compare_all(&[img], t.path());
}

#[test]
fn raid1_set_matches_the_kernel() {
    skip_unless!(
        env::require_kernel_mount(),
        env::require_btrfs_progs(),
        require_tool("compsize")
    );
    let set = sets::KernelSet::new(2, &["-m", "raid1", "-d", "raid1"]);
    let t = tempfile::tempdir().unwrap();
    compare_all(&set.paths, t.path());
}

#[test]
fn bad_input_is_one_line_and_an_exit() {
    let t = tempfile::tempdir().unwrap();
    let junk = t.path().join("junk.img");
    std::fs::write(&junk, vec![0x5au8; 1 << 20]).unwrap();
    let empty = t.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    for img in [&junk, &empty, &t.path().join("absent.img")] {
        for cmd in ["usage", "df", "du", "compsize"] {
            let o = Command::new(btrkit_tests::bin_path("btrkit"))
                .args(["filesystem", cmd])
                .arg(img)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{cmd} {}: {err}", img.display());
            assert_eq!(err.lines().count(), 1, "{cmd}: {err}");
            assert!(err.starts_with("btrkit: error: "), "{err}");
        }
    }
    // A usage error.
    let o = Command::new(btrkit_tests::bin_path("btrkit"))
        .args(["filesystem", "usage"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(16));
}

#[test]
fn corrupt_image_never_panics() {
    skip_unless!(env::require_btrfs_progs());
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("c.img");
    let o = Command::new(btrkit_tests::bin_path("btrkit-mkfs"))
        .args(["-q", "-b", "160M"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let clean = std::fs::read(&img).unwrap();
    // Flip bytes across the metadata area, one image each.
    let mut g = btrkit_core::util::prng::Prng::new(7);
    for i in 0..24 {
        let mut b = clean.clone();
        let at = 0x10000 + g.below((b.len() - 0x10000) as u64 / 64) as usize * 64 % (48 << 20);
        for k in 0..64 {
            b[at + k] ^= 0xa5;
        }
        std::fs::write(&img, &b).unwrap();
        for cmd in ["usage", "df", "du", "compsize"] {
            let o = Command::new(btrkit_tests::bin_path("btrkit"))
                .args(["filesystem", cmd])
                .arg(&img)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!err.contains("panicked"), "flip {i} at {at}: {cmd}: {err}");
            assert!(o.status.code().is_some_and(|c| c <= 1), "{cmd}: {err}");
            if !o.status.success() {
                assert_eq!(
                    err.lines()
                        .filter(|l| l.starts_with("btrkit: error"))
                        .count(),
                    1,
                    "{err}"
                );
            }
        }
    }
}
