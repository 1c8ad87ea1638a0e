//! Model-based test of the write path: random xattr inserts, updates and
//! deletes on the root directories of two trees of an image made by
//! mkfs.btrfs, with commits in between; after reopening, every tree must
//! hold exactly what an in-memory model says, and `btrfs check` must find
//! the image clean.

mod common;
mod skip;

use btrkit_core::format::consts::*;
use btrkit_core::format::dir::{name_hash, DirItem};
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::FileDevice;
use btrkit_core::trans::Store;
use btrkit_core::tree::TreeIter;
use btrkit_core::util::prng::Prng;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use zerocopy::IntoBytes;

fn have(cmd: &str) -> bool {
    Command::new(cmd).arg("--version").output().is_ok()
}

fn mkfs(path: &Path, size: u64, args: &[&str]) -> bool {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let st = Command::new("mkfs.btrfs")
        .args(["-f", "-q"])
        .args(args)
        .arg(path)
        .status();
    matches!(st, Ok(s) if s.success())
}

fn xattr_item(name: &[u8], value: &[u8], transid: u64) -> Vec<u8> {
    let h = DirItem {
        location: Key::MIN.to_disk(),
        transid: transid.into(),
        data_len: (value.len() as u16).into(),
        name_len: (name.len() as u16).into(),
        type_: BTRFS_FT_XATTR,
    };
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(name);
    v.extend_from_slice(value);
    v
}

type Model = BTreeMap<(u64, Key), (Vec<u8>, Vec<u8>)>;

fn run_model(seed: u64, nodesize: &str, ops: usize, commit_every: usize, extra: &[&str]) -> u8 {
    if !have("mkfs.btrfs") || !have("btrfs") {
        skip::skip("btrfs-progs not installed");
        return 0;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    if extra == ["btrkit"] {
        // The same model on an image made by our own mkfs.
        std::fs::File::create(&img)
            .unwrap()
            .set_len(512 << 20)
            .unwrap();
        let dev = Arc::new(FileDevice::open(&img, true).unwrap());
        let o = btrkit_core::mkfs::MkfsOptions {
            nodesize: nodesize.parse().unwrap(),
            ..Default::default()
        };
        let (fs, staged, _) = btrkit_core::mkfs::make(dev, &o).unwrap();
        btrkit_core::mkfs::finish(fs, &staged).unwrap();
    } else {
        let mut args = vec!["-n", nodesize];
        args.extend_from_slice(extra);
        assert!(mkfs(&img, 512 << 20, &args), "mkfs.btrfs failed");
    }
    let trees = [BTRFS_FS_TREE_OBJECTID, BTRFS_DATA_RELOC_TREE_OBJECTID];
    let mut model: Model = BTreeMap::new();
    let mut rng = Prng::new(seed);
    {
        let dev = Arc::new(FileDevice::open(&img, true).unwrap());
        let mut fs = Store::open(dev).unwrap();
        for i in 0..ops {
            let tree = trees[rng.below(2) as usize];
            let op = rng.below(10);
            let existing: Vec<(u64, Key)> =
                model.keys().filter(|(t, _)| *t == tree).copied().collect();
            if op < 6 || existing.is_empty() {
                let name = format!("user.k{}", rng.next_u64() % 100_000_000).into_bytes();
                let vlen = [0usize, 5, 40, 300, 1500][rng.below(5) as usize];
                let value: Vec<u8> = (0..vlen).map(|_| rng.next_u64() as u8).collect();
                let key = Key::new(256, BTRFS_XATTR_ITEM_KEY, name_hash(&name));
                if model.contains_key(&(tree, key)) {
                    continue;
                }
                fs.insert_item(tree, &key, &xattr_item(&name, &value, fs.transid()))
                    .unwrap();
                model.insert((tree, key), (name, value));
            } else if op < 8 {
                let k = existing[rng.below(existing.len() as u64) as usize];
                let vlen = [0usize, 9, 120, 700][rng.below(4) as usize];
                let value: Vec<u8> = (0..vlen).map(|_| rng.next_u64() as u8).collect();
                let name = model[&k].0.clone();
                fs.update_item(k.0, &k.1, &xattr_item(&name, &value, fs.transid()))
                    .unwrap();
                model.insert(k, (name, value));
            } else {
                let k = existing[rng.below(existing.len() as u64) as usize];
                assert!(fs.delete_item(k.0, &k.1).unwrap());
                model.remove(&k);
            }
            if (i + 1) % commit_every == 0 {
                fs.commit()
                    .unwrap_or_else(|e| panic!("commit after op {i}: {e}"));
            }
        }
        fs.commit().unwrap();
    }
    // Reopen read-only and compare with the model.
    let image = Image::open_path(&img, OpenOptions::default()).unwrap();
    let mut max_level = 0;
    for &tree in &trees {
        let root = image.find_root(tree).unwrap().unwrap();
        max_level = max_level.max(root.level);
        let mut got = Vec::new();
        for it in TreeIter::new(&image, root, Key::new(256, BTRFS_XATTR_ITEM_KEY, 0)).unwrap() {
            let it = it.unwrap();
            if it.key.objectid != 256 || it.key.ty != BTRFS_XATTR_ITEM_KEY {
                break;
            }
            let d = it.data().unwrap();
            let nl = u16::from_le_bytes([d[27], d[28]]) as usize;
            let dl = u16::from_le_bytes([d[25], d[26]]) as usize;
            got.push((
                it.key,
                d[30..30 + nl].to_vec(),
                d[30 + nl..30 + nl + dl].to_vec(),
            ));
        }
        let want: Vec<(Key, Vec<u8>, Vec<u8>)> = model
            .iter()
            .filter(|((t, _), _)| *t == tree)
            .map(|((_, k), (n, v))| (*k, n.clone(), v.clone()))
            .collect();
        assert_eq!(got.len(), want.len(), "tree {tree}: item count");
        assert!(got == want, "tree {tree}: contents differ from the model");
    }
    if let Ok(keep) = std::env::var("BTRKIT_KEEP_IMG") {
        let _ = std::fs::copy(&img, format!("{keep}-{seed:x}"));
    }
    let (ok, text) = common::btrfs_check(&img);
    assert!(ok, "btrfs check failed:\n{text}");
    assert!(
        text.contains("no error found"),
        "btrfs check output:\n{text}"
    );
    max_level
}

#[test]
fn model_16k_nodes() {
    assert!(run_model(0x5eed, "16384", 3000, 250, &[]) >= 1 || !have("mkfs.btrfs"));
}

#[test]
fn model_4k_nodes_deep_trees() {
    let level = run_model(0xbeef, "4096", 7000, 400, &[]);
    assert!(
        level >= 2 || !have("mkfs.btrfs"),
        "trees should have grown to level 2, got {level}"
    );
}

#[test]
fn model_non_skinny_no_fst() {
    run_model(
        0xfeed,
        "4096",
        1500,
        300,
        &["-O", "^skinny-metadata", "-R", "^free-space-tree"],
    );
}

#[test]
fn model_on_btrkit_mkfs_image() {
    assert!(run_model(0xabcd, "4096", 3000, 300, &["btrkit"]) >= 1 || !have("mkfs.btrfs"));
}
