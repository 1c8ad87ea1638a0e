//! `btrkit-tune --csum ALGO`: every data and metadata checksum converted,
//! on images the kernel filled (plain, zstd-compressed and nodatasum files,
//! a subvolume):
//! - crc32c -> xxhash -> sha256 -> blake2 -> crc32c on one image: after
//!   each, the kernel mounts it and reads every file back as it was, and
//!   btrkit-fsck and btrfs check 6.14, both with data checksums, are clean;
//! - a RAID1 set of two devices and a RAID5 set of three (metadata RAID5
//!   too: tree blocks rewritten with their parity) converted the same way;
//! - a data sector corrupted in the image: named in the report (address,
//!   file) and still failing after the conversion (kernel EIO, btrfs check);
//! - the conversion cut at every write (a sample when there are many) on
//!   a crash device, unflushed writes lost or torn: the image is as it was,
//!   or converted, or half done with a flag the kernel refuses to mount
//!   (checked on a sample) and btrkit-fsck names in one finding, and a
//!   rerun finishes it; a rerun with another algorithm is refused.

use btrkit_core::check::{CheckOptions, NoProgress};
use btrkit_core::csum::CsumType;
use btrkit_core::format::consts::*;
use btrkit_core::image::read_superblock;
use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::tune::{tune_devices, Request};
use btrkit_core::util::prng::Prng;
use btrkit_tests::kcrash::{self, Manifest};
use btrkit_tests::kimage::{KernelImage, MkfsOpts};
use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::sets::{self, KernelSet};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, env, skip_unless};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// `btrkit-tune --json --csum ALGO DEVS...`: (exit code, report, stderr).
fn tune(devs: &[PathBuf], algo: &str) -> (i32, serde_json::Value, String) {
    let o = Command::new(bin_path("btrkit-tune"))
        .args(["--json", "--csum", algo])
        .args(devs)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run btrkit-tune");
    (
        o.status.code().unwrap_or(-1),
        serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Compressible text, random bytes, a nodatasum file and a subvolume with
/// files of its own, written through the kernel mount at `root` (mounted
/// with compress=zstd).
fn fill(root: &Path) {
    sets::write_files(root);
    let mut g = Prng::new(7);
    std::fs::create_dir(root.join("text")).unwrap();
    for i in 0..12 {
        let line = format!("line of text number {i} for the compressor\n");
        std::fs::write(root.join(format!("text/t{i}")), line.repeat(2000 + i * 700)).unwrap();
    }
    let nocow = root.join("nocow");
    std::fs::write(&nocow, b"").unwrap();
    must_run(Command::new("chattr").arg("+C").arg(&nocow));
    let mut v = vec![0u8; 300_000];
    g.fill(&mut v);
    std::fs::write(&nocow, &v).unwrap();
    must_run(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(root.join("sub")),
    );
    for i in 0..8 {
        let mut v = vec![0u8; 50_000 * (i + 1)];
        g.fill(&mut v);
        std::fs::write(root.join(format!("sub/s{i}")), &v).unwrap();
        std::fs::write(
            root.join(format!("sub/z{i}")),
            format!("zzz {i} ").repeat(30_000),
        )
        .unwrap();
    }
}

/// An image of `size` bytes (mkfs.btrfs, no free space tree: the kernel
/// builds it), filled by the kernel, unmounted.
fn filled_image(size: u64) -> KernelImage {
    let mut opts = MkfsOpts::default().size(size);
    opts.extra = vec!["-R".into(), "^free-space-tree".into()];
    let mut k = KernelImage::mkfs(&opts);
    k.mount("compress=zstd,space_cache=v2");
    fill(k.mnt());
    k.umount();
    k
}

/// What the kernel shows of the filesystem mounted read-only.
fn manifest(devs: &[PathBuf]) -> Manifest {
    sets::manifest(devs, "ro").expect("kernel mount and read")
}

/// The conversion to `algo` left `devs` converted, mountable with every
/// file as `want`, clean for btrkit-fsck and btrfs check 6.14, data
/// checksums included.
fn assert_converted(devs: &[PathBuf], algo: &str, want: &Manifest) {
    let t = CsumType::parse(algo).unwrap();
    for d in devs {
        let sb = read_superblock(&btrkit_core::io::FileDevice::open(d, false).unwrap(), 0).unwrap();
        assert_eq!(
            sb.csum_type.get(),
            t.to_disk(),
            "{}: csum_type",
            d.display()
        );
        assert_eq!(
            sb.flags.get()
                & (BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM | BTRFS_SUPER_FLAG_CHANGING_META_CSUM),
            0,
            "{}: a conversion flag is left",
            d.display()
        );
    }
    let got = manifest(devs);
    assert!(
        &got == want,
        "after --csum {algo}: {}",
        want.short_diff(&got, 12)
    );
    sets::fsck_clean(devs).unwrap_or_else(|e| panic!("after --csum {algo}: {e}"));
    if env::require_progs_new() {
        let v = oracle::btrfs_check_with(devs, Progs::New, &["--check-data-csum"], None).unwrap();
        assert!(
            v.clean,
            "btrfs check 6.14 --check-data-csum after --csum {algo}:\n{}",
            v.output
        );
    }
}

#[test]
fn every_algorithm_and_back() {
    skip_unless!(env::require_kernel_mount());
    let k = filled_image(512 << 20);
    let devs = vec![k.image().to_path_buf()];
    let want = manifest(&devs);
    // Nothing to do: the algorithm it already has.
    let (code, r, err) = tune(&devs, "crc32c");
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["steps"][0]["outcome"], "already-so", "{r}");
    for algo in ["xxhash", "sha256", "blake2", "crc32c"] {
        let (code, r, err) = tune(&devs, algo);
        assert_eq!(code, 0, "--csum {algo}: {err}");
        assert_eq!(r["steps"][0]["outcome"], "done", "{r}");
        assert_converted(&devs, algo, &want);
    }
}

#[test]
fn raid1_and_raid5_sets() {
    skip_unless!(env::require_kernel_mount());
    for (n, args, algo) in [
        (2, ["-d", "raid1", "-m", "raid1"], "sha256"),
        (3, ["-d", "raid5", "-m", "raid5"], "xxhash"),
    ] {
        let set = KernelSet::new(n, &args);
        let want = manifest(&set.paths);
        let (code, r, err) = tune(&set.paths, algo);
        assert_eq!(code, 0, "{args:?} --csum {algo}: {err}");
        assert_eq!(r["steps"][0]["outcome"], "done", "{r}");
        assert_converted(&set.paths, algo, &want);
        let (code, _, err) = tune(&set.paths, "blake2");
        assert_eq!(code, 0, "{args:?} --csum blake2: {err}");
        assert_converted(&set.paths, "blake2", &want);
    }
}

/// The physical offset in `img` of the sector starting with `marker`.
fn find_sector(img: &Path, marker: &[u8]) -> u64 {
    let f = std::fs::File::open(img).unwrap();
    let len = f.metadata().unwrap().len();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        let n = buf.len().min((len - off) as usize);
        f.read_exact_at(&mut buf[..n], off).unwrap();
        for s in (0..n).step_by(4096) {
            if buf[s..].starts_with(marker) {
                return off + s as u64;
            }
        }
        off += n as u64;
    }
    panic!("marker not found in {}", img.display());
}

