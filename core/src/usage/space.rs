//! `btrfs filesystem usage` and `df`: allocation per block group type and
//! profile and per device, the kernel's space info (`BTRFS_IOC_SPACE_INFO`),
//! its global block reserve and its statfs, computed from the chunk tree,
//! the device items, the block group items and the root items.
//!
//! The kernel values depend on state a mount builds: the global reserve is
//! sized from the root items at mount (and after each commit), the statfs
//! treats the metadata space as not full (no chunk allocation has failed
//! yet), and no block group is read-only (no balance or scrub running).
//! Those are the values of a fresh mount of the image.

use crate::chunk::{reduce_profile, stripe_length, RaidAttr};
use crate::format::consts::*;
use crate::format::dev::DevItem;
use crate::format::key::Key;
use crate::fs::Filesystem;
use crate::trans::TreeId;
use crate::Result;
use serde::Serialize;
use std::collections::BTreeMap;

/// One device of the filesystem.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceUsage {
    /// Device id.
    pub devid: u64,
    /// The path it was given by; None when missing.
    pub path: Option<String>,
    /// Size the filesystem uses of it (its device item's `total_bytes`).
    pub size: u64,
    /// Size of the file or block device itself (0 when missing).
    pub device_size: u64,
    /// Bytes its chunks take on it.
    pub allocated: u64,
    /// `size` less `allocated`.
    pub unallocated: i64,
    /// `device_size` less `size` when present (space the filesystem does
    /// not use).
    pub slack: u64,
    /// Not among the devices given.
    pub missing: bool,
}

/// Block groups of one type and profile, as one line of `btrfs
/// filesystem df` and one section of `usage`.
#[derive(Clone, Debug, Serialize)]
pub struct ProfileUsage {
    /// `Data`, `Metadata`, `System` or `Data+Metadata` (mixed).
    pub kind: String,
    /// `single`, `DUP`, `RAID1`, ...
    pub profile: String,
    /// The block group flags (type and profile bits).
    pub flags: u64,
    /// Logical size of the block groups.
    pub size: u64,
    /// Logical bytes used in them.
    pub used: u64,
    /// Bytes they take on each device: (devid, bytes), by devid.
    pub devices: Vec<(u64, u64)>,
}

/// The kernel's statfs of a mount (`df`), in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Statfs {
    /// f_bsize (the sector size).
    pub bsize: u64,
    /// f_blocks * f_bsize.
    pub total: u64,
    /// f_bfree * f_bsize.
    pub free: u64,
    /// f_bavail * f_bsize: the "Available" of df on a read-write mount.
    pub available: u64,
    /// An estimate of f_bavail * f_bsize on a read-only mount: the kernel
    /// holds block groups on read-only devices read-only and leaves their
    /// free space out; this leaves out all of the data block groups' free
    /// space, which equals the kernel's on a fresh image but not after
    /// some writes (not compared by the tests).
    pub available_read_only: u64,
}

/// Everything `btrfs filesystem usage -b` and `df -b` print.
#[derive(Clone, Debug, Serialize)]
pub struct SpaceReport {
    /// Sum of the device sizes.
    pub device_size: u64,
    /// Bytes the chunks take on the devices.
    pub device_allocated: u64,
    /// `device_size` less `device_allocated`.
    pub device_unallocated: i64,
    /// Sum of the sizes of the missing devices.
    pub device_missing: u64,
    /// Sum of the devices' slack.
    pub device_slack: u64,
    /// Raw bytes used (each copy counted).
    pub used: u64,
    /// Free space estimated as btrfs-progs does.
    pub free_estimated: u64,
    /// Its minimum (unallocated space filled with the most redundant
    /// profile in use).
    pub free_min: u64,
    /// Raw over logical size of the data block groups.
    pub data_ratio: f64,
    /// Raw over logical size of the metadata block groups.
    pub metadata_ratio: f64,
    /// Size of the kernel's global block reserve.
    pub global_reserve: u64,
    /// Used of it (0 on a fresh mount).
    pub global_reserve_used: u64,
    /// Types with more than one profile (`data`, `metadata`, `system`).
    pub multiple_profiles: Vec<String>,
    /// The statfs a mount reports.
    pub statfs: Statfs,
    /// Per type and profile, in the kernel's space info order (df's).
    pub profiles: Vec<ProfileUsage>,
    /// Per device, by devid.
    pub devices: Vec<DeviceUsage>,
}

