//! `btrkit-dump log`: the fsync log, one section per logged inode. The
//! reading and grouping is `btrkit_core::log::inspect`; this file only lays
//! the result out as comfy-table tables or JSON.

use btrkit_core::format::names::{key_string, objectid_name};

use btrkit_core::log::inspect::{
    inspect_log, DirEntryKind, DirLogKind, ExtentKind, LogDump, LogProblem, LoggedExtent,
    LoggedInode, NameKind, OtherItem, SubvolLog, Time, TreeInfo,
};
use comfy_table::{presets, Cell, Table};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;

#[derive(clap::Args)]
#[command(
    after_help = "Prints `(no log)` (JSON: {\"log\": null}) when the superblock has no log root.\n\
Exit status: 0 when the log (or its absence) was read cleanly, 1 when a log block or item is \
damaged (everything still readable is printed) or the image cannot be opened.\n\nExamples:\n  \
btrkit-dump log crash.img\n  btrkit-dump log crash.img --json"
)]
pub struct Args {
    #[command(flatten)]
    pub dev: crate::devices::Devices,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    log: Option<&'a LogDump>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let img = a.dev.open()?;
    let dump = inspect_log(&img);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if a.json {
        serde_json::to_writer_pretty(&mut out, &JsonOut { log: dump.as_ref() })?;
        writeln!(out)?;
    } else {
        match &dump {
            None => writeln!(out, "(no log)")?,
            Some(d) => out.write_all(render(d).as_bytes())?,
        }
    }
    out.flush()?;
    match &dump {
        Some(d) if d.is_damaged() => {
            eprintln!(
                "btrkit-dump: the log is damaged: {} problem(s), see the output",
                d.problem_count()
            );
            Ok(1)
        }
        _ => Ok(0),
    }
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::ASCII_FULL_CONDENSED);
    t
}

fn tree_line(t: &TreeInfo) -> String {
    let mut s = format!(
        "bytenr {} level {} generation {}",
        t.bytenr, t.level, t.generation
    );
    match t.block_generation {
        Some(g) if g != t.generation => {
            let _ = write!(s, " (root block says {g})");
        }
        Some(_) => {}
        None => s.push_str(" (root block unreadable)"),
    }
    let _ = write!(
        s,
        ", {} block{}, {} item{}",
        t.blocks,
        plural(t.blocks),
        t.items,
        plural(t.items)
    );
    s
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn render(d: &LogDump) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "log root tree: {}", tree_line(&d.log_root));
    let _ = writeln!(
        o,
        "last committed generation {}; the log holds fsyncs of transaction {}",
        d.super_generation,
        d.super_generation + 1
    );
    if d.log_root_transid != 0 {
        let _ = writeln!(o, "log_root_transid (deprecated) {}", d.log_root_transid);
    }
    let _ = writeln!(
        o,
        "{} subvolume log{}",
        d.subvols.len(),
        plural(d.subvols.len())
    );
    if !d.other.is_empty() {
        o.push_str("\nother items in the log root tree\n");
        o.push_str(&other_table(&d.other));
        o.push('\n');
    }
    if !d.problems.is_empty() {
        o.push_str("\nproblems in the log root tree\n");
        o.push_str(&problem_table(&d.problems));
        o.push('\n');
    }
    for s in &d.subvols {
        render_subvol(&mut o, s);
    }
    let n = d.problem_count();
    if n > 0 {
        let _ = writeln!(o, "\nlog DAMAGED: {n} problem{}", plural(n));
    }
    o
}

fn subvol_name(id: u64) -> String {
    match objectid_name(id) {
        Some(n) if id < 256 => format!("{id} ({n})"),
        _ => id.to_string(),
    }
}

