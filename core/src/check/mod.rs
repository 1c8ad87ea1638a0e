//! The checker: reads an image (never writes) and returns findings, in
//! phases:
//!
//! superblocks (1), chunks/devices/block groups (2), every tree block (3),
//! the extent tree against what the trees reference (4), the free space
//! tree and the v1 free space cache (5), every subvolume's inodes and names
//! (6), data checksums (7), log trees (8) and quota groups (9).
//!
//! Phase 3 walks every tree once (`walk`) and hands each leaf to the
//! collectors of the later phases, which keep compact per-extent and
//! per-inode facts; the later phases then compare those facts. Nothing here
//! prints: the binary renders the [`Report`].

mod chunks;
mod csums;
pub(crate) mod datacsum;
mod extents;
pub mod findings;
mod free_space;
mod fs;
mod log;
mod names;
mod parity;
mod qgroups;
pub mod repair;
pub mod reuse;
mod space_cache;
mod superblock;
mod uuid_tree;
mod walk;

pub use findings::{
    phase_name, Category, ExtentRef, Finding, Phase, PhaseSummary, QgroupCount, QgroupReport,
    Repair, Report, Severity, PHASES,
};

use crate::devices::{Access, Single};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::image::{Image, OpenOptions};
use crate::{Error, Result};
use findings::Sink;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the checker does beyond the metadata phases. The default is what
/// `btrfs check --readonly` does: no data read, first good tree block copy only.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Read every checksummed data sector and verify it (phase 7).
    pub check_data_csum: bool,
    /// Read and verify every copy of every tree block (DUP metadata), as a
    /// metadata scrub would, not only the first good one as btrfs check
    /// does. Copy 0 is always verified, and the others whenever it is bad.
    pub check_mirrors: bool,
    /// Keep what a repair needs: every range a tree references
    /// ([`Report::in_use`]), what a repair's allocator must not hand out
    /// whatever the extent tree says; and the facts of the clean subvolume
    /// trees ([`Report::prior`]), for the check after the repair.
    pub for_repair: bool,
}

impl CheckOptions {
    /// For an image this engine wrote: every copy of every tree block is
    /// read (see [`Report::is_pristine`]).
    pub fn own_writes() -> Self {
        CheckOptions {
            check_data_csum: false,
            check_mirrors: true,
            for_repair: false,
        }
    }
}

/// Progress callbacks; the binary draws a bar, tests pass [`NoProgress`].
pub trait Progress: Sync {
    /// A phase starts; `total` units of work are expected (0 if unknown).
    fn phase(&self, _phase: u8, _name: &str, _total: u64) {}
    /// `n` more units of the current phase's `total` are done (tree blocks in
    /// phase 3, data sectors in phase 7).
    fn advance(&self, _n: u64) {}
}

/// A [`Progress`] that ignores every call: for tests and non-interactive use.
pub struct NoProgress;
impl Progress for NoProgress {}

/// One ROOT_ITEM of the root tree, as the checker needs it.
#[derive(Clone, Debug)]
pub(crate) struct RootRec {
    pub key: Key,
    pub item: Box<RootItem>,
}

impl RootRec {
    pub fn id(&self) -> u64 {
        self.key.objectid
    }
    /// Where a partially dropped tree resumes dropping, if it is being dropped.
    pub fn drop_key(&self) -> Option<Key> {
        let k = Key::from(&self.item.drop_progress);
        (k.objectid != 0 || k.ty != 0 || k.offset != 0).then_some(k)
    }
}

/// ROOT_REF / ROOT_BACKREF as found in the root tree.
#[derive(Clone, Debug)]
pub(crate) struct RootLink {
    pub key: Key,
    pub dirid: u64,
    pub sequence: u64,
    pub name: Vec<u8>,
}

/// A directory entry that names a subvolume (location key ROOT_ITEM).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SubvolDirent {
    pub tree: u64,
    pub dir: u64,
    pub child: u64,
}

