//! Kernel crash images and manifests, the oracle for log replay.
//!
//! A scenario (`tests/scenarios/*.scn`) is run with real syscalls on a btrfs
//! filesystem that the Linux kernel mounts from a sparse loop image with
//! `commit=600`, so nothing reaches disk except what the steps make durable
//! (fsync, fdatasync, sync). At `crash` the backing file is copied while the
//! filesystem is still mounted: the copy holds exactly what a power failure at
//! that instant would leave, usually with a log tree. Mounting a copy of it
//! makes the kernel replay the log; [`manifest_of_image`] then records what a
//! user sees of every path, the reference `btrkit-replay` must reproduce.
//!
//! Scenario language, one command a line, `#` comments, numbers in decimal or
//! `0x`, sizes with K/M/G suffixes, `"..."` strings with C escapes and
//! `<N x 'C'>` for N copies of a character. Paths are relative to the root of
//! the filesystem (a leading `/` is allowed).
//!
//! Directives (apply to the whole run wherever they appear):
//! - `mkfs ARGS...`: extra `mkfs.btrfs` arguments (`mkfs -n 4096 --csum sha256`)
//! - `fssize SIZE`: size of the sparse image (default 512M)
//! - `mount OPTS`: extra mount options of the live mount (`mount compress=zstd`);
//!   `commit=600` is added unless the options name another commit interval
//! - `expect-log yes|no`: whether the crash image must hold a log tree. By
//!   default it must when a fsync came after the last commit.
//! - `warmup no`: skip the warm-up files (see [`WARMUP_DIR`]).
//!
//! Steps: `mkdir P`, `create P`, `write P OFF LEN [BYTE|"text"|random:SEED]`
//! (buffered pwrite; fill byte 0xcd by default; a quoted text is written once,
//! LEN is then ignored), `truncate P SIZE`, `fallocate P OFF LEN [keep]`,
//! `punch P OFF LEN`, `zero-range P OFF LEN [keep]`, `link OLD NEW`,
//! `symlink TARGET P`, `rename OLD NEW`, `unlink P`, `rmdir P`,
//! `setxattr P NAME VALUE`, `removexattr P NAME`, `chmod P OCTAL`,
//! `chown P UID GID`, `mkfifo P`, `fsync P`, `fdatasync P`, `sync` (a full
//! transaction commit through syncfs), `subvol-create P`, `snapshot SRC DST`
//! (commits), `evict` (drop the dentry and inode caches), `crash`, and the bulk
//! step `writefiles DIR N SIZE[-MAX] [fsync|fdatasync|none]`: create N files
//! `DIR/fNNNNN` one by one with distinct content ([`file_content`]), sizes
//! spread over SIZE..=MAX, each synced right after it is written when asked.
//!
//! Every `crash` but the last is an intermediate one: the image is taken, the
//! live filesystem is thrown away, the image is mounted again (the kernel
//! replays its log) and the steps go on. The last `crash` (or the end of the
//! steps) gives the crash image.
//!
//! Expectations, checked against a manifest by [`check_expectations`]:
//! `expect exists P`, `expect absent P`, `expect size P N`, `expect nlink P N`,
//! `expect type P file|dir|symlink|fifo`, `expect target P T`,
//! `expect xattr P NAME VALUE`, `expect noxattr P NAME`,
//! `expect entries DIR [NAME...]` (exact set), `expect fill P BYTE` (every byte).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Errors of this module are strings: they end up in test failure messages.
pub type Res<T> = Result<T, String>;

/// Bumped whenever a change here changes the crash images a scenario gives,
/// so cached images are regenerated.
pub const GENERATOR_VERSION: u32 = 2;

const DEFAULT_FSSIZE: u64 = 512 << 20;
const DEFAULT_FILL: u8 = 0xcd;

// ---------------------------------------------------------------------------
// Scenario language

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fill {
    Byte(u8),
    /// Written once at the offset; its length is the write length.
    Text(Vec<u8>),
    /// A deterministic pseudo-random stream seeded by the value.
    Random(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    None,
    Fsync,
    Fdatasync,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Mkdir(String),
    Create(String),
    Write {
        path: String,
        off: u64,
        len: u64,
        fill: Fill,
    },
    Truncate(String, u64),
    Fallocate {
        path: String,
        off: u64,
        len: u64,
        keep: bool,
    },
    Punch {
        path: String,
        off: u64,
        len: u64,
    },
    ZeroRange {
        path: String,
        off: u64,
        len: u64,
        keep: bool,
    },
    Link(String, String),
    Symlink {
        target: String,
        path: String,
    },
    Rename(String, String),
    Unlink(String),
    Rmdir(String),
    SetXattr {
        path: String,
        name: String,
        value: Vec<u8>,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    Chmod(String, u32),
    Chown(String, u32, u32),
    Mkfifo(String),
    Fsync(String),
    Fdatasync(String),
    Sync,
    SubvolCreate(String),
    Snapshot(String, String),
    Evict,
    WriteFiles {
        dir: String,
        count: u32,
        min: u64,
        max: u64,
        sync: SyncKind,
    },
    Crash,
}

impl Step {
    /// Whether the step leaves something in the log that only a log sync
    /// wrote (the kernel may still decide to commit instead).
    fn logs(&self) -> bool {
        matches!(self, Step::Fsync(_) | Step::Fdatasync(_))
            || matches!(self, Step::WriteFiles { sync, .. } if *sync != SyncKind::None)
    }
    /// Whether the step commits the transaction, which empties the log.
    fn commits(&self) -> bool {
        matches!(self, Step::Sync | Step::Snapshot(..))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    Exists(String),
    Absent(String),
    Size(String, u64),
    Nlink(String, u64),
    Type(String, char),
    Target(String, String),
    Xattr(String, String, Vec<u8>),
    NoXattr(String, String),
    Entries(String, Vec<String>),
    Fill(String, u8),
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// The file as written; cached crash images are keyed by it.
    pub text: String,
    pub mkfs: Vec<String>,
    pub fssize: u64,
    pub mount: Vec<String>,
    pub expect_log: Option<bool>,
    /// `expect-log any`: the kernel may commit or log (random scenarios).
    pub log_optional: bool,
    /// Write the size-class warm-up files before the steps (see [`WARMUP_DIR`]).
    pub warmup: bool,
    /// Steps with their 1-based line numbers.
    pub steps: Vec<(usize, Step)>,
    pub expects: Vec<(usize, Expect)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Word(String),
    Quoted(Vec<u8>),
}

impl Tok {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Tok::Word(w) => w.as_bytes().to_vec(),
            Tok::Quoted(b) => b.clone(),
        }
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }
}

fn tokenize(line: &str) -> Res<Vec<Tok>> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' {
            break;
        } else if c == b'"' {
            let mut v = Vec::new();
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err("unterminated string".into()),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        let e = *b.get(i + 1).ok_or("dangling backslash")?;
                        i += 2;
                        v.push(match e {
                            b'n' => b'\n',
                            b't' => b'\t',
                            b'r' => b'\r',
                            b'0' => 0,
                            b'x' => {
                                let hex = line.get(i..i + 2).ok_or("short \\x escape")?;
                                i += 2;
                                u8::from_str_radix(hex, 16)
                                    .map_err(|_| format!("bad \\x escape {hex}"))?
                            }
                            other => other,
                        });
                    }
                    Some(&ch) => {
                        v.push(ch);
                        i += 1;
                    }
                }
            }
            out.push(Tok::Quoted(v));
        } else if c == b'<' && line[i..].contains(" x '") {
            // <N x 'C'>
            let end = line[i..].find("'>").ok_or("unterminated <N x 'C'>")? + i;
            let inner = &line[i + 1..end];
            let (n, ch) = inner.split_once(" x '").ok_or("bad <N x 'C'>")?;
            let n: usize = n
                .trim()
                .parse()
                .map_err(|_| format!("bad count in <{inner}'>"))?;
            let ch = ch.as_bytes();
            if ch.len() != 1 {
                return Err(format!("<N x 'C'> needs one character, got {inner:?}"));
            }
            out.push(Tok::Quoted(vec![ch[0]; n]));
            i = end + 2;
        } else {
            let start = i;
            while i < b.len() && !b[i].is_ascii_whitespace() {
                i += 1;
            }
            out.push(Tok::Word(line[start..i].to_string()));
        }
    }
    Ok(out)
}

