//! `chunk-recover`: rebuild the chunk tree and the superblock's
//! sys_chunk_array when they are lost (btrfs-progs `chunk-recover.c`),
//! also when both are: the chunk map that reading any tree needs is
//! recovered from the devices themselves.
//!
//! 1. **Scan.** Every sector-aligned offset of every device is tried as a
//!    tree block: header fsid the superblock's, checksum and every block
//!    check passing, generation not past the superblock's. A block's
//!    header bytenr is its logical address and where it was found is one
//!    of its physical copies. The leaves of the extent tree, the block
//!    group tree, the dev tree and the chunk tree give block group items,
//!    dev extents and (old) chunk items, the newest leaf's copy of each
//!    key kept.
//! 2. **Bootstrap.** A chunk is its block group item (logical start,
//!    length, type and profile) and the dev extents naming it (device,
//!    physical offset, length): from the scan's records, newest first,
//!    the candidates whose stripes the blocks found on them confirm form
//!    a first chunk map. It only has to reach the trees.
//! 3. **The trees.** Through that map the root tree, then the extent (or
//!    block group) tree and the dev tree are read as every engine read
//!    is, block by block validated: their block group items and dev
//!    extents are the filesystem's current ones, without the stale copies
//!    old leaves still hold. From them the chunks are built again: stripe
//!    count and length from the profile, stripe order (where it matters:
//!    RAID0, RAID10, RAID5/6) from an old chunk item with the same stripes,
//!    else from where tree blocks and checksummed data sectors are found.
//! 4. **Verify.** Every chunk holding tree blocks must be confirmed on
//!    each stripe by blocks found there carrying the logical address the
//!    chunk maps them to; data chunks are checked against a sample of
//!    their checksummed sectors, every copy; the trees read through the
//!    final map must give the same items.
//! 5. **Write**, in one transaction: a new chunk tree (a device item per
//!    device, a chunk item per chunk) in the SYSTEM block groups, the old
//!    tree's blocks freed without being read, the sys_chunk_array made
//!    from the SYSTEM chunks; the commit points every superblock copy of
//!    every device at the new tree (`chunk_root`, its level and
//!    generation). Interrupted before the superblocks, the image is what
//!    it was; a second run finishes.
//!
//! A filesystem with an fsync log is refused (a commit drops the log, and
//! replaying it needs the chunk tree): `zero-log` first. Every device must
//! be given.

use super::{open_devices, RescueReport, Status};
use crate::check::Progress;
use crate::chunk::{stripe_length, ChunkMap, ChunkMapping, RaidAttr};
use crate::csum::{verify_block, CsumType};
use crate::format::block_group::BlockGroupItem;
use crate::format::chunk::{chunk_problems, parse_chunk, ChunkItem, Stripe};
use crate::format::consts::*;
use crate::format::dev::{DevExtent, DevItem};
use crate::format::key::Key;
use crate::format::names::block_group_flags_str;
use crate::image::{Image, OpenOptions};
use crate::io::BlockDevice;
use crate::trans::Store;
use crate::tree::node::{Expect, Node, ValidateCtx};
use crate::tree::TreeIter;
use crate::CorruptKind;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

/// Bytes read from a device at a time while scanning.
const WINDOW: usize = 8 << 20;
/// Checksummed data sectors read per data chunk to verify its mapping.
const DATA_SAMPLES: usize = 64;

/// What the run may do.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Scan, rebuild and verify, but write nothing.
    pub dry_run: bool,
}

/// What [`chunk_recover`] found and did.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkRecover {
    /// Nothing was written.
    pub dry_run: bool,
    /// The chunk tree as it was: `readable`, or why it could not be read.
    pub chunk_tree_before: String,
    /// Each device scanned.
    pub devices: Vec<ScannedDevice>,
    /// Chunks rebuilt, by logical address.
    pub chunks: Vec<RecoveredChunk>,
    /// Dev extents of the dev tree whose chunk has no block group item
    /// (left in the dev tree, not made chunks).
    pub orphan_dev_extents: Vec<String>,
    /// Things noticed that did not stop the recovery.
    pub warnings: Vec<String>,
    /// The chunk tree read and already holds exactly these chunks.
    pub unchanged: bool,
    /// The new chunk tree was committed.
    pub committed: bool,
    /// The generation that commit wrote.
    pub generation: Option<u64>,
    /// The new chunk tree's root block.
    pub chunk_root: Option<u64>,
    /// What replacing the tree did.
    pub replaced: Option<crate::trans::ChunkTreeReplaced>,
}

/// One device's scan.
#[derive(Clone, Debug, Serialize)]
pub struct ScannedDevice {
    /// The device as given.
    pub device: String,
    /// Its devid.
    pub devid: u64,
    /// Its size in bytes, every one of which was scanned (the holes of a
    /// sparse image file skipped: they hold nothing).
    pub bytes: u64,
    /// Valid tree blocks of this filesystem found on it.
    pub tree_blocks: u64,
}

/// One rebuilt chunk.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveredChunk {
    /// Logical start.
    pub logical: u64,
    /// Logical length.
    pub length: u64,
    /// Type and profile bits.
    pub flags: u64,
    /// The same, as text (`METADATA|DUP`).
    pub kind: String,
    /// Bytes its block group item says are used.
    pub used: u64,
    /// Its stripes in order: (devid, physical offset).
    pub stripes: Vec<(u64, u64)>,
    /// How the stripe order was decided.
    pub order: &'static str,
    /// Tree blocks the extent tree lists in it.
    pub blocks_listed: u64,
    /// Tree blocks found on its stripes where it maps them.
    pub blocks_confirmed: u64,
    /// Valid tree blocks found on its stripes carrying another address
    /// (older blocks left from before the space was reused).
    pub blocks_elsewhere: u64,
    /// Checksummed data sector copies read through it.
    pub data_checked: u64,
    /// Those that matched their checksum.
    pub data_matched: u64,
}

