//! Bad input to `btrkit-dump super` and `btrkit-dump tree`: each case gives
//! one clear error line on stderr naming the problem, a non-zero exit, no
//! panic, and leaves the image byte for byte as it was.

use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::consts::*;
use btrkit_core::format::superblock::Superblock;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_tests::fixtures::{have_cmd, run_dump, sparse_file, RunOutput};
use btrkit_tests::sys::run;
use std::ffi::OsStr;
use std::io::Read;
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

const LIMIT: Duration = Duration::from_secs(60);
const IMG_SIZE: u64 = 128 << 20;

/// What a command must do with an input.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    /// Non-zero exit, one stderr line containing one of the needles.
    Fail,
    /// The superblock itself is readable: printing it is fine; a refusal
    /// must still be one line naming the problem.
    FailOrPrint,
}

struct Case {
    name: &'static str,
    path: PathBuf,
    needles: &'static [&'static str],
    super_: Want,
    tree: Want,
}

/// Size, mtime and a checksum of every byte: enough to see any write.
#[derive(Debug, PartialEq)]
struct Fingerprint(Option<(u64, SystemTime, u32)>);

fn fingerprint(p: &Path) -> Fingerprint {
    let Ok(meta) = std::fs::metadata(p) else {
        return Fingerprint(None);
    };
    if meta.is_dir() {
        return Fingerprint(Some((
            0,
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            0,
        )));
    }
    let mut f = std::fs::File::open(p).expect("open image for fingerprint");
    // One crc32c per MiB, folded: any changed byte changes some chunk's crc.
    let mut crcs = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read image for fingerprint");
        if n == 0 {
            break;
        }
        crcs.extend_from_slice(&CsumType::Crc32c.compute(&buf[..n])[..4]);
    }
    let crc = u32::from_le_bytes(
        CsumType::Crc32c.compute(&crcs)[..4]
            .try_into()
            .expect("4 bytes"),
    );
    Fingerprint(Some((
        meta.len(),
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        crc,
    )))
}

