//! The random differential sweeps of the fsync log writer: two families of
//! workload scripts, each ending in a crash, run on the kernel and through
//! btrkit's engine ([`crate::logcheck`] judges a pair), and a shrinker that
//! cuts a disagreement down to a short script to keep as a regression.
//!
//! - namespace: mkdir, create, small writes, renames (and exchanges) of files and
//!   directories across parents, onto existing names and back to old names,
//!   links, unlinks, rmdirs, fsync of any inode, sync, over a tree of three
//!   or four levels with a handful of reused names;
//! - data: writes at unaligned offsets and past the end, truncates up and
//!   down, fallocate with and without keep-size, punch, zero-range, clone,
//!   replace by rename, fsync, fdatasync, sync_file_range.
//!
//! Every step a generator writes is one the model ([`crate::fsmodel`])
//! accepts, so the kernel never refuses one.

use crate::fsmodel::{join, split, Model, BLOCK, FIRST_INO_AFTER_WARMUP};
use crate::kcrash::Scenario;
#[cfg(test)]
use crate::kcrash::Step;
use btrkit_core::util::prng::Prng;

/// One of `v`, drawn from `r` (`v` is never empty: the model always has
/// the root and at least the files a script made).
fn one<'a, T>(r: &mut Prng, v: &'a [T]) -> &'a T {
    &v[r.below(v.len() as u64) as usize]
}

/// The generator of one seed of one family.
fn generator(seed: u64, family: u64) -> Prng {
    Prng::new(Prng::derive(seed, family))
}

/// A script being written: each step is checked against the model first.
struct Writer {
    model: Model,
    lines: Vec<String>,
}

impl Writer {
    fn new() -> Writer {
        Writer {
            model: Model::new(FIRST_INO_AFTER_WARMUP),
            lines: vec!["expect-log any".into()],
        }
    }

    /// Add `line` when the model accepts it; whether it did.
    fn step(&mut self, line: String) -> bool {
        let Ok(s) = Scenario::parse("gen", &format!("{line}\n")) else {
            return false;
        };
        let Some((_, st)) = s.steps.into_iter().next() else {
            return false;
        };
        let mut m = self.model.clone();
        if m.apply(&st).is_err() {
            return false;
        }
        self.model = m;
        self.lines.push(line);
        true
    }

    fn text(mut self) -> String {
        self.lines.push("crash".into());
        self.lines.join("\n") + "\n"
    }
}

const NAMES: &[&str] = &["a", "b", "c", "d", "x", "foo"];
const FAMILY_NS: u64 = 0x6e73;
const FAMILY_DATA: u64 = 0x6461;

/// A path of the namespace family's tree: a name of the pool in one of the
/// directories no deeper than three levels.
fn ns_new_path(w: &Writer, r: &mut Prng) -> String {
    let dirs: Vec<String> = w
        .model
        .dirs()
        .into_iter()
        .filter(|d| d.matches('/').count() <= 3 || d == "/")
        .collect();
    let dir = one(r, &dirs).clone();
    let name = *one(r, NAMES);
    join(&dir, name)
}