pub(crate) struct Ctx<'a> {
    pub img: &'a Image,
    pub opts: CheckOptions,
    pub progress: &'a dyn Progress,
    pub sink: Sink,
    /// Superblock generation: nothing committed may be newer.
    pub gen: u64,
    pub roots: Vec<RootRec>,
    pub root_links: Vec<RootLink>,
    /// Roots listed as orphans in the root tree (deleted, being dropped).
    pub orphan_roots: Vec<u64>,
    pub chunks: chunks::Facts,
    pub ext: extents::Facts,
    pub csum: csums::Facts,
    pub fst: free_space::Facts,
    pub space_cache: space_cache::Facts,
    pub qgroups: qgroups::Facts,
    pub uuid: uuid_tree::Facts,
    /// Data ranges that file extents say must have checksums (phase 7).
    pub csum_needed: Vec<csums::Need>,
    /// Data ranges that must have none (phase 7).
    pub csum_forbidden: Vec<csums::Forbid>,
    /// Result of the data verification run beside the metadata phases.
    pub data_verified: Option<(u64, Vec<(u64, String)>)>,
    /// The stream reads every tree block the extent tree lists; the walk
    /// need not ask for blocks one by one.
    pub meta_prefetched: bool,
    /// Tree blocks the walk has read so far: the bulk read-ahead stays a
    /// bounded distance ahead of it.
    pub walked: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Tree blocks read ahead of the walk.
    pub stream: std::sync::Arc<walk::BlockStream>,
    pub subvol_dirents: Vec<SubvolDirent>,
    /// The check before this one (a repair's), whose clean subvolume
    /// trees are taken as they were when unchanged.
    pub prior: Option<&'a reuse::Prior>,
    /// What this check keeps for the one after it.
    pub keep: Option<reuse::Keep>,
}

impl<'a> Ctx<'a> {
    pub fn report(&mut self, f: Finding) {
        self.sink.push(f);
    }
    pub fn has_incompat(&self, f: u64) -> bool {
        self.img.sb.has_incompat(f)
    }
}

/// Open `path` read-only and check it: [`check_paths`] with one device.
pub fn check_path(path: &Path, opts: CheckOptions, progress: &dyn Progress) -> Result<Report> {
    check_paths(&[path.to_path_buf()], false, opts, progress)
}

/// Open the devices at `paths` (image files or block devices of one
/// filesystem, in any order) read-only and check the filesystem. With
/// `degraded`, devices of the filesystem may be missing (a warning; what
/// only they held is reported where it is needed). When the primary
/// superblock of a single device is unusable, a mirror is tried, and the
/// damage is a phase-1 error. Fails only when no superblock copy can be
/// used, the devices do not form one filesystem, or a file cannot be read.
pub fn check_paths(
    paths: &[PathBuf],
    degraded: bool,
    opts: CheckOptions,
    progress: &dyn Progress,
) -> Result<Report> {
    check_paths_after(paths, degraded, opts, progress, None)
}

/// [`check_paths`] after a repair whose first check kept `prior`
/// ([`Report::prior`]): subvolume trees whose root item is unchanged are
/// taken from there instead of walked again (see [`reuse`]).
pub fn check_paths_after(
    paths: &[PathBuf],
    degraded: bool,
    opts: CheckOptions,
    progress: &dyn Progress,
    prior: Option<std::sync::Arc<reuse::Prior>>,
) -> Result<Report> {
    let sink = || {
        let mut s = Sink::new();
        s.prior = prior.clone();
        s
    };
    if paths.is_empty() {
        return Err(Error::Invalid("no device given".into()));
    }
    for p in paths {
        let meta = std::fs::metadata(p)
            .map_err(|e| Error::io(format!("cannot open {}", p.display()), e))?;
        if meta.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is a directory, not an image",
                p.display()
            )));
        }
    }
    // Positioned reads, not a memory map: mapped pages of the image would
    // count in the checker's resident memory, and every block is read once.
    let devices = crate::devices::Devices::open_paths(paths, Access::default())?;
    check_devices(&devices, degraded, opts, progress, &sink)
}

