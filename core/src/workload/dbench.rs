//! dbench on btrkit's engine: NBENCH loadfiles (dbench 4's `client.txt`)
//! replayed by N clients, each in its own `/clients/clientN` tree, as
//! dbench's fileio backend runs them on a local filesystem: NTCreateX
//! opens or creates by its create options and disposition, WriteX and
//! ReadX are pwrite and pread, Flush is fsync, QUERY_* are stats, FIND_FIRST
//! lists a directory, Deltree removes a tree. Each line's expected status
//! is compared with what happened; a different one is counted as
//! unexpected (dbench warns about it). Throughput counts the bytes of
//! ReadX and WriteX, as dbench does.

use super::durable::{position_pattern, CrashCheck};
use crate::fs::{Filesystem, Loc};
use crate::log::batch::SharedFs;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One operation of a loadfile.
#[derive(Clone, Debug, PartialEq)]
pub enum NbOp {
    /// Open or create a file or directory, giving it handle `fnum`;
    /// truncates a regular file for the overwriting dispositions.
    NtCreateX {
        /// Loadfile path (`\clients\client1\...`), mapped to the client's own tree.
        path: String,
        /// SMB create options; bit 0x1 (FILE_DIRECTORY_FILE) makes a directory.
        options: u32,
        /// SMB create disposition: 0 supersede, 1 open, 2 create, 3 open-if,
        /// 4 overwrite, 5 overwrite-if.
        disposition: u32,
        /// Handle that later lines use to name the open file.
        fnum: i64,
    },
    /// Close a handle.
    Close {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
    },
    /// pwrite `size` bytes at byte offset `off` of an open file.
    WriteX {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
        /// Byte offset in the file.
        off: u64,
        /// Bytes to write.
        size: u64,
    },
    /// pread `size` bytes at byte offset `off` of an open file.
    ReadX {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
        /// Byte offset in the file.
        off: u64,
        /// Bytes to read.
        size: u64,
    },
    /// fsync an open file (through the shared fsync, so concurrent Flushes
    /// batch their log syncs).
    Flush {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
    },
    /// Rename a file or directory.
    Rename {
        /// Loadfile path of the existing name.
        from: String,
        /// Loadfile path of the new name.
        to: String,
    },
    /// Remove a file's name.
    Unlink {
        /// Loadfile path of the name to remove.
        path: String,
    },
    /// Remove a directory and everything under it (status not checked, as
    /// dbench does not).
    Deltree {
        /// Loadfile path of the directory.
        path: String,
    },
    /// Make a directory (status not checked, as dbench does not).
    Mkdir {
        /// Loadfile path of the new directory.
        path: String,
    },
    /// Remove an empty directory.
    Rmdir {
        /// Loadfile path of the directory.
        path: String,
    },
    /// QUERY_PATH_INFORMATION: stat a path (symlinks followed).
    QueryPath {
        /// Loadfile path to stat.
        path: String,
    },
    /// QUERY_FILE_INFORMATION: stat an open file.
    QueryFile {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
    },
    /// QUERY_FS_INFORMATION: asks the engine nothing and always succeeds.
    QueryFs,
    /// SET_FILE_INFORMATION on an open file.
    SetFile {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
        /// SMB information level: 1004 (basic info) updates the times; other
        /// levels change nothing.
        level: u32,
    },
    /// FIND_FIRST: list a directory; succeeds when a name matches.
    FindFirst {
        /// Loadfile path whose last component is a pattern with `*` and `?`,
        /// matched case-insensitively.
        pattern: String,
    },
    /// LockX or UnlockX: no lock is taken; succeeds when the handle is open.
    Lock {
        /// Handle from an earlier NTCreateX.
        fnum: i64,
    },
}

impl NbOp {
    /// The operation's name as dbench reports it (`NTCreateX`, `Qpathinfo`,
    /// `LockX`...), the key of [`DbenchReport::ops`].
    pub fn name(&self) -> &'static str {
        match self {
            NbOp::NtCreateX { .. } => "NTCreateX",
            NbOp::Close { .. } => "Close",
            NbOp::WriteX { .. } => "WriteX",
            NbOp::ReadX { .. } => "ReadX",
            NbOp::Flush { .. } => "Flush",
            NbOp::Rename { .. } => "Rename",
            NbOp::Unlink { .. } => "Unlink",
            NbOp::Deltree { .. } => "Deltree",
            NbOp::Mkdir { .. } => "Mkdir",
            NbOp::Rmdir { .. } => "Rmdir",
            NbOp::QueryPath { .. } => "Qpathinfo",
            NbOp::QueryFile { .. } => "Qfileinfo",
            NbOp::QueryFs => "Qfsinfo",
            NbOp::SetFile { .. } => "Sfileinfo",
            NbOp::FindFirst { .. } => "Find",
            NbOp::Lock { .. } => "LockX",
        }
    }
}

