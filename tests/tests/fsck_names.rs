//! btrkit-fsck on names the kernel refuses and on broken directory links,
//! in a kernel-made image with DIR_INDEX / DIR_ITEM items patched (their
//! checksums fixed): a name with `/`, with a NUL, `.`, `..`, an empty one
//! (only the DIR_INDEX patched, so the name's records disagree too), a
//! directory entry pointing back at an ancestor (a cycle), one naming the
//! root directory, and a second name of a directory (a hard-linked
//! directory). Each is an error naming the directory, the item's key and
//! the escaped name; the read-only check leaves the image as it was.

use btrkit_core::format::consts::*;
use btrkit_tests::fsck_support::{
    kernel_image, kernel_unavailable, patch_dir_entry, run_fsck, DIR_ITEM_DATA_LEN,
    DIR_ITEM_LOCATION, DIR_ITEM_NAME, DIR_ITEM_NAME_LEN,
};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// The findings of a read-only `btrkit-fsck --json`: (category, key as
/// "(objectid type offset)", message) of every error, and its exit code.
fn errors(img: &Path) -> (i32, Vec<(String, String, String)>) {
    let r = run_fsck(img, &[], Duration::from_secs(120));
    let v = r.json();
    let list = v["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings: {}{}", r.stdout, r.stderr))
        .iter()
        .filter(|f| f["severity"] == "error")
        .map(|f| {
            (
                f["category"].as_str().unwrap_or("").to_string(),
                format!(
                    "({} {} {})",
                    f["key"]["objectid"], f["key"]["type"], f["key"]["offset"]
                ),
                f["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    (r.code, list)
}

#[test]
fn refused_names_cycles_and_linked_directories_are_errors() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let inos = dir.path().join("inos");
    let img = kernel_image(
        dir.path(),
        "names.img",
        "",
        "",
        &format!(
            "mkdir -p d top/mid/loop p/q r/s && touch d/aaa d/bbb d/x d/xx d/e d/ok && \
             stat -c '%n %i' d top top/mid p/q r > '{}'",
            inos.display()
        ),
    );
    let ino: HashMap<String, u64> = std::fs::read_to_string(&inos)
        .unwrap()
        .lines()
        .map(|l| {
            let (n, i) = l.split_once(' ').unwrap();
            (n.to_string(), i.parse().unwrap())
        })
        .collect();
    let (d, top, mid, q, r) = (ino["d"], ino["top"], ino["top/mid"], ino["p/q"], ino["r"]);
    let (code, before) = errors(&img);
    assert_eq!(code, 0, "the kernel's image is clean: {before:?}");

    let index = &[BTRFS_DIR_INDEX_KEY][..];
    let both = &[BTRFS_DIR_INDEX_KEY, BTRFS_DIR_ITEM_KEY][..];
    let rename = |from: &[u8], to: &'static [u8]| {
        patch_dir_entry(&img, d, from, index, &|b, o| {
            b[o + DIR_ITEM_NAME..o + DIR_ITEM_NAME + to.len()].copy_from_slice(to)
        });
    };
    rename(b"aaa", b"a/a");
    rename(b"bbb", b"b\0b");
    rename(b"x", b".");
    rename(b"xx", b"..");
    patch_dir_entry(&img, d, b"e", index, &|b, o| {
        b[o + DIR_ITEM_NAME_LEN..o + DIR_ITEM_NAME_LEN + 2].copy_from_slice(&0u16.to_le_bytes());
        b[o + DIR_ITEM_DATA_LEN..o + DIR_ITEM_DATA_LEN + 2].copy_from_slice(&1u16.to_le_bytes());
    });
    let point = |dir: u64, name: &[u8], to: u64| {
        patch_dir_entry(&img, dir, name, both, &|b, o| {
            b[o + DIR_ITEM_LOCATION..o + DIR_ITEM_LOCATION + 8].copy_from_slice(&to.to_le_bytes())
        });
    };
    point(mid, b"loop", top);
    point(r, b"s", q);
    let image_before = std::fs::read(&img).unwrap();

    let (code, errs) = errors(&img);
    let shown = errs
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(code, 4, "{shown}");
    let has = |cat: &str, key: &str, msg: &str| {
        assert!(
            errs.iter()
                .any(|e| e.0 == cat && e.1.contains(key) && e.2.contains(msg)),
            "no {cat} error at {key} saying {msg:?} in:\n{shown}"
        );
    };
    let dir_index = format!("({d} {BTRFS_DIR_INDEX_KEY} ");
    for (name, why) in [
        ("a/a", "contains '/'"),
        ("b\\x00b", "contains a NUL byte"),
        (".", "is \".\""),
        ("..", "is \"..\""),
        ("", "is empty"),
    ] {
        has(
            "name",
            &dir_index,
            &format!("directory {d}: name \"{name}\" {why}, a name the kernel refuses"),
        );
    }
    // Only the DIR_INDEX was patched: its records disagree as well.
    assert!(
        errs.iter()
            .any(|e| e.0 == "name" && e.2.contains(&format!("name in directory {d} for inode"))),
        "{shown}"
    );
    has(
        "dir-link",
        &format!("({mid} {BTRFS_DIR_INDEX_KEY} "),
        &format!("directory {mid}: entry for directory {top} is a second name of it"),
    );
    has(
        "dir-link",
        &format!("({mid} {BTRFS_DIR_INDEX_KEY} "),
        "names one of the directory's own ancestors (a directory cycle",
    );
    has(
        "dir-link",
        &format!("({r} {BTRFS_DIR_INDEX_KEY} "),
        &format!("directory {r}: entry for directory {q} is a second name of it"),
    );
    assert!(
        std::fs::read(&img).unwrap() == image_before,
        "the read-only check wrote the image"
    );
}

#[test]
fn an_entry_naming_the_root_directory_is_a_cycle() {
    if let Some(why) = kernel_unavailable() {
        btrkit_tests::skip(&why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let inos = dir.path().join("inos");
    let img = kernel_image(
        dir.path(),
        "root.img",
        "",
        "",
        &format!("mkdir -p a/up && stat -c '%i' a > '{}'", inos.display()),
    );
    let a: u64 = std::fs::read_to_string(&inos)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    patch_dir_entry(
        &img,
        a,
        b"up",
        &[BTRFS_DIR_INDEX_KEY, BTRFS_DIR_ITEM_KEY],
        &|b, o| b[o..o + 8].copy_from_slice(&BTRFS_FIRST_FREE_OBJECTID.to_le_bytes()),
    );
    let (code, errs) = errors(&img);
    assert_eq!(code, 4, "{errs:?}");
    assert!(
        errs.iter().any(|e| e.0 == "dir-link"
            && e.1.contains(&format!("({a} {BTRFS_DIR_INDEX_KEY} "))
            && e.2.contains("names the subvolume's root directory")),
        "{errs:?}"
    );
}
