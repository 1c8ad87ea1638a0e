//! Filesystem creation. A minimal bootstrap (chunk, root, extent, dev and
//! free space trees in single leaves, all in generation 1) is written with
//! the superblock held back; the transaction engine then creates the other
//! trees and the root directories and commits; only when everything is on
//! disk is the superblock written. A failure at any point leaves an image
//! with no valid superblock.

pub mod build;
pub mod rootdir;

use crate::csum::CsumType;
use crate::format::block_group::BlockGroupItem;
use crate::format::chunk::{ChunkItem, Stripe};
use crate::format::consts::*;
use crate::format::dev::{DevExtent, DevItem};
use crate::format::extent::{write_inline_refs, ExtentItem, InlineRef, TreeBlockInfo};
use crate::format::key::Key;
use crate::format::superblock::Superblock;
use crate::io::{BlockDevice, StagedSuper};
use crate::trans::Store;
use crate::tree::edit;
use crate::CorruptKind;
use crate::{Error, Result};
use std::sync::Arc;
use zerocopy::{FromZeros, IntoBytes};

const MIB: u64 = 1 << 20;

/// Optional features of a new filesystem (mkfs.btrfs `-O`). Invariant,
/// kept by [`Features::apply`]: `block_group_tree` only with
/// `free_space_tree` and `no_holes`.
#[derive(Clone, Debug)]
pub struct Features {
    /// `NO_HOLES` incompat: holes in files are implicit, no hole file extent
    /// items are written.
    pub no_holes: bool,
    /// `SKINNY_METADATA` incompat: tree blocks are recorded as METADATA_ITEM
    /// keys (level in the offset) instead of EXTENT_ITEM plus tree block info.
    pub skinny_metadata: bool,
    /// `EXTENDED_IREF` incompat: inode names that do not fit an INODE_REF item
    /// (many hard links in one directory) go to INODE_EXTREF items.
    pub extref: bool,
    /// Free space tree (compat_ro `FREE_SPACE_TREE` and `FREE_SPACE_TREE_VALID`)
    /// instead of the v1 space cache.
    pub free_space_tree: bool,
    /// Block group items in their own tree (compat_ro `BLOCK_GROUP_TREE`)
    /// instead of the extent tree.
    pub block_group_tree: bool,
    /// `MIXED_GROUPS` incompat (mkfs.btrfs `-M`): data and metadata share
    /// block groups (DATA|METADATA); nodes are one sector, data and
    /// metadata take one profile.
    pub mixed: bool,
    /// `RAID56` incompat (`-O raid56`); set anyway when a profile is
    /// RAID5 or RAID6, as mkfs.btrfs does.
    pub raid56: bool,
    /// Quota groups (`-O quota`): enabled, and counted once the files are
    /// in ([`enable_quota`]).
    pub quota: bool,
    /// Simple quotas (`-O squota`, incompat SIMPLE_QUOTA): enabled when
    /// the filesystem is made, so every extent written into it counts
    /// for the subvolume that wrote it.
    pub squota: bool,
    /// `block-group-tree` was named (on or off) in a list, not taken from
    /// the defaults: a default block group tree gives way when a feature
    /// it needs is turned off (mkfs.btrfs 6.19), a named one is an error.
    bgt_named: bool,
}

impl Default for Features {
    /// mkfs.btrfs 6.19's defaults: no-holes, skinny-metadata, extref, the
    /// free space tree and (new in 6.19) the block group tree.
    fn default() -> Self {
        Features {
            no_holes: true,
            skinny_metadata: true,
            extref: true,
            free_space_tree: true,
            block_group_tree: true,
            mixed: false,
            raid56: false,
            quota: false,
            squota: false,
            bgt_named: false,
        }
    }
}

impl Features {
    /// What `-O list-all` prints: every feature btrkit-mkfs takes, with
    /// whether it is on by default (mkfs.btrfs's own list has the same
    /// names).
    pub fn list_all() -> String {
        let d = Features::default();
        let rows: [(&str, &str, bool); 10] = [
            ("quota", "quota support (qgroups)", d.quota),
            ("mixed-bg", "mixed data and metadata block groups", d.mixed),
            (
                "extref",
                "increased hardlink limit per file to 65536",
                d.extref,
            ),
            ("raid56", "raid56 extended format", d.raid56),
            (
                "skinny-metadata",
                "reduced-size metadata extent refs",
                d.skinny_metadata,
            ),
            ("no-holes", "no explicit hole extents for files", d.no_holes),
            (
                "free-space-tree",
                "free space tree, improved space tracking (space_cache=v2)",
                d.free_space_tree,
            ),
            (
                "block-group-tree",
                "block group tree, more efficient block group tracking to reduce mount time",
                d.block_group_tree,
            ),
            (
                "squota",
                "squota support (simple accounting qgroups)",
                d.squota,
            ),
            (
                "raid-stripe-tree",
                "raid stripe tree (not supported by btrkit-mkfs)",
                false,
            ),
        ];
        let mut out = String::from("Filesystem features available:\n");
        for (name, what, on) in rows {
            out.push_str(&format!(
                "{name:<22} - {what}{}\n",
                if on { " (default)" } else { "" }
            ));
        }
        out
    }

    /// Apply a comma-separated `-O` list: `name` enables, `^name` disables.
    pub fn apply(&mut self, list: &str) -> Result<()> {
        for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (on, name) = match raw.strip_prefix('^') {
                Some(n) => (false, n),
                None => (true, raw),
            };
            match name.to_ascii_lowercase().replace('_', "-").as_str() {
                "no-holes" => self.no_holes = on,
                "skinny-metadata" => self.skinny_metadata = on,
                "extref" => self.extref = on,
                "free-space-tree" | "fst" => self.free_space_tree = on,
                "block-group-tree" | "bgt" => {
                    self.block_group_tree = on;
                    self.bgt_named = true;
                }
                "mixed-bg" => self.mixed = on,
                "raid56" => self.raid56 = on,
                "quota" => self.quota = on,
                "squota" => self.squota = on,
                "raid-stripe-tree" => {
                    return Err(Error::Unsupported(
                        "feature 'raid-stripe-tree' is not supported by btrkit-mkfs: RAID5/6 here use the classic layout (parity in every row, no stripe tree), which the kernel mounts without it".into(),
                    ))
                }
                "zoned" | "raid1c34" | "extent-tree-v2" => {
                    return Err(Error::Unsupported(format!("feature '{name}' is not supported by btrkit-mkfs")))
                }
                _ => return Err(Error::Invalid(format!("unknown feature '{name}' (known: no-holes, skinny-metadata, extref, free-space-tree, block-group-tree, mixed-bg, raid56, quota, squota)"))),
            }
        }
        if self.quota && self.squota {
            return Err(Error::Invalid(
                "quota and squota cannot both be enabled (squota is the simple mode of quotas)"
                    .into(),
            ));
        }
        if self.block_group_tree && !(self.free_space_tree && self.no_holes) {
            if self.bgt_named {
                return Err(Error::Invalid(
                    "block-group-tree requires the no-holes and free-space-tree features".into(),
                ));
            }
            self.block_group_tree = false;
        }
        Ok(())
    }
}

