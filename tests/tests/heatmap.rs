//! `btrkit-dump heatmap`: the pictures of known images (made by btrkit-mkfs
//! with a known file, and by mkfs.btrfs filled through a kernel mount)
//! have the expected size, the block group colours where the chunk map
//! puts the block groups, black where nothing is allocated, and as many
//! white (full) pixels as the data written fills; a set gives one picture
//! per device; the terminal picture has the expected lines; `--json`
//! describes the same pixels the PNG draws; bad input is one line and a
//! non-zero exit.
//!
//! Where a cell lands is computed here with this file's own Hilbert
//! curve, not the binary's.

use btrkit_core::chunk::stripe_length;
use btrkit_core::devices::DeviceSet;
use btrkit_core::format::consts::*;
use btrkit_core::image::OpenOptions;
use btrkit_tests::bins::bin_path;
use btrkit_tests::env::require_kernel_mount;
use btrkit_tests::kimage::{KernelImage, MkfsOpts};
use btrkit_tests::skip_unless;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dump(args: &[&OsStr]) -> Output {
    Command::new(bin_path("btrkit-dump"))
        .arg("heatmap")
        .args(args)
        .output()
        .expect("run btrkit-dump")
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "btrkit-dump heatmap failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn mkfs(args: &[&OsStr]) {
    let o = Command::new(bin_path("btrkit-mkfs"))
        .args(["-q", "-f"])
        .args(args)
        .output()
        .expect("run btrkit-mkfs");
    assert!(
        o.status.success(),
        "btrkit-mkfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// (width, height, RGB bytes) of a PNG.
fn decode(p: &Path) -> (u32, u32, Vec<u8>) {
    let f = std::io::BufReader::new(std::fs::File::open(p).expect("open png"));
    let mut r = png::Decoder::new(f).read_info().expect("png header");
    let mut buf = vec![0; r.output_buffer_size().expect("png size")];
    let info = r.next_frame(&mut buf).expect("png data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// The Hilbert curve as the README describes it: index 0 at the top left,
/// the last at the top right (the classic iterative construction).
fn xy(side: u64, d: u64) -> (u64, u64) {
    let (mut x, mut y, mut t, mut s) = (0, 0, d, 1);
    while s < side {
        let rx = (t >> 1) & 1;
        let ry = (t ^ rx) & 1;
        if ry == 0 {
            if rx == 1 {
                x = s - 1 - x;
                y = s - 1 - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        x += s * rx;
        y += s * ry;
        t >>= 2;
        s <<= 1;
    }
    (x, y)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Data,
    Metadata,
    System,
}

fn kind_of(flags: u64) -> Kind {
    if flags & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
        Kind::System
    } else if flags & BTRFS_BLOCK_GROUP_METADATA != 0 {
        Kind::Metadata
    } else {
        Kind::Data
    }
}

/// The type a pixel's colour says: data grey, metadata blue, system red;
/// None for black.
fn class(p: [u8; 3]) -> Option<Kind> {
    let [r, g, b] = p;
    if p == [0, 0, 0] {
        None
    } else if r == g && g == b {
        Some(Kind::Data)
    } else if b > r && b > g {
        Some(Kind::Metadata)
    } else if r > g && g == b {
        Some(Kind::System)
    } else {
        panic!("pixel {p:?} has no block group colour")
    }
}

struct Picture {
    side: u64,
    rgb: Vec<u8>,
}

impl Picture {
    fn load(p: &Path) -> Picture {
        let (w, h, rgb) = decode(p);
        assert_eq!(w, h, "{}: not square", p.display());
        Picture {
            side: u64::from(w),
            rgb,
        }
    }
    /// The colour of cell `i` (the i-th pixel along the curve).
    fn cell(&self, i: u64) -> [u8; 3] {
        let (x, y) = xy(self.side, i);
        let at = ((y * self.side + x) * 3) as usize;
        [self.rgb[at], self.rgb[at + 1], self.rgb[at + 2]]
    }
}

/// Check a picture of a space of `total` bytes against the ranges of it
/// each block group type takes: a cell wholly inside one shows that type,
/// a cell touching none is black. Returns (white cells, cells checked).
fn check_cells(pic: &Picture, total: u64, ranges: &[(u64, u64, Kind)]) -> (u64, u64) {
    let n = pic.side * pic.side;
    let bpc = total.div_ceil(n).max(1);
    let (mut white, mut checked) = (0, 0);
    for i in 0..n {
        let (s, e) = (i * bpc, ((i + 1) * bpc).min(total));
        let got = pic.cell(i);
        if got == [255, 255, 255] {
            white += 1;
        }
        if s >= e {
            assert_eq!(got, [0, 0, 0], "cell {i} past the end of the space");
            continue;
        }
        let inside = ranges.iter().find(|r| r.0 <= s && e <= r.1);
        let touches = ranges.iter().any(|r| r.0 < e && s < r.1);
        match (inside, touches) {
            (Some(r), _) => {
                assert_eq!(
                    class(got),
                    Some(r.2),
                    "cell {i} ({s}..{e}) inside {r:?}: {got:?}"
                );
                checked += 1;
            }
            (None, false) => {
                assert_eq!(
                    got,
                    [0, 0, 0],
                    "cell {i} ({s}..{e}) is unallocated: {got:?}"
                );
                checked += 1;
            }
            (None, true) => {}
        }
    }
    (white, checked)
}

/// Each device's allocated ranges and the logical space's, from the
/// chunk map.
struct Layout {
    physical: Vec<(u64, Vec<(u64, u64, Kind)>)>,
    logical: Vec<(u64, u64, Kind)>,
    logical_total: u64,
}

fn layout(paths: &[PathBuf]) -> Layout {
    let img = DeviceSet::open_paths(paths, OpenOptions::default()).expect("open image");
    let mut physical: Vec<(u64, Vec<(u64, u64, Kind)>)> =
        img.dev_items.iter().map(|&d| (d, Vec::new())).collect();
    let mut logical = Vec::new();
    let mut at = 0;
    for m in img.chunks.iter() {
        let k = kind_of(m.type_flags);
        let per = stripe_length(m.type_flags, m.length, m.stripes.len() as u64);
        for &(d, p) in &m.stripes {
            let dev = physical
                .iter_mut()
                .find(|x| x.0 == d)
                .expect("stripe devid");
            dev.1.push((p, p + per, k));
        }
        logical.push((at, at + m.length, k));
        at += m.length;
    }
    Layout {
        physical,
        logical,
        logical_total: at,
    }
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).expect("stat").len()
}

fn random_file(p: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    std::fs::write(p, v).expect("write file");
}

const DATA: usize = 48 << 20;

/// A 512 MiB btrkit-mkfs image holding one 48 MiB file.
fn known_image(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    random_file(&root.join("big"), DATA, 7);
    let img = dir.join("disk.img");
    mkfs(&[
        "-b".as_ref(),
        "512M".as_ref(),
        img.as_os_str(),
        "--rootdir".as_ref(),
        root.as_os_str(),
    ]);
    img
}

#[test]
fn physical_picture_of_a_known_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = known_image(dir.path());
    let out = dir.path().join("p.png");
    ok(&dump(&[img.as_os_str(), "-o".as_ref(), out.as_os_str()]));
    let pic = Picture::load(&out);
    assert_eq!(pic.side, 256, "default size");
    let lay = layout(std::slice::from_ref(&img));
    assert_eq!(lay.physical.len(), 1);
    let total = file_size(&img);
    let (white, checked) = check_cells(&pic, total, &lay.physical[0].1);
    assert!(checked > 60000, "only {checked} cells checked");
    // The file's data fills whole cells of 8 KiB: as many white ones as
    // it covers, less those its extents' ends share with free bytes.
    let bpc = total / (256 * 256);
    let want = DATA as u64 / bpc;
    assert!(
        white <= want && white + 16 >= want,
        "{white} white cells for {want} cells of data"
    );
    // Every type is drawn somewhere, and the first MiB (never allocated)
    // is black.
    let mut seen = [false; 3];
    for i in 0..256 * 256 {
        if let Some(k) = class(pic.cell(i)) {
            seen[k as usize] = true;
        }
    }
    assert_eq!(seen, [true; 3]);
    for i in 0..(1 << 20) / bpc {
        assert_eq!(pic.cell(i), [0, 0, 0]);
    }
}

/// `--json` with `-o`: one scan, two views of it. Every allocated pixel of
/// the JSON is where the PNG has that type's colour, every other pixel of
/// the PNG is black; the totals are the image's size, and the allocated
/// bytes by type are what the pixels' add up to.
#[test]
fn json_is_the_picture() {
    let dir = tempfile::tempdir().unwrap();
    let img = known_image(dir.path());
    let out = dir.path().join("p.png");
    let o = dump(&[
        img.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
        "--json".as_ref(),
    ]);
    ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let pics = v["pictures"].as_array().expect("pictures");
    assert_eq!(pics.len(), 1);
    let p = &pics[0];
    assert_eq!(p["space"], "physical");
    assert_eq!(p["devid"], 1);
    assert_eq!(p["side"], 256);
    assert_eq!(p["bytes"].as_u64(), Some(file_size(&img)));
    let pic = Picture::load(&out);
    let side = pic.side;
    let mut allocated_pixels = std::collections::HashSet::new();
    let mut sums = [0u64; 4];
    for px in p["pixels"].as_array().expect("pixels") {
        let (x, y) = (px["x"].as_u64().unwrap(), px["y"].as_u64().unwrap());
        let at = ((y * side + x) * 3) as usize;
        let rgb = [pic.rgb[at], pic.rgb[at + 1], pic.rgb[at + 2]];
        let want = match px["type"].as_str().unwrap() {
            "data" => Kind::Data,
            "metadata" => Kind::Metadata,
            "system" => Kind::System,
            t => panic!("unexpected type {t}"),
        };
        assert_eq!(class(rgb), Some(want), "pixel ({x}, {y})");
        let i = px["start"].as_u64().unwrap() / p["bytes_per_pixel"].as_u64().unwrap();
        assert_eq!(xy(side, i), (x, y), "pixel of byte {}", px["start"]);
        let f = px["fill"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f));
        for (k, name) in ["data", "metadata", "system"].iter().enumerate() {
            sums[k] += px["allocated"][name].as_u64().unwrap();
        }
        allocated_pixels.insert((x, y));
    }
    for (k, name) in ["data", "metadata", "system"].iter().enumerate() {
        assert_eq!(p["allocated"][name].as_u64(), Some(sums[k]), "{name} bytes");
        assert!(sums[k] > 0, "no {name} allocated");
    }
    for y in 0..side {
        for x in 0..side {
            if !allocated_pixels.contains(&(x, y)) {
                let at = ((y * side + x) * 3) as usize;
                assert_eq!(
                    &pic.rgb[at..at + 3],
                    &[0, 0, 0],
                    "pixel ({x}, {y}) not in the JSON"
                );
            }
        }
    }
    // --json alone scans at the PNG's default size; with --term it is refused.
    let o = dump(&[img.as_os_str(), "--json".as_ref()]);
    ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["pictures"][0]["side"], 256);
    let o = dump(&[img.as_os_str(), "--json".as_ref(), "--term".as_ref()]);
    assert!(!o.status.success());
}

#[test]
fn virtual_picture_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let img = known_image(dir.path());
    let out = dir.path().join("v.png");
    ok(&dump(&[
        img.as_os_str(),
        "--virtual".as_ref(),
        "--size".as_ref(),
        "128".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]));
    let pic = Picture::load(&out);
    assert_eq!(pic.side, 128);
    let lay = layout(std::slice::from_ref(&img));
    let (white, checked) = check_cells(&pic, lay.logical_total, &lay.logical);
    assert!(checked > 16000, "only {checked} cells checked");
    let bpc = lay.logical_total.div_ceil(128 * 128);
    let want = DATA as u64 / bpc;
    assert!(
        white <= want && white + 16 >= want,
        "{white} white cells for {want}"
    );

    // Sizes other than powers of two from 2 to 1024 are refused.
    for bad in ["100", "1", "2048", "0"] {
        let o = dump(&[
            img.as_os_str(),
            "--size".as_ref(),
            bad.as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert!(!o.status.success(), "--size {bad} accepted");
        assert_eq!(
            String::from_utf8_lossy(&o.stderr).lines().count(),
            1,
            "--size {bad}"
        );
    }
}

#[test]
fn a_set_gives_one_picture_per_device() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    random_file(&root.join("f"), 20 << 20, 3);
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    mkfs(&[
        "-b".as_ref(),
        "256M".as_ref(),
        "-d".as_ref(),
        "raid0".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--rootdir".as_ref(),
        root.as_os_str(),
    ]);
    let out = dir.path().join("set.png");
    ok(&dump(&[
        a.as_os_str(),
        b.as_os_str(),
        "--size".as_ref(),
        "64".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]));
    assert!(!out.exists(), "one picture per device, none for the set");
    let lay = layout(&[a.clone(), b.clone()]);
    assert_eq!(lay.physical.len(), 2);
    let mut pics = Vec::new();
    for (devid, ranges) in &lay.physical {
        let p = dir.path().join(format!("set-dev{devid}.png"));
        let pic = Picture::load(&p);
        assert_eq!(pic.side, 64);
        let size = file_size(if *devid == 1 { &a } else { &b });
        let (_, checked) = check_cells(&pic, size, ranges);
        assert!(
            checked > 3000,
            "devid {devid}: only {checked} cells checked"
        );
        pics.push(pic.rgb);
    }
    // --devid draws one of them, to the name given.
    let one = dir.path().join("two.png");
    ok(&dump(&[
        a.as_os_str(),
        b.as_os_str(),
        "--size".as_ref(),
        "64".as_ref(),
        "--devid".as_ref(),
        "2".as_ref(),
        "-o".as_ref(),
        one.as_os_str(),
    ]));
    assert_eq!(decode(&one).2, pics[1]);
    let o = dump(&[
        a.as_os_str(),
        b.as_os_str(),
        "--devid".as_ref(),
        "3".as_ref(),
        "-o".as_ref(),
        one.as_os_str(),
    ]);
    assert!(!o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);

    // The terminal: per device a title line and 64/2 lines of 64 cells.
    let o = dump(&[a.as_os_str(), b.as_os_str(), "--term".as_ref()]);
    ok(&o);
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * (1 + 32), "{text}");
    assert!(lines[0].starts_with("devid 1"), "{}", lines[0]);
    assert!(lines[33].starts_with("devid 2"), "{}", lines[33]);
    for l in lines[1..33].iter().chain(&lines[34..]) {
        assert_eq!(l.matches('\u{2580}').count(), 64, "{l}");
        assert!(l.ends_with("\x1b[0m"));
    }
}

