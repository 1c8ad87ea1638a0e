//! `btrkit device add|remove|replace start` against the kernel's: a
//! filesystem grows from one device to three and back, converted on the
//! way, with a device replaced while present and another rebuilt while
//! missing (from a mirror and from RAID5 parity) and one removed while
//! missing; at each step every file,
//! extent and share as before, the same profiles, devices and sizes as
//! the kernel's same step, btrfs check 6.2 and 6.14 clean, every copy and
//! parity verified, and the kernel writes to the result.

use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sets::{device_opts, extents_of, fsck_clean, write_files};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, env, kcrash, skip_unless};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn new_file(p: &Path, size: u64) -> PathBuf {
    std::fs::File::create(p).unwrap().set_len(size).unwrap();
    p.to_path_buf()
}

fn btrkit(args: &[&str]) -> String {
    let o = must_run(Command::new(bin_path("btrkit")).args(args));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn btrkit_fails(args: &[&str]) -> String {
    let o = Command::new(bin_path("btrkit"))
        .args(args)
        .output()
        .unwrap();
    assert!(!o.status.success(), "btrkit {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Files, extents (logical, length, flags) and the kernel's view of the
/// devices: (devid, size) of each, used bytes by type and profile.
#[derive(Debug, PartialEq)]
struct View {
    files: String,
    extents: Vec<String>,
    devices: Vec<(u64, u64)>,
    used: BTreeMap<String, u64>,
}

/// The kernel forgets every device it scanned and holds no more: the
/// copies here share an fsid, and a copy's device detached since would
/// otherwise stand for its devid in the next mount.
fn forget() {
    let _ = Command::new("btrfs")
        .args(["device", "scan", "--forget"])
        .output();
}

fn view(devs: &[PathBuf], extra: &str) -> View {
    forget();
    let opts = format!("ro{extra}{}", device_opts(devs));
    let m = LoopMount::new(&devs[0], &opts).unwrap();
    let files = kcrash::manifest_of_tree(m.path()).unwrap().render();
    let extents = extents_of(m.path());
    let show = must_run(
        Command::new("btrfs")
            .args(["filesystem", "show", "--raw"])
            .arg(m.path()),
    );
    let mut devices: Vec<(u64, u64)> = String::from_utf8_lossy(&show.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"devid")).then(|| (f[1].parse().unwrap(), f[3].parse().unwrap()))
        })
        .collect();
    devices.sort_unstable();
    let df = must_run(
        Command::new("btrfs")
            .args(["filesystem", "df", "--raw"])
            .arg(m.path()),
    );
    let used = String::from_utf8_lossy(&df.stdout)
        .lines()
        .filter(|l| !l.starts_with("GlobalReserve"))
        .filter_map(|l| {
            let (k, rest) = l.split_once(':')?;
            let u = rest.split("used=").nth(1)?.trim().parse().ok()?;
            Some((k.to_string(), u))
        })
        .collect();
    drop(m);
    View {
        files,
        extents,
        devices,
        used,
    }
}

fn clean(devs: &[PathBuf], what: &str) {
    for p in [Progs::Distro, Progs::New] {
        if matches!(p, Progs::New) && !env::require_progs_new() {
            continue;
        }
        let v = oracle::btrfs_check(devs, p).unwrap();
        assert!(v.clean, "{what}: btrfs check {p:?}:\n{}", v.output);
    }
    fsck_clean(devs).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Loop devices for `files`, detached on drop.
struct Loops(Vec<PathBuf>);
impl Loops {
    fn new(files: &[PathBuf]) -> Loops {
        Loops(
            files
                .iter()
                .map(|f| btrkit_tests::mount::attach_loop(f).unwrap())
                .collect(),
        )
    }
}
impl Drop for Loops {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = btrkit_tests::mount::detach_loop(l);
        }
    }
}

/// The kernel runs `btrfs ARGS... MNT` (`{N}` in ARGS: the loop device of
/// `extra[N]`) on a mount of `devs` with `opts`.
fn kernel(devs: &[PathBuf], opts: &str, extra: &[PathBuf], args: &[&str]) {
    forget();
    let loops = Loops::new(devs);
    let xl = Loops::new(extra);
    let mut o: Vec<String> = loops.0[1..]
        .iter()
        .map(|l| format!("device={}", l.display()))
        .collect();
    if !opts.is_empty() {
        o.push(opts.into());
    }
    let mnt = tempfile::tempdir().unwrap();
    must_run(
        Command::new("mount")
            .arg("-o")
            .arg(o.join(","))
            .arg(&loops.0[0])
            .arg(mnt.path()),
    );
    let a: Vec<String> = args
        .iter()
        .map(
            |x| match x.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
                Some(n) => xl.0[n.parse::<usize>().unwrap()].display().to_string(),
                None => x.to_string(),
            },
        )
        .collect();
    let r = Command::new("btrfs")
        .args(&a)
        .arg(mnt.path())
        .output()
        .unwrap();
    must_run(Command::new("umount").arg(mnt.path()));
    assert!(
        r.status.success(),
        "kernel: btrfs {a:?}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
}

