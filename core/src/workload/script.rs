//! The workload script language: one parser for every backend (the engine
//! behind `btrkit-shell`, and the kernel harness of the tests).
//!
//! One command a line; `#` starts a comment; numbers are decimal or `0x`
//! hex with an optional K/M/G suffix; `"..."` is a string with C escapes
//! (`\n \t \r \0 \\ \" \xHH`, octal `\NNN`); `<N x 'C'>` is N copies of C.
//! Paths are relative to the root of the filesystem (a leading `/` is
//! allowed). Lines starting with `!` are ignored.
//!
//! Directives (they apply to the whole run wherever they appear): `mkfs
//! ARGS...` (mkfs.btrfs options, profiles `-m`/`-d` included), `fssize SIZE`
//! (default 512M; of each device), `devices N` (the filesystem spans N
//! devices, default 1), `mount OPTS` (comma separated mount options),
//! `expect-log yes|no|any`, `warmup yes|no`.
//!
//! Steps: see [`Step`]; expectations: see [`Expect`]. The language is the one
//! the kernel oracle (`kcrash.py`) documents, plus `writefiles`, `chown`,
//! `mkfifo`, `random:SEED` fills, `expect fill`, `enospc-ok` on `fallocate`,
//! and the shell's `read`,
//! `ls`, `stat`, `stats`, `set` and `crash --keep-random SEED`.

use std::fmt;

/// A parse error with its 1-based line (0 when the error is not tied to one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number; 0 when the error is about the script as a whole.
    pub line: usize,
    /// What is wrong, for a person (often the usage of the verb).
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: {}", self.line, self.msg)
        } else {
            f.write_str(&self.msg)
        }
    }
}

type Res<T> = std::result::Result<T, String>;

/// Size in bytes of the image a run creates when the script has no
/// `fssize` directive: 512 MiB (the kernel oracle's default).
pub const DEFAULT_FSSIZE: u64 = 512 << 20;

/// Most devices a script's filesystem may span (`devices N`).
pub const MAX_DEVICES: u64 = 16;
/// Fill byte of `write`, `dwrite` and `mwrite` without one.
pub const DEFAULT_FILL: u8 = 0xcd;

/// The bytes a `write` step puts in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Every byte is this value (`write P OFF LEN 0xaa`; default 0xcd).
    Byte(u8),
    /// Written once at the offset; its length is the write length.
    Text(Vec<u8>),
    /// A deterministic pseudo-random stream seeded by the value.
    Random(u64),
}

/// Whether a `writefiles` step syncs each file after writing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// No sync: the files reach the disk by writeback and commits alone.
    None,
    /// fsync each file.
    Fsync,
    /// fdatasync each file.
    Fdatasync,
}

/// The kind of special file `mknod` (or `mkfifo`) makes; created with
/// mode 0644.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A named pipe.
    Fifo,
    /// A character device (major, minor).
    Chr(u32, u32),
    /// A block device (major, minor).
    Blk(u32, u32),
}

pub use crate::fs::{SYNC_RANGE_WAIT_AFTER, SYNC_RANGE_WAIT_BEFORE, SYNC_RANGE_WRITE};

