//! Every word a script line or an interactive line may start with: its
//! syntax (the parser's own usage text), what it does, and one example.
//! `help VERB`, `btrkit-shell verbs VERB`, the interactive completion and
//! the completion scripts all read this one table; a unit test holds it to
//! the parser in core/src/workload/script.rs, so a verb the parser learns
//! without a line here fails the build's tests.

/// What a line starting with the verb is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Applies to the whole run wherever it appears (mkfs, mount, ...).
    Directive,
    /// A file operation or a commit, in script order.
    Step,
    /// An expectation checked at the end.
    Expect,
    /// Inspection and engine switches (btrkit-shell's additions).
    Inspect,
    /// A command of the interactive shell only.
    Shell,
}

impl Kind {
    fn title(self) -> &'static str {
        match self {
            Kind::Directive => "Directives (whole run; in the interactive shell they are ignored)",
            Kind::Step => "Steps",
            Kind::Expect => "Expectations",
            Kind::Inspect => "Inspection and engine switches",
            Kind::Shell => "Interactive shell",
        }
    }
}

/// One verb of the language.
#[derive(Debug)]
pub struct Verb {
    /// The word a line starts with.
    pub name: &'static str,
    /// What sort of line it starts.
    pub kind: Kind,
    /// Its forms, one a line, as the parser's usage messages spell them.
    pub syntax: &'static str,
    /// What it does.
    pub about: &'static str,
    /// One line that uses it (parsed by the unit tests).
    pub example: &'static str,
}

macro_rules! verbs {
    ($($name:literal $kind:ident $syntax:literal $about:literal $example:literal;)*) => {
        /// The table, in the order `help` lists it.
        pub const VERBS: &[Verb] = &[$(Verb {
            name: $name,
            kind: Kind::$kind,
            syntax: $syntax,
            about: $about,
            example: $example,
        }),*];
    };
}