/// Everything [`make`] needs to lay out a new single-device filesystem.
/// `Default` is mkfs.btrfs's: 16 KiB nodes, 4 KiB sectors, crc32c, no label,
/// random fsid, default features, the current time.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Filesystem size; None = the whole device.
    pub size: Option<u64>,
    /// Tree block size in bytes: a power of two from `sectorsize` to 64 KiB.
    pub nodesize: u32,
    /// Sector size in bytes, the unit of data extents and checksums; only 4096
    /// is accepted.
    pub sectorsize: u32,
    /// Checksum algorithm for tree blocks, superblocks and data.
    pub csum: CsumType,
    /// Filesystem label, at most 255 bytes (the superblock field is 256 bytes,
    /// NUL-terminated).
    pub label: String,
    /// Filesystem UUID (fsid); None = a random one.
    pub fsid: Option<[u8; 16]>,
    /// Optional features to enable.
    pub features: Features,
    /// Creation time for inodes and root items (seconds since the epoch).
    pub now: u64,
    /// Metadata (and system) profile, as block group profile bits (0 is
    /// SINGLE); None = mkfs.btrfs's default: DUP on one device, RAID1 on
    /// several.
    pub metadata_profile: Option<u64>,
    /// Data profile; None = SINGLE.
    pub data_profile: Option<u64>,
    /// The node size was given (`-n`); with mixed block groups and no
    /// `-n`, nodes are one sector, as mkfs.btrfs makes them.
    pub nodesize_given: bool,
    /// The device's own UUID (`--device-uuid`, one device only); None =
    /// a random one.
    pub device_uuid: Option<[u8; 16]>,
    /// Compress the files of `--rootdir` (`--compress`); None: plain.
    pub compress: Option<crate::fs::compress::Method>,
    /// `--compress-force`: compress as under `-o compress-force`.
    pub compress_force: bool,
    /// The largest chunk, the first ones and every later one (`--shrink`:
    /// [`SHRINK_CHUNK`]); None: the kernel's sizes.
    pub chunk_cap: Option<u64>,
}

/// The chunk size of a filesystem made to be shrunk: it ends where its
/// last chunk does, so the unused tail of the last data and metadata
/// chunks is what the image carries beyond its contents (mkfs.btrfs
/// sizes its chunks from an estimate of the source, 8 MiB data chunks
/// for a small tree, larger ones for a large tree).
pub const SHRINK_CHUNK: u64 = 8 * MIB;

/// Free metadata space a shrunk filesystem keeps at least (more for large
/// nodes and for a large tree, half its metadata, up to 512 MiB): what
/// the kernel needs to mount it read-write and start writing.
pub const SHRINK_META_SLACK: u64 = 16 * MIB;

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            size: None,
            nodesize: 16384,
            sectorsize: 4096,
            csum: CsumType::Crc32c,
            label: String::new(),
            fsid: None,
            features: Features::default(),
            now: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            metadata_profile: None,
            data_profile: None,
            nodesize_given: false,
            device_uuid: None,
            compress: None,
            compress_force: false,
            chunk_cap: None,
        }
    }
}

pub use crate::format::names::parse_profile;

/// The profile's name as mkfs.btrfs prints it.
fn profile_name(p: u64) -> &'static str {
    match p & BTRFS_BLOCK_GROUP_PROFILE_MASK {
        0 => "single",
        BTRFS_BLOCK_GROUP_DUP => "DUP",
        BTRFS_BLOCK_GROUP_RAID0 => "RAID0",
        BTRFS_BLOCK_GROUP_RAID1 => "RAID1",
        BTRFS_BLOCK_GROUP_RAID1C3 => "RAID1C3",
        BTRFS_BLOCK_GROUP_RAID1C4 => "RAID1C4",
        BTRFS_BLOCK_GROUP_RAID10 => "RAID10",
        BTRFS_BLOCK_GROUP_RAID5 => "RAID5",
        BTRFS_BLOCK_GROUP_RAID6 => "RAID6",
        _ => "?",
    }
}

/// Layout of one chunk of the bootstrap.
#[derive(Clone, Debug)]
pub struct ChunkPlan {
    /// Block group flags: type (SYSTEM, METADATA, DATA) and profile.
    pub flags: u64,
    /// Logical start address of the chunk, in bytes.
    pub logical: u64,
    /// Chunk length in bytes (logical size).
    pub length: u64,
    /// (devid, physical offset) of each stripe, in stripe order.
    pub stripes: Vec<(u64, u64)>,
    /// Bytes each stripe takes on its device (the dev extent length).
    pub stripe_size: u64,
    /// Stripes per mirrored set (RAID10: 2; 1 otherwise).
    pub sub_stripes: u16,
}

/// What [`make`] created, for the mkfs binary's report (human and `--json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MkfsSummary {
    /// Filesystem label (may be empty).
    pub label: String,
    /// Filesystem UUID (fsid), in the usual 8-4-4-4-12 hex form.
    pub uuid: String,
    /// Tree block size in bytes.
    pub node_size: u32,
    /// Sector size in bytes.
    pub sector_size: u32,
    /// Usable size of the filesystem in bytes (the requested size rounded down
    /// to a sector).
    pub filesystem_size: u64,
    /// Checksum algorithm name (`crc32c`, `xxhash64`, `sha256`, `blake2b`).
    pub checksum: String,
    /// Names of the incompat features, then the compat_ro ones, that were set.
    pub features: Vec<String>,
    /// The initial chunks as (type and profile as btrfs-progs prints them,
    /// e.g. `METADATA|DUP`; logical start; length), bytes.
    pub chunks: Vec<(String, u64, u64)>,
    /// Data and metadata profiles, as mkfs.btrfs prints them (`single`,
    /// `DUP`, `RAID1`...).
    pub profiles: (String, String),
    /// Every device as (devid, size in bytes, its path or name).
    pub devices: Vec<(u64, u64, String)>,
}

pub use crate::util::uuid::{parse_uuid, random_uuid, uuid_str};

/// Smallest filesystem this layout fits in.
pub fn min_size(nodesize: u32) -> u64 {
    let _ = nodesize;
    // 1 MiB reserved + system 2x8 MiB + metadata 2x32 MiB + data 64 MiB.
    1 + 16 + 64 + 64 + 1
}

fn validate(o: &MkfsOptions, dev_size: u64) -> Result<u64> {
    let ss = o.sectorsize;
    if ss != 4096 {
        return Err(Error::Invalid(format!(
            "sectorsize {ss} unsupported (only 4096)"
        )));
    }
    let ns = o.nodesize;
    if !ns.is_power_of_two() || ns < ss || ns > BTRFS_MAX_NODESIZE {
        return Err(Error::Invalid(format!(
            "nodesize {ns} invalid: must be a power of two between {ss} and {BTRFS_MAX_NODESIZE}"
        )));
    }
    let size = o.size.unwrap_or(dev_size);
    if size > dev_size {
        return Err(Error::Invalid(format!(
            "size {size} is larger than the device ({dev_size} bytes)"
        )));
    }
    let size = size / ss as u64 * ss as u64;
    let min = min_size(ns) * MIB;
    if size < min {
        return Err(Error::Invalid(format!(
            "size {size} bytes is too small: the minimum is {} MiB",
            min / MIB
        )));
    }
    if o.label.len() >= BTRFS_LABEL_SIZE {
        return Err(Error::Invalid(format!(
            "label is {} bytes, the maximum is {}",
            o.label.len(),
            BTRFS_LABEL_SIZE - 1
        )));
    }
    Ok(size)
}

/// Chunk layout for a one-device filesystem of `size` bytes with the
/// default profiles: DUP system and metadata, SINGLE data, sized as
/// mkfs.btrfs sizes its first chunks; none above `cap`.
pub fn plan_chunks(size: u64, cap: Option<u64>) -> Vec<ChunkPlan> {
    let cap = cap.unwrap_or(u64::MAX);
    let sys = (8 * MIB).min(cap);
    let meta = (size / 20 / MIB * MIB).clamp(32 * MIB, 256 * MIB).min(cap);
    let data = (size / 10 / MIB * MIB).clamp(64 * MIB, 1024 * MIB).min(cap);
    let mut phys = MIB;
    let mut take = |len: u64| {
        let p = phys;
        phys += len;
        (1, p)
    };
    let s = ChunkPlan {
        flags: BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_DUP,
        logical: MIB,
        length: sys,
        stripes: vec![take(sys), take(sys)],
        stripe_size: sys,
        sub_stripes: 1,
    };
    let m = ChunkPlan {
        flags: BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP,
        logical: s.logical + sys,
        length: meta,
        stripes: vec![take(meta), take(meta)],
        stripe_size: meta,
        sub_stripes: 1,
    };
    let d = ChunkPlan {
        flags: BTRFS_BLOCK_GROUP_DATA,
        logical: m.logical + meta,
        length: data,
        stripes: vec![take(data)],
        stripe_size: data,
        sub_stripes: 1,
    };
    vec![s, m, d]
}

