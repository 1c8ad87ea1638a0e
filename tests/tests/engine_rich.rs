//! btrkit-shell on an image the kernel wrote: the rich image (inline,
//! regular, prealloc, zstd by property and zlib by `chattr +c`, sparse
//! files, xattrs, links, a subvolume and two snapshots) plus reflinked
//! files, changed by one script through the kernel on a copy and through
//! btrkit-shell on another copy. The kernel mounts both and must see the
//! same tree (contents, sizes, allocation, inode numbers...), and both
//! images must pass `btrfs check`, ours also `btrkit-fsck --check-data-csum`.

use btrkit_tests::kcrash::{self, Runner, Scenario};
use btrkit_tests::kimage::{KernelImage, MkfsOpts};
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::rich::populate_rich;
use btrkit_tests::LoopMount;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Reflinks the kernel makes on top of the rich content: a whole-file
/// clone of a regular file and of a compressed one, and a range clone.
const KERNEL_REFLINKS: &str = "\
clone /data/rand0 0 /data/reflinked 0 0
clone /compressed/text1m 0 /compressed/textclone 0 0
clone /data/rand1 1M /data/partclone 0 1M
";

/// Changes to every kind of content, run by both engines.
const CHANGES: &str = "\
# compressed by the directory's zstd property: overwrite, append, new
# files and directories inherit the property
write /compressed/text1m 64K 8K 0x42
write /compressed/text300k 300000 100K 0x43
write /compressed/newfile 0 300K 0x61
mkdir /compressed/subdir
write /compressed/subdir/f 0 200K 0x62
write /compressed/textclone 0 4K 0x50
setxattr /compressed/text1m user.new v
# zlib by chattr +c
write /chattr/c 4K 8K 0x44
# the property changed to lzo, then a file without compression
setxattr /compressed btrfs.compression lzo
write /compressed/lzofile 0 256K 0x63
create /compressed/plain
setxattr /compressed/plain btrfs.compression none
write /compressed/plain 0 64K 0x64
# shared extents: copy-on-write of one block, clones over clones, a punch
write /data/reflinked 100K 4K 0x45
clone /data/rand1 0 /data/reflinked 1M 64K
punch /data/rand1 1M 64K
truncate /data/partclone 100K
write /data/rand0 2M 8K 0x46
# prealloc: into unwritten space, keep-size past the end, shrink
write /prealloc/partial 1M 64K 0x47
write /prealloc/keep 8K 4K 0x48
fallocate /prealloc/extend 1M 1M keep
truncate /prealloc/extend 512K
zero-range /prealloc/partial 0 16K
# holes
write /holes/sparse1 2M 4K 0x49
truncate /holes/sparse2 1M
# snapshots share their blocks with the source
write /snap/dir/a 0 4K 0x4a
write /sub/dir/a 8K 4K 0x4b
write /topsnap/data/rand0 0 4K 0x4c
unlink /topsnap/many/file000001
rename /topsnap/links /topsnap/links2
snapshot /sub /snap2
write /snap2/b 0 10 0x4d
subvol-create /sub2
write /sub2/f 0 64K 0x4e
# names, links, xattrs, a big directory
mkdir /newdir
rename /links/orig /newdir/orig
link /newdir/orig /newdir/orig2
unlink /inline/h3
setxattr /xattr/many user.x010 changed
removexattr /xattr/many user.x020
write /many/file000003 0 10K 0x4f
truncate /many/file000002 100
unlink /many/file000005
rename /many/file000007 /many/renamed
sync
";

/// Whether the inode of `path` carries NOCOMPRESS: the kernel sets it when
/// a compression attempt fails ("mark_incompressible").
fn marked_incompressible(img: &Path, path: &str) -> Result<bool, String> {
    use btrkit_core::format::consts::{BTRFS_INODE_ITEM_KEY, BTRFS_INODE_NOCOMPRESS};
    use btrkit_core::format::inode::InodeItem;
    use zerocopy::FromBytes;
    let dev = btrkit_core::io::FileDevice::open(img, false).map_err(|e| e.to_string())?;
    let mut fs = btrkit_core::fs::Filesystem::mount(
        std::sync::Arc::new(dev),
        Default::default(),
        btrkit_core::log::LogState::boxed(),
    )
    .map_err(|e| e.to_string())?;
    let l = fs
        .resolve(path, false)
        .map_err(|e| format!("{path}: {e}"))?;
    let key = btrkit_core::format::key::Key::new(l.ino, BTRFS_INODE_ITEM_KEY, 0);
    let d = fs
        .store
        .lookup(btrkit_core::trans::TreeId::Tree(l.subvol), &key)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{path}: no inode item"))?;
    let (item, _) =
        InodeItem::read_from_prefix(&d).map_err(|_| format!("{path}: short inode item"))?;
    Ok(item.flags.get() & BTRFS_INODE_NOCOMPRESS != 0)
}