/// A size or offset: decimal or 0x hex, optional K/M/G suffix.
pub fn parse_num(s: &str) -> Res<u64> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(h) => u64::from_str_radix(h, 16),
        None => digits.parse(),
    }
    .map_err(|_| format!("bad number {s:?}"))?;
    v.checked_mul(mult)
        .ok_or_else(|| format!("number {s:?} overflows"))
}

fn parse_fill(t: &Tok) -> Res<Fill> {
    match t {
        Tok::Quoted(b) => Ok(Fill::Text(b.clone())),
        Tok::Word(w) => match w.strip_prefix("random:") {
            Some(seed) => Ok(Fill::Random(parse_num(seed)?)),
            None => {
                let v = parse_num(w)?;
                u8::try_from(v)
                    .map(Fill::Byte)
                    .map_err(|_| format!("fill byte {w} is not a byte"))
            }
        },
    }
}

impl Scenario {
    pub fn load(path: &Path) -> Res<Scenario> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Scenario::parse(&name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(name: &str, text: &str) -> Res<Scenario> {
        let mut s = Scenario {
            name: name.to_string(),
            text: text.to_string(),
            mkfs: Vec::new(),
            fssize: DEFAULT_FSSIZE,
            mount: Vec::new(),
            expect_log: None,
            log_optional: false,
            warmup: true,
            steps: Vec::new(),
            expects: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let toks = tokenize(line).map_err(|e| format!("line {n}: {e}"))?;
            let Some(Tok::Word(verb)) = toks.first() else {
                if toks.is_empty() {
                    continue;
                }
                return Err(format!("line {n}: a line starts with a verb"));
            };
            let args = &toks[1..];
            let r = (|| -> Res<()> {
                match verb.as_str() {
                    "mkfs" => s.mkfs.extend(args.iter().map(Tok::text)),
                    "fssize" => s.fssize = parse_num(&one(args)?.text())?,
                    "mount" => {
                        for a in args {
                            s.mount.extend(
                                a.text()
                                    .split(',')
                                    .filter(|o| !o.is_empty())
                                    .map(str::to_string),
                            );
                        }
                    }
                    "warmup" => {
                        s.warmup = match one(args)?.text().as_str() {
                            "yes" => true,
                            "no" => false,
                            o => return Err(format!("warmup yes|no, not {o}")),
                        }
                    }
                    "expect-log" => {
                        s.expect_log = Some(match one(args)?.text().as_str() {
                            "yes" => true,
                            "no" => false,
                            "any" => {
                                s.log_optional = true;
                                return Ok(());
                            }
                            o => return Err(format!("expect-log yes|no|any, not {o}")),
                        })
                    }
                    "expect" => s.expects.push((n, parse_expect(args)?)),
                    _ => s.steps.push((n, parse_step(verb, args)?)),
                }
                Ok(())
            })();
            r.map_err(|e| format!("line {n}: {e}"))?;
        }
        Ok(s)
    }

    /// Options of the live mount: the scenario's, with `commit=600` unless it
    /// sets its own interval.
    pub fn mount_options(&self) -> String {
        let mut o = self.mount.clone();
        if !o.iter().any(|x| x.starts_with("commit=")) {
            o.insert(0, "commit=600".into());
        }
        o.join(",")
    }

    /// Whether the crash image must hold a log tree: by default, when a step
    /// that syncs the log comes after the last commit (or intermediate crash,
    /// whose replaying mount commits) before the final crash.
    pub fn wants_log(&self) -> bool {
        if self.log_optional {
            return false;
        }
        if let Some(e) = self.expect_log {
            return e;
        }
        let end = self
            .steps
            .iter()
            .rposition(|(_, s)| *s == Step::Crash)
            .unwrap_or(self.steps.len());
        let mut pending = false;
        for (_, st) in &self.steps[..end] {
            if st.commits() || *st == Step::Crash {
                pending = false;
            } else if st.logs() {
                pending = true;
            }
        }
        pending
    }
}

fn one(args: &[Tok]) -> Res<&Tok> {
    match args {
        [a] => Ok(a),
        _ => Err(format!("expected one argument, got {}", args.len())),
    }
}

fn need(args: &[Tok], min: usize, max: usize, usage: &str) -> Res<()> {
    if args.len() < min || args.len() > max {
        return Err(format!("usage: {usage}"));
    }
    Ok(())
}

fn parse_step(verb: &str, a: &[Tok]) -> Res<Step> {
    let t = |i: usize| a[i].text();
    let num = |i: usize| parse_num(&a[i].text());
    Ok(match verb {
        "mkdir" => {
            need(a, 1, 1, "mkdir P")?;
            Step::Mkdir(t(0))
        }
        "create" => {
            need(a, 1, 1, "create P")?;
            Step::Create(t(0))
        }
        "write" => {
            need(a, 3, 4, "write P OFF LEN [BYTE|\"text\"|random:SEED]")?;
            let fill = if a.len() == 4 {
                parse_fill(&a[3])?
            } else {
                Fill::Byte(DEFAULT_FILL)
            };
            let len = match &fill {
                Fill::Text(b) => b.len() as u64,
                _ => num(2)?,
            };
            Step::Write {
                path: t(0),
                off: num(1)?,
                len,
                fill,
            }
        }
        "truncate" => {
            need(a, 2, 2, "truncate P SIZE")?;
            Step::Truncate(t(0), num(1)?)
        }
        "fallocate" | "zero-range" => {
            need(a, 3, 4, &format!("{verb} P OFF LEN [keep]"))?;
            let keep = match a.get(3).map(Tok::text).as_deref() {
                None => false,
                Some("keep") => true,
                Some(o) => return Err(format!("{verb}: unknown flag {o}")),
            };
            let (path, off, len) = (t(0), num(1)?, num(2)?);
            if verb == "fallocate" {
                Step::Fallocate {
                    path,
                    off,
                    len,
                    keep,
                }
            } else {
                Step::ZeroRange {
                    path,
                    off,
                    len,
                    keep,
                }
            }
        }
        "punch" => {
            need(a, 3, 3, "punch P OFF LEN")?;
            Step::Punch {
                path: t(0),
                off: num(1)?,
                len: num(2)?,
            }
        }
        "link" => {
            need(a, 2, 2, "link OLD NEW")?;
            Step::Link(t(0), t(1))
        }
        "symlink" => {
            need(a, 2, 2, "symlink TARGET P")?;
            Step::Symlink {
                target: t(0),
                path: t(1),
            }
        }
        "rename" => {
            need(a, 2, 2, "rename OLD NEW")?;
            Step::Rename(t(0), t(1))
        }
        "unlink" => {
            need(a, 1, 1, "unlink P")?;
            Step::Unlink(t(0))
        }
        "rmdir" => {
            need(a, 1, 1, "rmdir P")?;
            Step::Rmdir(t(0))
        }
        "setxattr" => {
            need(a, 3, 3, "setxattr P NAME VALUE")?;
            Step::SetXattr {
                path: t(0),
                name: t(1),
                value: a[2].bytes(),
            }
        }
        "removexattr" => {
            need(a, 2, 2, "removexattr P NAME")?;
            Step::RemoveXattr {
                path: t(0),
                name: t(1),
            }
        }
        "chmod" => {
            need(a, 2, 2, "chmod P OCTAL")?;
            Step::Chmod(
                t(0),
                u32::from_str_radix(&t(1), 8).map_err(|_| format!("bad mode {}", t(1)))?,
            )
        }
        "chown" => {
            need(a, 3, 3, "chown P UID GID")?;
            let id = |i: usize| -> Res<u32> {
                u32::try_from(num(i)?).map_err(|_| "id out of range".to_string())
            };
            Step::Chown(t(0), id(1)?, id(2)?)
        }
        "mkfifo" => {
            need(a, 1, 1, "mkfifo P")?;
            Step::Mkfifo(t(0))
        }
        "fsync" => {
            need(a, 1, 1, "fsync P")?;
            Step::Fsync(t(0))
        }
        "fdatasync" => {
            need(a, 1, 1, "fdatasync P")?;
            Step::Fdatasync(t(0))
        }
        "sync" => {
            need(a, 0, 0, "sync")?;
            Step::Sync
        }
        "subvol-create" => {
            need(a, 1, 1, "subvol-create P")?;
            Step::SubvolCreate(t(0))
        }
        "snapshot" => {
            need(a, 2, 2, "snapshot SRC DST")?;
            Step::Snapshot(t(0), t(1))
        }
        "evict" => {
            need(a, 0, 0, "evict")?;
            Step::Evict
        }
        "crash" => {
            need(a, 0, 0, "crash")?;
            Step::Crash
        }
        "writefiles" => {
            need(
                a,
                3,
                4,
                "writefiles DIR N SIZE[-MAX] [fsync|fdatasync|none]",
            )?;
            let count = u32::try_from(num(1)?).map_err(|_| "too many files".to_string())?;
            let sz = t(2);
            let (min, max) = match sz.split_once('-') {
                Some((lo, hi)) => (parse_num(lo)?, parse_num(hi)?),
                None => (parse_num(&sz)?, parse_num(&sz)?),
            };
            if min > max {
                return Err(format!("size range {sz} is empty"));
            }
            let sync = match a.get(3).map(Tok::text).as_deref() {
                None | Some("none") => SyncKind::None,
                Some("fsync") => SyncKind::Fsync,
                Some("fdatasync") => SyncKind::Fdatasync,
                Some(o) => return Err(format!("writefiles: unknown sync mode {o}")),
            };
            Step::WriteFiles {
                dir: t(0),
                count,
                min,
                max,
                sync,
            }
        }
        other => return Err(format!("unknown verb {other:?}")),
    })
}

fn parse_expect(a: &[Tok]) -> Res<Expect> {
    let kind = a.first().ok_or("expect what?")?.text();
    let a = &a[1..];
    let t = |i: usize| a[i].text();
    Ok(match kind.as_str() {
        "exists" => {
            need(a, 1, 1, "expect exists P")?;
            Expect::Exists(norm(&t(0)))
        }
        "absent" => {
            need(a, 1, 1, "expect absent P")?;
            Expect::Absent(norm(&t(0)))
        }
        "size" => {
            need(a, 2, 2, "expect size P N")?;
            Expect::Size(norm(&t(0)), parse_num(&t(1))?)
        }
        "nlink" => {
            need(a, 2, 2, "expect nlink P N")?;
            Expect::Nlink(norm(&t(0)), parse_num(&t(1))?)
        }
        "type" => {
            need(a, 2, 2, "expect type P file|dir|symlink|fifo")?;
            let c = match t(1).as_str() {
                "file" => 'f',
                "dir" => 'd',
                "symlink" => 'l',
                "fifo" => 'p',
                o => return Err(format!("unknown type {o}")),
            };
            Expect::Type(norm(&t(0)), c)
        }
        "target" => {
            need(a, 2, 2, "expect target P T")?;
            Expect::Target(norm(&t(0)), t(1))
        }
        "xattr" => {
            need(a, 3, 3, "expect xattr P NAME VALUE")?;
            Expect::Xattr(norm(&t(0)), t(1), a[2].bytes())
        }
        "noxattr" => {
            need(a, 2, 2, "expect noxattr P NAME")?;
            Expect::NoXattr(norm(&t(0)), t(1))
        }
        "entries" => {
            need(a, 1, usize::MAX, "expect entries DIR [NAME...]")?;
            let mut names: Vec<String> = a[1..].iter().map(Tok::text).collect();
            names.sort();
            Expect::Entries(norm(&t(0)), names)
        }
        "fill" => {
            need(a, 2, 2, "expect fill P BYTE")?;
            let b = u8::try_from(parse_num(&t(1))?).map_err(|_| "fill is a byte".to_string())?;
            Expect::Fill(norm(&t(0)), b)
        }
        o => return Err(format!("unknown expectation {o:?}")),
    })
}

/// `a/b`, `/a/b/` -> `/a/b`; the root is `/`.
fn norm(p: &str) -> String {
    let t = p.trim_matches('/');
    format!("/{t}")
}

/// The scenarios of a directory, sorted by file name.
pub fn load_dir(dir: &Path) -> Res<Vec<Scenario>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    files.sort();
    files.iter().map(|p| Scenario::load(p)).collect()
}

