//! Phase 6, the UUID tree: every live subvolume's UUID (and received UUID)
//! maps to its id, which is how `btrfs receive` and `btrfs subvolume show`
//! find a subvolume, and no entry names a subvolume that is gone or has
//! another UUID. The kernel rebuilds the tree at mount only when the
//! superblock says its last scan is older than the filesystem
//! (`uuid_tree_generation`); otherwise a missing entry stays missing.

use super::findings::{Category, Phase, Repair, F};
use super::Ctx;
use crate::format::consts::*;
use crate::tree::Node;
use std::collections::HashSet;

const P: Phase = Phase::Subvolumes;

/// What the UUID tree's leaves hold.
#[derive(Default)]
pub(crate) struct Facts {
    /// The tree has a root item.
    pub present: bool,
    /// (key type, uuid, subvolume id) of each entry.
    pub entries: Vec<(u8, [u8; 16], u64)>,
}

pub(super) fn on_leaf(cx: &mut Ctx, node: &Node) {
    for slot in 0..node.nr_safe() {
        let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
            continue;
        };
        if k.ty != BTRFS_UUID_KEY_SUBVOL && k.ty != BTRFS_UUID_KEY_RECEIVED_SUBVOL {
            continue;
        }
        let mut u = [0u8; 16];
        u[..8].copy_from_slice(&k.objectid.to_le_bytes());
        u[8..].copy_from_slice(&k.offset.to_le_bytes());
        // A malformed item is the tree block check's finding.
        for c in d.chunks_exact(8) {
            let id = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            cx.uuid.entries.push((k.ty, u, id));
        }
    }
}

fn uuid_string(u: &[u8; 16]) -> String {
    crate::util::uuid::uuid_str(u)
}

pub(super) fn check(cx: &mut Ctx) {
    if !cx.uuid.present {
        return;
    }
    let entries = std::mem::take(&mut cx.uuid.entries);
    let have: HashSet<(u8, [u8; 16], u64)> = entries.iter().copied().collect();
    let mut want: HashSet<(u8, [u8; 16], u64)> = HashSet::new();
    for r in &cx.roots {
        let id = r.id();
        // The subvolumes the kernel's scan covers: the top one and every
        // subvolume id (not the data relocation tree).
        let subvol = id == BTRFS_FS_TREE_OBJECTID
            || (BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&id);
        if !subvol || !r.item.has_v2() || r.item.refs.get() == 0 {
            continue;
        }
        for (u, ty) in [
            (r.item.uuid, BTRFS_UUID_KEY_SUBVOL),
            (r.item.received_uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL),
        ] {
            if u != [0; 16] {
                want.insert((ty, u, id));
            }
        }
    }
    // The kernel rescans at the next mount when its last scan is older
    // than the filesystem: then a missing entry is only a warning.
    let rescan_due = cx.img.sb.uuid_tree_generation.get() != cx.img.sb.generation.get();
    let kind = |ty: u8| {
        if ty == BTRFS_UUID_KEY_SUBVOL {
            "UUID"
        } else {
            "received UUID"
        }
    };
    let mut missing: Vec<_> = want.difference(&have).copied().collect();
    missing.sort_unstable_by_key(|e| (e.2, e.0));
    let mut found = Vec::new();
    for (ty, u, id) in missing {
        let f = if rescan_due {
            F::warn(P, Category::UuidTree)
        } else {
            F::err(P, Category::UuidTree)
        };
        found.push(
            f.tree(BTRFS_UUID_TREE_OBJECTID)
                .fix(Repair::RebuildUuidTree)
                .msg(format!(
                    "subvolume {id}'s {} {} has no entry in the UUID tree",
                    kind(ty),
                    uuid_string(&u)
                )),
        );
    }
    let mut stale: Vec<_> = have.difference(&want).copied().collect();
    stale.sort_unstable_by_key(|e| (e.2, e.0));
    for (ty, u, id) in stale {
        // What the kernel's check of the tree at mount removes.
        found.push(
            F::warn(P, Category::UuidTree)
                .tree(BTRFS_UUID_TREE_OBJECTID)
                .fix(Repair::RebuildUuidTree)
                .msg(format!(
                    "UUID tree entry {} {} names subvolume {id}, which is not a live subvolume with that {}",
                    kind(ty),
                    uuid_string(&u),
                    kind(ty)
                )),
        );
    }
    for f in found {
        cx.report(f);
    }
}