/// A line: the operation and the status it expects to succeed with.
#[derive(Clone, Debug, PartialEq)]
pub struct NbLine {
    /// Line number in the loadfile, from 1.
    pub line: usize,
    /// The operation.
    pub op: NbOp,
    /// The loadfile expects `NT_STATUS_OK` (true) or some failure status
    /// (false).
    pub ok: bool,
}

fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn num(s: &str, line: usize) -> Result<u64> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| Error::Invalid(format!("loadfile line {line}: {s:?} is not a number")))
}

/// Parse a loadfile. Unknown operations are an error naming the line; a
/// leading timestamp (dbench 3 loadfiles) is skipped.
pub fn parse_loadfile(text: &str) -> Result<Vec<NbLine>> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let mut w = words(raw.trim());
        if w.is_empty() || w[0].starts_with('#') {
            continue;
        }
        if w[0].parse::<f64>().is_ok() && w.len() > 1 {
            w.remove(0);
        }
        let status = w.last().cloned().unwrap_or_default();
        if !status.starts_with("NT_STATUS_") {
            return Err(Error::Invalid(format!(
                "loadfile line {line}: no NT_STATUS at the end"
            )));
        }
        let need = |n: usize| -> Result<()> {
            if w.len() < n + 2 {
                return Err(Error::Invalid(format!(
                    "loadfile line {line}: {} needs {n} arguments",
                    w[0]
                )));
            }
            Ok(())
        };
        let fnum = |s: &str| -> Result<i64> {
            s.parse::<i64>()
                .map_err(|_| Error::Invalid(format!("loadfile line {line}: {s:?} is not a handle")))
        };
        let op = match w[0].as_str() {
            "NTCreateX" => {
                need(4)?;
                NbOp::NtCreateX {
                    path: w[1].clone(),
                    options: num(&w[2], line)? as u32,
                    disposition: num(&w[3], line)? as u32,
                    fnum: fnum(&w[4])?,
                }
            }
            "Close" => {
                need(1)?;
                NbOp::Close { fnum: fnum(&w[1])? }
            }
            "WriteX" => {
                need(4)?;
                NbOp::WriteX {
                    fnum: fnum(&w[1])?,
                    off: num(&w[2], line)?,
                    size: num(&w[3], line)?,
                }
            }
            "ReadX" => {
                need(4)?;
                NbOp::ReadX {
                    fnum: fnum(&w[1])?,
                    off: num(&w[2], line)?,
                    size: num(&w[3], line)?,
                }
            }
            "Flush" => {
                need(1)?;
                NbOp::Flush { fnum: fnum(&w[1])? }
            }
            "Rename" => {
                need(2)?;
                NbOp::Rename {
                    from: w[1].clone(),
                    to: w[2].clone(),
                }
            }
            "Unlink" => {
                need(1)?;
                NbOp::Unlink { path: w[1].clone() }
            }
            "Deltree" => {
                need(1)?;
                NbOp::Deltree { path: w[1].clone() }
            }
            "Mkdir" => {
                need(1)?;
                NbOp::Mkdir { path: w[1].clone() }
            }
            "Rmdir" => {
                need(1)?;
                NbOp::Rmdir { path: w[1].clone() }
            }
            "QUERY_PATH_INFORMATION" | "Qpathinfo" => {
                need(1)?;
                NbOp::QueryPath { path: w[1].clone() }
            }
            "QUERY_FILE_INFORMATION" | "Qfileinfo" => {
                need(1)?;
                NbOp::QueryFile { fnum: fnum(&w[1])? }
            }
            "QUERY_FS_INFORMATION" | "Qfsinfo" => NbOp::QueryFs,
            "SET_FILE_INFORMATION" | "Sfileinfo" => {
                need(2)?;
                NbOp::SetFile {
                    fnum: fnum(&w[1])?,
                    level: num(&w[2], line)? as u32,
                }
            }
            "FIND_FIRST" | "Find" => {
                need(1)?;
                NbOp::FindFirst {
                    pattern: w[1].clone(),
                }
            }
            "LockX" | "UnlockX" => {
                need(1)?;
                NbOp::Lock { fnum: fnum(&w[1])? }
            }
            o => {
                return Err(Error::Invalid(format!(
                    "loadfile line {line}: unknown operation {o}"
                )))
            }
        };
        out.push(NbLine {
            line,
            op,
            ok: status == "NT_STATUS_OK",
        });
    }
    if out.is_empty() {
        return Err(Error::Invalid("the loadfile has no operations".into()));
    }
    Ok(out)
}