verbs! {
    "mkfs" Directive "mkfs ARGS..."
        "Extra mkfs.btrfs options for the image the run creates (profiles -m/-d included)."
        "mkfs -n 65536 -O ^no-holes";
    "fssize" Directive "fssize SIZE"
        "Size of the image the run creates, of each device (default 512M)."
        "fssize 1G";
    "devices" Directive "devices N"
        "The filesystem spans N devices (1 to 16; IMAGE-2.EXT ... beside IMAGE without --device)."
        "devices 2";
    "mount" Directive "mount OPTS"
        "Comma-separated mount options (commit=600 unless the script sets its own interval)."
        "mount compress=zstd,commit=5";
    "warmup" Directive "warmup yes|no"
        "Whether the run starts with the kernel oracle's warm-up files (each backend has its default)."
        "warmup no";
    "expect-log" Directive "expect-log yes|no|any"
        "Whether the final image must hold a log tree (by default: when a log sync follows the last commit)."
        "expect-log yes";
    "mkdir" Step "mkdir P" "Make a directory." "mkdir /a";
    "create" Step "create P" "Create an empty regular file (mode 0644)." "create /a/f";
    "write" Step "write P OFF LEN [BYTE|\"text\"|random:SEED] [enospc-ok]"
        "Buffered pwrite of LEN bytes at OFF (the file is created if missing): every byte BYTE \
         (default 0xcd), a quoted text (its length is the write's), or seeded random bytes; \
         with enospc-ok running out of space ends the write without failing the script."
        "write /a/f 0 64K 0xaa";
    "swrite" Step "swrite P OFF LEN [BYTE] [sync|dsync]"
        "Buffered writes on a descriptor opened O_SYNC (or O_DSYNC): each write of at most 1 MiB \
         is durable when it returns."
        "swrite /a/f 0 8K 0x41 dsync";
    "dwrite" Step "dwrite P OFF LEN [BYTE] [CHUNK]"
        "O_DIRECT writes of CHUNK bytes each (default LEN, at most 1 MiB)."
        "dwrite /a/d 0 1M 7 4K";
    "mwrite" Step "mwrite P OFF LEN [BYTE]"
        "Stores through a shared mapping of an existing file, nothing synced."
        "mwrite /a/d 4096 100";
    "msync" Step "msync P [OFF LEN]"
        "msync(MS_SYNC) of a range, the whole file without one (a ranged fsync)."
        "msync /a/d 0 4096";
    "sync-range" Step "sync-range P OFF LEN wait_before|write|wait_after"
        "sync_file_range(2) of a range (LEN 0: to the end of the file) with these flags joined by |."
        "sync-range /a/d 0 8K write|wait_after";
    "truncate" Step "truncate P SIZE" "Set the file size." "truncate /a/f 1M";
    "fallocate" Step "fallocate P OFF LEN [keep] [enospc-ok]"
        "fallocate(2) mode 0, or FALLOC_FL_KEEP_SIZE with keep; with enospc-ok ENOSPC is an \
         outcome, not a failure."
        "fallocate /a/f 0 1M keep";
    "zero-range" Step "zero-range P OFF LEN [keep]"
        "FALLOC_FL_ZERO_RANGE (with FALLOC_FL_KEEP_SIZE when keep)."
        "zero-range /a/f 4K 8K";
    "punch" Step "punch P OFF LEN" "FALLOC_FL_PUNCH_HOLE; the size is kept." "punch /a/f 4K 8K";
    "collapse" Step "collapse P OFF LEN"
        "FALLOC_FL_COLLAPSE_RANGE, which Btrfs does not support: the step fails with EOPNOTSUPP, \
         on the kernel as here."
        "collapse /a/f 0 4K";
    "clone" Step "clone SRC SRCOFF DST DSTOFF LEN"
        "FICLONERANGE: share LEN bytes of SRC at DSTOFF in DST (LEN 0: to the end of SRC)."
        "clone /a/f 0 /a/g 0 0";
    "link" Step "link OLD NEW" "A new hard link NEW to OLD." "link /a/f /a/hard";
    "symlink" Step "symlink TARGET P" "A symbolic link P holding TARGET as written." "symlink ../f /a/sym";
    "rename" Step "rename OLD NEW" "rename(2), replacing NEW if it exists." "rename /a/f /a/g";
    "exchange" Step "exchange A B" "renameat2(2) with RENAME_EXCHANGE: the two names trade inodes." "exchange /a/f /b";
    "unlink" Step "unlink P" "Remove a name that is not a directory." "unlink /a/g";
    "rmdir" Step "rmdir P" "Remove an empty directory." "rmdir /a/empty";
    "setxattr" Step "setxattr P NAME VALUE"
        "Set an extended attribute (full name, namespace included; symlinks not followed)."
        "setxattr /a/f user.k \"v\"";
    "removexattr" Step "removexattr P NAME" "Remove an extended attribute." "removexattr /a/f user.k";
    "fsync" Step "fsync P"
        "fsync(2): a log sync, or a transaction commit when the inode cannot be logged."
        "fsync /a/f";
    "fdatasync" Step "fdatasync P" "fdatasync(2)." "fdatasync /a/f";
    "sync" Step "sync" "Commit the transaction (btrfs filesystem sync)." "sync";
    "chmod" Step "chmod P OCTAL" "Set the permission and set-id bits (at most 07777)." "chmod /a/f 0600";
    "chown" Step "chown P UID GID" "Set the owner (symlinks not followed)." "chown /a/f 1000 1000";
    "touch" Step "touch P" "Create if missing, then set the times to now." "touch /a/f";
    "mkfifo" Step "mkfifo P" "Make a FIFO (mode 0644)." "mkfifo /a/p";
    "mknod" Step "mknod P fifo | mknod P chr|blk MAJ MIN"
        "Make a special file (mode 0644)."
        "mknod /a/null chr 1 3";
    "tmpfile" Step "tmpfile H"
        "An O_TMPFILE in the root directory, held open under the handle name H."
        "tmpfile t1";
    "open-fd" Step "open-fd P"
        "Open P and hold the descriptor until close-fd P; steps naming P use it, even after P is \
         renamed or unlinked."
        "open-fd /a/f";
    "close-fd" Step "close-fd P" "Close the descriptor held under the name P." "close-fd /a/f";
    "evict" Step "evict"
        "Drop clean caches as echo 2 > /proc/sys/vm/drop_caches (dirty and open inodes stay)."
        "evict";
    "sleep" Step "sleep SECONDS" "Wait (the engine moves its clock; the kernel sleeps)." "sleep 1.5";
    "remount" Step "remount"
        "Close every held descriptor, unmount (a commit) and mount again."
        "remount";
    "subvol-create" Step "subvol-create P" "Make a subvolume (commits)." "subvol-create /sv";
    "snapshot" Step "snapshot SRC DST" "Snapshot subvolume SRC as DST (commits)." "snapshot /sv /snap";
    "subvol-delete" Step "subvol-delete P" "Delete a subvolume (commits)." "subvol-delete /snap";
    "subvol-set-default" Step "subvol-set-default P"
        "Make P's subvolume the default one."
        "subvol-set-default /sv";
    "quota-enable" Step "quota-enable" "Enable quota groups (commits)." "quota-enable";
    "balance-metadata" Step "balance-metadata"
        "btrfs balance start -m: relocate every metadata and system block group (commits)."
        "balance-metadata";
    "balance" Step "balance [-d[FILTERS]] [-m[FILTERS]] [-s[FILTERS]] [-f]"
        "btrfs balance start with its options: relocate the block groups the filters choose, \
         converting profiles with convert= (commits)."
        "balance -dusage=50 -mconvert=raid1";
    "writefiles" Step "writefiles DIR N SIZE[-MAX] [fsync|fdatasync|none]"
        "Create N files DIR/f00000... of distinct content, sizes spread over SIZE..MAX, each \
         synced after it is written when asked."
        "writefiles /a 100 4K-64K fsync";
    "crash" Step "crash [--keep-random SEED]"
        "Power failure: only flushed writes survive (with --keep-random, also a seeded random \
         subset of the others). A crash before the last one is recovered and the steps go on."
        "crash --keep-random 7";
    "expect" Expect "expect exists P\n\
expect absent P\n\
expect size P N\n\
expect md5 P HEX\n\
expect nlink P N\n\
expect entries DIR [NAME...]\n\
expect xattr P NAME VALUE\n\
expect noxattr P NAME\n\
expect xattrnames P [NAME...]\n\
expect target P T\n\
expect type P file|dir|symlink|fifo|chr|blk|sock\n\
expect mode P OCTAL\n\
expect alloc P [A,B)=KIND ...\n\
expect consistent\n\
expect post STEP...\n\
expect fill P BYTE"
        "Checked on the state after the final crash and recovery (at once in the interactive \
         shell): entries and xattrnames are exact sets, alloc KIND is data, unwritten, hole or \
         extent, consistent runs the checker, post runs a step that must succeed."
        "expect size /a/f 4096";
    "read" Inspect "read P [OFF [LEN]]"
        "Print file bytes: text when printable, else a hex dump."
        "read /a/f 0 16";
    "ls" Inspect "ls [P]"
        "List a directory (default /): inode, mode, links, size, name."
        "ls /a";
    "stat" Inspect "stat P" "Print an inode's attributes (symlinks not followed)." "stat /a/f";
    "stats" Inspect "stats [--json]" "Print the engine's counters." "stats --json";
    "set" Inspect "set NAME on|off"
        "Switch an engine optimization: fast-fsync-skip, log-conflicting-inodes, sync-io-first."
        "set fast-fsync-skip off";
    "help" Shell "help [VERB]" "List the verbs, or show one: syntax and an example." "help write";
    "quit" Shell "quit" "Unmount (a commit) and leave; also exit or ^D." "quit";
}