/// The kernel's raid index order (`enum btrfs_raid_types`): the order of
/// profiles in its space info answers and statfs' factor choice.
fn raid_index(flags: u64) -> usize {
    let p = flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    [
        BTRFS_BLOCK_GROUP_RAID10,
        BTRFS_BLOCK_GROUP_RAID1,
        BTRFS_BLOCK_GROUP_DUP,
        BTRFS_BLOCK_GROUP_RAID0,
        0,
        BTRFS_BLOCK_GROUP_RAID5,
        BTRFS_BLOCK_GROUP_RAID6,
        BTRFS_BLOCK_GROUP_RAID1C3,
        BTRFS_BLOCK_GROUP_RAID1C4,
    ]
    .iter()
    .position(|&x| x == p)
    .unwrap_or(4)
}

/// Copies of each byte (the kernel's `btrfs_bg_type_to_factor`; RAID5/6 1).
fn factor(flags: u64) -> u64 {
    if flags & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0 {
        1
    } else {
        RaidAttr::of(flags).map_or(1, |a| a.ncopies.max(1))
    }
}

/// Profile name as btrfs prints it.
pub fn profile_name(flags: u64) -> &'static str {
    match flags & BTRFS_BLOCK_GROUP_PROFILE_MASK {
        BTRFS_BLOCK_GROUP_RAID0 => "RAID0",
        BTRFS_BLOCK_GROUP_RAID1 => "RAID1",
        BTRFS_BLOCK_GROUP_DUP => "DUP",
        BTRFS_BLOCK_GROUP_RAID10 => "RAID10",
        BTRFS_BLOCK_GROUP_RAID5 => "RAID5",
        BTRFS_BLOCK_GROUP_RAID6 => "RAID6",
        BTRFS_BLOCK_GROUP_RAID1C3 => "RAID1C3",
        BTRFS_BLOCK_GROUP_RAID1C4 => "RAID1C4",
        _ => "single",
    }
}

/// Type name as btrfs prints it.
pub fn kind_name(flags: u64) -> &'static str {
    let t = flags & BTRFS_BLOCK_GROUP_TYPE_MASK;
    if t == BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA {
        "Data+Metadata"
    } else if t & BTRFS_BLOCK_GROUP_DATA != 0 {
        "Data"
    } else if t & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
        "System"
    } else {
        "Metadata"
    }
}

/// The kernel's `btrfs_calc_insert_metadata_size`: room for `items` item
/// insertions, each possibly splitting a block on every level.
fn insert_metadata_size(nodesize: u64, items: u64) -> u64 {
    nodesize * BTRFS_MAX_LEVEL as u64 * 2 * items
}