/// Check the filesystem on one device (an image held in memory, a crash
/// device): [`check_paths`] with one device.
pub fn check_device(
    dev: std::sync::Arc<dyn crate::io::BlockDevice>,
    opts: CheckOptions,
    progress: &dyn Progress,
) -> Result<Report> {
    check_device_after(dev, opts, progress, None)
}

/// [`check_device`] after a repair: see [`check_paths_after`].
pub fn check_device_after(
    dev: std::sync::Arc<dyn crate::io::BlockDevice>,
    opts: CheckOptions,
    progress: &dyn Progress,
    prior: Option<std::sync::Arc<reuse::Prior>>,
) -> Result<Report> {
    let sink = || {
        let mut s = Sink::new();
        s.prior = prior.clone();
        s
    };
    let devices = crate::devices::Devices::new(vec![(String::new(), dev)]);
    check_devices(&devices, false, opts, progress, &sink)
}

/// Open the devices and check the filesystem. One device is read from
/// the primary superblock, or the first good mirror (the damage then a
/// phase-1 error with its repair).
fn check_devices(
    devices: &crate::devices::Devices,
    degraded: bool,
    opts: CheckOptions,
    progress: &dyn Progress,
    sink: &dyn Fn() -> Sink,
) -> Result<Report> {
    let mut open_opts = check_open_options(0, degraded);
    open_opts.alt_fsid = unfinished_fsid_change(devices);
    let mut opened = devices.open(open_opts, Single::AnyMirror)?;
    // A half-done checksum conversion: tree blocks and csum items in
    // either algorithm, not one error per block.
    if let Some(to) = opened.img.unfinished_csum_target() {
        if to != opened.img.csum {
            let opts = OpenOptions {
                alt_csum: Some(to),
                ..open_opts
            };
            if let Ok(o) = devices.open(opts, Single::AnyMirror) {
                opened = o;
            }
        }
    }
    let mut pre = sink();
    if let Some((mirror, primary_err)) = &opened.fallback {
        pre.push(
            findings::F::err(Phase::Superblocks, Category::Superblock)
                .at(BTRFS_SUPER_INFO_OFFSET)
                .fix(findings::Repair::RewriteSuperblocks)
                .msg(format!(
                    "primary superblock unusable ({primary_err}); checked using mirror {mirror}"
                )),
        );
    }
    Ok(run(&opened.img, opts, progress, pre))
}

/// The fsid tree blocks may still carry when `btrkit-tune -u` was
/// interrupted: it keeps the old fsid in the unused metadata_uuid field
/// while CHANGING_FSID is set. The check then reads blocks in either
/// state and reports the flag (phase 1), instead of calling every block
/// not yet rewritten damaged.
fn unfinished_fsid_change(devices: &crate::devices::Devices) -> Option<[u8; 16]> {
    let (_, d) = devices.list().first()?;
    let sb = crate::image::first_valid_superblock(d.as_ref()).ok()?;
    let changing = sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID != 0;
    let own_uuid = sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_METADATA_UUID != 0;
    (changing && !own_uuid && sb.metadata_uuid != [0; 16]).then_some(sb.metadata_uuid)
}

/// How the checker opens a filesystem: read-only, damaged blocks
/// returned with their problems, from superblock copy `mirror`.
fn check_open_options(mirror: usize, degraded: bool) -> OpenOptions {
    OpenOptions {
        mirror,
        lenient: true,
        writable: false,
        degraded,
        ..OpenOptions::default()
    }
}

/// Check an opened image.
pub fn check_image(img: &Image, opts: CheckOptions, progress: &dyn Progress) -> Report {
    run(img, opts, progress, Sink::new())
}