/// Files whose extents must be compressed (or not) as the kernel's are.
const COMPRESSION_CHECKED: &[&str] = &[
    "/compressed/text1m",
    "/compressed/text300k",
    "/compressed/newfile",
    "/compressed/subdir/f",
    "/compressed/textclone",
    "/compressed/lzofile",
    "/compressed/plain",
    "/chattr/c",
    "/data/reflinked",
];

/// (file offset, length, compression) of every file extent of `path`.
fn extents_of(img: &Path, path: &str) -> Result<Vec<(u64, u64, u8)>, String> {
    use btrkit_core::format::file_extent::{parse_file_extent, FileExtent};
    use btrkit_core::fs::extents::extent_key;
    let dev = btrkit_core::io::FileDevice::open(img, false).map_err(|e| e.to_string())?;
    let mut fs = btrkit_core::fs::Filesystem::mount(
        std::sync::Arc::new(dev),
        Default::default(),
        btrkit_core::log::LogState::boxed(),
    )
    .map_err(|e| e.to_string())?;
    let l = fs
        .resolve(path, false)
        .map_err(|e| format!("{path}: {e}"))?;
    let items = fs
        .store
        .items_in(
            btrkit_core::trans::TreeId::Tree(l.subvol),
            extent_key(l.ino, 0),
            extent_key(l.ino, u64::MAX),
        )
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (k, d) in items {
        match parse_file_extent(&d).map_err(|e| e.to_string())? {
            FileExtent::Inline { head, .. } => {
                out.push((k.offset, head.ram_bytes.get(), head.compression))
            }
            FileExtent::Disk { head, item } => {
                out.push((k.offset, item.num_bytes.get(), head.compression))
            }
        }
    }
    Ok(out)
}

