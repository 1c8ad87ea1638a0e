//! Phase 1: every superblock copy on its own, then the primary's counters
//! against what the trees hold.

use super::findings::{Category, Phase, Repair, F};
use super::Ctx;
use crate::format::consts::*;

const P: Phase = Phase::Superblocks;

/// The superblock flags of an unfinished checksum conversion.
pub(super) const CSUM_CHANGE_FLAGS: u64 =
    BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM | BTRFS_SUPER_FLAG_CHANGING_META_CSUM;

pub(super) fn check_mirrors(cx: &mut Ctx) {
    let img = cx.img;
    let devs: Vec<_> = img.devices().map(|(id, d)| (id, d.clone())).collect();
    for (devid, dev) in devs {
        // On a filesystem of several devices, each device's copies are
        // named with the device.
        let of = if img.multi_device() {
            format!(" of {}", img.device_name(devid))
        } else {
            String::new()
        };
        superblock_copies(cx, &*dev, &of);
        if !of.is_empty() {
            own_dev_item(cx, devid, &*dev, &of);
        }
    }
    let img = cx.img;
    let sb = &img.sb;
    general(cx, img, sb);
}

/// Every superblock copy of one device against the one in use.
fn superblock_copies(cx: &mut Ctx, dev: &dyn crate::io::BlockDevice, of: &str) {
    let sb = &cx.img.sb;
    let size = dev.size();
    for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
        let off = btrfs_sb_offset(mirror);
        if off + BTRFS_SUPER_INFO_SIZE as u64 > size {
            continue;
        }
        cx.sink.checked(P, 1);
        let (m, status) = match crate::image::read_superblock_raw(dev, mirror) {
            Ok(x) => x,
            Err(e) => {
                cx.report(
                    F::err(P, Category::Superblock)
                        .at(off)
                        .fix(Repair::RewriteSuperblocks)
                        .msg(format!("superblock mirror {mirror}{of} unreadable: {e}")),
                );
                continue;
            }
        };
        if !status.magic_ok {
            // A filesystem grown past a mirror's offset after mkfs may lack it.
            if mirror == 0 {
                cx.report(
                    F::err(P, Category::Superblock)
                        .at(off)
                        .fix(Repair::RewriteSuperblocks)
                        .msg(format!("primary superblock{of} has no btrfs magic")),
                );
            } else {
                cx.report(
                    F::warn(P, Category::Superblock)
                        .at(off)
                        .msg(format!("superblock mirror {mirror}{of} has no btrfs magic")),
                );
            }
            continue;
        }
        if status.csum_ok != Some(true) {
            cx.report(
                F::err(P, Category::Superblock)
                    .at(off)
                    .fix(Repair::RewriteSuperblocks)
                    .msg(format!("superblock mirror {mirror}{of} checksum mismatch")),
            );
            continue;
        }
        if !status.bytenr_ok {
            cx.report(
                F::err(P, Category::Superblock)
                    .at(off)
                    .fix(Repair::RewriteSuperblocks)
                    .msg(format!(
                        "superblock mirror {mirror}{of} says it lives at {}",
                        m.bytenr.get()
                    )),
            );
        }
        if m.fsid != sb.fsid {
            cx.report(F::err(P, Category::Superblock).at(off).msg(format!(
                "superblock mirror {mirror}{of} has a different fsid"
            )));
        }
        if m.generation.get() != sb.generation.get() {
            cx.report(F::warn(P, Category::Superblock).at(off).msg(format!(
                "superblock mirror {mirror}{of} generation {} differs from the one in use ({})",
                m.generation.get(),
                sb.generation.get()
            )));
        }
    }
}

/// A device's own device item (in its primary superblock) against the
/// chunk tree's, and its size against its total_bytes: each device of a
/// set carries its own.
fn own_dev_item(cx: &mut Ctx, devid: u64, dev: &dyn crate::io::BlockDevice, of: &str) {
    let Ok(m) = crate::image::read_superblock(dev, 0) else {
        return; // reported with the copies
    };
    let at = BTRFS_SUPER_INFO_OFFSET;
    if m.dev_item.devid.get() != devid {
        cx.report(F::err(P, Category::Superblock).at(at).msg(format!(
            "the superblock{of} names device {}",
            m.dev_item.devid.get()
        )));
    }
    if m.num_devices.get() != cx.img.sb.num_devices.get()
        || m.total_bytes.get() != cx.img.sb.total_bytes.get()
    {
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .fix(Repair::DeviceSizes)
                .msg(format!(
            "the superblock{of} says num_devices {} total_bytes {}, the one in use {} and {}",
            m.num_devices.get(),
            m.total_bytes.get(),
            cx.img.sb.num_devices.get(),
            cx.img.sb.total_bytes.get()
        )),
        );
    }
    // An interrupted metadata UUID change can leave the flag on some
    // devices only (the flags of the superblock in use are checked with
    // the others): the kernel refuses every device that carries it.
    let changing = BTRFS_SUPER_FLAG_CHANGING_FSID_V2;
    if m.flags.get() & changing != 0 && cx.img.sb.flags.get() & changing == 0 {
        cx.report(F::err(P, Category::Superblock).at(at).msg(format!(
            "the superblock{of} records an interrupted metadata_uuid change: the kernel will not mount this until btrfstune finishes it"
        )));
    }
    cx.chunks.sb_dev_items.push((
        devid,
        m.dev_item.total_bytes.get(),
        m.dev_item.bytes_used.get(),
        m.dev_item.uuid,
    ));
}

