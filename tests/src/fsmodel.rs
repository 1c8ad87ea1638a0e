//! A model of the namespace and file contents a workload script makes, for
//! the random differential sweeps: which steps are valid next (so a
//! generator never writes a step the kernel refuses), and what every fsync
//! promised (the states an fsynced file may be found in after a crash).
//!
//! Inode numbers are allocated as Btrfs allocates them in a fresh
//! subvolume (the next number above the highest, never reused within a
//! mount), starting after the kernel harness's warm-up files, so the
//! model's numbers are the ones a manifest shows.

use crate::kcrash::{content_hash, Fill, Manifest, Step};
use std::collections::{BTreeMap, HashMap};

/// First inode number a script's own files get: 256 is the top directory,
/// the warm-up directory and its two files take 257 to 259.
pub const FIRST_INO_AFTER_WARMUP: u64 = 260;

/// Block size of clone alignment and of the sector.
pub const BLOCK: u64 = 4096;

#[derive(Clone, Debug)]
enum Body {
    Dir(BTreeMap<String, u64>),
    File(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Node {
    body: Body,
    nlink: u32,
}

/// What a file looks like to a promise: None when it has no name left.
pub type FileState = Option<(u64, String)>;

/// An fsync's promise: the inode, the step line that made it, and every
/// state it had from that step to the crash (oldest first).
#[derive(Clone, Debug)]
pub struct Promise {
    /// Inode number.
    pub ino: u64,
    /// Step index (0-based among the script's steps) of the fsync.
    pub step: usize,
    /// The path it was fsynced through.
    pub path: String,
    /// States from the fsync on.
    pub window: Vec<FileState>,
}

/// The model filesystem.
#[derive(Clone, Debug)]
pub struct Model {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

/// The parent path and last name of an absolute path (`/a/b` -> `/a`, `b`).
pub fn split(path: &str) -> (String, String) {
    let p = path.trim_end_matches('/');
    match p.rfind('/') {
        Some(0) => ("/".into(), p[1..].into()),
        Some(i) => (p[..i].into(), p[i + 1..].into()),
        None => ("/".into(), p.into()),
    }
}

/// `dir` joined with `name`.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn fill_bytes(fill: &Fill, len: u64) -> Option<Vec<u8>> {
    match fill {
        Fill::Byte(b) => Some(vec![*b; len as usize]),
        Fill::Text(t) => Some(t.clone()),
        Fill::Random(_) => None,
    }
}

impl Model {
    /// An empty filesystem whose first new inode is `first_ino`.
    pub fn new(first_ino: u64) -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(
            256,
            Node {
                body: Body::Dir(BTreeMap::new()),
                nlink: 1,
            },
        );
        Model {
            nodes,
            next_ino: first_ino,
        }
    }

    /// Inode of a path.
    pub fn lookup(&self, path: &str) -> Option<u64> {
        let mut cur = 256u64;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            match &self.nodes.get(&cur)?.body {
                Body::Dir(m) => cur = *m.get(c)?,
                Body::File(_) => return None,
            }
        }
        Some(cur)
    }

