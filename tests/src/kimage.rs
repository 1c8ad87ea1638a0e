//! Scratch Btrfs images made by `mkfs.btrfs` and mounted by the kernel.
//!
//! Every [`KernelImage`] lives in its own temporary directory (image file and
//! mount point), so tests can run in parallel. Dropping it, also while a test
//! panics, unmounts (retrying while busy, lazily as a last resort), detaches
//! the loop device and removes the directory: the mount is a
//! [`LoopMount`](crate::mount::LoopMount).
//!
//! The helpers panic with the failing command's output: they are test
//! fixtures, and a test cannot go on without its image.

use crate::sys::must_run;
use btrkit_core::format::superblock::Superblock;
use btrkit_core::image::read_superblock;
use btrkit_core::io::FileDevice;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::mount::LoopMount;

/// Options for `mkfs.btrfs`.
#[derive(Clone, Debug)]
pub struct MkfsOpts {
    /// Size of the sparse image file in bytes.
    pub size: u64,
    pub nodesize: Option<u32>,
    /// `--csum`: crc32c, xxhash, sha256, blake2.
    pub csum: Option<String>,
    /// `-O` feature list, e.g. `^no-holes`.
    pub features: Option<String>,
    pub label: Option<String>,
    /// Further arguments passed as they are.
    pub extra: Vec<String>,
}

impl Default for MkfsOpts {
    fn default() -> Self {
        MkfsOpts {
            size: 512 << 20,
            nodesize: None,
            csum: None,
            features: None,
            label: None,
            extra: Vec::new(),
        }
    }
}