/// Chunk layout on devices of `sizes` bytes (devids 1..) for metadata
/// profile `meta` (the system chunk's too, as mkfs.btrfs does) and data
/// profile `data`: system, metadata and data chunks one after another in
/// logical space from 1 MiB, each placed by the kernel's chunk allocator
/// rules (`place_chunk`) on the space the chunks before it left.
pub fn plan_set_chunks(sizes: &[u64], meta: u64, data: u64) -> Result<Vec<ChunkPlan>> {
    plan_chunks_of(sizes, meta, data, false, None)
}

/// [`plan_set_chunks`]; `mixed`: one DATA|METADATA chunk after the system
/// chunk instead of a metadata and a data chunk (profile `meta`).
fn plan_chunks_of(
    sizes: &[u64],
    meta: u64,
    data: u64,
    mixed: bool,
    cap: Option<u64>,
) -> Result<Vec<ChunkPlan>> {
    use crate::trans::chunk_alloc::{pick_hole, place_chunk, Candidate};
    let total: u64 = sizes.iter().sum();
    let mut next: Vec<u64> = vec![MIB; sizes.len()];
    let mut logical = MIB;
    let mut plan = |ty: u64, profile: u64| -> Result<ChunkPlan> {
        let flags = ty | profile;
        let name = crate::format::names::block_group_flags_str(flags);
        let attr = crate::chunk::RaidAttr::of(profile)
            .ok_or_else(|| Error::Unsupported(format!("a {name} chunk")))?;
        if (sizes.len() as u64) < attr.devs_min {
            return Err(Error::Invalid(format!(
                "profile {} needs at least {} devices, {} given",
                profile_name(profile),
                attr.devs_min,
                sizes.len()
            )));
        }
        let mut cands = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let hole = [(next[i], size.max(next[i]))];
            if let Some((at, avail)) = pick_hole(&hole, ty, attr, total) {
                cands.push(Candidate {
                    devid: i as u64 + 1,
                    uuid: [0; 16],
                    dev_offset: at,
                    max_avail: avail,
                    total_avail: avail,
                });
            }
        }
        let (stripes, stripe_size, length) =
            place_chunk(cands, ty, attr, total, &name, sizes.len(), cap).map_err(|e| match e {
                Error::NoSpace(m) => Error::Invalid(format!("the devices are too small: {m}")),
                e => e,
            })?;
        // A chunk too small for the bootstrap and a first commit is of no
        // use; mkfs.btrfs refuses such devices too.
        let least = if ty == BTRFS_BLOCK_GROUP_SYSTEM {
            4 * MIB
        } else {
            16 * MIB
        }
        .min(cap.unwrap_or(u64::MAX));
        if length < least {
            return Err(Error::Invalid(format!(
                "the devices are too small: the first {name} chunk would be {} KiB",
                length >> 10
            )));
        }
        for &(devid, _, p) in &stripes {
            let i = (devid - 1) as usize;
            next[i] = next[i].max(p + stripe_size);
        }
        let c = ChunkPlan {
            flags,
            logical,
            length,
            stripes: stripes.iter().map(|&(d, _, p)| (d, p)).collect(),
            stripe_size,
            sub_stripes: attr.sub_stripes as u16,
        };
        logical += length;
        Ok(c)
    };
    let sys = plan(BTRFS_BLOCK_GROUP_SYSTEM, meta)?;
    if mixed {
        let m = plan(BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DATA, meta)?;
        return Ok(vec![sys, m]);
    }
    let m = plan(BTRFS_BLOCK_GROUP_METADATA, meta)?;
    let d = plan(BTRFS_BLOCK_GROUP_DATA, data)?;
    Ok(vec![sys, m, d])
}

fn chunk_item_bytes(p: &ChunkPlan, sectorsize: u32, dev_uuids: &[[u8; 16]]) -> Vec<u8> {
    let c = ChunkItem {
        length: p.length.into(),
        owner: BTRFS_EXTENT_TREE_OBJECTID.into(),
        stripe_len: BTRFS_STRIPE_LEN.into(),
        type_: p.flags.into(),
        io_align: (BTRFS_STRIPE_LEN as u32).into(),
        io_width: (BTRFS_STRIPE_LEN as u32).into(),
        sector_size: sectorsize.into(),
        num_stripes: (p.stripes.len() as u16).into(),
        sub_stripes: p.sub_stripes.into(),
    };
    let mut v = c.as_bytes().to_vec();
    for &(devid, offset) in &p.stripes {
        let s = Stripe {
            devid: devid.into(),
            offset: offset.into(),
            dev_uuid: dev_uuids[(devid - 1) as usize],
        };
        v.extend_from_slice(s.as_bytes());
    }
    v
}

/// Superblocks held back until the new filesystem is complete, one staged
/// device per member (see [`finish`]).
pub struct Staging {
    devs: Vec<Arc<StagedSuper>>,
}

impl Staging {
    /// Write every device's held superblocks: from here on the devices
    /// form a valid filesystem. Every device's other writes were flushed
    /// by the commit that made them.
    pub fn publish(&self) -> Result<()> {
        for d in &self.devs {
            d.publish()?;
        }
        Ok(())
    }
}

pub use crate::format::inode::{dir_inode, now_ts};
pub use crate::format::root::new_root_item;

/// Make a filesystem on `dev`. Returns the summary and the open engine
/// (superblock still held) so `--rootdir` can populate it before
/// [`finish`] publishes the superblock.
pub fn make(dev: Arc<dyn BlockDevice>, o: &MkfsOptions) -> Result<(Store, Staging, MkfsSummary)> {
    make_set(vec![(String::new(), dev)], o)
}

