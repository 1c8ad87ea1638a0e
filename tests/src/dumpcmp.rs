//! `btrkit-dump tree` against `btrfs inspect-internal dump-tree`.
//!
//! Only the item lines are compared — `\titem N key (...) itemoff X itemsize Y`
//! — because they pin down every tree's exact content and layout (key order,
//! leaf boundaries via the slot numbers, item offsets and sizes) while leaving
//! the rest of the output format free.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// The item lines of a dump-tree output, trailing whitespace removed.
pub fn item_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| is_item_line(l))
        .map(|l| l.trim_end().to_string())
        .collect()
}

/// `^\titem \d+ key `
fn is_item_line(l: &str) -> bool {
    let Some(rest) = l.strip_prefix("\titem ") else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with(" key ")
}

fn run_capture(cmd: &mut Command) -> Result<String, String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| format!("{shown}: cannot start: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err: Vec<&str> = err.lines().take(10).collect();
        return Err(format!(
            "{shown} exited with {}: {}",
            out.status,
            err.join(" | ")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `btrkit-dump tree IMAGE [--tree T]`.
pub fn dump_ours(image: &Path, tree: Option<&str>) -> Result<String, String> {
    let mut c = Command::new(crate::bin_path("btrkit-dump"));
    c.arg("tree").arg(image);
    if let Some(t) = tree {
        c.args(["--tree", t]);
    }
    run_capture(&mut c)
}

/// `btrkit-dump tree --json IMAGE [--tree T]`, turned back into item lines
/// (`\titem N key (...) itemoff X itemsize Y`) in document order. Every
/// block must also hold as many items or pointers as its `nritems` says,
/// and every item a `body` object.
pub fn json_item_lines(image: &Path, tree: Option<&str>) -> Result<Vec<String>, String> {
    let mut c = Command::new(crate::bin_path("btrkit-dump"));
    c.arg("tree").arg("--json").arg(image);
    if let Some(t) = tree {
        c.args(["--tree", t]);
    }
    let text = run_capture(&mut c)?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("btrkit-dump tree --json: not JSON: {e}"))?;
    let trees = doc["trees"]
        .as_array()
        .ok_or("btrkit-dump tree --json: no \"trees\" array")?;
    let mut out = Vec::new();
    for t in trees {
        for b in t["blocks"].as_array().ok_or("a tree without \"blocks\"")? {
            if b.get("error").is_some() {
                continue;
            }
            let nr = b["nritems"].as_u64().ok_or("a block without nritems")? as usize;
            let damaged = b["problems"].as_array().is_some_and(|p| !p.is_empty());
            if let Some(items) = b["items"].as_array() {
                if items.len() != nr && !damaged {
                    return Err(format!(
                        "block {}: nritems {nr} but {} items",
                        b["bytenr"],
                        items.len()
                    ));
                }
                for it in items {
                    if !it["body"].is_object() {
                        return Err(format!("block {}: item without a body: {it}", b["bytenr"]));
                    }
                    out.push(format!(
                        "\titem {} key {} itemoff {} itemsize {}",
                        it["slot"],
                        it["key"]["text"].as_str().unwrap_or("?"),
                        it["itemoff"],
                        it["itemsize"]
                    ));
                }
            } else if b["ptrs"].as_array().map(|p| p.len()) != Some(nr) && !damaged {
                return Err(format!(
                    "node {}: nritems {nr} but pointers {:?}",
                    b["bytenr"],
                    b["ptrs"].as_array().map(|p| p.len())
                ));
            }
        }
    }
    Ok(out)
}

/// `btrfs inspect-internal dump-tree [-t T] IMAGE`.
pub fn dump_progs(image: &Path, tree: Option<&str>) -> Result<String, String> {
    let mut c = Command::new("btrfs");
    c.args(["inspect-internal", "dump-tree"]);
    if let Some(t) = tree {
        c.args(["-t", t]);
    }
    c.arg(image);
    run_capture(&mut c)
}

/// True for a dump-tree section header line: `root tree`, `chunk tree`,
/// `log root tree`, `fs tree key (FS_TREE ROOT_ITEM 0) `, `log tree key (...)`.
fn is_section_header(l: &str) -> bool {
    let l = l.trim_end();
    let head = match l.find(" tree") {
        Some(i) => &l[..i],
        None => return false,
    };
    let rest = &l[head.len() + " tree".len()..];
    !head.is_empty()
        && head.bytes().all(|b| b.is_ascii_lowercase() || b == b' ')
        && (rest.is_empty() || rest.starts_with(" key ("))
}

/// The item lines of a btrfs-progs dump with the log root tree and the log
/// trees left out.
pub fn item_lines_without_logs(text: &str) -> Vec<String> {
    let mut in_log = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if is_section_header(l) {
            in_log = l.starts_with("log ");
        } else if !in_log && is_item_line(l) {
            out.push(l.trim_end().to_string());
        }
    }
    out
}

/// Result of comparing two item-line lists.
#[derive(Debug)]
pub struct Comparison {
    pub ours: usize,
    pub theirs: usize,
    /// Same lines in the same order.
    pub in_order: bool,
    /// Same lines, counted with multiplicity, in any order.
    pub same_multiset: bool,
    /// A short, diff-like excerpt of what differs (empty when `in_order`).
    pub report: String,
}

fn counts(v: &[String]) -> BTreeMap<&str, i64> {
    let mut m = BTreeMap::new();
    for l in v {
        *m.entry(l.as_str()).or_insert(0) += 1;
    }
    m
}

/// Compare item lines: ours (`-`) against btrfs-progs (`+`).
pub fn compare(ours: &[String], theirs: &[String]) -> Comparison {
    let in_order = ours == theirs;
    let (co, ct) = (counts(ours), counts(theirs));
    let same_multiset = co == ct;
    let mut report = String::new();
    if !in_order {
        let first = ours
            .iter()
            .zip(theirs)
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(theirs.len()));
        report += &format!(
            "--- btrkit-dump ({} item lines)\n+++ btrfs dump-tree ({} item lines)\n@@ first difference at item line {} @@\n",
            ours.len(),
            theirs.len(),
            first + 1
        );
        for l in &ours[first.saturating_sub(3)..first] {
            report += &format!(" {l}\n");
        }
        for l in ours.iter().skip(first).take(6) {
            report += &format!("-{l}\n");
        }
        for l in theirs.iter().skip(first).take(6) {
            report += &format!("+{l}\n");
        }
        if same_multiset {
            report += "(same item lines as a multiset: only the order differs)\n";
        } else {
            let mut only_ours = Vec::new();
            let mut only_theirs = Vec::new();
            for (l, n) in &co {
                let d = n - ct.get(l).copied().unwrap_or(0);
                if d > 0 {
                    only_ours.push(format!("-{l}  (x{d})"));
                }
            }
            for (l, n) in &ct {
                let d = n - co.get(l).copied().unwrap_or(0);
                if d > 0 {
                    only_theirs.push(format!("+{l}  (x{d})"));
                }
            }
            report += &format!(
                "as multisets: {} distinct lines only in btrkit-dump, {} only in btrfs dump-tree\n",
                only_ours.len(),
                only_theirs.len()
            );
            for l in only_ours.iter().take(10).chain(only_theirs.iter().take(10)) {
                report += l;
                report += "\n";
            }
        }
    }
    Comparison {
        ours: ours.len(),
        theirs: theirs.len(),
        in_order,
        same_multiset,
        report,
    }
}