fn general(cx: &mut Ctx, img: &crate::image::Image, sb: &crate::format::superblock::Superblock) {
    let ss = sb.sectorsize.get() as u64;
    let off = img.mirror;
    let at = btrfs_sb_offset(off);
    if sb.leafsize.get() != sb.nodesize.get() {
        cx.report(F::err(P, Category::Superblock).at(at).msg(format!(
            "leafsize {} differs from nodesize {}",
            sb.leafsize.get(),
            sb.nodesize.get()
        )));
    }
    if !sb.total_bytes.get().is_multiple_of(ss) {
        cx.report(F::warn(P, Category::Superblock).at(at).msg(format!(
            "total_bytes {} is not aligned to sectorsize {ss}",
            sb.total_bytes.get()
        )));
    }
    if !sb.dev_item.total_bytes.get().is_multiple_of(ss) {
        cx.report(F::warn(P, Category::Superblock).at(at).msg(format!(
            "device total_bytes {} is not aligned to sectorsize {ss}",
            sb.dev_item.total_bytes.get()
        )));
    }
    if sb.root_dir_objectid.get() != BTRFS_ROOT_TREE_DIR_OBJECTID {
        cx.report(F::warn(P, Category::Superblock).at(at).msg(format!(
            "root_dir_objectid is {}",
            sb.root_dir_objectid.get()
        )));
    }
    // The members btrfs check validates before it opens a filesystem.
    let ns = sb.nodesize.get();
    let stripesize = sb.stripesize.get();
    if stripesize != 4096 && stripesize != sb.sectorsize.get() {
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .msg(format!("invalid stripesize {stripesize}")),
        );
    }
    if sb.total_bytes.get() == 0 {
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .msg("total_bytes is 0"),
        );
    }
    if sb.bytes_used.get() < 6 * ns as u64 {
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .fix(Repair::BlockGroupUsage)
                .msg(format!(
                    "bytes_used {} is less than six tree blocks",
                    sb.bytes_used.get()
                )),
        );
    }
    let meta_uuid = if sb.has_incompat(BTRFS_FEATURE_INCOMPAT_METADATA_UUID) {
        sb.metadata_uuid
    } else {
        sb.fsid
    };
    if sb.dev_item.fsid != meta_uuid {
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .msg("the device item's fsid differs from the filesystem's"),
        );
    }
    if sb.num_devices.get() > 1 << 31 {
        cx.report(F::warn(P, Category::Superblock).at(at).msg(format!(
            "suspicious number of devices {}",
            sb.num_devices.get()
        )));
    }
    let min_sys =
        std::mem::size_of::<crate::format::key::DiskKey>() + crate::format::chunk::CHUNK_ITEM_SIZE;
    if (sb.sys_chunk_array_size.get() as usize) < min_sys {
        cx.report(F::err(P, Category::Superblock).at(at).msg(format!(
            "sys_chunk_array_size {} cannot hold a chunk",
            sb.sys_chunk_array_size.get()
        )));
    }
    let ro = sb.compat_ro_flags.get();
    if ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID != 0
        && ro & BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE == 0
    {
        cx.report(
            F::err(P, Category::Features)
                .at(at)
                .msg("free_space_tree_valid is set without free_space_tree"),
        );
    }
    // btrfstune sets these while it rewrites the filesystem and clears them
    // when done: the kernel refuses to mount until it is resumed.
    for (flag, what, finish) in [
        (
            BTRFS_SUPER_FLAG_CHANGING_FSID,
            "fsid change",
            "-u (or -U with the new fsid)",
        ),
        (
            BTRFS_SUPER_FLAG_CHANGING_FSID_V2,
            "metadata_uuid change",
            "-M with the new fsid",
        ),
        (
            BTRFS_SUPER_FLAG_CHANGING_BG_TREE,
            "block group tree conversion",
            "--convert-to-block-group-tree (or --convert-from-, the same direction)",
        ),
        (
            BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM,
            "data checksum conversion",
            "--csum with the same algorithm",
        ),
        (
            BTRFS_SUPER_FLAG_CHANGING_META_CSUM,
            "metadata checksum conversion",
            "--csum with the same algorithm",
        ),
    ] {
        if sb.flags.get() & flag != 0 {
            let msg = if flag & CSUM_CHANGE_FLAGS != 0 {
                let to = img.unfinished_csum_target().map_or("ALGO", |c| c.name());
                format!(
                    "an interrupted {what} to {to}: the kernel will not mount this until it is finished: rerun `btrkit-tune --csum {to}` (`btrfstune --csum {to}` if btrfstune started it); until then the csum tree and data checksums are not checked"
                )
            } else {
                format!(
                    "an interrupted {what}: the kernel will not mount this until it is finished: run btrkit-tune {finish} again"
                )
            };
            cx.report(F::err(P, Category::Superblock).at(at).msg(msg));
        }
    }
    if sb.flags.get() & BTRFS_SUPER_FLAG_ERROR != 0 {
        cx.report(
            F::warn(P, Category::Superblock)
                .at(at)
                .msg("the filesystem was marked as having an error"),
        );
    }
    if sb.flags.get() & (BTRFS_SUPER_FLAG_METADUMP | BTRFS_SUPER_FLAG_METADUMP_V2) != 0 {
        cx.report(
            F::warn(P, Category::Superblock)
                .at(at)
                .msg("metadump image: data blocks are not present"),
        );
    }
    let gen = sb.generation.get();
    for (i, b) in sb.super_roots.iter().enumerate() {
        if b.tree_root.get() == 0 {
            continue;
        }
        if b.tree_root_gen.get() > gen {
            cx.report(F::warn(P, Category::BackupRoot).at(at).msg(format!(
                "backup root {i} generation {} newer than the superblock's {gen}",
                b.tree_root_gen.get()
            )));
        } else if b.tree_root_gen.get() == gen && b.tree_root.get() != sb.root.get() {
            cx.report(F::warn(P, Category::BackupRoot).at(at).msg(format!(
                "backup root {i} of the current generation points at tree root {} not {}",
                b.tree_root.get(),
                sb.root.get()
            )));
        }
    }
}

