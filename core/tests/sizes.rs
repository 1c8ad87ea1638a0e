//! How big the engine's types and functions may grow, counted from the
//! source as `layers.rs` counts imports. A type with more than a hundred
//! methods does too many jobs: split it along them (as `Store` was split
//! into the tree editor and its views: `Chunks`, `ExtentRefs`, `Commit`,
//! `DataPath`, ...), never raise the limit. Functions of the files named
//! below were cut into named steps; they stay that way.

use std::collections::BTreeMap;
use std::path::Path;

/// Most methods one type may have (inherent impls, all files, tests out).
const MAX_METHODS: usize = 99;

/// Files whose functions were cut into named steps, and the longest a
/// function in them may be, in lines.
const STEPPED: &[&str] = &[
    "check/extents.rs",
    "check/repair.rs",
    "mkfs/mod.rs",
    "restore/copy.rs",
];
const MAX_FN_LINES: usize = 150;

/// The part of a source file before its unit tests.
fn code_of(text: &str) -> &str {
    match text.find("\n#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The type an inherent impl header names (`impl Foo {`, `impl<'a> Foo<'a>
/// {`); None for trait impls and anything else.
fn inherent_impl(line: &str) -> Option<String> {
    let rest = line.strip_prefix("impl")?;
    let rest = if let Some(r) = rest.strip_prefix('<') {
        let close = r.find('>')?;
        &r[close + 1..]
    } else {
        rest
    };
    let rest = rest.strip_prefix(' ')?.trim_end();
    if !rest.ends_with('{') || rest.contains(" for ") {
        return None;
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Whether `line` starts a method at the impl's indentation.
fn is_method(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("    ") else {
        return false;
    };
    if rest.starts_with(' ') {
        return false;
    }
    let rest = rest
        .strip_prefix("pub(crate) ")
        .or_else(|| rest.strip_prefix("pub(super) "))
        .or_else(|| rest.strip_prefix("pub "))
        .unwrap_or(rest);
    let rest = rest.strip_prefix("const ").unwrap_or(rest);
    let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
    rest.starts_with("fn ")
}

/// Methods per type over every file of `core/src`.
fn methods_per_type(src: &Path) -> BTreeMap<String, usize> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut count = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut current: Option<String> = None;
        for line in code_of(&text).lines() {
            if let Some(t) = inherent_impl(line) {
                current = Some(t);
            } else if line.starts_with('}') {
                current = None;
            } else if let Some(t) = &current {
                if is_method(line) {
                    *count.entry(t.clone()).or_insert(0) += 1;
                }
            }
        }
    }
    count
}

/// Every function of `text` longer than `max` lines: (name, lines).
fn long_functions(text: &str, max: usize) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code_of(text).lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let body = l.trim_start();
        let indent = &l[..l.len() - body.len()];
        let body = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .find_map(|p| body.strip_prefix(p))
            .unwrap_or(body);
        let Some(sig) = body.strip_prefix("fn ") else {
            continue;
        };
        let name: String = sig
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // A one-line function closes where it opens.
        if l.contains('{') && l.matches('{').count() == l.matches('}').count() {
            continue;
        }
        // The body ends at the first line closing at the signature's indent.
        let close = format!("{indent}}}");
        let Some(end) = lines[i + 1..].iter().position(|x| x.trim_end() == close) else {
            continue;
        };
        let len = end + 2;
        if len > max {
            out.push((name, len));
        }
    }
    out
}

#[test]
fn no_type_has_more_than_a_hundred_methods() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let count = methods_per_type(&src);
    for t in ["Store", "Filesystem"] {
        assert!(
            count.contains_key(t),
            "no methods of {t} found: the counter is broken"
        );
    }
    let over: Vec<_> = count.iter().filter(|(_, &n)| n > MAX_METHODS).collect();
    assert!(
        over.is_empty(),
        "types with more than {MAX_METHODS} methods (split them along their jobs): {over:?}"
    );
}

#[test]
fn stepped_functions_stay_short() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for f in STEPPED {
        let text = std::fs::read_to_string(src.join(f)).unwrap();
        for (name, n) in long_functions(&text, MAX_FN_LINES) {
            long.push(format!("{f}: {name} ({n} lines)"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines; cut them into named steps: {long:?}"
    );
}

#[test]
fn counters_count() {
    let text = "impl Foo {\n    pub fn a(&self) {}\n    fn b(&self) {\n        x\n    }\n}\nimpl Bar for Foo {\n    fn c() {}\n}\nimpl<'a> Baz<'a> {\n    pub(super) fn d() {}\n}\n";
    let dir = std::env::temp_dir().join(format!("btrkit-sizes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("x.rs"), text).unwrap();
    let count = methods_per_type(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(count.get("Foo"), Some(&2));
    assert_eq!(count.get("Baz"), Some(&1));
    assert_eq!(count.get("Bar"), None);
    assert_eq!(long_functions(text, 2), vec![("b".to_string(), 3)]);
}
