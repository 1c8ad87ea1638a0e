//! Every image of btrfs-progs' fsck-tests: btrkit-fsck's verdict must equal
//! the one in verdicts.tsv (corrupt images reported with errors, clean
//! images with no error at all), with and without --check-data-csum, and
//! no run may panic or hang.

use btrkit_tests::fsck_support::*;
use std::time::Duration;

#[test]
fn fsck_fixture_verdicts() {
    let dir = fixtures_dir();
    let Ok(tsv) = std::fs::read_to_string(dir.join("verdicts.tsv")) else {
        btrkit_tests::skip(&format!("{} not found", dir.display()));
        return;
    };
    if !have("tar") || !have("xz") {
        btrkit_tests::skip("tar/xz not available");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut wrong = Vec::new();
    let mut n = 0;
    for line in tsv.lines().skip(1) {
        let mut it = line.split('\t');
        let (Some(name), Some(expected)) = (it.next(), it.next()) else {
            continue;
        };
        let archive = dir.join(format!("{name}.tar.xz"));
        sh(&format!(
            "tar -xJf '{}' -C '{}'",
            archive.display(),
            tmp.path().display()
        ));
        let img = tmp.path().join(format!("{name}.raw"));
        for extra in [&[][..], &["--check-data-csum"][..]] {
            let r = run_fsck(&img, extra, Duration::from_secs(120));
            let got = match r.code {
                0 => "clean",
                4 => "corrupt",
                _ => "failed",
            };
            if got != expected || r.stderr.contains("panicked") {
                wrong.push(format!(
                    "{name} {extra:?}: expected {expected}, got {got} (exit {}): {:?} {}",
                    r.code,
                    r.errors().first(),
                    r.stderr
                ));
            }
        }
        let _ = std::fs::remove_file(&img);
        n += 1;
    }
    assert!(n >= 54, "only {n} fixtures listed");
    assert!(
        wrong.is_empty(),
        "{} of {n} verdicts wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