/// Compute the report of the filesystem opened by [`super::open`];
/// `names` names the devices (devid -> path).
pub fn space_report(fs: &mut Filesystem, names: &BTreeMap<u64, String>) -> Result<SpaceReport> {
    let st = &mut fs.store;
    let sb = *st.sb();
    let nodesize = st.nodesize() as u64;
    let sectorsize = (st.sectorsize() as u64).max(1);
    // Device items: the filesystem's view of each device.
    let mut dev_items: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (k, d) in st.items_in(
        TreeId::Chunk,
        Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, 0),
        Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, u64::MAX),
    )? {
        let di: &DevItem = crate::format::view(&d, "device item").map_err(|e| e.at(0, k))?;
        dev_items.insert(k.offset, (di.total_bytes.get(), di.bytes_used.get()));
    }
    // Global block reserve (the kernel's btrfs_update_global_block_rsv):
    // the used bytes of the trees every transaction may change, at least
    // enough for an unlink and its delayed refs, at most 512 MiB.
    let compat_ro = sb.compat_ro_flags.get();
    let fst = compat_ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0;
    let mut trees = vec![BTRFS_EXTENT_TREE_OBJECTID, BTRFS_CSUM_TREE_OBJECTID];
    if fst {
        trees.push(BTRFS_FREE_SPACE_TREE_OBJECTID);
    }
    if compat_ro & BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        trees.push(BTRFS_BLOCK_GROUP_TREE_OBJECTID);
    }
    if sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE != 0 {
        trees.push(BTRFS_RAID_STRIPE_TREE_OBJECTID);
    }
    let mut rsv_bytes = 0u64;
    // The root tree's own item, then one per tree found.
    let mut min_items = 1u64;
    for id in trees {
        if st.tree_exists(id)? {
            if let Some((_, ri)) = &st.root_state(id)?.item {
                rsv_bytes = rsv_bytes.saturating_add(ri.bytes_used.get());
            }
            min_items += 1;
        }
    }
    const UNLINK_METADATA_UNITS: u64 = 6;
    min_items += UNLINK_METADATA_UNITS;
    let delayed_refs =
        insert_metadata_size(nodesize, UNLINK_METADATA_UNITS) * if fst { 2 } else { 1 };
    let global_reserve = rsv_bytes
        .max(insert_metadata_size(nodesize, min_items) + delayed_refs)
        .min(512 << 20);

    let img = st.image();
    // Per type and profile (the space infos), from the block groups.
    let mut spaces: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for bg in st.block_groups() {
        let f = bg.flags & (BTRFS_BLOCK_GROUP_TYPE_MASK | BTRFS_BLOCK_GROUP_PROFILE_MASK);
        let e = spaces.entry(f).or_default();
        e.0 += bg.length;
        e.1 += bg.used;
    }
    // Physical allocation per (flags, devid), and per device.
    let mut phys: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let mut allocated: BTreeMap<u64, u64> = BTreeMap::new();
    for c in img.chunks.iter() {
        let f = c.type_flags & (BTRFS_BLOCK_GROUP_TYPE_MASK | BTRFS_BLOCK_GROUP_PROFILE_MASK);
        let n = c.stripes.len() as u64;
        let per = stripe_length(c.type_flags, c.length, n);
        for &(devid, _) in &c.stripes {
            *phys.entry((f, devid)).or_default() += per;
            *allocated.entry(devid).or_default() += per;
        }
    }
    let mut devices = Vec::new();
    for (&devid, &(size, _)) in &dev_items {
        let path = names
            .get(&devid)
            .cloned()
            .or_else(|| img.device_path(devid).map(str::to_string));
        let present = img
            .device_of(devid)
            .or_else(|| (devid == img.devid).then(|| img.device()))
            .filter(|_| !img.missing.contains(&devid));
        let device_size = present.map_or(0, |d| d.size());
        let alloc = allocated.get(&devid).copied().unwrap_or(0);
        devices.push(DeviceUsage {
            devid,
            path: present.and(path),
            size,
            device_size,
            allocated: alloc,
            unallocated: size as i64 - alloc as i64,
            slack: if present.is_some() {
                device_size.saturating_sub(size)
            } else {
                0
            },
            missing: present.is_none(),
        });
    }

    // The space infos in the kernel's order: by type (DATA, SYSTEM,
    // METADATA, mixed), then by raid index.
    let type_order = [
        BTRFS_BLOCK_GROUP_DATA,
        BTRFS_BLOCK_GROUP_SYSTEM,
        BTRFS_BLOCK_GROUP_METADATA,
        BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA,
    ];
    let mut order: Vec<u64> = spaces.keys().copied().collect();
    order.sort_by_key(|f| {
        let t = f & BTRFS_BLOCK_GROUP_TYPE_MASK;
        (
            type_order.iter().position(|&x| x == t).unwrap_or(4),
            raid_index(*f),
        )
    });
    let profiles: Vec<ProfileUsage> = order
        .iter()
        .map(|&f| ProfileUsage {
            kind: kind_name(f).into(),
            profile: profile_name(f).into(),
            flags: f,
            size: spaces[&f].0,
            used: spaces[&f].1,
            devices: phys
                .iter()
                .filter(|((pf, _), _)| *pf == f)
                .map(|((_, d), &b)| (*d, b))
                .collect(),
        })
        .collect();

    // btrfs-progs' overall figures (cmds/filesystem-usage.c).
    let device_size: u64 = devices.iter().map(|d| d.size).sum();
    let device_missing: u64 = devices.iter().filter(|d| d.missing).map(|d| d.size).sum();
    let device_slack: u64 = devices.iter().map(|d| d.slack).sum();
    let mixed = spaces.keys().any(|f| {
        f & BTRFS_BLOCK_GROUP_TYPE_MASK == BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA
    });
    let is56 = |f: u64| f & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0;
    let mut max_ratio = 1.0f64;
    // r_* raw, l_* logical: (data, metadata, system) chunks and used.
    let (mut r_dc, mut r_du, mut r_mc, mut r_mu, mut r_sc, mut r_su) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut l_dc, mut l_mc) = (0u64, 0u64);
    // RAID5/6: raw size of each stripe, used in the proportion of the
    // profile's logical use.
    for (want, parity) in [
        (BTRFS_BLOCK_GROUP_RAID5, 1u64),
        (BTRFS_BLOCK_GROUP_RAID6, 2),
    ] {
        let ratio = |t: u64| -> f64 {
            let (c, u) = spaces
                .iter()
                .filter(|(f, _)| *f & want != 0 && *f & t != 0)
                .fold((0u64, 0u64), |a, (_, v)| (a.0 + v.0, a.1 + v.1));
            if c == 0 {
                0.0
            } else {
                u as f64 / c as f64
            }
        };
        let (dr, mr, sr) = (
            ratio(BTRFS_BLOCK_GROUP_DATA),
            ratio(BTRFS_BLOCK_GROUP_METADATA),
            ratio(BTRFS_BLOCK_GROUP_SYSTEM),
        );
        // One entry per (flags, device, stripe count), as btrfs-progs
        // groups its chunk infos.
        let mut groups: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
        for c in img.chunks.iter().filter(|c| c.type_flags & want != 0) {
            let f = c.type_flags & (BTRFS_BLOCK_GROUP_TYPE_MASK | BTRFS_BLOCK_GROUP_PROFILE_MASK);
            let n = c.stripes.len() as u64;
            for &(devid, _) in &c.stripes {
                let e = groups.entry((f, devid * 1024 + n)).or_insert((0, n));
                e.0 += c.length;
            }
        }
        for ((f, _), (len, n)) in groups {
            let data = n.saturating_sub(parity).max(1);
            let rt = n as f64 / data as f64;
            max_ratio = max_ratio.max(rt);
            let size = len / data;
            if f & BTRFS_BLOCK_GROUP_DATA != 0 {
                r_dc += size;
                r_du = (r_du as f64 + size as f64 * dr) as u64;
            } else if f & BTRFS_BLOCK_GROUP_METADATA != 0 {
                r_mc += size;
                r_mu = (r_mu as f64 + size as f64 * mr) as u64;
            } else if f & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
                r_sc += size;
                r_su = (r_su as f64 + size as f64 * sr) as u64;
            }
        }
    }
    for (&f, &(size, used)) in &spaces {
        let ratio = if is56(f) {
            0
        } else {
            RaidAttr::of(f).map_or(1, |a| a.ncopies)
        };
        max_ratio = max_ratio.max(ratio as f64);
        if f & BTRFS_BLOCK_GROUP_DATA != 0 {
            r_du += used * ratio;
            r_dc += size * ratio;
            l_dc += size;
        }
        if f & BTRFS_BLOCK_GROUP_METADATA != 0 {
            r_mu += used * ratio;
            r_mc += size * ratio;
            l_mc += size;
        }
        if f & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
            r_su += used * ratio;
            r_sc += size * ratio;
        }
    }
    let mut r_total_chunks = r_dc + r_sc;
    let mut r_total_used = r_du + r_su;
    if !mixed {
        r_total_chunks += r_mc;
        r_total_used += r_mu;
    }
    let r_total_unused = device_size as i64 - r_total_chunks as i64;
    let data_ratio = if l_dc == 0 {
        f64::NAN
    } else {
        r_dc as f64 / l_dc as f64
    };
    let metadata_ratio = if mixed {
        data_ratio
    } else if l_mc == 0 {
        f64::NAN
    } else {
        r_mc as f64 / l_mc as f64
    };
    let mut free_estimated = if l_dc == 0 {
        0
    } else {
        (r_dc.saturating_sub(r_du) as f64 / data_ratio) as u64
    };
    if mixed {
        free_estimated = free_estimated.saturating_sub(global_reserve);
    }
    let mut free_min = free_estimated;
    if r_total_unused >= 16 << 20 && l_dc != 0 {
        free_estimated = (free_estimated as f64 + r_total_unused as f64 / data_ratio) as u64;
        free_min = (free_min as f64 + r_total_unused as f64 / max_ratio) as u64;
    }
    let mut multiple_profiles = Vec::new();
    for (t, name) in [
        (BTRFS_BLOCK_GROUP_DATA, "data"),
        (BTRFS_BLOCK_GROUP_METADATA, "metadata"),
        (BTRFS_BLOCK_GROUP_SYSTEM, "system"),
    ] {
        let n = spaces
            .keys()
            .filter(|f| *f & BTRFS_BLOCK_GROUP_TYPE_MASK == t)
            .count();
        if n > 1 {
            multiple_profiles.push(name.to_string());
        }
    }

    let statfs = statfs(&sb, &spaces, &devices, global_reserve, sectorsize);
    Ok(SpaceReport {
        device_size,
        device_allocated: r_total_chunks,
        device_unallocated: r_total_unused,
        device_missing,
        device_slack,
        used: r_total_used,
        free_estimated,
        free_min,
        data_ratio,
        metadata_ratio,
        global_reserve,
        global_reserve_used: 0,
        multiple_profiles,
        statfs,
        profiles,
        devices,
    })
}

