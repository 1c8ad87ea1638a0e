//! Crash consistency of the engine's commits: a workload runs through the
//! script runner on a `CrashDevice` (a disk with a volatile write cache),
//! and power fails at sampled points: at every flush (with none, all, or
//! random subsets of the writes since the last flush surviving, and with
//! 4 KiB pages of those writes torn), and after random numbers of writes
//! between flushes. Each crashed image must mount again (a log, if the
//! superblock names one, replayed first), be clean for the checker, and
//! show exactly what a mount showed after the last durable commit before
//! the crash, or after the one that was being written.
//!
//! What a mount shows at each durable superblock (generation and log) is
//! recorded by an undisturbed run of the same workload; the engine is
//! deterministic, so a run cut at a crash point writes the same bytes up
//! to it.
//!
//! `BTRKIT_CRASH_POINTS=N` caps the flush points tried per workload (all of
//! them by default when there are at most 48, else an even sample of 48;
//! 0 means all); `BTRKIT_CRASH_CUTS=N` sets the mid-batch cuts per flush
//! interval (1 by default).

mod common;

use btrkit_core::io::{BlockDevice, CrashDevice};
use btrkit_core::util::prng::Prng;
use btrkit_core::workload::engine::EngineRunner;
use btrkit_core::workload::Manifest;
use common::*;
use std::sync::{Arc, Mutex};

/// Which durable state a superblock names: (generation, log root).
type StateKey = (u64, u64);

fn state_key(dev: &dyn BlockDevice) -> Result<StateKey, String> {
    let sb = btrkit_core::image::read_superblock(dev, 0).map_err(|e| format!("superblock: {e}"))?;
    Ok((sb.generation.get(), sb.log_root.get()))
}

/// What a mount of a copy of the durable part of `dev` shows.
fn durable_view(dev: &CrashDevice) -> Result<(StateKey, Manifest), String> {
    let copy = Arc::new(dev.crash_device(|_| false));
    let key = state_key(copy.as_ref())?;
    let mut fs = mount(copy, &[]).map_err(|e| format!("mount: {e}"))?;
    let m =
        btrkit_core::workload::engine::manifest(&mut fs).map_err(|e| format!("manifest: {e}"))?;
    Ok((key, m))
}

#[derive(Default)]
struct TapState {
    flushes: usize,
    /// Writes the device had accepted at each completed flush.
    flush_writes: Vec<u64>,
    /// The power is off: everything is refused.
    dead: bool,
    /// Durable states in the order they became durable, with what a mount
    /// shows of each (recording runs only).
    states: Vec<(StateKey, Manifest)>,
    record_error: Option<String>,
}

/// A device over a `CrashDevice` that counts flushes, can refuse the
/// `fail_flush`-th one (power fails with the writes since the previous
/// flush in the volatile cache), and can record each new durable state.
struct Tap {
    inner: Arc<CrashDevice>,
    fail_flush: Option<usize>,
    record: bool,
    st: Mutex<TapState>,
}

impl Tap {
    fn new(inner: Arc<CrashDevice>, fail_flush: Option<usize>, record: bool) -> Arc<Tap> {
        Arc::new(Tap {
            inner,
            fail_flush,
            record,
            st: Mutex::new(TapState::default()),
        })
    }
    fn state(&self) -> std::sync::MutexGuard<'_, TapState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn power_off() -> btrkit_core::Error {
        btrkit_core::Error::io(
            "simulated power failure",
            std::io::Error::other("flush refused"),
        )
    }
}