fn copies(devs: &[PathBuf], dir: &Path, prefix: &str) -> Vec<PathBuf> {
    btrkit_tests::sets::copy_set(devs, dir, prefix).unwrap()
}

/// Ours and the kernel's after the same step agree.
fn agree(ours: &[PathBuf], theirs: &[PathBuf], before: &View, what: &str) {
    agree_as(ours, theirs, before, what, true)
}

/// [`agree`], the profiles compared only when `profiles`.
fn agree_as(ours: &[PathBuf], theirs: &[PathBuf], before: &View, what: &str, profiles: bool) {
    clean(ours, what);
    let (o, k) = (view(ours, ""), view(theirs, ""));
    assert!(o.files == before.files, "{what}: files differ from before");
    assert!(
        o.extents == before.extents,
        "{what}: extents or sharing differ from before"
    );
    assert_eq!(o.devices, k.devices, "{what}: devices (devid, size)");
    if profiles {
        assert_eq!(
            o.used.keys().collect::<Vec<_>>(),
            k.used.keys().collect::<Vec<_>>(),
            "{what}: profiles"
        );
    }
    let data = |v: &View| {
        v.used
            .iter()
            .filter(|(k, _)| k.starts_with("Data"))
            .map(|(_, u)| *u)
            .sum::<u64>()
    };
    assert_eq!(data(&o), data(&k), "{what}: data used");
}

