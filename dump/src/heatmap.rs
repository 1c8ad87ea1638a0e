//! `btrkit-dump heatmap`: a picture of where the filesystem's block groups
//! lie and how full they are, as btrfs-heatmap draws it. The address
//! space (core's [`btrkit_core::heatmap`] cells, in address order) is laid
//! along a Hilbert curve, so bytes near each other in the space are near
//! each other in the picture. Written as PNG, or to the terminal.

use crate::devices::Devices;
use btrkit_core::heatmap::{scan, Heatmap, Kind, Space};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
#[command(
    after_help = "The picture: the address space is cut into SIZE x SIZE pixels in address \
order, laid along a Hilbert curve from the top left corner to the top right one. A pixel's \
colour is the type of the block group taking most of its bytes: data grey to white, metadata \
blue, system red, mixed (data and metadata) amber; its brightness how much of its bytes \
extents use (from 20% for an empty block group to full); unallocated bytes are black.\n\n\
--physical (the default) draws each device's bytes, 0 to its size, every copy of every chunk \
where it lies; on a filesystem of several devices one picture per device, FILE-devN.png \
(FILE.png with --devid). --virtual draws the logical space: every chunk once, laid end to end \
in logical order without the holes between them.\n\n\
Exit status: 0 when every picture was drawn, 1 when the image cannot be read or a picture \
cannot be written.\n\nExamples:\n  btrkit-dump heatmap disk.img -o disk.png\n  \
btrkit-dump heatmap a.img b.img -o set.png        (set-dev1.png, set-dev2.png)\n  \
btrkit-dump heatmap disk.img --virtual --size 512 -o logical.png\n  \
btrkit-dump heatmap disk.img --term\n  \
btrkit-dump heatmap disk.img --json | jq '.pictures[0].allocated'"
)]
pub struct Args {
    #[command(flatten)]
    pub devs: Devices,
    /// Write the picture as PNG to FILE (one per device, FILE-devN.png,
    /// for a physical picture of several devices).
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        required_unless_present_any = ["term", "json"]
    )]
    pub output: Option<PathBuf>,
    /// Draw each device's physical bytes (the default).
    #[arg(long, conflicts_with = "virtual_")]
    pub physical: bool,
    /// Draw the logical address space of all chunks instead.
    #[arg(long = "virtual")]
    pub virtual_: bool,
    /// Pixels per side, a power of two from 2 to 1024 (default 256; 64
    /// with --term alone, which then fills 32 lines).
    #[arg(long, value_name = "N")]
    pub size: Option<u32>,
    /// Draw only the device with this devid.
    #[arg(long, value_name = "DEVID", conflicts_with = "virtual_")]
    pub devid: Option<u64>,
    /// Print the picture to the terminal: a line naming it, then SIZE/2
    /// lines of half blocks in 24-bit colour (with -o and no --size, a 64
    /// pixel picture of the same scan).
    #[arg(long)]
    pub term: bool,
    /// Print what each picture shows as JSON instead of drawing it to the
    /// terminal: its space and scale, the bytes allocated by type and
    /// used, and every allocated pixel (x, y, first byte, type, fill).
    #[arg(long, conflicts_with = "term")]
    pub json: bool,
}

/// Pixels per side when neither --size nor -o asks otherwise.
const TERM_SIDE: u32 = 64;
const PNG_SIDE: u32 = 256;

/// Brightness of an allocated pixel whose bytes are all free: what keeps
/// empty block groups visible against unallocated black.
const MIN_BRIGHT: f64 = 0.2;

/// Full-brightness colour of each block group type.
fn base(kind: Kind) -> [u8; 3] {
    match kind {
        Kind::Data => [255, 255, 255],
        Kind::Metadata => [60, 120, 255],
        Kind::System => [255, 60, 60],
        Kind::Mixed => [255, 190, 40],
    }
}

/// The colour of cell `i`.
fn colour(h: &Heatmap, i: usize) -> [u8; 3] {
    let Some(kind) = h.cells[i].kind() else {
        return [0, 0, 0];
    };
    let v = MIN_BRIGHT + (1.0 - MIN_BRIGHT) * h.fill(i);
    base(kind).map(|c| (f64::from(c) * v).round().clamp(1.0, 255.0) as u8)
}

