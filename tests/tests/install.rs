//! Installable and discoverable: the man pages every binary writes from its
//! clap definition render with `man -l` without a warning and name every
//! long flag of their command; the completion scripts load in bash, zsh
//! and fish; scripts/install.sh into a scratch DESTDIR gives binaries that
//! run, man pages and completions where the shells look; the .deb of
//! scripts/package-deb.sh holds the same and dpkg installs it;
//! `btrkit-shell verbs VERB` and the interactive `help VERB` show every verb.

use btrkit_tests::env::repo_root;
use btrkit_tests::fixtures::have_cmd;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Every binary scripts/install.sh installs: the workspace's [[bin]]s but
/// the test crate's helpers, from `cargo metadata` as the script reads it.
fn workspace_bins() -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let o = Command::new(cargo)
        .current_dir(repo_root())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .expect("cargo metadata");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("metadata JSON");
    let mut out = Vec::new();
    for p in v["packages"].as_array().expect("packages") {
        if p["name"] == "btrkit-tests" {
            continue;
        }
        for t in p["targets"].as_array().expect("targets") {
            if t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|x| x == "bin"))
            {
                out.push(t["name"].as_str().expect("name").to_string());
            }
        }
    }
    out.sort();
    assert!(out.len() >= 8, "{out:?}");
    out
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// Run `bin` with BTRKIT_GENERATE=`spec`; the files it wrote.
fn generate(bin: &str, spec: &str) -> Vec<PathBuf> {
    let o = Command::new(btrkit_tests::bin_path(bin))
        .env("BTRKIT_GENERATE", spec)
        .arg("--version")
        .output()
        .expect("run");
    assert!(o.status.success(), "{bin}: {}", text(&o));
    let files: Vec<PathBuf> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    assert!(
        !files.is_empty(),
        "{bin} wrote nothing for {spec}: does main call btrkit_cli::generate::handle?"
    );
    files
}

/// `man -l` of a page: its warnings, and its text with lines joined.
fn render(page: &Path) -> (String, String) {
    let o = Command::new("sh")
        .arg("-c")
        .arg("MANWIDTH=80 man --warnings -l \"$1\" 2>&1 >/dev/null")
        .arg("sh")
        .arg(page)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("man");
    let warnings = String::from_utf8_lossy(&o.stdout).into_owned();
    let o = Command::new("man")
        .args(["-l"])
        .arg(page)
        .env("MANWIDTH", "80")
        .env("LC_ALL", "C.UTF-8")
        .env("MAN_KEEP_FORMATTING", "")
        .output()
        .expect("man");
    assert!(o.status.success(), "{}: {}", page.display(), text(&o));
    // Pages are not hyphenated (.nh); a word broken anyway would be joined
    // here so the flag search below still finds it.
    let t = String::from_utf8_lossy(&o.stdout).replace("\u{2010}\n", "");
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    (warnings, t)
}

/// The long flags `--help` lists for the command `bin ARGS...`.
fn long_flags(bin: &str, args: &[&str]) -> BTreeSet<String> {
    let o = Command::new(btrkit_tests::bin_path(bin))
        .args(args)
        .arg("--help")
        .output()
        .expect("help");
    assert!(o.status.success(), "{bin} {args:?} --help: {}", text(&o));
    let mut out = BTreeSet::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let t = l.trim_start();
        // Option lines: `-x, --flag ...` or `--flag ...`, indented.
        if l.len() == t.len() || !t.starts_with('-') {
            continue;
        }
        for w in t.split([' ', ',', '=', '<', '[']) {
            if let Some(f) = w.strip_prefix("--") {
                if !f.is_empty() {
                    out.insert(format!("--{f}"));
                }
            }
        }
    }
    out
}

fn need_man() -> bool {
    if have_cmd("man") && have_cmd("groff") {
        return true;
    }
    btrkit_tests::env::skip("man (man-db) and groff are not installed");
    false
}

