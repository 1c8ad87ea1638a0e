//! Shared helpers for integration tests.
//!
//! - [`env`]: probes for root, btrfs-progs, loop devices and `../shared`, each
//!   printing `SKIP: <test>: <reason>` when the test cannot run (a failure
//!   under `BTRKIT_REQUIRE_ORACLES=1`); use them via [`skip_unless!`].
//! - [`bins`]: paths to the workspace binaries (`bin_path("btrkit-dump")`),
//!   building them on first use when missing or older than their sources.
//! - [`mount`]: [`LoopMount`], the one loop-mount guard every test and helper
//!   mounts through (unmounts and detaches on drop, also on panic), and
//!   probes for mount points and loop devices.
//! - [`kimage`]: kernel-mounted scratch images ([`kimage::KernelImage`]) with a
//!   drop guard that unmounts and detaches, and crash-image capture.
//! - [`rich`]: builds an image full of the things the kernel writes (inline,
//!   prealloc, compressed, holes, xattrs, links, subvolumes, multi-level trees).
//! - [`fsck_support`]: running btrkit-fsck, locating and damaging items.
//! - [`repair_support`]: damaging an image in memory one field at a time
//!   and reading every file back, for the `--repair` tests.
//! - [`salvage`]: log blocks of a crash image, damaging them, comparing a
//!   salvaged image with the kernel's replay and zero-log.
//! - [`oracle`]: `btrfs check --readonly` (btrfs-progs 6.2 or 6.14, one
//!   image or a device set), the one place it is run and judged.
//! - [`sets`]: device sets: copies, the kernel's view and btrkit-fsck over
//!   every device.
//! - [`logcheck`]: one scenario's log judged against the kernel (its own
//!   run, its replay of ours, btrkit-replay, btrfs check, fsync promises);
//!   [`fsmodel`] models what a script does and what its fsyncs promised;
//!   [`sweep`] writes the random differential families and shrinks a
//!   disagreement to a regression script.
//! - [`hostile`]: items of real images edited into what a hostile writer
//!   leaves (names, keys, fields, duplicates; checksums fixed on every
//!   copy), and every image-reading tool run on them within time and
//!   memory bounds, a restore inside a canary tree.
//! - [`corrupt`]: a corruption generator after btrfs-progs'
//!   btrfs-corrupt-block (fields, items, keys, headers, the superblock,
//!   every copy written), recipes for each class of btrfs-progs'
//!   fsck-tests, and the kernel-filled base images they damage
//!   (`btrkit-corrupt` is its command line).
//! - [`dumpcmp`]: compares `btrkit-dump tree` against `btrfs inspect-internal
//!   dump-tree` on their item lines.

pub mod bins;
pub mod corrupt;
pub mod dumpcmp;
pub mod env;
pub mod fixtures;
pub mod fsck_support;
pub mod fsmodel;
// Waits for its children with wait4 (their peak memory) and signals them.
#[allow(unsafe_code)]
pub mod hostile;
pub mod repair_support;
// Drives the kernel through system calls (mmap, pwrite, sync_file_range).
#[allow(unsafe_code)]
pub mod kcrash;
pub mod kimage;
pub mod logcheck;
pub mod mount;
pub mod oracle;
pub mod rich;
pub mod salvage;
pub mod sets;
pub mod shellrun;
pub mod sweep;
// Safe wrappers over the system calls the other helpers need.
#[allow(unsafe_code)]
pub mod sys;

pub use bins::bin_path;
pub use env::{
    oracles_required, progs_new_dir, repo_root, require_btrfs_progs, require_fuse,
    require_kernel_mount, require_loop, require_progs_new, require_root, require_shared, skip,
    skip_part, test_name,
};
pub use kimage::{KernelImage, MkfsOpts};
pub use mount::{FuseMount, LoopMount};