impl BlockDevice for Tap {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> btrkit_core::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> btrkit_core::Result<()> {
        if self.state().dead {
            return Err(Tap::power_off());
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> btrkit_core::Result<()> {
        let mut st = self.state();
        if st.dead || self.fail_flush == Some(st.flushes) {
            st.dead = true;
            return Err(Tap::power_off());
        }
        st.flushes += 1;
        self.inner.flush()?;
        st.flush_writes.push(self.inner.writes());
        if self.record {
            match durable_view(&self.inner) {
                Ok((k, m)) => {
                    if st.states.last().map(|s| s.0) != Some(k) {
                        st.states.push((k, m));
                    }
                }
                Err(e) => {
                    st.record_error.get_or_insert(e);
                }
            }
        }
        Ok(())
    }
}

/// A workload: mkfs arguments, mount options, script.
struct Workload {
    name: &'static str,
    mkfs: &'static [&'static str],
    mount: &'static [&'static str],
    script: &'static str,
}

/// Run the workload on `dev` until it ends or the power fails; Err(step)
/// names the step that failed.
fn run_workload(w: &Workload, dev: Arc<Tap>) -> Result<(), String> {
    let d: Arc<dyn BlockDevice> = dev;
    let mut fs = mount(d.clone(), w.mount).map_err(|e| format!("mount: {e}"))?;
    let mut r = EngineRunner::new();
    for st in steps(w.script) {
        apply(&mut fs, &mut r, &d, w.mount, &st).map_err(|e| format!("{st:?}: {e}"))?;
    }
    r.close_all(&mut fs).map_err(|e| format!("close: {e}"))?;
    fs.sync().map_err(|e| format!("final sync: {e}"))
}

/// The crashed image must mount, be clean, and show the durable state
/// before the crash or the next one.
fn verify_crash(
    img: Arc<CrashDevice>,
    before: StateKey,
    states: &[(StateKey, Manifest)],
    what: &str,
) -> Result<(), String> {
    let key = state_key(img.as_ref()).map_err(|e| format!("{what}: {e}"))?;
    let i = states.iter().position(|s| s.0 == before).ok_or_else(|| {
        format!("{what}: the state before the crash {before:?} was never recorded")
    })?;
    let allowed: Vec<&(StateKey, Manifest)> = states[i..].iter().take(2).collect();
    let Some((_, want)) = allowed.iter().find(|s| s.0 == key) else {
        return Err(format!(
            "{what}: superblock names {key:?}; expected {:?}",
            allowed.iter().map(|s| s.0).collect::<Vec<_>>()
        ));
    };
    let d: Arc<dyn BlockDevice> = img;
    let mut fs = mount(d.clone(), &[]).map_err(|e| format!("{what}: does not mount: {e}"))?;
    let got = btrkit_core::workload::engine::manifest(&mut fs)
        .map_err(|e| format!("{what}: manifest: {e}"))?;
    drop(fs);
    if &got != want {
        return Err(format!(
            "{what}: state {key:?} differs from the recorded one:\n{}",
            want.short_diff(&got, 12)
        ));
    }
    check_clean(d)
        .map(drop)
        .map_err(|e| format!("{what}: checker: {e}"))
}

