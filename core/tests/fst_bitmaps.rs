//! Free space tree upkeep across the extent/bitmap conversion: fragment a
//! data block group by writing thousands of one-sector files and deleting
//! every other one; the group must switch to bitmaps, and `btrfs check` must
//! agree with every entry before and after.

mod common;
mod skip;

use btrkit_core::format::consts::*;
use btrkit_core::format::inode::InodeItem;
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::FileDevice;
use btrkit_core::trans::Store;
use btrkit_core::tree::TreeIter;
use std::path::Path;
use std::sync::Arc;
use zerocopy::FromZeros;

fn bitmap_groups(img: &Path) -> usize {
    let image = Image::open_path(img, OpenOptions::default()).unwrap();
    let root = image
        .find_root(BTRFS_FREE_SPACE_TREE_OBJECTID)
        .unwrap()
        .unwrap();
    let mut n = 0;
    for it in TreeIter::new(&image, root, Key::MIN).unwrap() {
        let it = it.unwrap();
        if it.key.ty == BTRFS_FREE_SPACE_INFO_KEY {
            let d = it.data().unwrap();
            if u32::from_le_bytes([d[4], d[5], d[6], d[7]]) & BTRFS_FREE_SPACE_USING_BITMAPS != 0 {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn fragmented_group_converts_to_bitmaps() {
    if !common::have_btrfs_progs() {
        skip::skip("btrfs-progs not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    {
        let dev = Arc::new(FileDevice::open(&img, true).unwrap());
        let o = btrkit_core::mkfs::MkfsOptions {
            nodesize: 4096,
            ..Default::default()
        };
        let (fs, staged, _) = btrkit_core::mkfs::make(dev, &o).unwrap();
        btrkit_core::mkfs::finish(fs, &staged).unwrap();
    }
    let tree = BTRFS_FS_TREE_OBJECTID;
    let n = 3000u64;
    let dev = Arc::new(FileDevice::open(&img, true).unwrap());
    let mut fs = Store::open(dev).unwrap();
    let mut dir_size = 0;
    for i in 0..n {
        let ino = 257 + i;
        let name = format!("f{i:05}");
        {
            let t = fs.transid();
            btrkit_core::fs::names::add_name(
                &mut fs,
                tree,
                256,
                btrkit_core::fs::inode::inode_key(ino),
                name.as_bytes(),
                BTRFS_FT_REG_FILE,
                2 + i,
                t,
            )
            .unwrap();
        }
        dir_size += 2 * name.len() as u64;
        let nb = btrkit_core::fs::data::write_extent(
            &mut fs,
            tree,
            ino,
            0,
            &vec![(i % 251) as u8; 4096],
            true,
        )
        .unwrap();
        let mut it = InodeItem::new_zeroed();
        it.generation.set(fs.transid());
        it.transid.set(fs.transid());
        it.size.set(4096);
        it.nbytes.set(nb);
        it.nlink.set(1);
        it.mode.set(0o100644);
        btrkit_core::fs::inode::put_inode(&mut fs, tree, ino, &it).unwrap();
    }
    let mut root = btrkit_core::fs::inode::get_inode(&mut fs, tree, 256)
        .unwrap()
        .unwrap();
    root.size.set(dir_size);
    btrkit_core::fs::inode::put_inode(&mut fs, tree, 256, &root).unwrap();
    fs.commit().unwrap();
    drop(fs);
    common::assert_btrfs_check_clean(&img);
    assert_eq!(bitmap_groups(&img), 0);

    let dev = Arc::new(FileDevice::open(&img, true).unwrap());
    let mut fs = Store::open(dev).unwrap();
    let now = btrkit_core::mkfs::now_ts(1);
    for i in (0..n).step_by(2) {
        {
            let (ino, n, _) = btrkit_core::fs::names::unlink(
                &mut fs,
                tree,
                256,
                format!("f{i:05}").as_bytes(),
                now,
            )
            .unwrap();
            if n == 0 {
                btrkit_core::fs::extents::drop_inode_items(&mut fs, tree, ino).unwrap();
            }
        }
    }
    fs.commit().unwrap();
    drop(fs);
    common::assert_btrfs_check_clean(&img);
    assert!(
        bitmap_groups(&img) >= 1,
        "a fragmented data group should use bitmaps"
    );

    let dev = Arc::new(FileDevice::open(&img, true).unwrap());
    let mut fs = Store::open(dev).unwrap();
    for i in (1..n).step_by(2) {
        {
            let (ino, n, _) = btrkit_core::fs::names::unlink(
                &mut fs,
                tree,
                256,
                format!("f{i:05}").as_bytes(),
                now,
            )
            .unwrap();
            if n == 0 {
                btrkit_core::fs::extents::drop_inode_items(&mut fs, tree, ino).unwrap();
            }
        }
    }
    fs.commit().unwrap();
    drop(fs);
    common::assert_btrfs_check_clean(&img);
}