    /// Whether the inode is a directory.
    pub fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir(_)))
    }

    /// A file's size (0 for anything else).
    pub fn size(&self, ino: u64) -> u64 {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::File(d)) => d.len() as u64,
            _ => 0,
        }
    }

    /// Every path, directories with a trailing `/` left out, sorted.
    pub fn paths(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![("/".to_string(), 256u64)];
        while let Some((p, ino)) = stack.pop() {
            out.push((p.clone(), ino));
            if let Some(Body::Dir(m)) = self.nodes.get(&ino).map(|n| &n.body) {
                for (name, &c) in m {
                    stack.push((join(&p, name), c));
                }
            }
        }
        out.sort();
        out
    }

    /// Directories (the top one included).
    pub fn dirs(&self) -> Vec<String> {
        self.paths()
            .into_iter()
            .filter(|(_, i)| self.is_dir(*i))
            .map(|(p, _)| p)
            .collect()
    }

    /// Regular files, by one path each (hard links give several).
    pub fn files(&self) -> Vec<String> {
        self.paths()
            .into_iter()
            .filter(|(_, i)| !self.is_dir(*i))
            .map(|(p, _)| p)
            .collect()
    }

    fn dir_mut(&mut self, ino: u64) -> Option<&mut BTreeMap<String, u64>> {
        match &mut self.nodes.get_mut(&ino)?.body {
            Body::Dir(m) => Some(m),
            Body::File(_) => None,
        }
    }

    fn file_mut(&mut self, path: &str) -> Result<&mut Vec<u8>, String> {
        let ino = self.lookup(path).ok_or(format!("{path}: no such file"))?;
        match &mut self.nodes.get_mut(&ino).ok_or("lost inode")?.body {
            Body::File(d) => Ok(d),
            Body::Dir(_) => Err(format!("{path}: is a directory")),
        }
    }

    fn new_node(&mut self, path: &str, body: Body) -> Result<u64, String> {
        let (dir, name) = split(path);
        let d = self
            .lookup(&dir)
            .ok_or(format!("{dir}: no such directory"))?;
        if self.lookup(path).is_some() {
            return Err(format!("{path}: exists"));
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.dir_mut(d)
            .ok_or(format!("{dir}: not a directory"))?
            .insert(name, ino);
        self.nodes.insert(ino, Node { body, nlink: 1 });
        Ok(ino)
    }

    /// Whether `anc` is `path` or one of its ancestors.
    pub fn is_within(anc: &str, path: &str) -> bool {
        anc == "/" || path == anc || path.starts_with(&format!("{anc}/"))
    }

    fn drop_name(&mut self, path: &str) -> Result<u64, String> {
        let (dir, name) = split(path);
        let d = self
            .lookup(&dir)
            .ok_or(format!("{dir}: no such directory"))?;
        let ino = self
            .dir_mut(d)
            .and_then(|m| m.remove(&name))
            .ok_or(format!("{path}: no such name"))?;
        let n = self.nodes.get_mut(&ino).ok_or("lost inode")?;
        n.nlink -= 1;
        if n.nlink == 0 {
            self.nodes.remove(&ino);
        }
        Ok(ino)
    }

    /// Whether a rename from `src` to `dst` is valid and changes something.
    pub fn rename_ok(&self, src: &str, dst: &str) -> bool {
        let (Some(s), Some(dd)) = (self.lookup(src), self.lookup(&split(dst).0)) else {
            return false;
        };
        if src == "/" || !self.is_dir(dd) || src == dst {
            return false;
        }
        if self.is_dir(s) && Self::is_within(src, dst) {
            return false;
        }
        match self.lookup(dst) {
            None => true,
            Some(t) if t == s => false,
            Some(t) => {
                if self.is_dir(s) != self.is_dir(t) || Self::is_within(dst, src) {
                    return false;
                }
                match self.nodes.get(&t).map(|n| &n.body) {
                    Some(Body::Dir(m)) => m.is_empty(),
                    _ => true,
                }
            }
        }
    }

    /// Whether renameat2(RENAME_EXCHANGE) of `a` and `b` would succeed:
    /// both exist, neither is the root, and neither is a directory
    /// holding the other.
    pub fn exchange_ok(&self, a: &str, b: &str) -> bool {
        let (Some(x), Some(y)) = (self.lookup(a), self.lookup(b)) else {
            return false;
        };
        if a == "/" || b == "/" {
            return false;
        }
        let holds = |d: u64, anc: &str, p: &str| self.is_dir(d) && Self::is_within(anc, p);
        !holds(x, a, b) && !holds(y, b, a)
    }

    /// Apply one step; Err when the kernel would refuse it (or the model
    /// does not know it).
    pub fn apply(&mut self, st: &Step) -> Result<(), String> {
        match st {
            Step::Write {
                enospc_ok: true, ..
            }
            | Step::Fallocate {
                enospc_ok: true, ..
            } => Err("a step that may run out of space is not modelled".into()),
            Step::Mkdir(p) => self.new_node(p, Body::Dir(BTreeMap::new())).map(drop),
            Step::Create(p) => match self.lookup(p) {
                Some(i) if self.is_dir(i) => Err(format!("create {p}: a directory")),
                Some(_) => Ok(()),
                None => self.new_node(p, Body::File(Vec::new())).map(drop),
            },
            Step::Write {
                path,
                off,
                len,
                fill,
                ..
            } => {
                if self.lookup(path).is_none() {
                    self.new_node(path, Body::File(Vec::new()))?;
                }
                let bytes = fill_bytes(fill, *len).ok_or("random fills are not modelled")?;
                let d = self.file_mut(path)?;
                let end = *off as usize + bytes.len();
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[*off as usize..end].copy_from_slice(&bytes);
                Ok(())
            }
            Step::Truncate(p, size) => {
                self.file_mut(p)?.resize(*size as usize, 0);
                Ok(())
            }
            Step::Fallocate {
                path,
                off,
                len,
                keep,
                ..
            }
            | Step::ZeroRange {
                path,
                off,
                len,
                keep,
            } => {
                let zero = matches!(st, Step::ZeroRange { .. });
                if self.lookup(path).is_none() {
                    self.new_node(path, Body::File(Vec::new()))?;
                }
                let d = self.file_mut(path)?;
                let end = (off + len) as usize;
                if !keep && d.len() < end {
                    d.resize(end, 0);
                }
                if zero {
                    let e = end.min(d.len());
                    if (*off as usize) < e {
                        d[*off as usize..e].fill(0);
                    }
                }
                Ok(())
            }
            Step::Punch { path, off, len } => {
                let d = self.file_mut(path)?;
                let e = ((off + len) as usize).min(d.len());
                if (*off as usize) < e {
                    d[*off as usize..e].fill(0);
                }
                Ok(())
            }
            Step::Clone {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                let s = self.file_mut(src)?.clone();
                if src_off % BLOCK != 0 || dst_off % BLOCK != 0 || *src_off >= s.len() as u64 {
                    return Err("clone: unaligned or past the end".into());
                }
                let len = if *len == 0 {
                    s.len() as u64 - src_off
                } else {
                    *len
                };
                let send = src_off + len;
                if send > s.len() as u64 || (len % BLOCK != 0 && send != s.len() as u64) {
                    return Err("clone: bad length".into());
                }
                if self.lookup(src) == self.lookup(dst) {
                    return Err("clone: same file".into());
                }
                if self.lookup(dst).is_none() {
                    self.new_node(dst, Body::File(Vec::new()))?;
                }
                let d = self.file_mut(dst)?;
                let dend = (dst_off + len) as usize;
                if len % BLOCK != 0 && dend < d.len() {
                    return Err("clone: unaligned end inside the destination".into());
                }
                if d.len() < dend {
                    d.resize(dend, 0);
                }
                d[*dst_off as usize..dend].copy_from_slice(&s[*src_off as usize..send as usize]);
                Ok(())
            }
            Step::Link(a, b) => {
                let ino = self.lookup(a).ok_or(format!("{a}: no such file"))?;
                if self.is_dir(ino) {
                    return Err("link: a directory".into());
                }
                let (dir, name) = split(b);
                let d = self.lookup(&dir).ok_or(format!("{dir}: no such dir"))?;
                if self.lookup(b).is_some() {
                    return Err(format!("{b}: exists"));
                }
                self.dir_mut(d).ok_or("not a dir")?.insert(name, ino);
                self.nodes.get_mut(&ino).ok_or("lost")?.nlink += 1;
                Ok(())
            }
            Step::Rename(a, b) => {
                if !self.rename_ok(a, b) {
                    return Err(format!("rename {a} {b}: refused"));
                }
                let s = self.lookup(a).ok_or("gone")?;
                if self.lookup(b).is_some() {
                    self.drop_name(b)?;
                }
                let (od, on) = split(a);
                let od = self.lookup(&od).ok_or("gone")?;
                self.dir_mut(od).ok_or("not a dir")?.remove(&on);
                let (nd, nn) = split(b);
                let nd = self.lookup(&nd).ok_or("gone")?;
                self.dir_mut(nd).ok_or("not a dir")?.insert(nn, s);
                Ok(())
            }
            Step::Exchange(a, b) => {
                if !self.exchange_ok(a, b) {
                    return Err(format!("exchange {a} {b}: refused"));
                }
                let (x, y) = (self.lookup(a).ok_or("gone")?, self.lookup(b).ok_or("gone")?);
                let (ad, an) = split(a);
                let ad = self.lookup(&ad).ok_or("gone")?;
                self.dir_mut(ad).ok_or("not a dir")?.insert(an, y);
                let (bd, bn) = split(b);
                let bd = self.lookup(&bd).ok_or("gone")?;
                self.dir_mut(bd).ok_or("not a dir")?.insert(bn, x);
                Ok(())
            }
            Step::Unlink(p) => {
                let ino = self.lookup(p).ok_or(format!("{p}: no such file"))?;
                if self.is_dir(ino) {
                    return Err("unlink: a directory".into());
                }
                self.drop_name(p).map(drop)
            }
            Step::Rmdir(p) => {
                let ino = self.lookup(p).ok_or(format!("{p}: no such dir"))?;
                match self.nodes.get(&ino).map(|n| &n.body) {
                    Some(Body::Dir(m)) if m.is_empty() && ino != 256 => self.drop_name(p).map(drop),
                    _ => Err("rmdir: not an empty directory".into()),
                }
            }
            Step::Fsync(p) | Step::Fdatasync(p) => {
                self.lookup(p).map(drop).ok_or(format!("{p}: no such file"))
            }
            Step::SyncRange { path, .. } => self.file_mut(path).map(drop),
            Step::Sync | Step::Crash { .. } => Ok(()),
            other => Err(format!("the model does not know {other:?}")),
        }
    }

    /// The state of an inode for a promise.
    pub fn state(&self, ino: u64) -> FileState {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::File(d)) => Some((d.len() as u64, content_hash(d))),
            _ => None,
        }
    }
}

