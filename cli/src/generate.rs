//! Man pages and completion scripts written from a binary's own clap
//! definition, so that neither can drift from `--help`.
//!
//! Every binary calls [`handle`] first thing in `main`. Without
//! `BTRKIT_GENERATE` in the environment it returns at once; with it, the
//! binary writes what was asked and exits:
//!
//! - `BTRKIT_GENERATE=man:DIR`: `DIR/NAME.1`, and one page per subcommand
//!   (`btrkit-fsck-rescue.1`, `btrkit-fsck-rescue-zero-log.1`, ...). The
//!   `after_help` text is split into sections: its `Examples:` block becomes
//!   EXAMPLES, its `Exit status`/`Exit codes` paragraph EXIT STATUS, the rest
//!   goes on the DESCRIPTION.
//! - `BTRKIT_GENERATE=completions:SHELL:DIR` (`bash`, `zsh`, `fish`):
//!   `DIR/NAME`, `DIR/_NAME` or `DIR/NAME.fish`, the names bash-completion,
//!   zsh's `fpath` and fish's `vendor_completions.d` look for.
//!
//! Each file written is printed on standard output; exit 0 when all were
//! written, 1 with one line on standard error otherwise.

use clap::Command;
use clap_mangen::Man;
use roff::{bold, roman, Roff};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable [`handle`] reads.
pub const ENV: &str = "BTRKIT_GENERATE";

/// Section of the overview page every generated page refers to.
const OVERVIEW: &str = "btrkit(7)";

/// Write the man pages or completions `BTRKIT_GENERATE` asks for and exit;
/// return at once when it is unset or empty.
pub fn handle<C: clap::CommandFactory>() {
    let Some(spec) = std::env::var_os(ENV).filter(|v| !v.is_empty()) else {
        return;
    };
    let cmd = C::command();
    let name = cmd.get_name().to_string();
    match generate(cmd, &spec.to_string_lossy()) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{name}: error: {ENV}: {e}");
            std::process::exit(1);
        }
    }
}

/// What `spec` (`man:DIR` or `completions:SHELL:DIR`) asks of `cmd`; the
/// files written.
pub fn generate(cmd: Command, spec: &str) -> Result<Vec<PathBuf>, String> {
    let usage = "expected man:DIR or completions:bash|zsh|fish:DIR";
    let (what, rest) = spec.split_once(':').ok_or(usage)?;
    match what {
        "man" => man_pages(cmd, Path::new(rest)),
        "completions" => {
            let (shell, dir) = rest.split_once(':').ok_or(usage)?;
            completion(cmd, shell, Path::new(dir)).map(|f| vec![f])
        }
        _ => Err(format!("{spec:?}: {usage}")),
    }
}

