//! Times before 1970. Btrfs stores a time as signed seconds and
//! nanoseconds; a file dated 1960-01-01 (made by the kernel) must read as
//! that date through every tool: core's stat, btrkit-dump (tree and log,
//! text and JSON), btrkit-shell's stat, btrkit-restore -m, btrkit-mount,
//! and btrkit-mkfs --rootdir of a host directory holding such files
//! (read back by the kernel). They once read as 2^64 - 315,619,200
//! seconds: restore set the year 2446 and the mount's time conversion
//! panicked, leaving the directory unlistable.

use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_core::mount_view::{ReadOnlyView, ROOT_NODE};
use btrkit_tests::{require_fuse, require_kernel_mount, skip_unless, KernelImage, MkfsOpts};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 1960-01-01 00:00:00 UTC.
const T1960: (i64, u32) = (-315_619_200, 0);
/// 1969-12-31 23:59:59.5 UTC: -1 s plus half a second.
const T_HALF: (i64, u32) = (-1, 500_000_000);

fn system_time((sec, nsec): (i64, u32)) -> SystemTime {
    let whole = if sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(sec as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
    };
    whole + Duration::from_nanos(u64::from(nsec))
}

/// Set the access and modification times of `p` (a file or directory).
fn set_times(p: &Path, t: (i64, u32)) {
    let f = std::fs::File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let st = system_time(t);
    f.set_times(std::fs::FileTimes::new().set_accessed(st).set_modified(st))
        .unwrap_or_else(|e| panic!("set times of {}: {e}", p.display()));
}

/// (mtime, atime) of `p` itself as the host reads them.
fn host_times(p: &Path) -> ((i64, u32), (i64, u32)) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    (
        (m.mtime(), m.mtime_nsec() as u32),
        (m.atime(), m.atime_nsec() as u32),
    )
}

/// The names, in the image and on the host, and the time each carries.
const FILES: [(&str, (i64, u32)); 4] = [
    ("old", T1960),
    ("half", T_HALF),
    ("olddir", T1960),
    ("logged", T1960),
];

/// Files the kernel dates before 1970 in a tree it commits (`old`,
/// `half`, the directory `olddir` holding `f`), and one in its fsync log
/// only (`logged`): the image as a power failure leaves it after that
/// fsync. The returned guard keeps the kernel image (and its directory)
/// alive.
fn kernel_crash_image() -> (KernelImage, btrkit_tests::kimage::CrashCopy) {
    let k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    std::fs::write(k.path("old"), b"dated 1960\n").unwrap();
    std::fs::write(k.path("half"), b"half a second before 1970\n").unwrap();
    std::fs::create_dir(k.path("olddir")).unwrap();
    std::fs::write(k.path("olddir/f"), b"inside\n").unwrap();
    set_times(&k.path("old"), T1960);
    set_times(&k.path("half"), T_HALF);
    set_times(&k.path("olddir"), T1960);
    k.sync();
    let p = k.path("logged");
    std::fs::write(&p, b"only in the log\n").unwrap();
    set_times(&p, T1960);
    std::fs::File::open(&p).unwrap().sync_all().unwrap();
    let c = k.crash_copy("times.img");
    (k, c)
}

/// Whether any object in `v` has `key` set to {"sec": .., "nsec": ..} of `t`.
fn has_time(v: &serde_json::Value, key: &str, t: (i64, u32)) -> bool {
    match v {
        serde_json::Value::Object(o) => {
            o.get(key).is_some_and(|x| {
                x["sec"].as_i64() == Some(t.0) && x["nsec"].as_u64() == Some(u64::from(t.1))
            }) || o.values().any(|x| has_time(x, key, t))
        }
        serde_json::Value::Array(a) => a.iter().any(|x| has_time(x, key, t)),
        _ => false,
    }
}

fn bin(name: &str) -> PathBuf {
    btrkit_tests::bin_path(name)
}