/// How strict a comparison is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Same lines in the same order (one tree: key order is fixed).
    Exact,
    /// Same multiset; a different order of trees is reported, not failed.
    AnyTreeOrder,
}

/// Dump `image` (whole, or one tree) with both tools and compare item lines.
/// Returns `Err(report)` on a mismatch or when a tool fails.
pub fn check_image(
    label: &str,
    image: &Path,
    tree: Option<&str>,
    order: Order,
) -> Result<usize, String> {
    let what = match tree {
        Some(t) => format!("{label} --tree {t}"),
        None => format!("{label} (all trees)"),
    };
    let theirs_txt =
        dump_progs(image, tree).map_err(|e| format!("{what}: btrfs-progs failed: {e}"))?;
    let ours_txt = dump_ours(image, tree).map_err(|e| {
        if e.contains("unexpected argument '--tree'") {
            format!("{what}: btrkit-dump has no --tree option yet")
        } else {
            format!("{what}: btrkit-dump failed: {e}")
        }
    })?;
    let errors = ours_txt.lines().filter(|l| l.starts_with("ERROR")).count();
    if errors > 0 {
        eprintln!("note: {what}: btrkit-dump printed {errors} ERROR lines");
    }
    let theirs = item_lines(&theirs_txt);
    let ours = item_lines(&ours_txt);
    // The JSON dump walks the same trees: the same item lines, in order.
    let json = json_item_lines(image, tree).map_err(|e| format!("{what}: {e}"))?;
    if json != ours {
        let c = compare(&json, &ours);
        return Err(format!(
            "{what}: --json items differ from the text dump's\n{}",
            c.report.replace("btrfs dump-tree", "btrkit-dump text")
        ));
    }
    // A whole image always has items; one tree may be empty (the csum tree
    // of a fresh image), and then both sides must agree on that.
    if theirs.is_empty() && (tree.is_none() || !theirs_txt.contains("leaf ")) {
        return Err(format!(
            "{what}: btrfs dump-tree printed no item lines nor an empty leaf"
        ));
    }
    let c = compare(&ours, &theirs);
    if c.in_order {
        eprintln!("ok: {what}: {} item lines identical, in order", c.ours);
        return Ok(c.ours);
    }
    if c.same_multiset && order == Order::AnyTreeOrder {
        eprintln!(
            "ok: {what}: {} item lines equal as multisets; the order of trees differs",
            c.ours
        );
        return Ok(c.ours);
    }
    // Name the most likely cause when the only difference is the log trees.
    let no_logs = item_lines_without_logs(&theirs_txt);
    if no_logs.len() != theirs.len() && compare(&ours, &no_logs).same_multiset {
        return Err(format!(
            "{what}: item lines differ only by the log root tree and log trees ({} item lines), \
             which btrkit-dump does not print",
            theirs.len() - no_logs.len()
        ));
    }
    let ours_no_logs = item_lines_without_logs(&ours_txt);
    if ours_no_logs.len() != ours.len() && compare(&ours_no_logs, &theirs).same_multiset {
        return Err(format!(
            "{what}: btrkit-dump also prints log trees ({} item lines) that btrfs dump-tree does not \
             print here; the other item lines match",
            ours.len() - ours_no_logs.len()
        ));
    }
    Err(format!("{what}: item lines differ\n{}", c.report))
}