impl RescueReport for ChunkRecover {
    fn status(&self) -> Status {
        if self.unchanged {
            Status::NothingToDo
        } else if self.dry_run {
            Status::WouldChange
        } else {
            Status::Done
        }
    }
    fn lines(&self) -> Vec<String> {
        let mut v = vec![format!("chunk tree before: {}", self.chunk_tree_before)];
        for d in &self.devices {
            v.push(format!(
                "scanned {} (devid {}): {} bytes, {} tree blocks",
                d.device, d.devid, d.bytes, d.tree_blocks
            ));
        }
        for c in &self.chunks {
            let stripes: Vec<String> = c.stripes.iter().map(|(d, p)| format!("{d}:{p}")).collect();
            let mut check = Vec::new();
            if c.blocks_confirmed + c.blocks_elsewhere > 0 {
                check.push(format!("{} tree blocks confirm it", c.blocks_confirmed));
            }
            if c.blocks_elsewhere > 0 {
                check.push(format!("{} older blocks elsewhere", c.blocks_elsewhere));
            }
            if c.data_checked > 0 {
                check.push(format!(
                    "{} of {} data sectors match",
                    c.data_matched, c.data_checked
                ));
            }
            v.push(format!(
                "chunk {}+{} {} stripes [{}] ({}){}",
                c.logical,
                c.length,
                c.kind,
                stripes.join(" "),
                c.order,
                if check.is_empty() {
                    String::new()
                } else {
                    format!(": {}", check.join(", "))
                }
            ));
        }
        v.extend(
            self.orphan_dev_extents
                .iter()
                .map(|o| format!("orphan dev extent: {o}")),
        );
        v.extend(self.warnings.iter().map(|w| format!("warning: {w}")));
        match self.status() {
            Status::NothingToDo => {
                v.push("the chunk tree holds these chunks already: nothing to do".into())
            }
            Status::WouldChange => v.push("dry run: nothing written".into()),
            _ => v.push(format!(
                "chunk tree rebuilt: root {} at generation {}",
                self.chunk_root.unwrap_or(0),
                self.generation.unwrap_or(0)
            )),
        }
        v
    }
}

/// A valid tree block found by the scan.
#[derive(Clone, Copy, Debug)]
struct Found {
    bytenr: u64,
}

/// A block group item as a scanned leaf holds it.
#[derive(Clone, Copy, Debug)]
struct BgRec {
    logical: u64,
    length: u64,
    flags: u64,
    used: u64,
    gen: u64,
}

/// A dev extent as a scanned leaf holds it.
#[derive(Clone, Copy, Debug)]
struct ExtRec {
    devid: u64,
    phys: u64,
    chunk_offset: u64,
    length: u64,
    gen: u64,
}

/// What the scan found.
#[derive(Default)]
struct Scan {
    /// Valid tree blocks by (devid, physical offset).
    blocks: BTreeMap<(u64, u64), Found>,
    bgs: BTreeMap<u64, BgRec>,
    exts: BTreeMap<(u64, u64), ExtRec>,
    /// Chunk items of old chunk tree leaves: logical -> (gen, item bytes).
    chunk_items: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Chunk tree uuids in block headers, counted.
    chunk_uuids: BTreeMap<[u8; 16], u64>,
}

/// What the filesystem's geometry says about blocks.
struct Geo {
    nodesize: u32,
    sectorsize: u32,
    csum: CsumType,
    fsid: [u8; 16],
    generation: u64,
    mixed: bool,
}

/// Rebuild the chunk tree of the filesystem at `paths` (every device).
pub fn chunk_recover(
    paths: &[PathBuf],
    opts: Options,
    progress: &dyn Progress,
) -> Result<ChunkRecover> {
    chunk_recover_devices(open_devices(paths, opts.dry_run)?, opts, progress)
}

