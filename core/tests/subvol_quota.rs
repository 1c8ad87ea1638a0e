//! Subvolumes, snapshots, quota groups and metadata balance through the
//! engine (fs/subvol.rs, trans/qgroup.rs, trans/subtree.rs,
//! trans/relocate.rs), on images made by core's mkfs in memory. After
//! every step that commits, the checker must find the image clean; with
//! quotas on, its quota phase (which recomputes every qgroup's referenced
//! and exclusive bytes from the extent tree) must have run and agree.

mod common;

use btrkit_core::check::Report;
use btrkit_core::format::consts::*;
use btrkit_core::fs::Filesystem;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::BlockDevice;
use btrkit_core::trans::qgroup::Counts;
use btrkit_core::workload::engine::EngineRunner;
use common::*;
use std::sync::Arc;

struct Rig {
    dev: Arc<dyn BlockDevice>,
    fs: Filesystem,
    runner: EngineRunner,
}

impl Rig {
    fn new(args: &[&str]) -> Rig {
        Rig::with_mount(args, &[])
    }
    fn with_mount(args: &[&str], mount_opts: &[&str]) -> Rig {
        let dev: Arc<dyn BlockDevice> = new_image(IMAGE_SIZE, args);
        let fs = mount(dev.clone(), mount_opts).unwrap();
        Rig {
            dev,
            fs,
            runner: EngineRunner::new(),
        }
    }
    /// Run script lines; each must succeed.
    fn run(&mut self, text: &str) {
        for st in steps(text) {
            apply(&mut self.fs, &mut self.runner, &self.dev, &[], &st)
                .unwrap_or_else(|e| panic!("{st:?}: {e}"));
        }
    }
    /// Run one script line that must fail with `errno`.
    fn fails(&mut self, line: &str, errno: i32) {
        let st = &steps(line)[0];
        match apply(&mut self.fs, &mut self.runner, &self.dev, &[], st) {
            Ok(()) => panic!("{line}: succeeded, expected errno {errno}"),
            Err(e) => assert_eq!(e.as_errno(), errno, "{line}: {e}"),
        }
    }
    /// Sync, then the checker; with `quotas`, its quota phase must have run.
    fn clean(&mut self, what: &str, quotas: bool) -> Report {
        self.fs.sync().unwrap();
        let r = assert_clean(self.dev.clone(), what);
        if quotas {
            let q = r.phases.iter().find(|p| p.phase == 9).expect("quota phase");
            assert!(
                q.ran && q.checked > 0,
                "{what}: the quota phase did not check anything"
            );
        }
        r
    }
    fn qgroup(&self, id: u64) -> Option<Counts> {
        self.fs.store.qgroups().groups.get(&id).copied()
    }
    fn tree_exists(&mut self, id: u64) -> bool {
        self.fs.store.tree_exists(id).unwrap()
    }
}