/// Make one filesystem on the devices `devs` (name for messages, device),
/// devids 1.. in the order given: the bootstrap on every device, each
/// device's superblocks with its own device item, all held back until
/// [`finish`]. Each device contributes its size (or `o.size`, which must
/// fit it).
pub fn make_set(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    o: &MkfsOptions,
) -> Result<(Store, Staging, MkfsSummary)> {
    if devs.is_empty() {
        return Err(Error::Invalid("no device to make a filesystem on".into()));
    }
    let one_sector = one_sector_nodes(o)?;
    let o = one_sector.as_ref().unwrap_or(o);
    let n = devs.len();
    let sizes = device_sizes(&devs, o)?;
    let profiles = profiles(o, n)?;
    let (meta_profile, data_profile) = profiles;
    let plans: Vec<ChunkPlan> = if n == 1
        && !o.features.mixed
        && meta_profile == BTRFS_BLOCK_GROUP_DUP
        && data_profile == 0
    {
        plan_chunks(sizes[0], o.chunk_cap)
    } else {
        plan_chunks_of(
            &sizes,
            meta_profile,
            data_profile,
            o.features.mixed,
            o.chunk_cap,
        )?
    };
    // Any old superblock goes first, so a failure below cannot leave the
    // previous filesystem looking intact over our half-written blocks.
    for (_, dev) in &devs {
        wipe_superblocks(dev.as_ref())?;
    }
    let staged: Vec<Arc<StagedSuper>> = devs
        .iter()
        .map(|(_, d)| Arc::new(StagedSuper::new(d.clone())))
        .collect();
    let fsid = o.fsid.unwrap_or_else(random_uuid);
    if o.device_uuid.is_some() && n > 1 {
        return Err(Error::Invalid(
            "--device-uuid is for a filesystem on one device".into(),
        ));
    }
    let dev_uuids: Vec<[u8; 16]> = (0..n)
        .map(|_| o.device_uuid.unwrap_or_else(random_uuid))
        .collect();
    // The chunk map of the plan, to place every copy of the bootstrap
    // blocks.
    let mut map = crate::chunk::ChunkMap::new();
    for p in &plans {
        let bytes = chunk_item_bytes(p, o.sectorsize, &dev_uuids);
        let (c, st) = crate::format::chunk::parse_chunk(&bytes)?;
        map.insert(p.logical, c, st)?;
    }
    let at = place_bootstrap(&map, &plans, o)?;
    let b = Bootstrap {
        o,
        plans: &plans,
        sizes: &sizes,
        fsid,
        chunk_tree_uuid: random_uuid(),
        dev_uuids,
        map,
        at,
    };
    let dev_items = b.dev_items();
    let (leaves, blocks) = b.leaves(&dev_items)?;
    b.write_blocks(&staged, leaves)?;
    let (compat_ro, incompat) = feature_flags(o, profiles);
    b.write_supers(&staged, &dev_items, blocks, (compat_ro, incompat))?;

    // Generation 2: the rest, through the engine.
    let mut fs = open_new(&devs, &staged, o)?;
    populate(&mut fs, o, fsid)?;
    fs.commit()?;
    // Simple quotas from the start, so everything written into the new
    // filesystem (--rootdir) is counted for its subvolume.
    let incompat = if o.features.squota {
        fs.quotas().quota_enable_simple(&[])?;
        fs.commit()?;
        incompat | BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA
    } else {
        incompat
    };
    let summary = b.summary(&devs, (compat_ro, incompat), profiles);
    Ok((fs, Staging { devs: staged }, summary))
}

/// Mixed block groups hold data and tree blocks alike: a node is one
/// sector. The options with that node size (None when not mixed).
fn one_sector_nodes(o: &MkfsOptions) -> Result<Option<MkfsOptions>> {
    if !o.features.mixed {
        return Ok(None);
    }
    if o.nodesize_given && o.nodesize != o.sectorsize {
        return Err(Error::Invalid(format!(
            "nodesize {} is not the sector size {} (mixed block groups need them equal)",
            o.nodesize, o.sectorsize
        )));
    }
    Ok(Some(MkfsOptions {
        nodesize: o.sectorsize,
        ..o.clone()
    }))
}

/// The size each device gives the filesystem, checked (a message names
/// the device when there are several).
fn device_sizes(devs: &[(String, Arc<dyn BlockDevice>)], o: &MkfsOptions) -> Result<Vec<u64>> {
    let n = devs.len();
    let mut sizes = Vec::with_capacity(n);
    for (name, d) in devs {
        let size = validate(o, d.size()).map_err(|e| match (e, n) {
            (Error::Invalid(m), n) if n > 1 => Error::Invalid(format!("{name}: {m}")),
            (e, _) => e,
        })?;
        sizes.push(size);
    }
    Ok(sizes)
}

/// The (metadata, data) profiles on `n` devices.
fn profiles(o: &MkfsOptions, n: usize) -> Result<(u64, u64)> {
    if o.features.mixed {
        // One profile for both (mkfs.btrfs: data's default, single, and
        // metadata follows it).
        return match (o.metadata_profile, o.data_profile) {
            (Some(m), Some(d)) if m != d => Err(Error::Invalid(
                "with mixed block groups data and metadata profiles must be the same".into(),
            )),
            (Some(p), _) | (None, Some(p)) => Ok((p, p)),
            (None, None) => Ok((0, 0)),
        };
    }
    Ok((
        o.metadata_profile.unwrap_or(if n > 1 {
            BTRFS_BLOCK_GROUP_RAID1
        } else {
            BTRFS_BLOCK_GROUP_DUP
        }),
        o.data_profile.unwrap_or(0),
    ))
}

/// The generation of the bootstrap blocks.
const BOOTSTRAP_GEN: u64 = 1;

/// Where the bootstrap blocks go: the chunk tree in the system chunk, the
/// rest at the start of the metadata chunk.
struct BootstrapBlocks {
    chunk_root: u64,
    root_tree: u64,
    extent_tree: u64,
    dev_tree: u64,
    /// The free space tree's (with that feature).
    fst: Option<u64>,
    /// The block group tree's (with that feature).
    bgt: Option<u64>,
}

/// The bootstrap blocks placed, each where no copy meets a superblock
/// copy on its device. A RAID5/6 block's write also writes its column's
/// parity: every stripe of the column counts.
fn place_bootstrap(
    map: &crate::chunk::ChunkMap,
    plans: &[ChunkPlan],
    o: &MkfsOptions,
) -> Result<BootstrapBlocks> {
    let ns = o.nodesize as u64;
    let (sys, meta) = (&plans[0], &plans[1]);
    let meets_super = |b: u64| -> Result<bool> {
        let mut at = Vec::new();
        for p in map.pieces(b, ns)? {
            at.extend(p.copies.iter().map(|c| c.1));
            if let Some(col) = &p.parity {
                at.extend(col.stripes.iter().map(|c| c.1));
            }
        }
        Ok(at.iter().any(|&p| {
            (0..BTRFS_SUPER_MIRROR_MAX).any(|m| {
                let s = btrfs_sb_offset(m);
                p < s + BTRFS_SUPER_INFO_SIZE as u64 && s < p + ns
            })
        }))
    };
    let first_free = |mut b: u64, end: u64| -> Result<u64> {
        while meets_super(b)? {
            b += ns;
            if b + ns > end {
                return Err(Error::Invalid("no room for the bootstrap blocks".into()));
            }
        }
        Ok(b)
    };
    let chunk_root = first_free(sys.logical, sys.logical + sys.length)?;
    let mut next = meta.logical;
    let mut take = || -> Result<u64> {
        let b = first_free(next, meta.logical + meta.length)?;
        next = b + ns;
        Ok(b)
    };
    let root_tree = take()?;
    let extent_tree = take()?;
    let dev_tree = take()?;
    let fst = if o.features.free_space_tree {
        Some(take()?)
    } else {
        None
    };
    let bgt = if o.features.block_group_tree {
        Some(take()?)
    } else {
        None
    };
    Ok(BootstrapBlocks {
        chunk_root,
        root_tree,
        extent_tree,
        dev_tree,
        fst,
        bgt,
    })
}

/// The (compat_ro, incompat) feature flags of the new filesystem, from
/// its options and (metadata, data) profiles.
fn feature_flags(o: &MkfsOptions, (meta_profile, data_profile): (u64, u64)) -> (u64, u64) {
    let f = &o.features;
    let mut compat_ro = 0;
    if f.free_space_tree {
        compat_ro |=
            BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE | BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID;
    }
    if f.block_group_tree {
        compat_ro |= BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE;
    }
    let mut incompat = BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF;
    if o.nodesize > 4096 {
        incompat |= BTRFS_FEATURE_INCOMPAT_BIG_METADATA;
    }
    if f.extref {
        incompat |= BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF;
    }
    if f.skinny_metadata {
        incompat |= BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA;
    }
    if f.no_holes {
        incompat |= BTRFS_FEATURE_INCOMPAT_NO_HOLES;
    }
    if (meta_profile | data_profile) & (BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4) != 0
    {
        incompat |= BTRFS_FEATURE_INCOMPAT_RAID1C34;
    }
    if f.mixed {
        incompat |= BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS;
    }
    match o.compress.map(|m| m.kind) {
        Some(BTRFS_COMPRESS_LZO) => incompat |= BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO,
        Some(BTRFS_COMPRESS_ZSTD) => incompat |= BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD,
        _ => {}
    }
    if f.raid56
        || (meta_profile | data_profile) & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0
    {
        incompat |= BTRFS_FEATURE_INCOMPAT_RAID56;
    }
    (compat_ro, incompat)
}