/// Run `steps` through the model; the promises every fsync and fdatasync
/// of a regular file made. Err when a step is one the model refuses.
pub fn promises(steps: &[Step], first_ino: u64) -> Result<Vec<Promise>, String> {
    let mut m = Model::new(first_ino);
    let mut out: Vec<Promise> = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        if matches!(st, Step::Crash { .. }) {
            if i + 1 < steps.len() {
                // What an intermediate crash leaves is the recovery's.
                return Err("steps after a crash are not modelled".into());
            }
            break;
        }
        m.apply(st).map_err(|e| format!("step {}: {e}", i + 1))?;
        for p in &mut out {
            p.window.push(m.state(p.ino));
        }
        if let Step::Fsync(p) | Step::Fdatasync(p) = st {
            let ino = m.lookup(p).ok_or("fsynced path vanished")?;
            if !m.is_dir(ino) {
                out.push(Promise {
                    ino,
                    step: i,
                    path: p.clone(),
                    window: vec![m.state(ino)],
                });
            }
        }
    }
    Ok(out)
}

/// The contents a promised inode had from its fsync on (the promise's
/// window, byte for byte): run the steps again keeping that inode's data.
pub fn window_contents(
    steps: &[Step],
    first_ino: u64,
    p: &Promise,
) -> Result<Vec<Option<Vec<u8>>>, String> {
    let mut m = Model::new(first_ino);
    let mut out = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        if matches!(st, Step::Crash { .. }) {
            break;
        }
        m.apply(st).map_err(|e| format!("step {}: {e}", i + 1))?;
        if i >= p.step {
            out.push(match m.nodes.get(&p.ino).map(|n| &n.body) {
                Some(Body::File(d)) => Some(d.clone()),
                _ => None,
            });
        }
    }
    Ok(out)
}