/// [`chunk_recover`] on devices already open (name, device), in any
/// order; writable unless a dry run.
pub fn chunk_recover_devices(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    opts: Options,
    progress: &dyn Progress,
) -> Result<ChunkRecover> {
    let set = assemble_devices(devs)?;
    let primary = &set[0];
    let sb = *primary.sb;
    if sb.log_root.get() != 0 && !opts.dry_run {
        return Err(Error::Unsupported(
            "the filesystem has an fsync log: the commit that writes the new chunk tree would drop it, \
             and replaying it needs the chunk tree. Clear it with `btrkit-fsck rescue zero-log` first \
             (its fsync'd changes are lost)"
                .into(),
        ));
    }
    let geo = Geo {
        nodesize: sb.nodesize.get(),
        sectorsize: sb.sectorsize.get(),
        csum: CsumType::from_disk(sb.csum_type.get())?,
        fsid: sb.tree_fsid(),
        generation: sb.generation.get(),
        mixed: sb.has_incompat(BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS),
    };
    if !(4096..=BTRFS_MAX_NODESIZE).contains(&geo.nodesize)
        || !geo.nodesize.is_power_of_two()
        || !(4096..=65536).contains(&geo.sectorsize)
        || !geo.sectorsize.is_power_of_two()
    {
        return Err(Error::corrupt_as(
            crate::CorruptKind::Superblock,
            format!(
                "superblock nodesize {} / sectorsize {} invalid",
                geo.nodesize, geo.sectorsize
            ),
            BTRFS_SUPER_INFO_OFFSET,
        ));
    }
    let primary_dev = primary.dev.clone();
    let primary_mirror = primary.mirror;
    let others: Vec<(u64, Arc<dyn BlockDevice>)> = set[1..]
        .iter()
        .map(|m| (m.devid(), m.dev.clone()))
        .collect();
    let names: BTreeMap<u64, String> = set.iter().map(|m| (m.devid(), m.name.clone())).collect();
    let own_items: BTreeMap<u64, DevItem> =
        set.iter().map(|m| (m.devid(), m.sb.dev_item)).collect();
    let open_with = |map: ChunkMap, writable: bool| {
        Image::open_with_chunk_map(
            primary_dev.clone(),
            others.clone(),
            names.clone(),
            OpenOptions {
                writable,
                mirror: primary_mirror,
                ..Default::default()
            },
            map,
        )
    };

    // The chunk tree as it stands.
    let before = Image::open_devices(
        primary_dev.clone(),
        others.clone(),
        names.clone(),
        OpenOptions {
            mirror: primary_mirror,
            ..Default::default()
        },
    );
    let (chunk_tree_before, old_map) = match before {
        Ok(img) => ("readable".to_string(), Some(img.chunks.clone())),
        Err(e) => (format!("unreadable: {e}"), None),
    };

    // 1. Scan.
    let total: u64 = set.iter().map(|m| m.dev.size()).sum();
    progress.phase(1, "scan devices for tree blocks", total >> 20);
    let mut scan = Scan::default();
    let mut devices = Vec::new();
    for m in &set {
        let n = scan_device(m.devid(), m.dev.as_ref(), &geo, &mut scan, progress)?;
        devices.push(ScannedDevice {
            device: m.name.clone(),
            devid: m.devid(),
            bytes: m.dev.size(),
            tree_blocks: n,
        });
    }
    let mut warnings = Vec::new();

    let dev_map: BTreeMap<u64, Arc<dyn BlockDevice>> =
        set.iter().map(|m| (m.devid(), m.dev.clone())).collect();
    let no_samples = BTreeMap::new();
    let cx = Cx {
        scan: &scan,
        geo: &geo,
        own: &own_items,
        devs: &dev_map,
        samples: &no_samples,
    };

    // 2. Bootstrap map.
    progress.phase(2, "bootstrap chunk map", 0);
    let boot = bootstrap_map(&cx);
    if boot.is_empty() {
        return Err(Error::corrupt_as(CorruptKind::Device, "the scan found no block group item with dev extents to map a chunk: nothing to recover from", 0));
    }

    // 3. The trees through it.
    progress.phase(3, "read the extent and dev trees", 0);
    let img = open_with(boot, false)?;
    let trees = read_trees(&img).map_err(|e| {
        Error::corrupt_as(
            CorruptKind::ChunkMap,
            format!(
                "the trees cannot be read through the chunks the scan found ({e}); nothing written"
            ),
            0,
        )
    })?;
    // A metadump image (btrfs-image) holds no data to read.
    let metadump = sb.flags.get() & (BTRFS_SUPER_FLAG_METADUMP | BTRFS_SUPER_FLAG_METADUMP_V2) != 0;
    let samples = if metadump {
        warnings.push(
            "metadump image: its data blocks are not present, data chunks not checked".into(),
        );
        BTreeMap::new()
    } else {
        data_samples(&img, &trees.bgs, geo.sectorsize as u64)
    };
    drop(img);
    let cx = Cx {
        samples: &samples,
        ..cx
    };
    let built = build_chunks(&trees, &cx)?;
    let mut orphan_dev_extents = Vec::new();
    let starts: BTreeSet<u64> = trees.bgs.iter().map(|b| b.logical).collect();
    for e in &trees.exts {
        if !starts.contains(&e.chunk_offset) {
            orphan_dev_extents.push(format!(
                "devid {} physical {}+{} names chunk {} that has no block group item",
                e.devid, e.phys, e.length, e.chunk_offset
            ));
        }
    }
    let mut map = ChunkMap::new();
    for c in &built {
        map.insert(c.logical, &c.item, &c.stripes).map_err(|e| {
            Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("rebuilt chunks do not fit together: {e}"),
                c.logical,
            )
        })?;
    }

    // 4. Verify: the trees read the same through the rebuilt map.
    progress.phase(4, "verify", 0);
    let img = open_with(map.clone(), false)?;
    let again = read_trees(&img)?;
    if again != trees {
        return Err(Error::corrupt_as(CorruptKind::ChunkMap, "the trees read through the rebuilt chunks differ from those read through the scan's: nothing written", 0));
    }
    drop(img);
    let mut chunks: Vec<RecoveredChunk> = Vec::new();
    for c in &built {
        if c.has_meta
            && c.report.blocks_listed > 0
            && c.report.blocks_confirmed == 0
            && c.report.data_matched == 0
        {
            return Err(Error::corrupt_as(CorruptKind::ChunkMap, format!(
                    "chunk {}+{} ({}) holds {} tree blocks the extent tree lists, but none was found where it maps them: nothing written",
                    c.logical, c.report.length, c.report.kind, c.report.blocks_listed
                ), c.logical));
        }
        // The data chunks' mapping comes from the trees' own items; data
        // that does not match is damaged data (or, when the stripe order
        // was read from the data, no order at all: refused above).
        if c.report.data_checked > c.report.data_matched {
            warnings.push(format!(
                "chunk {}: {} of {} data sector copies read through it fail their checksums (btrkit-fsck --check-data-csum names them)",
                c.logical,
                c.report.data_checked - c.report.data_matched,
                c.report.data_checked
            ));
        }
        chunks.push(c.report.clone());
    }
    let unchanged = old_map.as_ref().is_some_and(|old| same_map(old, &map))
        && sys_array_of(&built) == sb.sys_chunk_array().to_vec();
    let mut out = ChunkRecover {
        dry_run: opts.dry_run,
        chunk_tree_before,
        devices,
        chunks,
        orphan_dev_extents,
        warnings,
        unchanged,
        committed: false,
        generation: None,
        chunk_root: None,
        replaced: None,
    };
    if unchanged || opts.dry_run {
        return Ok(out);
    }

    // 5. Write.
    progress.phase(5, "write the chunk tree", 0);
    let mut items: Vec<(Key, Vec<u8>)> = Vec::new();
    let mut dev_items = Vec::new();
    for (&devid, own) in &own_items {
        let mut di = *own;
        let used: u64 = trees
            .exts
            .iter()
            .filter(|e| e.devid == devid)
            .map(|e| e.length)
            .sum();
        di.bytes_used.set(used);
        items.push((
            Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid),
            di.as_bytes().to_vec(),
        ));
        dev_items.push(di);
    }
    for c in &built {
        items.push((
            Key::new(
                BTRFS_FIRST_CHUNK_TREE_OBJECTID,
                BTRFS_CHUNK_ITEM_KEY,
                c.logical,
            ),
            c.item_bytes(),
        ));
    }
    let uuid = chunk_tree_uuid(&trees, &scan)?;
    let img = open_with(map.clone(), true)?;
    let mut st = Store::from_image_without_chunk_tree(img, uuid)?;
    let replaced = st.replace_chunk_tree(&items, &sys_array_of(&built), &dev_items)?;
    st.commit()?;
    out.committed = true;
    out.generation = Some(st.image().sb.generation.get());
    out.chunk_root = Some(st.image().sb.chunk_root.get());
    out.replaced = Some(replaced);
    drop(st);
    // What a normal open now reads must be what was written.
    let img =
        Image::open_devices(primary_dev, others, names, OpenOptions::default()).map_err(|e| {
            Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("the rebuilt chunk tree does not open: {e}"),
                0,
            )
        })?;
    if !same_map(&img.chunks, &map) {
        return Err(Error::corrupt_as(
            CorruptKind::ChunkMap,
            "the rebuilt chunk tree reads back differently from what was written",
            0,
        ));
    }
    Ok(out)
}

/// One device of the filesystem, by the first of its superblock copies
/// that is valid.
struct Member {
    name: String,
    dev: Arc<dyn BlockDevice>,
    sb: Box<crate::format::superblock::Superblock>,
    /// Which copy `sb` is (a damaged primary is no reason to stop here:
    /// the commit writes every copy again).
    mirror: usize,
}

impl Member {
    fn devid(&self) -> u64 {
        self.sb.dev_item.devid.get()
    }
}