/// One step of a script: an operation on the filesystem (or, for
/// `crash`, `remount` and `set`, on the session). A path is relative to
/// the filesystem root; steps that take a file also accept the name a
/// held descriptor was given by `open-fd` or `tmpfile`.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// `mkdir P`: make a directory.
    Mkdir(String),
    /// `create P`: make an empty regular file (open O_CREAT, mode 0644, close).
    Create(String),
    /// Buffered pwrite; with `enospc_ok` running out of space ends the
    /// write quietly.
    Write {
        /// File to write; created (mode 0644) if missing.
        path: String,
        /// Byte offset of the first byte written.
        off: u64,
        /// Bytes to write (a text fill's own length).
        len: u64,
        /// What the bytes are.
        fill: Fill,
        /// Running out of space (ENOSPC) ends the write without failing the
        /// script.
        enospc_ok: bool,
    },
    /// O_DIRECT writes of `chunk` bytes each.
    Dwrite {
        /// File to write; created (mode 0644) if missing.
        path: String,
        /// Byte offset of the first byte written.
        off: u64,
        /// Bytes to write in all.
        len: u64,
        /// Fill byte of every byte written.
        byte: u8,
        /// Bytes per pwrite (default: `len`, at most 1 MiB); never 0 when `len`
        /// is not.
        chunk: u64,
    },
    /// Buffered pwrite on a descriptor opened O_SYNC (or O_DSYNC with
    /// `datasync`): every write of at most 1 MiB is durable when it returns.
    Swrite {
        /// File to write; created (mode 0644) if missing.
        path: String,
        /// Byte offset of the first byte written.
        off: u64,
        /// Bytes to write in all.
        len: u64,
        /// Fill byte of every byte written.
        byte: u8,
        /// O_DSYNC (`dsync`) rather than O_SYNC (`sync`, the default).
        datasync: bool,
    },
    /// Stores through a shared mapping, nothing synced.
    Mwrite {
        /// File to map; it must exist.
        path: String,
        /// Byte offset of the first byte stored.
        off: u64,
        /// Bytes to store.
        len: u64,
        /// Fill byte of every byte stored.
        byte: u8,
    },
    /// msync(MS_SYNC) of a range (the whole file without one).
    Msync {
        /// File to sync.
        path: String,
        /// (offset, length) in bytes; None = from 0 to the file size.
        range: Option<(u64, u64)>,
    },
    /// `sync-range P OFF LEN FLAGS`: sync_file_range(2) of a range.
    SyncRange {
        /// File to sync.
        path: String,
        /// Byte offset of the range.
        off: u64,
        /// Length of the range in bytes (0: to the end of the file).
        len: u64,
        /// `SYNC_RANGE_WAIT_BEFORE`, `SYNC_RANGE_WRITE` and `SYNC_RANGE_WAIT_AFTER`
        /// (1, 2, 4 as in the kernel), from `wait_before|write|wait_after`.
        flags: u32,
    },
    /// `truncate P SIZE`: set the file size to SIZE bytes.
    Truncate(String, u64),
    /// fallocate(2) mode 0 or KEEP_SIZE; with `enospc_ok`, ENOSPC is an
    /// outcome, not a failure of the script.
    Fallocate {
        /// File; created if missing (as fallocate(1) does).
        path: String,
        /// Byte offset of the range.
        off: u64,
        /// Length of the range in bytes.
        len: u64,
        /// FALLOC_FL_KEEP_SIZE (`keep`): i_size does not grow.
        keep: bool,
        /// ENOSPC (`enospc-ok`) does not fail the script.
        enospc_ok: bool,
    },
    /// `punch P OFF LEN`: FALLOC_FL_PUNCH_HOLE (the size is kept).
    Punch {
        /// File; created if missing (as fallocate(1) does).
        path: String,
        /// Byte offset of the hole.
        off: u64,
        /// Length of the hole in bytes.
        len: u64,
    },
    /// `zero-range P OFF LEN [keep]`: FALLOC_FL_ZERO_RANGE.
    ZeroRange {
        /// File; created if missing (as fallocate(1) does).
        path: String,
        /// Byte offset of the range.
        off: u64,
        /// Length of the range in bytes.
        len: u64,
        /// FALLOC_FL_KEEP_SIZE (`keep`): i_size does not grow.
        keep: bool,
    },
    /// `collapse P OFF LEN`: FALLOC_FL_COLLAPSE_RANGE, which Btrfs does not
    /// support: the step fails with EOPNOTSUPP, on the kernel as here.
    Collapse {
        /// File; created if missing (as fallocate(1) does).
        path: String,
        /// Byte offset of the range removed.
        off: u64,
        /// Length of the range removed, in bytes.
        len: u64,
    },
    /// FICLONERANGE; `len` 0 clones to the end of the source.
    Clone {
        /// Source file; it must exist.
        src: String,
        /// Byte offset in the source.
        src_off: u64,
        /// Destination file; created (mode 0644) if missing.
        dst: String,
        /// Byte offset in the destination.
        dst_off: u64,
        /// Bytes to clone; 0 = to the end of the source.
        len: u64,
    },
    /// `link OLD NEW`: a new hard link NEW to OLD (OLD not followed).
    Link(String, String),
    /// `symlink TARGET P`: a symbolic link P to TARGET.
    Symlink {
        /// The link's content, stored as written (not resolved).
        target: String,
        /// Path of the new link.
        path: String,
    },
    /// `rename OLD NEW`: rename(2), replacing NEW if it exists.
    Rename(String, String),
    /// `exchange A B`: renameat2(2) with RENAME_EXCHANGE: the two names
    /// trade their inodes (both must exist; any types).
    Exchange(String, String),
    /// `unlink P`: remove a non-directory name.
    Unlink(String),
    /// `rmdir P`: remove an empty directory.
    Rmdir(String),
    /// `setxattr P NAME VALUE`: set an extended attribute (symlinks not
    /// followed).
    SetXattr {
        /// Inode to change.
        path: String,
        /// Full attribute name, namespace included (`user.k`).
        name: String,
        /// Value bytes (a quoted string may hold any byte).
        value: Vec<u8>,
    },
    /// `removexattr P NAME`: remove an extended attribute (symlinks not
    /// followed).
    RemoveXattr {
        /// Inode to change.
        path: String,
        /// Full attribute name, namespace included.
        name: String,
    },
    /// `fsync P`: fsync(2): a log sync, or a transaction commit when the
    /// inode cannot be logged.
    Fsync(String),
    /// `fdatasync P`: fdatasync(2).
    Fdatasync(String),
    /// `sync`: commit the transaction (`btrfs filesystem sync` on the kernel).
    Sync,
    /// `chmod P OCTAL`: set the permission and set-id bits (at most 07777).
    Chmod(String, u32),
    /// `chown P UID GID`: set the owner (lchown: symlinks not followed).
    Chown(String, u32, u32),
    /// Create if missing, then set the times to now.
    Touch(String),
    /// `mknod P KIND` (or `mkfifo P`): make a special file, mode 0644.
    Mknod(String, NodeKind),
    /// An O_TMPFILE in the root directory, held open under the handle name.
    Tmpfile(String),
    /// `open-fd P`: open P and hold the descriptor under the name P until
    /// `close-fd P`; steps naming P use it (even after P is renamed or unlinked).
    OpenFd(String),
    /// `close-fd P`: close the descriptor held under the name P.
    CloseFd(String),
    /// `evict`: drop clean caches as `echo 2 > /proc/sys/vm/drop_caches`
    /// (unused inodes and clean tree blocks; dirty and open ones stay).
    Evict,
    /// Seconds (the engine moves its clock; the kernel sleeps).
    Sleep(f64),
    /// `remount`: close every held descriptor, unmount (a commit) and mount
    /// again.
    Remount,
    /// `subvol-create P`: make a subvolume (commits).
    SubvolCreate(String),
    /// `snapshot SRC DST`: snapshot subvolume SRC as DST (commits).
    Snapshot(String, String),
    /// `subvol-delete P`: delete a subvolume (commits).
    SubvolDelete(String),
    /// `subvol-set-default P`: make P's subvolume the default one.
    SubvolSetDefault(String),
    /// `quota-enable`: enable quota groups (commits).
    QuotaEnable,
    /// `balance-metadata`: `btrfs balance start -m`, relocating every
    /// metadata and system block group (commits).
    BalanceMetadata,
    /// `balance ARGS...`: `btrfs balance start ARGS` (`-d`, `-m`,
    /// `-dconvert=raid1`, `-dusage=50`...), relocating the block groups the
    /// filters choose (commits).
    Balance(Vec<String>),
    /// Create `count` files `dir/fNNNNN` with distinct content, sizes spread
    /// over `min..=max`, each synced after it is written when asked.
    WriteFiles {
        /// Directory the files go in; it must exist.
        dir: String,
        /// Number of files, named `f00000`, `f00001`...
        count: u32,
        /// Smallest file size in bytes.
        min: u64,
        /// Largest file size in bytes (at least `min`).
        max: u64,
        /// Sync done after each file is written.
        sync: SyncKind,
    },
    /// Power failure; with `keep_random` a random subset of the unflushed
    /// writes (seeded) survives too.
    Crash {
        /// Seed of the random subset of unflushed writes that survives
        /// (`--keep-random SEED`); None: only flushed writes survive.
        keep_random: Option<u64>,
    },
    // Inspection and engine control (btrkit-shell).
    /// `read P [OFF [LEN]]`: print file bytes (text when printable, else a
    /// hex dump).
    Read {
        /// File to read.
        path: String,
        /// Byte offset of the first byte (default 0).
        off: u64,
        /// Bytes to read; None = to the end of the file.
        len: Option<u64>,
    },
    /// `ls [P]`: list a directory (default `/`), one line per entry: inode,
    /// mode, link count, size, name.
    Ls(String),
    /// `stat P`: print an inode's attributes (symlinks not followed).
    Stat(String),
    /// `stats [--json]`: print the engine's counters.
    Stats {
        /// One line of JSON instead of a table.
        json: bool,
    },
    /// `set NAME on|off`: switch an engine optimization (`fast-fsync-skip`,
    /// `log-conflicting-inodes`, `sync-io-first`).
    Set {
        /// Switch name.
        name: String,
        /// On or off.
        on: bool,
    },
}

