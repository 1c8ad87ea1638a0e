//! `super-recover`: every superblock copy on every device is read; the
//! valid ones (magic, checksum, `bytenr`) are tried newest generation
//! first, and the first whose trees can be read (the chunk tree, the root
//! tree and the root blocks of the trees it names) is written to every
//! copy of every device, each device's copy with that device's own device
//! item from the chunk tree (btrfs-progs `super-recover.c`).
//!
//! Only superblocks change, each copy written whole, the generation kept:
//! interrupted, each copy is either what it was or the chosen one, and
//! the chosen one stays the newest valid copy, so a second run finishes.

use super::{copies_on, open_devices, write_super_copy, RescueReport, Status};
use crate::csum::CsumType;
use crate::format::consts::*;
use crate::format::dev::DevItem;
use crate::format::key::Key;
use crate::format::superblock::Superblock;
use crate::image::{read_superblock_raw, Image, OpenOptions};
use crate::io::BlockDevice;
use crate::tree::node::Expect;
use crate::tree::TreeIter;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use zerocopy::FromBytes;

/// What [`super_recover`] found and did.
#[derive(Clone, Debug, Serialize)]
pub struct SuperRecover {
    /// Only looked: nothing written.
    pub dry_run: bool,
    /// The copy chosen: its device, copy number and generation.
    pub chosen: Chosen,
    /// Newer generations tried first, and why their trees did not read.
    pub rejected: Vec<String>,
    /// Every copy of every device, before, and whether it was written.
    pub copies: Vec<SuperCopy>,
}

/// The superblock copy written everywhere.
#[derive(Clone, Debug, Serialize)]
pub struct Chosen {
    /// The device it was read from.
    pub device: String,
    /// Its copy number.
    pub mirror: usize,
    /// Its generation.
    pub generation: u64,
}

/// One superblock copy as found.
#[derive(Clone, Debug, Serialize)]
pub struct SuperCopy {
    /// The device, as given.
    pub device: String,
    /// Copy number (0 primary, 1, 2).
    pub mirror: usize,
    /// Byte offset.
    pub offset: u64,
    /// Magic, checksum and bytenr hold.
    pub valid: bool,
    /// Its generation (valid copies).
    pub generation: Option<u64>,
    /// What is wrong with it (invalid copies).
    pub defects: Vec<String>,
    /// Rewritten from the chosen copy (in a dry run: would be).
    pub written: bool,
}

impl RescueReport for SuperRecover {
    fn status(&self) -> Status {
        match (self.copies.iter().any(|c| c.written), self.dry_run) {
            (false, _) => Status::NothingToDo,
            (true, true) => Status::WouldChange,
            (true, false) => Status::Done,
        }
    }
    fn lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .rejected
            .iter()
            .map(|r| format!("not used: {r}"))
            .collect();
        v.push(format!(
            "chosen: {} superblock copy {} (generation {})",
            self.chosen.device, self.chosen.mirror, self.chosen.generation
        ));
        for c in &self.copies {
            let was = if c.valid {
                format!("generation {}", c.generation.unwrap_or(0))
            } else {
                c.defects.join(", ")
            };
            let done = match (c.written, self.dry_run) {
                (false, _) => "kept",
                (true, true) => "would be written",
                (true, false) => "written",
            };
            v.push(format!(
                "{} copy {} (byte {}): {was}: {done}",
                c.device, c.mirror, c.offset
            ));
        }
        match self.status() {
            Status::NothingToDo => v.push("all superblock copies are good: nothing to do".into()),
            Status::WouldChange => v.push("dry run: nothing written".into()),
            _ => v.push("superblocks recovered".into()),
        }
        v
    }
}

struct Found {
    dev: usize,
    mirror: usize,
    sb: Superblock,
    valid: bool,
    offset: u64,
    defects: Vec<String>,
    raw: Vec<u8>,
}