/// The engine opened on the staged devices (generation 2 on), every block
/// group dirty so the first commit fills the free space tree.
fn open_new(
    devs: &[(String, Arc<dyn BlockDevice>)],
    staged: &[Arc<StagedSuper>],
    o: &MkfsOptions,
) -> Result<Store> {
    let others: Vec<(u64, Arc<dyn BlockDevice>)> = staged
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, d)| (i as u64 + 1, d.clone() as Arc<dyn BlockDevice>))
        .collect();
    let names = if devs.len() > 1 {
        devs.iter()
            .enumerate()
            .map(|(i, (name, _))| (i as u64 + 1, name.clone()))
            .collect()
    } else {
        Default::default()
    };
    let img = crate::image::Image::open_devices(
        staged[0].clone(),
        others,
        names,
        crate::image::OpenOptions {
            writable: true,
            ..Default::default()
        },
    )?;
    let mut fs = Store::from_image(img)?;
    fs.chunks().set_cap(o.chunk_cap);
    fs.chunks().rewrite_block_groups();
    Ok(fs)
}

/// A new filesystem's identity, chunks and bootstrap block places: what
/// its generation 1 is written from.
struct Bootstrap<'a> {
    o: &'a MkfsOptions,
    plans: &'a [ChunkPlan],
    sizes: &'a [u64],
    fsid: [u8; 16],
    chunk_tree_uuid: [u8; 16],
    dev_uuids: Vec<[u8; 16]>,
    map: crate::chunk::ChunkMap,
    at: BootstrapBlocks,
}

/// Append an item to a bootstrap leaf.
fn push_item(b: &mut [u8], k: Key, d: &[u8]) -> Result<()> {
    let at = edit::nritems(b);
    edit::leaf_insert(b, at, &k, d)
}