/// The devices as one filesystem, as `DeviceSet::assemble` matches them
/// but by each device's first valid superblock copy; the one with the
/// newest generation first. Every device must be there.
fn assemble_devices(devs: Vec<(String, Arc<dyn BlockDevice>)>) -> Result<Vec<Member>> {
    if devs.is_empty() {
        return Err(Error::Invalid("no device given".into()));
    }
    let mut v: Vec<Member> = Vec::with_capacity(devs.len());
    for (name, dev) in devs {
        let mut first_err = None;
        let mut got = None;
        for mirror in 0..super::copies_on(dev.size()).max(1) {
            match crate::image::read_superblock(dev.as_ref(), mirror) {
                Ok(sb) => {
                    got = Some((sb, mirror));
                    break;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let Some((sb, mirror)) = got else {
            let e = first_err.unwrap_or_else(|| Error::NotBtrfs("no superblock".into()));
            return Err(match e {
                Error::NotBtrfs(m) => Error::NotBtrfs(format!("{name}: {m}")),
                e => Error::Invalid(format!("{name}: no valid superblock copy ({e})")),
            });
        };
        v.push(Member {
            name,
            dev,
            sb: Box::new(sb),
            mirror,
        });
    }
    // The newest generation first, then by devid.
    v.sort_by_key(|m| (std::cmp::Reverse(m.sb.generation.get()), m.devid()));
    let fsid = v[0].sb.fsid;
    let mut seen = BTreeSet::new();
    for m in &v {
        if m.sb.fsid != fsid {
            return Err(Error::Invalid(format!(
                "{} and {} are not one filesystem",
                v[0].name, m.name
            )));
        }
        if m.sb.flags.get() & BTRFS_SUPER_FLAG_SEEDING != 0 {
            return Err(Error::Unsupported(format!(
                "{} is a seed device: seed devices are not supported",
                m.name
            )));
        }
        // One commit behind is a power failure between two devices'
        // superblocks; more is a device left out of commits.
        if m.sb.generation.get().saturating_add(1) < v[0].sb.generation.get() {
            return Err(Error::Invalid(format!(
                "{} is at generation {}, {} at {}: a stale device",
                m.name,
                m.sb.generation.get(),
                v[0].name,
                v[0].sb.generation.get()
            )));
        }
        if !seen.insert(m.devid()) {
            return Err(Error::Invalid(format!(
                "device {} is given twice ({})",
                m.devid(),
                m.name
            )));
        }
    }
    let want = v[0].sb.num_devices.get();
    if want != v.len() as u64 {
        return Err(Error::MissingDevice {
            devids: Vec::new(),
            what: format!(
                "the filesystem has {want} devices and {} were given: chunk-recover needs every device",
                v.len()
            ),
        });
    }
    Ok(v)
}

/// Scan one device for tree blocks; returns how many were found.
fn scan_device(
    devid: u64,
    dev: &dyn BlockDevice,
    geo: &Geo,
    scan: &mut Scan,
    progress: &dyn Progress,
) -> Result<u64> {
    let ns = geo.nodesize as usize;
    let ss = geo.sectorsize as usize;
    let size = dev.size();
    let ctx = ValidateCtx {
        nodesize: geo.nodesize,
        sectorsize: geo.sectorsize,
        csum: geo.csum,
        fsid: geo.fsid,
        alt_fsid: None,
        alt_csum: None,
        max_generation: geo.generation,
    };
    let supers: Vec<u64> = (0..BTRFS_SUPER_MIRROR_MAX).map(btrfs_sb_offset).collect();
    let mut buf = vec![0u8; WINDOW + ns];
    let mut pos = 0u64;
    let mut found = 0u64;
    let mut reported = 0u64;
    // Each turn moves `pos` on by at least one sector.
    while pos.saturating_add(ns as u64) <= size {
        // The holes of a sparse image read as zeroes: skip them.
        match dev.next_data(pos) {
            None => break,
            Some(d) if d > pos => {
                let d = d / ss as u64 * ss as u64;
                if d > pos {
                    pos = d;
                    continue;
                }
            }
            Some(_) => {}
        }
        let len = (size - pos).min((WINDOW + ns) as u64) as usize;
        dev.read_at(pos, &mut buf[..len])?;
        let mut off = 0usize;
        while off < WINDOW && off + ns <= len {
            let at = pos + off as u64;
            let b = &buf[off..off + ns];
            if b[0x20..0x30] == geo.fsid
                && !supers.contains(&at)
                && u64::from_le_bytes(b[0x40..0x48].try_into().unwrap_or([0; 8])) != BTRFS_MAGIC
                && verify_block(geo.csum, b)
            {
                let bytenr = u64::from_le_bytes(b[0x30..0x38].try_into().unwrap_or([0; 8]));
                if let Ok(node) = Node::from_vec(bytenr, b.to_vec()) {
                    if node.validate(&ctx, &Expect::default()).is_empty() {
                        record(devid, at, &node, scan);
                        found += 1;
                        off += ns;
                        continue;
                    }
                }
            }
            off += ss;
        }
        pos += off as u64;
        let mib = pos >> 20;
        if mib > reported {
            progress.advance(mib - reported);
            reported = mib;
        }
    }
    Ok(found)
}

/// Keep what a valid block found at (`devid`, `phys`) tells.
fn record(devid: u64, phys: u64, node: &Node, scan: &mut Scan) {
    let h = node.header();
    let gen = h.generation.get();
    scan.blocks.insert(
        (devid, phys),
        Found {
            bytenr: h.bytenr.get(),
        },
    );
    *scan.chunk_uuids.entry(h.chunk_tree_uuid).or_default() += 1;
    if !node.is_leaf() {
        return;
    }
    let owner = h.owner.get();
    if !matches!(
        owner,
        BTRFS_EXTENT_TREE_OBJECTID
            | BTRFS_DEV_TREE_OBJECTID
            | BTRFS_CHUNK_TREE_OBJECTID
            | BTRFS_BLOCK_GROUP_TREE_OBJECTID
    ) {
        return;
    }
    for slot in 0..node.nr_safe() {
        let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
            continue;
        };
        match k.ty {
            BTRFS_BLOCK_GROUP_ITEM_KEY
                if owner == BTRFS_EXTENT_TREE_OBJECTID
                    || owner == BTRFS_BLOCK_GROUP_TREE_OBJECTID =>
            {
                let Ok(bg) = BlockGroupItem::read_from_bytes(d) else {
                    continue;
                };
                let rec = BgRec {
                    logical: k.objectid,
                    length: k.offset,
                    flags: bg.flags.get(),
                    used: bg.used.get(),
                    gen,
                };
                keep_newer(&mut scan.bgs, k.objectid, rec, |r| r.gen);
            }
            BTRFS_DEV_EXTENT_KEY if owner == BTRFS_DEV_TREE_OBJECTID => {
                let Ok(de) = DevExtent::read_from_bytes(d) else {
                    continue;
                };
                let rec = ExtRec {
                    devid: k.objectid,
                    phys: k.offset,
                    chunk_offset: de.chunk_offset.get(),
                    length: de.length.get(),
                    gen,
                };
                keep_newer(&mut scan.exts, (k.objectid, k.offset), rec, |r| r.gen);
            }
            BTRFS_CHUNK_ITEM_KEY
                if owner == BTRFS_CHUNK_TREE_OBJECTID && parse_chunk(d).is_ok() =>
            {
                keep_newer(&mut scan.chunk_items, k.offset, (gen, d.to_vec()), |r| r.0);
            }
            _ => {}
        }
    }
}

fn keep_newer<K: Ord, V>(m: &mut BTreeMap<K, V>, k: K, v: V, gen: impl Fn(&V) -> u64) {
    match m.get(&k) {
        Some(old) if gen(old) >= gen(&v) => {}
        _ => {
            m.insert(k, v);
        }
    }
}

/// A block group item of the current trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bg {
    logical: u64,
    length: u64,
    flags: u64,
    used: u64,
}

/// A dev extent of the current dev tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ext {
    devid: u64,
    phys: u64,
    chunk_offset: u64,
    length: u64,
    chunk_tree_uuid: [u8; 16],
}