/// Count and latency of one operation kind over all clients in the counted
/// run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpStats {
    /// Operations done.
    pub count: u64,
    /// Mean latency in milliseconds.
    pub avg_ms: f64,
    /// Largest latency in milliseconds.
    pub max_ms: f64,
}

/// The result of a dbench [`run`], in dbench's terms, plus the engine's
/// counters and device I/O of the counted run (the warmup excluded).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DbenchReport {
    /// Client threads that ran.
    pub clients: u64,
    /// Wall-clock length of the counted run in seconds (after the warmup).
    pub seconds: f64,
    /// Throughput as dbench gives it: bytes of successful ReadX and WriteX,
    /// in MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Largest latency of any operation, in milliseconds.
    pub max_latency_ms: f64,
    /// Lines whose status was not the one the loadfile expects.
    pub unexpected: u64,
    /// The first few of them, for a person to read.
    pub unexpected_examples: Vec<String>,
    /// Whole passes of the loadfile, all clients together.
    pub loadfile_passes: u64,
    /// Count and latency per operation, by name ([`NbOp::name`]).
    pub ops: BTreeMap<String, OpStats>,
    /// Engine counters (commits, fsyncs, log syncs...) for the counted run.
    pub stats: crate::fs::EngineStats,
    /// Device writes and flushes of the counted run.
    pub io: super::fileio::IoSummary,
    /// Bytes of WriteX payload.
    pub payload_written: u64,
    /// Seconds of warmup before the `seconds` counted, and the operations
    /// the clients finished in it (forgotten).
    pub warmup_seconds: f64,
    /// Operations the clients finished during the warmup (not in `ops`).
    pub warmup_ops: u64,
}

/// How a dbench run is made and when it ends.
#[derive(Clone, Debug)]
pub struct DbenchOptions {
    /// Number of clients, each a thread with its own `/clients/clientN`
    /// tree; at least 1.
    pub clients: u64,
    /// Seconds; with `passes`, whichever ends first (0: no time limit).
    pub time: f64,
    /// Passes of the loadfile per client (0: until the time is up).
    pub passes: u64,
    /// Seconds of warmup before `time` starts, as dbench's: the clients
    /// run, and what they did is then forgotten (bytes, operation counts,
    /// latencies, the engine's counters); dbench's default is a fifth of
    /// the time limit. Only with a time limit.
    pub warmup: f64,
}

/// Per-client state: the handles of the loadfile mapped to inodes.
struct Client {
    id: u64,
    handles: HashMap<i64, Loc>,
    wbuf: Vec<u8>,
    /// The path each handle was opened by.
    paths: HashMap<i64, String>,
    /// With a crash check: the client's files and what its Flushes
    /// acknowledged.
    durable: Option<DurableFiles>,
}

/// A written file: where, what was written since it was created (or
/// truncated), and what a Flush acknowledged of that.
struct Tracked {
    loc: Loc,
    size: u64,
    ranges: BTreeMap<u64, u64>,
    ack: Option<(u64, BTreeMap<u64, u64>)>,
}

/// One client's files, for the check after a crash. A file's
/// acknowledgement stands until something the client did later may
/// legitimately undo or move it without a sync (a truncate, an unlink, a
/// rename of it or of a directory above it, a Deltree): from then on the
/// file is no longer checked. Writes carry [`position_pattern`] bytes, so
/// any write to a place writes the same bytes there.
#[derive(Default)]
pub struct DurableFiles {
    files: HashMap<String, Tracked>,
    writes: u64,
    acknowledged: u64,
}