impl Step {
    /// The verb as written in a script.
    pub fn verb(&self) -> &'static str {
        use Step::*;
        match self {
            Mkdir(_) => "mkdir",
            Create(_) => "create",
            Write { .. } => "write",
            Dwrite { .. } => "dwrite",
            Swrite { .. } => "swrite",
            Mwrite { .. } => "mwrite",
            Msync { .. } => "msync",
            SyncRange { .. } => "sync-range",
            Truncate(..) => "truncate",
            Fallocate { .. } => "fallocate",
            Punch { .. } => "punch",
            ZeroRange { .. } => "zero-range",
            Collapse { .. } => "collapse",
            Clone { .. } => "clone",
            Link(..) => "link",
            Symlink { .. } => "symlink",
            Rename(..) => "rename",
            Exchange(..) => "exchange",
            Unlink(_) => "unlink",
            Rmdir(_) => "rmdir",
            SetXattr { .. } => "setxattr",
            RemoveXattr { .. } => "removexattr",
            Fsync(_) => "fsync",
            Fdatasync(_) => "fdatasync",
            Sync => "sync",
            Chmod(..) => "chmod",
            Chown(..) => "chown",
            Touch(_) => "touch",
            Mknod(..) => "mknod",
            Tmpfile(_) => "tmpfile",
            OpenFd(_) => "open-fd",
            CloseFd(_) => "close-fd",
            Evict => "evict",
            Sleep(_) => "sleep",
            Remount => "remount",
            SubvolCreate(_) => "subvol-create",
            Snapshot(..) => "snapshot",
            SubvolDelete(_) => "subvol-delete",
            SubvolSetDefault(_) => "subvol-set-default",
            QuotaEnable => "quota-enable",
            BalanceMetadata => "balance-metadata",
            Balance(_) => "balance",
            WriteFiles { .. } => "writefiles",
            Crash { .. } => "crash",
            Read { .. } => "read",
            Ls(_) => "ls",
            Stat(_) => "stat",
            Stats { .. } => "stats",
            Set { .. } => "set",
        }
    }

    /// Whether the step may leave something that only a log sync made
    /// durable (the filesystem may still commit instead).
    pub fn logs(&self) -> bool {
        use Step::*;
        match self {
            Fsync(_) | Fdatasync(_) | Msync { .. } | Swrite { .. } => true,
            SyncRange { flags, .. } => flags & SYNC_RANGE_WAIT_AFTER != 0,
            WriteFiles { sync, .. } => *sync != SyncKind::None,
            _ => false,
        }
    }

    /// Whether the step commits the transaction, which empties the log.
    pub fn commits(&self) -> bool {
        use Step::*;
        matches!(
            self,
            Sync | Snapshot(..)
                | SubvolCreate(_)
                | SubvolDelete(_)
                | QuotaEnable
                | BalanceMetadata
                | Balance(_)
                | Remount
        )
    }

    /// The step is a `crash` (a power failure).
    pub fn is_crash(&self) -> bool {
        matches!(self, Step::Crash { .. })
    }

    /// Steps that only look (the shell's read, ls, stat, stats).
    pub fn is_inspection(&self) -> bool {
        matches!(
            self,
            Step::Read { .. } | Step::Ls(..) | Step::Stat(..) | Step::Stats { .. }
        )
    }
}

/// A regular-file extent map kind in `expect alloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    /// Written data (FIEMAP extents not flagged unwritten; dirty delalloc
    /// data counts too).
    Data,
    /// Preallocated and never written (FIEMAP_EXTENT_UNWRITTEN).
    Unwritten,
    /// No extent at all.
    Hole,
    /// Data or unwritten.
    Extent,
}

/// One `expect` line: a property of the filesystem checked after the run
/// (after the final crash and recovery when the script has one). Paths
/// are normalized to start with `/`; symlinks are never followed.
#[derive(Clone, Debug, PartialEq)]
pub enum Expect {
    /// `expect exists P`: the path exists.
    Exists(String),
    /// `expect absent P`: the path does not exist.
    Absent(String),
    /// `expect size P N`: `st_size` is N bytes.
    Size(String, u64),
    /// `expect md5 P HEX`: a regular file whose content has this MD5 (stored
    /// as 32 lowercase hex digits).
    Md5(String, String),
    /// `expect nlink P N`: the link count is N.
    Nlink(String, u64),
    /// Exact set of names in a directory (sorted).
    Entries(String, Vec<String>),
    /// `expect xattr P NAME VALUE`: the `user.*` attribute NAME holds exactly
    /// VALUE.
    Xattr(String, String, Vec<u8>),
    /// `expect noxattr P NAME`: the `user.*` attribute NAME is absent.
    NoXattr(String, String),
    /// Exact set of `user.*` xattr names (sorted).
    XattrNames(String, Vec<String>),
    /// `expect target P T`: a symlink whose target is T.
    Target(String, String),
    /// `f` file, `d` dir, `l` symlink, `p` fifo, `c` chr, `b` blk, `s` sock.
    Type(String, char),
    /// `expect mode P OCTAL`: the permission and set-id bits (07777) are
    /// exactly these.
    Mode(String, u32),
    /// `expect alloc P [A,B)=KIND ...`: every byte range `[A, B)` of the
    /// file's extent map is all of that kind.
    Alloc(String, Vec<(u64, u64, AllocKind)>),
    /// `expect consistent`: the recovered image checks clean (btrfs check on
    /// the kernel side, the engine's checker here).
    Consistent,
    /// A step run on the recovered filesystem; it must succeed.
    Post(Step),
    /// Every byte of the file is this one.
    Fill(String, u8),
}

/// A parsed script.
#[derive(Clone, Debug)]
pub struct Script {
    /// Name the script is known by (usually its file name), for messages.
    pub name: String,
    /// The text as written (caches are keyed by it).
    pub text: String,
    /// Extra mkfs.btrfs arguments from every `mkfs` directive, in order.
    pub mkfs: Vec<String>,
    /// Image size in bytes (`fssize`; default [`DEFAULT_FSSIZE`]), of each
    /// device.
    pub fssize: u64,
    /// Devices the filesystem spans (`devices N`; default 1), each of
    /// `fssize` bytes, devids in order.
    pub devices: usize,
    /// Mount options from every `mount` directive, split at commas; see
    /// [`Script::mount_options`].
    pub mount: Vec<String>,
    /// `expect-log yes|no`; None when unsaid or `any`.
    pub expect_log: Option<bool>,
    /// `expect-log any`: the filesystem may commit or log.
    pub log_optional: bool,
    /// `warmup yes|no`; None when unsaid (each backend has its default).
    pub warmup: Option<bool>,
    /// Steps with their 1-based line numbers.
    pub steps: Vec<(usize, Step)>,
    /// Expectations with their 1-based line numbers, in script order.
    pub expects: Vec<(usize, Expect)>,
}

impl Script {
    /// The position in `steps` of the crash that ends the workload (only
    /// inspection follows it): the image is left as that power failure
    /// leaves it.
    pub fn final_crash(&self) -> Option<usize> {
        let i = self.steps.iter().rposition(|(_, s)| !s.is_inspection())?;
        self.steps[i].1.is_crash().then_some(i)
    }
}

/// A token of a script line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok<'a> {
    /// A bare word, borrowed from the line.
    Word(&'a str),
    /// A quoted string or `<N x 'C'>`, escapes decoded: any bytes.
    Quoted(Vec<u8>),
}

impl Tok<'_> {
    /// The token's bytes (a word's UTF-8, a quoted string's decoded bytes).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Tok::Word(w) => w.as_bytes().to_vec(),
            Tok::Quoted(b) => b.clone(),
        }
    }
    /// The token as an owned string (invalid UTF-8 replaced by U+FFFD).
    pub fn text(&self) -> String {
        self.str().into_owned()
    }
    /// The token as text, borrowed where it is already text.
    pub fn str(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Tok::Word(w) => std::borrow::Cow::Borrowed(w),
            Tok::Quoted(b) => String::from_utf8_lossy(b),
        }
    }
    fn is_word(&self, w: &str) -> bool {
        matches!(self, Tok::Word(x) if *x == w)
    }
}