// ---------------------------------------------------------------------------
// Content

/// Deterministic pseudo-random bytes (xorshift64*), for fills and file bodies.
struct Prng(u64);
impl Prng {
    fn new(seed: u64) -> Prng {
        Prng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Size of file `i` of a `writefiles` step over `min..=max`.
pub fn file_size(i: u32, min: u64, max: u64) -> u64 {
    let span = max - min + 1;
    min + (Prng::new(0x5eed ^ i as u64).next() % span)
}

/// Content of file `i` of a `writefiles` step: its name first, so no two
/// files are alike, then pseudo-random bytes.
pub fn file_content(i: u32, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    Prng::new(i as u64 + 1).fill(&mut v);
    let tag = format!("file {i:05}\n");
    let n = tag.len().min(v.len());
    v[..n].copy_from_slice(&tag.as_bytes()[..n]);
    v
}

pub fn file_name(i: u32) -> String {
    format!("f{i:05}")
}

// ---------------------------------------------------------------------------
// Commands and loop mounts

fn run(cmd: &mut Command) -> Res<Output> {
    let desc = format!("{cmd:?}");
    let o = cmd.output().map_err(|e| format!("{desc}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{desc} failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim(),
            String::from_utf8_lossy(&o.stdout).trim()
        ));
    }
    Ok(o)
}

/// Copy keeping holes, as the crash capture and every image copy do.
pub fn copy_sparse(from: &Path, to: &Path) -> Res<()> {
    run(Command::new("cp").arg("--sparse=always").arg(from).arg(to)).map(|_| ())
}

/// Whether this machine can run the kernel oracle; `Err` says why not.
pub fn can_run() -> Res<()> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (loop devices and mount)".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.contains("btrfs") {
        // The module may simply not be loaded yet.
        let _ = Command::new("modprobe").arg("btrfs").output();
        if !std::fs::read_to_string("/proc/filesystems")
            .unwrap_or_default()
            .contains("btrfs")
        {
            return Err("btrfs is not available in the kernel".into());
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("no /dev/loop-control (loop devices)".into());
    }
    for tool in ["mkfs.btrfs", "btrfs", "losetup", "mount", "umount", "cp"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!("{tool} is not installed"));
        }
    }
    Ok(())
}