/// The kernel's btrfs_statfs: the size and use of the data profile's
/// logical space, the global reserve counted as used, and as available the
/// free space of the data block groups plus what new data chunks could
/// take of the unallocated space (btrfs_calc_avail_data_space).
fn statfs(
    sb: &crate::format::superblock::Superblock,
    spaces: &BTreeMap<u64, (u64, u64)>,
    devices: &[DeviceUsage],
    global_reserve: u64,
    bsize: u64,
) -> Statfs {
    let bits = bsize.trailing_zeros();
    let mut total_used = 0u64;
    let mut free_data = 0u64;
    let mut data_factor = 1u64;
    let mut best_index = None;
    let mut data_profiles = 0u64;
    for (&f, &(size, used)) in spaces {
        let k = factor(f);
        if f & BTRFS_BLOCK_GROUP_DATA != 0 {
            free_data += (size - used.min(size)) * k;
            // The last profile in raid index order gives the factor.
            let ri = raid_index(f);
            if best_index.is_none_or(|b| ri > b) {
                best_index = Some(ri);
                data_factor = k;
            }
            data_profiles |= f & BTRFS_BLOCK_GROUP_PROFILE_MASK;
        }
        total_used += used * k;
    }
    let blocks = (sb.total_bytes.get() / data_factor) >> bits;
    let mut bfree = blocks.saturating_sub((total_used / data_factor) >> bits);
    bfree = bfree.saturating_sub(global_reserve >> bits);
    // New data chunks in the profile the kernel would allocate them with.
    let present: Vec<&DeviceUsage> = devices.iter().filter(|d| !d.missing).collect();
    let profile = reduce_profile(data_profiles, present.len() as u64);
    let attr = RaidAttr::of(profile).unwrap_or(RaidAttr {
        devs_min: 1,
        devs_max: 1,
        devs_increment: 1,
        dev_stripes: 1,
        ncopies: 1,
        sub_stripes: 1,
        nparity: 0,
    });
    let mut num_stripes = if profile & BTRFS_BLOCK_GROUP_RAID0 != 0 {
        present.len() as u64
    } else if profile
        & (BTRFS_BLOCK_GROUP_RAID1 | BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4)
        != 0
    {
        attr.ncopies
    } else if profile & BTRFS_BLOCK_GROUP_RAID10 != 0 {
        4
    } else {
        1
    };
    let min_stripe = attr.dev_stripes * BTRFS_STRIPE_LEN;
    let mut avail: Vec<u64> = present
        .iter()
        .filter_map(|d| {
            let used = d.allocated;
            let a = d.size.saturating_sub(used) / BTRFS_STRIPE_LEN * BTRFS_STRIPE_LEN;
            (a > (1 << 20) + min_stripe).then(|| a - (1 << 20))
        })
        .collect();
    avail.sort_unstable_by(|a, b| b.cmp(a));
    let mut n = avail.len();
    let mut space = 0u64;
    while n as u64 >= attr.devs_min && n > 0 {
        num_stripes = num_stripes.min(n as u64);
        let i = n - 1;
        if avail[i] >= min_stripe {
            let take = avail[i];
            space += take * num_stripes;
            let first = (i + 1).saturating_sub(num_stripes as usize);
            for a in &mut avail[first..=i] {
                *a -= take;
            }
        }
        n -= 1;
    }
    let bavail = ((free_data / data_factor) + space / data_factor) >> bits;
    let bavail_ro = (space / data_factor) >> bits;
    Statfs {
        bsize,
        total: blocks << bits,
        free: bfree << bits,
        available: bavail << bits,
        available_read_only: bavail_ro << bits,
    }
}