impl DurableFiles {
    fn created(&mut self, path: &str, loc: Loc) {
        self.files.insert(
            path.to_string(),
            Tracked {
                loc,
                size: 0,
                ranges: BTreeMap::new(),
                ack: None,
            },
        );
    }

    fn written(&mut self, path: &str, off: u64, len: u64) {
        self.writes += 1;
        let Some(t) = self.files.get_mut(path) else {
            return;
        };
        t.size = t.size.max(off + len);
        // Merge [off, off + len) into the disjoint ranges.
        let (mut a, mut b) = (off, off + len);
        let touching: Vec<(u64, u64)> = t
            .ranges
            .range(..=b)
            .rev()
            .take_while(|(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            t.ranges.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        t.ranges.insert(a, b);
    }

    /// `path` and everything under it.
    fn forget(&mut self, path: &str) {
        let under = format!("{}/", path.trim_end_matches('/'));
        self.files
            .retain(|p, _| p != path && !p.starts_with(&under));
    }

    fn snapshot(&self, path: &str) -> Option<(u64, BTreeMap<u64, u64>)> {
        self.files.get(path).map(|t| (t.size, t.ranges.clone()))
    }

    fn acknowledge(&mut self, path: &str, snap: Option<(u64, BTreeMap<u64, u64>)>) {
        if let (Some(t), Some(s)) = (self.files.get_mut(path), snap) {
            self.acknowledged += 1;
            t.ack = Some(s);
        }
    }
}

/// After a crash and recovery: every file a Flush acknowledged (and the
/// client did not later truncate, unlink or move) is at its path, as the
/// same inode, at least as long, with the acknowledged bytes.
pub fn verify_durable(fs: &mut Filesystem, clients: &[DurableFiles]) -> Result<CrashCheck> {
    let mut r = CrashCheck {
        unit: "file",
        ..Default::default()
    };
    for c in clients {
        r.writes += c.writes;
        r.acknowledged += c.acknowledged;
        let mut paths: Vec<&String> = c.files.keys().collect();
        paths.sort();
        for p in paths {
            let t = &c.files[p];
            r.checked += 1;
            let Some((size, ranges)) = &t.ack else {
                continue;
            };
            r.checked_acknowledged += 1;
            let problem = (|| -> Result<Option<String>> {
                let l = match fs.resolve(p, false) {
                    Ok(l) => l,
                    Err(e) if errno_of(&e) == libc::ENOENT => return Ok(Some("missing".into())),
                    Err(e) => return Err(e),
                };
                if l != t.loc {
                    return Ok(Some(format!("inode {} where {} was", l.ino, t.loc.ino)));
                }
                let st = fs.stat(l)?;
                if st.size < *size {
                    return Ok(Some(format!("{} bytes, {} acknowledged", st.size, size)));
                }
                for (&a, &b) in ranges {
                    let got = match fs.read(l, a, b - a) {
                        Ok(g) => g,
                        Err(e) if errno_of(&e) == libc::EIO => {
                            return Ok(Some(format!("bytes {a}..{b} unreadable: {e}")))
                        }
                        Err(e) => return Err(e),
                    };
                    if got != position_pattern(l.ino, a, (b - a) as usize) {
                        return Ok(Some(format!("bytes {a}..{b} differ from what was written")));
                    }
                }
                Ok(None)
            })()?;
            if let Some(why) = problem {
                r.lost += 1;
                if r.examples.len() < 8 {
                    r.examples.push(format!("{p}: {why}"));
                }
            }
        }
    }
    Ok(r)
}

/// A loadfile path for client `id`: `client1` becomes `clientN`, `\` is
/// `/`, and names are case-folded as a case-insensitive server sees them.
fn client_path(p: &str, id: u64) -> String {
    let p = p.replace('\\', "/").to_lowercase();
    p.replacen("/clients/client1", &format!("/clients/client{id}"), 1)
}

fn errno_of(e: &Error) -> i32 {
    e.as_errno()
}

impl Client {
    /// Run one line: Ok(true) when it succeeded.
    fn apply(&mut self, fs: &mut Filesystem, op: &NbOp) -> Result<bool> {
        let id = self.id;
        let soft = |r: Result<()>| -> Result<bool> {
            match r {
                Ok(()) => Ok(true),
                Err(e) if errno_of(&e) != 0 && errno_of(&e) != libc::EIO => Ok(false),
                Err(e) => Err(e),
            }
        };
        match op {
            NbOp::NtCreateX {
                path,
                options,
                disposition,
                fnum,
            } => {
                let p = client_path(path, id);
                let dir = options & 0x1 != 0;
                let r = (|| -> Result<(Loc, bool)> {
                    let found = match fs.resolve(&p, true) {
                        Ok(l) => Some(l),
                        Err(e) if errno_of(&e) == libc::ENOENT => None,
                        Err(e) => return Err(e),
                    };
                    // FILE_OPEN 1, FILE_CREATE 2, FILE_OPEN_IF 3,
                    // FILE_OVERWRITE 4, FILE_OVERWRITE_IF 5, FILE_SUPERSEDE 0.
                    let (l, mut fresh) = match (found, disposition) {
                        (Some(_), 2) => return Err(Error::errno(libc::EEXIST, "exists")),
                        (Some(l), _) => (l, false),
                        (None, 1) | (None, 4) => {
                            return Err(Error::errno(libc::ENOENT, "not found"))
                        }
                        (None, _) => {
                            let (d, n) = fs.resolve_parent(&p)?;
                            let l = if dir {
                                fs.mkdir(d, &n, 0o755)?
                            } else {
                                fs.create(d, &n, 0o644)?
                            };
                            (l, true)
                        }
                    };
                    let reg = crate::fs::inode::is_reg(fs.item(l)?.mode.get());
                    if !dir && matches!(disposition, 0 | 4 | 5) && reg {
                        fs.truncate(l, 0)?;
                        fresh = true;
                    }
                    fs.open(l)?;
                    Ok((l, fresh && reg))
                })();
                match r {
                    Ok((l, fresh)) => {
                        if let Some(old) = self.handles.insert(*fnum, l) {
                            fs.close(old)?;
                        }
                        if let Some(d) = &mut self.durable {
                            if fresh {
                                d.created(&p, l);
                            }
                        }
                        self.paths.insert(*fnum, p);
                        Ok(true)
                    }
                    Err(e) => soft(Err(e)),
                }
            }
            NbOp::Close { fnum } => match self.handles.remove(fnum).inspect(|_| {
                self.paths.remove(fnum);
            }) {
                Some(l) => soft(fs.close(l)),
                None => Ok(false),
            },
            NbOp::WriteX { fnum, off, size } => {
                let Some(&l) = self.handles.get(fnum) else {
                    return Ok(false);
                };
                let r = match &mut self.durable {
                    Some(d) => {
                        let r = fs.write(l, *off, &position_pattern(l.ino, *off, *size as usize));
                        if r.is_ok() {
                            if let Some(p) = self.paths.get(fnum) {
                                d.written(p, *off, *size);
                            }
                        }
                        r
                    }
                    None => {
                        if self.wbuf.len() < *size as usize {
                            self.wbuf.resize(
                                *size as usize,
                                (id as u8).wrapping_mul(37).wrapping_add(1),
                            );
                        }
                        fs.write(l, *off, &self.wbuf[..*size as usize])
                    }
                };
                let ok = soft(r)?;
                fs.periodic()?;
                Ok(ok)
            }
            NbOp::ReadX { fnum, off, size } => {
                let Some(&l) = self.handles.get(fnum) else {
                    return Ok(false);
                };
                soft(fs.read(l, *off, *size).map(drop))
            }
            NbOp::Flush { .. } => Err(Error::Invalid(
                "Flush runs through the shared fsync, not Client::apply".into(),
            )),
            NbOp::Rename { from, to } => {
                let (a, b) = (client_path(from, id), client_path(to, id));
                if let Some(d) = &mut self.durable {
                    d.forget(&a);
                    d.forget(&b);
                }
                soft((|| {
                    let (od, on) = fs.resolve_parent(&a)?;
                    let (nd, nn) = fs.resolve_parent(&b)?;
                    fs.rename(od, &on, nd, &nn)
                })())
            }
            NbOp::Unlink { path } => {
                let p = client_path(path, id);
                if let Some(d) = &mut self.durable {
                    d.forget(&p);
                }
                soft((|| {
                    let (d, n) = fs.resolve_parent(&p)?;
                    fs.unlink(d, &n)
                })())
            }
            NbOp::Deltree { path } => {
                let p = client_path(path, id);
                if let Some(d) = &mut self.durable {
                    d.forget(&p);
                }
                match fs.resolve(&p, false) {
                    Ok(l) => {
                        deltree(fs, l, 0)?;
                        let (d, n) = fs.resolve_parent(&p)?;
                        soft(fs.rmdir(d, &n))
                    }
                    Err(e) if errno_of(&e) == libc::ENOENT => Ok(false),
                    Err(e) => Err(e),
                }
            }
            NbOp::Mkdir { path } => {
                let p = client_path(path, id);
                soft((|| {
                    let (d, n) = fs.resolve_parent(&p)?;
                    fs.mkdir(d, &n, 0o755).map(drop)
                })())
            }
            NbOp::Rmdir { path } => {
                let p = client_path(path, id);
                if let Some(d) = &mut self.durable {
                    d.forget(&p);
                }
                soft((|| {
                    let (d, n) = fs.resolve_parent(&p)?;
                    fs.rmdir(d, &n)
                })())
            }
            NbOp::QueryPath { path } => {
                let p = client_path(path, id);
                soft(fs.resolve(&p, true).and_then(|l| fs.stat(l)).map(drop))
            }
            NbOp::QueryFile { fnum } => {
                let Some(&l) = self.handles.get(fnum) else {
                    return Ok(false);
                };
                soft(fs.stat(l).map(drop))
            }
            NbOp::QueryFs => Ok(true),
            NbOp::SetFile { fnum, level } => {
                let Some(&l) = self.handles.get(fnum) else {
                    return Ok(false);
                };
                // SMB_SET_FILE_BASIC_INFO: times; the other levels carry
                // nothing the loadfile gives.
                if *level == 1004 {
                    soft(fs.set_times(l, None))
                } else {
                    Ok(true)
                }
            }
            NbOp::FindFirst { pattern } => {
                let p = client_path(pattern, id);
                let (dir, pat) = match p.rsplit_once('/') {
                    Some((d, f)) => (
                        if d.is_empty() {
                            "/".to_string()
                        } else {
                            d.to_string()
                        },
                        f.to_string(),
                    ),
                    None => ("/".to_string(), p.clone()),
                };
                let l = match fs.resolve(&dir, true) {
                    Ok(l) => l,
                    Err(e) if errno_of(&e) == libc::ENOENT => return Ok(false),
                    Err(e) => return Err(e),
                };
                let names = fs.readdir(l)?;
                Ok(names
                    .iter()
                    .any(|(n, _, _)| glob(&pat, &String::from_utf8_lossy(n).to_lowercase())))
            }
            NbOp::Lock { fnum } => Ok(self.handles.contains_key(fnum)),
        }
    }
}

/// Remove everything under directory `l` (bounded depth).
fn deltree(fs: &mut Filesystem, l: Loc, depth: u32) -> Result<()> {
    if depth > 64 {
        return Err(Error::Invalid(
            "deltree: directories nested too deep".into(),
        ));
    }
    for (name, child, _) in fs.readdir(l)? {
        if crate::fs::inode::is_dir(fs.item(child)?.mode.get()) {
            deltree(fs, child, depth + 1)?;
            fs.rmdir(l, &name)?;
        } else {
            fs.unlink(l, &name)?;
        }
    }
    Ok(())
}

/// `*` and `?` matching, as FIND_FIRST patterns use them.
fn glob(p: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
    let (mut pi, mut si, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// What one client did in the counted run (the warmup's forgotten but
/// for its operation count; the statuses and passes of the whole run).
struct ClientOut {
    bytes: u64,
    unexpected: u64,
    passes: u64,
    examples: Vec<String>,
    /// Per operation: count, total and max latency (ms).
    ops: BTreeMap<String, (u64, f64, f64)>,
    written: u64,
    warm_ops: u64,
    durable: Option<DurableFiles>,
}

/// Run `clients` clients over the loadfile until the time or the passes
/// are done. Each client's tree is made first (`/clients`).
pub fn run(shared: &SharedFs, load: &[NbLine], o: &DbenchOptions) -> Result<DbenchReport> {
    Ok(run_with(shared, load, o, false)?.0)
}

/// [`run`]; with `track`, writes carry position patterns and each
/// client's acknowledged files come back for [`verify_durable`].
pub fn run_with(
    shared: &SharedFs,
    load: &[NbLine],
    o: &DbenchOptions,
    track: bool,
) -> Result<(DbenchReport, Vec<DurableFiles>)> {
    if o.clients == 0 {
        return Err(Error::Invalid("--clients must be at least 1".into()));
    }
    if o.time <= 0.0 && o.passes == 0 {
        return Err(Error::Invalid(
            "set --time or --passes: the run would never end".into(),
        ));
    }
    {
        let mut fs = shared.lock();
        let root = fs.root();
        if fs.lookup(root, b"clients")?.is_none() {
            fs.mkdir(root, b"clients", 0o755)?;
        }
    }
    if !(o.warmup >= 0.0 && o.warmup.is_finite()) {
        return Err(Error::Invalid("--warmup must be 0 or more seconds".into()));
    }
    let mut before = shared.lock().stats.clone();
    let mut io0 = super::fileio::IoSummary::of(&shared.lock());
    let stop = AtomicBool::new(false);
    let mut started = Instant::now();
    // The counted run starts when the warmup ends; whatever a client
    // finishes before that is forgotten by the client itself.
    let warm_end =
        (o.time > 0.0 && o.warmup > 0.0).then(|| started + Duration::from_secs_f64(o.warmup));
    let deadline =
        (o.time > 0.0).then(|| warm_end.unwrap_or(started) + Duration::from_secs_f64(o.time));
    let outs: Vec<Result<ClientOut>> = std::thread::scope(|s| {
        let hs: Vec<_> = (1..=o.clients)
            .map(|id| {
                let stop = &stop;
                s.spawn(move || -> Result<ClientOut> {
                    let _seat = shared.seat();
                    let mut c = Client {
                        id,
                        handles: HashMap::new(),
                        wbuf: Vec::new(),
                        paths: HashMap::new(),
                        durable: track.then(DurableFiles::default),
                    };
                    let (mut bytes, mut unexpected, mut passes, mut written) =
                        (0u64, 0u64, 0u64, 0u64);
                    let mut examples = Vec::new();
                    let mut ops: BTreeMap<String, (u64, f64, f64)> = BTreeMap::new();
                    let mut warming = warm_end.is_some();
                    let mut warm_ops = 0u64;
                    'outer: loop {
                        for l in load {
                            if stop.load(Ordering::Relaxed)
                                || deadline.is_some_and(|d| Instant::now() >= d)
                            {
                                break 'outer;
                            }
                            let t0 = Instant::now();
                            let ok = match &l.op {
                                NbOp::Flush { fnum } => match c.handles.get(fnum) {
                                    Some(&h) => match (
                                        c.paths.get(fnum).cloned(),
                                        shared.fsync(h, false, None),
                                    ) {
                                        (Some(p), Ok(())) => {
                                            if let Some(d) = &mut c.durable {
                                                // What was written before the
                                                // fsync (a client is one thread).
                                                let snap = d.snapshot(&p);
                                                d.acknowledge(&p, snap);
                                            }
                                            true
                                        }
                                        (None, Ok(())) => true,
                                        (_, Err(e)) if errno_of(&e) != 0 => false,
                                        (_, Err(e)) => return Err(e),
                                    },
                                    None => false,
                                },
                                op => {
                                    let mut fs = shared.lock();
                                    c.apply(&mut fs, op)?
                                }
                            };
                            let ms = t0.elapsed().as_secs_f64() * 1000.0;
                            if warming && warm_end.is_some_and(|w| Instant::now() >= w) {
                                warming = false;
                                warm_ops = ops.values().map(|e| e.0).sum();
                                bytes = 0;
                                written = 0;
                                ops.clear();
                            }
                            if ok {
                                if let NbOp::WriteX { size, .. } | NbOp::ReadX { size, .. } = &l.op
                                {
                                    bytes += size;
                                }
                                if let NbOp::WriteX { size, .. } = &l.op {
                                    written += size;
                                }
                            }
                            // dbench does not check Deltree and Mkdir (a
                            // tree left by an earlier run, the shared
                            // \clients made by the first client).
                            let checked =
                                !matches!(l.op, NbOp::Deltree { .. } | NbOp::Mkdir { .. });
                            if checked && ok != l.ok {
                                unexpected += 1;
                                if examples.len() < 5 {
                                    examples.push(format!(
                                        "client {id}, line {}: {} {}",
                                        l.line,
                                        l.op.name(),
                                        if l.ok { "failed" } else { "succeeded" }
                                    ));
                                }
                            }
                            let e = ops.entry(l.op.name().to_string()).or_insert((0, 0.0, 0.0));
                            e.0 += 1;
                            e.1 += ms;
                            e.2 = e.2.max(ms);
                        }
                        passes += 1;
                        if o.passes > 0 && passes >= o.passes {
                            break;
                        }
                    }
                    let mut fs = shared.lock();
                    for (_, h) in c.handles.drain() {
                        fs.close(h)?;
                    }
                    Ok(ClientOut {
                        bytes,
                        unexpected,
                        passes,
                        examples,
                        ops,
                        written,
                        warm_ops,
                        durable: c.durable,
                    })
                })
            })
            .collect();
        if let Some(w) = warm_end {
            // The engine's counters start over with the counted run too.
            while Instant::now() < w && !hs.iter().all(|h| h.is_finished()) {
                std::thread::sleep((w - Instant::now()).min(Duration::from_millis(20)));
            }
            let fs = shared.lock();
            before = fs.stats.clone();
            io0 = super::fileio::IoSummary::of(&fs);
            started = w;
        }
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Internal("a client thread panicked".into())))
            })
            .collect()
    });
    let secs = started.elapsed().as_secs_f64();
    let mut r = DbenchReport {
        clients: o.clients,
        seconds: secs,
        warmup_seconds: warm_end.map_or(0.0, |_| o.warmup),
        ..Default::default()
    };
    let mut bytes = 0;
    let mut ops: BTreeMap<String, (u64, f64, f64)> = BTreeMap::new();
    let mut durable = Vec::new();
    for x in outs {
        let c = x?;
        durable.extend(c.durable);
        bytes += c.bytes;
        r.payload_written += c.written;
        r.warmup_ops += c.warm_ops;
        r.unexpected += c.unexpected;
        r.loadfile_passes += c.passes;
        for e in c.examples {
            if r.unexpected_examples.len() < 10 {
                r.unexpected_examples.push(e);
            }
        }
        for (k, (n, sum, max)) in c.ops {
            let e = ops.entry(k).or_insert((0, 0.0, 0.0));
            e.0 += n;
            e.1 += sum;
            e.2 = e.2.max(max);
        }
    }
    r.mb_per_s = bytes as f64 / 1e6 / secs.max(1e-9);
    for (k, (n, sum, max)) in ops {
        r.max_latency_ms = r.max_latency_ms.max(max);
        r.ops.insert(
            k,
            OpStats {
                count: n,
                avg_ms: if n > 0 { sum / n as f64 } else { 0.0 },
                max_ms: max,
            },
        );
    }
    let st = super::fileio::diff_stats(&before, &shared.lock().stats);
    r.stats = st;
    r.io = super::fileio::IoSummary::of(&shared.lock()).since(io0);
    Ok((r, durable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_standard_forms() {
        let t = "Deltree \"\\clients\\client1\" NT_STATUS_OK\nNTCreateX \"\\clients\\client1\\a b\" 0x40 0x2 9938 NT_STATUS_OK\nWriteX 9938 0 65536 65536 NT_STATUS_OK\nFIND_FIRST \"\\clients\\client1\\FILLER.*\" 260 1366 0 NT_STATUS_NO_SUCH_FILE\n";
        let l = parse_loadfile(t).unwrap();
        assert_eq!(l.len(), 4);
        assert_eq!(
            l[1].op,
            NbOp::NtCreateX {
                path: "\\clients\\client1\\a b".into(),
                options: 0x40,
                disposition: 2,
                fnum: 9938
            }
        );
        assert_eq!(
            l[2].op,
            NbOp::WriteX {
                fnum: 9938,
                off: 0,
                size: 65536
            }
        );
        assert!(!l[3].ok);
        assert!(parse_loadfile("Frobnicate 1 NT_STATUS_OK")
            .unwrap_err()
            .to_string()
            .contains("line 1"));
        assert!(parse_loadfile("WriteX 1 NT_STATUS_OK").is_err());
    }

    #[test]
    fn paths_and_patterns() {
        assert_eq!(
            client_path("\\clients\\client1\\~dmtmp\\WORD", 7),
            "/clients/client7/~dmtmp/word"
        );
        assert!(glob("filler.*", "filler.000"));
        assert!(!glob("filler.*", "fill.000"));
        assert!(glob("*.t?t", "a.txt"));
    }
}
