//! btrkit-mkfs against the oracles: every image passes `btrfs check
//! --readonly` and `btrkit-fsck --check-data-csum` with no finding, and
//! mounts (and still checks clean after the kernel wrote to it); `--rootdir` copies read back through the kernel
//! equal the source; bad input is refused with one line and no valid image.

use btrkit_tests::oracle::{self, Progs};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join(name);
    if !p.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", name])
            .status()
            .unwrap();
        assert!(st.success());
    }
    p
}

fn have_progs() -> bool {
    Command::new("btrfs").arg("--version").output().is_ok()
}

use btrkit_tests::sys::is_root;
use btrkit_tests::LoopMount;

/// Root, loop devices and btrfs in the kernel (probed once, quietly: the
/// tests skip only their mount part).
fn can_mount() -> bool {
    btrkit_tests::mount::probe().is_ok()
}

fn mkfs(args: &[&str], img: &Path) -> Output {
    Command::new(bin("btrkit-mkfs"))
        .args(args)
        .arg(img)
        .output()
        .unwrap()
}

fn check(img: &Path) {
    oracle::assert_btrfs_check_clean(&[img], Progs::Distro, &img.display().to_string());
    // btrkit-fsck, data checksums included, finds nothing either: no error
    // and no warning.
    let r = btrkit_tests::fsck_support::run_fsck(
        img,
        &["--check-data-csum", "--check-mirrors"],
        std::time::Duration::from_secs(120),
    );
    let findings = r.json()["findings"]
        .as_array()
        .map(|a| a.len())
        .unwrap_or(usize::MAX);
    assert!(
        r.code == 0 && findings == 0,
        "btrkit-fsck {}: exit {}, {findings} findings:\n{}{}",
        img.display(),
        r.code,
        r.stdout,
        r.stderr
    );
}

/// A loop mount that is undone even when the test fails.
fn mount(img: &Path, opts: &str) -> LoopMount {
    LoopMount::new(img, opts).unwrap_or_else(|e| panic!("mount {} failed: {e}", img.display()))
}