/// Recover the superblock copies of the devices at `paths` (every device
/// of the filesystem).
pub fn super_recover(paths: &[PathBuf], dry_run: bool) -> Result<SuperRecover> {
    let devs = open_devices(paths, dry_run)?;
    let mut found: Vec<Found> = Vec::new();
    for (i, (_, d)) in devs.iter().enumerate() {
        for mirror in 0..copies_on(d.size()) {
            let (sb, st) = read_superblock_raw(d.as_ref(), mirror)?;
            let mut raw = vec![0u8; BTRFS_SUPER_INFO_SIZE];
            d.read_at(st.offset, &mut raw)?;
            found.push(Found {
                dev: i,
                mirror,
                sb,
                valid: st.is_valid(),
                offset: st.offset,
                defects: st.defects(),
                raw,
            });
        }
    }
    let valid: Vec<&Found> = found.iter().filter(|f| f.valid).collect();
    let Some(first) = valid.first() else {
        return Err(Error::NotBtrfs(
            "no superblock copy on the devices given is valid (magic, checksum and bytenr)".into(),
        ));
    };
    if let Some(other) = valid.iter().find(|f| f.sb.fsid != first.sb.fsid) {
        return Err(Error::Invalid(format!(
            "{} and {} hold superblocks of different filesystems",
            devs[first.dev].0, devs[other.dev].0
        )));
    }
    // Each device's id: from its newest valid copy.
    let mut devid_of: BTreeMap<usize, u64> = BTreeMap::new();
    for f in &valid {
        let newer = valid
            .iter()
            .filter(|g| g.dev == f.dev)
            .all(|g| g.sb.generation.get() <= f.sb.generation.get());
        if newer {
            devid_of.insert(f.dev, f.sb.dev_item.devid.get());
        }
    }
    for (i, (name, _)) in devs.iter().enumerate() {
        if !devid_of.contains_key(&i) {
            return Err(Error::Invalid(format!(
                "{name}: no valid superblock copy says which device it is"
            )));
        }
    }
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for (&i, &id) in &devid_of {
        if let Some(j) = seen.insert(id, i) {
            return Err(Error::Invalid(format!(
                "{} and {} are both device {id}",
                devs[j].0, devs[i].0
            )));
        }
    }
    let mut gens: Vec<u64> = valid.iter().map(|f| f.sb.generation.get()).collect();
    gens.sort_unstable_by(|a, b| b.cmp(a));
    gens.dedup();
    let mut rejected = Vec::new();
    let mut chosen = None;
    for g in gens {
        let Some(c) = valid.iter().find(|f| f.sb.generation.get() == g) else {
            continue;
        };
        match try_open(&devs, &devid_of, c) {
            Ok(items) => {
                chosen = Some((*c, items));
                break;
            }
            Err(e) => rejected.push(format!(
                "generation {g} ({} copy {}): {e}",
                devs[c.dev].0, c.mirror
            )),
        }
    }
    let Some((c, dev_items)) = chosen else {
        return Err(Error::corrupt_as(
            crate::CorruptKind::Superblock,
            format!(
                "no valid superblock copy has trees that can be read ({})",
                rejected.join("; ")
            ),
            0,
        ));
    };
    let csum = CsumType::from_disk(c.sb.csum_type.get())?;
    if c.sb.num_devices.get() != devs.len() as u64 {
        return Err(Error::MissingDevice {
            devids: Vec::new(),
            what: format!(
                "the filesystem has {} devices and {} were given: give every device",
                c.sb.num_devices.get(),
                devs.len()
            ),
        });
    }
    let mut out = SuperRecover {
        dry_run,
        chosen: Chosen {
            device: devs[c.dev].0.clone(),
            mirror: c.mirror,
            generation: c.sb.generation.get(),
        },
        rejected,
        copies: Vec::new(),
    };
    for (i, (name, d)) in devs.iter().enumerate() {
        let devid = devid_of[&i];
        let mut sb = c.sb;
        match dev_items.get(&devid) {
            Some(di) => sb.dev_item = *di,
            None => {
                // A device the chunk tree does not name keeps its own item.
                if let Some(own) = found
                    .iter()
                    .filter(|f| f.dev == i && f.valid)
                    .max_by_key(|f| f.sb.generation.get())
                {
                    sb.dev_item = own.sb.dev_item;
                }
            }
        }
        let mut wrote = false;
        for f in found.iter().filter(|f| f.dev == i) {
            let want = crate::trans::super_bytes(&sb, f.offset, csum);
            let write = !f.valid || want != f.raw;
            if write && !dry_run {
                write_super_copy(d.as_ref(), &sb, f.mirror, csum)?;
                wrote = true;
            }
            out.copies.push(SuperCopy {
                device: name.clone(),
                mirror: f.mirror,
                offset: f.offset,
                valid: f.valid,
                generation: f.valid.then(|| f.sb.generation.get()),
                defects: f.defects.clone(),
                written: write,
            });
        }
        if wrote {
            d.flush()?;
        }
    }
    Ok(out)
}

/// Open the filesystem from copy `c` and read its trees' roots; the
/// device items of its chunk tree, by devid.
fn try_open(
    devs: &[(String, Arc<dyn BlockDevice>)],
    devid_of: &BTreeMap<usize, u64>,
    c: &Found,
) -> Result<BTreeMap<u64, DevItem>> {
    let others = devs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != c.dev)
        .map(|(i, (_, d))| (devid_of[&i], d.clone()))
        .collect();
    let names = devs
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (devid_of[&i], n.clone()))
        .collect();
    let img = Image::open_devices(
        devs[c.dev].1.clone(),
        others,
        names,
        OpenOptions {
            mirror: c.mirror,
            ..Default::default()
        },
    )?;
    trees_readable(&img)?;
    let mut items = BTreeMap::new();
    let mut it = TreeIter::new(&img, img.chunk_tree(), Key::MIN)?;
    while let Some(r) = it.next_item() {
        let item = r?;
        if item.key.ty == BTRFS_DEV_ITEM_KEY {
            if let Ok(di) = DevItem::read_from_bytes(item.data()?) {
                items.insert(item.key.offset, di);
            }
        }
    }
    Ok(items)
}

/// The root tree reads, and so does the root block of every tree that
/// opening the filesystem needs (extent, dev, checksum, free space and
/// block group trees; as btrfs-progs' `open_ctree`). A damaged subvolume
/// is the checker's, not a reason to prefer an older superblock.
pub(crate) fn trees_readable(img: &Image) -> Result<()> {
    let root = img.root_tree();
    img.read_tree_block(root.bytenr, &Expect::root(&root), false)?;
    for (k, ri) in img.root_items_in(root)? {
        if !matches!(
            k.objectid,
            BTRFS_EXTENT_TREE_OBJECTID
                | BTRFS_DEV_TREE_OBJECTID
                | BTRFS_CSUM_TREE_OBJECTID
                | BTRFS_FREE_SPACE_TREE_OBJECTID
                | BTRFS_BLOCK_GROUP_TREE_OBJECTID
        ) {
            continue;
        }
        let t = crate::image::tree_root_of(k.objectid, &ri);
        img.read_tree_block(t.bytenr, &Expect::root(&t), false)?;
    }
    Ok(())
}