#[test]
fn devices_come_and_go_as_with_the_kernel() {
    skip_unless!(env::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let g = 1u64 << 30;
    let d1 = new_file(&t.path().join("d1.img"), 2 * g);
    must_run(
        Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-d", "single", "-m", "dup"])
            .arg(&d1),
    );
    {
        let m = LoopMount::new(&d1, "").unwrap();
        write_files(m.path());
        must_run(
            Command::new("btrfs")
                .args(["subvolume", "snapshot"])
                .arg(m.path())
                .arg(m.path().join("snap")),
        );
        std::fs::write(m.path().join("dir0/f0"), b"after the snapshot").unwrap();
        must_run(
            Command::new("cp")
                .arg("--reflink=always")
                .arg(m.path().join("dir1/f3"))
                .arg(m.path().join("clone")),
        );
    }
    let before = view(std::slice::from_ref(&d1), "");
    let kd1 = copies(std::slice::from_ref(&d1), t.path(), "k");

    // add, then raid1.
    let d2 = new_file(&t.path().join("d2.img"), 2 * g);
    let k2 = new_file(&t.path().join("k2.img"), 2 * g);
    btrkit(&["device", "add", s(&d2), s(&d1)]);
    kernel(
        &kd1,
        "",
        std::slice::from_ref(&k2),
        &["device", "add", "{0}"],
    );
    let (ours, theirs) = (
        vec![d1.clone(), d2.clone()],
        vec![kd1[0].clone(), k2.clone()],
    );
    agree(&ours, &theirs, &before, "device add");
    btrkit(&[
        "balance",
        "start",
        "-dconvert=raid1",
        "-mconvert=raid1",
        s(&d1),
        s(&d2),
    ]);
    kernel(
        &theirs,
        "",
        &[],
        &["balance", "start", "-dconvert=raid1", "-mconvert=raid1"],
    );
    agree(&ours, &theirs, &before, "convert to raid1");

    // Refusals, nothing written.
    let e = btrkit_fails(&["device", "remove", "2", s(&d1), s(&d2)]);
    assert!(e.contains("unable to go below 2 devices on raid1"), "{e}");
    let e = btrkit_fails(&["device", "add", s(&d2), s(&d1), s(&d2)]);
    assert!(e.contains("already a device"), "{e}");
    let other = new_file(&t.path().join("other.img"), g);
    must_run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&other));
    let e = btrkit_fails(&["device", "add", s(&other), s(&d1), s(&d2)]);
    assert!(e.contains("--force"), "{e}");
    let small = new_file(&t.path().join("small.img"), g);
    let e = btrkit_fails(&["device", "replace", "start", "2", s(&small), s(&d1), s(&d2)]);
    assert!(e.contains("smaller"), "{e}");
    agree(&ours, &theirs, &before, "after refusals");

    // Replace device 2 while present.
    let d3 = new_file(&t.path().join("d3.img"), 3 * g);
    let k3 = new_file(&t.path().join("k3.img"), 3 * g);
    btrkit(&["device", "replace", "start", "2", s(&d3), s(&d1), s(&d2)]);
    kernel(
        &theirs,
        "",
        std::slice::from_ref(&k3),
        &["replace", "start", "-B", "2", "{0}"],
    );
    let (ours, theirs) = (
        vec![d1.clone(), d3.clone()],
        vec![kd1[0].clone(), k3.clone()],
    );
    agree(&ours, &theirs, &before, "replace while present");
    // The device replaced is nobody's: its superblocks are scratched.
    assert!(btrkit_core::image::read_superblock(
        &btrkit_core::io::FileDevice::open(&d2, false).unwrap(),
        0
    )
    .is_err());

    // Device 2 lost: rebuilt from its mirror onto a new one.
    let d4 = new_file(&t.path().join("d4.img"), 3 * g);
    let k4 = new_file(&t.path().join("k4.img"), 3 * g);
    let o = must_run(Command::new(bin_path("btrkit")).args([
        "device",
        "replace",
        "start",
        "--json",
        "2",
        s(&d4),
        s(&d1),
    ]));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        r["rebuilt"].as_u64().unwrap() > 0 && r["rebuilt"] == r["copied"],
        "{r}"
    );
    kernel(
        &theirs[..1],
        "degraded",
        std::slice::from_ref(&k4),
        &["replace", "start", "-B", "2", "{0}"],
    );
    let (ours, theirs) = (
        vec![d1.clone(), d4.clone()],
        vec![kd1[0].clone(), k4.clone()],
    );
    // The kernel's degraded read-write mount puts what it writes before
    // the replace in new single chunks; btrkit writes nothing there.
    agree_as(
        &ours,
        &theirs,
        &before,
        "replace of a missing device",
        false,
    );
    assert!(
        view(&ours, "").used.keys().all(|k| k.ends_with("RAID1")),
        "the rebuilt filesystem keeps RAID1 only"
    );
    // What a kernel user does next: those single chunks back to RAID1.
    kernel(
        &theirs,
        "",
        &[],
        &[
            "balance",
            "start",
            "-dconvert=raid1,soft",
            "-mconvert=raid1,soft",
        ],
    );

    // A third device, RAID5 data; then one lost and rebuilt from parity.
    let d5 = new_file(&t.path().join("d5.img"), 2 * g);
    let k5 = new_file(&t.path().join("k5.img"), 2 * g);
    btrkit(&["device", "add", s(&d5), s(&d1), s(&d4)]);
    kernel(
        &theirs,
        "",
        std::slice::from_ref(&k5),
        &["device", "add", "{0}"],
    );
    let (ours, theirs) = (
        vec![d1.clone(), d4.clone(), d5.clone()],
        vec![kd1[0].clone(), k4.clone(), k5.clone()],
    );
    btrkit(&[
        "balance",
        "start",
        "-dconvert=raid5",
        s(&d1),
        s(&d4),
        s(&d5),
    ]);
    kernel(&theirs, "", &[], &["balance", "start", "-dconvert=raid5"]);
    agree(&ours, &theirs, &before, "raid5 on three devices");
    let d6 = new_file(&t.path().join("d6.img"), 2 * g);
    btrkit(&["device", "replace", "start", "3", s(&d6), s(&d1), s(&d4)]);
    let ours = vec![d1.clone(), d4.clone(), d6.clone()];
    clean(&ours, "raid5 device rebuilt from parity");
    let v = view(&ours, "");
    assert!(
        v.files == before.files && v.extents == before.extents,
        "rebuilt from parity: files differ"
    );

    // Device 3 lost for good: removed while missing, what it held
    // rebuilt from parity onto the other two (the kernel removes it
    // present).
    btrkit(&["device", "remove", "missing", s(&d1), s(&d4)]);
    kernel(&theirs, "", &[], &["device", "remove", "3"]);
    let (ours, theirs) = (
        vec![d1.clone(), d4.clone()],
        vec![kd1[0].clone(), k4.clone()],
    );
    agree(&ours, &theirs, &before, "a missing device removed");

    // Back to one device: single data, dup metadata, device 1 removed by
    // its path.
    btrkit(&[
        "balance",
        "start",
        "-dconvert=single",
        "-mconvert=dup",
        "-f",
        s(&d1),
        s(&d4),
    ]);
    kernel(
        &theirs,
        "",
        &[],
        &[
            "balance",
            "start",
            "-dconvert=single",
            "-mconvert=dup",
            "-f",
        ],
    );
    btrkit(&["device", "remove", s(&d1), s(&d1), s(&d4)]);
    kernel(&theirs, "", &[], &["device", "remove", "1"]);
    let (ours, theirs) = (vec![d4.clone()], vec![k4.clone()]);
    agree(&ours, &theirs, &before, "back to one device");
    let sb = btrkit_tests::kimage::superblock_of(&d4);
    assert_eq!(sb.num_devices.get(), 1);
    let e = btrkit_core::image::read_superblock(
        &btrkit_core::io::FileDevice::open(&d1, false).unwrap(),
        0,
    );
    assert!(e.is_err(), "a removed device keeps its superblock");
    // The kernel writes to what is left.
    let m = LoopMount::new(&d4, "").unwrap();
    std::fs::create_dir(m.path().join("later")).unwrap();
    write_files(&m.path().join("later"));
    drop(m);
    clean(&ours, "written by the kernel");
}
