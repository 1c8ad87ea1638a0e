//! Running a script: every step in order; a failing step stops the run
//! with `SCRIPT:LINE: VERB: reason`; expectations are checked at the end,
//! against the state after the final crash and recovery.

use btrkit_core::workload::content::warmup_steps;
use btrkit_core::workload::session::{Session, SessionOptions};
use btrkit_core::workload::{Script, Step};
use std::io::Read;
use std::path::Path;

fn read_script(arg: &str) -> anyhow::Result<(String, String)> {
    if arg == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        return Ok(("-".into(), s));
    }
    let text =
        std::fs::read_to_string(arg).map_err(|e| anyhow::anyhow!("cannot read {arg}: {e}"))?;
    Ok((arg.to_string(), text))
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
pub fn session_options(script: &Script) -> SessionOptions {
    let crashes = script.steps.iter().any(|(_, s)| s.is_crash());
    let keep = script.steps.iter().any(|(_, s)| {
        matches!(
            s,
            Step::Crash {
                keep_random: Some(_)
            }
        )
    });
    SessionOptions {
        crashable: crashes,
        record_writes: keep,
    }
}

pub fn run_script(image: &Path, arg: &str, quiet: bool) -> i32 {
    let (name, text) = match read_script(arg) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("btrkit-shell: error: {e}");
            return 2;
        }
    };
    let script = match Script::parse(&name, &text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}:{}: {}", e.line, e.msg);
            return 2;
        }
    };
    let mut s = match Session::open(image, &script, &session_options(&script)) {
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
    let final_crash = script.final_crash();
    for (i, (line, st)) in script.steps.iter().enumerate() {
        let r = match st {
            Step::Crash { keep_random } if Some(i) == final_crash => {
                s.crash_final(*keep_random).map(|_| Default::default())
            }
            _ => s.apply(st),
        };
        match r {
            Ok(out) => {
                if let Some(t) = out.text {
                    println!("{t}");
                }
            }
            Err(e) => {
                eprintln!("{name}:{line}: {}: {e}", st.verb());
                let clean = is_refusal(&e);
                if let Err(e2) = s.close(clean) {
                    eprintln!("btrkit-shell: error: unmounting: {e2}");
                }
                return 1;
            }
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