#[test]
fn every_csum_and_nodesize_checks_clean_and_mounts() {
    if !have_progs() {
        btrkit_tests::skip("btrfs-progs not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for csum in ["crc32c", "xxhash", "sha256", "blake2"] {
        for ns in ["4096", "16384", "65536"] {
            let img = t.path().join(format!("{csum}-{ns}.img"));
            let o = mkfs(&["-q", "-b", "256M", "-n", ns, "--csum", csum], &img);
            assert!(
                o.status.success(),
                "mkfs {csum} {ns}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            check(&img);
            if can_mount() {
                let m = mount(&img, "rw");
                std::fs::write(m.path().join("f"), vec![7u8; 300_000]).unwrap();
                drop(m);
                check(&img);
            }
        }
    }
    if !can_mount() {
        btrkit_tests::skip_part("mount", "needs root, loop devices and btrfs in the kernel");
    }
}

#[test]
fn features_and_options() {
    if !have_progs() {
        btrkit_tests::skip("btrfs-progs not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for (i, extra) in [
        vec!["-O", "^no-holes"],
        vec!["-O", "^skinny-metadata", "-R", "^free-space-tree"],
        vec!["-O", "block-group-tree"],
        vec![
            "-L",
            "mylabel",
            "-U",
            "0f0e0d0c-0b0a-4908-8706-050403020100",
        ],
    ]
    .iter()
    .enumerate()
    {
        let img = t.path().join(format!("f{i}.img"));
        let mut args = vec!["-q", "-b", "300M"];
        args.extend(extra.iter());
        let o = mkfs(&args, &img);
        assert!(
            o.status.success(),
            "mkfs {extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        check(&img);
        if i == 3 {
            let o = Command::new("btrfs")
                .args(["inspect-internal", "dump-super"])
                .arg(&img)
                .output()
                .unwrap();
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(
                s.contains("mylabel") && s.contains("0f0e0d0c-0b0a-4908-8706-050403020100"),
                "{s}"
            );
        }
    }
}

fn make_source(root: &Path) {
    use std::io::Write;
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::create_dir_all(root.join("many")).unwrap();
    let mut g = btrkit_core::util::prng::Prng::new(12345);
    let mut rnd = |n: usize| -> Vec<u8> {
        let mut v = vec![0u8; n];
        g.fill(&mut v);
        v
    };
    std::fs::write(root.join("tiny"), b"x").unwrap();
    std::fs::write(root.join("inline2000"), rnd(2000)).unwrap();
    std::fs::write(root.join("a/4096"), rnd(4096)).unwrap();
    std::fs::write(root.join("a/b/big"), rnd(3 << 20)).unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    // Sparse: data, hole, data, trailing hole.
    let f = std::fs::File::create(root.join("sparse")).unwrap();
    f.set_len(20 << 20).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(root.join("sparse"))
        .unwrap();
    f.write_all(&rnd(10000)).unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(9 << 20)).unwrap();
    f.write_all(&rnd(70000)).unwrap();
    std::fs::hard_link(root.join("tiny"), root.join("a/tiny-link")).unwrap();
    std::fs::hard_link(root.join("tiny"), root.join("a/b/c/tiny-link2")).unwrap();
    std::os::unix::fs::symlink("../tiny", root.join("a/sym")).unwrap();
    std::os::unix::fs::symlink(
        "/nonexistent/target/of/a/dangling/link",
        root.join("dangling"),
    )
    .unwrap();
    for i in 0..1500 {
        std::fs::write(root.join(format!("many/file-{i:05}")), rnd(i % 300)).unwrap();
    }
    std::fs::set_permissions(root.join("a/4096"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o711)).unwrap();
    if is_root() {
        std::os::unix::fs::chown(root.join("a/4096"), Some(1234), Some(5678)).unwrap();
    }
    let _ = Command::new("setfattr")
        .args(["-n", "user.color", "-v", "blue"])
        .arg(root.join("a/4096"))
        .status();
    let _ = Command::new("setfattr")
        .args(["-n", "user.empty"])
        .arg(root.join("tiny"))
        .status();
    let _ = Command::new("setfattr")
        .args(["-n", "user.dir", "-v", "0x00ff00ff"])
        .arg(root.join("a"))
        .status();
    // An access ACL (user::rw-, user:1000:r--, group::r--, mask::r--,
    // other::r--) and a default ACL on a directory, as setfacl stores
    // them, and a security.* attribute: the kernel reads them back.
    let acl = "0x02000000010006000000000002000400e8030000040004000000000010000400000000002000040000000000";
    for (name, path) in [
        ("system.posix_acl_access", "a/4096"),
        ("system.posix_acl_default", "a/b"),
    ] {
        let _ = Command::new("setfattr")
            .args(["-n", name, "-v", acl])
            .arg(root.join(path))
            .status();
    }
    let _ = Command::new("setfattr")
        .args(["-n", "security.btrkit", "-v", "label"])
        .arg(root.join("inline2000"))
        .status();
    // Special files: a FIFO, a socket and (as root) a character and a
    // block device.
    btrkit_tests::sys::mkfifo(&root.join("fifo"), 0o640).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    if is_root() {
        btrkit_core::io::host::mknod(&root.join("null-ish"), libc::S_IFCHR | 0o600, (1, 3))
            .unwrap();
        btrkit_core::io::host::mknod(&root.join("blk"), libc::S_IFBLK | 0o600, (7, 200)).unwrap();
    }
}

/// Everything a user sees of a tree: per path, type, mode, uid, gid, size,
/// link count, mtime, symlink target or content hash, xattrs.
fn describe(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let m = std::fs::symlink_metadata(&p).unwrap();
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        let kind = if m.is_dir() {
            "d"
        } else if t.is_symlink() {
            "l"
        } else if t.is_fifo() {
            "p"
        } else if t.is_socket() {
            "s"
        } else if t.is_char_device() || t.is_block_device() {
            "dev"
        } else {
            "f"
        };
        let body = if m.is_file() {
            let d = std::fs::read(&p).unwrap();
            format!(
                "{:016x}",
                d.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64)
                    .wrapping_mul(0x100000001b3))
            )
        } else if m.file_type().is_symlink() {
            std::fs::read_link(&p).unwrap().display().to_string()
        } else if kind == "dev" {
            format!("rdev {:x}", m.rdev())
        } else {
            String::new()
        };
        let size = if m.is_dir() { 0 } else { m.len() };
        let nlink = if m.is_dir() { 0 } else { m.nlink() };
        let xa = Command::new("getfattr")
            .args(["-h", "-d", "-m", "-", "--absolute-names"])
            .arg(&p)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .skip(1)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let mtime = if m.file_type().is_symlink() {
            0
        } else {
            m.mtime()
        };
        out.push(format!(
            "{} {kind} {:o} {}:{} {size} {nlink} {mtime} {body} [{xa}]",
            rel.display(),
            m.mode(),
            m.uid(),
            m.gid()
        ));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn rootdir_copy_equals_source() {
    if !have_progs() {
        btrkit_tests::skip("btrfs-progs not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_source(&src);
    for (i, extra) in [
        vec![],
        vec!["-n", "4096", "-O", "^no-holes", "--csum", "xxhash"],
        vec!["-n", "65536", "--csum", "blake2"],
    ]
    .iter()
    .enumerate()
    {
        let img = t.path().join(format!("r{i}.img"));
        let mut args = vec!["-q", "-b", "512M", "-r", src.to_str().unwrap()];
        args.extend(extra.iter());
        let o = mkfs(&args, &img);
        assert!(
            o.status.success(),
            "mkfs --rootdir {extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        check(&img);
        if !can_mount() {
            btrkit_tests::skip_part("mount comparison", "needs root and loop devices");
            continue;
        }
        let m = mount(&img, "ro");
        let (want, got) = (describe(&src), describe(m.path()));
        let diff: Vec<_> = want
            .iter()
            .zip(got.iter())
            .filter(|(a, b)| a != b)
            .take(5)
            .collect();
        assert_eq!(want.len(), got.len(), "entry count differs");
        assert!(
            diff.is_empty(),
            "{extra:?}: differences (source, image): {diff:#?}"
        );
    }
}

#[test]
fn rootdir_enospc_fails_cleanly_and_keeps_last_commit() {
    if !have_progs() {
        btrkit_tests::skip("btrfs-progs not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // 30,000 files of 8 KiB: 240 MiB of data (and several commits) into 200 MiB.
    let block: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    for d in 0..30 {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for i in 0..1000 {
            std::fs::write(dir.join(format!("f{i}")), &block).unwrap();
        }
    }
    let img = t.path().join("full.img");
    let o = mkfs(&["-q", "-b", "200M", "-r", src.to_str().unwrap()], &img);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "mkfs should fail with ENOSPC");
    assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
    assert!(err.contains("no space"), "{err}");
    check(&img);
    if can_mount() {
        let m = mount(&img, "ro");
        let n = std::fs::read_dir(m.path()).unwrap().count();
        assert!(n > 0, "some directories were committed before the failure");
    }
}

#[test]
fn bad_input_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("x.img");
    let one_line = |o: &Output, want: &str| {
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "should fail: {want}");
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
        assert!(e.to_lowercase().contains(want), "want '{want}' in: {e}");
    };
    one_line(&mkfs(&["-b", "10M"], &img), "too small");
    one_line(&mkfs(&["-b", "300M", "-n", "12288"], &img), "nodesize");
    one_line(&mkfs(&["-b", "300M", "-n", "131072"], &img), "nodesize");
    one_line(
        &mkfs(&["-b", "300M", "-O", "frobnicate"], &img),
        "unknown feature",
    );
    one_line(&mkfs(&["-b", "300M", "--csum", "md5"], &img), "checksum");
    one_line(
        &mkfs(&["-b", "300M", "-r", "/nonexistent/dir"], &img),
        "nonexistent",
    );
    // An existing filesystem is not overwritten without -f.
    let o = mkfs(&["-q", "-b", "300M"], &img);
    assert!(o.status.success());
    let before = std::fs::read(&img).unwrap();
    one_line(&mkfs(&["-b", "300M"], &img), "already contains a btrfs");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "refused mkfs changed the image"
    );
    assert!(mkfs(&["-q", "-f", "-b", "300M"], &img).status.success());
    // An unreadable source file (checked as an unprivileged user) is
    // reported before the image is touched.
    if is_root() && Command::new("setpriv").arg("--version").output().is_ok() {
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("secret"), b"data").unwrap();
        std::fs::set_permissions(src.join("secret"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = t.path().join("u.img");
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin("btrkit-mkfs"))
            .args(["-b", "300M", "-r", src.to_str().unwrap()])
            .arg(&out)
            .output()
            .unwrap();
        one_line(&o, "secret");
        assert!(
            !out.exists()
                || std::fs::metadata(&out).unwrap().len() == 0
                || btrkit_core::image::read_superblock(
                    &btrkit_core::io::FileDevice::open(&out, false).unwrap(),
                    0
                )
                .is_err()
        );
    } else {
        btrkit_tests::skip_part("unreadable source", "needs root and setpriv");
    }
}

// ---------------------------------------------------------------------------
// Several devices

fn mkfs_set(args: &[&str], imgs: &[PathBuf]) -> Output {
    Command::new(bin("btrkit-mkfs"))
        .args(args)
        .args(imgs)
        .output()
        .unwrap()
}

/// The profiles the kernel reports for the mounted set (`btrfs filesystem
/// df`): "Data, RAID1", "Metadata, RAID10"...
fn kernel_profiles(mnt: &Path) -> Vec<String> {
    let o = Command::new("btrfs")
        .args(["filesystem", "df"])
        .arg(mnt)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split(':').next())
        .filter(|l| !l.starts_with("GlobalReserve"))
        .map(str::to_string)
        .collect()
}

/// Every profile on sets of 2 to 4 devices, devices of different sizes
/// among them: `btrfs check` and btrkit-fsck (every copy) find the set
/// clean; the kernel mounts it, reports the profiles asked for, takes
/// files that outgrow the first data chunk (new chunks by the kernel),
/// and the set still checks clean after.
#[test]
fn sets_of_every_profile_check_clean_and_mount() {
    btrkit_tests::skip_unless!(btrkit_tests::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let cases: &[(&[u64], &str, &str, &str, &str)] = &[
        (&[512, 512], "raid1", "raid1", "RAID1", "RAID1"),
        (&[512, 384], "", "", "single", "RAID1"),
        (&[300, 512, 400], "raid1c3", "raid0", "RAID0", "RAID1C3"),
        (
            &[512, 512, 512, 512],
            "raid10",
            "raid10",
            "RAID10",
            "RAID10",
        ),
        (
            &[400, 400, 400, 600],
            "raid1c4",
            "raid1c3",
            "RAID1C3",
            "RAID1C4",
        ),
        (&[512, 512], "dup", "single", "single", "DUP"),
        (&[512, 300], "raid0", "dup", "DUP", "RAID0"),
        (&[512, 512, 512], "raid1", "raid10", "RAID10", "RAID1"),
        (&[512], "single", "dup", "DUP", "single"),
        (&[512], "raid0", "raid0", "RAID0", "RAID0"),
    ];
    for (i, (sizes, m, d, want_data, want_meta)) in cases.iter().enumerate() {
        let imgs: Vec<PathBuf> = sizes
            .iter()
            .enumerate()
            .map(|(j, mib)| {
                let p = t.path().join(format!("s{i}-{j}.img"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(mib << 20)
                    .unwrap();
                p
            })
            .collect();
        let mut args = vec!["-q", "-f"];
        if !m.is_empty() {
            args.extend(["-m", m, "-d", d]);
        }
        let o = mkfs_set(&args, &imgs);
        let what = format!("{sizes:?} -m {m} -d {d}");
        assert!(
            o.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        oracle::check_set_clean(&imgs).unwrap_or_else(|e| panic!("{what}: {e}"));
        btrkit_tests::sets::fsck_clean(&imgs).unwrap_or_else(|e| panic!("{what}: {e}"));
        {
            let opts = format!("rw{}", btrkit_tests::sets::device_opts(&imgs));
            let m = LoopMount::mount(&imgs[0], &t.path().join(format!("m{i}")), &opts)
                .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
            let profiles = kernel_profiles(m.path());
            assert!(
                profiles.contains(&format!("Data, {want_data}"))
                    && profiles.contains(&format!("Metadata, {want_meta}"))
                    && profiles.contains(&format!("System, {want_meta}")),
                "{what}: the kernel reports {profiles:?}"
            );
            // More than the first data chunk holds: the kernel allocates.
            let block: Vec<u8> = (0..1 << 20)
                .map(|x: u32| (x * 7 + i as u32) as u8)
                .collect();
            for f in 0..96 {
                std::fs::write(m.path().join(format!("f{f}")), &block).unwrap();
            }
            m.unmount().unwrap();
        }
        oracle::check_set_clean(&imgs)
            .unwrap_or_else(|e| panic!("{what}, after the kernel wrote: {e}"));
        btrkit_tests::sets::fsck_clean(&imgs)
            .unwrap_or_else(|e| panic!("{what}, after the kernel wrote: {e}"));
        for p in &imgs {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `--rootdir` onto a RAID10 set of four: the kernel reads back the source
/// exactly; the set checks clean.
#[test]
fn rootdir_onto_a_set() {
    btrkit_tests::skip_unless!(btrkit_tests::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_source(&src);
    let imgs: Vec<PathBuf> = (1..=4)
        .map(|i| t.path().join(format!("r{i}.img")))
        .collect();
    let o = mkfs_set(
        &[
            "-q",
            "-b",
            "400M",
            "-m",
            "raid1c3",
            "-d",
            "raid10",
            "-r",
            src.to_str().unwrap(),
        ],
        &imgs,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    oracle::check_set_clean(&imgs).unwrap();
    btrkit_tests::sets::fsck_clean(&imgs).unwrap();
    let opts = format!("ro{}", btrkit_tests::sets::device_opts(&imgs));
    let m = LoopMount::mount(&imgs[0], &t.path().join("m"), &opts).unwrap();
    let (want, got) = (describe(&src), describe(m.path()));
    assert_eq!(want, got, "the set differs from the source");
}

/// Sets refused with one line, nothing written to an existing image and no
/// file left behind that was not there.
#[test]
fn set_bad_input_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let p = |n: &str| t.path().join(n);
    let one_line = |o: &Output, want: &str| {
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "should fail: {want}");
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
        assert!(e.to_lowercase().contains(want), "want '{want}' in: {e}");
    };
    let (a, b, c) = (p("a.img"), p("b.img"), p("c.img"));
    one_line(
        &mkfs_set(&["-b", "300M", "-m", "raid1"], std::slice::from_ref(&a)),
        "needs at least 2 devices",
    );
    assert!(!a.exists(), "a refused mkfs left {}", a.display());
    one_line(
        &mkfs_set(
            &["-b", "300M", "-d", "raid1c4"],
            &[a.clone(), b.clone(), c.clone()],
        ),
        "needs at least 4 devices",
    );
    one_line(
        &mkfs_set(&["-b", "300M", "-d", "raid6"], &[a.clone(), b.clone()]),
        "needs at least 3 devices",
    );
    one_line(
        &mkfs_set(
            &["-b", "300M", "-O", "raid-stripe-tree", "-d", "raid5"],
            &[a.clone(), b.clone(), c.clone()],
        ),
        "raid-stripe-tree",
    );
    one_line(
        &mkfs_set(&["-b", "300M", "-d", "raid7"], &[a.clone(), b.clone()]),
        "unknown profile",
    );
    one_line(&mkfs_set(&["-b", "300M"], &[a.clone(), a.clone()]), "twice");
    for f in [&a, &b, &c] {
        assert!(!f.exists(), "a refused mkfs left {}", f.display());
    }
    // An existing filesystem among the devices: refused without -f, and
    // no device is touched.
    assert!(mkfs_set(&["-q", "-b", "300M"], std::slice::from_ref(&a))
        .status
        .success());
    let before = std::fs::read(&a).unwrap();
    one_line(
        &mkfs_set(&["-b", "300M"], &[b.clone(), a.clone()]),
        "already contains",
    );
    assert_eq!(std::fs::read(&a).unwrap(), before);
    // A profile the devices cannot take: the existing image is unchanged.
    one_line(
        &mkfs_set(
            &["-f", "-b", "300M", "-m", "raid1c3"],
            &[a.clone(), b.clone()],
        ),
        "needs at least 3 devices",
    );
    assert_eq!(
        std::fs::read(&a).unwrap(),
        before,
        "a refused mkfs -f changed the image"
    );
    // A device too small for its share.
    let (big, small) = (p("big.img"), p("small.img"));
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    std::fs::File::create(&small)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    one_line(&mkfs_set(&[], &[big, small]), "too small");
}

/// Mixed block groups (`-M`), on one device and on sets: one-sector nodes
/// by default, one DATA|METADATA profile (the kernel reports
/// "Data+Metadata"), clean before and after the kernel fills it past the
/// first chunk; a node size other than the sector or two different
/// profiles are refused as mkfs.btrfs refuses them.
#[test]
fn mixed_block_groups_on_one_device_and_on_sets() {
    btrkit_tests::skip_unless!(btrkit_tests::require_kernel_mount());
    let t = tempfile::tempdir().unwrap();
    for (i, (n, args, want)) in [
        (1, &["-M"][..], "single"),
        (1, &["-M", "-d", "dup"][..], "DUP"),
        (2, &["-M", "-m", "raid1", "-d", "raid1"][..], "RAID1"),
        (3, &["-M", "-d", "raid1c3"][..], "RAID1C3"),
    ]
    .iter()
    .enumerate()
    {
        let imgs: Vec<PathBuf> = (0..*n)
            .map(|j| t.path().join(format!("x{i}-{j}.img")))
            .collect();
        let mut a = vec!["-b", "300M", "--json"];
        a.extend(args.iter());
        let o = mkfs_set(&a, &imgs);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["summary"]["node_size"], 4096, "{args:?}");
        oracle::check_set_clean(&imgs).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        btrkit_tests::sets::fsck_clean(&imgs).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        {
            let opts = format!("rw{}", btrkit_tests::sets::device_opts(&imgs));
            let m = LoopMount::mount(&imgs[0], &t.path().join(format!("m{i}")), &opts).unwrap();
            let profiles = kernel_profiles(m.path());
            assert!(
                profiles.contains(&format!("Data+Metadata, {want}")),
                "{args:?}: {profiles:?}"
            );
            let block: Vec<u8> = (0..1 << 20)
                .map(|x: u32| (x * 13 + i as u32) as u8)
                .collect();
            for f in 0..80 {
                std::fs::write(m.path().join(format!("f{f}")), &block).unwrap();
            }
            m.unmount().unwrap();
        }
        oracle::check_set_clean(&imgs).unwrap_or_else(|e| panic!("{args:?} after: {e}"));
        btrkit_tests::sets::fsck_clean(&imgs).unwrap_or_else(|e| panic!("{args:?} after: {e}"));
    }
    let img = t.path().join("bad.img");
    for (args, want) in [
        (&["-M", "-n", "16K"][..], "sector size"),
        (&["-M", "-m", "dup", "-d", "single"][..], "must be the same"),
    ] {
        let mut a = vec!["-b", "300M"];
        a.extend(args.iter());
        let o = mkfs(&a, &img);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(want), "{args:?}: {e}");
    }
}

/// A source file written to while `--rootdir` copies it: mkfs stops with
/// an error naming it, and the image is left clearly not a filesystem
/// (no superblock), never a silent partial copy.
#[test]
fn rootdir_source_changing_during_the_copy_is_refused() {
    if !have_progs() {
        btrkit_tests::skip("btrfs-progs not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Enough data that the copy takes far longer than one append.
    std::fs::write(src.join("big"), vec![7u8; 64 << 20]).unwrap();
    std::fs::write(src.join("growing"), b"start\n").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let path = src.join("growing");
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.write_all(b"more\n").unwrap();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    let img = t.path().join("c.img");
    let o = mkfs(&["-b", "512M", "-r", src.to_str().unwrap()], &img);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "mkfs succeeded on a changing source");
    assert!(
        e.trim().lines().count() == 1
            && e.contains("growing")
            && e.contains("changed during the copy"),
        "{e}"
    );
    let o = Command::new("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(&img)
        .output()
        .unwrap();
    let sup = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() || !sup.contains("_BHRfS_M") || sup.contains("bad magic"),
        "the image still looks like a filesystem: {sup}"
    );
}

/// Device numbers are stored as the kernel stores them (its own dev_t,
/// major above a 20-bit minor): devices made by btrkit's engine and by
/// `--rootdir` show the same major and minor through the kernel, and the
/// kernel's own mknod reads back through btrkit-restore.
#[test]
fn device_numbers_reach_the_kernel() {
    if !have_progs() || !can_mount() || !is_root() {
        btrkit_tests::skip("needs btrfs-progs, root and loop devices");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("dev.img");
    let o = mkfs(&["-q", "-b", "256M"], &img);
    assert!(o.status.success());
    let script = t.path().join("s.scn");
    std::fs::write(&script, "mknod /c chr 1 3\nmknod /b blk 259 70000\nsync\n").unwrap();
    let o = Command::new(bin("btrkit-shell"))
        .arg("-q")
        .arg(&img)
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check(&img);
    {
        let m = mount(&img, "");
        let rdev = |p: &str| {
            let r = std::fs::symlink_metadata(m.path().join(p)).unwrap().rdev();
            (libc::major(r), libc::minor(r))
        };
        assert_eq!(rdev("c"), (1, 3));
        assert_eq!(rdev("b"), (259, 70000));
        btrkit_core::io::host::mknod(&m.path().join("k"), libc::S_IFCHR | 0o600, (10, 200))
            .unwrap();
    }
    let out = t.path().join("out");
    let o = Command::new(bin("btrkit-restore"))
        .arg(&img)
        .arg(&out)
        .arg("--device-nodes")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = std::fs::symlink_metadata(out.join("k")).unwrap().rdev();
    assert_eq!((libc::major(r), libc::minor(r)), (10, 200));
}
