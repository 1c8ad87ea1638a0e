//! btrkit-replay on real kernel logs from the btrfs-progs fixtures, and on
//! bad input: each bad case is one clear line, a non-zero exit, an
//! untouched IMAGE and no OUT left behind.

use btrkit_core::format::consts::*;
use btrkit_core::image::{read_superblock, Image, OpenOptions};
use btrkit_core::io::FileDevice;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::{
    bin_path, require_btrfs_progs, require_kernel_mount, require_shared, skip_unless, LoopMount,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn extract(shared: &Path, name: &str, dir: &Path) -> PathBuf {
    let tar = shared
        .join("fixtures/btrfs-progs-fsck")
        .join(format!("{name}.tar.xz"));
    assert!(Command::new("tar")
        .arg("-xJf")
        .arg(&tar)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap()
        .success());
    dir.join(format!("{name}.raw"))
}

fn replay(args: &[&str]) -> Output {
    Command::new(bin_path("btrkit-replay"))
        .args(args)
        .output()
        .unwrap()
}

fn digest(p: &Path) -> u64 {
    // Hash only the data regions (SEEK_DATA/SEEK_HOLE): the images are
    // sparse and 1 GiB.
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len();
    let mut h = 0xcbf29ce484222325u64;
    for (d, e) in btrkit_core::io::host::data_runs(&f, 0, len) {
        let mut buf = vec![0u8; (e - d) as usize];
        f.read_exact_at(&mut buf, d).unwrap();
        for (i, c) in buf.chunks(4096).enumerate() {
            if c.iter().any(|&b| b != 0) {
                h ^= d + i as u64 * 4096;
                for &b in c {
                    h = (h ^ b as u64).wrapping_mul(0x100000001b3);
                }
            }
        }
    }
    h
}

fn log_root(p: &Path) -> u64 {
    read_superblock(&FileDevice::open(p, false).unwrap(), 0)
        .unwrap()
        .log_root
        .get()
}

fn check_clean(p: &Path) {
    oracle::assert_btrfs_check_clean(&[p], Progs::Distro, &p.display().to_string());
}

fn one_line_error(o: &Output, want: &str) {
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "expected failure ({want}), got success"
    );
    assert_ne!(o.status.code(), Some(101), "panicked: {e}");
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(e.to_lowercase().contains(want), "want '{want}' in: {e}");
}