/// The block group items and dev extents of the current trees.
#[derive(Debug, PartialEq, Eq)]
struct Trees {
    bgs: Vec<Bg>,
    exts: Vec<Ext>,
    /// Every tree block the extent tree lists, ascending.
    tree_blocks: Vec<u64>,
}

/// Read the current block group items and dev extents.
fn read_trees(img: &Image) -> Result<Trees> {
    let bg_tree = if img
        .sb
        .has_compat_ro(BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE)
    {
        BTRFS_BLOCK_GROUP_TREE_OBJECTID
    } else {
        BTRFS_EXTENT_TREE_OBJECTID
    };
    let root = img.find_root(bg_tree)?.ok_or_else(|| {
        Error::corrupt_as(
            CorruptKind::Reference,
            format!("the root tree has no tree {bg_tree}"),
            0,
        )
    })?;
    let mut bgs = Vec::new();
    let mut tree_blocks = Vec::new();
    if bg_tree != BTRFS_EXTENT_TREE_OBJECTID {
        let extent = img.find_root(BTRFS_EXTENT_TREE_OBJECTID)?.ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Reference,
                "the root tree has no extent tree",
                0,
            )
        })?;
        let mut it = TreeIter::new(img, extent, Key::MIN)?;
        while let Some(r) = it.next_item() {
            let item = r?;
            note_tree_block(&item.key, item.data()?, &mut tree_blocks);
        }
    }
    let mut it = TreeIter::new(img, root, Key::MIN)?;
    while let Some(r) = it.next_item() {
        let item = r?;
        if bg_tree == BTRFS_EXTENT_TREE_OBJECTID {
            note_tree_block(&item.key, item.data()?, &mut tree_blocks);
        }
        if item.key.ty != BTRFS_BLOCK_GROUP_ITEM_KEY {
            continue;
        }
        let bg = BlockGroupItem::read_from_bytes(item.data()?).map_err(|_| {
            Error::corrupt_item("block group item size", item.node.bytenr, Some(item.key))
        })?;
        bgs.push(Bg {
            logical: item.key.objectid,
            length: item.key.offset,
            flags: bg.flags.get(),
            used: bg.used.get(),
        });
    }
    let root = img.find_root(BTRFS_DEV_TREE_OBJECTID)?.ok_or_else(|| {
        Error::corrupt_as(CorruptKind::Reference, "the root tree has no dev tree", 0)
    })?;
    let mut exts = Vec::new();
    let mut it = TreeIter::new(img, root, Key::MIN)?;
    while let Some(r) = it.next_item() {
        let item = r?;
        if item.key.ty != BTRFS_DEV_EXTENT_KEY {
            continue;
        }
        let de = DevExtent::read_from_bytes(item.data()?).map_err(|_| {
            Error::corrupt_key_as(
                CorruptKind::Device,
                "dev extent size",
                item.node.bytenr,
                item.key,
            )
        })?;
        exts.push(Ext {
            devid: item.key.objectid,
            phys: item.key.offset,
            chunk_offset: de.chunk_offset.get(),
            length: de.length.get(),
            chunk_tree_uuid: de.chunk_tree_uuid,
        });
    }
    tree_blocks.sort_unstable();
    Ok(Trees {
        bgs,
        exts,
        tree_blocks,
    })
}

/// Keep the address of the tree block an extent item is for.
fn note_tree_block(k: &Key, d: &[u8], out: &mut Vec<u64>) {
    let tree_block = match k.ty {
        BTRFS_METADATA_ITEM_KEY => true,
        // btrfs_extent_item: refs, generation, flags.
        BTRFS_EXTENT_ITEM_KEY => d
            .get(16..24)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .is_some_and(|f| f & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0),
        _ => false,
    };
    if tree_block {
        out.push(k.objectid);
    }
}

/// Checksummed data sectors to read through each data chunk: logical
/// chunk start -> (sector, checksum), at most [`DATA_SAMPLES`] each, one
/// per stripe unit where there are enough. A csum tree that cannot be
/// read gives none (the data chunks are then not checked).
fn data_samples(img: &Image, bgs: &[Bg], ss: u64) -> BTreeMap<u64, Vec<(u64, Vec<u8>)>> {
    let mut out: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    let data: BTreeMap<u64, u64> = bgs
        .iter()
        .filter(|b| b.flags & BTRFS_BLOCK_GROUP_DATA != 0)
        .map(|b| (b.logical, b.logical.saturating_add(b.length)))
        .collect();
    let Ok(Some(root)) = img.find_root(BTRFS_CSUM_TREE_OBJECTID) else {
        return out;
    };
    let Ok(mut it) = TreeIter::new(
        img,
        root,
        Key::new(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 0),
    ) else {
        return out;
    };
    let cs = img.csum.size().max(1);
    let step = (BTRFS_STRIPE_LEN / ss.max(1)).max(1);
    while let Some(Ok(item)) = it.next_item() {
        if item.key.objectid != BTRFS_EXTENT_CSUM_OBJECTID || item.key.ty != BTRFS_EXTENT_CSUM_KEY {
            break;
        }
        let Ok(d) = item.data() else { continue };
        let n = (d.len() / cs) as u64;
        let mut i = 0u64;
        while i < n {
            let l = item.key.offset.saturating_add(i * ss);
            if let Some((&start, &end)) = data.range(..=l).next_back() {
                let v = out.entry(start).or_default();
                if l < end && v.len() < DATA_SAMPLES {
                    let at = (i as usize) * cs;
                    v.push((l, d[at..at + cs].to_vec()));
                }
            }
            i += step;
        }
        if out.len() == data.len() && out.values().all(|v| v.len() >= DATA_SAMPLES) {
            break;
        }
    }
    out
}