fn get_u64(sb: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(sb[off..off + 8].try_into().expect("8 bytes"))
}
fn set_u64(sb: &mut [u8], off: usize, v: u64) {
    sb[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Rewrite the primary superblock of `path` through `f` (given its raw
/// bytes; fields are found with `offset_of!(Superblock, ...)`), then fix its
/// checksum unless `recsum` is false.
fn patch_super(path: &Path, recsum: bool, f: impl FnOnce(&mut [u8])) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open image");
    let mut buf = vec![0u8; BTRFS_SUPER_INFO_SIZE];
    file.read_exact_at(&mut buf, BTRFS_SUPER_INFO_OFFSET)
        .expect("read superblock");
    f(&mut buf);
    if recsum {
        let c = block_csum(CsumType::Crc32c, &buf);
        buf[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
    }
    file.write_all_at(&buf, BTRFS_SUPER_INFO_OFFSET)
        .expect("write superblock");
}

fn copy_image(from: &Path, to: &Path) {
    run(Command::new("cp").arg("--sparse=always").arg(from).arg(to)).expect("cp image");
}

/// Logical -> physical offset of the first copy of a tree block of the intact image.
fn physical_of(img: &Image, logical: u64) -> u64 {
    img.chunks
        .map(logical, img.nodesize as u64, img.devid)
        .expect("map tree block")[0]
}

/// A logical address inside no chunk, past everything the image maps.
fn unmapped_logical(img: &Image) -> u64 {
    let end = img.chunks.iter().map(|c| c.end()).max().unwrap_or(0);
    (end + (1 << 30)) & !0xfff
}

fn check(case: &Case, sub: &str, want: Want, o: &RunOutput, failures: &mut Vec<String>) {
    let what = format!("{} / dump {sub}", case.name);
    if o.timed_out {
        failures.push(format!("{what}: still running after {LIMIT:?}"));
        return;
    }
    if o.crashed() {
        failures.push(format!("{what}: crashed\n{}", o.describe()));
        return;
    }
    let lines: Vec<&str> = o.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    match (o.code(), want) {
        (Some(0), Want::FailOrPrint) => {
            eprintln!("{what}: printed (exit 0)");
            return;
        }
        (Some(0), Want::Fail) => {
            failures.push(format!(
                "{what}: exit 0, expected a refusal\n{}",
                o.describe()
            ));
            return;
        }
        _ => {}
    }
    if lines.len() != 1 {
        failures.push(format!(
            "{what}: {} stderr lines, want exactly one\n{}",
            lines.len(),
            o.describe()
        ));
        return;
    }
    // A refusal names the problem on its stderr line; a dump that got as
    // far as the trees may instead report the unreadable block on an
    // `ERROR` line of its output and sum up on stderr.
    let named = |l: &str| {
        let l = l.to_lowercase();
        case.needles.iter().any(|n| l.contains(&n.to_lowercase()))
    };
    let report = std::iter::once(lines[0])
        .chain(
            o.stdout
                .lines()
                .filter(|l| l.trim_start().starts_with("ERROR")),
        )
        .find(|l| named(l));
    match report {
        Some(r) => eprintln!("{what}: exit {:?}: {r}", o.code()),
        None => failures.push(format!(
            "{what}: no error line names the problem (any of {:?}): {}\n{}",
            case.needles,
            lines[0],
            o.describe()
        )),
    }
}

#[test]
fn bad_input_is_refused_cleanly() {
    let td = tempfile::tempdir().expect("tempdir");
    let dir = td.path();
    let mut cases: Vec<Case> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let not_btrfs: &[&str] = &["not a btrfs image"];

    // Inputs that need no tool.
    let p = dir.join("random.img");
    let mut bytes = vec![0u8; 1 << 20];
    btrkit_core::util::prng::Prng::new(0x9e37_79b9_7f4a_7c15).fill(&mut bytes);
    std::fs::write(&p, &bytes).expect("write");
    cases.push(Case {
        name: "random bytes",
        path: p,
        needles: not_btrfs,
        super_: Want::Fail,
        tree: Want::Fail,
    });
    let p = dir.join("empty.img");
    std::fs::write(&p, b"").expect("write");
    cases.push(Case {
        name: "empty file",
        path: p,
        needles: not_btrfs,
        super_: Want::Fail,
        tree: Want::Fail,
    });
    cases.push(Case {
        name: "missing file",
        path: dir.join("no-such-image.img"),
        needles: &["no such file", "not found", "does not exist"],
        super_: Want::Fail,
        tree: Want::Fail,
    });
    let p = dir.join("a-directory");
    std::fs::create_dir(&p).expect("mkdir");
    cases.push(Case {
        name: "directory",
        path: p,
        needles: &["directory"],
        super_: Want::Fail,
        tree: Want::Fail,
    });

    // Other filesystems.
    for (fs, args, size) in [
        ("ext4", &["-q", "-F"][..], 64u64 << 20),
        ("xfs", &["-q", "-f"][..], 320 << 20),
    ] {
        let tool = format!("mkfs.{fs}");
        if !have_cmd(&tool) {
            skipped.push(format!("{fs} image: {tool} not installed"));
            continue;
        }
        let p = dir.join(format!("{fs}.img"));
        sparse_file(&p, size).expect("sparse file");
        match run(Command::new(&tool).args(args).arg(&p)) {
            Ok(_) => cases.push(Case {
                name: if fs == "ext4" {
                    "ext4 image"
                } else {
                    "xfs image"
                },
                path: p,
                needles: not_btrfs,
                super_: Want::Fail,
                tree: Want::Fail,
            }),
            Err(e) => skipped.push(format!("{fs} image: {e}")),
        }
    }

    // Damaged btrfs images, derived from a fresh mkfs.btrfs image.
    if !have_cmd("mkfs.btrfs") {
        skipped.push("damaged btrfs images: mkfs.btrfs not installed".into());
    } else {
        let base = dir.join("base.img");
        btrkit_tests::fixtures::mkfs_btrfs(&base, IMG_SIZE, &[]).expect("mkfs.btrfs");
        let img = Image::open_path(&base, OpenOptions::default()).expect("open fresh image");
        let chunk_phys = physical_of(&img, img.sb.chunk_root.get());
        let root_phys = physical_of(&img, img.sb.root.get());
        let unmapped = unmapped_logical(&img);
        drop(img);
        let derive = |name: &str| {
            let p = dir.join(name);
            copy_image(&base, &p);
            p
        };

        let p = derive("short.img");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open")
            .set_len(BTRFS_SUPER_INFO_OFFSET + 2048)
            .expect("truncate");
        cases.push(Case {
            name: "truncated inside the superblock",
            path: p,
            needles: &["not a btrfs image", "too small", "truncated"],
            super_: Want::Fail,
            tree: Want::Fail,
        });

        let past_end: &[&str] = &["past the end", "truncated", "beyond the end"];
        let p = derive("cut-chunk.img");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open")
            .set_len(chunk_phys)
            .expect("truncate");
        cases.push(Case {
            name: "truncated before the chunk tree",
            path: p,
            needles: past_end,
            super_: Want::FailOrPrint,
            tree: Want::Fail,
        });
        if root_phys > chunk_phys {
            let p = derive("cut-root.img");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .expect("open")
                .set_len(root_phys)
                .expect("truncate");
            cases.push(Case {
                name: "truncated before the root tree",
                path: p,
                needles: past_end,
                super_: Want::FailOrPrint,
                tree: Want::Fail,
            });
        }

        let p = derive("magic.img");
        patch_super(&p, true, |sb| {
            set_u64(sb, offset_of!(Superblock, magic), BTRFS_MAGIC ^ 0xff)
        });
        cases.push(Case {
            name: "wrong magic",
            path: p,
            needles: not_btrfs,
            super_: Want::Fail,
            tree: Want::Fail,
        });

        let p = derive("csum.img");
        patch_super(&p, false, |sb| sb[offset_of!(Superblock, label)] ^= 0x55);
        cases.push(Case {
            name: "bad superblock checksum",
            path: p,
            needles: &["checksum"],
            super_: Want::FailOrPrint,
            tree: Want::Fail,
        });

        let p = derive("incompat.img");
        patch_super(&p, true, |sb| {
            let o = offset_of!(Superblock, incompat_flags);
            set_u64(sb, o, get_u64(sb, o) | 1 << 50)
        });
        cases.push(Case {
            name: "unknown incompat feature",
            path: p,
            needles: &["incompat"],
            super_: Want::FailOrPrint,
            tree: Want::Fail,
        });

        let outside: &[&str] = &["outside every chunk"];
        let p = derive("root-unmapped.img");
        patch_super(&p, true, |sb| {
            set_u64(sb, offset_of!(Superblock, root), unmapped)
        });
        cases.push(Case {
            name: "root tree pointer outside every chunk",
            path: p,
            needles: outside,
            super_: Want::FailOrPrint,
            tree: Want::Fail,
        });
        let p = derive("chunk-unmapped.img");
        patch_super(&p, true, |sb| {
            set_u64(sb, offset_of!(Superblock, chunk_root), unmapped)
        });
        cases.push(Case {
            name: "chunk root pointer outside every chunk",
            path: p,
            needles: outside,
            super_: Want::FailOrPrint,
            tree: Want::Fail,
        });

        // A real two-device filesystem; only the first device is given to
        // dump, which names the missing one.
        let d1 = dir.join("multi1.img");
        let d2 = dir.join("multi2.img");
        let made = sparse_file(&d1, IMG_SIZE)
            .and_then(|_| sparse_file(&d2, IMG_SIZE))
            .and_then(|_| {
                run(Command::new("mkfs.btrfs")
                    .args(["-f", "-d", "single", "-m", "single"])
                    .arg(&d1)
                    .arg(&d2))
                .map(drop)
            });
        match made {
            Ok(_) => cases.push(Case {
                name: "one device of a two-device filesystem",
                path: d1,
                needles: &["devid 2 not given"],
                super_: Want::FailOrPrint,
                tree: Want::Fail,
            }),
            Err(e) => skipped.push(format!("multi-device image: {e}")),
        }
    }

    let mut failures = Vec::new();
    for case in &cases {
        let before = fingerprint(&case.path);
        for (sub, want) in [("super", case.super_), ("tree", case.tree)] {
            let o = run_dump(&[OsStr::new(sub), case.path.as_os_str()], LIMIT);
            check(case, sub, want, &o, &mut failures);
        }
        if fingerprint(&case.path) != before {
            failures.push(format!("{}: the image changed", case.name));
        }
    }
    // A part that could not be built is a skip (a failure when oracles are required).
    for s in &skipped {
        btrkit_tests::skip_part("bad input", s);
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