/// A btrfs image attached to a loop device and mounted. Dropping it unmounts
/// and detaches, retrying while the kernel reports the mount busy, so a
/// panicking test leaves nothing behind.
pub struct LoopMount {
    mnt: PathBuf,
    dev: String,
    mounted: bool,
}

impl LoopMount {
    pub fn mount(img: &Path, mnt: &Path, opts: &str) -> Res<LoopMount> {
        std::fs::create_dir_all(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        let mut last = String::new();
        for attempt in 0..8 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(150 * attempt));
            }
            let o = match Command::new("losetup")
                .args(["--find", "--show"])
                .arg(img)
                .output()
            {
                Ok(o) => o,
                Err(e) => return Err(format!("losetup: {e}")),
            };
            if !o.status.success() {
                last = format!(
                    "losetup {}: {}",
                    img.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                continue;
            }
            let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
            // From here the guard owns the loop device, mounted or not.
            let mut g = LoopMount {
                mnt: mnt.to_path_buf(),
                dev,
                mounted: false,
            };
            let mut cmd = Command::new("mount");
            cmd.args(["-t", "btrfs"]);
            if !opts.is_empty() {
                cmd.args(["-o", opts]);
            }
            let o = cmd
                .arg(&g.dev)
                .arg(mnt)
                .output()
                .map_err(|e| format!("mount: {e}"))?;
            if o.status.success() {
                g.mounted = true;
                return Ok(g);
            }
            last = format!(
                "mount -o {opts} {} ({}): {}{}",
                img.display(),
                g.dev,
                String::from_utf8_lossy(&o.stderr).trim().replace('\n', " "),
                kernel_says(&g.dev)
            );
            drop(g);
            // Only a busy or racing device is worth another try; a refused
            // filesystem is refused again.
            if !(last.contains("busy")
                || last.contains("already")
                || last.contains("No such device"))
            {
                break;
            }
        }
        Err(last)
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    pub fn device(&self) -> &str {
        &self.dev
    }

    /// Unmount and detach now, reporting failure (Drop can only try).
    pub fn unmount(mut self) -> Res<()> {
        self.release()
    }

    fn release(&mut self) -> Res<()> {
        let mut err = None;
        if self.mounted {
            let mut ok = false;
            let mut last = String::new();
            for i in 0..60 {
                match Command::new("umount").arg(&self.mnt).output() {
                    Ok(o) if o.status.success() => {
                        ok = true;
                        break;
                    }
                    Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    Err(e) => last = e.to_string(),
                }
                std::thread::sleep(Duration::from_millis(if i < 10 { 100 } else { 500 }));
            }
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
                err = Some(format!(
                    "umount {}: {last} (lazily unmounted)",
                    self.mnt.display()
                ));
            }
            self.mounted = false;
        }
        if !self.dev.is_empty() {
            let mut last = String::new();
            let mut ok = false;
            for _ in 0..30 {
                match Command::new("losetup").arg("-d").arg(&self.dev).output() {
                    Ok(o) if o.status.success() => {
                        ok = true;
                        break;
                    }
                    // Already gone (autoclear raced us): nothing left to do.
                    Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No such device") => {
                        ok = true;
                        break;
                    }
                    Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    Err(e) => last = e.to_string(),
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if !ok && err.is_none() {
                err = Some(format!("losetup -d {}: {last}", self.dev));
            }
            self.dev.clear();
        }
        let _ = std::fs::remove_dir(&self.mnt);
        err.map_or(Ok(()), Err)
    }
}

/// The kernel's last complaints about a device (why a mount failed), as
/// "; kernel: ..." or nothing. Other runs may log meanwhile, so only lines
/// naming the device count.
fn kernel_says(dev: &str) -> String {
    let name = dev.rsplit('/').next().unwrap_or(dev);
    let tag = format!("(device {name})");
    let Ok(o) = Command::new("dmesg").output() else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&tag) && (l.contains("critical") || l.contains("error")))
        .map(|l| l.split_once("] ").map_or(l, |(_, r)| r))
        .collect();
    let mut last: Vec<&str> = lines.iter().rev().take(3).copied().collect();
    last.reverse();
    if last.is_empty() {
        String::new()
    } else {
        format!("; kernel: {}", last.join(" / "))
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("warning: {e}");
        }
    }
}

/// At most this many kernel runs (mkfs, mount, workload, manifests) at once in
/// this process; `BTRKIT_KCRASH_JOBS` overrides the default of 2.
pub fn max_jobs() -> usize {
    std::env::var("BTRKIT_KCRASH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2)
}

static SLOTS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A held kernel slot; see [`slot`].
pub struct Slot(());

/// Wait for one of the [`max_jobs`] slots. Hold it for the kernel-heavy part
/// of a test so parallel tests of one binary do not overload the machine.
pub fn slot() -> Slot {
    let (m, cv) = &SLOTS;
    let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
    while *n >= max_jobs() {
        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
    }
    *n += 1;
    Slot(())
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (m, cv) = &SLOTS;
        let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        cv.notify_one();
    }
}

/// Run `f` on every item with at most `jobs` threads; results in input order.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(usize, &T) -> R + Sync,
) -> Vec<R> {
    let queue = Mutex::new((0..items.len()).collect::<VecDeque<_>>());
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1).min(items.len().max(1)) {
            s.spawn(|| loop {
                let Some(i) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                    break;
                };
                let r = f(i, &items[i]);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

// ---------------------------------------------------------------------------
// Running a scenario

fn cpath(p: &Path) -> Res<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("NUL in path {}", p.display()))
}

fn errno(what: &str, p: &Path) -> String {
    format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    )
}

fn open_for_sync(p: &Path) -> Res<File> {
    // Read-only opens work for files and directories alike, and fsync needs
    // no write access.
    File::open(p).map_err(|e| format!("open {}: {e}", p.display()))
}

fn fsync_path(p: &Path, data_only: bool) -> Res<()> {
    use std::os::fd::AsRawFd;
    let f = open_for_sync(p)?;
    let r = unsafe {
        if data_only {
            libc::fdatasync(f.as_raw_fd())
        } else {
            libc::fsync(f.as_raw_fd())
        }
    };
    if r != 0 {
        return Err(errno(if data_only { "fdatasync" } else { "fsync" }, p));
    }
    Ok(())
}

fn falloc(p: &Path, mode: libc::c_int, off: u64, len: u64) -> Res<()> {
    use std::os::fd::AsRawFd;
    let f = OpenOptions::new()
        .write(true)
        .open(p)
        .map_err(|e| format!("open {}: {e}", p.display()))?;
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    if r != 0 {
        return Err(errno("fallocate", p));
    }
    Ok(())
}