/// quota enable on a filesystem with data, snapshots of the top level and
/// of a subvolume, writes on both sides of each snapshot, deletion and the
/// cleaner: the checker's recomputation agrees after every commit, and the
/// counters follow the sharing rules.
#[test]
fn qgroups_through_snapshots_and_deletion() {
    let mut r = Rig::new(&["-n", "16384"]);
    r.run("mkdir /a\nwrite /a/f 0 1M random:1\nwrite /a/g 0 3000 7\nsync\n");
    r.run("quota-enable");
    r.clean("quota enabled", true);
    let top = r.qgroup(5).expect("qgroup 0/5");
    assert!(top.rfer >= 1 << 20 && top.excl == top.rfer, "{top:?}");

    r.run("snapshot / /snap");
    r.clean("snapshot of the top level", true);
    let (a, s) = (
        r.qgroup(5).unwrap(),
        r.qgroup(256).expect("qgroup of the snapshot"),
    );
    assert!(
        s.rfer >= 1 << 20 && a.excl < 1 << 20 && s.excl < 1 << 20,
        "shared data counts for both, exclusively for neither: {a:?} {s:?}"
    );

    r.run("write /a/f 0 256K random:2\nwrite /snap/a/f 512K 128K 3\nwrite /snap/new 0 64K random:4\nwrite /a/new 0 5000 5\n");
    r.clean("writes on both sides", true);
    let (a2, s2) = (r.qgroup(5).unwrap(), r.qgroup(256).unwrap());
    assert!(
        a2.excl >= 256 << 10 && s2.excl >= 192 << 10,
        "{a2:?} {s2:?}"
    );

    r.run("subvol-create /sv\nwrite /sv/x 0 300K random:6\nclone /sv/x 0 /sv/y 0 0\n");
    r.clean("a subvolume with a clone", true);
    let sv = r.qgroup(257).expect("qgroup of the subvolume");
    assert!(
        sv.rfer >= 300 << 10 && sv.rfer < 400 << 10,
        "a clone in one subvolume counts once: {sv:?}"
    );
    r.run("snapshot /sv /sv-snap\nunlink /sv/x\nunlink /sv/y\n");
    r.clean("snapshot of the subvolume, originals unlinked", true);
    let (sv, ss) = (r.qgroup(257).unwrap(), r.qgroup(258).unwrap());
    assert!(
        ss.excl >= 300 << 10 && sv.rfer < 64 << 10,
        "the snapshot holds the data alone now: {sv:?} {ss:?}"
    );

    // Delete the top-level snapshot: its tree is dropped by the cleaner
    // in the next transaction, then its qgroup goes.
    r.run("subvol-delete /snap");
    r.clean("snapshot deleted", true);
    r.clean("the cleaner ran", true);
    r.clean("qgroup removed", true);
    assert!(
        !r.tree_exists(256),
        "the deleted snapshot's tree is dropped"
    );
    assert!(
        r.qgroup(256).is_none(),
        "the deleted snapshot's qgroup is removed"
    );
    let a3 = r.qgroup(5).unwrap();
    assert_eq!(
        a3.excl, a3.rfer,
        "nothing of the top level is shared any more: {a3:?}"
    );
    r.run("remount");
    r.clean("after a remount", true);
}

/// Subvolumes inside subvolumes, deletion rules (ENOTEMPTY with a nested
/// subvolume, EPERM for the default one), rmdir of an empty subvolume,
/// EXDEV across subvolumes, set-default seen at the next mount.
#[test]
fn subvolume_create_and_delete() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("subvol-create /sv\nmkdir /sv/d\nwrite /sv/d/f 0 100K random:1\nsubvol-create /sv/inner\nwrite /sv/inner/g 0 10K 2\nsubvol-create /empty\nwrite /top 0 1000 3\n");
    r.clean("nested subvolumes", false);
    let (sv, inner, empty) = (256, 257, 258);
    assert!(r.tree_exists(sv) && r.tree_exists(inner) && r.tree_exists(empty));

    r.fails("subvol-delete /sv", libc::ENOTEMPTY);
    r.fails("link /top /sv/top", libc::EXDEV);
    r.fails("rename /sv/d/f /f", libc::EXDEV);
    r.fails("subvol-delete /top", libc::EINVAL);
    r.run("rmdir /empty");
    r.clean("an empty subvolume removed with rmdir", false);
    r.clean("the cleaner dropped it", false);
    assert!(!r.tree_exists(empty));

    r.run("subvol-delete /sv/inner\nsubvol-delete /sv\n");
    r.clean("subvolumes deleted", false);
    r.clean("the cleaner dropped them", false);
    assert!(!r.tree_exists(sv) && !r.tree_exists(inner));
    let orphans =
        r.fs.store
            .items_in(
                btrkit_core::trans::TreeId::Root,
                btrkit_core::format::key::Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0),
                btrkit_core::format::key::Key::new(
                    BTRFS_ORPHAN_OBJECTID,
                    BTRFS_ORPHAN_ITEM_KEY,
                    u64::MAX,
                ),
            )
            .unwrap();
    assert!(
        orphans.is_empty(),
        "orphan items of dropped subvolumes go with them"
    );

    // The default subvolume: seen at the next mount, and not deletable.
    r.run("subvol-create /def\nwrite /def/inside 0 10 1\nsubvol-set-default /def\nremount\n");
    let m = seen(&mut r.fs);
    assert!(
        m.entries.contains_key("/inside") && !m.entries.contains_key("/top"),
        "the default subvolume is the mount's root:\n{}",
        m.render()
    );
    r.clean("set-default and remount", false);
    let root = r.fs.root();
    assert_eq!(root.subvol, 259);
    let top = btrkit_core::fs::Loc::new(5, BTRFS_FIRST_FREE_OBJECTID);
    let err = r.fs.subvols().subvol_delete(top, b"def").unwrap_err();
    assert_eq!(err.as_errno(), libc::EPERM, "{err}");
}

