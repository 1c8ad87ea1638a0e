//! What a user sees of a filesystem, path by path: the common currency of
//! every comparison (engine against kernel, replay against the kernel's
//! replay) and of a script's `expect` lines. Each backend builds it its own
//! way (syscalls on a mount, or the engine's own view); this module compares.

use super::script::{AllocKind, Expect, Script};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// What a user sees of one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `f` file, `d` directory, `l` symlink, `p` fifo, `c`/`b` device, `s` socket.
    pub kind: char,
    /// Inode number (`st_ino`); a diff can ignore it with the `ino` field name.
    pub ino: u64,
    /// Permission and set-id bits (the type is `kind`).
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// `st_size` in bytes: the file size, a symlink's target length, a
    /// directory's Btrfs i_size (twice the total length of its names).
    pub size: u64,
    /// Hard link count (`st_nlink`).
    pub nlink: u64,
    /// Content digest of a regular file ([`content_hash`]).
    pub hash: Option<String>,
    /// MD5 of a regular file's content, hex (`expect md5`).
    pub md5: Option<String>,
    /// A symlink's target.
    pub target: Option<String>,
    /// Device number (major, minor) of a device node.
    pub rdev: Option<(u32, u32)>,
    /// `user.*` extended attributes.
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// A regular file's logical extent map (as FIEMAP shows it): `[start,
    /// end)` runs of `data` or `unwritten` space, adjacent runs of one kind
    /// merged, holes left out.
    pub alloc: Vec<(u64, u64, &'static str)>,
}

/// BLAKE2b-256 of a byte string, as hex.
pub fn content_hash(data: &[u8]) -> String {
    hex(&crate::csum::CsumType::Blake2b.compute(data)[..32])
}

/// MD5 of a byte string, as 32 lowercase hex digits (`expect md5`).
pub fn md5_hex(data: &[u8]) -> String {
    use md5::Digest;
    hex(&md5::Md5::digest(data))
}

/// Bytes as lowercase hex, two digits each, no separator.
pub fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// Append `[start, end)` of `kind` to an extent map, merging with the last
/// run when they touch and agree.
pub fn push_alloc(v: &mut Vec<(u64, u64, &'static str)>, start: u64, end: u64, kind: &'static str) {
    match v.last_mut() {
        Some(l) if l.1 == start && l.2 == kind => l.1 = end,
        _ => v.push((start, end, kind)),
    }
}

impl Entry {
    /// Fields compared between manifests, in a stable order.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("type", self.kind.to_string()),
            ("ino", self.ino.to_string()),
            ("mode", format!("{:o}", self.mode)),
            ("uid", self.uid.to_string()),
            ("gid", self.gid.to_string()),
            ("size", self.size.to_string()),
            ("nlink", self.nlink.to_string()),
        ];
        if let Some(h) = &self.hash {
            v.push(("hash", h[..16.min(h.len())].to_string()));
        }
        if let Some(t) = &self.target {
            v.push(("target", format!("{t:?}")));
        }
        if let Some((a, b)) = self.rdev {
            v.push(("rdev", format!("{a}:{b}")));
        }
        if !self.xattrs.is_empty() {
            let x: Vec<String> = self
                .xattrs
                .iter()
                .map(|(k, v)| format!("{k}={:?}", String::from_utf8_lossy(v)))
                .collect();
            v.push(("xattrs", x.join(",")));
        }
        if !self.alloc.is_empty() {
            let a: Vec<String> = self
                .alloc
                .iter()
                .map(|(s, e, k)| format!("[{s},{e})={k}"))
                .collect();
            v.push(("alloc", a.join(" ")));
        }
        v
    }

    /// Kinds covering `[lo, hi)` of the extent map.
    fn kinds_in(&self, lo: u64, hi: u64) -> BTreeSet<&'static str> {
        let mut kinds = BTreeSet::new();
        let mut pos = lo;
        for &(s, e, k) in &self.alloc {
            if e <= pos || s >= hi {
                continue;
            }
            if s > pos {
                kinds.insert("hole");
            }
            kinds.insert(k);
            pos = pos.max(e);
            if pos >= hi {
                break;
            }
        }
        if pos < hi {
            kinds.insert("hole");
        }
        kinds
    }
}

/// Every path of a filesystem (`/` is the root) with what a user sees of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Every path, absolute from the filesystem root (`/`, `/a/b`), in byte
    /// order.
    pub entries: BTreeMap<String, Entry>,
}