fn shell(img: &Path, script: &Path) -> Result<(), String> {
    let o = Command::new(btrkit_tests::bin_path("btrkit-shell"))
        .arg(img)
        .arg(script)
        .arg("-q")
        .output()
        .map_err(|e| format!("btrkit-shell: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "btrkit-shell exit {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

fn kernel_apply(img: &Path, mnt: &Path, scn: &Scenario) -> Result<(), String> {
    let m = LoopMount::mount(img, mnt, "")?;
    let mut r = Runner::new(m.path());
    for (line, st) in &scn.steps {
        r.apply(st).map_err(|e| format!("line {line}: {e}"))?;
    }
    r.close_all();
    m.unmount()
}

#[test]
fn shell_changes_kernel_written_images() {
    if let Err(why) = kcrash::can_run() {
        btrkit_tests::skip(&why);
        return;
    }
    let mut k = KernelImage::new_mounted(&MkfsOpts::default().size(1 << 30).nodesize(4096), "");
    populate_rich(&k, 3000);
    let reflinks = Scenario::parse("reflinks", KERNEL_REFLINKS).expect("parse reflinks");
    let mut r = Runner::new(k.mnt());
    for (line, st) in &reflinks.steps {
        r.apply(st)
            .unwrap_or_else(|e| panic!("reflinks line {line}: {e}"));
    }
    r.close_all();
    k.umount();
    let v = oracle::btrfs_check(&[k.image()], Progs::Distro).expect("btrfs check");
    assert!(v.clean, "btrfs check of the kernel's image: {}", v.output);

    let changes = Scenario::parse("changes", CHANGES).expect("parse changes");
    let work = tempfile::Builder::new()
        .prefix("engine-rich-")
        .tempdir()
        .expect("tempdir");
    let w = work.path();
    let theirs = w.join("kernel.img");
    let ours = w.join("ours.img");
    kcrash::copy_sparse(k.image(), &theirs).expect("copy");
    kcrash::copy_sparse(k.image(), &ours).expect("copy");
    kernel_apply(&theirs, &w.join("mnt"), &changes).expect("kernel run");
    let script = w.join("changes.scn");
    std::fs::write(&script, CHANGES).expect("write script");
    shell(&ours, &script).expect("btrkit-shell run");

    let mut problems = Vec::new();
    let kernel = kcrash::manifest_via_copy(&theirs, &w.join("kernel-copy.img"), "ro")
        .expect("kernel manifest");
    match kcrash::manifest_via_copy(&ours, &w.join("ours-copy.img"), "ro") {
        Ok(m) if m != kernel => problems.push(format!(
            "the kernel sees our image differently (A = kernel run, B = btrkit run):\n{}",
            kernel.short_diff(&m, 20)
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("kernel mount of our image: {e}")),
    }
    // The kernel's choice to compress a range is made by an async worker
    // and has been seen to differ between two kernel runs of the same
    // script on the same image (once in CI: a 104 KiB append written
    // uncompressed). A mismatch is therefore checked against a second
    // kernel run: ours must equal one of the kernel's own outcomes.
    let mut second: Option<std::path::PathBuf> = None;
    for f in COMPRESSION_CHECKED {
        match (extents_of(&theirs, f), extents_of(&ours, f)) {
            (Ok(a), Ok(b)) if a != b => {
                let again = second.get_or_insert_with(|| {
                    let p = w.join("kernel2.img");
                    kcrash::copy_sparse(k.image(), &p).expect("copy");
                    kernel_apply(&p, &w.join("mnt"), &changes).expect("second kernel run");
                    p
                });
                // Seen here on one base image in three: both kernel runs
                // store an 8 KiB overwrite of 0x42 bytes (which zstd
                // shrinks to a few bytes) uncompressed and mark the file
                // NOCOMPRESS, i.e. the kernel's compression attempt failed;
                // the same steps on a fresh image compress. Ours may then
                // differ in the compression of extents only, nowhere else.
                let layout =
                    |v: &[(u64, u64, u8)]| v.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>();
                let gave_up = marked_incompressible(&theirs, f).unwrap_or(false)
                    && !marked_incompressible(&ours, f).unwrap_or(true);
                match extents_of(again, f) {
                    Ok(c) if c == b => println!("{f}: the kernel's two runs differ ({a:?} / {c:?}); ours equals the second"),
                    Ok(c) if c == a && gave_up && layout(&a) == layout(&b) => println!(
                        "{f}: the kernel's compression attempt failed (NOCOMPRESS set, {a:?}); ours compressed, same extents otherwise ({b:?})"
                    ),
                    c => problems.push(format!("{f}: extents (offset, length, compression): kernel {a:?} (again {c:?}), ours {b:?}")),
                }
            }
            (Ok(a), Ok(_)) => assert!(!a.is_empty(), "{f} has no extents"),
            (a, b) => problems.push(format!("{f}: {a:?} / {b:?}")),
        }
    }
    for img in [&theirs, &ours] {
        if let Err(e) = oracle::check_clean(&[img], Progs::Distro) {
            problems.push(format!("{}: {e}", img.display()));
        }
    }
    // What btrkit-fsck finds in ours must be what it finds in the kernel's
    // (mkfs.btrfs 6.2 to 6.14 leave stale free-space entries behind).
    let fsck = |img: &Path| {
        btrkit_tests::fsck_support::run_fsck(
            img,
            &["--check-data-csum", "--check-mirrors"],
            Duration::from_secs(300),
        )
        .errors()
    };
    let known = fsck(&theirs);
    let new: Vec<_> = fsck(&ours)
        .into_iter()
        .filter(|e| !known.contains(e))
        .collect();
    if !new.is_empty() {
        problems.push(format!(
            "btrkit-fsck finds in ours only: {:?}",
            new.into_iter().take(4).collect::<Vec<_>>()
        ));
    }
    // The kernel mounts ours read-write too and can keep changing it.
    match LoopMount::mount(&ours, &w.join("mnt2"), "") {
        Ok(m) => {
            let p = m.path().join("compressed/after-kernel");
            if let Err(e) = std::fs::write(&p, vec![0x55u8; 100_000]) {
                problems.push(format!("kernel write on our image: {e}"));
            }
            if let Err(e) = m.unmount() {
                problems.push(e);
            }
            if let Err(e) = oracle::check_clean(&[&ours], Progs::Distro) {
                problems.push(format!("after a kernel write: {e}"));
            }
        }
        Err(e) => problems.push(format!("read-write mount of our image: {e}")),
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