fn create(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The completion script of `cmd` for `shell`, under the file name that
/// shell's completion loader looks for.
pub fn completion(mut cmd: Command, shell: &str, dir: &Path) -> Result<PathBuf, String> {
    use clap_complete::Shell;
    let name = cmd.get_name().to_string();
    let (sh, file) = match shell {
        "bash" => (Shell::Bash, name.clone()),
        "zsh" => (Shell::Zsh, format!("_{name}")),
        "fish" => (Shell::Fish, format!("{name}.fish")),
        o => return Err(format!("no completions for shell {o:?} (bash, zsh, fish)")),
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(file);
    let mut f = create(&path)?;
    clap_complete::generate(sh, &mut cmd, &name, &mut f);
    if sh == Shell::Fish {
        f.write_all(fish_positional_values(&cmd).as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    f.flush().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// clap_complete's fish script completes the possible values of options
/// only; bash's and zsh's also those of positional arguments (the shell's
/// `verbs VERB`). These lines add them for fish, for the command and its
/// direct subcommands, with the conditions clap_complete's script defines.
fn fish_positional_values(cmd: &Command) -> String {
    let name = cmd.get_name();
    let func = format!("__fish_{}", name.replace('-', "_"));
    let mut out = String::new();
    let mut emit = |cond: String, c: &Command| {
        for a in c.get_positionals().filter(|a| !a.is_hide_set()) {
            let vals: Vec<String> = a
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| {
                    let help = v.get_help().map(|h| h.to_string()).unwrap_or_default();
                    let help = first_sentence(&help);
                    format!("{}\\t'{}'", fish_escape(v.get_name()), fish_escape(help))
                })
                .collect();
            if !vals.is_empty() {
                out.push_str(&format!(
                    "complete -c {name} -n \"{cond}\" -f -a \"{}\"\n",
                    vals.join(" ")
                ));
            }
        }
    };
    emit(format!("{func}_needs_command"), cmd);
    for sub in visible_subcommands(cmd) {
        emit(format!("{func}_using_subcommand {}", sub.get_name()), sub);
    }
    out
}

/// Up to the first full stop that ends a sentence (one followed by a
/// capital), without it.
fn first_sentence(s: &str) -> &str {
    let b = s.as_bytes();
    let end = (0..b.len())
        .find(|&i| {
            b[i] == b'.'
                && b.get(i + 1) == Some(&b' ')
                && b.get(i + 2).is_some_and(u8::is_ascii_uppercase)
        })
        .unwrap_or(s.len());
    s[..end].trim_end_matches('.')
}

/// Text safe inside fish's double quotes and, within them, single quotes.
fn fish_escape(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .map(|c| match c {
            '\\' | '\'' | '"' | '$' => format!("\\{c}"),
            c => c.to_string(),
        })
        .collect()
}

/// `NAME.1` and one page per visible subcommand, at any depth.
pub fn man_pages(cmd: Command, dir: &Path) -> Result<Vec<PathBuf>, String> {
    // No `help` subcommand page: `--help` is on every page already.
    let mut cmd = cmd.disable_help_subcommand(true);
    // Building gives every subcommand its display name (`btrkit-fsck-rescue`)
    // and its bin name for the synopsis (`btrkit-fsck rescue`).
    cmd.build();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let version = cmd.get_version().unwrap_or_default().to_string();
    let mut out = Vec::new();
    let mut todo = vec![(cmd, None::<String>)];
    // Depth is bounded by the definitions (a finite tree of commands).
    while let Some((c, parent)) = todo.pop() {
        let name = page_name(&c);
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        render_page(&c, parent.as_deref(), &version, &mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut f = create(&path)?;
        f.write_all(&buf)
            .and_then(|()| f.flush())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(path);
        for sub in visible_subcommands(&c) {
            todo.push((sub.clone(), Some(name.clone())));
        }
    }
    Ok(out)
}

fn page_name(c: &Command) -> String {
    c.get_display_name().unwrap_or(c.get_name()).to_string()
}

fn visible_subcommands(c: &Command) -> impl Iterator<Item = &Command> {
    c.get_subcommands().filter(|s| !s.is_hide_set())
}

/// One page: clap_mangen's NAME, SYNOPSIS, DESCRIPTION, OPTIONS and
/// SUBCOMMANDS, then the after-help text as DESCRIPTION paragraphs, EXIT
/// STATUS and EXAMPLES, and SEE ALSO.
fn render_page(
    c: &Command,
    parent: Option<&str>,
    version: &str,
    w: &mut dyn Write,
) -> std::io::Result<()> {
    let man = Man::new(c.clone())
        .source(format!("btrkit {version}"))
        .manual("btrkit manual");
    man.render_title(w)?;
    // No hyphenation: a flag or a path broken across lines cannot be
    // searched for or copied; left-adjusted, as a line of long unbreakable
    // words cannot be stretched to the margin (troff warns).
    w.write_all(b".nh\n.ad l\n")?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    let after = c
        .get_after_long_help()
        .or(c.get_after_help())
        .map(|s| s.to_string())
        .unwrap_or_default();
    let parts = split_after_help(&after);
    let mut r = Roff::new();
    let has_about = c.get_long_about().or(c.get_about()).is_some();
    if has_about {
        man.render_description_section(w)?;
    } else if !parts.text.is_empty() {
        r.control("SH", ["DESCRIPTION"]);
    }
    for (i, p) in parts.text.iter().enumerate() {
        if has_about || i > 0 {
            r.control("PP", []);
        }
        r.text([roman(p.join(" "))]);
    }
    w.write_all(r.render().as_bytes())?;
    if c.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if visible_subcommands(c).next().is_some() {
        man.render_subcommands_section(w)?;
    }
    let mut r = Roff::new();
    if !parts.exit.is_empty() {
        r.control("SH", ["EXIT STATUS"]);
        for (i, p) in parts.exit.iter().enumerate() {
            if i > 0 {
                r.control("PP", []);
            }
            r.text([roman(p.join(" "))]);
        }
    }
    if !parts.examples.is_empty() {
        r.control("SH", ["EXAMPLES"]);
        for ex in &parts.examples {
            let (cmd, note) = split_example(ex);
            match note {
                // The command as its tag, what it does below it.
                Some(n) => {
                    r.control("TP", []);
                    r.text([bold(cmd)]);
                    r.text([roman(n)]);
                }
                None => {
                    r.control("TP", []);
                    r.text([bold(cmd)]);
                }
            }
        }
    }
    r.control("SH", ["SEE ALSO"]);
    let mut see: Vec<String> = Vec::new();
    if let Some(p) = parent {
        see.push(format!("{p}(1)"));
    }
    see.extend(visible_subcommands(c).map(|s| format!("{}(1)", page_name(s))));
    see.push(OVERVIEW.to_string());
    r.text([roman(see.join(", "))]);
    w.write_all(r.render().as_bytes())
}

/// An `after_help` text cut into the parts of a man page.
#[derive(Default, Debug, PartialEq)]
struct AfterHelp {
    /// Paragraphs of prose, each as its lines.
    text: Vec<Vec<String>>,
    /// The exit status paragraphs.
    exit: Vec<Vec<String>>,
    /// Example lines, each a command with perhaps a note after it.
    examples: Vec<String>,
}

/// Paragraphs end at blank lines; `Examples:` starts the examples (one a
/// line, until a blank line); a line starting `Exit status`/`Exit codes`
/// starts an exit status paragraph, even inside another paragraph.
fn split_after_help(s: &str) -> AfterHelp {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        None,
        Text,
        Exit,
        Examples,
    }
    let mut out = AfterHelp::default();
    let mut at = In::None;
    for line in s.lines() {
        let t = line.trim();
        if t.is_empty() {
            at = In::None;
            continue;
        }
        if let Some(rest) = t.strip_prefix("Examples:") {
            at = In::Examples;
            if !rest.trim().is_empty() {
                out.examples.push(rest.trim().to_string());
            }
            continue;
        }
        if t.starts_with("Exit status") || t.starts_with("Exit codes") {
            at = In::Exit;
            let body = t
                .strip_prefix("Exit status: ")
                .or_else(|| t.strip_prefix("Exit codes: "))
                .unwrap_or(t);
            out.exit.push(vec![body.to_string()]);
            continue;
        }
        match at {
            In::Examples => out.examples.push(t.to_string()),
            In::Exit => {
                if let Some(p) = out.exit.last_mut() {
                    p.push(t.to_string());
                }
            }
            In::Text => {
                if let Some(p) = out.text.last_mut() {
                    p.push(t.to_string());
                }
            }
            In::None => {
                at = In::Text;
                out.text.push(vec![t.to_string()]);
            }
        }
    }
    out
}

/// An example line as its command and the note beside it: the help texts
/// set a note off by two or more spaces, `# `, or write it in parentheses
/// after such a gap.
fn split_example(line: &str) -> (String, Option<String>) {
    match line.find("  ") {
        Some(i) => {
            let cmd = line[..i].trim_end();
            let note = line[i..].trim();
            let note = note.strip_prefix("# ").unwrap_or(note);
            let note = match note.strip_prefix('(').and_then(|n| n.strip_suffix(')')) {
                Some(inner) => inner,
                None => note,
            };
            (cmd.to_string(), Some(note.to_string()))
        }
        None => match line.split_once(" # ") {
            Some((c, n)) => (c.trim().to_string(), Some(n.trim().to_string())),
            None => (line.to_string(), None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_help_parts() {
        let a = split_after_help(
            "Prints this.\nand that.\nExit status: 0 fine, 1 not.\n\nExamples:\n  \
             x a.img            (one)\n  x b.img   # two\n  x c.img\n\nMore prose.",
        );
        assert_eq!(
            a.text,
            vec![vec!["Prints this.", "and that."], vec!["More prose."]]
        );
        assert_eq!(a.exit, vec![vec!["0 fine, 1 not."]]);
        assert_eq!(a.examples.len(), 3);
        assert_eq!(
            split_example(&a.examples[0]),
            ("x a.img".to_string(), Some("one".to_string()))
        );
        assert_eq!(
            split_example(&a.examples[1]),
            ("x b.img".to_string(), Some("two".to_string()))
        );
        assert_eq!(split_example(&a.examples[2]), ("x c.img".to_string(), None));
    }

    #[derive(clap::Parser)]
    #[command(
        name = "demo",
        version,
        about = "A demo",
        after_help = "Exit codes: 0 ok.\n\nExamples:\n  demo run x"
    )]
    struct Demo {
        #[command(subcommand)]
        cmd: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        /// Run it.
        Run {
            /// A flag.
            #[arg(long)]
            fast: bool,
        },
    }

    #[test]
    fn pages_and_completions() {
        use clap::CommandFactory;
        let d = std::env::temp_dir().join(format!("btrkit-gen-{}", std::process::id()));
        let files = generate(Demo::command(), &format!("man:{}", d.display())).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["demo.1", "demo-run.1"]);
        let top = std::fs::read_to_string(d.join("demo.1")).unwrap();
        assert!(top.contains(".SH \"EXIT STATUS\""), "{top}");
        assert!(top.contains(".SH EXAMPLES"), "{top}");
        assert!(top.contains("demo\\-run(1)"), "{top}");
        let sub = std::fs::read_to_string(d.join("demo-run.1")).unwrap();
        assert!(sub.contains("\\-\\-fast"), "{sub}");
        for sh in ["bash", "zsh", "fish"] {
            let f = generate(
                Demo::command(),
                &format!("completions:{sh}:{}", d.display()),
            )
            .unwrap();
            assert!(std::fs::metadata(&f[0]).unwrap().len() > 0);
        }
        assert!(generate(Demo::command(), "completions:tcsh:/x").is_err());
        assert!(generate(Demo::command(), "pdf:/x").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