/// bytes_used, num_devices and total_bytes against the chunk and extent trees.
pub(super) fn check_against_trees(cx: &mut Ctx) {
    let sb = &cx.img.sb;
    let at = btrfs_sb_offset(cx.img.mirror);
    let ndev = cx.chunks.dev_items.len() as u64;
    if ndev > 0 && sb.num_devices.get() != ndev {
        let m = format!(
            "superblock num_devices {} but the chunk tree holds {ndev} device item(s)",
            sb.num_devices.get()
        );
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .fix(Repair::DeviceSizes)
                .msg(m),
        );
    }
    let dev_total: u64 = cx
        .chunks
        .dev_items
        .iter()
        .map(|d| d.total_bytes)
        .fold(0u64, |a, b| a.saturating_add(b));
    if ndev > 0 && sb.total_bytes.get() < dev_total {
        let m = format!(
            "superblock total_bytes {} smaller than the devices' total {dev_total}",
            sb.total_bytes.get()
        );
        cx.report(
            F::err(P, Category::Superblock)
                .at(at)
                .fix(Repair::DeviceSizes)
                .msg(m),
        );
    }
    // Each device's superblock carries its own device item (the one in
    // use when there is one device).
    let mut own = std::mem::take(&mut cx.chunks.sb_dev_items);
    if own.is_empty() {
        own.push((
            sb.dev_item.devid.get(),
            sb.dev_item.total_bytes.get(),
            sb.dev_item.bytes_used.get(),
            sb.dev_item.uuid,
        ));
    }
    let multi = cx.img.multi_device();
    for (devid, total, used, uuid) in own {
        let Some(d) = cx
            .chunks
            .dev_items
            .iter()
            .find(|d| d.devid == devid)
            .copied()
        else {
            if multi {
                let m = format!(
                    "{} has no device item in the chunk tree",
                    cx.img.device_name(devid)
                );
                cx.report(F::err(P, Category::Superblock).at(at).msg(m));
            }
            continue;
        };
        let of = if multi {
            format!(" of {}", cx.img.device_name(devid))
        } else {
            String::new()
        };
        if d.total_bytes != total || d.bytes_used != used {
            let m = format!(
                "superblock device item{of} (total {total} used {used}) differs from the chunk tree's (total {} used {})",
                d.total_bytes, d.bytes_used
            );
            cx.report(F::warn(P, Category::Superblock).at(at).msg(m));
        }
        if multi && d.uuid != uuid {
            let m =
                format!("superblock device item{of} has another device uuid than the chunk tree's");
            cx.report(F::err(P, Category::Superblock).at(at).msg(m));
        }
    }
    if cx.chunks.bg_loaded {
        let used: u64 = cx
            .chunks
            .block_groups
            .iter()
            .map(|b| b.used)
            .fold(0u64, |a, b| a.saturating_add(b));
        if used != sb.bytes_used.get() {
            let m = format!(
                "superblock bytes_used {} but the block groups use {used}",
                sb.bytes_used.get()
            );
            cx.report(
                F::err(P, Category::Superblock)
                    .at(at)
                    .fix(Repair::BlockGroupUsage)
                    .msg(m),
            );
        }
    }
    cx.sink.checked(P, 1);
}