/// The first map: every block group item of the scan with dev extents
/// that fit it, newest first; then chunk items of old chunk tree leaves
/// for what is left uncovered. Overlaps keep the first.
fn bootstrap_map(cx: &Cx) -> ChunkMap {
    let scan = cx.scan;
    let mut bgs: Vec<&BgRec> = scan.bgs.values().collect();
    bgs.sort_by_key(|b| std::cmp::Reverse(b.gen));
    let mut by_chunk: BTreeMap<u64, Vec<ExtRec>> = BTreeMap::new();
    for e in scan.exts.values() {
        by_chunk.entry(e.chunk_offset).or_default().push(*e);
    }
    let mut map = ChunkMap::new();
    for bg in bgs {
        let cands = by_chunk.get(&bg.logical).cloned().unwrap_or_default();
        let bg = Bg {
            logical: bg.logical,
            length: bg.length,
            flags: bg.flags,
            used: bg.used,
        };
        if let Ok(c) = assemble(&bg, &cands, cx, true) {
            let _ = map.insert(c.logical, &c.item, &c.stripes);
        }
    }
    let mut old: Vec<(&u64, &(u64, Vec<u8>))> = scan.chunk_items.iter().collect();
    old.sort_by_key(|(_, (g, _))| std::cmp::Reverse(*g));
    for (&l, (_, bytes)) in old {
        if let Ok((c, s)) = parse_chunk(bytes) {
            if map.lookup(l).is_none() {
                let _ = map.insert(l, c, s);
            }
        }
    }
    map
}

/// What assembling a chunk looks at.
struct Cx<'a> {
    scan: &'a Scan,
    geo: &'a Geo,
    /// Each device's own device item (its uuid goes in the stripes).
    own: &'a BTreeMap<u64, DevItem>,
    devs: &'a BTreeMap<u64, Arc<dyn BlockDevice>>,
    samples: &'a BTreeMap<u64, Vec<(u64, Vec<u8>)>>,
}

/// A chunk rebuilt.
struct Built {
    logical: u64,
    item: ChunkItem,
    stripes: Vec<Stripe>,
    /// It holds tree blocks other than the chunk tree's (which is lost).
    has_meta: bool,
    report: RecoveredChunk,
}

impl Built {
    fn item_bytes(&self) -> Vec<u8> {
        let mut v = self.item.as_bytes().to_vec();
        for s in &self.stripes {
            v.extend_from_slice(s.as_bytes());
        }
        v
    }
}

/// The chunks of the current trees: one per block group item, from the
/// dev extents naming it.
fn build_chunks(trees: &Trees, cx: &Cx) -> Result<Vec<Built>> {
    let mut by_chunk: BTreeMap<u64, Vec<ExtRec>> = BTreeMap::new();
    for e in &trees.exts {
        by_chunk.entry(e.chunk_offset).or_default().push(ExtRec {
            devid: e.devid,
            phys: e.phys,
            chunk_offset: e.chunk_offset,
            length: e.length,
            gen: 0,
        });
    }
    let mut out = Vec::new();
    for bg in &trees.bgs {
        let cands = by_chunk.get(&bg.logical).cloned().unwrap_or_default();
        if cands.is_empty() {
            return Err(Error::corrupt_as(
                CorruptKind::Device,
                format!(
                    "block group {}+{} ({}) has no dev extent: its chunk cannot be rebuilt",
                    bg.logical,
                    bg.length,
                    block_group_flags_str(bg.flags)
                ),
                bg.logical,
            ));
        }
        if let Some(e) = cands.iter().find(|e| !cx.devs.contains_key(&e.devid)) {
            return Err(Error::corrupt_as(
                CorruptKind::Device,
                format!(
                    "block group {} has a dev extent on devid {}, which is not a device of the set",
                    bg.logical, e.devid
                ),
                bg.logical,
            ));
        }
        let mut c = assemble(bg, &cands, cx, false)?;
        let end = bg.logical.saturating_add(bg.length);
        let from = trees.tree_blocks.partition_point(|&b| b < bg.logical);
        let to = trees.tree_blocks.partition_point(|&b| b < end);
        c.report.blocks_listed = (to - from) as u64;
        out.push(c);
    }
    Ok(out)
}

