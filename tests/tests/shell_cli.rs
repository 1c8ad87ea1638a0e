//! btrkit-shell as a user meets it: scripts from a file and from stdin, the
//! image made on demand, `SCRIPT:LINE: VERB: reason` on a failing step with
//! what the last commit made durable kept, failing expectations saying what
//! they found, bad images refused with one line and left untouched,
//! `stats --json`, and the interactive shell on a terminal.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn shell() -> PathBuf {
    btrkit_tests::bin_path("btrkit-shell")
}

fn run(img: &Path, script: &str) -> Output {
    let mut c = Command::new(shell())
        .arg(img)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn btrkit-shell");
    c.stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write script");
    c.wait_with_output().expect("wait")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fsck_clean(img: &Path) {
    let o = Command::new(btrkit_tests::bin_path("btrkit-fsck"))
        .arg("--check-data-csum")
        .arg("--check-mirrors")
        .arg(img)
        .output()
        .expect("btrkit-fsck");
    // A damaged DUP copy is only a warning (exit 0) but in what the shell
    // wrote it is a bug.
    assert!(
        o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("mirror-copy"),
        "btrkit-fsck: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn image_made_from_directives_and_checked() {
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("new.img");
    let o = run(&img, "mkfs -n 4096 --csum xxhash\nfssize 300M\nmkdir /d\nwrite /d/f 0 10K 0x61\nsync\nexpect size /d/f 10K\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&img).expect("image").len(), 300 << 20);
    fsck_clean(&img);
    // The default size is 512M.
    let img2 = d.path().join("default.img");
    let o = run(&img2, "write /f 0 1\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&img2).expect("image").len(), 512 << 20);
    // A script file works as stdin does, and reopens the same image; an
    // expectation that fails names what it found.
    let md5 = btrkit_core::workload::manifest::md5_hex(&vec![0x61u8; 10 << 10]);
    let scn = d.path().join("w.scn");
    std::fs::write(
        &scn,
        format!("expect size /d/f 10K\nexpect md5 /d/f {md5}\n"),
    )
    .expect("write");
    let o = Command::new(shell())
        .arg(&img)
        .arg(&scn)
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&scn, format!("expect md5 /d/f {}\n", "0".repeat(32))).expect("write");
    let o = Command::new(shell())
        .arg(&img)
        .arg(&scn)
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(&md5), "{}", stderr(&o));
}

#[test]
fn failing_step_names_line_and_keeps_what_was_committed() {
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("a.img");
    let scn = d.path().join("fail.scn");
    std::fs::write(
        &scn,
        "write /kept 0 8K 0x11\nsync\nwrite /kept 8K 4K 0x22\nunlink /missing\nwrite /never 0 4K\n",
    )
    .expect("write");
    let o = Command::new(shell())
        .arg(&img)
        .arg(&scn)
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    let want = format!("{}:4: unlink: ", scn.display());
    assert!(e.starts_with(&want) && e.contains("ENOENT"), "stderr: {e}");
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    fsck_clean(&img);
    // A refusal leaves the filesystem consistent, so unmounting committed
    // the step before it too; the step after never ran.
    let o = run(&img, "expect size /kept 12K\nexpect absent /never\n");
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn parse_errors_and_failed_expectations() {
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("p.img");
    let o = run(&img, "mkdir /a\nfrobnicate /a\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("-:2: "), "{}", stderr(&o));
    assert!(
        !img.exists(),
        "a script that does not parse must not create the image"
    );
    let o = run(
        &img,
        "write /f 0 5000\nexpect size /f 4096\nexpect absent /f\nexpect nlink /f 1\n",
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("-:2: expect:") && e.contains("5000"), "{e}");
    assert!(e.contains("-:3: expect:"), "{e}");
    assert!(!e.contains("-:4:"), "{e}");
}

#[test]
fn bad_images_are_refused_untouched() {
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("garbage.img");
    let bytes: Vec<u8> = (0..(4u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&img, &bytes).expect("write");
    let o = run(&img, "write /f 0 4K\nsync\n");
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    assert_eq!(
        std::fs::read(&img).expect("read"),
        bytes,
        "the image changed"
    );
    let o = run(&d.path().join("no/such/dir/x.img"), "sync\n");
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
}

#[test]
fn stats_json_reports_the_engine() {
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("s.img");
    let o = run(&img, "mount compress=zstd\nwrite /f 0 1M 0x00\nfsync /f\nwrite /g 0 100 0x01\nsync\nstats --json\n");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    // The fsync syncs the log; only `sync` commits.
    assert!(v["commits"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert_eq!(v["log_syncs"].as_u64(), Some(1), "{v}");
    assert_eq!(v["full_commits"].as_u64(), Some(0), "{v}");
    assert!(v["compressed_extents"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(v["inline_extents"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(v["bytes_written"]["data"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(v["ordered_extents"].as_u64().unwrap_or(0) >= 2, "{v}");
    assert!(v["fsyncs"].as_u64() == Some(1), "{v}");
}

/// The interactive shell needs a terminal: `script(1)` gives it one.
#[test]
fn interactive_shell_on_a_terminal() {
    if !btrkit_tests::fixtures::have_cmd("script") {
        btrkit_tests::skip("script(1) (util-linux) is not installed");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("i.img");
    let o = run(&img, "mkdir /dir\nwrite /dir/file 0 4K 0x41\nsync\n");
    assert!(o.status.success(), "{}", stderr(&o));
    let cmd = format!("{} {}", shell().display(), img.display());
    let mut c = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
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
    // One line at a time, each after its prompt, as typed (a line editor
    // in raw mode may drop what was typed ahead): a step, an inspection, a
    // bad line, an expectation, then quit (which unmounts and commits).
    let lines = [
        "write /dir/new 0 100 0x42",
        "ls /dir",
        "bogus",
        "expect size /dir/new 100",
        "quit",
    ];
    for (i, l) in lines.iter().enumerate() {
        let t0 = std::time::Instant::now();
        while prompts() <= i {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "no prompt {}: {}",
                i + 1,
                String::from_utf8_lossy(&seen.lock().expect("lock"))
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        input.write_all(format!("{l}\n").as_bytes()).expect("type");
        input.flush().expect("flush");
    }
    let status = c.wait().expect("wait");
    drop(input);
    reader.join().expect("reader");
    let o = Output {
        status,
        stdout: seen.lock().expect("lock").clone(),
        stderr: Vec::new(),
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("btrkit>"), "no prompt: {out}");
    assert!(
        out.contains("file") && out.contains("new"),
        "ls output: {out}"
    );
    assert!(out.contains("ok"), "expectation: {out}");
    let o = run(&img, "expect size /dir/new 100\nexpect size /dir/file 4K\n");
    assert!(o.status.success(), "{}", stderr(&o));
    fsck_clean(&img);
}

/// Peak RSS in KiB of btrkit-shell running `script` (a file) on `img`.
fn peak_rss_kib(img: &Path, script: &Path) -> (i64, String) {
    let (ok, rss, err) =
        btrkit_tests::sys::run_peak_rss(Command::new(shell()).arg(img).arg(script).arg("-q"))
            .expect("run btrkit-shell");
    assert!(ok, "btrkit-shell failed: {err}");
    (rss, err)
}

/// A script streams: it is parsed and run a line at a time, so 200,000
/// lines cost no more memory than 1,000 (the whole text and its parsed
/// steps used to be held; 200,000 lines of steps were tens of MiB). A bad
/// line anywhere is found before the image is touched.
#[test]
fn a_long_script_streams_in_constant_memory() {
    let d = tempfile::tempdir().expect("tempdir");
    let mut rss = Vec::new();
    for n in [1_000usize, 200_000] {
        let script = d.path().join(format!("s{n}.scn"));
        let mut text = String::from("fssize 256M\nmkdir /d\nwrite /d/f 0 4K 0x61\n");
        for i in 0..n {
            // Steps that keep nothing: a stat and a comment-padded read.
            if i % 2 == 0 {
                text += "stat /d/f\n";
            } else {
                text += "read /d/f 0 16            # some padding to make the line longer than a step\n";
            }
        }
        text += "sync\nexpect size /d/f 4K\n";
        std::fs::write(&script, text).expect("script");
        let img = d.path().join(format!("s{n}.img"));
        rss.push(peak_rss_kib(&img, &script).0);
    }
    assert!(
        rss[1] < rss[0] + 8 * 1024,
        "peak RSS {} KiB for 200,000 lines against {} KiB for 1,000",
        rss[1],
        rss[0]
    );

    // A bad line at the end stops the script before it runs anything.
    let img = d.path().join("bad.img");
    let o = run(&img, "write /f 0 4K\nsync\nbogus verb\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("-:3:"), "{}", stderr(&o));
    assert!(!img.exists(), "a script that does not parse made an image");
}
