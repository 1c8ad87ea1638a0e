//! Images made by the Linux kernel with every feature we can reach from a
//! loop mount (compression, subvolumes, snapshots, reflinks, prealloc,
//! inline extents, holes, xattrs, hard links, special files, a deleted
//! subvolume, fsync log trees) must check clean, as `btrfs check` says.

use btrkit_tests::fsck_support::*;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::LoopMount;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn kernel_ready() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    for p in [
        "mkfs.btrfs",
        "btrfs",
        "mount",
        "umount",
        "xfs_io",
        "setfattr",
    ] {
        if !have(p) {
            return Some(format!("{p} not installed"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices".into());
    }
    None
}

/// mkfs.btrfs (6.2 to 6.14, as measured) leaves free space tree entries for its temporary
/// chunks, which upstream `btrfs check` now reports (fsck-tests 058); so the
/// free space tree is left to the kernel, which builds it at the first
/// mount from the block groups that exist.
fn mkfs(dir: &Path, name: &str, size: &str, args: &str) -> PathBuf {
    let img = dir.join(name);
    sh(&format!(
        "truncate -s {size} '{}' && mkfs.btrfs -q -f -R ^free-space-tree {args} '{}'",
        img.display(),
        img.display()
    ));
    img
}

/// A workload touching every on-disk feature reachable from userspace.
const POPULATE: &str = r#"
set -e
mkdir -p d1/d2 d3
for i in $(seq 1 1500); do echo "small file $i" > d1/f$i; done
for i in $(seq 1 40); do mkdir d1/d2/sub$i; echo x > d1/d2/sub$i/file; done
head -c 3000000 /dev/urandom > big
yes "compressible text line" | head -c 4000000 > comp
cp --reflink=always big big.clone
cp --reflink=always comp d3/comp.clone
xfs_io -f -c "falloc 0 4m" -c "pwrite 1m 64k" prealloc >/dev/null
xfs_io -f -c "falloc -k 0 1m" keepsize >/dev/null
xfs_io -f -c "pwrite 0 64k" -c "pwrite 1m 64k" -c "truncate 3m" sparse >/dev/null
xfs_io -f -c "pwrite 0 8k" -c "reflink prealloc 1m 4m 64k" mixed >/dev/null
setfattr -n user.a -v hello d1/f1
setfattr -n user.long -v "$(head -c 2000 /dev/zero | tr '\0' x)" big
ln d1/f2 d3/hardlink
ln d1/f2 d1/d2/hardlink2
ln -s ../big d3/sym
mkfifo d3/fifo
touch nocow && chattr +C nocow && head -c 200000 /dev/urandom > nocow
touch nocow.clone && chattr +C nocow.clone && cp --reflink=always nocow nocow.clone
btrfs -q subvolume create sv
cp -a d1/d2 sv/
btrfs -q subvolume create sv/nested
echo nested > sv/nested/file
btrfs -q subvolume snapshot . snap
btrfs -q subvolume snapshot -r sv sv-ro
rm d1/f3 d1/f4
echo appended >> d1/f5
for i in $(seq 100 400); do echo changed > d1/f$i; done
btrfs -q subvolume create doomed
cp -a d1/d2 doomed/
sync
btrfs -q subvolume delete doomed
"#;

fn populate(mnt: &Path) {
    sh(&format!("cd '{}' && {}", mnt.display(), POPULATE));
}

fn assert_clean(img: &Path, what: &str) {
    let r = run_fsck(img, &[], Duration::from_secs(300));
    assert_eq!(
        r.code,
        0,
        "{what}: btrkit-fsck exit {}: {:?}\n{}",
        r.code,
        r.errors(),
        r.stderr
    );
    let r = run_fsck(img, &["--check-data-csum"], Duration::from_secs(300));
    assert_eq!(
        r.code,
        0,
        "{what} --check-data-csum: exit {}: {:?}",
        r.code,
        r.errors()
    );
    if let Ok(v) = oracle::btrfs_check(&[img], Progs::Distro) {
        assert!(v.clean, "{what}: btrfs check disagrees: {}", v.stderr);
    }
}

#[test]
fn fsck_kernel_feature_images_clean() {
    if let Some(why) = kernel_ready() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    for (name, mkfs_args, mount_opts) in [
        ("default-zstd.img", "", "compress=zstd"),
        (
            "holes-lzo.img",
            "-O ^no-holes -n 4096",
            "compress-force=lzo",
        ),
        (
            "zlib-64k-xxhash.img",
            "-n 65536 --csum xxhash",
            "compress=zlib",
        ),
        (
            "sha256-blake.img",
            "--csum sha256 -m single",
            "compress=zstd:1",
        ),
        ("blake2-mixed.img", "--csum blake2 -M", "compress=zlib"),
    ] {
        let img = mkfs(tmp.path(), name, "512M", mkfs_args);
        {
            let m = LoopMount::new(&img, &format!("space_cache=v2,{mount_opts}")).expect("mount");
            populate(m.path());
        }
        assert_clean(&img, name);
    }
}

#[test]
fn fsck_kernel_log_tree_clean() {
    if let Some(why) = kernel_ready() {
        btrkit_tests::skip(&why);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = mkfs(tmp.path(), "log.img", "512M", "");
    let crash = tmp.path().join("crash.img");
    {
        let m = LoopMount::new(&img, "space_cache=v2,commit=600,compress=zstd").expect("mount");
        let p = m.path().display().to_string();
        sh(&format!("cd '{p}' && mkdir a b && for i in $(seq 1 300); do echo $i > a/f$i; done && head -c 1000000 /dev/urandom > a/big && sync"));
        sh(&format!(
            "cd '{p}' && xfs_io -f -c 'pwrite 0 200k' -c fsync b/new >/dev/null \
             && xfs_io -c 'pwrite 4k 8k' -c fsync a/big >/dev/null \
             && yes abc | head -c 300000 > b/comp && xfs_io -c fsync b/comp \
             && xfs_io -f -c 'falloc 0 1m' -c 'pwrite 0 4k' -c fsync b/pre >/dev/null \
             && xfs_io -f -c 'pwrite 0 100' -c fsync b/tiny >/dev/null \
             && mv a/f1 b/f1moved && ln a/f2 b/f2link && xfs_io -c fsync b/f2link \
             && rm a/f5 && touch a/f6 && xfs_io -c fsync a \
             && setfattr -n user.x -v y b/new && xfs_io -c fsync b/new \
             && xfs_io -c 'pwrite 100k 4k' -c 'fpunch 0 64k' -c fsync b/new >/dev/null"
        ));
        sh(&format!(
            "cp --sparse=always '{}' '{}'",
            img.display(),
            crash.display()
        ));
    }
    let r = run_fsck(&crash, &[], Duration::from_secs(120));
    let log_blocks = r.json()["phases"][7]["checked"].as_u64().unwrap_or(0);
    assert_eq!(r.code, 0, "crash image: exit {}: {:?}", r.code, r.errors());
    assert!(log_blocks > 0, "the crash image has no log tree to check");
    assert_clean(&img, "log.img after unmount");
}