/// The namespace family, seed `seed`.
pub fn namespace_script(seed: u64) -> String {
    let r = &mut generator(seed, FAMILY_NS);
    let mut w = Writer::new();
    // Where each inode has been, so renames go back to old names.
    let mut history: std::collections::HashMap<u64, Vec<String>> = Default::default();
    let (dirs, files) = (2 + r.below(4), 2 + r.below(4));
    let mut made = 0;
    for _ in 0..40 {
        if made >= dirs {
            break;
        }
        let p = ns_new_path(&w, r);
        made += w.step(format!("mkdir {p}")) as u64;
    }
    made = 0;
    for _ in 0..40 {
        if made >= files {
            break;
        }
        let p = ns_new_path(&w, r);
        let line = if r.chance(50, 100) {
            format!("create {p}")
        } else {
            format!(
                "write {p} 0 {} 0x{:02x}",
                one(r, &[100u64, 3000, 70000]),
                1 + r.below(254)
            )
        };
        made += w.step(line) as u64;
    }
    w.lines.push("sync".into());
    for (p, ino) in w.model.paths() {
        history.entry(ino).or_default().push(p);
    }
    let ops = 8 + r.below(18);
    let mut done = 0;
    for _ in 0..ops * 8 {
        if done >= ops {
            break;
        }
        let all: Vec<(String, u64)> = w.model.paths();
        let nonroot: Vec<&(String, u64)> = all.iter().filter(|(p, _)| p != "/").collect();
        let op = r.below(100);
        let line = if op < 8 {
            format!("mkdir {}", ns_new_path(&w, r))
        } else if op < 18 {
            format!("create {}", ns_new_path(&w, r))
        } else if op < 23 {
            let files = w.model.files();
            if files.is_empty() {
                continue;
            }
            format!(
                "write {} {} {} 0x{:02x}",
                one(r, &files),
                one(r, &[0u64, 100, 4096]),
                one(r, &[10u64, 3000]),
                1 + r.below(254)
            )
        } else if op < 29 && nonroot.len() >= 2 {
            // Two names trade inodes (renameat2 RENAME_EXCHANGE).
            let (a, ia) = (*one(r, &nonroot)).clone();
            let (b, ib) = (*one(r, &nonroot)).clone();
            if a == b || !w.model.exchange_ok(&a, &b) {
                continue;
            }
            history.entry(ia).or_default().push(b.clone());
            history.entry(ib).or_default().push(a.clone());
            format!("exchange {a} {b}")
        } else if op < 50 && !nonroot.is_empty() {
            let (src, ino) = (*one(r, &nonroot)).clone();
            let old: Vec<String> = history
                .get(&ino)
                .map(|v| v.iter().filter(|p| **p != src).cloned().collect())
                .unwrap_or_default();
            let dst = if !old.is_empty() && r.chance(35, 100) {
                one(r, &old).clone()
            } else if r.chance(30, 100) {
                // Onto an existing name.
                one(r, &nonroot).0.clone()
            } else {
                ns_new_path(&w, r)
            };
            if !w.model.rename_ok(&src, &dst) {
                continue;
            }
            history.entry(ino).or_default().push(dst.clone());
            format!("rename {src} {dst}")
        } else if op < 56 {
            let files = w.model.files();
            if files.is_empty() {
                continue;
            }
            format!("link {} {}", one(r, &files), ns_new_path(&w, r))
        } else if op < 64 {
            let files = w.model.files();
            if files.is_empty() {
                continue;
            }
            format!("unlink {}", one(r, &files))
        } else if op < 69 {
            let dirs: Vec<String> = w.model.dirs().into_iter().filter(|d| d != "/").collect();
            if dirs.is_empty() {
                continue;
            }
            format!("rmdir {}", one(r, &dirs))
        } else if op < 94 {
            format!("fsync {}", one(r, &all).0)
        } else if op < 97 {
            let files = w.model.files();
            if files.is_empty() {
                continue;
            }
            format!("fdatasync {}", one(r, &files))
        } else {
            "sync".to_string()
        };
        if w.step(line) {
            done += 1;
            if let Some(last) = w.lines.last() {
                // A new inode's first path.
                if last.starts_with("mkdir") || last.starts_with("create") {
                    let p = last.split_whitespace().nth(1).unwrap_or("").to_string();
                    if let Some(ino) = w.model.lookup(&p) {
                        history.entry(ino).or_default().push(p);
                    }
                }
            }
        }
    }
    let all = w.model.paths();
    let last = one(r, &all).0.clone();
    w.step(format!("fsync {last}"));
    w.text()
}

/// The data family, seed `seed`.
pub fn data_script(seed: u64) -> String {
    let r = &mut generator(seed, FAMILY_DATA);
    let mut w = Writer::new();
    w.step("mkdir /d".into());
    let names = ["/f0", "/f1", "/d/f2", "/d/f3"];
    let nfiles = 2 + r.below(3) as usize;
    for f in &names[..nfiles] {
        w.step(format!(
            "write {f} 0 {} 0x{:02x}",
            one(r, &[100u64, 5000, 70000, 300000]),
            1 + r.below(254)
        ));
    }
    w.lines.push("sync".into());
    let ops = 6 + r.below(16);
    let mut done = 0;
    let mut tmp = 0;
    for _ in 0..ops * 8 {
        if done >= ops {
            break;
        }
        let files = w.model.files();
        if files.is_empty() {
            break;
        }
        let f = one(r, &files).clone();
        let size = w.model.size(w.model.lookup(&f).unwrap_or(0));
        let off_choices = [
            0,
            1,
            4095,
            4096,
            10000,
            65536,
            262144,
            532480,
            size,
            size + 1 + r.below(20000),
            size.saturating_sub(1 + r.below(3000)),
        ];
        let off = *one(r, &off_choices);
        let len = *one(r, &[1u64, 500, 4096, 4097, 20000, 81920]);
        let byte = 1 + r.below(254);
        let op = r.below(100);
        let lines: Vec<String> = if op < 22 {
            vec![format!("write {f} {off} {len} 0x{byte:02x}")]
        } else if op < 30 {
            let to = *one(
                r,
                &[0u64, 1000, 4096, 100000, 400000, size / 2, size + 5000],
            );
            vec![format!("truncate {f} {to}")]
        } else if op < 37 {
            let keep = if r.chance(50, 100) { " keep" } else { "" };
            vec![format!(
                "fallocate {f} {} {}{keep}",
                off / BLOCK * BLOCK,
                one(r, &[4096u64, 65536])
            )]
        } else if op < 43 {
            vec![format!("punch {f} {off} {len}")]
        } else if op < 49 {
            let keep = if r.chance(50, 100) { " keep" } else { "" };
            vec![format!("zero-range {f} {off} {len}{keep}")]
        } else if op < 56 {
            let src = one(r, &files).clone();
            let ssize = w.model.size(w.model.lookup(&src).unwrap_or(0));
            if ssize == 0 {
                continue;
            }
            let so = r.below(ssize.div_ceil(BLOCK)) * BLOCK;
            let blocks = r.below(4);
            let clen = if blocks == 0 { 0 } else { blocks * BLOCK };
            let dso = *one(r, &[0u64, 4096, 16384, size.div_ceil(BLOCK) * BLOCK]);
            vec![format!("clone {src} {so} {f} {dso} {clen}")]
        } else if op < 62 {
            // Replace by rename: a new file, or another of the files.
            if r.chance(60, 100) {
                tmp += 1;
                let t = join(&split(&f).0, &format!("t{tmp}"));
                vec![
                    format!("create {t}"),
                    format!(
                        "write {t} 0 {} 0x{byte:02x}",
                        one(r, &[100u64, 5000, 70000])
                    ),
                    format!("rename {t} {f}"),
                ]
            } else {
                let other = one(r, &files).clone();
                vec![format!("rename {other} {f}")]
            }
        } else if op < 80 {
            vec![format!("fsync {f}")]
        } else if op < 88 {
            vec![format!("fdatasync {f}")]
        } else if op < 96 {
            let flags = one(
                r,
                &["write", "write|wait_after", "wait_before|write|wait_after"],
            );
            vec![format!(
                "sync-range {f} {} {} {flags}",
                off / BLOCK * BLOCK,
                len
            )]
        } else {
            vec!["sync".to_string()]
        };
        let mut trial = Writer {
            model: w.model.clone(),
            lines: Vec::new(),
        };
        if lines.into_iter().all(|l| trial.step(l)) {
            w.model = trial.model;
            w.lines.extend(trial.lines);
            done += 1;
        }
    }
    let files = w.model.files();
    if !files.is_empty() {
        let f = one(r, &files).clone();
        let verb = if r.chance(70, 100) {
            "fsync"
        } else {
            "fdatasync"
        };
        w.step(format!("{verb} {f}"));
    }
    w.text()
}