fn write_fill(p: &Path, off: u64, len: u64, fill: &Fill) -> Res<()> {
    // pwrite into an existing file keeps the rest of it.
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(p)
        .map_err(|e| format!("open {}: {e}", p.display()))?;
    let mut rng = match fill {
        Fill::Random(s) => Some(Prng::new(*s)),
        _ => None,
    };
    let chunk = len.min(1 << 20) as usize;
    let mut buf = match fill {
        Fill::Byte(b) => vec![*b; chunk],
        Fill::Text(t) => t.clone(),
        Fill::Random(_) => vec![0; chunk],
    };
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        if let Some(r) = rng.as_mut() {
            r.fill(&mut buf[..n]);
        }
        f.write_all_at(&buf[..n], off + done)
            .map_err(|e| format!("write {}: {e}", p.display()))?;
        done += n as u64;
    }
    Ok(())
}

struct Runner<'a> {
    root: &'a Path,
}

impl Runner<'_> {
    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    fn apply(&self, st: &Step) -> Res<()> {
        let io = |what: &str, p: &Path, r: std::io::Result<()>| {
            r.map_err(|e| format!("{what} {}: {e}", p.display()))
        };
        match st {
            Step::Mkdir(p) => io("mkdir", &self.p(p), std::fs::create_dir(self.p(p))),
            Step::Create(p) => {
                let p = self.p(p);
                io(
                    "create",
                    &p,
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .mode(0o644)
                        .open(&p)
                        .map(drop),
                )
            }
            Step::Write {
                path,
                off,
                len,
                fill,
            } => write_fill(&self.p(path), *off, *len, fill),
            Step::Truncate(p, size) => {
                let p = self.p(p);
                io(
                    "truncate",
                    &p,
                    OpenOptions::new()
                        .write(true)
                        .open(&p)
                        .and_then(|f| f.set_len(*size)),
                )
            }
            Step::Fallocate {
                path,
                off,
                len,
                keep,
            } => falloc(
                &self.p(path),
                if *keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 },
                *off,
                *len,
            ),
            Step::Punch { path, off, len } => falloc(
                &self.p(path),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                *off,
                *len,
            ),
            Step::ZeroRange {
                path,
                off,
                len,
                keep,
            } => {
                let k = if *keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
                falloc(&self.p(path), libc::FALLOC_FL_ZERO_RANGE | k, *off, *len)
            }
            Step::Link(a, b) => io("link", &self.p(b), std::fs::hard_link(self.p(a), self.p(b))),
            Step::Symlink { target, path } => io(
                "symlink",
                &self.p(path),
                std::os::unix::fs::symlink(target, self.p(path)),
            ),
            Step::Rename(a, b) => io("rename", &self.p(a), std::fs::rename(self.p(a), self.p(b))),
            Step::Unlink(p) => io("unlink", &self.p(p), std::fs::remove_file(self.p(p))),
            Step::Rmdir(p) => io("rmdir", &self.p(p), std::fs::remove_dir(self.p(p))),
            Step::SetXattr { path, name, value } => {
                let p = self.p(path);
                let (cp, cn) = (
                    cpath(&p)?,
                    CString::new(name.as_str()).map_err(|_| "NUL in xattr name")?,
                );
                let r = unsafe {
                    libc::lsetxattr(
                        cp.as_ptr(),
                        cn.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                };
                if r != 0 {
                    return Err(errno(&format!("setxattr {name}"), &p));
                }
                Ok(())
            }
            Step::RemoveXattr { path, name } => {
                let p = self.p(path);
                let (cp, cn) = (
                    cpath(&p)?,
                    CString::new(name.as_str()).map_err(|_| "NUL in xattr name")?,
                );
                if unsafe { libc::lremovexattr(cp.as_ptr(), cn.as_ptr()) } != 0 {
                    return Err(errno(&format!("removexattr {name}"), &p));
                }
                Ok(())
            }
            Step::Chmod(p, mode) => {
                use std::os::unix::fs::PermissionsExt;
                let p = self.p(p);
                io(
                    "chmod",
                    &p,
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)),
                )
            }
            Step::Chown(p, u, g) => io(
                "chown",
                &self.p(p),
                std::os::unix::fs::lchown(self.p(p), Some(*u), Some(*g)),
            ),
            Step::Mkfifo(p) => {
                let p = self.p(p);
                if unsafe { libc::mkfifo(cpath(&p)?.as_ptr(), 0o644) } != 0 {
                    return Err(errno("mkfifo", &p));
                }
                Ok(())
            }
            Step::Fsync(p) => fsync_path(&self.p(p), false),
            Step::Fdatasync(p) => fsync_path(&self.p(p), true),
            Step::Sync => {
                use std::os::fd::AsRawFd;
                let f = open_for_sync(self.root)?;
                // syncfs on btrfs commits the running transaction.
                if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
                    return Err(errno("syncfs", self.root));
                }
                Ok(())
            }
            Step::SubvolCreate(p) => run(Command::new("btrfs")
                .args(["subvolume", "create"])
                .arg(self.p(p)))
            .map(drop),
            Step::Snapshot(a, b) => run(Command::new("btrfs")
                .args(["subvolume", "snapshot"])
                .arg(self.p(a))
                .arg(self.p(b)))
            .map(drop),
            Step::Evict => std::fs::write("/proc/sys/vm/drop_caches", "2\n")
                .map_err(|e| format!("drop_caches: {e}")),
            Step::WriteFiles {
                dir,
                count,
                min,
                max,
                sync,
            } => {
                let d = self.p(dir);
                for i in 0..*count {
                    let p = d.join(file_name(i));
                    let data = file_content(i, file_size(i, *min, *max));
                    let f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o644)
                        .open(&p)
                        .map_err(|e| format!("create {}: {e}", p.display()))?;
                    f.write_all_at(&data, 0)
                        .map_err(|e| format!("write {}: {e}", p.display()))?;
                    let r = match sync {
                        SyncKind::None => Ok(()),
                        SyncKind::Fsync => f.sync_all(),
                        SyncKind::Fdatasync => f.sync_data(),
                    };
                    r.map_err(|e| format!("sync {}: {e}", p.display()))?;
                }
                Ok(())
            }
            Step::Crash => Ok(()),
        }
    }
}

/// Directory of the warm-up files every scenario starts with (unless it says
/// `warmup no`): `small` (4 KiB) and `medium` (256 KiB) of incompressible data.
///
/// Why: the kernel (6.x) sorts data block groups into extent size classes
/// (up to 128 KiB, up to 8 MiB, larger) and allocates a new chunk rather
/// than put an extent into a block group of another class; a chunk allocated
/// in the running transaction makes the next fsync commit the transaction
/// instead of writing a log. mkfs makes a single data block group, so the
/// first extent of the other class after the last commit (say, a 16 KiB
/// overwrite of a 256 KiB file) would turn the scenario's fsync into a
/// commit. The warm-up gives each of the two classes its own block group
/// before the steps start. The files stay and show in every manifest.
pub const WARMUP_DIR: &str = ".kcrash-warmup";