/// Split a line into words and quoted strings.
pub fn tokenize(line: &str) -> Res<Vec<Tok<'_>>> {
    let b = line.as_bytes();
    let mut out = Vec::with_capacity(8);
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
                        match e {
                            b'n' => v.push(b'\n'),
                            b't' => v.push(b'\t'),
                            b'r' => v.push(b'\r'),
                            b'x' => {
                                let hex = line.get(i..i + 2).ok_or("short \\x escape")?;
                                i += 2;
                                v.push(
                                    u8::from_str_radix(hex, 16)
                                        .map_err(|_| format!("bad \\x escape {hex}"))?,
                                );
                            }
                            b'0'..=b'7' => {
                                // Up to three octal digits.
                                let mut val = (e - b'0') as u32;
                                let mut n = 1;
                                while n < 3 && matches!(b.get(i), Some(b'0'..=b'7')) {
                                    val = val * 8 + (b[i] - b'0') as u32;
                                    i += 1;
                                    n += 1;
                                }
                                v.push(u8::try_from(val).map_err(|_| "octal escape above \\377")?);
                            }
                            other => v.push(other),
                        }
                    }
                    Some(&ch) => {
                        v.push(ch);
                        i += 1;
                    }
                }
            }
            out.push(Tok::Quoted(v));
        } else if c == b'<' && line[i..].contains(" x '") {
            let end = line[i..].find("'>").ok_or("unterminated <N x 'C'>")? + i;
            let inner = &line[i + 1..end];
            let (n, ch) = inner.split_once(" x '").ok_or("bad <N x 'C'>")?;
            let n: usize = n
                .trim()
                .parse()
                .map_err(|_| format!("bad count in <{inner}'>"))?;
            if n > 1 << 24 {
                return Err(format!("<{n} x ...> is too long"));
            }
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
            out.push(Tok::Word(&line[start..i]));
        }
    }
    Ok(out)
}

/// A size or offset (the one rule of `util::size`: decimal or 0x hex, an
/// optional K/M/G/T/P/E suffix).
pub fn parse_num(s: &str) -> Res<u64> {
    crate::util::size::parse_size(s).map_err(|e| format!("bad number: {e}"))
}

fn parse_byte(s: &str) -> Res<u8> {
    u8::try_from(parse_num(s)?).map_err(|_| format!("{s} is not a byte"))
}

fn parse_fill(t: &Tok) -> Res<Fill> {
    match t {
        Tok::Quoted(b) => Ok(Fill::Text(b.clone())),
        Tok::Word(w) => match w.strip_prefix("random:") {
            Some(seed) => Ok(Fill::Random(parse_num(seed)?)),
            None => Ok(Fill::Byte(parse_byte(w)?)),
        },
    }
}

fn need(args: &[Tok], min: usize, max: usize, usage: &str) -> Res<()> {
    if args.len() < min || args.len() > max {
        return Err(format!("usage: {usage}"));
    }
    Ok(())
}

fn one<'a, 'b>(args: &'b [Tok<'a>]) -> Res<&'b Tok<'a>> {
    match args {
        [a] => Ok(a),
        _ => Err(format!("expected one argument, got {}", args.len())),
    }
}

/// `a/b`, `/a/b/` -> `/a/b`; the root is `/`.
pub fn norm(p: &str) -> String {
    let t = p.trim_matches('/');
    format!("/{t}")
}

/// How many steps [`Script::stream`] parses ahead of the one running.
pub const STREAM_AHEAD: usize = 512;

/// What stopped a streamed script: a line that does not parse, or the
/// caller's own error for a step.
#[derive(Debug)]
pub enum StreamError<E> {
    /// A line does not parse, or the script cannot be read.
    Parse(ParseError),
    /// The caller's `on_step` refused a step.
    Step {
        /// 1-based line of the step.
        line: usize,
        /// The caller's error.
        err: E,
    },
}

/// What one pass over a script learns of its steps without keeping them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepSummary {
    /// Steps seen.
    pub steps: usize,
    /// Some step is a `crash`; some `crash` keeps a random subset.
    pub crashes: bool,
    /// Some `crash` keeps a random subset (`--keep-random`).
    pub keep_random: bool,
    /// The line of the crash that ends the workload (see
    /// [`Script::final_crash`]).
    pub final_crash_line: Option<usize>,
}

impl StepSummary {
    /// Count one step at `line`.
    pub fn add(&mut self, line: usize, st: &Step) {
        self.steps += 1;
        if let Step::Crash { keep_random } = st {
            self.crashes = true;
            self.keep_random |= keep_random.is_some();
        }
        if !st.is_inspection() {
            self.final_crash_line = st.is_crash().then_some(line);
        }
    }
}

impl Script {
    /// A script without text or steps, to be filled a line at a time.
    fn empty(name: &str) -> Script {
        Script {
            name: name.to_string(),
            text: String::new(),
            mkfs: Vec::new(),
            fssize: DEFAULT_FSSIZE,
            devices: 1,
            mount: Vec::new(),
            expect_log: None,
            log_optional: false,
            warmup: None,
            steps: Vec::new(),
            expects: Vec::new(),
        }
    }

    /// Parse a script from `r` a line at a time, handing each step to
    /// `on_step` in order and keeping none: memory does not grow with the
    /// number of steps. The script returned holds the directives and
    /// expectations (no text, no steps). A step that `on_step` refuses
    /// stops the stream there; a line that does not parse stops it after
    /// the steps before it ran.
    ///
    /// Lines are read and parsed on a thread of their own, at most
    /// [`STREAM_AHEAD`] steps ahead of the one running, so that parsing
    /// a long script overlaps the work its steps do.
    pub fn stream<R: std::io::BufRead + Send, E>(
        name: &str,
        r: R,
        mut on_step: impl FnMut(usize, &Step) -> std::result::Result<(), E>,
    ) -> std::result::Result<Script, StreamError<E>> {
        Script::stream_prepared(name, r, |_| None, |n, st, _| on_step(n, st))
    }

