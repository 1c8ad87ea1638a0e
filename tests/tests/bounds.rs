//! No tool sizes an allocation by a field from disk: a kernel crash image
//! whose logged file extent claims 2^45 bytes over its 64 KiB of data
//! once made replay, `replay --salvage`, restore and the mount abort on a
//! 34 GB allocation (the checksums of the claimed range). Every tool now
//! runs under a 1 GiB address-space limit and answers with a clear line:
//! replay and restore name the item and refuse, salvage and `restore
//! --salvage` leave the file as committed, fsck and `dump log` report the
//! item.

use btrkit_tests::fsck_support::{find_log_item, patch_block};
use btrkit_tests::{require_kernel_mount, skip_unless, KernelImage, MkfsOpts};
use std::path::Path;
use std::process::{Command, Output};

/// The limit every tool runs under (`prlimit --as`): far above what they
/// need for this image, far below the allocation they once made.
const LIMIT: u64 = 1 << 30;

fn bin(name: &str) -> String {
    btrkit_tests::bin_path(name).display().to_string()
}

/// Run `args` (a binary and its arguments) under the address-space limit.
fn limited(args: &[&str]) -> Output {
    let o = Command::new("prlimit")
        .arg(format!("--as={LIMIT}"))
        .arg("--")
        .args(args)
        .output()
        .expect("prlimit");
    // A failed allocation aborts (SIGABRT), a panic exits 101.
    use std::os::unix::process::ExitStatusExt;
    assert!(
        o.status.signal().is_none() && o.status.code() != Some(101),
        "{args:?} died: {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A kernel crash image whose fsync log holds `f` (64 KiB written and
/// fsynced after the last commit), its logged extent then claiming 2^45
/// bytes.
fn crash_with_huge_logged_extent(k: &KernelImage) -> std::path::PathBuf {
    std::fs::write(k.path("f"), vec![0x61u8; 65536]).unwrap();
    std::fs::File::open(k.path("f"))
        .unwrap()
        .sync_all()
        .unwrap();
    let c = k.crash_copy("huge.img");
    let img = k.dir().join("huge.img");
    std::fs::copy(&c.path, &img).unwrap();
    let at = find_log_item(&img, 0, &|key, _| {
        key.ty == btrkit_core::format::consts::BTRFS_EXTENT_DATA_KEY
    })
    .expect("a logged file extent");
    // num_bytes: the last 8 bytes of the 53-byte item.
    patch_block(&img, at.bytenr, true, true, &|b| {
        b[at.data_off + 45..at.data_off + 53].copy_from_slice(&(1u64 << 45).to_le_bytes())
    });
    img
}

#[test]
fn a_logged_extent_of_2_45_bytes_costs_no_memory() {
    skip_unless!(require_kernel_mount());
    let k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    let img = crash_with_huge_logged_extent(&k);
    let p = img.display().to_string();
    let w = k.dir();
    let out = |n: &str| w.join(n).display().to_string();
    let before = std::fs::read(&img).unwrap();

    // replay: refused, naming the item, pointing at --salvage.
    let o = limited(&[&bin("btrkit-replay"), &p, "-o", &out("r.img")]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("num_bytes 35184372088832 exceeds ram_bytes 65536") && t.contains("--salvage"),
        "{t}"
    );
    // replay --salvage: the rest of the log replays, the file is left out.
    let o = limited(&[
        &bin("btrkit-replay"),
        &p,
        "--salvage",
        "-o",
        &out("s.img"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("exceeds ram_bytes"), "{}", text(&o));

    // restore: says the log cannot be replayed, naming the item, and reads
    // what --salvage gets (exit 1: fsynced files may be at their last
    // commit); with --salvage asked, the same without the warning's exit.
    let o = limited(&[&bin("btrkit-restore"), &p, &out("rest")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("(257 108 0)") && text(&o).contains("cannot be replayed"),
        "{}",
        text(&o)
    );
    let o = limited(&[&bin("btrkit-restore"), &p, &out("rest2"), "--salvage"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(Path::new(&out("rest2")).is_dir());

    // fsck and dump log report it.
    let o = limited(&[&bin("btrkit-fsck"), &p]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("log-extent"), "{}", text(&o));
    let o = limited(&[&bin("btrkit-dump"), "log", &p]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("35184372088832"), "{}", text(&o));

    assert!(
        std::fs::read(&img).unwrap() == before,
        "a tool wrote the image"
    );
}