impl MkfsOpts {
    pub fn size(mut self, bytes: u64) -> Self {
        self.size = bytes;
        self
    }
    pub fn nodesize(mut self, n: u32) -> Self {
        self.nodesize = Some(n);
        self
    }
    pub fn csum(mut self, c: &str) -> Self {
        self.csum = Some(c.into());
        self
    }
    pub fn features(mut self, f: &str) -> Self {
        self.features = Some(f.into());
        self
    }
    pub fn label(mut self, l: &str) -> Self {
        self.label = Some(l.into());
        self
    }
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["-f".to_string(), "-q".to_string()];
        if let Some(n) = self.nodesize {
            a.push("--nodesize".into());
            a.push(n.to_string());
        }
        if let Some(c) = &self.csum {
            a.push("--csum".into());
            a.push(c.clone());
        }
        if let Some(f) = &self.features {
            a.push("-O".into());
            a.push(f.clone());
        }
        if let Some(l) = &self.label {
            a.push("--label".into());
            a.push(l.clone());
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// Read superblock copy 0 of an image file with btrkit-core.
pub fn superblock_of(image: &Path) -> Superblock {
    let dev =
        FileDevice::open(image, false).unwrap_or_else(|e| panic!("open {}: {e}", image.display()));
    read_superblock(&dev, 0).unwrap_or_else(|e| panic!("superblock of {}: {e}", image.display()))
}

/// A crash image copied from a live mount. It lives in its own temporary
/// directory, removed on drop, so it outlives the [`KernelImage`] it came from.
#[derive(Debug)]
pub struct CrashCopy {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    /// Superblock `log_root` (non-zero: the fsync log holds something).
    pub log_root: u64,
    pub log_root_level: u8,
    pub generation: u64,
}

/// A sparse image in its own temporary directory, mounted or not.
pub struct KernelImage {
    dir: tempfile::TempDir,
    image: PathBuf,
    mnt: PathBuf,
    /// The live mount, while mounted.
    mount: Option<LoopMount>,
    pub mkfs: MkfsOpts,
}

impl KernelImage {
    /// Create the image with `mkfs.btrfs -f -q` (not mounted).
    pub fn mkfs(opts: &MkfsOpts) -> KernelImage {
        let dir = tempfile::Builder::new()
            .prefix("btrkit-kimg-")
            .tempdir()
            .expect("tempdir");
        let image = dir.path().join("disk.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir mount point");
        let f = std::fs::File::create(&image).expect("create image file");
        f.set_len(opts.size).expect("size image file");
        drop(f);
        must_run(Command::new("mkfs.btrfs").args(opts.args()).arg(&image));
        KernelImage {
            dir,
            image,
            mnt,
            mount: None,
            mkfs: opts.clone(),
        }
    }

    /// `mkfs` then mount with `commit=600` plus `extra_opts` (comma list,
    /// may be empty), then one `sync` so setup starts from a committed state.
    pub fn new_mounted(opts: &MkfsOpts, extra_opts: &str) -> KernelImage {
        let mut k = KernelImage::mkfs(opts);
        k.mount(extra_opts);
        k.sync();
        k
    }

    /// Loop-mount the image. `commit=600` is added unless `opts` sets a
    /// commit interval, so that no transaction commit happens behind the
    /// test's back (crash images rely on it).
    pub fn mount(&mut self, opts: &str) {
        assert!(self.mount.is_none(), "already mounted");
        let mut o: Vec<&str> = opts.split(',').filter(|s| !s.is_empty()).collect();
        if !o.iter().any(|s| s.starts_with("commit=")) {
            o.insert(0, "commit=600");
        }
        let m = LoopMount::mount(&self.image, &self.mnt, &o.join(","))
            .unwrap_or_else(|e| panic!("mount failed: {e}"));
        self.mount = Some(m);
    }

    /// Unmount and detach. Retries while the mount is busy, then falls back
    /// to a lazy unmount so a stuck test never leaves a mount behind.
    pub fn umount(&mut self) {
        if let Some(m) = self.mount.take() {
            if let Err(e) = m.unmount() {
                eprintln!("warning: {e}");
            }
        }
    }

    /// The loop device while mounted.
    pub fn loop_device(&self) -> Option<&Path> {
        self.mount.as_ref().map(LoopMount::device)
    }
    /// The live mount guard, while mounted.
    pub fn loop_mount(&self) -> Option<&LoopMount> {
        self.mount.as_ref()
    }
    pub fn is_mounted(&self) -> bool {
        self.mount.is_some()
    }
    /// The image file.
    pub fn image(&self) -> &Path {
        &self.image
    }
    /// The mount point (the filesystem root while mounted).
    pub fn mnt(&self) -> &Path {
        &self.mnt
    }
    /// `rel` under the mount point.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel.trim_start_matches('/'))
    }
    /// This image's private temporary directory, for copies and outputs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Commit the running transaction (`btrfs filesystem sync`).
    pub fn sync(&self) {
        assert!(self.is_mounted(), "sync needs a mount");
        must_run(
            Command::new("btrfs")
                .args(["filesystem", "sync"])
                .arg(&self.mnt),
        );
    }

    /// Generation of the last committed transaction, from the superblock in
    /// the backing file (the kernel's writes reach it through the page cache).
    /// Compare before and after a series of fsyncs to detect a commit that
    /// intervened (any `sync(2)` on the machine commits every filesystem).
    pub fn committed_generation(&self) -> u64 {
        superblock_of(&self.image).generation.get()
    }

    /// Copy the backing file while mounted, as a power failure would leave it:
    /// everything the kernel completed (fsync'd data and the log tree), no
    /// commit after the last one. Follows the method of the shared kernel
    /// oracle: mount with commit=600, `sync` once after setup, run the steps,
    /// fsync, `cp --sparse=always`. Panics unless the copy has a log tree.
    pub fn crash_copy(&self, name: &str) -> CrashCopy {
        let c = self.crash_copy_unchecked(name);
        assert!(
            c.log_root != 0,
            "crash copy {} has no log tree (log_root 0): a commit happened?",
            c.path.display()
        );
        c
    }

    /// As [`crash_copy`](Self::crash_copy), without requiring a log tree.
    pub fn crash_copy_unchecked(&self, name: &str) -> CrashCopy {
        assert!(self.is_mounted(), "crash_copy needs a live mount");
        let dir = tempfile::Builder::new()
            .prefix("btrkit-crash-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().join(name);
        must_run(
            Command::new("cp")
                .arg("--sparse=always")
                .arg(&self.image)
                .arg(&path),
        );
        let sb = superblock_of(&path);
        CrashCopy {
            _dir: dir,
            path,
            log_root: sb.log_root.get(),
            log_root_level: sb.log_root_level,
            generation: sb.generation.get(),
        }
    }
}

impl Drop for KernelImage {
    fn drop(&mut self) {
        self.umount();
    }
}

/// `(tree id, ROOT_ITEM offset, level)` of every tree in the root tree, read
/// with btrkit-core.
pub fn tree_levels(image: &Path) -> Vec<(u64, u64, u8)> {
    use btrkit_core::image::{Image, OpenOptions};
    let img = Image::open_path(image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("open {}: {e}", image.display()));
    let items = img
        .root_items_in(img.root_tree())
        .unwrap_or_else(|e| panic!("root items: {e}"));
    items
        .into_iter()
        .map(|(k, ri)| (k.objectid, k.offset, ri.level))
        .collect()
}

/// `(tree id, level)` of every log tree in the log root tree (empty when the
/// image has no log), and the log root tree's own level.
pub fn log_tree_levels(image: &Path) -> (Option<u8>, Vec<(u64, u8)>) {
    use btrkit_core::image::{Image, OpenOptions};
    let img = Image::open_path(image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("open {}: {e}", image.display()));
    let Some(lrt) = img.log_root_tree() else {
        return (None, Vec::new());
    };
    let items = img
        .root_items_in(lrt)
        .unwrap_or_else(|e| panic!("log root items: {e}"));
    (
        Some(lrt.level),
        items
            .into_iter()
            .map(|(k, ri)| (k.offset, ri.level))
            .collect(),
    )
}