    /// [`Script::stream`], with `prepare` run on the reading thread for each
    /// step as it is parsed, and what it made handed to `on_step` with the
    /// step (a write's bytes, made while the step before it runs).
    pub fn stream_prepared<R: std::io::BufRead + Send, E>(
        name: &str,
        r: R,
        prepare: impl Fn(&Step) -> Option<Vec<u8>> + Send,
        mut on_step: impl FnMut(usize, &Step, Option<&[u8]>) -> std::result::Result<(), E>,
    ) -> std::result::Result<Script, StreamError<E>> {
        type Batch = Vec<(usize, Step, Option<Vec<u8>>)>;
        enum Msg {
            Steps(Batch),
            Failed(ParseError),
        }
        const BATCH: usize = 64;
        std::thread::scope(|sc| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(STREAM_AHEAD / BATCH - 1);
            // Steps run go back to the reader, which made them: freed on
            // the thread that allocated them (a free from another thread
            // is the allocator's slow path), their batch's room reused.
            let (done_tx, done_rx) = std::sync::mpsc::channel::<Batch>();
            let reader = sc.spawn(move || {
                let mut r = r;
                let mut s = Script::empty(name);
                let mut line = String::new();
                let mut n = 0usize;
                let next_batch = || match done_rx.try_recv() {
                    Ok(mut b) => {
                        b.clear();
                        b
                    }
                    Err(_) => Vec::with_capacity(BATCH),
                };
                let mut batch = next_batch();
                let failed = loop {
                    line.clear();
                    let got = match r.read_line(&mut line) {
                        Ok(got) => got,
                        Err(e) => {
                            break Some(ParseError {
                                line: n + 1,
                                msg: format!("cannot read the script: {e}"),
                            })
                        }
                    };
                    if got == 0 {
                        break None;
                    }
                    n += 1;
                    let text = line.trim_end_matches(['\n', '\r']);
                    if let Err(msg) = s.parse_line(n, text) {
                        break Some(ParseError { line: n, msg });
                    }
                    batch.extend(s.steps.drain(..).map(|(ln, st)| {
                        let p = prepare(&st);
                        (ln, st, p)
                    }));
                    if batch.len() >= BATCH {
                        let full = std::mem::replace(&mut batch, next_batch());
                        if tx.send(Msg::Steps(full)).is_err() {
                            // The runner stopped: nothing more is wanted.
                            return s;
                        }
                    }
                };
                if !batch.is_empty() && tx.send(Msg::Steps(batch)).is_err() {
                    return s;
                }
                if let Some(e) = failed {
                    let _ = tx.send(Msg::Failed(e));
                }
                s
            });
            for msg in rx.iter() {
                match msg {
                    Msg::Steps(steps) => {
                        for (ln, st, p) in &steps {
                            on_step(*ln, st, p.as_deref())
                                .map_err(|err| StreamError::Step { line: *ln, err })?;
                        }
                        // The reader may be gone (it read the last line).
                        let _ = done_tx.send(steps);
                    }
                    Msg::Failed(e) => return Err(StreamError::Parse(e)),
                }
            }
            reader.join().map_err(|_| {
                StreamError::Parse(ParseError {
                    line: 0,
                    msg: "the script reader failed".into(),
                })
            })
        })
    }

    /// Parse a whole script held in memory, keeping its text and every step;
    /// the first line that does not parse is the error.
    pub fn parse(name: &str, text: &str) -> std::result::Result<Script, ParseError> {
        let mut s = Script::empty(name);
        s.text = text.to_string();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            s.parse_line(n, line)
                .map_err(|msg| ParseError { line: n, msg })?;
        }
        Ok(s)
    }

    /// Parse one line into this script (directives, steps, expectations).
    pub fn parse_line(&mut self, n: usize, line: &str) -> Res<()> {
        let toks = tokenize(line)?;
        let Some(first) = toks.first() else {
            return Ok(());
        };
        let Tok::Word(verb) = first else {
            return Err("a line starts with a verb".into());
        };
        if verb.starts_with('!') {
            return Ok(());
        }
        let args = &toks[1..];
        match *verb {
            "mkfs" => self.mkfs.extend(args.iter().map(Tok::text)),
            "fssize" => self.fssize = parse_num(&one(args)?.text())?,
            "devices" => {
                let n = parse_num(&one(args)?.text())?;
                if !(1..=MAX_DEVICES).contains(&n) {
                    return Err(format!("devices N: from 1 to {MAX_DEVICES}, not {n}"));
                }
                self.devices = n as usize;
            }
            "mount" => {
                for a in args {
                    self.mount.extend(
                        a.text()
                            .split(',')
                            .filter(|o| !o.is_empty())
                            .map(str::to_string),
                    );
                }
            }
            "warmup" => {
                self.warmup = Some(match one(args)?.text().as_str() {
                    "yes" => true,
                    "no" => false,
                    o => return Err(format!("warmup yes|no, not {o}")),
                })
            }
            "expect-log" => match one(args)?.text().as_str() {
                "yes" => self.expect_log = Some(true),
                "no" => self.expect_log = Some(false),
                "any" => self.log_optional = true,
                o => return Err(format!("expect-log yes|no|any, not {o}")),
            },
            "expect" => self.expects.push((n, parse_expect(args)?)),
            _ => self.steps.push((n, parse_step(verb, args)?)),
        }
        Ok(())
    }

    /// Mount options with `commit=600` unless the script sets its own
    /// interval (the kernel oracle's live mount).
    pub fn mount_options(&self) -> String {
        let mut o = self.mount.clone();
        if !o.iter().any(|x| x.starts_with("commit=")) {
            o.insert(0, "commit=600".into());
        }
        o.join(",")
    }

    /// Whether the final state must hold a log tree: by default when a step
    /// that syncs the log comes after the last commit (or intermediate
    /// crash, whose recovery commits) before the final crash.
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
            .rposition(|(_, s)| s.is_crash())
            .unwrap_or(self.steps.len());
        let mut pending = false;
        for (_, st) in &self.steps[..end] {
            if st.commits() || st.is_crash() {
                pending = false;
            } else if st.logs() {
                pending = true;
            }
        }
        pending
    }

    /// Steps before the final crash (all of them without one), and whether
    /// there was a final crash: what a differential run executes.
    pub fn steps_before_final_crash(&self) -> (&[(usize, Step)], bool) {
        match self.steps.iter().rposition(|(_, s)| s.is_crash()) {
            Some(i) => (&self.steps[..i], true),
            None => (&self.steps[..], false),
        }
    }
}

