//! Running a script: every step in order; a failing step stops the run
//! with `SCRIPT:LINE: VERB: reason`; expectations are checked at the end,
//! against the state after the final crash and recovery.
//!
//! A script streams: a first pass reads the directives and expectations
//! and notes whether and where it crashes, keeping no steps; the second
//! parses and runs one line at a time. A script of a million lines costs
//! no more memory than one of a thousand. Standard input is spooled to an
//! unnamed temporary file first, so it can be read twice.

use btrkit_core::workload::content::{prepared_payload, warmup_steps};
use btrkit_core::workload::script::{StepSummary, StreamError};
use btrkit_core::workload::session::{Session, SessionOptions};
use btrkit_core::workload::{Script, Step};
use std::fs::File;
use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};

/// The script file, rewound (standard input spooled to a temporary file).
fn open_script(arg: &str) -> anyhow::Result<(String, File)> {
    if arg == "-" {
        let mut f = tempfile::tempfile()?;
        std::io::copy(&mut std::io::stdin().lock(), &mut f)?;
        f.rewind()?;
        return Ok(("-".into(), f));
    }
    let f = File::open(arg).map_err(|e| anyhow::anyhow!("cannot read {arg}: {e}"))?;
    Ok((arg.to_string(), f))
}

/// Whether an error leaves the filesystem as consistent as before the
/// step (a refusal, as the kernel refuses), so unmounting may commit.
fn is_refusal(e: &btrkit_core::Error) -> bool {
    matches!(
        e,
        btrkit_core::Error::Errno { .. } | btrkit_core::Error::NoSpace(_)
    )
}

/// Options a script's steps call for: crash support only when it crashes.
fn options_of(sum: &StepSummary) -> SessionOptions {
    SessionOptions {
        crashable: sum.crashes,
        record_writes: sum.keep_random,
    }
}

/// The image files of the session: IMAGE and the `--device` paths, or
/// the script's `devices N` named beside IMAGE.
pub fn session_paths(image: &Path, extra: &[PathBuf], script: &Script) -> Vec<PathBuf> {
    if extra.is_empty() {
        return btrkit_core::workload::session::device_paths(image, script.devices);
    }
    std::iter::once(image.to_path_buf())
        .chain(extra.iter().cloned())
        .collect()
}

pub fn run_script(image: &Path, extra: &[PathBuf], arg: &str, quiet: bool) -> i32 {
    let (name, mut file) = match open_script(arg) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("btrkit-shell: error: {e}");
            return 2;
        }
    };
    // First pass: directives, expectations and what the steps need.
    let mut sum = StepSummary::default();
    let first = Script::stream(&name, BufReader::new(&file), |line, st| {
        sum.add(line, st);
        Ok::<(), ()>(())
    });
    let script = match first {
        Ok(s) => s,
        Err(StreamError::Parse(e)) => {
            eprintln!("{name}:{}: {}", e.line, e.msg);
            return 2;
        }
        Err(StreamError::Step { .. }) => return 2,
    };
    if let Err(e) = file.rewind() {
        eprintln!("btrkit-shell: error: cannot read {name} again: {e}");
        return 2;
    }
    let paths = session_paths(image, extra, &script);
    let mut s = match Session::open_set(&paths, &script, &options_of(&sum)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("btrkit-shell: error: {}: {e}", image.display());
            return 1;
        }
    };
    if script.warmup == Some(true) {
        for st in warmup_steps() {
            if let Err(e) = s.apply(&st) {
                eprintln!("{name}: warm-up: {}: {e}", st.verb());
                let _ = s.close(is_refusal(&e));
                return 1;
            }
        }
    }
    // Second pass: each step as its line is read.
    let second = Script::stream_prepared(
        &name,
        BufReader::new(&file),
        prepared_payload,
        |line, st, payload| {
            let r = match st {
                Step::Crash { keep_random } if Some(line) == sum.final_crash_line => {
                    s.crash_final(*keep_random).map(|_| Default::default())
                }
                _ => s.apply_prepared(st, payload),
            };
            match r {
                Ok(out) => {
                    if let Some(t) = out.text {
                        println!("{t}");
                    }
                    Ok(())
                }
                Err(e) => Err((st.verb(), e)),
            }
        },
    );
    match second {
        Ok(_) => {}
        Err(StreamError::Parse(e)) => {
            // The first pass read the same bytes: only an I/O error or a
            // file changed under us gets here.
            eprintln!("{name}:{}: {}", e.line, e.msg);
            let _ = s.close(true);
            return 2;
        }
        Err(StreamError::Step {
            line,
            err: (verb, e),
        }) => {
            eprintln!("{name}:{line}: {verb}: {e}");
            let clean = is_refusal(&e);
            if let Err(e2) = s.close(clean) {
                eprintln!("btrkit-shell: error: unmounting: {e2}");
            }
            return 1;
        }
    }
    let fails = match s.check(&script) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{name}: checking expectations: {e}");
            let _ = s.close(false);
            return 1;
        }
    };
    for f in &fails {
        // "line N: what was found"
        let (line, msg) = f
            .strip_prefix("line ")
            .and_then(|r| r.split_once(": "))
            .unwrap_or(("?", f));
        eprintln!("{name}:{line}: expect: {msg}");
    }
    if let Err(e) = s.close(true) {
        eprintln!("btrkit-shell: error: unmounting: {e}");
        return 1;
    }
    if !fails.is_empty() {
        return 1;
    }
    if !quiet && !script.expects.is_empty() {
        eprintln!("{name}: {} expectation(s) hold", script.expects.len());
    }
    0
}
