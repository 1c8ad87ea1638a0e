//! Shared by the `fsck --repair` tests: damage an image held in a crash
//! device one field at a time (checksums fixed, so only the meaning is
//! wrong), and read every file of an image through btrkit's read-only
//! view to tell whether a repair lost or changed any.

use btrkit_core::format::consts::*;
use btrkit_core::format::header::HEADER_SIZE;
use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::io::BlockDevice;
use btrkit_core::mount_view::ReadOnlyView;
use btrkit_core::restore::ReadOptions;
use btrkit_core::tree::TreeIter;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One item of the base image, and where its bytes are on the device.
#[derive(Clone, Debug)]
pub struct Located {
    /// The tree it is in.
    pub tree: u64,
    /// Its key.
    pub key: Key,
    /// Logical address of its leaf.
    pub bytenr: u64,
    /// Offset of its data in the leaf.
    pub data_off: usize,
    /// Length of its data.
    pub data_len: usize,
}

/// Write the whole of `dev` (an image held in memory) to the file `path`,
/// for the programs that take a path: btrfs check, a kernel mount, the
/// binaries.
pub fn write_image(dev: &Arc<dyn BlockDevice>, path: &std::path::Path) {
    let mut whole = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut whole)
        .expect("read the image held in memory");
    std::fs::write(path, &whole).expect("write the image file");
}

/// Every item of `tree` (1 root, 3 chunk, else by id) in `dev` for which
/// `pred` holds.
pub fn items_of(
    dev: Arc<dyn BlockDevice>,
    tree: u64,
    pred: &dyn Fn(&Key, &[u8]) -> bool,
) -> Vec<Located> {
    let Ok(img) = Image::open(dev, OpenOptions::default()) else {
        return Vec::new();
    };
    let root = match tree {
        BTRFS_ROOT_TREE_OBJECTID => img.root_tree(),
        BTRFS_CHUNK_TREE_OBJECTID => img.chunk_tree(),
        _ => match img.find_root(tree) {
            Ok(Some(r)) => r,
            _ => return Vec::new(),
        },
    };
    let mut out = Vec::new();
    let Ok(mut it) = TreeIter::new(&img, root, Key::MIN) else {
        return out;
    };
    while let Some(Ok(item)) = it.next_item() {
        let Ok(d) = item.data() else { continue };
        if !pred(&item.key, d) {
            continue;
        }
        if let Some(h) = item.node.item(item.slot) {
            out.push(Located {
                tree,
                key: item.key,
                bytenr: item.node.bytenr,
                data_off: HEADER_SIZE + h.offset.get() as usize,
                data_len: d.len(),
            });
        }
    }
    out
}

/// Change tree block `bytenr` of `dev` with `f` on every copy, its
/// checksum made right again, and flush.
pub fn patch_tree_block(dev: &Arc<dyn BlockDevice>, bytenr: u64, f: &dyn Fn(&mut [u8])) {
    let img = Image::open(dev.clone(), OpenOptions::default()).expect("open image");
    let ns = img.nodesize as usize;
    let phys = img
        .chunks
        .map(bytenr, ns as u64, img.devid)
        .expect("map block");
    let mut b = vec![0u8; ns];
    dev.read_at(phys[0], &mut b).expect("read block");
    f(&mut b);
    let c = btrkit_core::csum::block_csum(img.csum, &b);
    b[..32].copy_from_slice(&c);
    for p in phys {
        dev.write_at(p, &b).expect("write block");
    }
    dev.flush().expect("flush");
}

/// Change superblock copy `mirror` of `dev` with `f`, its checksum made
/// right again unless `keep_csum`, and flush.
pub fn patch_superblock(
    dev: &dyn BlockDevice,
    mirror: usize,
    keep_csum: bool,
    f: &dyn Fn(&mut [u8]),
) {
    let off = btrfs_sb_offset(mirror);
    let mut b = vec![0u8; BTRFS_SUPER_INFO_SIZE];
    dev.read_at(off, &mut b).expect("read superblock");
    f(&mut b);
    if !keep_csum {
        let t = u16::from_le_bytes([b[0xc4], b[0xc5]]);
        let ty = btrkit_core::csum::CsumType::from_disk(t).expect("csum type");
        let c = ty.compute(&b[32..]);
        b[..32].copy_from_slice(&c);
    }
    dev.write_at(off, &b).expect("write superblock");
    dev.flush().expect("flush");
}

/// What reading a file gave: a digest of its bytes, or the error.
pub type FileRead = Result<u64, String>;

/// Every path of the default subvolume as btrkit's read-only view
/// sees it (through an overlay: nothing written to `dev`): regular files
/// with a digest of their contents, others with their type. `None` when
/// the filesystem cannot be opened at all.
pub fn read_all(dev: Arc<dyn BlockDevice>) -> Option<BTreeMap<String, FileRead>> {
    let mut v = ReadOnlyView::open(
        vec![("image".into(), dev)],
        &ReadOptions::default(),
        None,
        false,
    )
    .ok()?;
    let mut out = BTreeMap::new();
    let mut stack = vec![(1u64, String::new(), 0u32)];
    let mut seen = 0usize;
    while let Some((node, path, depth)) = stack.pop() {
        if depth > 64 || seen > 1_000_000 {
            break;
        }
        let entries = match v.opendir(node).and_then(|h| {
            let e = v.dir_entries(h);
            v.releasedir(h);
            e
        }) {
            Ok(e) => e,
            Err(e) => {
                out.insert(format!("{path}/"), Err(e.to_string()));
                continue;
            }
        };
        for e in entries.iter() {
            seen += 1;
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let p = format!("{path}/{name}");
            match e.ftype {
                BTRFS_FT_DIR => {
                    out.insert(format!("{p}/"), Ok(0));
                    stack.push((e.node, p, depth + 1));
                }
                BTRFS_FT_REG_FILE => {
                    let r = v.getattr(e.node).and_then(|st| {
                        let mut h = 0xcbf29ce484222325u64;
                        let mut off = 0;
                        while off < st.size {
                            let chunk = v.read(e.node, off, (st.size - off).min(1 << 20))?;
                            if chunk.is_empty() {
                                break;
                            }
                            for &b in &chunk {
                                h = (h ^ b as u64).wrapping_mul(0x100000001b3);
                            }
                            off += chunk.len() as u64;
                        }
                        Ok(h ^ st.size)
                    });
                    out.insert(p, r.map_err(|e| e.to_string()));
                }
                t => {
                    out.insert(p, Ok(t as u64));
                }
            }
        }
    }
    Some(out)
}

/// The files that read before and do not read the same after: a path
/// that reads otherwise, or one gone whose contents no new path holds (a
/// repair that puts a corrupted name right moves a file to its real name).
pub fn lost_files(
    before: &BTreeMap<String, FileRead>,
    after: &BTreeMap<String, FileRead>,
) -> Vec<String> {
    let mut moved: Vec<&FileRead> = after
        .iter()
        .filter(|(p, r)| r.is_ok() && !before.contains_key(*p))
        .map(|(_, r)| r)
        .collect();
    let mut lost = Vec::new();
    for (p, r) in before.iter().filter(|(_, r)| r.is_ok()) {
        match after.get(p) {
            Some(a) if a == r => {}
            Some(_) => lost.push(p.clone()),
            None => match moved.iter().position(|m| *m == r) {
                Some(i) => {
                    moved.swap_remove(i);
                }
                None => lost.push(p.clone()),
            },
        }
    }
    lost
}