fn parse_step(verb: &str, a: &[Tok]) -> Res<Step> {
    let t = |i: usize| a[i].text();
    let num = |i: usize| parse_num(&a[i].str());
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
            need(
                a,
                3,
                5,
                "write P OFF LEN [BYTE|\"text\"|random:SEED] [enospc-ok]",
            )?;
            let mut rest: Vec<&Tok> = a[3..].iter().collect();
            let enospc_ok = rest.last().is_some_and(|x| x.is_word("enospc-ok"));
            if enospc_ok {
                rest.pop();
            }
            if rest.len() > 1 {
                return Err(
                    "usage: write P OFF LEN [BYTE|\"text\"|random:SEED] [enospc-ok]".into(),
                );
            }
            let fill = match rest.first() {
                Some(f) => parse_fill(f)?,
                None => Fill::Byte(DEFAULT_FILL),
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
                enospc_ok,
            }
        }
        "swrite" => {
            need(a, 3, 5, "swrite P OFF LEN [BYTE] [sync|dsync]")?;
            let mut rest: Vec<String> = a[3..].iter().map(|x| x.text()).collect();
            let datasync = match rest.last().map(String::as_str) {
                Some("dsync") => {
                    rest.pop();
                    true
                }
                Some("sync") => {
                    rest.pop();
                    false
                }
                _ => false,
            };
            let byte = match rest.as_slice() {
                [] => DEFAULT_FILL,
                [b] => u8::try_from(parse_num(b)?)
                    .map_err(|_| format!("swrite: fill byte {b} is not 0-255"))?,
                _ => return Err("usage: swrite P OFF LEN [BYTE] [sync|dsync]".into()),
            };
            Step::Swrite {
                path: t(0),
                off: num(1)?,
                len: num(2)?,
                byte,
                datasync,
            }
        }
        "dwrite" => {
            need(a, 3, 5, "dwrite P OFF LEN [BYTE] [CHUNK]")?;
            let len = num(2)?;
            let byte = if a.len() > 3 {
                parse_byte(&t(3))?
            } else {
                DEFAULT_FILL
            };
            let chunk = if a.len() > 4 {
                num(4)?
            } else {
                len.min(1 << 20)
            };
            if chunk == 0 && len > 0 {
                return Err("dwrite: CHUNK must not be 0".into());
            }
            Step::Dwrite {
                path: t(0),
                off: num(1)?,
                len,
                byte,
                chunk,
            }
        }
        "mwrite" => {
            need(a, 3, 4, "mwrite P OFF LEN [BYTE]")?;
            let byte = if a.len() > 3 {
                parse_byte(&t(3))?
            } else {
                DEFAULT_FILL
            };
            Step::Mwrite {
                path: t(0),
                off: num(1)?,
                len: num(2)?,
                byte,
            }
        }
        "msync" => {
            if a.len() != 1 && a.len() != 3 {
                return Err("usage: msync P [OFF LEN]".into());
            }
            let range = if a.len() == 3 {
                Some((num(1)?, num(2)?))
            } else {
                None
            };
            Step::Msync { path: t(0), range }
        }
        "sync-range" => {
            need(a, 4, 4, "sync-range P OFF LEN wait_before|write|wait_after")?;
            let mut flags = 0;
            for f in t(3).split('|') {
                flags |= match f {
                    "wait_before" => SYNC_RANGE_WAIT_BEFORE,
                    "write" => SYNC_RANGE_WRITE,
                    "wait_after" => SYNC_RANGE_WAIT_AFTER,
                    o => return Err(format!("sync-range: unknown flag {o}")),
                };
            }
            Step::SyncRange {
                path: t(0),
                off: num(1)?,
                len: num(2)?,
                flags,
            }
        }
        "truncate" => {
            need(a, 2, 2, "truncate P SIZE")?;
            Step::Truncate(t(0), num(1)?)
        }
        "fallocate" | "zero-range" => {
            let usage = if verb == "fallocate" {
                "fallocate P OFF LEN [keep] [enospc-ok]"
            } else {
                "zero-range P OFF LEN [keep]"
            };
            need(a, 3, if verb == "fallocate" { 5 } else { 4 }, usage)?;
            let (mut keep, mut enospc_ok) = (false, false);
            for flag in a[3..].iter().map(Tok::text) {
                match flag.as_str() {
                    "keep" if !keep => keep = true,
                    "enospc-ok" if verb == "fallocate" && !enospc_ok => enospc_ok = true,
                    o => return Err(format!("{verb}: unknown or repeated flag {o} ({usage})")),
                }
            }
            let (path, off, len) = (t(0), num(1)?, num(2)?);
            if verb == "fallocate" {
                Step::Fallocate {
                    path,
                    off,
                    len,
                    keep,
                    enospc_ok,
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
        "collapse" => {
            need(a, 3, 3, "collapse P OFF LEN")?;
            Step::Collapse {
                path: t(0),
                off: num(1)?,
                len: num(2)?,
            }
        }
        "clone" => {
            need(a, 5, 5, "clone SRC SRCOFF DST DSTOFF LEN")?;
            Step::Clone {
                src: t(0),
                src_off: num(1)?,
                dst: t(2),
                dst_off: num(3)?,
                len: num(4)?,
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
        "exchange" => {
            need(a, 2, 2, "exchange A B")?;
            Step::Exchange(t(0), t(1))
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
        "chmod" => {
            need(a, 2, 2, "chmod P OCTAL")?;
            let m = u32::from_str_radix(&t(1), 8).map_err(|_| format!("bad mode {}", t(1)))?;
            if m > 0o7777 {
                return Err(format!("mode {} has bits beyond 07777", t(1)));
            }
            Step::Chmod(t(0), m)
        }
        "chown" => {
            need(a, 3, 3, "chown P UID GID")?;
            let id = |i: usize| -> Res<u32> {
                u32::try_from(num(i)?).map_err(|_| "id out of range".to_string())
            };
            Step::Chown(t(0), id(1)?, id(2)?)
        }
        "touch" => {
            need(a, 1, 1, "touch P")?;
            Step::Touch(t(0))
        }
        "mkfifo" => {
            need(a, 1, 1, "mkfifo P")?;
            Step::Mknod(t(0), NodeKind::Fifo)
        }
        "mknod" => {
            need(a, 2, 4, "mknod P fifo | mknod P chr|blk MAJ MIN")?;
            let dev = |what: &str| -> Res<(u32, u32)> {
                if a.len() != 4 {
                    return Err(format!("usage: mknod P {what} MAJ MIN"));
                }
                let n = |i: usize| -> Res<u32> {
                    u32::try_from(num(i)?).map_err(|_| "device number out of range".to_string())
                };
                Ok((n(2)?, n(3)?))
            };
            let kind = match t(1).as_str() {
                "fifo" if a.len() == 2 => NodeKind::Fifo,
                "chr" => {
                    let (x, y) = dev("chr")?;
                    NodeKind::Chr(x, y)
                }
                "blk" => {
                    let (x, y) = dev("blk")?;
                    NodeKind::Blk(x, y)
                }
                o => return Err(format!("mknod: unknown type {o}")),
            };
            Step::Mknod(t(0), kind)
        }
        "tmpfile" => {
            need(a, 1, 1, "tmpfile H")?;
            Step::Tmpfile(t(0))
        }
        "open-fd" => {
            need(a, 1, 1, "open-fd P")?;
            Step::OpenFd(t(0))
        }
        "close-fd" => {
            need(a, 1, 1, "close-fd P")?;
            Step::CloseFd(t(0))
        }
        "evict" => {
            need(a, 0, 0, "evict")?;
            Step::Evict
        }
        "sleep" => {
            need(a, 1, 1, "sleep SECONDS")?;
            let s: f64 = t(0).parse().map_err(|_| format!("bad seconds {}", t(0)))?;
            if !(0.0..=1e9).contains(&s) {
                return Err(format!("sleep {s}: out of range"));
            }
            Step::Sleep(s)
        }
        "remount" => {
            need(a, 0, 0, "remount")?;
            Step::Remount
        }
        "subvol-create" => {
            need(a, 1, 1, "subvol-create P")?;
            Step::SubvolCreate(t(0))
        }
        "snapshot" => {
            need(a, 2, 2, "snapshot SRC DST")?;
            Step::Snapshot(t(0), t(1))
        }
        "subvol-delete" => {
            need(a, 1, 1, "subvol-delete P")?;
            Step::SubvolDelete(t(0))
        }
        "subvol-set-default" => {
            need(a, 1, 1, "subvol-set-default P")?;
            Step::SubvolSetDefault(t(0))
        }
        "quota-enable" => {
            need(a, 0, 0, "quota-enable")?;
            Step::QuotaEnable
        }
        "balance-metadata" => {
            need(a, 0, 0, "balance-metadata")?;
            Step::BalanceMetadata
        }
        "balance" => {
            // Checked now, so a script with bad filters fails to parse.
            let words: Vec<String> = a.iter().map(Tok::text).collect();
            crate::balance::parse_args(&words)
                .and_then(|r| r.normalize())
                .map_err(|e| format!("balance: {e}"))?;
            Step::Balance(words)
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
        "crash" => match a {
            [] => Step::Crash { keep_random: None },
            [f, s] if f.text() == "--keep-random" => Step::Crash {
                keep_random: Some(parse_num(&s.text())?),
            },
            _ => return Err("usage: crash [--keep-random SEED]".into()),
        },
        "read" => {
            need(a, 1, 3, "read P [OFF [LEN]]")?;
            let off = if a.len() > 1 { num(1)? } else { 0 };
            let len = if a.len() > 2 { Some(num(2)?) } else { None };
            Step::Read {
                path: t(0),
                off,
                len,
            }
        }
        "ls" => {
            need(a, 0, 1, "ls [P]")?;
            Step::Ls(if a.is_empty() { "/".into() } else { t(0) })
        }
        "stat" => {
            need(a, 1, 1, "stat P")?;
            Step::Stat(t(0))
        }
        "stats" => match a {
            [] => Step::Stats { json: false },
            [f] if f.text() == "--json" => Step::Stats { json: true },
            _ => return Err("usage: stats [--json]".into()),
        },
        "set" => {
            need(a, 2, 2, "set NAME on|off")?;
            let on = match t(1).as_str() {
                "on" => true,
                "off" => false,
                o => return Err(format!("set {}: on or off, not {o}", t(0))),
            };
            Step::Set { name: t(0), on }
        }
        other => return Err(format!("unknown verb {other:?}")),
    })
}

fn parse_kind(s: &str) -> Res<char> {
    Ok(match s {
        "file" => 'f',
        "dir" => 'd',
        "symlink" => 'l',
        "fifo" => 'p',
        "chr" => 'c',
        "blk" => 'b',
        "sock" => 's',
        o => return Err(format!("unknown type {o}")),
    })
}

fn parse_alloc_range(s: &str) -> Res<(u64, u64, AllocKind)> {
    let bad = || format!("bad range {s:?}, want [A,B)=data|unwritten|hole|extent");
    let rest = s.strip_prefix('[').ok_or_else(bad)?;
    let (range, kind) = rest.split_once(")=").ok_or_else(bad)?;
    let (a, b) = range.split_once(',').ok_or_else(bad)?;
    let (a, b) = (parse_num(a)?, parse_num(b)?);
    if a >= b {
        return Err(format!("empty range {s:?}"));
    }
    let k = match kind {
        "data" => AllocKind::Data,
        "unwritten" => AllocKind::Unwritten,
        "hole" => AllocKind::Hole,
        "extent" => AllocKind::Extent,
        _ => return Err(bad()),
    };
    Ok((a, b, k))
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
        "md5" => {
            need(a, 2, 2, "expect md5 P HEX")?;
            let h = t(1).to_ascii_lowercase();
            if h.len() != 32 || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!("bad md5 {h}"));
            }
            Expect::Md5(norm(&t(0)), h)
        }
        "nlink" => {
            need(a, 2, 2, "expect nlink P N")?;
            Expect::Nlink(norm(&t(0)), parse_num(&t(1))?)
        }
        "entries" => {
            need(a, 1, usize::MAX, "expect entries DIR [NAME...]")?;
            let mut names: Vec<String> = a[1..].iter().map(Tok::text).collect();
            names.sort();
            Expect::Entries(norm(&t(0)), names)
        }
        "xattr" => {
            need(a, 3, 3, "expect xattr P NAME VALUE")?;
            Expect::Xattr(norm(&t(0)), t(1), a[2].bytes())
        }
        "noxattr" => {
            need(a, 2, 2, "expect noxattr P NAME")?;
            Expect::NoXattr(norm(&t(0)), t(1))
        }
        "xattrnames" => {
            need(a, 1, usize::MAX, "expect xattrnames P [NAME...]")?;
            let mut names: Vec<String> = a[1..].iter().map(Tok::text).collect();
            names.sort();
            Expect::XattrNames(norm(&t(0)), names)
        }
        "target" => {
            need(a, 2, 2, "expect target P T")?;
            Expect::Target(norm(&t(0)), t(1))
        }
        "type" => {
            need(a, 2, 2, "expect type P file|dir|symlink|fifo|chr|blk|sock")?;
            Expect::Type(norm(&t(0)), parse_kind(&t(1))?)
        }
        "mode" => {
            need(a, 2, 2, "expect mode P OCTAL")?;
            Expect::Mode(
                norm(&t(0)),
                u32::from_str_radix(&t(1), 8).map_err(|_| format!("bad mode {}", t(1)))?,
            )
        }
        "alloc" => {
            need(a, 2, usize::MAX, "expect alloc P [A,B)=KIND ...")?;
            let ranges = a[1..]
                .iter()
                .map(|x| parse_alloc_range(&x.text()))
                .collect::<Res<Vec<_>>>()?;
            Expect::Alloc(norm(&t(0)), ranges)
        }
        "consistent" => {
            need(a, 0, 0, "expect consistent")?;
            Expect::Consistent
        }
        "post" => {
            let Some(Tok::Word(verb)) = a.first() else {
                return Err("usage: expect post STEP...".into());
            };
            let st = parse_step(verb, &a[1..])?;
            if st.is_crash() {
                return Err("expect post: a post step cannot crash".into());
            }
            Expect::Post(st)
        }
        "fill" => {
            need(a, 2, 2, "expect fill P BYTE")?;
            Expect::Fill(norm(&t(0)), parse_byte(&t(1))?)
        }
        o => return Err(format!("unknown expectation {o:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let text = "# comment\nmkfs -n 4096 -O ^no-holes\nmount compress=zstd\nfssize 1G\n\
            mkdir /a\nwrite /a/f 0 64K 0xaa\nwrite /a/g 10 0 \"hi\\n\\x41\\101\"\nsetxattr /a/f user.k <3 x 'z'>\n\
            writefiles /a 10 100-4000 fsync\nfsync /a/f # trailing\ndwrite /a/d 0 1M 7 4K\nmwrite /a/d 4096 100\n\
            msync /a/d\nmsync /a/d 0 4096\nsync-range /a/d 0 8K write|wait_after\ncollapse /a/d 0 4096\n\
            clone /a/f 0 /a/g 8192 0\nmknod /a/c chr 1 3\nmkfifo /a/p\ntmpfile h\nopen-fd /a/f\nclose-fd /a/f\n\
            sleep 0.5\nremount\nsubvol-delete /s\nsubvol-set-default /s\nquota-enable\nbalance-metadata\ntouch /a/t\n\
            write /a/x 0 1G 0 enospc-ok\n!ignored line\ncrash --keep-random 7\nexpect size /a/f 64K\n\
            expect entries /a f g\nexpect alloc /a/f [0,4096)=data [4096,8192)=hole\nexpect post unlink /a/f\n\
            expect md5 /a/f 0123456789abcdef0123456789ABCDEF\nexpect type /a/c chr\nexpect consistent\n";
        let s = Script::parse("t", text).unwrap();
        assert_eq!(s.mkfs, ["-n", "4096", "-O", "^no-holes"]);
        assert_eq!(s.mount_options(), "commit=600,compress=zstd");
        assert_eq!(s.fssize, 1 << 30);
        assert_eq!(s.devices, 1);
        let set = Script::parse("set", "devices 3\nmkfs -m raid1c3 -d raid0\n").unwrap();
        assert_eq!((set.devices, set.mkfs.len()), (3, 4));
        for bad in [
            "devices 0",
            "devices 17",
            "devices",
            "devices 2 3",
            "devices x",
        ] {
            assert!(Script::parse("bad", bad).is_err(), "{bad}");
        }
        let st: Vec<&Step> = s.steps.iter().map(|(_, x)| x).collect();
        assert_eq!(
            *st[2],
            Step::Write {
                path: "/a/g".into(),
                off: 10,
                len: 5,
                fill: Fill::Text(b"hi\nAA".to_vec()),
                enospc_ok: false
            }
        );
        assert_eq!(
            *st[3],
            Step::SetXattr {
                path: "/a/f".into(),
                name: "user.k".into(),
                value: b"zzz".to_vec()
            }
        );
        assert_eq!(
            *st[4],
            Step::WriteFiles {
                dir: "/a".into(),
                count: 10,
                min: 100,
                max: 4000,
                sync: SyncKind::Fsync
            }
        );
        assert_eq!(
            *st[6],
            Step::Dwrite {
                path: "/a/d".into(),
                off: 0,
                len: 1 << 20,
                byte: 7,
                chunk: 4096
            }
        );
        assert_eq!(
            *st[9],
            Step::Msync {
                path: "/a/d".into(),
                range: Some((0, 4096))
            }
        );
        assert_eq!(
            *st[10],
            Step::SyncRange {
                path: "/a/d".into(),
                off: 0,
                len: 8192,
                flags: SYNC_RANGE_WRITE | SYNC_RANGE_WAIT_AFTER
            }
        );
        assert_eq!(
            *st[12],
            Step::Clone {
                src: "/a/f".into(),
                src_off: 0,
                dst: "/a/g".into(),
                dst_off: 8192,
                len: 0
            }
        );
        assert_eq!(*st[13], Step::Mknod("/a/c".into(), NodeKind::Chr(1, 3)));
        assert_eq!(*st[14], Step::Mknod("/a/p".into(), NodeKind::Fifo));
        assert_eq!(*st[18], Step::Sleep(0.5));
        assert!(matches!(
            st[25],
            Step::Write {
                enospc_ok: true,
                fill: Fill::Byte(0),
                ..
            }
        ));
        assert_eq!(
            *st[26],
            Step::Crash {
                keep_random: Some(7)
            }
        );
        assert_eq!(
            s.expects[1].1,
            Expect::Entries("/a".into(), vec!["f".into(), "g".into()])
        );
        assert_eq!(
            s.expects[2].1,
            Expect::Alloc(
                "/a/f".into(),
                vec![(0, 4096, AllocKind::Data), (4096, 8192, AllocKind::Hole)]
            )
        );
        assert_eq!(s.expects[3].1, Expect::Post(Step::Unlink("/a/f".into())));
        assert_eq!(
            s.expects[4].1,
            Expect::Md5("/a/f".into(), "0123456789abcdef0123456789abcdef".into())
        );
        assert_eq!(s.expects[5].1, Expect::Type("/a/c".into(), 'c'));
        // Line numbers are kept.
        assert_eq!(s.steps[0].0, 5);
    }

    #[test]
    fn refuses_bad_lines_with_their_line() {
        for (text, line) in [
            ("bogus x", 1),
            ("mkdir a\nwrite f 0", 2),
            ("write f 0 1 300", 1),
            ("chmod f 9", 1),
            ("crash now", 1),
            ("set x maybe", 1),
            ("expect alloc f [5,1)=data", 1),
            ("\"x\" y", 1),
            ("write f 0 1 \"abc", 1),
        ] {
            let e = Script::parse("t", text).unwrap_err();
            assert_eq!(e.line, line, "{text}: {e}");
        }
    }

    #[test]
    fn log_expectation() {
        assert!(Script::parse("t", "write f 0 1\nfsync f\ncrash")
            .unwrap()
            .wants_log());
        assert!(!Script::parse("t", "write f 0 1\nfsync f\nsync\ncrash")
            .unwrap()
            .wants_log());
        assert!(
            !Script::parse("t", "expect-log any\nwrite f 0 1\nfsync f\ncrash")
                .unwrap()
                .wants_log()
        );
        let s = Script::parse("t", "mount commit=5 compress-force=lzo").unwrap();
        assert_eq!(s.mount_options(), "commit=5,compress-force=lzo");
    }

    #[test]
    fn stream_hands_steps_over_a_bounded_distance_behind_the_reader() {
        let text = "fssize 300M\nwrite /f 0 4K\n\n# note\nfsync /f\r\nexpect size /f 4K\ncrash\nmkfs -n 4096\n";
        let parsed = Script::parse("t", text).unwrap();
        // A reader that counts the lines handed out: a step must come
        // before the reader is more than a bounded number of lines ahead,
        // however long the script.
        struct Counting<'a> {
            lines: std::str::Lines<'a>,
            read: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        }
        impl std::io::Read for Counting<'_> {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                unreachable!("read through BufRead only")
            }
        }
        impl std::io::BufRead for Counting<'_> {
            fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
                unreachable!("read_line only")
            }
            fn consume(&mut self, _: usize) {}
            fn read_line(&mut self, buf: &mut String) -> std::io::Result<usize> {
                match self.lines.next() {
                    None => Ok(0),
                    Some(l) => {
                        self.read.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        buf.push_str(l);
                        buf.push('\n');
                        Ok(l.len() + 1)
                    }
                }
            }
        }
        let long = "sync\n".repeat(20 * STREAM_AHEAD);
        let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = Counting {
            lines: long.lines(),
            read: read.clone(),
        };
        let mut seen = 0;
        let mut lead = 0;
        Script::stream("t", r, |line, _| {
            seen += 1;
            assert_eq!(line, seen);
            let ahead = read.load(std::sync::atomic::Ordering::SeqCst) - line;
            lead = lead.max(ahead);
            assert!(
                ahead <= 2 * STREAM_AHEAD,
                "reader {ahead} lines ahead at {line}"
            );
            // A slow runner: the reader has every chance to run away.
            if line % 1000 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(seen, 20 * STREAM_AHEAD);
        assert!(lead > 0, "the reader parses ahead");

        let r = Counting {
            lines: text.lines(),
            read: read.clone(),
        };
        let mut got = Vec::new();
        let s = Script::stream("t", r, |line, st| {
            got.push((line, st.clone()));
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(got, parsed.steps);
        assert!(s.steps.is_empty() && s.text.is_empty());
        assert_eq!(
            (s.fssize, s.mkfs.clone()),
            (300 << 20, vec!["-n".to_string(), "4096".into()])
        );
        assert_eq!(s.expects, parsed.expects);
        let mut sum = StepSummary::default();
        for (l, st) in &got {
            sum.add(*l, st);
        }
        assert_eq!(sum.final_crash_line, Some(7));
        assert!(sum.crashes && !sum.keep_random);

        // A bad line stops the stream with its number; so does a step the
        // caller refuses.
        let e = Script::stream("t", "write /f 0 1\nbogus\n".as_bytes(), |_, _| {
            Ok::<(), ()>(())
        });
        assert!(matches!(
            e,
            Err(StreamError::Parse(ParseError { line: 2, .. }))
        ));
        let mut n = 0;
        let e = Script::stream("t", "sync\nsync\nsync\n".as_bytes(), |_, _| {
            n += 1;
            if n == 2 {
                Err("no")
            } else {
                Ok(())
            }
        });
        assert!(matches!(e, Err(StreamError::Step { line: 2, err: "no" })));
    }
}