/// Whether a line is a step the shrinker may drop (directives, the crash
/// and comments stay).
fn droppable(line: &str) -> bool {
    let t = line.trim_start();
    let verb = t.split_whitespace().next().unwrap_or("");
    !(t.is_empty()
        || t.starts_with('#')
        || matches!(
            verb,
            "mkfs" | "fssize" | "mount" | "devices" | "expect-log" | "expect" | "warmup" | "crash"
        ))
}

/// Cut `text` down to a script that still `fails`: whole runs of steps go
/// while the failure stays (ddmin over the step lines, largest runs
/// first), then single steps once more. `fails` is asked for scripts that
/// may not even run; it answers false for those.
pub fn shrink(text: &str, mut fails: impl FnMut(&str) -> bool) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let render = |l: &[String]| l.join("\n") + "\n";
    let mut chunk = lines
        .iter()
        .filter(|l| droppable(l))
        .count()
        .div_ceil(2)
        .max(1);
    loop {
        let mut changed = false;
        let mut i = 0;
        loop {
            let idx: Vec<usize> = (0..lines.len()).filter(|&k| droppable(&lines[k])).collect();
            if i >= idx.len() {
                break;
            }
            let cut: Vec<usize> = idx[i..(i + chunk).min(idx.len())].to_vec();
            let trial: Vec<String> = lines
                .iter()
                .enumerate()
                .filter(|(k, _)| !cut.contains(k))
                .map(|(_, l)| l.clone())
                .collect();
            if fails(&render(&trial)) {
                lines = trial;
                changed = true;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 && !changed {
            break;
        }
        if !changed {
            chunk = chunk.div_ceil(2);
        }
    }
    render(&lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_scripts_parse_and_the_model_accepts_every_step() {
        for seed in 1..300 {
            for text in [namespace_script(seed), data_script(seed)] {
                let s = Scenario::parse("t", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                let steps: Vec<Step> = s.steps.into_iter().map(|(_, s)| s).collect();
                crate::fsmodel::promises(&steps, FIRST_INO_AFTER_WARMUP)
                    .unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert!(text.trim_end().ends_with("crash"));
            }
        }
    }

    #[test]
    fn namespace_scripts_rename_directories_and_reuse_names() {
        let all: String = (1..200).map(namespace_script).collect();
        assert!(all.contains("rename /"), "renames");
        assert!(all.matches("exchange /").count() > 50, "exchanges");
        assert!(all.contains("rmdir "), "rmdirs");
        assert!(all.contains("link "), "links");
    }

    #[test]
    fn shrink_keeps_only_what_the_failure_needs() {
        let text = "expect-log any\nmkdir /a\nmkdir /b\ncreate /a/x\nsync\nrename /a/x /b/x\nfsync /b\ncrash\n";
        let out = shrink(text, |t| {
            t.contains("rename /a/x /b/x") && t.contains("fsync /b")
        });
        assert_eq!(out, "expect-log any\nrename /a/x /b/x\nfsync /b\ncrash\n");
    }
}