impl Bootstrap<'_> {
    fn ns(&self) -> u64 {
        self.o.nodesize as u64
    }

    /// An empty leaf at `bytenr` of tree `owner`.
    fn new_leaf(&self, bytenr: u64, owner: u64) -> Vec<u8> {
        let mut b = vec![0u8; self.ns() as usize];
        edit::init_block(
            &mut b,
            bytenr,
            0,
            owner,
            BOOTSTRAP_GEN,
            &self.fsid,
            &self.chunk_tree_uuid,
        );
        b
    }

    /// Every device's device item.
    fn dev_items(&self) -> Vec<DevItem> {
        let o = self.o;
        (0..self.sizes.len())
            .map(|i| {
                let devid = i as u64 + 1;
                let used: u64 = self
                    .plans
                    .iter()
                    .map(|p| {
                        p.stripes.iter().filter(|s| s.0 == devid).count() as u64 * p.stripe_size
                    })
                    .sum();
                let mut di = DevItem::new_zeroed();
                di.devid.set(devid);
                di.total_bytes.set(self.sizes[i]);
                di.bytes_used.set(used);
                di.io_align.set(o.sectorsize);
                di.io_width.set(o.sectorsize);
                di.sector_size.set(o.sectorsize);
                di.uuid = self.dev_uuids[i];
                di.fsid = self.fsid;
                di
            })
            .collect()
    }

    /// The bootstrap leaves (chunk, root, extent and dev trees, then the
    /// block group and free space trees' with those features) and the
    /// number of bootstrap blocks.
    fn leaves(&self, dev_items: &[DevItem]) -> Result<(Vec<Vec<u8>>, u64)> {
        let (extent_leaf, extra_leaves, blocks) = self.extent_leaves()?;
        let mut all = vec![
            self.chunk_leaf(dev_items)?,
            self.root_leaf()?,
            extent_leaf,
            self.dev_leaf()?,
        ];
        all.extend(extra_leaves);
        Ok((all, blocks))
    }

    /// Chunk tree: a device item per device and the chunks.
    fn chunk_leaf(&self, dev_items: &[DevItem]) -> Result<Vec<u8>> {
        let mut chunk_leaf = self.new_leaf(self.at.chunk_root, BTRFS_CHUNK_TREE_OBJECTID);
        for di in dev_items {
            push_item(
                &mut chunk_leaf,
                Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, di.devid.get()),
                di.as_bytes(),
            )?;
        }
        for p in self.plans {
            push_item(
                &mut chunk_leaf,
                Key::new(
                    BTRFS_FIRST_CHUNK_TREE_OBJECTID,
                    BTRFS_CHUNK_ITEM_KEY,
                    p.logical,
                ),
                &chunk_item_bytes(p, self.o.sectorsize, &self.dev_uuids),
            )?;
        }
        Ok(chunk_leaf)
    }

    /// Dev tree: one dev extent per stripe, by device and physical offset.
    fn dev_leaf(&self) -> Result<Vec<u8>> {
        let mut dev_leaf = self.new_leaf(self.at.dev_tree, BTRFS_DEV_TREE_OBJECTID);
        let mut exts: Vec<(u64, u64, &ChunkPlan)> = self
            .plans
            .iter()
            .flat_map(|p| p.stripes.iter().map(move |&(d, ph)| (d, ph, p)))
            .collect();
        exts.sort_by_key(|e| (e.0, e.1));
        for (devid, ph, p) in exts {
            let de = DevExtent {
                chunk_tree: BTRFS_CHUNK_TREE_OBJECTID.into(),
                chunk_objectid: BTRFS_FIRST_CHUNK_TREE_OBJECTID.into(),
                chunk_offset: p.logical.into(),
                length: p.stripe_size.into(),
                chunk_tree_uuid: self.chunk_tree_uuid,
            };
            push_item(
                &mut dev_leaf,
                Key::new(devid, BTRFS_DEV_EXTENT_KEY, ph),
                de.as_bytes(),
            )?;
        }
        Ok(dev_leaf)
    }

    /// Extent tree: block group items (unless in the block group tree) and
    /// a tree block item for each bootstrap block; with it the block group
    /// tree's leaf and the free space tree's (empty), and the number of
    /// bootstrap blocks.
    fn extent_leaves(&self) -> Result<(Vec<u8>, Vec<Vec<u8>>, u64)> {
        let (at, ns) = (&self.at, self.ns());
        let mut blocks: Vec<(u64, u64)> = vec![
            (at.chunk_root, BTRFS_CHUNK_TREE_OBJECTID),
            (at.root_tree, BTRFS_ROOT_TREE_OBJECTID),
            (at.extent_tree, BTRFS_EXTENT_TREE_OBJECTID),
            (at.dev_tree, BTRFS_DEV_TREE_OBJECTID),
        ];
        if let Some(b) = at.fst {
            blocks.push((b, BTRFS_FREE_SPACE_TREE_OBJECTID));
        }
        if let Some(b) = at.bgt {
            blocks.push((b, BTRFS_BLOCK_GROUP_TREE_OBJECTID));
        }
        let mut items: Vec<(Key, Vec<u8>)> = Vec::new();
        for &(b, owner) in &blocks {
            items.push(self.tree_block_item(b, owner));
        }
        let mut bg_items: Vec<(Key, Vec<u8>)> = Vec::new();
        for p in self.plans {
            let used: u64 = blocks
                .iter()
                .filter(|(b, _)| *b >= p.logical && *b < p.logical + p.length)
                .count() as u64
                * ns;
            let bi = BlockGroupItem {
                used: used.into(),
                chunk_objectid: BTRFS_FIRST_CHUNK_TREE_OBJECTID.into(),
                flags: p.flags.into(),
            };
            bg_items.push((
                Key::new(p.logical, BTRFS_BLOCK_GROUP_ITEM_KEY, p.length),
                bi.as_bytes().to_vec(),
            ));
        }
        if at.bgt.is_none() {
            items.extend(bg_items.iter().cloned());
        }
        items.sort_by_key(|i| i.0);
        let mut extent_leaf = self.new_leaf(at.extent_tree, BTRFS_EXTENT_TREE_OBJECTID);
        for (k, d) in &items {
            push_item(&mut extent_leaf, *k, d)?;
        }
        let mut extra_leaves: Vec<Vec<u8>> = Vec::new();
        if let Some(b) = at.bgt {
            let mut l = self.new_leaf(b, BTRFS_BLOCK_GROUP_TREE_OBJECTID);
            for (k, d) in &bg_items {
                push_item(&mut l, *k, d)?;
            }
            extra_leaves.push(l);
        }
        if let Some(b) = at.fst {
            // Filled by the first commit: every block group starts dirty.
            extra_leaves.push(self.new_leaf(b, BTRFS_FREE_SPACE_TREE_OBJECTID));
        }
        Ok((extent_leaf, extra_leaves, blocks.len() as u64))
    }

    /// The extent item of bootstrap block `b` of tree `owner`.
    fn tree_block_item(&self, b: u64, owner: u64) -> (Key, Vec<u8>) {
        let head = ExtentItem {
            refs: 1.into(),
            generation: BOOTSTRAP_GEN.into(),
            flags: BTRFS_EXTENT_FLAG_TREE_BLOCK.into(),
        };
        let mut d = head.as_bytes().to_vec();
        let key = if self.o.features.skinny_metadata {
            Key::new(b, BTRFS_METADATA_ITEM_KEY, 0)
        } else {
            d.extend_from_slice(
                TreeBlockInfo {
                    key: Key::MIN.to_disk(),
                    level: 0,
                }
                .as_bytes(),
            );
            Key::new(b, BTRFS_EXTENT_ITEM_KEY, self.ns())
        };
        write_inline_refs(&mut d, &[InlineRef::TreeBlock { root: owner }]);
        (key, d)
    }

    /// Root tree: root items of the bootstrap trees.
    fn root_leaf(&self) -> Result<Vec<u8>> {
        let at = &self.at;
        let mut root_leaf = self.new_leaf(at.root_tree, BTRFS_ROOT_TREE_OBJECTID);
        let mut roots = vec![
            (BTRFS_EXTENT_TREE_OBJECTID, at.extent_tree),
            (BTRFS_DEV_TREE_OBJECTID, at.dev_tree),
        ];
        if let Some(b) = at.fst {
            roots.push((BTRFS_FREE_SPACE_TREE_OBJECTID, b));
        }
        if let Some(b) = at.bgt {
            roots.push((BTRFS_BLOCK_GROUP_TREE_OBJECTID, b));
        }
        for (id, b) in roots {
            let mut ri = new_root_item(self.o.now, BOOTSTRAP_GEN, 0, None);
            ri.bytenr.set(b);
            ri.bytes_used.set(self.ns());
            push_item(
                &mut root_leaf,
                Key::new(id, BTRFS_ROOT_ITEM_KEY, 0),
                ri.as_bytes(),
            )?;
        }
        Ok(root_leaf)
    }

    /// Write the bootstrap blocks to every copy (RAID5/6 blocks with
    /// their parity).
    fn write_blocks(&self, staged: &[Arc<StagedSuper>], leaves: Vec<Vec<u8>>) -> Result<()> {
        let (map, ns) = (&self.map, self.ns());
        let mut parity_blocks = Vec::new();
        for mut b in leaves {
            edit::mark_written(&mut b);
            let c = crate::csum::block_csum(self.o.csum, &b);
            b[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
            let bytenr = u64::from_le_bytes(b[0x30..0x38].try_into().unwrap_or([0; 8]));
            if map.lookup(bytenr).is_some_and(|m| m.nparity() > 0) {
                parity_blocks.push((bytenr, b));
                continue;
            }
            for (devid, ph) in map.copies(bytenr, ns)? {
                staged[(devid - 1) as usize].write_at(ph, &b)?;
            }
        }
        if !parity_blocks.is_empty() {
            let lookup: Vec<(u64, Arc<dyn BlockDevice>)> = staged
                .iter()
                .enumerate()
                .map(|(i, d)| (i as u64 + 1, d.clone() as Arc<dyn BlockDevice>))
                .collect();
            let refs: Vec<(u64, &[u8])> = parity_blocks
                .iter()
                .map(|(b, v)| (*b, v.as_slice()))
                .collect();
            crate::chunk::rmw::ParityWriter::new().write(map, &refs, &lookup, false)?;
        }
        Ok(())
    }

    /// The bootstrap superblock, every copy on every device with its own
    /// device item (held in memory by the staged devices).
    fn write_supers(
        &self,
        staged: &[Arc<StagedSuper>],
        dev_items: &[DevItem],
        blocks: u64,
        (compat_ro, incompat): (u64, u64),
    ) -> Result<()> {
        let (o, at) = (self.o, &self.at);
        let mut sb = Superblock::new_zeroed();
        sb.fsid = self.fsid;
        sb.metadata_uuid = self.fsid;
        sb.magic.set(BTRFS_MAGIC);
        sb.generation.set(BOOTSTRAP_GEN);
        sb.root.set(at.root_tree);
        sb.chunk_root.set(at.chunk_root);
        sb.total_bytes.set(self.sizes.iter().sum());
        sb.bytes_used.set(blocks * self.ns());
        sb.root_dir_objectid.set(BTRFS_ROOT_TREE_DIR_OBJECTID);
        sb.num_devices.set(self.sizes.len() as u64);
        sb.sectorsize.set(o.sectorsize);
        sb.nodesize.set(o.nodesize);
        sb.leafsize.set(o.nodesize);
        sb.stripesize.set(o.sectorsize);
        sb.chunk_root_generation.set(BOOTSTRAP_GEN);
        sb.flags.set(BTRFS_HEADER_FLAG_WRITTEN);
        sb.compat_ro_flags.set(compat_ro);
        sb.incompat_flags.set(incompat);
        sb.csum_type.set(o.csum.to_disk());
        sb.label[..o.label.len()].copy_from_slice(o.label.as_bytes());
        let sys = &self.plans[0];
        let sys_bytes = chunk_item_bytes(sys, o.sectorsize, &self.dev_uuids);
        let k = Key::new(
            BTRFS_FIRST_CHUNK_TREE_OBJECTID,
            BTRFS_CHUNK_ITEM_KEY,
            sys.logical,
        )
        .to_disk();
        sb.sys_chunk_array[..17].copy_from_slice(k.as_bytes());
        sb.sys_chunk_array[17..17 + sys_bytes.len()].copy_from_slice(&sys_bytes);
        sb.sys_chunk_array_size.set((17 + sys_bytes.len()) as u32);
        for (i, dev) in staged.iter().enumerate() {
            sb.dev_item = dev_items[i];
            for m in 0..BTRFS_SUPER_MIRROR_MAX {
                let off = btrfs_sb_offset(m);
                if off + BTRFS_SUPER_INFO_SIZE as u64 > self.sizes[i] {
                    break;
                }
                let mut copy = sb;
                copy.bytenr.set(off);
                let mut bytes = copy.as_bytes().to_vec();
                let c = crate::csum::block_csum(o.csum, &bytes);
                bytes[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
                dev.write_at(off, &bytes)?;
            }
        }
        Ok(())
    }

    /// What was made, for the report.
    fn summary(
        &self,
        devs: &[(String, Arc<dyn BlockDevice>)],
        (compat_ro, incompat): (u64, u64),
        (meta_profile, data_profile): (u64, u64),
    ) -> MkfsSummary {
        let o = self.o;
        MkfsSummary {
            label: o.label.clone(),
            uuid: uuid_str(&self.fsid),
            node_size: o.nodesize,
            sector_size: o.sectorsize,
            filesystem_size: self.sizes.iter().sum(),
            checksum: o.csum.name().to_string(),
            features: crate::format::names::incompat_names(incompat)
                .into_iter()
                .chain(crate::format::names::compat_ro_names(compat_ro))
                .collect(),
            chunks: self
                .plans
                .iter()
                .map(|p| {
                    (
                        crate::format::names::block_group_flags_str(p.flags),
                        p.logical,
                        p.length,
                    )
                })
                .collect(),
            profiles: (
                profile_name(data_profile).to_string(),
                profile_name(meta_profile).to_string(),
            ),
            devices: devs
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (i as u64 + 1, self.sizes[i], name.clone()))
                .collect(),
        }
    }
}