/// Points of one workload: every flush (sampled past the cap) and cuts
/// between flushes.
fn crash_workload(w: &Workload, seed: u64) {
    let made = new_image(IMAGE_SIZE, w.mkfs);
    let base = || Arc::new(made.crash_device(|_| false));
    // The undisturbed run.
    let tap = Tap::new(base(), None, true);
    run_workload(w, tap.clone())
        .unwrap_or_else(|e| panic!("{}: the workload fails without a crash: {e}", w.name));
    let st = std::mem::take(&mut *tap.state());
    if let Some(e) = st.record_error {
        panic!("{}: a durable state does not mount: {e}", w.name);
    }
    let mut states = vec![(state_key(base().as_ref()).unwrap(), seen_on_disk(base()))];
    for s in st.states {
        if states.last().map(|l| l.0) != Some(s.0) {
            states.push(s);
        }
    }
    assert!(
        states.len() >= 6,
        "{}: only {} durable states; the workload should commit more",
        w.name,
        states.len()
    );
    let flushes = st.flushes;
    let mut writes_at = vec![0u64];
    writes_at.extend(st.flush_writes.iter().copied());

    let cap = env_num("BTRKIT_CRASH_POINTS", 48) as usize;
    let points: Vec<usize> = if cap == 0 || flushes <= cap {
        (0..flushes).collect()
    } else {
        (0..cap).map(|i| i * flushes / cap).collect()
    };
    let cuts_per = env_num("BTRKIT_CRASH_CUTS", 1);
    let mut rng = Prng::new(seed);
    let mut tried = 0;
    for &k in &points {
        // Power fails at flush k: what was written since flush k-1 is in
        // the volatile cache.
        let inner = base();
        let tap = Tap::new(inner.clone(), Some(k), false);
        let r = run_workload(w, tap);
        assert!(
            r.is_err(),
            "{}: the run did not notice the failed flush {k}",
            w.name
        );
        let before = state_key(&inner.crash_device(|_| false)).unwrap();
        let s = rng.next_u64();
        let variants: Vec<(String, CrashDevice)> = vec![
            ("none kept".into(), inner.crash_device(|_| false)),
            ("all kept".into(), inner.crash_device(|_| true)),
            (
                format!("subset {s:#x}"),
                inner.crash_device(|i| (s.rotate_left(i as u32 % 64) & 1) == 1),
            ),
            (
                format!("subset {:#x}", !s),
                inner.crash_device(|i| (s.rotate_left(i as u32 % 64) & 1) == 0),
            ),
            (
                format!("torn {s:#x}"),
                inner.crash_device_torn(|i, j| {
                    (s ^ (i as u64).wrapping_mul(0x9e37_79b9)
                        ^ (j as u64).wrapping_mul(0x85eb_ca6b))
                    .count_ones()
                    .is_multiple_of(2)
                }),
            ),
            (
                format!("torn all-but-last-page {s:#x}"),
                inner.crash_device_torn(|i, j| j == 0 || (s >> (i % 64)) & 1 == 1),
            ),
        ];
        for (what, img) in variants {
            tried += 1;
            verify_crash(
                Arc::new(img),
                before,
                &states,
                &format!("{}: flush {k} of {flushes}, {what}", w.name),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        // Cuts after a random number of the writes before flush k.
        let (lo, hi) = (
            writes_at[k],
            writes_at.get(k + 1).copied().unwrap_or(writes_at[k] + 1),
        );
        for _ in 0..cuts_per {
            if hi <= lo + 1 {
                break;
            }
            let n = lo + 1 + rng.below(hi - lo - 1);
            let inner = base();
            inner.fail_after_writes(Some(n));
            let r = run_workload(w, Tap::new(inner.clone(), None, false));
            assert!(
                r.is_err(),
                "{}: the run did not notice the refused write {n}",
                w.name
            );
            let before = state_key(&inner.crash_device(|_| false)).unwrap();
            let s = rng.next_u64();
            for (what, img) in [
                ("none kept", inner.crash_device(|_| false)),
                ("all kept", inner.crash_device(|_| true)),
                (
                    "subset",
                    inner.crash_device(|i| (s.rotate_left(i as u32 % 64) & 1) == 1),
                ),
                (
                    "torn",
                    inner.crash_device_torn(|i, j| {
                        (s ^ ((i * 31 + j) as u64)).count_ones() % 2 == 1
                    }),
                ),
            ] {
                tried += 1;
                verify_crash(
                    Arc::new(img),
                    before,
                    &states,
                    &format!("{}: after write {n} (flush {k}), {what}", w.name),
                )
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
    eprintln!(
        "{}: {} durable states, {flushes} flushes, {tried} crash images checked",
        w.name,
        states.len()
    );
}

/// Files: data of every kind (inline, compressed or not, prealloc, holes,
/// clones), names, xattrs; commits by sync, fsync, remount.
const FILES: &str = "\
mkdir /d
write /d/small 0 700 1
write /d/big 0 300000 random:7
write /d/sparse 1048576 5000 3
setxattr /d/big user.a \"one\"
sync
clone /d/big 0 /d/copy 0 0
link /d/big /d/big2
create /d/pre
fallocate /d/pre 0 200000 keep
write /d/big 4096 20000 9
fsync /d/big
truncate /d/small 100
punch /d/sparse 1048576 4096
symlink ../x /d/l
rename /d/small /small
sync
mkdir /e
rename /d /e/d
unlink /e/d/big2
write /e/d/copy 8192 8192 random:2
setxattr /e user.b <1500 x 'b'>
remount
zero-range /e/d/big 1000 70000
removexattr /e/d/big user.a
write /n 0 123456 random:11
fsync /n
unlink /e/d/l
mkdir /e/empty
sync
rmdir /e/empty
unlink /n
sync
";

/// Subvolumes, snapshots (a commit before each), deletion with the cleaner,
/// and a metadata balance.
const SUBVOLS: &str = "\
mkdir /a
write /a/f 0 200000 random:1
write /a/g 0 3000 4
sync
subvol-create /sv
write /sv/x 0 100000 random:5
snapshot / /snap
write /a/f 0 65536 6
write /snap/a/f 65536 65536 8
snapshot /sv /sv-snap
unlink /sv/x
sync
subvol-delete /snap
sync
write /sv-snap/x 0 4096 2
sync
balance-metadata
write /a/h 0 50000 random:9
sync
";

#[test]
fn files_workload_4k_nodes() {
    crash_workload(
        &Workload {
            name: "files-4k",
            mkfs: &["-n", "4096"],
            mount: &[],
            script: FILES,
        },
        1,
    );
}

#[test]
fn files_workload_compressed_no_holes_off() {
    crash_workload(
        &Workload {
            name: "files-zstd",
            mkfs: &["-n", "16384", "-O", "^no-holes"],
            mount: &["compress=zstd", "max_inline=0"],
            script: FILES,
        },
        2,
    );
}

/// Quotas (enable with its rescan), subvolumes with data, deletion and the
/// cleaner, a balance: the qgroup items must be right at every commit.
const QUOTAS: &str = "\
write /f 0 100000 random:3
sync
quota-enable
subvol-create /sv
write /sv/x 0 150000 random:5
clone /f 0 /g 0 0
sync
subvol-create /sv2
write /sv2/y 0 3000 1
subvol-delete /sv
sync
write /f 0 8192 7
sync
balance-metadata
unlink /g
sync
";

#[test]
fn subvolume_workload() {
    crash_workload(
        &Workload {
            name: "subvols",
            mkfs: &["-n", "4096"],
            mount: &[],
            script: SUBVOLS,
        },
        3,
    );
}

#[test]
fn quota_workload() {
    crash_workload(
        &Workload {
            name: "quotas",
            mkfs: &["-n", "16384", "-O", "block-group-tree"],
            mount: &[],
            script: QUOTAS,
        },
        4,
    );
}

/// With quotas on, a snapshot commits after creating the snapshot's tree
/// and qgroup but before linking it (dir entry, ROOT_REF, ROOT_BACKREF):
/// a crash after that commit must not leave a subvolume nothing names
/// that the checker (and btrfs check) reports; every crash point of the
/// workload recovers clean.
#[test]
fn snapshot_with_quotas_on() {
    crash_workload(&Workload { name: "snapshot-quotas", mkfs: &["-n", "4096"], mount: &[], script: "write /f 0 5000 1\nsync\nquota-enable\nsnapshot / /snap\nwrite /snap/f 0 10 2\nsync\n" }, 5);
}

/// Files unlinked (or made with O_TMPFILE) while open, committed, then a
/// power failure: their orphan items keep them consistent, and the next
/// mount deletes them (the kernel's orphan cleanup at mount), so after its
/// first commit neither the inodes nor their data remain.
#[test]
fn orphans_left_by_a_crash_are_removed_at_mount() {
    use btrkit_core::format::consts::*;
    use btrkit_core::format::key::Key;
    let made = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let d: Arc<dyn BlockDevice> = made.clone();
    let mut fs = mount(d.clone(), &[]).unwrap();
    let mut r = EngineRunner::new();
    for st in steps(
        "write /x 0 100000 random:1\nopen-fd /x\nunlink /x\ntmpfile t\nwrite t 0 5000 2\nsync\n",
    ) {
        apply(&mut fs, &mut r, &d, &[], &st).unwrap();
    }
    // Power fails with both files open.
    let crashed: Arc<dyn BlockDevice> = Arc::new(made.crash_device(|_| false));
    drop(fs);
    assert_clean(crashed.clone(), "orphans after the crash");
    let mut fs = mount(crashed.clone(), &[]).unwrap();
    fs.sync().unwrap();
    let orphans = fs
        .store
        .items_in(
            5,
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, u64::MAX),
        )
        .unwrap();
    assert!(
        orphans.is_empty(),
        "orphan items left after mount and commit: {:?}",
        orphans.iter().map(|(k, _)| k.offset).collect::<Vec<_>>()
    );
    for ino in [257u64, 258] {
        assert!(
            btrkit_core::fs::inode::get_inode(&mut fs.store, 5, ino)
                .unwrap()
                .is_none(),
            "inode {ino} still exists"
        );
    }
    drop(fs);
    assert_clean(crashed, "after orphan cleanup");
}

/// An orphan item of an inode that still has links (an fs-verity build a
/// crash interrupted): the check names what the kernel will do, and the
/// mount's orphan cleanup (the one rule repair runs too) drops the orphan
/// and verity items and keeps the file whole, extents past its size too.
#[test]
fn orphan_of_a_linked_inode_keeps_the_file() {
    use btrkit_core::format::consts::*;
    use btrkit_core::format::key::Key;
    let made = new_image(IMAGE_SIZE, &["-n", "4096"]);
    let d: Arc<dyn BlockDevice> = made.clone();
    let mut fs = mount(d.clone(), &[]).unwrap();
    let mut r = EngineRunner::new();
    for st in steps("write /f 0 20000 3\nsync\n") {
        apply(&mut fs, &mut r, &d, &[], &st).unwrap();
    }
    let ino = 257u64;
    let orphan = Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, ino);
    let verity = Key::new(ino, BTRFS_VERITY_MERKLE_ITEM_KEY, 0);
    fs.store.insert_item(5, &orphan, &[]).unwrap();
    fs.store.insert_item(5, &verity, &[0u8; 32]).unwrap();
    // The size says less than the extents hold: the kernel keeps them.
    btrkit_core::fs::inode::modify_inode(&mut fs.store, 5, ino, |i| i.size.set(100)).unwrap();
    fs.commit("test").unwrap();
    drop(fs);
    let settled = settled(&made);
    let before = check(settled.clone());
    assert!(
        before.findings.iter().any(|f| f
            .message
            .contains(&format!("orphan item {ino} is for an inode with links"))),
        "no orphan finding: {}",
        errors_of(&before)
    );
    let extents_before = count_extents(&settled, ino);
    let mut fs = mount(settled.clone(), &[]).unwrap();
    fs.sync().unwrap();
    for k in [orphan, verity] {
        assert!(
            fs.store.lookup(5, &k).unwrap().is_none(),
            "{k:?} left by orphan cleanup"
        );
    }
    assert!(btrkit_core::fs::inode::get_inode(&mut fs.store, 5, ino)
        .unwrap()
        .is_some());
    drop(fs);
    assert_eq!(
        count_extents(&settled, ino),
        extents_before,
        "extents past the size dropped"
    );
    assert_clean(settled, "after orphan cleanup of a linked inode");
}

fn count_extents(dev: &Arc<CrashDevice>, ino: u64) -> usize {
    use btrkit_core::format::consts::*;
    use btrkit_core::format::key::Key;
    let mut fs = mount(dev.clone(), &["ro"]).unwrap();
    fs.store
        .items_in(
            5,
            Key::new(ino, BTRFS_EXTENT_DATA_KEY, 0),
            Key::new(ino, BTRFS_EXTENT_DATA_KEY, u64::MAX),
        )
        .unwrap()
        .len()
}

/// Run `script` on a fresh image, then fail the power: the durable part of
/// the device, mounted (its log replayed by btrkit's replay at mount).
fn crash_after(mkfs: &[&str], size: u64, script: &str) -> (Arc<dyn BlockDevice>, Manifest) {
    let made = new_image(size, mkfs);
    let d: Arc<dyn BlockDevice> = made.clone();
    let mut fs = mount(d.clone(), &[]).unwrap();
    let mut r = EngineRunner::new();
    for st in steps(script) {
        apply(&mut fs, &mut r, &d, &[], &st).unwrap_or_else(|e| panic!("step {st:?}: {e}"));
    }
    let crashed: Arc<dyn BlockDevice> = Arc::new(made.crash_device(|_| false));
    drop(fs);
    let m = seen_on_disk(crashed.clone());
    (crashed, m)
}

/// fsync through a descriptor of a file whose last link is gone (fstests
/// generic/764): the kernel logs the inode (nlink 0) and the directory
/// it lost its name from, so replay removes the name and the file. The
/// engine used to skip the fsync and the file came back.
#[test]
fn fsync_of_an_unlinked_open_file_logs_its_deletion() {
    for (what, script) in [
        (
            "one link",
            "mkdir /d\nwrite /d/f 0 8192 1\nopen-fd /d/f\nsync\nunlink /d/f\nfsync /d/f\nclose-fd /d/f\n",
        ),
        (
            "links gone one by one",
            "mkdir /d\nmkdir /e\nwrite /d/f 0 8192 1\nlink /d/f /e/g\nopen-fd /d/f\nsync\n\
             unlink /e/g\nfsync /d/f\nunlink /d/f\nfsync /d/f\nclose-fd /d/f\n",
        ),
        (
            "renamed, then unlinked",
            "mkdir /d\nmkdir /e\nwrite /d/f 0 8192 1\nopen-fd /d/f\nsync\n\
             rename /d/f /e/g\nunlink /e/g\nfsync /d/f\nclose-fd /d/f\n",
        ),
    ] {
        let (crashed, m) = crash_after(&["-n", "4096"], IMAGE_SIZE, script);
        for gone in ["/d/f", "/e/g"] {
            assert!(
                !m.entries.contains_key(gone),
                "{what}: {gone} is back after replay:\n{}",
                m.render()
            );
        }
        assert_clean(crashed, what);
    }
}

/// Inode numbers are not handed out again in the mount that freed them
/// (the kernel fixes a subvolume's free objectid when it loads the root):
/// a log written after rmdir and mkdir of a directory that lost a
/// snapshot (fstests btrfs/120) named the new directory by the old one's
/// number, and a name of it by the number of the file fsynced, so the
/// conflict check took the old directory for the fsynced file itself and
/// logged instead of committing; replay then brought the deleted snapshot
/// back.
#[test]
fn snapshot_churn_under_a_recreated_directory() {
    let round = "snapshot / /t/snap\nsubvol-delete /t/snap\nrmdir /t\nmkdir /t\n";
    let script = format!(
        "mkdir /t\n{round}fsync /t\nremount\n{round}write /t/foobar 0 10 1\nfsync /t/foobar\n"
    );
    let (crashed, m) = crash_after(&["-n", "4096"], IMAGE_SIZE, &script);
    assert!(m.entries.contains_key("/t/foobar"), "{}", m.render());
    assert!(
        !m.entries.keys().any(|p| p.contains("snap")),
        "a deleted snapshot is back:\n{}",
        m.render()
    );
    assert_clean(crashed, "after two rounds of snapshot churn");
}