#[test]
fn bad_sector_stays_bad() {
    skip_unless!(env::require_kernel_mount());
    let mut opts = MkfsOpts::default().size(256 << 20);
    opts.extra = vec!["-R".into(), "^free-space-tree".into()];
    let mut k = KernelImage::mkfs(&opts);
    k.mount("space_cache=v2");
    fill(k.mnt());
    let marker = b"BTRKIT-BAD-SECTOR-MARKER";
    let mut v = vec![0u8; 64 << 10];
    Prng::new(3).fill(&mut v);
    v[..marker.len()].copy_from_slice(marker);
    std::fs::write(k.path("dir1/bad.bin"), &v).unwrap();
    k.umount();
    let devs = vec![k.image().to_path_buf()];
    let at = find_sector(k.image(), marker);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(k.image())
        .unwrap();
    f.write_all_at(b"flipped", at + 1000).unwrap();
    drop(f);
    let (code, r, err) = tune(&devs, "xxhash");
    assert_eq!(code, 0, "{err}");
    let lines = r["steps"][0]["lines"].to_string();
    assert!(
        lines.contains("matches its crc32c checksum on no copy") && lines.contains("dir1/bad.bin"),
        "the bad sector is not reported: {lines}"
    );
    // Still bad: the kernel's read fails, both checkers complain.
    let m = LoopMount::new(k.image(), "ro").unwrap();
    let e = std::fs::read(m.path().join("dir1/bad.bin")).expect_err("a read of the bad sector");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(std::fs::read(m.path().join("dir0/f1")).is_ok());
    drop(m);
    assert!(
        sets::fsck_clean(&devs).is_err(),
        "btrkit-fsck finds nothing"
    );
    if env::require_progs_new() {
        let v = oracle::btrfs_check_with(&devs, Progs::New, &["--check-data-csum"], None).unwrap();
        assert!(
            !v.clean,
            "btrfs check 6.14 finds nothing wrong:\n{}",
            v.output
        );
    }
}

