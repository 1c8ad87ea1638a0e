//! Base images for the corruption recipes: made fresh by mkfs.btrfs (the
//! distribution's, 6.2) and filled through a kernel loop mount, so every
//! structure is the kernel's: files of many sizes (empty, inline, one
//! sector, several extents, holes, prealloc written and not, prealloc past
//! EOF), hard links, symlinks, xattrs, a fifo, reflinked copies (in one
//! subvolume and across two: extent items with several inline
//! references), a subvolume and a snapshot of it changed after (shared
//! and unshared blocks), and a subvolume deleted and not yet dropped (its
//! orphan item in the root tree: the image is copied from the live mount
//! right after the deletion's commit, before the cleaner's drop commits).
//!
//! The free space tree is left to the kernel (mkfs.btrfs before 6.3 leaves
//! stale entries in the one it makes, which newer checkers report): it
//! builds it at the first mount from the block groups there are.

use crate::mount::LoopMount;
use crate::sys::run;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One kind of base image.
#[derive(Clone, Copy, Debug)]
pub struct BaseSpec {
    pub name: &'static str,
    /// mkfs.btrfs arguments beside `-f -q -R ^free-space-tree`.
    pub mkfs: &'static [&'static str],
}

/// The base images: 4 KiB nodes (trees of several levels from a few
/// hundred files), the default 16 KiB nodes without no-holes (explicit
/// hole extents), and 4 KiB nodes without skinny metadata (EXTENT_ITEMs
/// with tree block info for tree blocks).
pub const BASES: &[BaseSpec] = &[
    BaseSpec {
        name: "4k",
        mkfs: &["-n", "4096"],
    },
    BaseSpec {
        name: "16k-holes",
        mkfs: &["-O", "^no-holes"],
    },
    BaseSpec {
        name: "4k-noskinny",
        mkfs: &["-n", "4096", "-O", "^skinny-metadata"],
    },
];

/// Size of a base image file (sparse).
pub const BASE_SIZE: u64 = 384 << 20;

/// What the kernel writes into a base image (run by `bash` in its root).
pub const POPULATE: &str = r#"
set -e
mkdir d0 d1 d2 d3 empty
for d in d0 d1 d2 d3; do
  for i in $(seq 1 40); do
    f=$d/f$i
    case $((i % 8)) in
      0) : > $f ;;
      1) head -c 100 /dev/urandom > $f ;;
      2) head -c 1500 /dev/urandom > $f ;;
      3) head -c 3000 /dev/urandom > $f ;;
      4) head -c 20000 /dev/urandom > $f ;;
      5) head -c 200000 /dev/urandom > $f ;;
      6) xfs_io -f -c "pwrite 0 8k" -c "pwrite 64k 8k" -c "pwrite 256k 4k" $f >/dev/null ;;
      7) xfs_io -f -c "falloc 0 64k" -c "pwrite 4k 4k" $f >/dev/null ;;
    esac
  done
done
xfs_io -f -c "pwrite -S 0x61 0 64k" -c fsync -c "pwrite -S 0x62 64k 64k" -c fsync \
   -c "pwrite -S 0x63 128k 64k" -c fsync d0/multi >/dev/null
xfs_io -f -c "falloc -k 0 128k" d2/keepsize >/dev/null
head -c 1000000 /dev/urandom > d1/big
ln d0/f1 d1/hl1
ln d0/f2 d2/hl2
ln d0/f2 d3/hl2b
ln -s ../d0/f1 d1/sym1
ln -s /a/target/that/does/not/exist/anywhere d2/sym2
ln -s f3 d3/sym3
mkfifo d3/fifo
setfattr -n user.one -v hello d0/f1 2>/dev/null || true
setfattr -n user.two -v "$(head -c 300 /dev/zero | tr '\0' y)" d1/big 2>/dev/null || true
for i in 5 13 21; do cp --reflink=always d0/f$i d1/f$i.clone; done
cp --reflink=always d1/big d2/big.clone
xfs_io -c "reflink d0/f29 0 0 64k" -f d3/partial >/dev/null
rm d0/f9 d1/f10
btrfs -q subvolume create sub
mkdir sub/a
for i in $(seq 1 30); do head -c $((i * 700)) /dev/urandom > sub/a/f$i; done
cp --reflink=always d0/f37 sub/f37.clone
btrfs -q subvolume create doomed
cp -a d0 doomed/
sync
btrfs -q subvolume snapshot sub snap
sync
echo more >> snap/a/f1
rm snap/a/f2
touch snap/new
head -c 50000 /dev/urandom > sub/a/f30
sync
xfs_io -c "pwrite 16k 4k" d1/big >/dev/null
sync
"#;

/// Make base image `spec` in `dir` (as `dir/<name>.img`). Needs root,
/// loop devices, mkfs.btrfs, btrfs, xfs_io.
pub fn make_base(dir: &Path, spec: &BaseSpec) -> Result<PathBuf, String> {
    let work = dir.join(format!("{}.work.img", spec.name));
    let out = dir.join(format!("{}.img", spec.name));
    let f = std::fs::File::create(&work).map_err(|e| e.to_string())?;
    f.set_len(BASE_SIZE).map_err(|e| e.to_string())?;
    drop(f);
    run(Command::new("mkfs.btrfs")
        .args(["-f", "-q", "-R", "^free-space-tree"])
        .args(spec.mkfs)
        .arg(&work))?;
    {
        let m = LoopMount::new(&work, "space_cache=v2,commit=600")?;
        run(Command::new("bash")
            .arg("-c")
            .arg(POPULATE)
            .current_dir(m.path()))?;
        // The deletion's commit, then the image as it is on disk at once:
        // the cleaner's drop of the subvolume is not committed yet.
        run(Command::new("btrfs")
            .args(["-q", "subvolume", "delete", "-c"])
            .arg(m.path().join("doomed")))?;
        run(Command::new("cp")
            .arg("--sparse=always")
            .arg(&work)
            .arg(&out))?;
        m.unmount()?;
    }
    let _ = std::fs::remove_file(&work);
    Ok(out)
}

/// Whether the image holds a deleted subvolume not yet dropped (what
/// class 066 needs).
pub fn has_dead_root(img: &Path) -> bool {
    super::Corruptor::open(img)
        .ok()
        .and_then(|mut c| super::recipes::Inventory::of(&mut c).ok())
        .is_some_and(|inv| !inv.dead_roots.is_empty())
}