/// Whether `got` keeps a promise byte by byte: its size is one the file
/// had since the fsync, and every byte holds what one of those states had
/// there. A commit after the fsync carries later metadata (a size) without
/// the data still in the page cache, so a recovered file may mix states;
/// what it may not hold is a byte no state since the fsync had.
pub fn bytes_within(got: &[u8], window: &[Option<Vec<u8>>]) -> bool {
    let states: Vec<&Vec<u8>> = window.iter().flatten().collect();
    if !states.iter().any(|s| s.len() == got.len()) {
        return false;
    }
    got.iter()
        .enumerate()
        .all(|(i, b)| states.iter().any(|s| s.get(i) == Some(b)))
}

/// The promises a recovered filesystem breaks, one line each: the inode is
/// looked up by number, and must be in one of its states since the fsync.
pub fn broken_promises(promises: &[Promise], got: &Manifest) -> Vec<String> {
    let mut by_ino: HashMap<u64, (u64, String)> = HashMap::new();
    for e in got.entries.values() {
        if e.kind == 'f' {
            by_ino.insert(e.ino, (e.size, e.hash.clone().unwrap_or_default()));
        }
    }
    let mut out = Vec::new();
    for p in promises {
        let now = by_ino.get(&p.ino).cloned();
        if !p.window.contains(&now) {
            out.push(format!(
                "inode {} fsynced as {} (step {}) is {} after recovery, never its state since",
                p.ino,
                p.path,
                p.step + 1,
                match &now {
                    Some((s, h)) => format!("{s} bytes ({})", &h[..12.min(h.len())]),
                    None => "missing".into(),
                }
            ));
        }
    }
    out
}