impl Manifest {
    /// One line per path.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for (p, e) in &self.entries {
            let f: Vec<String> = e
                .fields()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(s, "{p} {}", f.join(" "));
        }
        s
    }

    /// Differences from `self` (A) to `other` (B), one line each; empty when equal.
    pub fn diff(&self, other: &Manifest) -> Vec<String> {
        self.diff_ignoring(other, &[])
    }

    /// [`diff`](Self::diff) without the named fields (say `ino`).
    pub fn diff_ignoring(&self, other: &Manifest, ignore: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        let keys: BTreeSet<&String> = self.entries.keys().chain(other.entries.keys()).collect();
        for k in keys {
            match (self.entries.get(k), other.entries.get(k)) {
                (Some(_), None) => out.push(format!("only in A: {k}")),
                (None, Some(_)) => out.push(format!("only in B: {k}")),
                (Some(a), Some(b)) => {
                    let fa: BTreeMap<_, _> = a
                        .fields()
                        .into_iter()
                        .filter(|(f, _)| !ignore.contains(f))
                        .collect();
                    let fb: BTreeMap<_, _> = b
                        .fields()
                        .into_iter()
                        .filter(|(f, _)| !ignore.contains(f))
                        .collect();
                    let mut d = Vec::new();
                    for f in fa.keys().chain(fb.keys()).collect::<BTreeSet<_>>() {
                        let (x, y) = (
                            fa.get(f).map(String::as_str).unwrap_or("-"),
                            fb.get(f).map(String::as_str).unwrap_or("-"),
                        );
                        if x != y {
                            d.push(format!("{f} {x} vs {y}"));
                        }
                    }
                    if a.hash != b.hash && d.iter().all(|l| !l.starts_with("hash")) {
                        d.push("hash differs".into());
                    }
                    if !d.is_empty() {
                        out.push(format!("differs {k}: {}", d.join("; ")));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The diff shortened for a failure message.
    pub fn short_diff(&self, other: &Manifest, max: usize) -> String {
        let d = self.diff(other);
        let mut s: Vec<String> = d.iter().take(max).cloned().collect();
        if d.len() > max {
            s.push(format!("... and {} more", d.len() - max));
        }
        s.join("\n")
    }

    /// The manifest without a subtree (say the warm-up directory).
    pub fn without(&self, dir: &str) -> Manifest {
        let pre = format!("{}/", dir.trim_end_matches('/'));
        Manifest {
            entries: self
                .entries
                .iter()
                .filter(|(k, _)| k.as_str() != dir && !k.starts_with(&pre))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

/// What a backend found beyond the manifest: the checker's verdict after
/// recovery (`expect consistent`) and the results of `expect post` steps,
/// in script order.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The checker's verdict on the recovered image (`btrfs check` for the
    /// kernel, the engine's checker for the engine), `Err` with the first
    /// errors; None when the backend did not check.
    pub consistent: Option<Result<(), String>>,
    /// Outcome of each `expect post` step, in script order; `Err` holds why
    /// it failed.
    pub posts: Vec<Result<(), String>>,
}

/// Check a script's `expect` lines against a manifest; one line per
/// failure, saying what was found.
pub fn check_expectations(script: &Script, m: &Manifest, out: &Outcome) -> Vec<String> {
    let mut fails = Vec::new();
    let mut posts = out.posts.iter();
    for (line, ex) in &script.expects {
        let mut fail = |msg: String| fails.push(format!("line {line}: {msg}"));
        let get = |p: &str| m.entries.get(p);
        match ex {
            Expect::Exists(p) => {
                if get(p).is_none() {
                    fail(format!("{p} missing"));
                }
            }
            Expect::Absent(p) => {
                if get(p).is_some() {
                    fail(format!("{p} present"));
                }
            }
            Expect::Size(p, n) | Expect::Nlink(p, n) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) => {
                    let (what, got) = if matches!(ex, Expect::Size(..)) {
                        ("size", e.size)
                    } else {
                        ("nlink", e.nlink)
                    };
                    if got != *n {
                        fail(format!("{p}: {what} {got}, expected {n}"));
                    }
                }
            },
            Expect::Md5(p, h) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.md5.as_deref() != Some(h.as_str()) => fail(format!(
                    "{p}: md5 {}, expected {h}",
                    e.md5.as_deref().unwrap_or("(not a file)")
                )),
                _ => {}
            },
            Expect::Type(p, k) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.kind != *k => fail(format!("{p}: type {}, expected {k}", e.kind)),
                _ => {}
            },
            Expect::Mode(p, mode) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.mode != *mode => {
                    fail(format!("{p}: mode {:o}, expected {mode:o}", e.mode))
                }
                _ => {}
            },
            Expect::Target(p, t) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.target.as_deref() != Some(t.as_str()) => {
                    fail(format!("{p}: target {:?}, expected {t:?}", e.target))
                }
                _ => {}
            },
            Expect::Xattr(p, n, v) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.xattrs.get(n) != Some(v) => fail(format!(
                    "{p}: xattr {n} = {:?}, expected {:?}",
                    e.xattrs
                        .get(n)
                        .map(|x| String::from_utf8_lossy(x).into_owned()),
                    String::from_utf8_lossy(v)
                )),
                _ => {}
            },
            Expect::NoXattr(p, n) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.xattrs.contains_key(n) => fail(format!("{p}: xattr {n} present")),
                _ => {}
            },
            Expect::XattrNames(p, names) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) => {
                    let got: Vec<String> = e
                        .xattrs
                        .keys()
                        .filter(|n| n.starts_with("user."))
                        .cloned()
                        .collect();
                    if &got != names {
                        fail(format!("{p}: xattr names {got:?}, expected {names:?}"));
                    }
                }
            },
            Expect::Entries(d, names) => {
                if d != "/" && get(d).is_none() {
                    fail(format!("{d} missing"));
                    continue;
                }
                let pre = if d == "/" {
                    "/".to_string()
                } else {
                    format!("{d}/")
                };
                let got: Vec<String> = m
                    .entries
                    .keys()
                    .filter_map(|k| k.strip_prefix(&pre))
                    .filter(|r| !r.is_empty() && !r.contains('/'))
                    .map(str::to_string)
                    .collect();
                if &got != names {
                    fail(format!("entries of {d}: {got:?}, expected {names:?}"));
                }
            }
            Expect::Alloc(p, ranges) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) => {
                    for &(lo, hi, want) in ranges {
                        let got = e.kinds_in(lo, hi);
                        let ok = match want {
                            AllocKind::Extent => {
                                got.iter().all(|k| *k == "data" || *k == "unwritten")
                            }
                            AllocKind::Data => got.iter().all(|k| *k == "data"),
                            AllocKind::Unwritten => got.iter().all(|k| *k == "unwritten"),
                            AllocKind::Hole => got.iter().all(|k| *k == "hole"),
                        };
                        if !ok {
                            let map: Vec<String> = e
                                .alloc
                                .iter()
                                .take(8)
                                .map(|(s, e, k)| format!("[{s},{e})={k}"))
                                .collect();
                            fail(format!(
                                "{p}: [{lo},{hi}) is {}, want {want:?} (map {})",
                                got.into_iter().collect::<Vec<_>>().join("+"),
                                map.join(" ")
                            ));
                        }
                    }
                }
            },
            Expect::Consistent => match &out.consistent {
                None => fail("consistency was not checked".into()),
                Some(Err(e)) => fail(format!("not consistent: {e}")),
                Some(Ok(())) => {}
            },
            Expect::Post(st) => match posts.next() {
                None => fail(format!("post {} was not run", st.verb())),
                Some(Err(e)) => fail(format!("post {}: {e}", st.verb())),
                Some(Ok(())) => {}
            },
            Expect::Fill(p, b) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) => {
                    let want = content_hash(&vec![*b; e.size as usize]);
                    if e.hash.as_deref() != Some(want.as_str()) {
                        fail(format!("{p}: not {} bytes of {b:#x}", e.size));
                    }
                }
            },
        }
    }
    fails
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> Entry {
        Entry {
            kind: 'f',
            ino: 257,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            hash: Some("ab".repeat(32)),
            md5: None,
            target: None,
            rdev: None,
            xattrs: BTreeMap::new(),
            alloc: vec![(0, 4096, "data"), (8192, 12288, "unwritten")],
        }
    }

    #[test]
    fn diff_names_fields() {
        let mut a = Manifest::default();
        a.entries.insert("/x".into(), file(3));
        let mut b = a.clone();
        if let Some(e) = b.entries.get_mut("/x") {
            e.size = 4;
        }
        b.entries.insert("/y".into(), file(3));
        assert_eq!(a.diff(&b), ["differs /x: size 3 vs 4", "only in B: /y"]);
        assert!(a.diff(&a).is_empty());
        assert!(a
            .diff_ignoring(&b, &["size"])
            .iter()
            .all(|l| !l.contains("/x")));
    }

    #[test]
    fn alloc_expectations() {
        let mut m = Manifest::default();
        m.entries.insert("/x".into(), file(12288));
        let s = Script::parse(
            "t",
            "expect alloc /x [0,4096)=data [4096,8192)=hole [8192,12288)=unwritten [0,12288)=data",
        )
        .unwrap();
        let f = check_expectations(&s, &m, &Outcome::default());
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].starts_with("line 1: /x: [0,12288) is data+hole+unwritten"),
            "{f:?}"
        );
    }
}