fn output_ok(c: &mut Command) -> String {
    let o = c.output().expect("run");
    assert!(
        o.status.success(),
        "{c:?}: {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn kernel_times_before_1970_read_everywhere() {
    skip_unless!(require_kernel_mount());
    let (k, crash) = kernel_crash_image();
    let img = &crash.path;

    // Core: stat through the read-only view (the log replayed in memory).
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(img, false).expect("open"));
    let mut v = ReadOnlyView::open(
        vec![("times.img".into(), dev)],
        &Default::default(),
        None,
        false,
    )
    .expect("view");
    for (name, t) in FILES {
        let (_, st) = v.lookup(ROOT_NODE, name.as_bytes()).expect(name);
        assert_eq!((st.mtime, st.atime), (t, t), "core stat of {name}");
    }
    drop(v);

    // btrkit-dump tree: the inode items, text (dump-tree prints these
    // seconds unsigned) and JSON.
    let text = output_ok(
        Command::new(bin("btrkit-dump"))
            .env("TZ", "UTC")
            .args(["tree", "--tree", "fs"])
            .arg(img),
    );
    assert!(
        text.contains("\t\tmtime -315619200.0 (1960-01-01 00:00:00)"),
        "dump tree: {text}"
    );
    assert!(
        text.contains("\t\tmtime -1.500000000 (1969-12-31 23:59:59)"),
        "dump tree: {text}"
    );
    let json = output_ok(
        Command::new(bin("btrkit-dump"))
            .args(["tree", "--json", "--tree", "fs"])
            .arg(img),
    );
    assert!(json.contains(r#""mtime":{"sec":-315619200,"nsec":0}"#));
    assert!(json.contains(r#""mtime":{"sec":-1,"nsec":500000000}"#));

    // btrkit-dump log: the logged inode.
    let log = output_ok(
        Command::new(bin("btrkit-dump"))
            .args(["log", "--json"])
            .arg(img),
    );
    let log: serde_json::Value = serde_json::from_str(&log).expect("log JSON");
    assert!(
        has_time(&log, "mtime", T1960),
        "the logged inode's mtime is not 1960: {log}"
    );
    let log_text = output_ok(Command::new(bin("btrkit-dump")).arg("log").arg(img));
    assert!(
        log_text.contains("mtime -315619200.000000000 (1960-01-01 00:00:00)"),
        "{log_text}"
    );

    // btrkit-shell's stat and ls, on a copy (the shell replays the log and
    // writes its image).
    let copy = k.dir().join("shell.img");
    std::fs::copy(img, &copy).unwrap();
    let mut sh = Command::new(bin("btrkit-shell"))
        .arg(&copy)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("btrkit-shell");
    use std::io::Write;
    sh.stdin
        .take()
        .unwrap()
        .write_all(b"stat /old\nstat /half\nls /\n")
        .unwrap();
    let o = sh.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("mtime -315619200.000000000"), "{out}");
    assert!(out.contains("mtime -1.500000000"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("-315619200.000000000 logged")),
        "ls: {out}"
    );

    // btrkit-restore -m sets the same times on the host.
    let dest = k.dir().join("restored");
    output_ok(
        Command::new(bin("btrkit-restore"))
            .arg(img)
            .arg(&dest)
            .arg("-m"),
    );
    for (name, t) in FILES {
        assert_eq!(host_times(&dest.join(name)), (t, t), "restore -m of {name}");
    }
}

#[test]
fn fuse_mount_shows_times_before_1970() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let (k, crash) = kernel_crash_image();
    let m = btrkit_tests::FuseMount::mount(&[&crash.path], &k.dir().join("fuse"), &[])
        .expect("btrkit-mount");
    // The listing (which once failed with EIO) and each file's times.
    let mut names: Vec<String> = std::fs::read_dir(m.path())
        .expect("list the mount")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["half", "logged", "old", "olddir"]);
    for (name, t) in FILES {
        assert_eq!(host_times(&m.path().join(name)), (t, t), "mount: {name}");
    }
    assert_eq!(
        std::fs::read(m.path().join("olddir/f")).unwrap(),
        b"inside\n"
    );
    m.unmount().expect("unmount");
}

#[test]
fn mkfs_rootdir_keeps_times_before_1970() {
    skip_unless!(require_kernel_mount());
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("olddir")).unwrap();
    std::fs::write(root.join("old"), b"dated 1960\n").unwrap();
    std::fs::write(root.join("half"), b"half a second before 1970\n").unwrap();
    std::fs::write(root.join("olddir/f"), b"inside\n").unwrap();
    set_times(&root.join("old"), T1960);
    set_times(&root.join("half"), T_HALF);
    set_times(&root.join("olddir"), T1960);
    let want: Vec<_> = ["old", "half", "olddir"]
        .iter()
        .map(|n| (*n, host_times(&root.join(n))))
        .collect();
    assert_eq!(want[0].1, (T1960, T1960), "the host keeps 1960");

    let img = d.path().join("rootdir.img");
    output_ok(
        Command::new(bin("btrkit-mkfs"))
            .args(["-b", "256M", "--rootdir"])
            .arg(&root)
            .arg(&img),
    );
    // The kernel reads our image.
    let m =
        btrkit_tests::LoopMount::mount(&img, &d.path().join("mnt"), "ro").expect("kernel mount");
    for (name, t) in &want {
        assert_eq!(
            host_times(&m.path().join(name)),
            *t,
            "the kernel's mount of our image: {name}"
        );
    }
    drop(m);
    // And so does core.
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&img, false).expect("open"));
    let mut v = ReadOnlyView::open(
        vec![("rootdir.img".into(), dev)],
        &Default::default(),
        None,
        false,
    )
    .expect("view");
    for (name, t) in &want {
        let (_, st) = v.lookup(ROOT_NODE, name.as_bytes()).expect(name);
        assert_eq!((st.mtime, st.atime), *t, "core: {name}");
    }
}
