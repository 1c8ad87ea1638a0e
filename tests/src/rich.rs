//! A "rich" image: through a kernel mount, everything the kernel writes that a
//! reader must cope with — inline, regular, prealloc (with and without
//! keep-size), compressed (zstd by property, zlib by `chattr +c`), sparse
//! files, xattrs, hard links, symlinks, a fifo, a directory big enough that
//! the fs, extent and csum trees get several levels, a subvolume and two
//! snapshots. See [`build_rich`].

use crate::kimage::{KernelImage, MkfsOpts};
use crate::sys::must_run;
use btrkit_core::util::prng::Prng;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

#[derive(Clone, Debug)]
pub struct RichOpts {
    pub mkfs: MkfsOpts,
    /// Files in `many/`. Every other one is a 1–2 block regular extent, the
    /// rest are inline. With nodesize 4096, 12000 gives fs and extent trees
    /// of level 2.
    pub many_files: usize,
    /// Extra mount options for the population mount.
    pub mount_opts: String,
}

impl Default for RichOpts {
    fn default() -> Self {
        RichOpts {
            mkfs: MkfsOpts::default().size(1 << 30).nodesize(4096),
            many_files: 12000,
            mount_opts: String::new(),
        }
    }
}

/// Deterministic pseudo-random bytes (core's `Prng`, the stream this
/// function made on its own before), incompressible enough that the kernel
/// stores them uncompressed.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Prng::new(seed).fill(&mut v);
    v
}

/// Text that compresses well.
pub fn compressible(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while v.len() < len {
        v.extend_from_slice(
            format!("line {i:08} the quick brown fox jumps over the lazy dog\n").as_bytes(),
        );
        i += 1;
    }
    v.truncate(len);
    v
}