#[test]
fn man_pages_render_without_warnings_and_name_every_flag() {
    if !need_man() {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let mut pages = 0;
    for bin in workspace_bins() {
        let dir = d.path().join(&bin);
        let files = generate(&bin, &format!("man:{}", dir.display()));
        for f in &files {
            let (warnings, t) = render(f);
            assert!(warnings.trim().is_empty(), "{}: {warnings}", f.display());
            // `btrkit-fsck-rescue-zero-log.1` documents `btrkit-fsck rescue zero-log`.
            let stem = f.file_stem().expect("stem").to_string_lossy().into_owned();
            let sub = stem
                .strip_prefix(&bin)
                .unwrap_or("")
                .trim_start_matches('-');
            let path = subcommand_path(&bin, sub);
            let args: Vec<&str> = path.iter().map(String::as_str).collect();
            for flag in long_flags(&bin, &args) {
                assert!(
                    t.contains(&flag),
                    "{}: {flag} is not on the page:\n{t}",
                    f.display()
                );
            }
            assert!(
                t.contains("SEE ALSO") && t.contains("btrkit(7)"),
                "{}",
                f.display()
            );
            if path.is_empty() {
                assert!(t.contains("EXAMPLES"), "{}: no examples:\n{t}", f.display());
                assert!(
                    t.contains("EXIT STATUS"),
                    "{}: no exit status:\n{t}",
                    f.display()
                );
            }
            pages += 1;
        }
        assert!(
            files.iter().any(|f| f.ends_with(format!("{bin}.1"))),
            "{files:?}"
        );
    }
    assert!(pages >= 20, "only {pages} pages");
    // The hand-written overview: clean, and naming every verb of the shell.
    let (warnings, t) = render(&repo_root().join("man/btrkit.7"));
    assert!(warnings.trim().is_empty(), "btrkit.7: {warnings}");
    for v in verbs() {
        assert!(
            t.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|w| w == v),
            "btrkit.7 does not name the verb {v}"
        );
    }
}

/// A page's subcommand part (`rescue-zero-log`) as the command words
/// (`rescue`, `zero-log`): the longest subcommand name that matches first,
/// as names hold dashes too.
fn subcommand_path(bin: &str, mut sub: &str) -> Vec<String> {
    let mut path: Vec<String> = Vec::new();
    while !sub.is_empty() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let o = Command::new(btrkit_tests::bin_path(bin))
            .args(&args)
            .output()
            .expect("help");
        let help = String::from_utf8_lossy(&o.stdout).into_owned();
        let names: Vec<String> = help
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        let best = names
            .iter()
            .filter(|n| sub == n.as_str() || sub.starts_with(&format!("{n}-")))
            .max_by_key(|n| n.len())
            .unwrap_or_else(|| panic!("{bin} {path:?}: no subcommand for {sub:?} in {names:?}"))
            .clone();
        sub = sub[best.len()..].trim_start_matches('-');
        path.push(best);
    }
    path
}

/// The verbs `btrkit-shell verbs` lists.
fn verbs() -> Vec<String> {
    let o = Command::new(btrkit_tests::bin_path("btrkit-shell"))
        .arg("verbs")
        .output()
        .expect("verbs");
    assert!(o.status.success(), "{}", text(&o));
    let v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("  "))
        .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect();
    assert!(v.len() > 50, "{v:?}");
    v
}

#[test]
fn completions_load_in_bash_zsh_and_fish() {
    let d = tempfile::tempdir().expect("tempdir");
    let shells: [(&str, &str); 3] = [
        ("bash", "source \"$1\""),
        ("zsh", "autoload -U compinit; compinit -u; source \"$1\""),
        ("fish", "source $argv[1]"),
    ];
    for (sh, load) in shells {
        if !have_cmd(sh) {
            btrkit_tests::env::skip_part(sh, &format!("{sh} is not installed"));
            continue;
        }
        for bin in workspace_bins() {
            let f = generate(
                &bin,
                &format!("completions:{sh}:{}", d.path().join(sh).display()),
            );
            let mut c = Command::new(sh);
            match sh {
                "fish" => c.args(["-c", load, "--"]).arg(&f[0]),
                _ => c.args(["-c", load, sh]).arg(&f[0]),
            };
            let o = c.env("HOME", d.path()).output().expect(sh);
            assert!(
                o.status.success() && o.stderr.is_empty(),
                "{sh} {}: {}",
                f[0].display(),
                text(&o)
            );
        }
    }
    // The shell's verbs are offered after `btrkit-shell verbs`.
    if have_cmd("fish") {
        let f = generate(
            "btrkit-shell",
            &format!("completions:fish:{}", d.path().join("f2").display()),
        );
        let o = Command::new("fish")
            .args([
                "-c",
                "source $argv[1]; complete -C'btrkit-shell verbs subvol-'",
                "--",
            ])
            .arg(&f[0])
            .output()
            .expect("fish");
        let t = text(&o);
        for v in ["subvol-create", "subvol-delete", "subvol-set-default"] {
            assert!(t.contains(v), "{t}");
        }
    }
    let f = generate(
        "btrkit-shell",
        &format!("completions:bash:{}", d.path().join("b2").display()),
    );
    let s = std::fs::read_to_string(&f[0]).expect("read");
    assert!(
        s.contains("balance-metadata") && s.contains("subvol-set-default"),
        "bash script lacks the verbs"
    );
}