fn render_subvol(o: &mut String, s: &SubvolLog) {
    let _ = writeln!(
        o,
        "\n=== subvolume {}: log tree {}, {} inode{} ===",
        subvol_name(s.subvol),
        tree_line(&s.tree),
        s.inodes.len(),
        plural(s.inodes.len())
    );
    for i in &s.inodes {
        o.push('\n');
        render_inode(o, i);
    }
    if !s.csums.is_empty() {
        let total: u64 = s.csums.iter().map(|c| c.len).sum();
        let _ = writeln!(
            o,
            "\ndata checksums: {} item{}, {total} bytes of data",
            s.csums.len(),
            plural(s.csums.len())
        );
        let mut t = table();
        t.set_header(vec!["disk start", "disk end", "length", "csums"]);
        for c in &s.csums {
            t.add_row(vec![
                c.start.to_string(),
                (c.start.saturating_add(c.len)).to_string(),
                c.len.to_string(),
                c.csums.to_string(),
            ]);
        }
        let _ = writeln!(o, "{t}");
    }
    if !s.other.is_empty() {
        o.push_str("\nother items\n");
        o.push_str(&other_table(&s.other));
        o.push('\n');
    }
    if !s.problems.is_empty() {
        let _ = writeln!(o, "\nproblems in the log of subvolume {}", s.subvol);
        o.push_str(&problem_table(&s.problems));
        o.push('\n');
    }
}

fn render_inode(o: &mut String, i: &LoggedInode) {
    let kind = i
        .inode
        .as_ref()
        .map(|s| s.kind)
        .unwrap_or("no inode item logged");
    let path = i.path.as_deref().unwrap_or("(no name)");
    let _ = writeln!(o, "inode {}  {path}  ({kind})", i.ino);
    let mut t = table();
    t.set_header(vec!["item", "key offset", "details"]);
    if let Some(s) = &i.inode {
        let flags = if s.flag_names.is_empty() {
            "none".to_string()
        } else {
            s.flag_names.join("|")
        };
        let mut d = format!(
            "mode {:o} size {} nbytes {} nlink {} uid {} gid {}\ngeneration {} transid {} sequence {} flags 0x{:x} ({flags})",
            s.mode, s.size, s.nbytes, s.nlink, s.uid, s.gid, s.generation, s.transid, s.sequence, s.flags
        );
        if s.rdev != 0 {
            let _ = write!(d, " rdev {}", s.rdev);
        }
        for (n, tm) in [
            ("atime", &s.atime),
            ("ctime", &s.ctime),
            ("mtime", &s.mtime),
            ("otime", &s.otime),
        ] {
            let _ = write!(d, "\n{n} {}", time_str(tm));
        }
        t.add_row(vec![Cell::new("INODE_ITEM"), Cell::new("0"), Cell::new(d)]);
    }
    if i.orphan {
        t.add_row(vec![
            "ORPHAN_ITEM",
            "",
            "orphan: no links left; replay deletes the inode",
        ]);
    }
    for n in &i.names {
        let (ty, off) = match n.kind {
            NameKind::Ref => ("INODE_REF", n.parent.to_string()),
            NameKind::Extref => ("INODE_EXTREF", "(hash)".to_string()),
        };
        t.add_row(vec![
            ty.to_string(),
            off,
            format!("\"{}\" in dir {} index {}", n.name, n.parent, n.index),
        ]);
    }
    for r in &i.dir_log_ranges {
        let ty = match r.kind {
            DirLogKind::DirLogItem => "DIR_LOG_ITEM",
            DirLogKind::DirLogIndex => "DIR_LOG_INDEX",
        };
        let end = if r.end == u64::MAX {
            "-1 (end)".to_string()
        } else {
            r.end.to_string()
        };
        t.add_row(vec![
            ty.to_string(),
            r.start.to_string(),
            format!("logged range {} .. {end}", r.start),
        ]);
    }
    for e in &i.dir_entries {
        let ty = match e.kind {
            DirEntryKind::DirItem => "DIR_ITEM",
            DirEntryKind::DirIndex => "DIR_INDEX",
        };
        t.add_row(vec![
            ty.to_string(),
            e.key_offset.to_string(),
            format!(
                "\"{}\" -> {} {} transid {}",
                e.name,
                key_string(&e.location),
                e.type_name,
                e.transid
            ),
        ]);
    }
    for x in &i.xattrs {
        t.add_row(vec![
            "XATTR_ITEM".to_string(),
            "(hash)".to_string(),
            format!("{} = {} ({} bytes)", x.name, x.value_preview, x.value_len),
        ]);
    }
    for e in &i.extents {
        t.add_row(vec![
            "EXTENT_DATA".to_string(),
            e.file_offset.to_string(),
            extent_str(e),
        ]);
    }
    for x in &i.other {
        t.add_row(vec![
            x.type_name.clone(),
            x.key.offset.to_string(),
            other_str(x),
        ]);
    }
    let _ = writeln!(o, "{t}");
}