fn warm_up(root: &Path) -> Res<()> {
    let d = root.join(WARMUP_DIR);
    std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    // Each file is flushed before the next so they get separate extents
    // allocated in this order: small first, into mkfs's block group.
    for (name, len, seed) in [("small", 4096u64, 0xa11u64), ("medium", 256 << 10, 0xa12)] {
        let p = d.join(name);
        write_fill(&p, 0, len, &Fill::Random(seed))?;
        fsync_path(&p, true)?;
    }
    Ok(())
}

/// A crash image: the backing file of a live mount copied at `crash`.
#[derive(Clone, Debug)]
pub struct CrashImage {
    pub path: PathBuf,
    /// Superblock `log_root` (0: no log, the kernel would not replay).
    pub log_root: u64,
    pub generation: u64,
}

/// Superblock `(generation, log_root)` of an image.
pub fn super_log_root(img: &Path) -> Res<(u64, u64)> {
    let dev = btrkit_core::io::FileDevice::open(img, false)
        .map_err(|e| format!("{}: {e}", img.display()))?;
    let sb = btrkit_core::image::read_superblock(&dev, 0)
        .map_err(|e| format!("{}: {e}", img.display()))?;
    Ok((sb.generation.get(), sb.log_root.get()))
}

/// Run `scn` in `work` (which must be empty or absent and private to this
/// run: it holds the live image and the mount point) and leave the crash
/// image at `work/crash.img`. Checks the log expectation of the scenario.
pub fn generate(scn: &Scenario, work: &Path) -> Res<CrashImage> {
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let live = work.join("live.img");
    let crash = work.join("crash.img");
    let _ = std::fs::remove_file(&live);
    let _ = std::fs::remove_file(&crash);
    File::create(&live)
        .and_then(|f| f.set_len(scn.fssize))
        .map_err(|e| format!("{}: {e}", live.display()))?;
    run(Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .args(&scn.mkfs)
        .arg(&live))
    .map_err(|e| format!("{}: {e}", scn.name))?;
    let opts = scn.mount_options();
    let mnt = work.join("mnt");
    let mut m = Some(LoopMount::mount(&live, &mnt, &opts)?);
    if scn.warmup {
        warm_up(&mnt)?;
    }
    // Whatever mount and warm-up dirtied goes into a commit before the steps.
    Runner { root: &mnt }.apply(&Step::Sync)?;
    let crashes = scn.steps.iter().filter(|(_, s)| *s == Step::Crash).count();
    let mut seen = 0;
    for (line, st) in &scn.steps {
        if *st == Step::Crash {
            seen += 1;
            let tmp = work.join("crash.tmp");
            copy_sparse(&live, &tmp)?;
            if seen < crashes {
                // The live filesystem is thrown away unsynced; the next steps
                // run on what the kernel makes of the crash image.
                if let Some(old) = m.take() {
                    old.unmount()?;
                }
                std::fs::rename(&tmp, &live).map_err(|e| e.to_string())?;
                m = Some(LoopMount::mount(&live, &mnt, &opts)?);
                continue;
            }
            std::fs::rename(&tmp, &crash).map_err(|e| e.to_string())?;
            break;
        }
        Runner { root: &mnt }
            .apply(st)
            .map_err(|e| format!("{} line {line}: {e}", scn.name))?;
    }
    if !crash.exists() {
        copy_sparse(&live, &crash)?;
    }
    if let Some(m) = m.take() {
        m.unmount()?;
    }
    let _ = std::fs::remove_file(&live);
    let (generation, log_root) = super_log_root(&crash)?;
    let want = scn.wants_log();
    if want && log_root == 0 {
        return Err(format!("{}: the crash image has no log tree (log_root 0), the kernel committed instead of logging", scn.name));
    }
    if scn.expect_log == Some(false) && log_root != 0 {
        return Err(format!(
            "{}: the crash image has a log tree at {log_root}, the scenario expects none",
            scn.name
        ));
    }
    Ok(CrashImage {
        path: crash,
        log_root,
        generation,
    })
}

/// Key of a cached crash image: scenario text, generator version, kernel.
fn cache_key(scn: &Scenario) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut h = Fnv::new();
    h.update(scn.text.as_bytes());
    h.update(&GENERATOR_VERSION.to_le_bytes());
    h.update(kernel.trim().as_bytes());
    format!("{}-{:016x}", scn.name, h.finish())
}

/// The crash image of `scn`, generated once and kept in `cache` (keyed by the
/// scenario text, generator version and kernel release). Set
/// `BTRKIT_KCRASH_FRESH=1` to regenerate once per process. Threads asking for
/// the same scenario wait for one generation.
pub fn cached_crash_image(scn: &Scenario, cache: &Path) -> Res<CrashImage> {
    static LOCKS: Mutex<Option<HashMap<String, Arc<Mutex<()>>>>> = Mutex::new(None);
    static FRESH_DONE: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let key = cache_key(scn);
    let lock = LOCKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(key.clone())
        .or_default()
        .clone();
    let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
    let path = cache.join(format!("{key}.img"));
    let fresh = std::env::var("BTRKIT_KCRASH_FRESH").is_ok_and(|v| v == "1")
        && FRESH_DONE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert(key.clone());
    if path.exists() && !fresh {
        let (generation, log_root) = super_log_root(&path)?;
        return Ok(CrashImage {
            path,
            log_root,
            generation,
        });
    }
    std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    // Older images of this scenario (other text, generator or kernel) go.
    if let Ok(rd) = std::fs::read_dir(cache) {
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            let stale = f.len() == scn.name.len() + 21
                && f.starts_with(&scn.name)
                && f.ends_with(".img")
                && f[scn.name.len()..].starts_with('-');
            if stale && e.path() != path {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let work = tempfile::Builder::new()
        .prefix(&format!("kcrash-{}-", scn.name))
        .tempdir()
        .map_err(|e| e.to_string())?;
    let c = {
        let _s = slot();
        generate(scn, work.path())?
    };
    std::fs::rename(&c.path, &path)
        .or_else(|_| copy_sparse(&c.path, &path).map_err(std::io::Error::other))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(CrashImage { path, ..c })
}

/// Where the test binaries and tools keep cached crash images: next to the
/// binaries of the current profile (`target/debug/kcrash-cache`).
pub fn default_cache_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir.join("kcrash-cache")
}

// ---------------------------------------------------------------------------
// Manifests

/// FNV-1a 64, for cache keys only.
struct Fnv(u64);
impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// BLAKE2b-256 of a byte string, as hex.
pub fn content_hash(data: &[u8]) -> String {
    hex(&btrkit_core::csum::CsumType::Blake2b.compute(data)[..32])
}

/// A stable digest of a (sparse) image file: only its data regions are read,
/// with their offsets, so a 512 MiB image with 20 MiB used hashes quickly.
pub fn image_digest(p: &Path) -> Res<String> {
    use std::os::fd::AsRawFd;
    let f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let fd = f.as_raw_fd();
    let mut parts = Vec::new();
    parts.extend_from_slice(&size.to_le_bytes());
    let mut off = 0u64;
    let mut buf = vec![0u8; 4 << 20];
    while off < size {
        let data = unsafe { libc::lseek(fd, off as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: only a hole remains
        }
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let (start, end) = (data as u64, if hole < 0 { size } else { hole as u64 });
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], pos)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            // A block of zeros reads the same whether stored or a hole.
            if buf[..n].iter().any(|&b| b != 0) {
                parts.extend_from_slice(&pos.to_le_bytes());
                parts.extend_from_slice(
                    &btrkit_core::csum::CsumType::Xxhash64.compute(&buf[..n])[..8],
                );
            }
            pos += n as u64;
        }
        off = end;
    }
    Ok(content_hash(&parts))
}