#[test]
fn terminal_picture_lines() {
    let dir = tempfile::tempdir().unwrap();
    let img = known_image(dir.path());
    for (size, lines) in [(None, 33), (Some("16"), 9), (Some("2"), 2)] {
        let mut args = vec![img.as_os_str(), "--term".as_ref()];
        if let Some(s) = size {
            args.extend([OsStr::new("--size"), OsStr::new(s)]);
        }
        let o = dump(&args);
        ok(&o);
        let text = String::from_utf8(o.stdout).unwrap();
        assert_eq!(text.lines().count(), lines, "--size {size:?}:\n{text}");
    }
    // With -o too, the PNG and the terminal come from one scan; the
    // terminal picture is the PNG's cells merged 4 x 4, the same layout.
    let out = dir.path().join("both.png");
    let o = dump(&[
        img.as_os_str(),
        "--term".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    ok(&o);
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 33);
    assert_eq!(Picture::load(&out).side, 256);
}

#[test]
fn bad_input_is_one_line_and_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let zeros = dir.path().join("zeros.img");
    std::fs::File::create(&zeros)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = dir.path().join("x.png");
    let missing = dir.path().join("absent.img");
    let img = known_image(dir.path());
    let unwritable = dir.path().join("no-such-dir").join("x.png");
    let cases: Vec<(&str, Vec<&OsStr>)> = vec![
        (
            "not a filesystem",
            vec![zeros.as_os_str(), "-o".as_ref(), out.as_os_str()],
        ),
        (
            "missing image",
            vec![missing.as_os_str(), "-o".as_ref(), out.as_os_str()],
        ),
        (
            "unwritable output",
            vec![img.as_os_str(), "-o".as_ref(), unwritable.as_os_str()],
        ),
        (
            "output is a directory",
            vec![img.as_os_str(), "-o".as_ref(), dir.path().as_os_str()],
        ),
    ];
    for (what, args) in cases {
        let o = dump(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(err.starts_with("btrkit-dump: error: "), "{what}: {err}");
        assert!(o.stdout.is_empty(), "{what}");
    }
    assert!(!out.exists());
    // Neither -o nor --term: a usage error.
    let o = dump(&[img.as_os_str()]);
    assert!(!o.status.success());
}

/// mkfs.btrfs's layout filled by the kernel: the picture agrees with the
/// chunk map the kernel left, and the data written shows as white cells.
#[test]
fn kernel_filled_image() {
    skip_unless!(require_kernel_mount());
    let mut k = KernelImage::new_mounted(&MkfsOpts::default().size(1 << 30), "");
    random_file(&k.path("a"), 40 << 20, 11);
    random_file(&k.path("b"), 24 << 20, 12);
    k.sync();
    k.umount();
    let img = k.image().to_path_buf();
    let out = k.dir().join("k.png");
    ok(&dump(&[img.as_os_str(), "-o".as_ref(), out.as_os_str()]));
    let pic = Picture::load(&out);
    let lay = layout(std::slice::from_ref(&img));
    let total = file_size(&img);
    let (white, checked) = check_cells(&pic, total, &lay.physical[0].1);
    assert!(checked > 60000, "only {checked} cells checked");
    let bpc = total / (256 * 256);
    let want = (64u64 << 20) / bpc;
    assert!(
        white <= want && white + 32 >= want,
        "{white} white cells for {want}"
    );
}