fn extent_str(e: &LoggedExtent) -> String {
    let mut s = match e.kind {
        ExtentKind::Inline => format!(
            "inline {} bytes, ram {}",
            e.inline_len.unwrap_or(0),
            e.ram_bytes
        ),
        ExtentKind::Regular | ExtentKind::Prealloc => {
            let what = if e.kind == ExtentKind::Prealloc {
                "prealloc"
            } else {
                "regular"
            };
            let (db, dn, off, n) = (
                e.disk_bytenr.unwrap_or(0),
                e.disk_num_bytes.unwrap_or(0),
                e.offset.unwrap_or(0),
                e.num_bytes.unwrap_or(0),
            );
            let range = format!("[{}, {})", e.file_offset, e.file_offset.saturating_add(n));
            if db == 0 {
                format!("{what} hole {range}, ram {}", e.ram_bytes)
            } else {
                format!(
                    "{what} {range}: disk {db} len {dn} offset {off}, ram {}",
                    e.ram_bytes
                )
            }
        }
    };
    if e.compression != "none" {
        let _ = write!(s, ", {}", e.compression);
    }
    if let (Some(have), Some(need)) = (e.csum_bytes_in_log, e.csum_bytes_needed) {
        if have < need {
            let _ = write!(s, ", log csums for {have} of {need} bytes");
        }
    }
    if e.encryption != 0 || e.other_encoding != 0 {
        let _ = write!(
            s,
            ", encryption {} other_encoding {}",
            e.encryption, e.other_encoding
        );
    }
    let _ = write!(s, ", gen {}", e.generation);
    s
}

fn other_str(x: &OtherItem) -> String {
    match &x.error {
        Some(e) => format!("{} bytes, DAMAGED: {e}", x.size),
        None => format!("{} bytes", x.size),
    }
}

fn other_table(v: &[OtherItem]) -> String {
    let mut t = table();
    t.set_header(vec!["key", "size", "note"]);
    for x in v {
        t.add_row(vec![
            key_string(&x.key),
            x.size.to_string(),
            x.error
                .clone()
                .map(|e| format!("DAMAGED: {e}"))
                .unwrap_or_default(),
        ]);
    }
    format!("{t}")
}

fn problem_table(v: &[LogProblem]) -> String {
    let mut t = table();
    t.set_header(vec!["block", "key", "problem"]);
    for p in v {
        t.add_row(vec![
            p.bytenr.to_string(),
            p.key.as_ref().map(key_string).unwrap_or_default(),
            p.message.clone(),
        ]);
    }
    format!("{t}")
}

/// `sec.nsec (YYYY-MM-DD HH:MM:SS)` in UTC, as dump-tree shows times.
fn time_str(t: &Time) -> String {
    let days = t.sec.div_euclid(86400);
    let secs = t.sec.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{}.{:09} ({y:04}-{m:02}-{d:02} {:02}:{:02}:{:02})",
        t.sec,
        t.nsec,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Proleptic Gregorian date of a day count from 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    // Shift to an era starting 0000-03-01 so leap days fall at era ends.
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(
            time_str(&Time {
                sec: 1796023614,
                nsec: 823479627
            }),
            "1796023614.823479627 (2026-11-30 07:26:54)"
        );
        assert_eq!(
            time_str(&Time {
                sec: -1,
                nsec: 500_000_000
            }),
            "-1.500000000 (1969-12-31 23:59:59)"
        );
        assert_eq!(
            time_str(&Time {
                sec: -315_619_200,
                nsec: 0
            }),
            "-315619200.000000000 (1960-01-01 00:00:00)"
        );
        // No overflow at the ends of the range.
        let _ = time_str(&Time {
            sec: i64::MIN,
            nsec: 0,
        });
        let _ = time_str(&Time {
            sec: i64::MAX,
            nsec: 0,
        });
    }
}
