//! `btrkit subvolume`, `btrkit property` and `btrkit filesystem label` on
//! images against btrfs(8) on the kernel's mount of the same image: the
//! same list (ids, generations, parents, paths, uuids), the same
//! properties and label after btrkit changed them; btrfs check clean;
//! refusals change nothing.

use btrkit_tests::mount::LoopMount;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::rich::{build_rich, RichOpts};
use btrkit_tests::sys::must_run;
use btrkit_tests::{bin_path, env, skip_unless, MkfsOpts};
use std::path::Path;
use std::process::Command;

fn btrkit(img: &Path, args: &[&str]) -> String {
    let o = must_run(Command::new(bin_path("btrkit")).args(args).arg(img));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn btrkit_fails(img: &Path, args: &[&str]) -> String {
    let o = Command::new(bin_path("btrkit"))
        .args(args)
        .arg(img)
        .output()
        .unwrap();
    assert!(!o.status.success(), "btrkit {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What btrfs(8) says on a read-only mount of the top level.
fn kernel_says(img: &Path, args: &[&[&str]]) -> Vec<String> {
    let m = LoopMount::new(img, "ro,subvolid=5").unwrap();
    let out = args
        .iter()
        .map(|a| {
            let mut c = Command::new("btrfs");
            c.args(&a[..a.len() - 1]);
            c.arg(m.path().join(a[a.len() - 1].trim_start_matches('/')));
            String::from_utf8_lossy(&must_run(&mut c).stdout).into_owned()
        })
        .collect();
    drop(m);
    out
}

fn clean(img: &Path, what: &str) {
    let v = oracle::btrfs_check(&[img], Progs::Distro).unwrap();
    assert!(v.clean, "{what}: {}", v.output);
    if env::require_progs_new() {
        let v = oracle::btrfs_check(&[img], Progs::New).unwrap();
        assert!(v.clean, "{what}: 6.14: {}", v.output);
    }
}

#[test]
fn subvolumes_properties_and_label_as_btrfs_shows_them() {
    skip_unless!(env::require_kernel_mount());
    let k = build_rich(&RichOpts {
        mkfs: MkfsOpts::default().size(1 << 30),
        many_files: 300,
        ..Default::default()
    });
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("s.img");
    btrkit_tests::kcrash::copy_sparse(k.image(), &img).unwrap();
    let list = ["subvolume", "list", "-p", "-u", "-q", "-R", "/"];
    assert_eq!(
        btrkit(&img, &["subvolume", "list", "-p", "-u", "-q", "-R"]),
        kernel_says(&img, &[&list])[0],
        "the kernel-made image's subvolumes"
    );

    btrkit(&img, &["subvolume", "create", "/made"]);
    btrkit(&img, &["subvolume", "create", "/made/inner"]);
    btrkit(&img, &["subvolume", "snapshot", "-r", "/made", "/made-ro"]);
    btrkit(&img, &["subvolume", "snapshot", "/made", "/compressed"]);
    btrkit(&img, &["subvolume", "delete", "/topsnap"]);
    btrkit(&img, &["property", "set", "/made", "ro", "true"]);
    btrkit(&img, &["property", "set", "/made-ro", "ro", "false"]);
    btrkit(&img, &["property", "set", "/data", "compression", "zstd"]);
    btrkit(&img, &["property", "set", "/inline", "compression", "lzo"]);
    btrkit(&img, &["property", "set", "/inline", "compression", ""]);
    btrkit(&img, &["filesystem", "label", "a label"]);
    btrkit(&img, &["subvolume", "set-default", "/made-ro"]);
    clean(&img, "after btrkit's changes");

    let said = kernel_says(
        &img,
        &[
            &list,
            &["property", "get", "/made"],
            &["property", "get", "/made-ro"],
            &["property", "get", "/data"],
            &["property", "get", "/inline"],
            &["filesystem", "label", "/"],
            &["subvolume", "get-default", "/"],
        ],
    );
    assert_eq!(
        btrkit(&img, &["subvolume", "list", "-p", "-u", "-q", "-R"]),
        said[0]
    );
    assert!(
        said[0].contains("path made/inner") && !said[0].contains("topsnap"),
        "{}",
        said[0]
    );
    assert_eq!(btrkit(&img, &["property", "get", "/made", "ro"]), said[1]);
    assert_eq!(said[1].trim(), "ro=true");
    assert_eq!(said[2].trim(), "ro=false");
    assert_eq!(
        btrkit(&img, &["property", "get", "/data", "compression"]),
        said[3]
    );
    assert_eq!(said[3].trim(), "compression=zstd");
    assert_eq!(said[4].trim(), "");
    assert_eq!(btrkit(&img, &["filesystem", "label"]), said[5]);
    assert_eq!(said[5].trim(), "a label");
    assert_eq!(btrkit(&img, &["subvolume", "get-default"]), said[6]);

    // The kernel mounts the default (made-ro) and writes to it.
    let m = LoopMount::new(&img, "").unwrap();
    std::fs::write(m.path().join("written-by-the-kernel"), b"x").unwrap();
    drop(m);
    clean(&img, "written by the kernel");

    // Refusals: nothing changes.
    let before = std::fs::read(&img).unwrap();
    for (args, says) in [
        (&["subvolume", "delete", "/data"][..], "not a subvolume"),
        (&["subvolume", "create", "/made"][..], "exists"),
        (
            &["property", "set", "/data", "ro", "true"][..],
            "not a subvolume",
        ),
        (
            &["property", "set", "/made", "ro", "maybe"][..],
            "true or false",
        ),
        (
            &["property", "set", "/data", "bogus", "1"][..],
            "unknown property",
        ),
        (
            &["filesystem", "label", "--set", &"x".repeat(300)][..],
            "too long",
        ),
    ] {
        let e = btrkit_fails(&img, args);
        assert!(e.contains(says), "{args:?}: {e}");
    }
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refusal changed the image"
    );
    let m = LoopMount::new(&img, "ro").unwrap();
    let e = btrkit_fails(&img, &["subvolume", "create", "/x"]);
    assert!(e.contains("in use"), "{e}");
    drop(m);
}