/// Listing and contents of a mounted copy of `img` (the kernel replays any log).
fn kernel_view(img: &Path) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("c.img");
    assert!(Command::new("cp")
        .arg("--sparse=always")
        .arg(img)
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    let m = LoopMount::mount(&copy, &dir.path().join("m"), "").unwrap_or_else(|e| panic!("{e}"));
    let o = Command::new("sh")
        .arg("-c")
        .arg("cd \"$0\" && find . -printf '%p %y %m %s %n %l\\n' | sort && find . -type f -exec cksum {} + 2>&1 | sort")
        .arg(m.path())
        .output()
        .unwrap();
    drop(m);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn kernel_log_fixtures_replay_like_the_kernel() {
    let Some(shared) = require_shared() else {
        return;
    };
    skip_unless!(require_btrfs_progs());
    let t = tempfile::tempdir().unwrap();
    for name in [
        "065-valid-log-tree--already-present",
        "065-valid-log-tree--compressed",
        "065-valid-log-tree--hole",
    ] {
        let img = extract(&shared, name, t.path());
        let before = digest(&img);
        let out = t.path().join(format!("{name}.out"));
        let o = replay(&[img.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(digest(&img), before, "{name}: IMAGE changed by -o");
        assert_eq!(log_root(&out), 0);
        check_clean(&out);
        if require_kernel_mount() {
            assert_eq!(
                kernel_view(&img),
                kernel_view(&out),
                "{name}: differs from the kernel's replay"
            );
        }
        // In place, on another copy.
        let inplace = t.path().join(format!("{name}.inplace"));
        btrkit_core::io::sparse_copy(&img, &inplace).unwrap();
        assert!(replay(&[inplace.to_str().unwrap()]).status.success());
        assert_eq!(log_root(&inplace), 0);
        check_clean(&inplace);
        // Replaying again: nothing to do, exit 0.
        let o = replay(&[inplace.to_str().unwrap()]);
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("no log to replay")
        );
    }
}

#[test]
fn missing_log_csums_refused_unless_forced() {
    let Some(shared) = require_shared() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let img = extract(&shared, "063-log-missing-csum--default", t.path());
    let before = digest(&img);
    let out = t.path().join("out");
    let o = replay(&[img.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    one_line_error(&o, "checksum");
    assert!(!out.exists(), "OUT left behind after a refused replay");
    let o = replay(&[img.to_str().unwrap()]);
    one_line_error(&o, "--force");
    assert_eq!(
        digest(&img),
        before,
        "refused in-place replay changed IMAGE"
    );
    let o = replay(&[
        img.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--force",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(log_root(&out), 0);
}

#[test]
fn dry_run_writes_nothing_and_lists_changes() {
    let Some(shared) = require_shared() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let img = extract(&shared, "065-valid-log-tree--compressed", t.path());
    let before = digest(&img);
    let o = replay(&[img.to_str().unwrap(), "--dry-run", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    let events = v["summary"]["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["event"] == "inode_created"));
    assert!(events.iter().any(|e| e["event"] == "data_replaced"));
    assert_eq!(digest(&img), before);
    assert_ne!(log_root(&img), 0);
    let o = replay(&[img.to_str().unwrap(), "--dry-run"]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("nothing was written")
    );
}

/// Rewrite the tree block at logical `bytenr` in every copy, re-checksummed
/// unless `recsum` is false.
fn patch_block(img: &Path, bytenr: u64, f: impl Fn(&mut [u8]), recsum: bool) {
    let image = Image::open_path(
        img,
        OpenOptions {
            lenient: true,
            ..Default::default()
        },
    )
    .unwrap();
    let ns = image.nodesize as usize;
    let csum = image.csum;
    let phys = image.chunks.map(bytenr, ns as u64, image.devid).unwrap();
    drop(image);
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    for p in phys {
        let mut b = vec![0u8; ns];
        file.read_exact_at(&mut b, p).unwrap();
        f(&mut b);
        if recsum {
            let c = btrkit_core::csum::block_csum(csum, &b);
            b[..32].copy_from_slice(&c);
        }
        file.write_all_at(&b, p).unwrap();
    }
}

fn patch_super(img: &Path, f: impl Fn(&mut btrkit_core::format::superblock::Superblock)) {
    use std::os::unix::fs::FileExt;
    use zerocopy::{FromBytes, IntoBytes};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = vec![0u8; 4096];
    file.read_exact_at(&mut b, BTRFS_SUPER_INFO_OFFSET).unwrap();
    let mut sb = btrkit_core::format::superblock::Superblock::read_from_bytes(&b).unwrap();
    f(&mut sb);
    let mut nb = sb.as_bytes().to_vec();
    let c = btrkit_core::csum::block_csum(
        btrkit_core::csum::CsumType::from_disk(sb.csum_type.get()).unwrap(),
        &nb,
    );
    nb[..32].copy_from_slice(&c);
    file.write_all_at(&nb, BTRFS_SUPER_INFO_OFFSET).unwrap();
}

#[test]
fn bad_input() {
    let Some(shared) = require_shared() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let base = extract(&shared, "065-valid-log-tree--compressed", t.path());
    let log = log_root(&base);
    let case = |name: &str| {
        let p = t.path().join(name);
        btrkit_core::io::sparse_copy(&base, &p).unwrap();
        p
    };
    let run_bad = |img: &Path, want: &str| {
        let before = digest(img);
        let out = img.with_extension("out");
        one_line_error(
            &replay(&[img.to_str().unwrap(), "-o", out.to_str().unwrap()]),
            want,
        );
        assert!(!out.exists(), "OUT left behind");
        one_line_error(&replay(&[img.to_str().unwrap()]), want);
        assert_eq!(digest(img), before, "IMAGE modified");
    };
    // A log block with a bad checksum (both copies).
    let p = case("badcsum");
    patch_block(&p, log, |b| b[200] ^= 0xff, false);
    run_bad(&p, "checksum");
    // A log pointing outside every chunk.
    let p = case("outside");
    patch_super(&p, |sb| sb.log_root.set(1 << 40));
    run_bad(&p, "outside every chunk");
    // A log from a generation that does not fit the superblock.
    let p = case("generation");
    patch_block(
        &p,
        log,
        |b| {
            let g = u64::from_le_bytes(b[0x50..0x58].try_into().unwrap());
            b[0x50..0x58].copy_from_slice(&(g + 7).to_le_bytes());
        },
        true,
    );
    run_bad(&p, "transid");
    // Not a btrfs image, and a missing file.
    let junk = t.path().join("junk");
    std::fs::write(&junk, vec![0x42u8; 1 << 20]).unwrap();
    one_line_error(&replay(&[junk.to_str().unwrap()]), "not a btrfs image");
    one_line_error(&replay(&["/nonexistent/image"]), "nonexistent");
    one_line_error(&replay(&[t.path().to_str().unwrap()]), "directory");
    // An image without a log: exit 0, unchanged.
    let clean = case("clean");
    patch_super(&clean, |sb| {
        sb.log_root.set(0);
        sb.log_root_level = 0;
    });
    let before = digest(&clean);
    let o = replay(&[clean.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("no log to replay"));
    assert_eq!(digest(&clean), before);
}