/// Deleting a subvolume with a lot in it (a tree several levels deep) and
/// remounting before the cleaner ran: the dead root found at mount is
/// dropped by the next commit.
#[test]
fn deleted_subvolume_dropped_after_remount() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("subvol-create /sv\nwritefiles /sv 400 100-9000\n");
    r.clean("many files", false);
    r.run("subvol-delete /sv");
    // Unmount right after the deletion commit: the cleaner has not run.
    r.fs.commit("test").unwrap();
    drop(std::mem::replace(
        &mut r.fs,
        mount(r.dev.clone(), &[]).unwrap(),
    ));
    r.clean("dead root found at mount", false);
    r.clean("dropped", false);
    assert!(!r.tree_exists(256));
}

/// rename(2) of a subvolume's entry within its parent is allowed by the
/// kernel (btrfs_rename refuses only a plain inode across subvolumes).
#[test]
fn rename_a_subvolume() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("subvol-create /sv\nwrite /sv/f 0 10 1\nmkdir /d\nsync\n");
    r.run("rename /sv /sv2\nrename /sv2 /d/sv3\n");
    let m = seen(&mut r.fs);
    assert!(m.entries.contains_key("/d/sv3/f"));
    r.clean("subvolume renamed", false);
}

/// A metadata balance moves every metadata and system block group to new
/// chunks; what a user sees is unchanged and the image is clean, also
/// with quotas on and after a remount.
#[test]
fn metadata_balance() {
    for args in [
        // Block group items in the extent tree (no block group tree
        // without no-holes), then in the block group tree (the default).
        &["-n", "4096", "-O", "^no-holes"][..],
        &["-n", "16384"][..],
    ] {
        let mut r = Rig::new(args);
        r.run("writefiles / 300 10-20000\nmkdir /x\nsetxattr /x user.big <1500 x 'q'>\nsubvol-create /sv\nwritefiles /sv 100 100-5000\nsnapshot /sv /snap\nquota-enable\n");
        r.clean("before the balance", true);
        let before = seen(&mut r.fs);
        let meta_chunks = |dev: &Arc<dyn BlockDevice>| -> Vec<u64> {
            let img = Image::open(dev.clone(), OpenOptions::default()).unwrap();
            img.chunks
                .iter()
                .filter(|c| {
                    c.type_flags & (BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_SYSTEM) != 0
                })
                .map(|c| c.logical)
                .collect()
        };
        let old = meta_chunks(&r.dev);
        r.run("balance-metadata");
        r.clean("after the balance", true);
        let new = meta_chunks(&r.dev);
        assert!(
            old.iter().all(|c| !new.contains(c)),
            "every metadata chunk moved: {old:?} -> {new:?}"
        );
        assert_eq!(seen(&mut r.fs).diff(&before), Vec::<String>::new());
        r.run("write /x/after 0 5000 1\nremount\n");
        r.clean("after a remount", true);
        let after = seen(&mut r.fs);
        assert!(after
            .entries
            .get("/x/after")
            .is_some_and(|e| e.size == 5000));
        // Only the new name changed anything (its directory's size).
        assert_eq!(
            after.without("/x/after").diff(&before),
            vec!["differs /x: size 10 vs 0".to_string()]
        );
    }
}

