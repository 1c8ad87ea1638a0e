//! Writing into a subvolume that a snapshot shares: the engine must give
//! the blocks below a copied shared block the right back references (shared
//! and keyed ones included), drop exactly its own reference to the old
//! block, and leave the snapshot untouched. `btrfs check` is the judge, and
//! the kernel reads both trees back.

use btrkit_core::format::consts::*;
use btrkit_core::io::FileDevice;
use btrkit_core::mkfs::now_ts;
use btrkit_core::trans::Store;
use btrkit_tests::oracle::{self, Progs};
use btrkit_tests::{require_btrfs_progs, require_kernel_mount, skip_unless, KernelImage, MkfsOpts};
use std::process::Command;
use std::sync::Arc;

fn check(img: &std::path::Path) {
    oracle::assert_btrfs_check_clean(&[img], Progs::Distro, &img.display().to_string());
}

#[test]
fn unlink_in_snapshotted_subvolume() {
    skip_unless!(require_btrfs_progs(), require_kernel_mount());
    for nodesize in [4096u32, 16384] {
        let mut k =
            KernelImage::new_mounted(&MkfsOpts::default().size(512 << 20).nodesize(nodesize), "");
        std::fs::create_dir(k.path("d")).unwrap();
        for i in 0..1500 {
            std::fs::write(
                k.path(&format!("d/f{i:04}")),
                vec![(i % 251) as u8; 5000 + i],
            )
            .unwrap();
        }
        k.sync();
        assert!(Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(k.mnt())
            .arg(k.path("snap"))
            .status()
            .unwrap()
            .success());
        k.sync();
        k.umount();
        check(k.image());

        // Our engine removes two thirds of the files in the fs tree; the
        // snapshot must keep all of them.
        let dev = Arc::new(FileDevice::open(k.image(), true).unwrap());
        let mut fs = Store::open(dev).unwrap();
        let dir_ino = {
            let key = btrkit_core::format::key::Key::new(
                256,
                BTRFS_DIR_ITEM_KEY,
                btrkit_core::format::dir::name_hash(b"d"),
            );
            let d = fs.lookup(BTRFS_FS_TREE_OBJECTID, &key).unwrap().unwrap();
            u64::from_le_bytes(d[..8].try_into().unwrap())
        };
        for i in (0..1500).filter(|i| i % 3 != 0) {
            {
                let (ino, n, _) = btrkit_core::fs::names::unlink(
                    &mut fs,
                    BTRFS_FS_TREE_OBJECTID,
                    dir_ino,
                    format!("f{i:04}").as_bytes(),
                    now_ts(1),
                )
                .unwrap();
                if n == 0 {
                    btrkit_core::fs::extents::drop_inode_items(
                        &mut fs,
                        BTRFS_FS_TREE_OBJECTID,
                        ino,
                    )
                    .unwrap();
                }
            }
            if i % 500 == 499 {
                fs.commit().unwrap();
            }
        }
        fs.commit().unwrap();
        drop(fs);
        check(k.image());

        k.mount("ro");
        let left = std::fs::read_dir(k.path("d")).unwrap().count();
        let snap = std::fs::read_dir(k.path("snap/d")).unwrap().count();
        assert_eq!(left, 500, "nodesize {nodesize}");
        assert_eq!(snap, 1500, "nodesize {nodesize}: the snapshot changed");
        for i in [0usize, 1, 2, 999, 1499] {
            let s = std::fs::read(k.path(&format!("snap/d/f{i:04}"))).unwrap();
            assert_eq!(s, vec![(i % 251) as u8; 5000 + i]);
        }
        k.umount();
    }
}