fn run(img: &Image, opts: CheckOptions, progress: &dyn Progress, sink: Sink) -> Report {
    let metadump =
        img.sb.flags.get() & (BTRFS_SUPER_FLAG_METADUMP | BTRFS_SUPER_FLAG_METADUMP_V2) != 0;
    // Data checksums half converted: phase 1 says so, nothing to verify.
    let converting = img.sb.flags.get() & superblock::CSUM_CHANGE_FLAGS != 0;
    std::thread::scope(|scope| {
        // Data verification is I/O bound and independent of the metadata
        // phases: it starts at once on its own thread.
        let data = (opts.check_data_csum && !metadump && !converting)
            .then(|| scope.spawn(|| datacsum::verify_all(img)));
        run_phases(img, opts, progress, sink, data)
    })
}

fn run_phases(
    img: &Image,
    opts: CheckOptions,
    progress: &dyn Progress,
    sink: Sink,
    data: Option<std::thread::ScopedJoinHandle<'_, (u64, Vec<(u64, String)>)>>,
) -> Report {
    let mut sink = sink;
    let prior = sink.prior.take();
    let mut cx = Ctx {
        img,
        opts,
        progress,
        sink,
        gen: img.sb.generation.get(),
        roots: Vec::new(),
        root_links: Vec::new(),
        orphan_roots: Vec::new(),
        chunks: Default::default(),
        ext: Default::default(),
        csum: Default::default(),
        fst: Default::default(),
        space_cache: Default::default(),
        qgroups: Default::default(),
        uuid: Default::default(),
        csum_needed: Vec::new(),
        csum_forbidden: Vec::new(),
        subvol_dirents: Vec::new(),
        data_verified: None,
        meta_prefetched: false,
        walked: Default::default(),
        stream: Default::default(),
        prior: prior.as_deref(),
        keep: opts.for_repair.then(reuse::Keep::default),
    };
    for w in &img.open_warnings {
        cx.report(findings::F::warn(Phase::Superblocks, Category::Open).msg(w.clone()));
    }
    timed(&mut cx, Phase::Superblocks, superblock::check_mirrors);
    std::thread::scope(|scope| {
        // Phase 3 also feeds phases 2, 4, 5, 6 and 7 with what the leaves
        // hold; the subvolumes' own checks (phase 6) may still be running
        // on their threads when it returns, beside phases 2 and 4.
        let t = Instant::now();
        cx.progress.phase(3, Phase::TreeBlocks.name(), 0);
        let mut pending = Vec::new();
        walk::walk_all(&mut cx, scope, &mut pending);
        cx.sink.ran(Phase::TreeBlocks);
        cx.sink
            .add_millis(Phase::TreeBlocks, t.elapsed().as_millis() as u64);
        timed(&mut cx, Phase::Chunks, chunks::check);
        timed(&mut cx, Phase::Superblocks, superblock::check_against_trees);
        timed(&mut cx, Phase::Extents, extents::check);
        let t = Instant::now();
        for h in pending {
            match h.join() {
                Ok(fs) => fs.deliver(&mut cx),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        if std::env::var_os("BTRKIT_PROF").is_some() {
            eprintln!("subvolume checks joined after {:?}", t.elapsed());
        }
        cx.sink
            .add_millis(Phase::Subvolumes, t.elapsed().as_millis() as u64);
    });
    timed(&mut cx, Phase::Subvolumes, fs::check_root_refs);
    timed(&mut cx, Phase::Subvolumes, uuid_tree::check);
    timed(&mut cx, Phase::FreeSpace, free_space::check);
    timed(&mut cx, Phase::FreeSpace, space_cache::check);
    if let Some(h) = data {
        cx.data_verified = h.join().ok();
    }
    timed(&mut cx, Phase::Checksums, parity::check);
    if cx.img.sb.flags.get() & superblock::CSUM_CHANGE_FLAGS == 0 {
        timed(&mut cx, Phase::Checksums, csums::check);
    }
    let quotas = cx.qgroups.present;
    timed(&mut cx, Phase::Qgroups, qgroups::check);
    // No quota tree: the phase had nothing to check.
    cx.sink.phases[9].ran = quotas;
    cx.ext.found_tree = Vec::new();
    cx.ext.found_data = Vec::new();
    cx.ext.block_owner = Vec::new();
    timed(&mut cx, Phase::Logs, log::check);
    report_rebuilt(&mut cx);
    let kept = cx.keep.take().and_then(reuse::finish);
    let mut report = cx.sink.into_report();
    report.prior = kept.map(std::sync::Arc::new);
    report
}

/// Tree blocks read through RAID5/6 parity: a damaged stripe is a
/// warning of its own (as a damaged mirror copy is: the data is there, the
/// redundancy is not); stripes on missing devices one warning in all. Data
/// rebuilt is reported by the data checksum check.
fn report_rebuilt(cx: &mut Ctx) {
    let r = cx.img.take_rebuilt_reads();
    if r.count == 0 {
        return;
    }
    let mut described = 0u64;
    for d in r.described.iter().filter(|d| d.damaged && d.tree_block) {
        described += 1;
        cx.report(
            findings::F::warn(Phase::TreeBlocks, Category::ParityRebuild)
                .at(d.logical)
                .msg(format!(
                    "{} (`btrfs scrub` rewrites it)",
                    d.describe(cx.img)
                )),
        );
    }
    if r.damaged_tree > described {
        cx.report(
            findings::F::warn(Phase::TreeBlocks, Category::ParityRebuild).msg(format!(
                "{} more damaged RAID5/6 stripes of tree blocks were read rebuilt from parity",
                r.damaged_tree - described
            )),
        );
    }
    let unreadable = r.count - r.damaged;
    if unreadable > 0 {
        cx.report(findings::F::warn(Phase::TreeBlocks, Category::ParityRebuild).msg(format!(
            "{unreadable} reads of RAID5/6 stripes that cannot be read (missing devices) were rebuilt from parity"
        )));
    }
}

fn timed(cx: &mut Ctx, phase: Phase, f: fn(&mut Ctx)) {
    let t = Instant::now();
    cx.progress.phase(phase.number(), phase.name(), 0);
    f(cx);
    if std::env::var_os("BTRKIT_PROF").is_some() {
        eprintln!("phase {phase}: {:?}", t.elapsed());
    }
    cx.sink.ran(phase);
    cx.sink.add_millis(phase, t.elapsed().as_millis() as u64);
}

pub(crate) fn fmt_key(k: &Key) -> String {
    crate::format::names::key_string(k)
}

#[cfg(test)]
mod tests {
    use super::csums::{covered, union_of};
    use super::findings::{Category, Phase, Sink, F};

    #[test]
    fn intervals() {
        let u = union_of(vec![(10, 5), (0, 4), (15, 5), (30, 1)]);
        assert_eq!(u, vec![(0, 4), (10, 20), (30, 31)]);
        assert!(covered(&u, 10, 10));
        assert!(covered(&u, 0, 4));
        assert!(!covered(&u, 3, 2));
        assert!(!covered(&u, 19, 2));
        assert!(covered(&u, 5, 0));
    }

    #[test]
    fn sink_counts_past_the_cap() {
        let mut s = Sink::new();
        for i in 0..3000u64 {
            s.push(F::err(Phase::Extents, Category::ExtentRef).at(i).msg("m"));
        }
        s.push(F::warn(Phase::Superblocks, Category::Superblock).msg("w"));
        let r = s.into_report();
        assert_eq!(r.errors, 3000);
        assert_eq!(r.warnings, 1);
        assert_eq!(r.findings.len() as u64 + r.suppressed, 3001);
        assert_eq!(r.findings[0].phase, 1);
        assert!(!r.is_clean());
    }
}