/// A snapshot of a subvolume that holds another subvolume copies the
/// entry naming the nested one, but no ROOT_REF links it under the
/// snapshot: the kernel shows an empty directory there (its lookup checks
/// the root ref and falls back to an empty placeholder). The engine's
/// lookup follows the entry to the nested subvolume itself, so the
/// snapshot aliases it: its files show (and can be changed) through the
/// snapshot.
#[test]
fn nested_subvolume_in_a_snapshot_is_an_empty_directory() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("subvol-create /sv\nwrite /sv/f 0 10 1\nsnapshot / /snap\n");
    r.clean("snapshot over a nested subvolume", false);
    let m = seen(&mut r.fs);
    assert!(
        m.entries.get("/snap/sv").is_some_and(|e| e.kind == 'd'),
        "{}",
        m.render()
    );
    assert!(
        !m.entries.contains_key("/snap/sv/f"),
        "the snapshot shows the nested subvolume's files:\n{}",
        m.render()
    );
}

/// The placeholder a snapshot shows for a nested subvolume behaves as the
/// kernel's (each errno checked on a loop mount): inode 2, an empty
/// directory of mode 0755; nothing can be made in it (open(O_CREAT)
/// EACCES, mkdir/symlink/mknod EPERM, rename into it EPERM, the subvolume
/// ioctls ENOTTY), it has no xattrs (EOPNOTSUPP), chmod succeeds without
/// effect; it does not move (ENOTEMPTY, EXDEV across subvolumes), is no
/// subvolume to delete (EINVAL), but rmdir removes it and an empty
/// directory may replace it, the live subvolume untouched.
#[test]
fn nested_subvolume_placeholder_operations() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("subvol-create /sv\nwrite /sv/f 0 10 1\nsnapshot / /snap\nmkdir /snap/e\ncreate /g\n");
    let ph = r.fs.resolve("/snap/sv", false).unwrap();
    let st = r.fs.stat(ph).unwrap();
    assert_eq!(
        (st.ino, st.mode, st.nlink, st.size),
        (2, 0o040755, 1, 0),
        "{st:?}"
    );
    assert!(r.fs.readdir(ph).unwrap().is_empty());
    r.fails("create /snap/sv/x", libc::EACCES);
    r.fails("write /snap/sv/x 0 10 1", libc::EACCES);
    r.fails("mkdir /snap/sv/x", libc::EPERM);
    r.fails("symlink t /snap/sv/x", libc::EPERM);
    r.fails("mknod /snap/sv/x fifo", libc::EPERM);
    r.fails("rename /snap/e /snap/sv/x", libc::EPERM);
    r.fails("rename /g /snap/sv/x", libc::EPERM);
    r.fails("subvol-create /snap/sv/x", libc::ENOTTY);
    r.fails("setxattr /snap/sv user.a 1", libc::EOPNOTSUPP);
    r.fails("unlink /snap/sv", libc::EISDIR);
    r.fails("rename /snap/sv /snap/sv2", libc::ENOTEMPTY);
    r.fails("rename /snap/sv /sv3", libc::EXDEV);
    r.fails("subvol-delete /snap/sv", libc::EINVAL);
    r.run("chmod /snap/sv 700\nrename /snap/sv /snap/sv\nfsync /snap/sv\n");
    assert_eq!(r.fs.stat(ph).unwrap().mode, 0o040755);
    r.clean("placeholder refusals", false);

    // rmdir of the placeholder, and an empty directory over another one.
    r.run("snapshot / /snap2\nmkdir /snap2/e\nrmdir /snap/sv\nrename /snap2/e /snap2/sv\n");
    r.clean("placeholders removed", false);
    let m = seen(&mut r.fs);
    assert!(!m.entries.contains_key("/snap/sv"), "{}", m.render());
    assert!(
        m.entries
            .get("/snap2/sv")
            .is_some_and(|e| e.kind == 'd' && e.ino != 2),
        "{}",
        m.render()
    );
    assert!(m.entries.contains_key("/sv/f"), "the subvolume stays");
    r.run("remount");
    r.clean("after a remount", false);
}

