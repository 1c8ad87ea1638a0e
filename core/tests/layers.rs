//! The layer order of `core/src`: no module names a module above it
//! (format, util, io, chunk, tree, alloc, trans, fs, log, check,
//! restore, rescue, mount_view, heatmap, balance, resize and subvolume,
//! mkfs, tune, offline, device_change and send, workload; the top-level files sit
//! in the layer of what they are). A module's own tests (from its
//! `#[cfg(test)]` on) may use anything.

use std::collections::BTreeSet;
use std::path::Path;

/// Lowest first; each entry one layer of modules (a top-level file or
/// directory of `core/src`).
const LAYERS: &[&[&str]] = &[
    &["format", "error"],
    &["util", "csum"],
    &["io"],
    &["chunk"],
    &["tree", "image", "devices"],
    &["alloc"],
    &["trans"],
    &["fs"],
    &["log"],
    &[
        "check",
        "restore",
        "rescue",
        "mount_view",
        "usage",
        "heatmap",
        "balance",
        "resize",
        "subvolume",
    ],
    &["mkfs"],
    &["tune"],
    &["offline", "device_change", "send", "mount_rw"],
    &["workload"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level modules `text` names through `crate::` paths, grouped
/// imports (`use crate::{a::x, b}`) included.
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: after `{` and after each `,`
            // at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                if start && !c.is_whitespace() {
                    let name = ident(&group[j..]);
                    if !name.is_empty() {
                        out.insert(name);
                    }
                    start = false;
                }
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            visit(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

#[test]
fn no_module_names_a_module_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    visit(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" {
            continue;
        }
        let Some(mine) = layer_of(&top) else {
            wrong.push(format!("{}: module {top} has no layer", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        let code = match text.find("#[cfg(test)]") {
            Some(i) => &text[..i],
            None => &text,
        };
        seen += 1;
        for m in named_modules(code) {
            if let Some(theirs) = layer_of(&m) {
                if theirs > mine {
                    wrong.push(format!(
                        "{}: {top} names {m}, a layer above it",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(seen > 100, "only {seen} files of core/src read");
    assert!(
        wrong.is_empty(),
        "layer order broken:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_scan_sees_paths_and_grouped_imports() {
    let m = named_modules(
        "use crate::fs::Loc;\nuse crate::{\n    format::key::Key,\n    trans::{Store, TreeId},\n    Error,\n};\nlet x = crate::mkfs::now_ts(1);",
    );
    let want: BTreeSet<String> = ["fs", "format", "trans", "Error", "mkfs"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(m, want);
    // A module placed above its importer is caught.
    assert!(layer_of("workload") > layer_of("io"));
}