pub fn write_file(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

pub fn write_at(p: &Path, off: u64, data: &[u8]) {
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    f.write_all_at(data, off)
        .unwrap_or_else(|e| panic!("pwrite {}: {e}", p.display()));
}

/// `fallocate(2)`; `keep_size` leaves i_size alone (prealloc past EOF).
pub fn fallocate(p: &Path, off: u64, len: u64, keep_size: bool) {
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let mode = if keep_size {
        libc::FALLOC_FL_KEEP_SIZE
    } else {
        0
    };
    crate::sys::fallocate(&f, mode, off, len)
        .unwrap_or_else(|e| panic!("fallocate {}: {e}", p.display()));
}

pub fn setxattr(p: &Path, name: &str, value: &[u8]) {
    crate::sys::lsetxattr(p, name, value)
        .unwrap_or_else(|e| panic!("setxattr {} {name}: {e}", p.display()));
}

pub fn fsync(p: &Path) {
    let f = File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    f.sync_all()
        .unwrap_or_else(|e| panic!("fsync {}: {e}", p.display()));
}

/// Populate a mounted image with the rich content (see the module doc).
/// `k` stays mounted.
pub fn populate_rich(k: &KernelImage, many_files: usize) {
    let p = |r: &str| k.path(r);
    for d in [
        "inline",
        "data",
        "prealloc",
        "compressed",
        "chattr",
        "holes",
        "xattr",
        "links",
        "links/sub",
        "many",
    ] {
        fs::create_dir(p(d)).unwrap_or_else(|e| panic!("mkdir {d}: {e}"));
    }
    // Inline extents: small files up to just under the default max_inline.
    for (i, n) in [1usize, 17, 100, 1000, 2000].iter().enumerate() {
        write_file(&p(&format!("inline/small{i}")), &compressible(*n));
    }
    // Regular extents with random data, one not block-aligned in size.
    write_file(&p("data/rand0"), &random_bytes(1, 3 << 20));
    write_file(&p("data/rand1"), &random_bytes(2, (5 << 20) + 123));
    // Overwrite in the middle: splits the file extent (CoW).
    write_at(&p("data/rand1"), 1 << 20, &random_bytes(3, 64 << 10));
    // Prealloc: extends i_size; keep-size past EOF; partially written.
    fallocate(&p("prealloc/extend"), 0, 1 << 20, false);
    write_file(&p("prealloc/keep"), &random_bytes(4, 4096));
    fallocate(&p("prealloc/keep"), 4096, 1 << 20, true);
    fallocate(&p("prealloc/partial"), 0, 2 << 20, false);
    write_at(
        &p("prealloc/partial"),
        512 << 10,
        &random_bytes(5, 64 << 10),
    );
    // Compression: zstd inherited from the directory property, and zlib (the
    // default algorithm) from `chattr +c` on an empty file.
    must_run(
        Command::new("btrfs")
            .args(["property", "set"])
            .arg(p("compressed"))
            .args(["compression", "zstd"]),
    );
    write_file(&p("compressed/text1m"), &compressible(1 << 20));
    write_file(&p("compressed/text300k"), &compressible(300_000));
    write_file(&p("compressed/random"), &random_bytes(6, 256 << 10));
    File::create(p("chattr/c")).expect("create chattr/c");
    must_run(Command::new("chattr").arg("+c").arg(p("chattr/c")));
    write_file(&p("chattr/c"), &compressible(512 << 10));
    // Holes: data islands, a trailing hole past the last extent.
    write_at(&p("holes/sparse1"), 0, &random_bytes(7, 4096));
    write_at(&p("holes/sparse1"), 1 << 20, &random_bytes(8, 4096));
    write_at(&p("holes/sparse1"), 5 << 20, &random_bytes(9, 8192));
    File::options()
        .write(true)
        .open(p("holes/sparse1"))
        .expect("open")
        .set_len(8 << 20)
        .expect("truncate");
    File::create(p("holes/sparse2"))
        .expect("create")
        .set_len(2 << 20)
        .expect("truncate");
    write_at(
        &p("holes/sparse2"),
        (2 << 20) - 4096,
        &random_bytes(10, 4096),
    );
    // xattrs on a file, a directory and a symlink; many on one file.
    write_file(&p("xattr/f1"), b"has xattrs\n");
    setxattr(&p("xattr/f1"), "user.a", b"1");
    setxattr(&p("xattr/f1"), "user.long", &compressible(1000));
    setxattr(&p("xattr"), "user.dir", b"on a directory");
    write_file(&p("xattr/many"), b"many xattrs\n");
    for i in 0..50 {
        setxattr(
            &p("xattr/many"),
            &format!("user.x{i:03}"),
            format!("value {i}").as_bytes(),
        );
    }
    // Hard links across directories, symlinks (short, long, dangling), a fifo.
    write_file(&p("links/orig"), &random_bytes(11, 10_000));
    fs::hard_link(p("links/orig"), p("links/h1")).expect("link");
    fs::hard_link(p("links/orig"), p("links/sub/h2")).expect("link");
    fs::hard_link(p("links/orig"), p("inline/h3")).expect("link");
    std::os::unix::fs::symlink("orig", p("links/sym")).expect("symlink");
    std::os::unix::fs::symlink("x".repeat(300), p("links/longsym")).expect("symlink");
    std::os::unix::fs::symlink("/nonexistent/target", p("links/dangling")).expect("symlink");
    setxattr(&p("links/sym"), "trusted.sym", b"on a symlink");
    crate::sys::mkfifo(&p("links/fifo"), 0o644).expect("mkfifo");
    // A commit between phases, so the trees hold several generations.
    k.sync();
    // Many files in one directory: multi-level fs, extent and csum trees.
    for i in 0..many_files {
        let name = p(&format!("many/file{i:06}"));
        if i % 2 == 0 {
            write_file(&name, &random_bytes(100 + i as u64, 4096 + (i % 7) * 100));
        } else {
            write_file(
                &name,
                format!("file {i} {}\n", "y".repeat(i % 50)).as_bytes(),
            );
        }
    }
    // Unlink some so the directory has gaps in its index.
    for i in (0..many_files).step_by(97) {
        let _ = fs::remove_file(p(&format!("many/file{i:06}")));
    }
    // A subvolume, a snapshot of it changed afterwards, and a snapshot of the
    // top level (shares all the blocks of the big fs tree).
    must_run(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(p("sub")),
    );
    fs::create_dir(p("sub/dir")).expect("mkdir sub/dir");
    write_file(&p("sub/dir/a"), &random_bytes(12, 200_000));
    write_file(&p("sub/b"), b"small in subvolume\n");
    k.sync();
    must_run(
        Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(p("sub"))
            .arg(p("snap")),
    );
    write_at(&p("snap/dir/a"), 4096, &random_bytes(13, 8192));
    write_file(&p("snap/new"), b"only in the snapshot\n");
    must_run(
        Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(k.mnt())
            .arg(p("topsnap")),
    );
}

/// mkfs, mount, [`populate_rich`], unmount. The image is left unmounted and
/// fully committed; it lives as long as the returned [`KernelImage`].
pub fn build_rich(opts: &RichOpts) -> KernelImage {
    let mut k = KernelImage::new_mounted(&opts.mkfs, &opts.mount_opts);
    populate_rich(&k, opts.many_files);
    k.umount();
    k
}