/// Run several checks, print every failure, and panic if any failed (so one
/// test shows all its mismatches, not just the first).
pub fn assert_all(results: Vec<Result<usize, String>>) {
    let fails: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if !fails.is_empty() {
        for f in &fails {
            eprintln!("MISMATCH: {f}");
        }
        panic!(
            "{} comparison(s) failed:\n{}",
            fails.len(),
            fails.join("\n")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_line_filter() {
        let t = "leaf 1 items 2\n\titem 0 key (1 INODE_ITEM 0) itemoff 1 itemsize 2 \n\t\titem x\n\titem a key\n\titem 12 key (2 X 3) itemoff 0 itemsize 0\n";
        assert_eq!(
            item_lines(t),
            vec![
                "\titem 0 key (1 INODE_ITEM 0) itemoff 1 itemsize 2",
                "\titem 12 key (2 X 3) itemoff 0 itemsize 0"
            ]
        );
    }

    #[test]
    fn log_sections() {
        let t = "root tree\nleaf 1\n\titem 0 key (a) x\nlog root tree\n\titem 0 key (l) x\nfs tree key (FS_TREE ROOT_ITEM 0) \n\titem 0 key (f) x\nlog tree key (TREE_LOG ROOT_ITEM 5) \n\titem 0 key (g) x\ntotal bytes 1\n";
        assert_eq!(item_lines(t).len(), 4);
        assert_eq!(
            item_lines_without_logs(t),
            vec!["\titem 0 key (a) x", "\titem 0 key (f) x"]
        );
    }

    #[test]
    fn compare_orders() {
        let a: Vec<String> = ["x", "y", "z"].iter().map(|s| s.to_string()).collect();
        let mut b = a.clone();
        assert!(compare(&a, &b).in_order);
        b.swap(0, 2);
        let c = compare(&a, &b);
        assert!(!c.in_order && c.same_multiset);
        b[0] = "w".into();
        let c = compare(&a, &b);
        assert!(!c.same_multiset);
        assert!(c.report.contains("+w"), "{}", c.report);
    }
}