/// Create the fs tree, csum tree, data relocation tree, uuid tree, and the
/// root tree's directory with its `default` entry, as mkfs.btrfs does.
fn populate(fs: &mut Store, o: &MkfsOptions, _fsid: [u8; 16]) -> Result<()> {
    let t = fs.transid();
    let ns = o.nodesize as u64;
    let fs_uuid = random_uuid();
    fs.create_tree(
        BTRFS_FS_TREE_OBJECTID,
        new_root_item(o.now, t, BTRFS_FIRST_FREE_OBJECTID, Some(fs_uuid)),
    )?;
    fs.create_tree(BTRFS_CSUM_TREE_OBJECTID, new_root_item(o.now, t, 0, None))?;
    fs.create_tree(BTRFS_UUID_TREE_OBJECTID, new_root_item(o.now, t, 0, None))?;
    fs.create_tree(
        BTRFS_DATA_RELOC_TREE_OBJECTID,
        new_root_item(o.now, t, BTRFS_FIRST_FREE_OBJECTID, Some(random_uuid())),
    )?;
    for tree in [BTRFS_FS_TREE_OBJECTID, BTRFS_DATA_RELOC_TREE_OBJECTID] {
        let ino = dir_inode(o.now, t, ns);
        fs.insert_item(
            tree,
            &Key::new(BTRFS_FIRST_FREE_OBJECTID, BTRFS_INODE_ITEM_KEY, 0),
            ino.as_bytes(),
        )?;
        let mut r = Vec::new();
        crate::format::inode::encode_inode_ref(&mut r, 0, b"..");
        fs.insert_item(
            tree,
            &Key::new(
                BTRFS_FIRST_FREE_OBJECTID,
                BTRFS_INODE_REF_KEY,
                BTRFS_FIRST_FREE_OBJECTID,
            ),
            &r,
        )?;
    }
    // The uuid tree maps the fs tree's uuid to its id.
    let (hi, lo) = (
        u64::from_le_bytes(fs_uuid[..8].try_into().unwrap_or([0; 8])),
        u64::from_le_bytes(fs_uuid[8..].try_into().unwrap_or([0; 8])),
    );
    fs.insert_item(
        BTRFS_UUID_TREE_OBJECTID,
        &Key::new(hi, BTRFS_UUID_KEY_SUBVOL, lo),
        &BTRFS_FS_TREE_OBJECTID.to_le_bytes(),
    )?;
    fs.update_superblock(|sb| sb.uuid_tree_generation.set(t));
    // Root tree directory: inode 6 with a `default` entry naming the fs tree.
    let ino = dir_inode(o.now, t, ns);
    fs.insert_item(
        BTRFS_ROOT_TREE_OBJECTID,
        &Key::new(BTRFS_ROOT_TREE_DIR_OBJECTID, BTRFS_INODE_ITEM_KEY, 0),
        ino.as_bytes(),
    )?;
    let mut r = Vec::new();
    crate::format::inode::encode_inode_ref(&mut r, 0, b"..");
    fs.insert_item(
        BTRFS_ROOT_TREE_OBJECTID,
        &Key::new(
            BTRFS_ROOT_TREE_DIR_OBJECTID,
            BTRFS_INODE_REF_KEY,
            BTRFS_ROOT_TREE_DIR_OBJECTID,
        ),
        &r,
    )?;
    let name = b"default";
    let mut d = Vec::new();
    crate::format::dir::encode_dir_entry(
        &mut d,
        &Key::new(BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
        t,
        BTRFS_FT_DIR,
        name,
        &[],
    );
    fs.insert_item(
        BTRFS_ROOT_TREE_OBJECTID,
        &Key::new(
            BTRFS_ROOT_TREE_DIR_OBJECTID,
            BTRFS_DIR_ITEM_KEY,
            crate::format::dir::name_hash(name),
        ),
        &d,
    )?;
    Ok(())
}

/// Zero every superblock copy: the image is then clearly not a filesystem.
pub fn wipe_superblocks(dev: &dyn BlockDevice) -> Result<()> {
    for m in 0..BTRFS_SUPER_MIRROR_MAX {
        let off = btrfs_sb_offset(m);
        if off + BTRFS_SUPER_INFO_SIZE as u64 <= dev.size() {
            dev.write_at(off, &[0u8; BTRFS_SUPER_INFO_SIZE])?;
        }
    }
    dev.flush()
}

/// `-O quota`: a qgroup for the top level and every subvolume, counted
/// from the trees as they stand (what `btrfs quota enable` and its rescan
/// leave), each step committed.
pub fn enable_quota(fs: &mut Store) -> Result<()> {
    let ids = crate::fs::subvol::subvol_ids(fs)?;
    fs.quotas().quota_enable(&ids)?;
    fs.commit()?;
    fs.quotas().quota_rescan()?;
    fs.commit()
}

/// `--shrink`: the device ends where its last dev extent does (device
/// item, the superblock's copy and total_bytes), committed; the caller
/// then truncates an image file to the size returned. As mkfs.btrfs, one
/// device only: a set's devices would each need their own end.
pub fn shrink(fs: &mut Store) -> Result<u64> {
    use crate::format::dev::{DevExtent, DevItem};
    use crate::format::key::Key;
    use zerocopy::FromBytes;
    if fs.image().devices().count() != 1 {
        return Err(Error::Invalid(
            "--shrink makes a filesystem on one device only".into(),
        ));
    }
    // Room for a read-write mount: the kernel reserves metadata space
    // (its global block reserve, about the size of the extent, checksum
    // and root trees, 5.5 MiB on a small filesystem) before any write and
    // cannot add a chunk to a device with no space left; the uuid tree
    // scan at the first mount writes too.
    let meta_used: u64 = fs
        .block_groups()
        .filter(|g| g.is_metadata())
        .map(|g| g.used)
        .sum();
    let meta_free: u64 = fs
        .block_groups()
        .filter(|g| g.is_metadata())
        .map(|g| g.length.saturating_sub(g.used))
        .sum();
    // The kernel's global reserve on a small filesystem is 368 nodes (the
    // extent, checksum, free space and block group trees' minimum and an
    // unlink's items with their delayed refs, each as 8 levels twice);
    // 512 leaves room beside it for the first transactions.
    let nodes = 512 * fs.nodesize() as u64;
    let want = (meta_used / 2)
        .max(nodes)
        .clamp(SHRINK_META_SLACK, 512 * MIB);
    if meta_free < want {
        let cap = fs.chunks().cap();
        fs.chunks()
            .set_cap(Some((want - meta_free).div_ceil(MIB) * MIB));
        let r = fs.chunks().alloc_chunk(BTRFS_BLOCK_GROUP_METADATA);
        fs.chunks().set_cap(cap);
        r?;
        fs.commit()?;
    }
    let devid = fs.sb().dev_item.devid.get();
    let mut end = 0u64;
    for (k, d) in fs.items_in(
        BTRFS_DEV_TREE_OBJECTID,
        Key::new(devid, BTRFS_DEV_EXTENT_KEY, 0),
        Key::new(devid, BTRFS_DEV_EXTENT_KEY, u64::MAX),
    )? {
        let de: &DevExtent = crate::format::view(&d, "dev extent").map_err(|e| e.at(0, k))?;
        end = end.max(k.offset.saturating_add(de.length.get()));
    }
    let ss = fs.sectorsize() as u64;
    if end == 0 || !end.is_multiple_of(ss) {
        return Err(Error::corrupt_as(
            CorruptKind::Device,
            format!("last dev extent of device {devid} ends at {end}, not a sector boundary"),
            0,
        ));
    }
    let key = Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid);
    let bytes = fs
        .lookup(BTRFS_CHUNK_TREE_OBJECTID, &key)?
        .ok_or_else(|| Error::corrupt_key_as(CorruptKind::Device, "device item missing", 0, key))?;
    let mut di = DevItem::read_from_bytes(&bytes)
        .map_err(|_| Error::corrupt_key_as(CorruptKind::Device, "dev item size", 0, key))?;
    di.total_bytes.set(end);
    fs.update_item(BTRFS_CHUNK_TREE_OBJECTID, &key, di.as_bytes())?;
    fs.update_superblock(|sb| {
        sb.dev_item.total_bytes.set(end);
        sb.total_bytes.set(end);
    });
    fs.commit()?;
    Ok(end)
}