/// What a user sees of one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `f` file, `d` directory, `l` symlink, `p` fifo, `c`/`b` device, `s` socket.
    pub kind: char,
    pub ino: u64,
    /// Permission bits and set-id bits (the type is `kind`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    /// Content digest of a regular file.
    pub hash: Option<String>,
    pub target: Option<String>,
    /// `user.*` extended attributes.
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// A regular file's logical extent map from FIEMAP: `[start, end)` runs of
    /// `data` or `unwritten` (preallocated) space, holes left out.
    pub alloc: Vec<(u64, u64, &'static str)>,
}

impl Entry {
    fn fields(&self) -> Vec<(&'static str, String)> {
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
}

/// Every path of a filesystem (`/` is the root) with what a user sees of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
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
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&String> =
            self.entries.keys().chain(other.entries.keys()).collect();
        for k in keys {
            match (self.entries.get(k), other.entries.get(k)) {
                (Some(_), None) => out.push(format!("only in A: {k}")),
                (None, Some(_)) => out.push(format!("only in B: {k}")),
                (Some(a), Some(b)) if a != b => {
                    let fa: BTreeMap<_, _> = a.fields().into_iter().collect();
                    let fb: BTreeMap<_, _> = b.fields().into_iter().collect();
                    let mut d = Vec::new();
                    for f in fa
                        .keys()
                        .chain(fb.keys())
                        .collect::<std::collections::BTreeSet<_>>()
                    {
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
                    out.push(format!("differs {k}: {}", d.join("; ")));
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
}

fn list_xattrs(p: &Path) -> Res<BTreeMap<String, Vec<u8>>> {
    let cp = cpath(p)?;
    let mut out = BTreeMap::new();
    let n = unsafe { libc::llistxattr(cp.as_ptr(), std::ptr::null_mut(), 0) };
    if n < 0 {
        return Err(errno("listxattr", p));
    }
    let mut names = vec![0u8; n as usize + 1];
    let n = unsafe { libc::llistxattr(cp.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        return Err(errno("listxattr", p));
    }
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name).map_err(|_| "NUL in xattr name")?;
        let len = unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), std::ptr::null_mut(), 0) };
        if len < 0 {
            return Err(errno("getxattr", p));
        }
        let mut v = vec![0u8; len as usize];
        let len =
            unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if len < 0 {
            return Err(errno("getxattr", p));
        }
        v.truncate(len as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    Ok(out)
}

const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;

/// Logical extent map of a file, adjacent runs of one kind merged (so the
/// map does not depend on how the space is cut into extents on disk).
fn fiemap(f: &File) -> Res<Vec<(u64, u64, &'static str)>> {
    use std::os::fd::AsRawFd;
    const N: usize = 128;
    let mut out: Vec<(u64, u64, &'static str)> = Vec::new();
    let mut start = 0u64;
    loop {
        // struct fiemap (32 bytes) followed by N struct fiemap_extent (56 bytes).
        let mut buf = vec![0u64; (32 + 56 * N) / 8];
        buf[0] = start;
        buf[1] = u64::MAX - start;
        buf[3] = N as u64; // fm_extent_count (low half); fm_flags and fm_mapped_extents stay 0
        let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP as _, buf.as_mut_ptr()) };
        if r != 0 {
            return Err(format!("fiemap: {}", std::io::Error::last_os_error()));
        }
        let mapped = (buf[2] >> 32) as usize;
        let mut last = mapped == 0;
        for i in 0..mapped.min(N) {
            let e = &buf[4 + i * 7..4 + i * 7 + 7];
            let (logical, length) = (e[0], e[2]);
            let flags = e[5] as u32;
            let kind = if flags & FIEMAP_EXTENT_UNWRITTEN != 0 {
                "unwritten"
            } else {
                "data"
            };
            match out.last_mut() {
                Some(l) if l.1 == logical && l.2 == kind => l.1 = logical + length,
                _ => out.push((logical, logical + length, kind)),
            }
            if flags & FIEMAP_EXTENT_LAST != 0 {
                last = true;
            }
            start = logical + length;
        }
        if last || mapped < N {
            return Ok(out);
        }
    }
}

fn describe(p: &Path) -> Res<Entry> {
    let md = std::fs::symlink_metadata(p).map_err(|e| format!("lstat {}: {e}", p.display()))?;
    let fmt = md.mode() & libc::S_IFMT;
    let kind = match fmt {
        libc::S_IFREG => 'f',
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        _ => 's',
    };
    let mut e = Entry {
        kind,
        ino: md.ino(),
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        nlink: md.nlink(),
        hash: None,
        target: None,
        xattrs: list_xattrs(p)?,
        alloc: Vec::new(),
    };
    match kind {
        'f' => {
            let mut f = File::open(p).map_err(|e| format!("open {}: {e}", p.display()))?;
            let mut data = Vec::with_capacity(md.size() as usize);
            f.read_to_end(&mut data)
                .map_err(|e| format!("read {}: {e}", p.display()))?;
            e.hash = Some(content_hash(&data));
            e.alloc = fiemap(&f).map_err(|x| format!("{}: {x}", p.display()))?;
        }
        'l' => {
            let t = std::fs::read_link(p).map_err(|e| format!("readlink {}: {e}", p.display()))?;
            e.target = Some(String::from_utf8_lossy(t.as_os_str().as_bytes()).into_owned());
        }
        _ => {}
    }
    Ok(e)
}

/// Manifest of a mounted (or any) directory tree, crossing into subvolumes.
pub fn manifest_of_tree(root: &Path) -> Res<Manifest> {
    let mut m = Manifest::default();
    let mut stack = vec![String::from("/")];
    while let Some(rel) = stack.pop() {
        let full = if rel == "/" {
            root.to_path_buf()
        } else {
            root.join(&rel[1..])
        };
        let e = describe(&full)?;
        if e.kind == 'd' {
            let rd =
                std::fs::read_dir(&full).map_err(|e| format!("readdir {}: {e}", full.display()))?;
            for d in rd {
                let d = d.map_err(|e| format!("readdir {}: {e}", full.display()))?;
                let name = d.file_name().to_string_lossy().into_owned();
                stack.push(if rel == "/" {
                    format!("/{name}")
                } else {
                    format!("{rel}/{name}")
                });
            }
        }
        m.entries.insert(rel, e);
    }
    Ok(m)
}

/// Copy `img` to `copy`, mount the copy with `opts` (a read-write mount
/// makes the kernel replay a log), record the manifest, unmount. The copy
/// stays, as the kernel left it, for the caller to inspect or delete.
pub fn manifest_via_copy(img: &Path, copy: &Path, opts: &str) -> Res<Manifest> {
    copy_sparse(img, copy)?;
    manifest_in_place(copy, opts)
}

/// Mount `img` itself with `opts`, record the manifest, unmount.
pub fn manifest_in_place(img: &Path, opts: &str) -> Res<Manifest> {
    let mnt = tempfile::Builder::new()
        .prefix("kcrash-mnt-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let m = LoopMount::mount(img, &mnt.path().join("m"), opts)?;
    let r = manifest_of_tree(m.path());
    m.unmount()?;
    r
}

/// Manifest of `img` after the kernel's log replay: a copy in `work` is
/// mounted read-write and deleted afterwards. `img` is never touched.
pub fn manifest_of_image(img: &Path, work: &Path) -> Res<Manifest> {
    let copy = work.join(format!("manifest-{}.img", std::process::id()));
    let r = manifest_via_copy(img, &copy, "rw");
    let _ = std::fs::remove_file(&copy);
    r
}

/// `btrfs check --readonly`: Ok when it exits 0 and reports no error.
pub fn btrfs_check(img: &Path) -> Res<()> {
    let o = Command::new("btrfs")
        .args(["check", "--readonly"])
        .arg(img)
        .output()
        .map_err(|e| format!("btrfs check: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() && text.contains("no error found") {
        return Ok(());
    }
    // The first line names the problems; the full report follows, without
    // the space statistics btrfs check prints first.
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !l.starts_with("total ")
                && !l.contains(" bytes: ")
                && !l.starts_with(" referenced")
                && !l.starts_with("found ")
        })
        .collect();
    let problems: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            (l.contains("error")
                || l.contains("invalid")
                || l.contains("mismatch")
                || l.contains("missing"))
                && !l.starts_with("error: errors found")
        })
        .take(4)
        .collect();
    Err(format!(
        "btrfs check --readonly fails ({}): {}\n{}",
        o.status,
        if problems.is_empty() {
            "see below".to_string()
        } else {
            problems.join("; ")
        },
        lines
            .iter()
            .take(40)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    ))
}