/// Flags of the unfinished conversion on `dev` (0 when none).
fn flags(dev: &Arc<dyn BlockDevice>) -> u64 {
    btrkit_core::image::first_valid_superblock(dev.as_ref())
        .map(|sb| {
            sb.flags.get()
                & (BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM | BTRFS_SUPER_FLAG_CHANGING_META_CSUM)
        })
        .unwrap_or(0)
}

/// The checksum type `dev`'s superblock names.
fn csum_of(dev: &Arc<dyn BlockDevice>) -> u16 {
    btrkit_core::image::first_valid_superblock(dev.as_ref())
        .unwrap()
        .csum_type
        .get()
}

/// btrkit-fsck's findings on `dev`, data checksums verified.
fn errors_of(dev: &Arc<dyn BlockDevice>) -> Vec<String> {
    let opts = CheckOptions {
        check_data_csum: true,
        ..CheckOptions::own_writes()
    };
    match btrkit_core::check::check_device(dev.clone(), opts, &NoProgress) {
        Ok(r) => r
            .findings
            .iter()
            .filter(|f| format!("{:?}", f.severity).to_lowercase().contains("err"))
            .map(|f| f.message.clone())
            .collect(),
        Err(e) => vec![format!("cannot check: {e}")],
    }
}

fn convert(dev: Arc<dyn BlockDevice>, to: CsumType) -> btrkit_core::Result<()> {
    let req = Request {
        csum: Some(to),
        ..Default::default()
    };
    tune_devices(vec![("image".into(), dev)], &req, &NoProgress).map(|_| ())
}

/// The whole device as an image file in `dir`.
fn to_file(dev: &Arc<dyn BlockDevice>, dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    let size = dev.size();
    f.set_len(size).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = buf.len().min((size - off) as usize);
        dev.read_at(off, &mut buf[..n]).unwrap();
        if buf[..n].iter().any(|&b| b != 0) {
            f.write_all_at(&buf[..n], off).unwrap();
        }
        off += n as u64;
    }
    p
}