/// Points an install or package script at the build these tests run with,
/// in its own target directory and profile, built already (`--no-build`):
/// nothing is built that the tests did not build.
fn this_build(c: &mut Command) {
    let fsck = btrkit_tests::bin_path("btrkit-fsck");
    let profile_dir = fsck.parent().expect("profile dir");
    let target = profile_dir.parent().expect("target dir");
    for b in workspace_bins() {
        btrkit_tests::bin_path(&b);
    }
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(p) => p.to_string(),
    };
    c.env("PROFILE", profile).env("CARGO_TARGET_DIR", target);
}

#[test]
fn install_script_into_a_scratch_destdir() {
    let d = tempfile::tempdir().expect("tempdir");
    let dest = d.path().join("root");
    let mut c = Command::new(repo_root().join("scripts/install.sh"));
    c.env("DESTDIR", &dest).env("PREFIX", "/usr");
    this_build(&mut c);
    c.arg("--no-build");
    let o = c.output().expect("install.sh");
    assert!(o.status.success(), "install.sh: {}", text(&o));
    let usr = dest.join("usr");
    let bins = workspace_bins();
    for b in &bins {
        let exe = usr.join("bin").join(b);
        let o = Command::new(&exe)
            .arg("--version")
            .output()
            .expect("run installed");
        assert!(o.status.success(), "{}: {}", exe.display(), text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains(b.as_str()));
        for p in [
            format!("share/man/man1/{b}.1.gz"),
            format!("share/bash-completion/completions/{b}"),
            format!("share/zsh/site-functions/_{b}"),
            format!("share/fish/vendor_completions.d/{b}.fish"),
        ] {
            assert!(usr.join(&p).is_file(), "{p} not installed");
        }
    }
    assert!(usr.join("share/man/man7/btrkit.7.gz").is_file());
    assert!(usr
        .join("share/man/man1/btrkit-fsck-rescue-zero-log.1.gz")
        .is_file());
    let installed: Vec<_> = std::fs::read_dir(usr.join("bin"))
        .expect("bin")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        installed.len(),
        bins.len(),
        "{installed:?}: test helpers installed?"
    );
    // man finds the installed pages by name under the prefix.
    if have_cmd("man") {
        let o = Command::new("man")
            .args(["-M"])
            .arg(usr.join("share/man"))
            .args(["-w", "btrkit-tune"])
            .output()
            .expect("man -w");
        assert!(o.status.success(), "{}", text(&o));
    }
}