/// Position of index `d` on the Hilbert curve of `side` x `side` pixels
/// (`side` a power of two), as (x, y) with y growing down: the curve
/// starts at (0, 0) and ends at (side - 1, 0), each index a neighbour of
/// the next. Built from the lowest pair of bits up: each level places the
/// curve so far in one quadrant of the next, turned so that its ends meet
/// the neighbouring quadrants'.
pub fn hilbert_xy(side: u32, d: u64) -> (u32, u32) {
    let (mut x, mut y) = (0u32, 0u32);
    let mut t = d;
    let mut s = 1u32;
    while s < side {
        let rx = (1 & (t / 2)) as u32;
        let ry = (1 & (t ^ u64::from(rx))) as u32;
        if ry == 0 {
            if rx == 1 {
                x = s - 1 - x;
                y = s - 1 - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        x += s * rx;
        y += s * ry;
        t /= 4;
        s *= 2;
    }
    (x, y)
}

/// The picture of `h` as `side` x `side` RGB pixels, row by row.
fn pixels(h: &Heatmap, side: u32) -> Vec<u8> {
    let mut out = vec![0u8; side as usize * side as usize * 3];
    for i in 0..h.cells.len() {
        let (x, y) = hilbert_xy(side, i as u64);
        let at = (y as usize * side as usize + x as usize) * 3;
        out[at..at + 3].copy_from_slice(&colour(h, i));
    }
    out
}

fn write_png(path: &Path, side: u32, rgb: &[u8]) -> anyhow::Result<()> {
    let write = || -> anyhow::Result<()> {
        let f = std::fs::File::create(path)?;
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), side, side);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header()?;
        w.write_image_data(rgb)?;
        w.finish()?;
        Ok(())
    };
    write().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// `FILE-devN.ext` for device `devid` of a picture per device.
fn per_device_path(out: &Path, devid: u64) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match out.extension() {
        Some(e) => format!("{stem}-dev{devid}.{}", e.to_string_lossy()),
        None => format!("{stem}-dev{devid}"),
    };
    out.with_file_name(name)
}