/// A subvolume and a snapshot renamed into another subvolume and back:
/// the entries name each root item by its key, the root references
/// follow, the directories' sizes too, and an fsync after the rename
/// commits (the log cannot hold it).
#[test]
fn rename_a_subvolume_across_subvolumes() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run(
        "subvol-create /sv\nwrite /sv/f 0 10 1\nsubvol-create /other\nsnapshot /sv /snap\nsync\n",
    );
    r.run("rename /sv /other/sv\nrename /snap /other/s\ncreate /other/x\nfsync /other/x\n");
    r.clean("moved into another subvolume", false);
    let m = seen(&mut r.fs);
    assert!(m.entries.contains_key("/other/sv/f") && m.entries.contains_key("/other/s/f"));
    assert!(!m.entries.contains_key("/sv") && !m.entries.contains_key("/snap"));
    r.fails("rename /other /other/sv/o", libc::EINVAL);
    r.fails("subvol-delete /other", libc::ENOTEMPTY);
    r.run("rename /other/sv /sv\nrename /other/s /sv2\nremount\n");
    r.clean("and back", false);
    let m = seen(&mut r.fs);
    assert!(m.entries.contains_key("/sv/f") && m.entries.contains_key("/sv2/f"));
    r.run("subvol-delete /other\nsubvol-delete /sv2\n");
    r.clean("deleted after the moves", false);
}

/// quota enable while a deleted snapshot waits for the cleaner: the
/// enable writes back dirty data after its first commit and rescans in
/// the same transaction; the cleaner then drops the snapshot at the commit
/// that ends the enable. A block of the top level that was shared with
/// the snapshot is copied away by the writeback and freed by the drop:
/// both changes are accounted from the committed trees, so the rescan must
/// count from those trees too (as the kernel's rescan reads commit roots),
/// or 0/5 loses a block it was never given (referenced below exclusive).
#[test]
fn quota_enable_with_a_deleted_snapshot_pending() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("write /b 622592 1 0\nwrite /b 0 4097 0\nclone /b 0 /b 28672 28672\npunch /b 4097 1\nsnapshot / /s\nwrite /b 2070 2027 0\nsubvol-delete /s\nquota-enable\n");
    r.clean("quota enabled with a deletion pending", true);
    let c = r.qgroup(5).unwrap();
    assert!(c.rfer >= c.excl, "{c:?}");
}

/// With quotas on, a snapshot taken while a deleted subvolume waits for
/// the cleaner: snapshot() commits, gives the new snapshot a copy of the
/// source's counters, and commits again. If that commit's cleaner dropped
/// the deleted tree in the same transaction as the copy, the extents whose
/// sharers changed would be accounted from committed trees where the new
/// snapshot does not exist yet, and added to its referenced bytes a second
/// time: the commit after the copy must run nothing else (the kernel's
/// qgroup_account_snapshot switches commit roots right after the inherit).
#[test]
fn snapshot_while_a_deletion_awaits_the_cleaner() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run(
        "writefiles / 100 10-3000\nquota-enable\nsnapshot / /b\nsubvol-delete /b\nsnapshot / /c\n",
    );
    r.clean("snapshot after a deletion", true);
    r.clean("the cleaner dropped the deleted snapshot", true);
    assert!(
        !r.tree_exists(256),
        "the deleted snapshot's tree is dropped"
    );
    r.run("write /c/new 0 20000 random:1\nunlink /c/f00000\nremount\n");
    r.clean("changes in the new snapshot", true);
}