/// The model's inode numbers against a manifest: every path both hold
/// must name the same inode (a harness error otherwise: the promises would
/// be checked against the wrong files).
pub fn numbering_agrees(m: &Model, got: &Manifest) -> Result<(), String> {
    for (p, ino) in m.paths() {
        if let Some(e) = got.entries.get(&p) {
            if p != "/" && e.ino != ino {
                return Err(format!(
                    "{p}: the model says inode {ino}, the filesystem {}",
                    e.ino
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(text: &str) -> Vec<Step> {
        crate::kcrash::Scenario::parse("t", text)
            .unwrap()
            .steps
            .into_iter()
            .map(|(_, s)| s)
            .collect()
    }

    #[test]
    fn renames_links_and_data_follow_posix() {
        let mut m = Model::new(257);
        for s in steps(
            "mkdir /a\nwrite /a/f 0 10 0x11\nlink /a/f /g\nrename /a /b\nwrite /b/f 20 2 0x22\n\
             truncate /g 5\nzero-range /g 0 2 keep\nmkdir /c\nrename /c /b/d\n",
        ) {
            m.apply(&s).unwrap();
        }
        assert_eq!(m.lookup("/b/f"), m.lookup("/g"));
        assert_eq!(m.size(m.lookup("/g").unwrap()), 5);
        assert_eq!(m.lookup("/b/d"), Some(259));
        assert!(!m.rename_ok("/b", "/b/d/x"), "into itself");
        assert!(!m.rename_ok("/b/d", "/b"), "over a non-empty ancestor");
        assert!(!m.rename_ok("/g", "/b/f"), "same inode");
        assert!(m.apply(&Step::Rmdir("/b".into())).is_err());
    }

    #[test]
    fn a_promise_lasts_until_a_later_state() {
        let p = promises(
            &steps("write /f 0 3 0x11\nfsync /f\nwrite /f 0 3 0x22\nunlink /f\ncrash\n"),
            257,
        )
        .unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].window.len(), 3);
        assert_eq!(p[0].window[2], None);
        let mut got = Manifest::default();
        assert!(
            broken_promises(&p, &got).is_empty(),
            "gone later is allowed"
        );
        got.entries.insert(
            "/f".into(),
            crate::kcrash::Entry {
                kind: 'f',
                ino: 257,
                mode: 0o644,
                uid: 0,
                gid: 0,
                size: 1,
                nlink: 1,
                hash: Some(content_hash(b"x")),
                md5: None,
                target: None,
                rdev: None,
                xattrs: Default::default(),
                alloc: Vec::new(),
            },
        );
        assert_eq!(broken_promises(&p, &got).len(), 1);
    }
}