/// The .deb of scripts/package-deb.sh (dpkg-deb), from this build: its
/// control fields, its files, and an install by dpkg into a scratch root
/// (its own dpkg database) whose binaries run and which dpkg removes again.
#[test]
fn deb_package_installs_into_a_scratch_root() {
    if !have_cmd("dpkg-deb") || !have_cmd("dpkg") {
        btrkit_tests::env::skip("dpkg-deb or dpkg is not installed");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let mut c = Command::new(repo_root().join("scripts/package-deb.sh"));
    // Uncompressed: the debug build's binaries are large, and xz of them
    // takes minutes; the package's layout and control fields are the same.
    c.env("DEBDIR", d.path().join("debian"))
        .env("DEB_COMPRESS", "none")
        .arg("--no-build");
    this_build(&mut c);
    let o = c.output().expect("package-deb.sh");
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let deb = out
        .lines()
        .map(str::trim)
        .rfind(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no .deb named in: {out}"));
    let field = |name: &str| {
        let f = Command::new("dpkg-deb")
            .arg("-f")
            .arg(&deb)
            .arg(name)
            .output()
            .expect("dpkg-deb -f");
        assert!(f.status.success(), "{}", text(&f));
        String::from_utf8_lossy(&f.stdout).trim().to_string()
    };
    let depends = field("Depends");
    assert!(
        depends.contains("fuse3") && depends.contains("libc6"),
        "Depends: {depends}"
    );
    assert_eq!(field("Package"), "btrkit");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    let c = Command::new("dpkg-deb")
        .arg("-c")
        .arg(&deb)
        .output()
        .expect("dpkg-deb -c");
    let listing = String::from_utf8_lossy(&c.stdout).into_owned();
    for b in workspace_bins() {
        for p in [
            format!("./usr/bin/{b}"),
            format!("./usr/share/man/man1/{b}.1.gz"),
            format!("./usr/share/bash-completion/completions/{b}"),
            format!("./usr/share/zsh/vendor-completions/_{b}"),
            format!("./usr/share/fish/vendor_completions.d/{b}.fish"),
        ] {
            assert!(listing.contains(&p), "{p} not in the package:\n{listing}");
        }
    }
    assert!(listing.contains("./usr/share/man/man7/btrkit.7.gz"));
    assert!(
        listing.lines().all(|l| l.contains("root/root")),
        "files not owned by root:\n{listing}"
    );
    // A scratch root with an empty dpkg database: dpkg unpacks and
    // configures the package there (libc6 and fuse3 are the host's, not the
    // scratch database's, hence --force-depends).
    let root = d.path().join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"] {
        std::fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").expect("status");
    let dpkg = |args: &[&str]| {
        let o = Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args([
                "--force-depends",
                "--force-not-root",
                "--force-script-chrootless",
            ])
            .args(args)
            .output()
            .expect("dpkg");
        assert!(o.status.success(), "dpkg {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    dpkg(&["-i", deb.to_str().expect("utf-8 path")]);
    let status = dpkg(&["-s", "btrkit"]);
    assert!(status.contains("Status: install ok installed"), "{status}");
    let files = dpkg(&["-L", "btrkit"]);
    for b in workspace_bins() {
        assert!(files.contains(&format!("/usr/bin/{b}\n")), "{b} not listed");
        let o = Command::new(root.join("usr/bin").join(&b))
            .arg("--version")
            .output()
            .expect("run");
        assert!(o.status.success(), "{b}: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains(b.as_str()));
    }
    dpkg(&["-r", "btrkit"]);
    assert!(
        !root.join("usr/bin/btrkit-fsck").exists(),
        "removed package left its binary"
    );
}

#[test]
fn shell_help_for_every_verb() {
    let shell = btrkit_tests::bin_path("btrkit-shell");
    let all = verbs();
    for v in &all {
        let o = Command::new(&shell)
            .args(["verbs", v])
            .output()
            .expect("verbs VERB");
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{v}: {}", text(&o));
        assert!(t.starts_with(v.as_str()), "{v}: syntax first:\n{t}");
        assert!(
            t.contains(&format!("Example: {v}")),
            "{v}: an example:\n{t}"
        );
    }
    let o = Command::new(&shell)
        .args(["verbs", "no-such-verb"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    interactive_help_and_history(&all);
}

/// `help VERB` in the interactive shell (on a terminal from script(1)), and
/// the history kept under $XDG_STATE_HOME.
fn interactive_help_and_history(all: &[String]) {
    if !have_cmd("script") {
        btrkit_tests::env::skip_part(
            "interactive help",
            "script(1) (util-linux) is not installed",
        );
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("i.img");
    let shell = btrkit_tests::bin_path("btrkit-shell");
    let mut c = Command::new(&shell)
        .arg(&img)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    c.stdin
        .take()
        .expect("stdin")
        .write_all(b"fssize 256M\nmkdir /d\n")
        .expect("write");
    let o = c.wait_with_output().expect("wait");
    assert!(o.status.success(), "{}", text(&o));
    let state = d.path().join("state");
    let mut lines: Vec<String> = all.iter().map(|v| format!("help {v}")).collect();
    lines.push("help".into());
    lines.push("quit".into());
    let cmd = format!("{} {}", shell.display(), img.display());
    let mut c = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("XDG_STATE_HOME", &state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script");
    let mut input = c.stdin.take().expect("stdin");
    let mut output = c.stdout.take().expect("stdout");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut output, &mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().expect("lock").extend_from_slice(&buf[..n]);
            }
        })
    };
    let prompts = || {
        String::from_utf8_lossy(&seen.lock().expect("lock"))
            .matches("btrkit> ")
            .count()
    };
    // One line after each prompt, as typed: a line editor in raw mode may
    // drop what was typed ahead.
    for (i, l) in lines.iter().enumerate() {
        let t0 = std::time::Instant::now();
        while prompts() <= i {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "no prompt {}: {}",
                i + 1,
                String::from_utf8_lossy(&seen.lock().expect("lock"))
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        input.write_all(format!("{l}\n").as_bytes()).expect("type");
        input.flush().expect("flush");
    }
    let status = c.wait().expect("wait");
    drop(input);
    reader.join().expect("reader");
    let out = String::from_utf8_lossy(&seen.lock().expect("lock")).replace('\r', "");
    assert!(status.success(), "{out}");
    for v in all {
        assert!(out.contains(&format!("Example: {v}")), "help {v}:\n{out}");
    }
    assert!(out.contains("help VERB shows one"), "{out}");
    let hist = std::fs::read_to_string(state.join("btrkit/shell_history")).expect("history file");
    assert!(
        hist.contains("help write") && hist.contains("help fsync"),
        "{hist}"
    );
}