/// The same with dirty data everywhere at the snapshot, flushoncommit,
/// and extents shared across subvolumes by reflinks: the writeback and the
/// cleaner both run in the snapshot's first commit, and nothing between
/// the new snapshot's inherit and the commit after it changes a reference.
#[test]
fn snapshot_with_dirty_data_and_a_deletion_pending() {
    let mut r = Rig::with_mount(&["-n", "4096"], &["flushoncommit"]);
    r.run("writefiles / 60 10-9000\nwrite /big 0 300K random:1\nsubvol-create /sv\nclone /big 0 /sv/x 0 0\nquota-enable\nsnapshot / /b\nwrite /b/f00002 0 100 1\nsubvol-delete /b\nwrite /sv/x 4096 5000 3\nwrite /f00003 0 7000 4\nclone /sv/x 0 /sv/y 0 0\nsnapshot / /c\n");
    r.clean("snapshot with dirty data and a deletion pending", true);
    r.run("subvol-delete /c\nwrite /big 0 100K random:5\nsnapshot /sv /sv2\n");
    r.clean("a second deletion and a snapshot of the subvolume", true);
    r.clean("the cleaner ran", true);
    assert!(!r.tree_exists(257) && !r.tree_exists(258) && r.tree_exists(259));
}

/// A subvolume id the cleaner freed is not handed out again before the
/// next mount (the root tree's free objectid is set at mount and only
/// counts up, as the kernel's): the deleted subvolume's free inode number
/// would otherwise be taken for the new one, and a file created in it
/// would get the number of an inode it already has.
#[test]
fn subvolume_id_freed_by_the_cleaner_is_not_reused() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("create /a\ncreate /b\ncreate /c\nsnapshot / /e\nremount\ncreate /e/z\nsubvol-delete /e\ncreate /d\ncreate /f\nsync\nsync\n");
    assert!(!r.tree_exists(256), "the deleted snapshot is dropped");
    r.run("snapshot / /n\ncreate /n/g\n");
    assert!(r.tree_exists(257), "the new snapshot has a fresh id");
    let m = seen(&mut r.fs);
    for p in ["/n/a", "/n/d", "/n/f", "/n/g"] {
        assert!(
            m.entries.get(p).is_some_and(|e| e.kind == 'f'),
            "{p}:\n{}",
            m.render()
        );
    }
    r.clean("a snapshot after a drop", false);
}

/// Deleting the source of a snapshot: the blocks the source created are
/// shared with the snapshot, and the tree blocks below them name the
/// source in their back references. The cleaner's drop gives them full
/// back references first (naming their parent blocks), so the snapshot
/// that keeps them still resolves as their owner and its qgroup holds all
/// of them exclusively; before, they counted for no one once the source
/// was gone. Then the snapshot changes and is snapshotted in turn.
#[test]
fn deleting_the_source_of_a_snapshot() {
    let mut r = Rig::new(&["-n", "4096"]);
    r.run("writefiles / 80 10-9000\nquota-enable\nsubvol-create /s\nwritefiles /s 30 100-5000\nsnapshot /s /t\nsubvol-delete /t\nsnapshot /s /u\nsubvol-delete /s\n");
    r.clean("the source deleted", true);
    r.clean("the cleaner dropped it", true);
    assert!(!r.tree_exists(256));
    let u = r.qgroup(258).expect("the snapshot's qgroup");
    assert!(
        u.excl == u.rfer && u.rfer > 100 << 10,
        "the snapshot holds everything alone: {u:?}"
    );
    r.run(
        "write /u/f00003 0 9000 1\nunlink /u/f00004\nsnapshot /u /v\nwrite /v/f00005 100 100 2\n",
    );
    r.clean("the snapshot changed and snapshotted", true);
    r.run("subvol-delete /u\nremount\n");
    r.clean("and deleted", true);
    r.clean("and dropped", true);
    let v = r.qgroup(259).expect("the second snapshot's qgroup");
    assert_eq!(v.excl, v.rfer, "{v:?}");
}