fn human(b: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// One line naming a picture: the space, its size, the pixel size and
/// what is allocated and used.
fn title(h: &Heatmap, what: &str, side: u32) -> String {
    let mut alloc = Vec::new();
    for k in [Kind::Data, Kind::Metadata, Kind::System, Kind::Mixed] {
        let b = h.allocated[k as usize];
        if b > 0 {
            alloc.push(format!("{} {}", k.name(), human(b)));
        }
    }
    format!(
        "{what}: {} in {side}x{side} pixels of {}; allocated {}; used {}",
        human(h.total),
        human(h.bytes_per_cell),
        if alloc.is_empty() {
            "nothing".to_string()
        } else {
            alloc.join(", ")
        },
        human(h.used)
    )
}

/// The picture as terminal lines: each character two pixels, the upper as
/// the foreground of an upper half block, the lower as its background.
fn term_lines(h: &Heatmap, side: u32) -> Vec<String> {
    let rgb = pixels(h, side);
    let px = |x: u32, y: u32| {
        let at = (y as usize * side as usize + x as usize) * 3;
        (rgb[at], rgb[at + 1], rgb[at + 2])
    };
    (0..side / 2)
        .map(|row| {
            let mut line = String::new();
            for x in 0..side {
                let (a, b) = (px(x, 2 * row), px(x, 2 * row + 1));
                line.push_str(&format!(
                    "\x1b[38;2;{};{};{}m\x1b[48;2;{};{};{}m\u{2580}",
                    a.0, a.1, a.2, b.0, b.1, b.2
                ));
            }
            line.push_str("\x1b[0m");
            line
        })
        .collect()
}

fn check_side(n: u32) -> anyhow::Result<u32> {
    if !n.is_power_of_two() || !(2..=1024).contains(&n) {
        anyhow::bail!("--size {n}: a power of two from 2 to 1024 is needed");
    }
    Ok(n)
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let png_side = check_side(a.size.unwrap_or(PNG_SIDE))?;
    let term_side = match (a.size, &a.output) {
        (Some(n), _) => n,
        (None, Some(_)) => TERM_SIDE.min(png_side),
        (None, None) => TERM_SIDE,
    };
    // One scan serves both pictures: the terminal's cells are groups of
    // the PNG's consecutive cells, and a Hilbert curve's groups of 4^k
    // consecutive indices fill the squares of the coarser curve.
    let scan_side = if a.output.is_some() || a.json {
        png_side
    } else {
        term_side
    };
    let ncells = u64::from(scan_side) * u64::from(scan_side);
    let factor = (ncells / (u64::from(term_side) * u64::from(term_side))) as usize;

    let img = a.devs.open()?;
    let spaces: Vec<(Space, String)> = if a.virtual_ {
        vec![(Space::Logical, "logical space".to_string())]
    } else {
        let sizes = btrkit_core::heatmap::device_sizes(&img)?;
        let devids: Vec<u64> = match a.devid {
            Some(d) if sizes.iter().any(|s| s.0 == d) => vec![d],
            Some(d) => anyhow::bail!(
                "the filesystem has no device {d} (its devids: {})",
                sizes
                    .iter()
                    .map(|s| s.0.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => sizes.iter().map(|s| s.0).collect(),
        };
        devids
            .into_iter()
            .map(|d| {
                // A set names its members; a single image is the path given.
                let name = match (img.device_of(d).is_some(), img.multi_device()) {
                    (true, true) => img.device_name(d),
                    (true, false) => format!("devid {d} ({})", a.devs.first().display()),
                    (false, _) => format!("devid {d} (missing)"),
                };
                (Space::Physical(d), name)
            })
            .collect()
    };
    let per_device = spaces.len() > 1;
    let mut pictures = Vec::new();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for (space, name) in spaces {
        let h = scan(&img, space, ncells)?;
        for w in &h.warnings {
            eprintln!("btrkit-dump: warning: {name}: {w}");
        }
        if let Some(o) = &a.output {
            let path = match space {
                Space::Physical(d) if per_device => per_device_path(o, d),
                _ => o.clone(),
            };
            write_png(&path, png_side, &pixels(&h, png_side))?;
            eprintln!(
                "btrkit-dump: wrote {}: {}",
                path.display(),
                title(&h, &name, png_side)
            );
        }
        if a.json {
            pictures.push(picture_json(&h, space, &name, png_side));
        }
        if a.term {
            let t = h.merged(factor.max(1));
            writeln!(out, "{}", title(&t, &name, term_side))?;
            for l in term_lines(&t, term_side) {
                writeln!(out, "{l}")?;
            }
        }
    }
    if a.json {
        serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "pictures": pictures }))?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(0)
}

/// One picture as `--json` prints it: the numbers its title gives, and
/// each allocated pixel where the PNG draws it.
fn picture_json(h: &Heatmap, space: Space, name: &str, side: u32) -> serde_json::Value {
    let by_kind = |v: &[u64; 4]| {
        let mut m = serde_json::Map::new();
        for k in [Kind::Data, Kind::Metadata, Kind::System, Kind::Mixed] {
            m.insert(k.name().to_string(), v[k as usize].into());
        }
        serde_json::Value::Object(m)
    };
    let pixels: Vec<serde_json::Value> = (0..h.cells.len())
        .filter_map(|i| {
            let kind = h.cells[i].kind()?;
            let (x, y) = hilbert_xy(side, i as u64);
            Some(serde_json::json!({
                "x": x,
                "y": y,
                "start": (i as u64).saturating_mul(h.bytes_per_cell),
                "bytes": h.cell_bytes(i),
                "type": kind.name(),
                "allocated": by_kind(&h.cells[i].allocated),
                "used": h.cells[i].used,
                "fill": h.fill(i),
            }))
        })
        .collect();
    serde_json::json!({
        "name": name,
        "space": match space { Space::Logical => "logical", Space::Physical(_) => "physical" },
        "devid": match space { Space::Physical(d) => Some(d), Space::Logical => None },
        "side": side,
        "bytes": h.total,
        "bytes_per_pixel": h.bytes_per_cell,
        "allocated": by_kind(&h.allocated),
        "used": h.used,
        "warnings": h.warnings,
        "pixels": pixels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_hilbert_curve_visits_every_pixel_once_in_steps_of_one() {
        for order in 1..=8u32 {
            let side = 1u32 << order;
            let n = u64::from(side) * u64::from(side);
            let mut seen = HashSet::new();
            let mut prev: Option<(u32, u32)> = None;
            for d in 0..n {
                let p = hilbert_xy(side, d);
                assert!(
                    p.0 < side && p.1 < side,
                    "order {order}: {p:?} off the picture"
                );
                assert!(seen.insert(p), "order {order}: {p:?} visited twice");
                if let Some(q) = prev {
                    let step = p.0.abs_diff(q.0) + p.1.abs_diff(q.1);
                    assert_eq!(step, 1, "order {order}: {q:?} to {p:?} at {d}");
                }
                prev = Some(p);
            }
            assert_eq!(seen.len() as u64, n);
            assert_eq!(hilbert_xy(side, 0), (0, 0));
            assert_eq!(hilbert_xy(side, n - 1), (side - 1, 0));
        }
    }

    #[test]
    fn groups_of_consecutive_indices_fill_the_coarser_curves_squares() {
        // What lets the terminal picture be the PNG's cells merged.
        for order in 2..=6u32 {
            let side = 1u32 << order;
            for d in 0..u64::from(side) * u64::from(side) {
                let (x, y) = hilbert_xy(side, d);
                assert_eq!(hilbert_xy(side / 4, d / 16), (x / 4, y / 4));
            }
        }
    }

    #[test]
    fn per_device_names() {
        assert_eq!(
            per_device_path(Path::new("/x/set.png"), 2),
            PathBuf::from("/x/set-dev2.png")
        );
        assert_eq!(
            per_device_path(Path::new("pic"), 1),
            PathBuf::from("pic-dev1")
        );
    }
}