/// Check a scenario's `expect` lines against a manifest; one line per failure.
pub fn check_expectations(scn: &Scenario, m: &Manifest) -> Vec<String> {
    let mut fails = Vec::new();
    for (line, ex) in &scn.expects {
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
            Expect::Type(p, k) => match get(p) {
                None => fail(format!("{p} missing")),
                Some(e) if e.kind != *k => fail(format!("{p}: type {}, expected {k}", e.kind)),
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
            Expect::Entries(d, names) => {
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

// ---------------------------------------------------------------------------
// Binaries and the headline workload

/// `btrkit-replay` (built if needed, see [`crate::bin_path`]), or the program
/// `BTRKIT_REPLAY_BIN` names, relative to the repository root or absolute:
/// the harness itself is checked end to end by pointing it at
/// `tests/scripts/kernel-replay-shim.sh`, which lets the kernel replay.
pub fn replay_bin() -> PathBuf {
    match std::env::var_os("BTRKIT_REPLAY_BIN") {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_relative() {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
            } else {
                p
            }
        }
        None => crate::bin_path("btrkit-replay"),
    }
}

/// The headline workload: 10,000 new files, each created, written (100 to
/// 4000 bytes of distinct content) and fsynced one by one with the periodic
/// commit pushed out to 10 minutes, then a power failure.
pub const HEADLINE: &str = "\
# 10,000 files created and fsynced one by one after the last commit. The
# kernel may still commit on its way: a new chunk makes the next fsync commit,
# and every log sync pins the log blocks it replaced until the next commit, so
# metadata space reclaim commits once pinned space gets large next to the free
# space. Small nodes (less pinned per log sync) on a roomy sparse 8 GiB image
# keep that to about one commit: over half of the files are only in the log.
fssize 8G
mkfs -n 4096
mkdir /d
sync
writefiles /d 10000 100-4000 fsync
crash
";
pub const HEADLINE_FILES: u32 = 10_000;
pub const HEADLINE_MIN: u64 = 100;
pub const HEADLINE_MAX: u64 = 4000;

pub fn headline_scenario() -> Scenario {
    Scenario::parse("headline", HEADLINE).expect("the headline scenario parses")
    // OK: constant text
}

/// Count the headline files `/d/fNNNNN` present
/// under `root`: (files present, files with the right content).
pub fn count_headline_files(root: &Path) -> Res<(u32, u32)> {
    let (mut present, mut right) = (0, 0);
    for i in 0..HEADLINE_FILES {
        let p = root.join("d").join(file_name(i));
        match std::fs::read(&p) {
            Ok(data) => {
                present += 1;
                if data == file_content(i, file_size(i, HEADLINE_MIN, HEADLINE_MAX)) {
                    right += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Ok((present, right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_language() {
        let s = Scenario::parse(
            "t",
            "# comment\nmkfs -n 4096 -O ^no-holes\nmount compress=zstd\nfssize 1G\nmkdir /a\nwrite /a/f 0 64K 0xaa\nwrite /a/g 10 0 \"hi\\n\\x41\"\nsetxattr /a/f user.k <3 x 'z'>\nwritefiles /a 10 100-4000 fsync\nfsync /a/f # trailing\ncrash\nexpect size /a/f 64K\nexpect entries /a f g\n",
        )
        .unwrap();
        assert_eq!(s.mkfs, ["-n", "4096", "-O", "^no-holes"]);
        assert_eq!(s.mount_options(), "commit=600,compress=zstd");
        assert_eq!(s.fssize, 1 << 30);
        assert_eq!(
            s.steps[2].1,
            Step::Write {
                path: "/a/g".into(),
                off: 10,
                len: 4,
                fill: Fill::Text(b"hi\nA".to_vec())
            }
        );
        assert_eq!(
            s.steps[3].1,
            Step::SetXattr {
                path: "/a/f".into(),
                name: "user.k".into(),
                value: b"zzz".to_vec()
            }
        );
        assert_eq!(
            s.steps[4].1,
            Step::WriteFiles {
                dir: "/a".into(),
                count: 10,
                min: 100,
                max: 4000,
                sync: SyncKind::Fsync
            }
        );
        assert_eq!(
            s.expects[1].1,
            Expect::Entries("/a".into(), vec!["f".into(), "g".into()])
        );
        assert!(s.wants_log());
        assert!(Scenario::parse("t", "bogus x").is_err());
        assert!(Scenario::parse("t", "write f 0").is_err());
        let s = Scenario::parse("t", "write f 0 1\nfsync f\nsync\ncrash").unwrap();
        assert!(!s.wants_log());
        let s = Scenario::parse("t", "mount commit=5 compress-force=lzo").unwrap();
        assert_eq!(s.mount_options(), "commit=5,compress-force=lzo");
    }

    #[test]
    fn file_contents_are_distinct_and_sized() {
        let a = file_content(1, file_size(1, 100, 4000));
        let b = file_content(2, file_size(2, 100, 4000));
        assert_ne!(a, b);
        assert!((100..=4000).contains(&(a.len() as u64)));
        assert!(a.starts_with(b"file 00001\n"));
        assert_eq!(file_content(3, 5), b"file ");
    }

    #[test]
    fn manifest_diff_names_fields() {
        let e = Entry {
            kind: 'f',
            ino: 257,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: 3,
            nlink: 1,
            hash: Some("ab".repeat(32)),
            target: None,
            xattrs: BTreeMap::new(),
            alloc: vec![],
        };
        let mut a = Manifest::default();
        a.entries.insert("/x".into(), e.clone());
        let mut b = a.clone();
        b.entries.get_mut("/x").unwrap().size = 4;
        b.entries.insert("/y".into(), e);
        let d = a.diff(&b);
        assert_eq!(d, ["differs /x: size 3 vs 4", "only in B: /y"]);
        assert!(a.diff(&a).is_empty());
    }
}