/// The chunk of block group `bg` from the dev extents `cands` naming it.
/// `noisy`: the candidates come from scanned leaves and may hold stale
/// ones (the stripes are then chosen among them); otherwise they are the
/// dev tree's and must be exactly the chunk's.
fn assemble(bg: &Bg, cands: &[ExtRec], cx: &Cx, noisy: bool) -> Result<Built> {
    let (scan, geo) = (cx.scan, cx.geo);
    let bad = |what: String| Error::corrupt_as(CorruptKind::Device, what, bg.logical);
    let flags = bg.flags;
    let kind = block_group_flags_str(flags);
    let profile = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    if profile.count_ones() > 1 {
        return Err(Error::corrupt_item(
            format!("block group {} has profile bits {kind}", bg.logical),
            bg.logical,
            None,
        ));
    }
    let attr = RaidAttr::of(flags).ok_or_else(|| Error::Unsupported(kind.clone()))?;
    let striped = profile
        & (BTRFS_BLOCK_GROUP_RAID0
            | BTRFS_BLOCK_GROUP_RAID10
            | BTRFS_BLOCK_GROUP_RAID5
            | BTRFS_BLOCK_GROUP_RAID6)
        != 0;
    let sub_stripes: u16 = if profile == BTRFS_BLOCK_GROUP_RAID10 {
        2
    } else {
        1
    };
    let has_meta = flags & BTRFS_BLOCK_GROUP_METADATA != 0;
    let has_data = flags & BTRFS_BLOCK_GROUP_DATA != 0;
    // Only chunk tree blocks live in SYSTEM chunks.
    let only_chunk_tree = flags & BTRFS_BLOCK_GROUP_TYPE_MASK == BTRFS_BLOCK_GROUP_SYSTEM;
    // Which of the candidates, and how many stripes.
    let chosen: Vec<ExtRec> = if noisy {
        let mut by_len: BTreeMap<u64, Vec<ExtRec>> = BTreeMap::new();
        for c in cands {
            by_len.entry(c.length).or_default().push(*c);
        }
        let mut pick = None;
        for (len, group) in by_len {
            let Some(n) = stripes_for(flags, attr, bg.length, len) else {
                continue;
            };
            if (group.len() as u64) < n
                || n > attr.dev_stripes.max(1).saturating_mul(cx.devs.len() as u64)
            {
                continue;
            }
            let mut g = group;
            g.sort_by_key(|e| {
                let s = confirmations(bg, flags, sub_stripes, e, n, scan, geo);
                std::cmp::Reverse((s, e.gen))
            });
            g.truncate(n as usize);
            pick = Some(g);
            break;
        }
        pick.ok_or_else(|| bad(format!("no dev extents fit block group {}", bg.logical)))?
    } else {
        let n = cands.len() as u64;
        for c in cands {
            if stripe_length(flags, bg.length, n) != c.length
                || stripes_for(flags, attr, bg.length, c.length) != Some(n)
            {
                return Err(bad(format!(
                    "block group {}+{} ({kind}) has {n} dev extents of {} bytes (devid {} physical {}): not a {kind} chunk",
                    bg.logical, bg.length, c.length, c.devid, c.phys
                )));
            }
        }
        cands.to_vec()
    };
    let n = chosen.len();
    // No more stripes than the devices hold (what is sized by n below).
    let most = (attr.dev_stripes.max(1) as usize).saturating_mul(cx.devs.len());
    if n > most {
        return Err(bad(format!(
            "block group {} ({kind}) has {n} dev extents, more than {most} stripes on {} devices",
            bg.logical,
            cx.devs.len()
        )));
    }
    let stripe_len = BTRFS_STRIPE_LEN;
    // A chunk item of an old chunk tree leaf with these very stripes.
    let old = scan.chunk_items.get(&bg.logical).and_then(|(_, b)| {
        let (c, s) = parse_chunk(b).ok()?;
        let set: BTreeSet<(u64, u64)> = s.iter().map(|s| (s.devid.get(), s.offset.get())).collect();
        let want: BTreeSet<(u64, u64)> = chosen.iter().map(|e| (e.devid, e.phys)).collect();
        (c.length.get() == bg.length && c.type_.get() == flags && set == want && set.len() == n)
            .then(|| {
                let order: Vec<(u64, u64)> =
                    s.iter().map(|s| (s.devid.get(), s.offset.get())).collect();
                (
                    order,
                    c.io_align.get(),
                    c.io_width.get(),
                    c.sub_stripes.get(),
                )
            })
    });
    // What the old item says of I/O sizes and (outside RAID10, where it
    // means nothing) sub_stripes, which old mkfs.btrfs wrote as 0: kept,
    // so that a chunk tree rebuilt as it was is byte for byte the same.
    let (io_align, io_width) = old
        .as_ref()
        .map_or((BTRFS_STRIPE_LEN as u32, BTRFS_STRIPE_LEN as u32), |o| {
            (o.1, o.2)
        });
    let sub_stripes = match &old {
        Some(o) if profile != BTRFS_BLOCK_GROUP_RAID10 && o.3 <= 1 => o.3,
        _ => sub_stripes,
    };
    let old = old.map(|o| o.0);
    // Scores of each candidate as each stripe position.
    let placeholder = ChunkMapping {
        logical: bg.logical,
        length: bg.length,
        type_flags: flags,
        stripe_len,
        stripes: (0..n as u64).map(|i| (i, 0)).collect(),
        sub_stripes,
    };
    let empty = Vec::new();
    let sample = cx.samples.get(&bg.logical).unwrap_or(&empty);
    let mut score = vec![vec![0u64; n]; n];
    for (j, e) in chosen.iter().enumerate() {
        score[j] = block_scores(&placeholder, e, scan, geo).0;
        if has_data && !noisy {
            for (i, d) in data_scores(&placeholder, e, sample, cx)
                .into_iter()
                .enumerate()
            {
                score[j][i] += d;
            }
        }
    }
    let (order, how): (Vec<(u64, u64)>, &'static str) = if let Some(o) = old {
        (o, "as an old chunk item has them")
    } else if !striped {
        let mut v: Vec<(u64, u64)> = chosen.iter().map(|e| (e.devid, e.phys)).collect();
        v.sort_unstable();
        (
            v,
            if n == 1 {
                "one stripe"
            } else {
                "mirrored copies"
            },
        )
    } else {
        let total = &score;
        let mut how = "from where its tree blocks and data sectors are found";
        let mut used = vec![false; n];
        let mut v = Vec::with_capacity(n);
        // Stripe position by position, the unused candidate that fits it
        // best (`total[candidate][position]`).
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            let best = (0..n).filter(|&j| !used[j]).max_by_key(|&j| {
                (
                    total[j][i],
                    std::cmp::Reverse((chosen[j].devid, chosen[j].phys)),
                )
            });
            let left = used.iter().filter(|u| !**u).count();
            match best {
                Some(j) if total[j][i] > 0 || left == 1 => {
                    used[j] = true;
                    v.push((chosen[j].devid, chosen[j].phys));
                }
                Some(_) if only_chunk_tree => {
                    // What it held is being replaced: any order serves.
                    let mut rest: Vec<(u64, u64)> = (0..n)
                        .filter(|&j| !used[j])
                        .map(|j| (chosen[j].devid, chosen[j].phys))
                        .collect();
                    rest.sort_unstable();
                    v.extend(rest);
                    how = "any order serves: a SYSTEM chunk holds only the chunk tree, rebuilt here";
                    break;
                }
                _ => {
                    return Err(Error::Unsupported(format!(
                        "the stripe order of chunk {}+{} ({kind}) cannot be told: no old chunk item has its stripes and no tree block or checksummed data sector found on them places stripe {i}",
                        bg.logical, bg.length
                    )))
                }
            }
        }
        (v, how)
    };
    let item = ChunkItem {
        length: bg.length.into(),
        owner: BTRFS_EXTENT_TREE_OBJECTID.into(),
        stripe_len: stripe_len.into(),
        type_: flags.into(),
        io_align: io_align.into(),
        io_width: io_width.into(),
        sector_size: geo.sectorsize.into(),
        num_stripes: (n as u16).into(),
        sub_stripes: sub_stripes.into(),
    };
    let problems = chunk_problems(&item, bg.logical, geo.sectorsize, geo.mixed);
    if !problems.is_empty() {
        return Err(bad(format!(
            "the chunk rebuilt for block group {} ({kind}) is not valid: {}",
            bg.logical,
            problems.join("; ")
        )));
    }
    let mut stripes = Vec::with_capacity(n);
    for &(devid, phys) in &order {
        let uuid = cx.own.get(&devid).map(|d| d.uuid).ok_or_else(|| {
            bad(format!(
                "chunk {} has a stripe on devid {devid}, not given",
                bg.logical
            ))
        })?;
        stripes.push(Stripe {
            devid: devid.into(),
            offset: phys.into(),
            dev_uuid: uuid,
        });
    }
    // How the final order fares: the blocks and data sectors it explains.
    let fin = ChunkMapping {
        stripes: order.clone(),
        ..placeholder.clone()
    };
    let mut confirmed = 0;
    let mut other = 0;
    for e in &chosen {
        let idx = order
            .iter()
            .position(|&s| s == (e.devid, e.phys))
            .unwrap_or(0);
        let (s, o) = block_scores(&placeholder, e, scan, geo);
        confirmed += s.get(idx).copied().unwrap_or(0);
        other += o;
    }
    let (checked, matched) = if has_data && !noisy {
        verify_data(&fin, sample, cx)
    } else {
        (0, 0)
    };
    Ok(Built {
        logical: bg.logical,
        item,
        stripes,
        has_meta,
        report: RecoveredChunk {
            logical: bg.logical,
            length: bg.length,
            flags,
            kind,
            used: bg.used,
            stripes: order,
            order: how,
            blocks_listed: 0,
            blocks_confirmed: confirmed,
            blocks_elsewhere: other,
            data_checked: checked,
            data_matched: matched,
        },
    })
}

