//! Crash consistency of the commit protocol: cut a commit at every write
//! (and keep random subsets of the unflushed writes, as a volatile cache
//! may), then reopen. The image must hold exactly the previous or the new
//! generation, never a mix.

mod skip;

use btrkit_core::format::consts::*;
use btrkit_core::format::dir::{name_hash, DirItem};
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::{BlockDevice, CrashDevice, MemDevice};
use btrkit_core::trans::Store;
use btrkit_core::tree::TreeIter;
use std::process::Command;
use std::sync::Arc;
use zerocopy::IntoBytes;

fn xattr(name: &[u8], value: &[u8]) -> Vec<u8> {
    let h = DirItem {
        location: Key::MIN.to_disk(),
        transid: 1.into(),
        data_len: (value.len() as u16).into(),
        name_len: (name.len() as u16).into(),
        type_: BTRFS_FT_XATTR,
    };
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(name);
    v.extend_from_slice(value);
    v
}

/// Names of the xattrs on inode 256 of the fs tree, and the generation.
fn state(img: Vec<u8>) -> Result<(u64, Vec<Vec<u8>>), String> {
    state_dev(Arc::new(MemDevice::new(img)))
}

fn state_dev(dev: Arc<dyn BlockDevice>) -> Result<(u64, Vec<Vec<u8>>), String> {
    let image = Image::open(dev, OpenOptions::default()).map_err(|e| e.to_string())?;
    let root = image
        .find_root(BTRFS_FS_TREE_OBJECTID)
        .map_err(|e| e.to_string())?
        .ok_or("no fs tree")?;
    let mut names = Vec::new();
    for it in TreeIter::new(&image, root, Key::new(256, BTRFS_XATTR_ITEM_KEY, 0))
        .map_err(|e| e.to_string())?
    {
        let it = it.map_err(|e| e.to_string())?;
        if it.key.ty != BTRFS_XATTR_ITEM_KEY {
            break;
        }
        let d = it.data().map_err(|e| e.to_string())?;
        let nl = u16::from_le_bytes([d[27], d[28]]) as usize;
        names.push(d[30..30 + nl].to_vec());
    }
    // Every tree must be readable in full, not just the fs tree.
    for (k, ri) in image
        .root_items_in(image.root_tree())
        .map_err(|e| e.to_string())?
    {
        let t = btrkit_core::image::tree_root_of(k.objectid, &ri);
        for it in TreeIter::new(&image, t, Key::MIN).map_err(|e| e.to_string())? {
            it.map_err(|e| e.to_string())?;
        }
    }
    names.sort();
    Ok((image.sb.generation.get(), names))
}

fn apply(fs: &mut Store, range: std::ops::Range<u32>) {
    for i in range {
        let name = format!("user.crash{i:05}").into_bytes();
        let key = Key::new(256, BTRFS_XATTR_ITEM_KEY, name_hash(&name));
        fs.insert_item(BTRFS_FS_TREE_OBJECTID, &key, &xattr(&name, &[i as u8; 200]))
            .unwrap();
    }
}

#[test]
fn commit_cut_at_every_write() {
    if Command::new("mkfs.btrfs")
        .arg("--version")
        .output()
        .is_err()
    {
        skip::skip("mkfs.btrfs not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    assert!(Command::new("mkfs.btrfs")
        .args(["-f", "-q", "-n", "4096"])
        .arg(&path)
        .status()
        .unwrap()
        .success());
    let base = std::fs::read(&path).unwrap();

    // Generation A: 300 xattrs committed.
    let dev = Arc::new(CrashDevice::new(base));
    let mut fs = Store::open(dev.clone()).unwrap();
    apply(&mut fs, 0..300);
    fs.commit().unwrap();
    let gen_a = dev.current_image();
    let (ga, names_a) = state(gen_a.clone()).unwrap();
    drop(fs);

    // Count the writes of the next commit (B: 300 more xattrs, 100 removed).
    let count = {
        let d = Arc::new(CrashDevice::new(gen_a.clone()));
        let mut fs = Store::open(d.clone()).unwrap();
        apply(&mut fs, 300..600);
        let before = d.writes();
        fs.commit().unwrap();
        let (gb, _) = state(d.current_image()).unwrap();
        assert_eq!(gb, ga + 1);
        d.writes() - before
    };
    assert!(count > 3, "commit made only {count} writes");
    let names_b = {
        let d = Arc::new(CrashDevice::new(gen_a.clone()));
        let mut fs = Store::open(d.clone()).unwrap();
        apply(&mut fs, 300..600);
        fs.commit().unwrap();
        state(d.current_image()).unwrap().1
    };

    let mut seed = 0x1234_5678u64;
    for cut in 0..=count {
        let d = Arc::new(CrashDevice::new(gen_a.clone()));
        let mut fs = Store::open(d.clone()).unwrap();
        apply(&mut fs, 300..600);
        d.fail_after_writes(Some(cut));
        let r = fs.commit();
        assert_eq!(r.is_ok(), cut >= count, "cut {cut} of {count}");
        // Power fails: keep none, all, and random subsets of unflushed writes.
        for variant in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let s = seed;
            let img = match variant {
                0 => d.crash_image(|_| false),
                1 => d.crash_image(|_| true),
                _ => d.crash_image(|i| (s >> (i % 64)) & 1 == 1),
            };
            let (g, names) = state(img)
                .unwrap_or_else(|e| panic!("cut {cut} variant {variant}: image unreadable: {e}"));
            if g == ga {
                assert_eq!(
                    names, names_a,
                    "cut {cut} variant {variant}: old generation with new contents"
                );
            } else {
                assert_eq!(g, ga + 1, "cut {cut} variant {variant}");
                assert_eq!(
                    names, names_b,
                    "cut {cut} variant {variant}: new generation with wrong contents"
                );
            }
        }
        // Torn writes: random 4 KiB pages of each unflushed write survive.
        for variant in 0..4u64 {
            let s = seed.wrapping_mul(variant + 1) | 1;
            let torn = d.crash_device_torn(|i, j| {
                let h = (s
                    ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    ^ (j as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
                .wrapping_mul(0x2545_f491_4f6c_dd1d);
                h >> 63 == 1
            });
            let (g, names) = state_dev(Arc::new(torn))
                .unwrap_or_else(|e| panic!("cut {cut} torn {variant}: image unreadable: {e}"));
            if g == ga {
                assert_eq!(
                    names, names_a,
                    "cut {cut} torn {variant}: old generation with new contents"
                );
            } else {
                assert_eq!(g, ga + 1, "cut {cut} torn {variant}");
                assert_eq!(
                    names, names_b,
                    "cut {cut} torn {variant}: new generation with wrong contents"
                );
            }
        }
    }
}