/// The switches `set` takes.
pub const SWITCHES: &[&str] = &["fast-fsync-skip", "log-conflicting-inodes", "sync-io-first"];

/// The table's entry for `name`.
pub fn find(name: &str) -> Option<&'static Verb> {
    VERBS.iter().find(|v| v.name == name)
}

/// Every verb's name, in table order.
pub fn names() -> impl Iterator<Item = &'static str> {
    VERBS.iter().map(|v| v.name)
}

/// The verbs as the values of `btrkit-shell verbs VERB`, each with what it
/// does: what the completion scripts offer.
pub fn value_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        VERBS
            .iter()
            .map(|v| clap::builder::PossibleValue::new(v.name).help(v.about)),
    )
}

/// The kinds of `expect` lines (`expect KIND ...`), from the table.
pub fn expect_kinds() -> impl Iterator<Item = &'static str> {
    find("expect")
        .map(|v| v.syntax)
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
}

/// `help VERB`: the syntax, what it does and the example.
pub fn help(v: &Verb) -> String {
    format!("{}\n\n  {}\n\n  Example: {}", v.syntax, v.about, v.example)
}

/// `help` alone: every verb by kind, with its first form.
pub fn overview() -> String {
    let mut s = String::new();
    for kind in [
        Kind::Step,
        Kind::Inspect,
        Kind::Expect,
        Kind::Directive,
        Kind::Shell,
    ] {
        s.push_str(kind.title());
        s.push_str(":\n");
        let mut line = String::from(" ");
        for v in VERBS.iter().filter(|v| v.kind == kind) {
            if line.len() + v.name.len() + 1 > 78 {
                s.push_str(&line);
                s.push('\n');
                line = String::from(" ");
            }
            line.push(' ');
            line.push_str(v.name);
        }
        s.push_str(&line);
        s.push_str("\n\n");
    }
    s.push_str("help VERB shows one: its syntax and an example.");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use btrkit_core::workload::Script;
    use std::collections::BTreeSet;

    /// The parser's source: its match arms are the verbs it knows.
    const PARSER: &str = include_str!("../../core/src/workload/script.rs");

    /// Words of the match arms (`"a" | "b" =>`) at `indent` between the
    /// line containing `from` and the next line containing `to`.
    fn arms(from: &str, to: &str, indent: usize) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut lines = PARSER.lines().skip_while(|l| !l.contains(from));
        let pad = " ".repeat(indent);
        for l in lines.by_ref().skip(1) {
            if l.contains(to) {
                return out;
            }
            let Some(rest) = l.strip_prefix(&pad) else {
                continue;
            };
            if !rest.starts_with('"') {
                continue;
            }
            let Some((pat, _)) = rest.split_once(" =>") else {
                continue;
            };
            for alt in pat.split('|') {
                let w = alt.trim().trim_matches('"');
                if !w.is_empty() && !w.contains(' ') {
                    out.insert(w.to_string());
                }
            }
        }
        panic!("{to:?} not found after {from:?} in the parser's source");
    }

    fn parser_verbs() -> BTreeSet<String> {
        let mut v = arms(
            "fn parse_step(",
            "other => return Err(format!(\"unknown verb",
            8,
        );
        let directives = arms("pub fn parse_line(", "_ => self.steps.push", 12);
        assert!(directives.contains("mkfs") && directives.contains("expect"));
        v.extend(directives);
        assert!(v.len() > 40, "the parser's arms were not found: {v:?}");
        v
    }

    fn usage_of(line: &str) -> Option<String> {
        let mut sc = Script::parse("t", "").ok()?;
        match sc.parse_line(1, line) {
            Err(e) => e.strip_prefix("usage: ").map(str::to_string),
            Ok(()) => None,
        }
    }

    #[test]
    fn every_parser_verb_has_help_and_no_other() {
        let parsed = parser_verbs();
        let table: BTreeSet<String> = VERBS
            .iter()
            .filter(|v| v.kind != Kind::Shell)
            .map(|v| v.name.to_string())
            .collect();
        let missing: Vec<_> = parsed.difference(&table).collect();
        assert!(
            missing.is_empty(),
            "verbs the parser knows without help: {missing:?}"
        );
        let extra: Vec<_> = table.difference(&parsed).collect();
        assert!(
            extra.is_empty(),
            "help for verbs the parser does not know: {extra:?}"
        );
        let names: BTreeSet<_> = names().collect();
        assert_eq!(names.len(), VERBS.len(), "a verb is in the table twice");
    }

    #[test]
    fn every_expectation_kind_has_a_form() {
        let parsed = arms(
            "fn parse_expect(",
            "o => return Err(format!(\"unknown expectation",
            8,
        );
        let table: BTreeSet<String> = expect_kinds().map(str::to_string).collect();
        assert_eq!(parsed, table);
    }

    /// The syntax lines are the parser's own usage messages: a verb given
    /// no arguments, or too many, is refused with one of them.
    #[test]
    fn syntax_is_the_parsers_usage() {
        let mut checked = 0;
        for v in VERBS.iter().filter(|v| v.kind != Kind::Shell) {
            let forms: Vec<&str> = v.syntax.lines().collect();
            let mut lines = vec![
                v.name.to_string(),
                format!("{} {}", v.name, ["x"; 9].join(" ")),
            ];
            if v.name == "expect" {
                lines = expect_kinds()
                    .flat_map(|k| {
                        [
                            format!("expect {k}"),
                            format!("expect {k} {}", ["x"; 9].join(" ")),
                        ]
                    })
                    .collect();
            }
            for l in lines {
                if let Some(u) = usage_of(&l) {
                    assert!(
                        forms.contains(&u.as_str()),
                        "{}: the parser says `usage: {u}`, the table {forms:?}",
                        v.name
                    );
                    checked += 1;
                }
            }
        }
        // Nearly every verb has a usage message; a parser that changed how
        // it words them must not leave this test checking nothing.
        assert!(checked > 50, "only {checked} usage messages seen");
    }

    #[test]
    fn every_example_parses_as_its_verb() {
        for v in VERBS {
            assert!(
                v.example.split_whitespace().next() == Some(v.name),
                "{}: {}",
                v.name,
                v.example
            );
            if v.kind == Kind::Shell {
                continue;
            }
            let mut sc = Script::parse("t", "").expect("empty script");
            sc.parse_line(1, v.example)
                .unwrap_or_else(|e| panic!("{}: example {:?}: {e}", v.name, v.example));
            match v.kind {
                Kind::Step | Kind::Inspect => {
                    assert_eq!(sc.steps.len(), 1, "{}", v.name);
                    // `mkfifo P` is `mknod P fifo` once parsed.
                    let want = if v.name == "mkfifo" { "mknod" } else { v.name };
                    assert_eq!(sc.steps[0].1.verb(), want);
                }
                Kind::Expect => assert_eq!(sc.expects.len(), 1),
                _ => assert!(sc.steps.is_empty() && sc.expects.is_empty(), "{}", v.name),
            }
        }
    }

    #[test]
    fn help_texts() {
        let h = help(find("write").expect("write"));
        assert!(h.starts_with("write P OFF LEN"), "{h}");
        assert!(h.contains("Example: write /a/f 0 64K 0xaa"), "{h}");
        let o = overview();
        for v in VERBS {
            assert!(
                o.split_whitespace().any(|w| w == v.name),
                "{} not in help",
                v.name
            );
        }
        assert!(o.lines().all(|l| l.len() <= 80), "{o}");
    }
}