#[test]
fn cut_at_every_write() {
    skip_unless!(env::require_kernel_mount());
    let k = filled_image(256 << 20);
    let want = manifest(&[k.image().to_path_buf()]);
    let base = Arc::new(std::fs::read(k.image()).unwrap());
    let fresh = || Arc::new(CrashDevice::from_shared(base.clone()));
    // sha256 to crc32c is the case where the csum items of the two sizes
    // do not divide each other; start from sha256.
    let start = fresh();
    convert(start.clone(), CsumType::Sha256).unwrap();
    let base = Arc::new(start.crash_image(|_| true));
    let fresh = || Arc::new(CrashDevice::from_shared(base.clone()));
    let (from, to) = (CsumType::Sha256, CsumType::Crc32c);
    let count = {
        let d = fresh();
        convert(d.clone(), to).expect("conversion");
        let n = d.writes();
        let d: Arc<dyn BlockDevice> = d;
        assert_eq!(csum_of(&d), to.to_disk());
        assert_eq!(errors_of(&d), Vec::<String>::new());
        n
    };
    assert!(count > 10, "{count} writes");
    // Every cut when few, else the first and last 30 and a sample between.
    let cuts: Vec<u64> = if count <= 120 {
        (0..count).collect()
    } else {
        let step = (count - 60) / 60 + 1;
        (0..30)
            .chain((30..count - 30).step_by(step as usize))
            .chain(count - 30..count)
            .collect()
    };
    let work = tempfile::tempdir().unwrap();
    let mut g = Prng::new(0x5eed);
    let (mut old, mut done, mut half) = (0, 0, [0u32; 2]);
    let mut kernel_tried = [false; 2];
    for cut in cuts {
        let d = fresh();
        d.fail_after_writes(Some(cut));
        assert!(convert(d.clone(), to).is_err(), "cut {cut} of {count}");
        for variant in 0..2 {
            let s = g.next_u64();
            let c: Arc<dyn BlockDevice> = Arc::new(match variant {
                0 => d.crash_device(|_| false),
                _ => d.crash_device_torn(|i, j| (s >> ((i * 7 + j) % 64)) & 1 == 1),
            });
            let f = flags(&c);
            if f == 0 {
                let errs = errors_of(&c);
                assert!(errs.is_empty(), "cut {cut}/{variant}: no flag but {errs:?}");
                if csum_of(&c) == from.to_disk() {
                    old += 1;
                } else {
                    assert_eq!(csum_of(&c), to.to_disk());
                    done += 1;
                }
                continue;
            }
            let which = usize::from(f & BTRFS_SUPER_FLAG_CHANGING_META_CSUM != 0);
            half[which] += 1;
            // btrkit-fsck names the unfinished conversion, once per
            // superblock copy at most, and nothing else.
            let errs = errors_of(&c);
            assert!(
                !errs.is_empty()
                    && errs
                        .iter()
                        .all(|e| e.contains("rerun `btrkit-tune --csum crc32c`")),
                "cut {cut}/{variant}: {errs:?}"
            );
            if !kernel_tried[which] {
                kernel_tried[which] = true;
                let p = to_file(&c, work.path(), "half.img");
                assert!(
                    LoopMount::new(&p, "ro").is_err(),
                    "cut {cut}/{variant}: the kernel mounts a half-done conversion"
                );
                // Another algorithm is refused, nothing written.
                let before = kcrash::image_digest(&p).unwrap();
                let (code, _, err) = tune(std::slice::from_ref(&p), "xxhash");
                assert_eq!(code, 1);
                assert!(err.contains("--csum crc32c"), "{err}");
                assert_eq!(kcrash::image_digest(&p).unwrap(), before);
                // The binary finishes it; the kernel reads every file.
                let (code, r, err) = tune(std::slice::from_ref(&p), "crc32c");
                assert_eq!(code, 0, "{err}");
                assert_eq!(r["steps"][0]["outcome"], "resumed", "{r}");
                assert_converted(std::slice::from_ref(&p), "crc32c", &want);
                std::fs::remove_file(&p).unwrap();
            }
            convert(c.clone(), to).unwrap_or_else(|e| panic!("cut {cut}/{variant}: rerun: {e}"));
            assert_eq!(flags(&c), 0);
            assert_eq!(csum_of(&c), to.to_disk());
            let errs = errors_of(&c);
            assert!(
                errs.is_empty(),
                "cut {cut}/{variant}: after the rerun {errs:?}"
            );
        }
    }
    eprintln!(
        "{count} writes: {old} as it was, {done} converted, {} half done in the data phase, {} in the metadata phase (all finished by a rerun)",
        half[0], half[1]
    );
    assert!(old > 0 && half[0] > 0 && half[1] > 0);
    assert!(kernel_tried.iter().all(|&t| t));
}
