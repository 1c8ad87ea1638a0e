//! Phase 2: chunk items against dev extents, block group items against
//! chunks, block group `used` against the extent tree, device `bytes_used`
//! against its dev extents.

use super::findings::{Category, Phase, Repair, F};
use super::Ctx;
use crate::format::chunk::{chunk_problems, parse_chunk, CHUNK_ITEM_SIZE, STRIPE_SIZE};
use crate::format::consts::*;
use crate::format::item::{decode, ItemBody};
use crate::format::key::DiskKey;
use crate::format::key::Key;
use crate::format::names::block_group_flags_str;
use crate::tree::Node;
use zerocopy::FromBytes;

const P: Phase = Phase::Chunks;

#[derive(Clone, Debug)]
pub(crate) struct ChunkRec {
    pub logical: u64,
    pub length: u64,
    pub flags: u64,
    pub num_stripes: u64,
    pub stripes: Vec<(u64, u64)>,
}

impl ChunkRec {
    /// Bytes each stripe occupies on its device.
    pub fn dev_extent_len(&self) -> u64 {
        crate::chunk::stripe_length(self.flags, self.length, self.num_stripes)
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct DevRec {
    pub devid: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub uuid: [u8; 16],
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct DevExtRec {
    pub devid: u64,
    pub physical: u64,
    pub length: u64,
    pub chunk_offset: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BgRec {
    pub start: u64,
    pub length: u64,
    pub used: u64,
    pub flags: u64,
}

impl BgRec {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.length)
    }
}

#[derive(Default)]
pub(crate) struct Facts {
    pub chunks: Vec<ChunkRec>,
    pub dev_items: Vec<DevRec>,
    pub dev_extents: Vec<DevExtRec>,
    /// Sorted by start once phase 3 is over.
    pub block_groups: Vec<BgRec>,
    /// True when the tree holding block group items was read.
    pub bg_loaded: bool,
    /// Each present device's own device item from its superblock, on a
    /// filesystem of several devices: (devid, total_bytes, bytes_used, uuid).
    pub sb_dev_items: Vec<(u64, u64, u64, [u8; 16])>,
}

impl Facts {
    /// The block group containing `bytenr`.
    pub fn bg_of(&self, bytenr: u64) -> Option<&BgRec> {
        let i = self.block_groups.partition_point(|b| b.start <= bytenr);
        let b = self.block_groups.get(i.checked_sub(1)?)?;
        (bytenr < b.end()).then_some(b)
    }
}

pub(super) fn on_chunk_leaf(cx: &mut Ctx, node: &Node) {
    let cs = cx.img.csum.size();
    let mixed = cx.has_incompat(BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS);
    let ss = cx.img.sectorsize;
    for slot in 0..node.nr_safe() {
        let Some(k) = node.key(slot) else { continue };
        let Ok(d) = node.item_data(slot) else {
            continue;
        };
        match decode(&k, d, cs) {
            Ok(ItemBody::Chunk(c, s)) => {
                for m in chunk_problems(c, k.offset, ss, mixed) {
                    cx.report(
                        F::err(P, Category::Chunk)
                            .tree(3)
                            .at(node.bytenr)
                            .key(k)
                            .msg(format!("chunk at {}: {m}", k.offset)),
                    );
                }
                cx.chunks.chunks.push(ChunkRec {
                    logical: k.offset,
                    length: c.length.get(),
                    flags: c.type_.get(),
                    num_stripes: c.num_stripes.get() as u64,
                    stripes: s.iter().map(|s| (s.devid.get(), s.offset.get())).collect(),
                })
            }
            Ok(ItemBody::DevItem(d)) => cx.chunks.dev_items.push(DevRec {
                devid: d.devid.get(),
                total_bytes: d.total_bytes.get(),
                bytes_used: d.bytes_used.get(),
                uuid: d.uuid,
            }),
            _ => {}
        }
    }
}

pub(super) fn on_dev_leaf(cx: &mut Ctx, node: &Node) {
    for slot in 0..node.nr_safe() {
        let Some(k) = node.key(slot) else { continue };
        if k.ty != BTRFS_DEV_EXTENT_KEY {
            continue;
        }
        let Ok(d) = node.item_data(slot) else {
            continue;
        };
        if let Ok(ItemBody::DevExtent(e)) = decode(&k, d, 0) {
            cx.chunks.dev_extents.push(DevExtRec {
                devid: k.objectid,
                physical: k.offset,
                length: e.length.get(),
                chunk_offset: e.chunk_offset.get(),
            });
        }
    }
}

/// Block group items live in the extent tree or the block group tree.
pub(super) fn on_bg_item(cx: &mut Ctx, k: &Key, d: &[u8]) {
    if let Ok(ItemBody::BlockGroup(b)) = decode(k, d, 0) {
        cx.chunks.block_groups.push(BgRec {
            start: k.objectid,
            length: k.offset,
            used: b.used.get(),
            flags: b.flags.get(),
        });
    }
}

pub(super) fn check(cx: &mut Ctx) {
    let mut chunks = std::mem::take(&mut cx.chunks.chunks);
    chunks.sort_by_key(|c| c.logical);
    let mut dexts = std::mem::take(&mut cx.chunks.dev_extents);
    dexts.sort_by_key(|d| (d.devid, d.physical));
    let bgs = std::mem::take(&mut cx.chunks.block_groups);
    let ss = cx.img.sectorsize as u64;
    let dev_size = |devid: u64| cx.img.device_of(devid).map(|d| d.size());
    cx.sink
        .checked(P, (chunks.len() + dexts.len() + bgs.len()) as u64);

    // Chunks: sane, non-overlapping, each stripe backed by its dev extent.
    let mut prev_end = 0u64;
    for c in &chunks {
        if c.length == 0 || c.length % ss != 0 || c.logical % ss != 0 {
            cx.report(
                F::err(P, Category::Chunk)
                    .tree(3)
                    .at(c.logical)
                    .msg(format!(
                        "chunk at {} has invalid length {}",
                        c.logical, c.length
                    )),
            );
        }
        if c.flags & BTRFS_BLOCK_GROUP_TYPE_MASK == 0 {
            cx.report(
                F::err(P, Category::Chunk)
                    .tree(3)
                    .at(c.logical)
                    .msg(format!(
                        "chunk at {} has no data/metadata/system type",
                        c.logical
                    )),
            );
        }
        if c.logical < prev_end {
            cx.report(
                F::err(P, Category::Chunk)
                    .tree(3)
                    .at(c.logical)
                    .msg(format!(
                        "chunk at {} overlaps the previous chunk",
                        c.logical
                    )),
            );
        }
        prev_end = prev_end.max(c.logical.saturating_add(c.length));
        let want = c.dev_extent_len();
        for &(devid, phys) in &c.stripes {
            let i = dexts.partition_point(|d| (d.devid, d.physical) < (devid, phys));
            match dexts.get(i) {
                Some(d) if d.devid == devid && d.physical == phys => {
                    if d.chunk_offset != c.logical || d.length != want {
                        // The chunk maps the data: its stripe says what
                        // the dev extent at its place must hold.
                        cx.report(F::err(P, Category::DevExtent).tree(4).at(phys).fix(Repair::DevExtentFromChunk {
                            devid,
                            physical: phys,
                            chunk: c.logical,
                            length: want,
                        }).msg(format!(
                            "dev extent {devid}:{phys} (chunk {} length {}) does not match chunk {} stripe length {want}",
                            d.chunk_offset, d.length, c.logical
                        )));
                    }
                }
                _ => cx.report(
                    F::err(P, Category::DevExtent)
                        .tree(4)
                        .at(c.logical)
                        .msg(format!(
                            "chunk {} stripe on device {devid} at {phys} has no dev extent",
                            c.logical
                        )),
                ),
            }
        }
    }

    // Dev extents: owned by a chunk, no overlap, inside the device.
    let stripes: std::collections::HashSet<(u64, u64)> = chunks
        .iter()
        .flat_map(|c| c.stripes.iter().copied())
        .collect();
    // Where a chunk's stripe says the dev extent at (devid, physical)
    // must end, by the chunk's own length.
    let stripe_end: std::collections::HashMap<(u64, u64), (u64, u64)> = chunks
        .iter()
        .flat_map(|c| {
            let want = c.dev_extent_len();
            c.stripes
                .iter()
                .map(move |&(d, p)| ((d, p), (c.logical, want)))
        })
        .collect();
    let mut used_by_dev: Vec<(u64, u64)> = Vec::new();
    let mut prev: Option<DevExtRec> = None;
    for d in &dexts {
        let i = chunks.partition_point(|c| c.logical < d.chunk_offset);
        let owned = chunks.get(i).is_some_and(|c| {
            c.logical == d.chunk_offset && c.stripes.contains(&(d.devid, d.physical))
        });
        if !owned {
            // No chunk has a stripe there: its space is nobody's (btrfs
            // check --repair deletes it). One a chunk's stripe names but
            // that points elsewhere is a mismatch of the chunk's, left.
            let mut f = F::err(P, Category::DevExtent).tree(4).at(d.physical);
            if !stripes.contains(&(d.devid, d.physical)) {
                f = f.fix(Repair::DeleteDevExtent {
                    devid: d.devid,
                    physical: d.physical,
                });
            }
            cx.report(f.msg(format!(
                "dev extent {}:{} length {} points to chunk {} which has no such stripe",
                d.devid, d.physical, d.length, d.chunk_offset
            )));
        }
        if let Some(p) = prev {
            if p.devid == d.devid && p.physical.saturating_add(p.length) > d.physical {
                cx.report(
                    F::err(P, Category::DevExtent)
                        .tree(4)
                        .at(d.physical)
                        .msg(format!(
                            "dev extent {}:{} overlaps dev extent at {}",
                            d.devid, d.physical, p.physical
                        )),
                );
            }
        }
        prev = Some(*d);
        let end = d.physical.saturating_add(d.length);
        // A length the chunk disagrees with is the chunk's to say; a dev
        // extent that fits its chunk and the device but not the device
        // item's size says the item is wrong.
        let from_chunk = stripe_end
            .get(&(d.devid, d.physical))
            .filter(|&&(logical, want)| d.chunk_offset != logical || d.length != want)
            .map(|&(chunk, length)| Repair::DevExtentFromChunk {
                devid: d.devid,
                physical: d.physical,
                chunk,
                length,
            });
        let real = dev_size(d.devid);
        if let Some(dev) = cx.chunks.dev_items.iter().find(|x| x.devid == d.devid) {
            if end > dev.total_bytes {
                let mut f = F::err(P, Category::DevExtent).tree(4).at(d.physical);
                if let Some(r) = from_chunk.clone() {
                    f = f.fix(r);
                } else if owned && real.is_some_and(|z| end <= z) {
                    f = f.fix(Repair::DeviceSizes);
                }
                cx.report(f.msg(format!(
                    "dev extent {}:{} ends at {end}, past the device size {}",
                    d.devid, d.physical, dev.total_bytes
                )));
            }
        } else {
            cx.report(
                F::err(P, Category::DevExtent)
                    .tree(4)
                    .at(d.physical)
                    .msg(format!("dev extent on unknown device {}", d.devid)),
            );
        }
        if let Some(size) = real.filter(|&z| end > z) {
            let mut f = F::err(P, Category::DevExtent).tree(4).at(d.physical);
            if let Some(r) = from_chunk.clone() {
                f = f.fix(r);
            }
            cx.report(f.msg(format!(
                "dev extent {}:{} ends at {end}, past the end of the image ({size} bytes)",
                d.devid, d.physical
            )));
        }
        match used_by_dev.iter_mut().find(|(id, _)| *id == d.devid) {
            Some((_, u)) => *u = u.saturating_add(d.length),
            None => used_by_dev.push((d.devid, d.length)),
        }
    }
    let devs = cx.chunks.dev_items.clone();
    for dev in &devs {
        if dev.bytes_used > dev.total_bytes {
            cx.report(F::err(P, Category::DevItem).tree(3).msg(format!(
                "device {} bytes_used {} exceeds its total_bytes {}",
                dev.devid, dev.bytes_used, dev.total_bytes
            )));
        }
        if let Some(size) = dev_size(dev.devid).filter(|&z| dev.total_bytes > z) {
            cx.report(F::err(P, Category::DevItem).tree(3).msg(format!(
                "device {} total_bytes {} but the image holds only {size} bytes (a shrunk or truncated device)",
                dev.devid, dev.total_bytes
            )));
        }
        let used = used_by_dev
            .iter()
            .find(|(id, _)| *id == dev.devid)
            .map(|x| x.1)
            .unwrap_or(0);
        if used != dev.bytes_used {
            cx.report(
                F::err(P, Category::DevItem)
                    .tree(3)
                    .fix(Repair::DeviceSizes)
                    .msg(format!(
                        "device {} bytes_used {} but its dev extents total {used}",
                        dev.devid, dev.bytes_used
                    )),
            );
        }
    }
    if devs.is_empty() {
        cx.report(
            F::err(P, Category::DevItem)
                .tree(3)
                .msg("the chunk tree holds no device item"),
        );
    }

    // Block groups against chunks, and their used bytes against the extent tree.
    if cx.chunks.bg_loaded {
        for b in &bgs {
            let i = chunks.partition_point(|c| c.logical < b.start);
            match chunks.get(i) {
                Some(c) if c.logical == b.start => {
                    if c.length != b.length || c.flags != b.flags {
                        cx.report(F::err(P, Category::BlockGroup).at(b.start).msg(format!(
                            "block group {}+{} [{}] does not match its chunk {}+{} [{}]",
                            b.start,
                            b.length,
                            block_group_flags_str(b.flags),
                            c.logical,
                            c.length,
                            block_group_flags_str(c.flags)
                        )));
                    }
                }
                _ => cx.report(
                    F::err(P, Category::BlockGroup)
                        .at(b.start)
                        .msg(format!("block group {}+{} has no chunk", b.start, b.length)),
                ),
            }
            if b.used > b.length {
                cx.report(
                    F::err(P, Category::BlockGroup)
                        .at(b.start)
                        .fix(Repair::BlockGroupUsage)
                        .msg(format!(
                            "block group {} used {} exceeds its length {}",
                            b.start, b.used, b.length
                        )),
                );
            }
        }
        for c in &chunks {
            let i = bgs.partition_point(|b| b.start < c.logical);
            if bgs.get(i).is_none_or(|b| b.start != c.logical) {
                cx.report(F::err(P, Category::BlockGroup).at(c.logical).msg(format!(
                    "chunk {}+{} has no block group item",
                    c.logical, c.length
                )));
            }
        }
        for (i, b) in bgs.iter().enumerate() {
            let found = cx.ext.used_in(b.start, b.end(), cx.img.nodesize as u64);
            if found != b.used {
                cx.report(
                    F::err(P, Category::BlockGroup)
                        .at(b.start)
                        .fix(Repair::BlockGroupUsage)
                        .msg(format!(
                            "block group {}+{} used {} but its extents total {found}",
                            b.start, b.length, b.used
                        )),
                );
            }
            if i > 0 && bgs[i - 1].end() > b.start {
                cx.report(
                    F::err(P, Category::BlockGroup)
                        .at(b.start)
                        .msg(format!("block group {} overlaps the previous one", b.start)),
                );
            }
        }
    }
    check_sys_chunk_array(cx, &chunks);
    cx.chunks.chunks = chunks;
    cx.chunks.dev_extents = dexts;
    cx.chunks.block_groups = bgs;
}

/// The superblock's copy of the system chunks: each entry a valid chunk,
/// the same as the chunk tree's, and every system chunk listed (the chunk
/// tree can only be read through it).
fn check_sys_chunk_array(cx: &mut Ctx, tree_chunks: &[ChunkRec]) {
    let sb = &cx.img.sb;
    let at = btrfs_sb_offset(cx.img.mirror);
    let size = sb.sys_chunk_array_size.get() as usize;
    let arr = sb.sys_chunk_array();
    let arr = &arr[..size.min(arr.len())];
    let mixed = cx.has_incompat(BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS);
    let ss = cx.img.sectorsize;
    let mut found = Vec::new();
    let mut problems = Vec::new();
    let mut p = 0usize;
    while p < arr.len() {
        let Ok((dk, _)) = DiskKey::read_from_prefix(&arr[p..]) else {
            problems.push(format!("sys_chunk_array truncated at offset {p}"));
            break;
        };
        let key = crate::format::key::Key::from(dk);
        p += std::mem::size_of::<DiskKey>();
        let Ok((c, st)) = parse_chunk(&arr[p..]) else {
            problems.push(format!("sys_chunk_array entry at offset {p} unreadable"));
            break;
        };
        p += CHUNK_ITEM_SIZE + st.len() * STRIPE_SIZE;
        for m in chunk_problems(c, key.offset, ss, mixed) {
            problems.push(format!("sys_chunk_array chunk at {}: {m}", key.offset));
        }
        if c.type_.get() & BTRFS_BLOCK_GROUP_SYSTEM == 0 {
            problems.push(format!(
                "sys_chunk_array chunk at {} is not a system chunk",
                key.offset
            ));
        }
        let stripes: Vec<(u64, u64)> = st.iter().map(|s| (s.devid.get(), s.offset.get())).collect();
        match tree_chunks.iter().find(|t| t.logical == key.offset) {
            Some(t)
                if t.length == c.length.get()
                    && t.flags == c.type_.get()
                    && t.stripes == stripes => {}
            Some(_) => problems.push(format!(
                "sys_chunk_array chunk at {} differs from the chunk tree's",
                key.offset
            )),
            None if !tree_chunks.is_empty() => problems.push(format!(
                "sys_chunk_array chunk at {} is not in the chunk tree",
                key.offset
            )),
            None => {}
        }
        found.push(key.offset);
    }
    for m in problems {
        cx.report(F::err(P, Category::SysChunkArray).at(at).msg(m));
    }
    for t in tree_chunks {
        if t.flags & BTRFS_BLOCK_GROUP_SYSTEM != 0 && !found.contains(&t.logical) {
            cx.report(F::warn(P, Category::SysChunkArray).at(at).msg(format!(
                "system chunk at {} is missing from the superblock's sys_chunk_array",
                t.logical
            )));
        }
    }
}
