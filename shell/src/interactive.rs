//! The interactive shell: one step or expectation a line, with history and
//! completion of verbs and paths.

use btrkit_core::workload::session::{Session, SessionOptions};
use btrkit_core::workload::Script;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

struct ShellHelper {
    session: Rc<RefCell<Option<Session>>>,
}

impl Completer for ShellHelper {
    type Candidate = Pair;
    fn complete(
        &self,
        line: &str,
        pos: usize,
        _: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let head = &line[..pos];
        let start = head.rfind(char::is_whitespace).map(|i| i + 1).unwrap_or(0);
        let word = &head[start..];
        let before: Vec<&str> = head[..start].split_whitespace().collect();
        // Words from a fixed list: the verb, `help`'s verb, `set`'s switch,
        // `expect`'s kind (and `expect post`'s step).
        let fixed: Option<Vec<&str>> = match before.as_slice() {
            [] | ["expect", "post"] => Some(crate::verbs::names().collect()),
            ["help"] => Some(crate::verbs::names().collect()),
            ["set"] => Some(crate::verbs::SWITCHES.to_vec()),
            ["set", _] => Some(vec!["on", "off"]),
            ["expect"] => Some(crate::verbs::expect_kinds().collect()),
            _ => None,
        };
        if let Some(list) = fixed {
            let c = list
                .into_iter()
                .filter(|v| v.starts_with(word))
                .map(|v| Pair {
                    display: v.to_string(),
                    replacement: format!("{v} "),
                })
                .collect();
            return Ok((start, c));
        }
        // A path: complete the last component from the directory's entries.
        let (dir, part) = match word.rfind('/') {
            Some(i) => (&word[..=i], &word[i + 1..]),
            None => ("/", word),
        };
        let mut out = Vec::new();
        if let Some(s) = self.session.borrow_mut().as_mut() {
            if let Ok(fs) = s.fs() {
                if let Ok(l) = fs.resolve(dir, true) {
                    if let Ok(ents) = fs.readdir(l) {
                        for (n, child, _) in ents {
                            let n = String::from_utf8_lossy(&n).into_owned();
                            if n.starts_with(part) {
                                let is_dir = fs
                                    .stat(child)
                                    .map(|st| st.mode & 0o170000 == 0o040000)
                                    .unwrap_or(false);
                                let prefix = if word.contains('/') { dir } else { "" };
                                out.push(Pair {
                                    display: n.clone(),
                                    replacement: format!(
                                        "{prefix}{n}{}",
                                        if is_dir { "/" } else { " " }
                                    ),
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok((start, out))
    }
}
impl Hinter for ShellHelper {
    type Hint = String;
}
impl Highlighter for ShellHelper {}
impl Validator for ShellHelper {}
impl Helper for ShellHelper {}

pub fn run(image: &Path, extra: &[std::path::PathBuf]) -> i32 {
    let mut empty = Script::parse("interactive", "").unwrap_or_else(|_| unreachable_script());
    empty.devices = 1 + extra.len();
    let paths = crate::run::session_paths(image, extra, &empty);
    let opts = SessionOptions {
        crashable: true,
        record_writes: true,
    };
    let session = match Session::open_set(&paths, &empty, &opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("btrkit-shell: error: {}: {e}", image.display());
            return 1;
        }
    };
    let cell = Rc::new(RefCell::new(Some(session)));
    let mut ed: Editor<ShellHelper, rustyline::history::DefaultHistory> = match Editor::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("btrkit-shell: error: terminal: {e}");
            return 1;
        }
    };
    ed.set_helper(Some(ShellHelper {
        session: cell.clone(),
    }));
    let history = history_file();
    if let Some(h) = &history {
        // A missing or unreadable file is an empty history.
        let _ = ed.load_history(h);
    }
    println!(
        "btrkit-shell on {} (help [VERB]; Tab completes; quit or ^D: unmount and leave)",
        image.display()
    );
    let mut n = 0usize;
    loop {
        let line = match ed.readline("btrkit> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("btrkit-shell: error: {e}");
                break;
            }
        };
        n += 1;
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let _ = ed.add_history_entry(t);
        if t == "quit" || t == "exit" {
            break;
        }
        if let Some(rest) = t
            .strip_prefix("help")
            .filter(|r| r.is_empty() || r.starts_with(' '))
        {
            match rest.trim() {
                "" => println!("{}", crate::verbs::overview()),
                v => match crate::verbs::find(v) {
                    Some(v) => println!("{}", crate::verbs::help(v)),
                    None => eprintln!("help: no verb {v:?} (help lists them)"),
                },
            }
            continue;
        }
        let mut sc = Script::parse("interactive", "").unwrap_or_else(|_| unreachable_script());
        if let Err(e) = sc.parse_line(n, t) {
            eprintln!("{e}");
            continue;
        }
        let mut guard = cell.borrow_mut();
        let Some(s) = guard.as_mut() else { break };
        for (_, st) in &sc.steps {
            match s.apply(st) {
                Ok(out) => {
                    if let Some(t) = out.text {
                        println!("{t}");
                    }
                }
                Err(e) => eprintln!("{}: {e}", st.verb()),
            }
        }
        if !sc.expects.is_empty() {
            match s.check(&sc) {
                Ok(f) if f.is_empty() => println!("ok"),
                Ok(f) => {
                    for x in f {
                        eprintln!("expect: {}", x.split_once(": ").map(|p| p.1).unwrap_or(&x));
                    }
                }
                Err(e) => eprintln!("expect: {e}"),
            }
        }
        if !sc.mkfs.is_empty() || !sc.mount.is_empty() {
            eprintln!(
                "mkfs and mount directives apply when the image is opened; they are ignored here"
            );
        }
    }
    if let Some(h) = &history {
        if let Err(e) = ed.save_history(h) {
            eprintln!("btrkit-shell: history not saved to {}: {e}", h.display());
        }
    }
    let s = cell.borrow_mut().take();
    match s.map(|s| s.close(true)) {
        Some(Err(e)) => {
            eprintln!("btrkit-shell: error: unmounting: {e}");
            1
        }
        _ => 0,
    }
}

/// Where the history lives: `$XDG_STATE_HOME/btrkit/shell_history`, else
/// `~/.local/state/btrkit/shell_history` (the XDG default); None (no
/// history kept) when neither is set or the directory cannot be made.
pub fn history_file() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let state = match nonempty("XDG_STATE_HOME") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(nonempty("HOME")?).join(".local/state"),
    };
    let dir = state.join("btrkit");
    std::fs::create_dir_all(&dir).ok()?;
    let file = dir.join("shell_history");
    // Written at the end of the session: find out now that it cannot be.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .ok()?;
    Some(file)
}

fn unreachable_script() -> Script {
    // An empty script always parses; this keeps the code free of panics.
    Script {
        name: String::new(),
        text: String::new(),
        mkfs: Vec::new(),
        fssize: btrkit_core::workload::script::DEFAULT_FSSIZE,
        devices: 1,
        mount: Vec::new(),
        expect_log: None,
        log_optional: false,
        warmup: None,
        steps: Vec::new(),
        expects: Vec::new(),
    }
}