/// Publish the superblocks: after this the devices are a valid filesystem.
pub fn finish(fs: Store, staged: &Staging) -> Result<()> {
    drop(fs);
    staged.publish()
}

/// A size as mkfs options take it (the one rule of `util::size`).
pub fn parse_size(s: &str) -> Result<u64> {
    crate::util::size::parse_size(s).map_err(|e| Error::Invalid(format!("size {e}")))
}

/// A node or sector size: a size that fits the superblock's 32-bit field.
fn parse_block_size(s: &str) -> Result<u32> {
    u32::try_from(parse_size(s)?)
        .map_err(|_| Error::Invalid(format!("block size '{s}' is out of range")))
}

impl MkfsOptions {
    /// Options from mkfs.btrfs-style arguments (a script's `mkfs`
    /// directive): -n/--nodesize, -s/--sectorsize, --csum, -L, -U,
    /// -O/--features, -R, -m/-d (profiles, checked against the devices by
    /// [`make_set`]), -b,
    /// and -f/-q/-K which change nothing here. Anything else is refused.
    pub fn from_mkfs_args<S: AsRef<str>>(args: &[S]) -> Result<MkfsOptions> {
        let mut o = MkfsOptions::default();
        let mut f = Features::default();
        let mut i = 0;
        let args: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
        while i < args.len() {
            let a = args[i];
            // `--opt=value` and `-nVALUE` forms too.
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) if a.starts_with("--") => (f, Some(v)),
                _ if a.len() > 2 && a.starts_with('-') && !a.starts_with("--") => {
                    (&a[..2], Some(&a[2..]))
                }
                _ => (a, None),
            };
            let mut value = || -> Result<&str> {
                if let Some(v) = inline {
                    return Ok(v);
                }
                i += 1;
                args.get(i)
                    .copied()
                    .ok_or_else(|| Error::Invalid(format!("mkfs option {flag} needs a value")))
            };
            match flag {
                "-n" | "--nodesize" => {
                    o.nodesize = parse_block_size(value()?)?;
                    o.nodesize_given = true;
                }
                "-s" | "--sectorsize" => o.sectorsize = parse_block_size(value()?)?,
                "--csum" | "--checksum" => o.csum = crate::csum::CsumType::parse(value()?)?,
                "-L" | "--label" => o.label = value()?.to_string(),
                "-U" | "--uuid" => o.fsid = Some(parse_uuid(value()?)?),
                "-O" | "--features" | "-R" | "--runtime-features" => f.apply(value()?)?,
                "-b" | "--byte-count" => o.size = Some(parse_size(value()?)?),
                "-m" | "--metadata" => o.metadata_profile = Some(parse_profile(value()?)?),
                "-d" | "--data" => o.data_profile = Some(parse_profile(value()?)?),
                "-f" | "--force" | "-q" | "--quiet" | "-K" | "--nodiscard" => {}
                "-M" | "--mixed" => f.mixed = true,
                _ => return Err(Error::Invalid(format!("unknown mkfs option {a}"))),
            }
            i += 1;
        }
        o.features = f;
        Ok(o)
    }
}

/// Create a filesystem on a new image file of `size` bytes (sparse).
pub fn make_image(path: &std::path::Path, size: u64, o: &MkfsOptions) -> Result<()> {
    make_images(&[path.to_path_buf()], size, o)
}

/// Create one filesystem on new image files of `size` bytes each
/// (sparse), devids in the order of `paths`.
pub fn make_images(paths: &[std::path::PathBuf], size: u64, o: &MkfsOptions) -> Result<()> {
    let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
    for path in paths {
        let f = std::fs::File::create(path)
            .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
        f.set_len(size)
            .map_err(|e| Error::io(format!("cannot size {}", path.display()), e))?;
        drop(f);
        devs.push((
            path.display().to_string(),
            Arc::new(crate::io::FileDevice::open(path, true)?),
        ));
    }
    let mut o = o.clone();
    o.size = Some(size);
    let (fs, staged, _) = make_set(devs, &o)?;
    finish(fs, &staged)
}

#[cfg(test)]
mod args_tests {
    use super::*;
    #[test]
    fn mkfs_arguments() {
        let o =
            MkfsOptions::from_mkfs_args(&["-n", "4096", "-O", "^no-holes", "--csum=sha256", "-f"])
                .unwrap();
        assert_eq!(o.nodesize, 4096);
        assert!(!o.features.no_holes);
        assert_eq!(o.csum, crate::csum::CsumType::Sha256);
        let o = MkfsOptions::from_mkfs_args(&["-n65536", "-m", "dup"]).unwrap();
        assert_eq!(o.nodesize, 65536);
        let o = MkfsOptions::from_mkfs_args(&["-d", "raid1", "-m", "raid1c3"]).unwrap();
        assert_eq!(o.data_profile, Some(BTRFS_BLOCK_GROUP_RAID1));
        assert_eq!(o.metadata_profile, Some(BTRFS_BLOCK_GROUP_RAID1C3));
        let o = MkfsOptions::from_mkfs_args(&["-d", "raid5", "-m", "raid6"]).unwrap();
        assert_eq!(o.data_profile, Some(BTRFS_BLOCK_GROUP_RAID5));
        assert_eq!(o.metadata_profile, Some(BTRFS_BLOCK_GROUP_RAID6));
        assert!(matches!(
            MkfsOptions::from_mkfs_args(&["-O", "raid-stripe-tree"]),
            Err(Error::Unsupported(_))
        ));
        assert!(MkfsOptions::from_mkfs_args(&["-d", "raid7"]).is_err());
        assert!(MkfsOptions::from_mkfs_args(&["--bogus"]).is_err());
        // 6.19: the block group tree is a default, dropped with a feature
        // it needs unless it was asked for.
        assert!(MkfsOptions::default().features.block_group_tree);
        for off in ["^no-holes", "^free-space-tree"] {
            let o = MkfsOptions::from_mkfs_args(&["-O", off]).unwrap();
            assert!(!o.features.block_group_tree, "{off}");
            assert!(MkfsOptions::from_mkfs_args(&["-O", off, "-O", "bgt"]).is_err());
            let named = format!("block-group-tree,{off}");
            assert!(MkfsOptions::from_mkfs_args(&["-O", &named]).is_err());
        }
        let o = MkfsOptions::from_mkfs_args(&["-O", "^bgt"]).unwrap();
        assert!(!o.features.block_group_tree && o.features.free_space_tree);
        assert!(MkfsOptions::from_mkfs_args(&["-n"]).is_err());
    }
}
