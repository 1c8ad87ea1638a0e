//! When metadata block groups fill, new chunks are allocated (chunk item,
//! dev extents, device bytes_used, block group item, free space entries)
//! and the image stays clean for `btrfs check`.

mod common;
mod skip;

use btrkit_core::format::consts::*;
use btrkit_core::format::dir::{name_hash, DirItem};
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::FileDevice;
use btrkit_core::trans::Store;
use std::sync::Arc;
use zerocopy::IntoBytes;

#[test]
fn metadata_fills_and_grows_new_chunks() {
    if !common::have_btrfs_progs() {
        skip::skip("btrfs-progs not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(400 << 20)
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
    let chunks_before = Image::open_path(&img, OpenOptions::default())
        .unwrap()
        .chunks
        .len();
    let dev = Arc::new(FileDevice::open(&img, true).unwrap());
    let mut fs = Store::open(dev).unwrap();
    // ~48 MiB of xattrs: more than the first 32 MiB metadata chunk holds.
    let value = vec![0x5au8; 1800];
    for i in 0..28_000u32 {
        let name = format!("user.fill{i:06}").into_bytes();
        let h = DirItem {
            location: Key::MIN.to_disk(),
            transid: 1.into(),
            data_len: (value.len() as u16).into(),
            name_len: (name.len() as u16).into(),
            type_: BTRFS_FT_XATTR,
        };
        let mut d = h.as_bytes().to_vec();
        d.extend_from_slice(&name);
        d.extend_from_slice(&value);
        let key = Key::new(256, BTRFS_XATTR_ITEM_KEY, name_hash(&name));
        if fs.lookup(BTRFS_FS_TREE_OBJECTID, &key).unwrap().is_some() {
            continue;
        }
        fs.insert_item(BTRFS_FS_TREE_OBJECTID, &key, &d).unwrap();
        if i % 7000 == 6999 {
            fs.commit().unwrap();
        }
    }
    fs.commit().unwrap();
    drop(fs);
    let image = Image::open_path(&img, OpenOptions::default()).unwrap();
    let meta_chunks = image
        .chunks
        .iter()
        .filter(|c| c.type_flags & BTRFS_BLOCK_GROUP_METADATA != 0)
        .count();
    assert!(
        image.chunks.len() > chunks_before && meta_chunks >= 2,
        "expected new metadata chunks, have {meta_chunks}"
    );
    common::assert_btrfs_check_clean(&img);
}