/// Stripes a chunk of `flags` and `length` has when each dev extent is
/// `ext_len` bytes; None when no count fits.
fn stripes_for(flags: u64, attr: RaidAttr, length: u64, ext_len: u64) -> Option<u64> {
    if ext_len == 0 {
        return None;
    }
    let p = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    let striped = p
        & (BTRFS_BLOCK_GROUP_RAID0
            | BTRFS_BLOCK_GROUP_RAID10
            | BTRFS_BLOCK_GROUP_RAID5
            | BTRFS_BLOCK_GROUP_RAID6)
        != 0;
    if !striped {
        return (ext_len == length).then_some(attr.ncopies.max(1));
    }
    if !length.is_multiple_of(ext_len) {
        return None;
    }
    let data = length / ext_len;
    let n = if p & BTRFS_BLOCK_GROUP_RAID10 != 0 {
        data * 2
    } else {
        data + attr.nparity
    };
    (n >= attr.devs_min.max(1) && n <= 0xffff).then_some(n)
}

/// Blocks confirming dev extent `e` in any stripe position of a chunk
/// with `n` stripes (the noisy pick's ranking).
fn confirmations(
    bg: &Bg,
    flags: u64,
    sub_stripes: u16,
    e: &ExtRec,
    n: u64,
    scan: &Scan,
    geo: &Geo,
) -> u64 {
    let m = ChunkMapping {
        logical: bg.logical,
        length: bg.length,
        type_flags: flags,
        stripe_len: BTRFS_STRIPE_LEN,
        stripes: (0..n).map(|i| (i, 0)).collect(),
        sub_stripes,
    };
    block_scores(&m, e, scan, geo)
        .0
        .into_iter()
        .max()
        .unwrap_or(0)
}

/// For dev extent `e` of the chunk `m` maps (its stripes numbered, each
/// at physical 0): how many blocks found on it fit each stripe position,
/// and how many fit none.
fn block_scores(m: &ChunkMapping, e: &ExtRec, scan: &Scan, geo: &Geo) -> (Vec<u64>, u64) {
    let n = m.stripes.len();
    let mut score = vec![0u64; n];
    let mut other = 0u64;
    let end = e.phys.saturating_add(e.length);
    let ns = geo.nodesize as u64;
    for (&(_, p), f) in scan.blocks.range((e.devid, e.phys)..(e.devid, end)) {
        let q = p - e.phys;
        let mut fits = false;
        if f.bytenr >= m.logical && f.bytenr.saturating_add(ns) <= m.end() {
            if let Ok(pieces) = m.map_range(f.bytenr - m.logical, ns) {
                if let [piece] = pieces.as_slice() {
                    for &(idx, at) in &piece.copies {
                        if at == q {
                            if let Some(s) = score.get_mut(idx as usize) {
                                *s += 1;
                                fits = true;
                            }
                        }
                    }
                }
            }
        }
        if !fits {
            other += 1;
        }
    }
    (score, other)
}

/// For dev extent `e` of the chunk `m` maps (stripes numbered, each at
/// physical 0): how many sampled data sectors read from it match their
/// checksum at each stripe position.
fn data_scores(m: &ChunkMapping, e: &ExtRec, sample: &[(u64, Vec<u8>)], cx: &Cx) -> Vec<u64> {
    let n = m.stripes.len();
    let mut score = vec![0u64; n];
    let Some(dev) = cx.devs.get(&e.devid) else {
        return score;
    };
    let ss = cx.geo.sectorsize as u64;
    let mut buf = vec![0u8; ss as usize];
    for (l, want) in sample {
        let Some(off) = l.checked_sub(m.logical) else {
            continue;
        };
        let Ok(pieces) = m.map_range(off, ss) else {
            continue;
        };
        let Some(piece) = pieces.first() else {
            continue;
        };
        let mut read: Option<(u64, bool)> = None;
        for &(idx, q) in &piece.copies {
            if q.saturating_add(ss) > e.length {
                continue;
            }
            let ok = match read {
                Some((at, ok)) if at == q => ok,
                _ => {
                    let ok =
                        dev.read_at(e.phys + q, &mut buf).is_ok() && cx.geo.csum.verify(&buf, want);
                    read = Some((q, ok));
                    ok
                }
            };
            if ok {
                if let Some(s) = score.get_mut(idx as usize) {
                    *s += 1;
                }
            }
        }
    }
    score
}

/// Sampled data sectors read through the final mapping `m`, every copy:
/// (copies read, copies matching their checksum).
fn verify_data(m: &ChunkMapping, sample: &[(u64, Vec<u8>)], cx: &Cx) -> (u64, u64) {
    let ss = cx.geo.sectorsize as u64;
    let mut buf = vec![0u8; ss as usize];
    let (mut checked, mut matched) = (0, 0);
    for (l, want) in sample {
        let Some(off) = l.checked_sub(m.logical) else {
            continue;
        };
        let Ok(pieces) = m.map_range(off, ss) else {
            continue;
        };
        for piece in &pieces {
            for &(devid, phys) in &piece.copies {
                let Some(dev) = cx.devs.get(&devid) else {
                    continue;
                };
                checked += 1;
                if dev.read_at(phys, &mut buf).is_ok() && cx.geo.csum.verify(&buf, want) {
                    matched += 1;
                }
            }
        }
    }
    (checked, matched)
}

/// The sys_chunk_array of the SYSTEM chunks, by logical address.
fn sys_array_of(built: &[Built]) -> Vec<u8> {
    let mut v = Vec::new();
    for c in built
        .iter()
        .filter(|c| c.item.type_.get() & BTRFS_BLOCK_GROUP_SYSTEM != 0)
    {
        v.extend_from_slice(
            Key::new(
                BTRFS_FIRST_CHUNK_TREE_OBJECTID,
                BTRFS_CHUNK_ITEM_KEY,
                c.logical,
            )
            .to_disk()
            .as_bytes(),
        );
        v.extend_from_slice(&c.item_bytes());
    }
    v
}

/// Whether two maps hold the same chunks with the same stripes.
fn same_map(a: &ChunkMap, b: &ChunkMap) -> bool {
    let key = |m: &ChunkMapping| (m.logical, m.length, m.type_flags, m.stripes.clone());
    a.len() == b.len() && a.iter().map(key).eq(b.iter().map(key))
}

/// The chunk tree's uuid: what the dev extents record, else what the
/// blocks found carry, the most common.
fn chunk_tree_uuid(trees: &Trees, scan: &Scan) -> Result<[u8; 16]> {
    let mut count: BTreeMap<[u8; 16], u64> = BTreeMap::new();
    for e in &trees.exts {
        *count.entry(e.chunk_tree_uuid).or_default() += 1;
    }
    if count.is_empty() {
        count = scan.chunk_uuids.clone();
    }
    count
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(u, _)| u)
        .ok_or_else(|| Error::corrupt_as(CorruptKind::ChunkMap, "no chunk tree uuid found", 0))
}
