//! The files a bad data sector belongs to, for the report: the data
//! extent holding it (extent tree), its data back references, and each
//! inode's path by its INODE_REF names. Best effort, each walk bounded:
//! what cannot be named (a shared reference, an extref-only name) is left
//! out, never an error.

use crate::format::consts::*;
use crate::format::extent::{parse_extent_item, ExtentDataRef, InlineRef};
use crate::format::key::Key;
use crate::trans::{Store, TreeId};
use crate::Result;
use zerocopy::FromBytes;

/// Items stepped back over to find the extent item holding an address.
const BACK_STEPS: usize = 64;
/// References named per sector.
const REFS_NAMED: usize = 4;
/// Directory levels followed up to a subvolume's root.
const DEPTH: usize = 256;

/// Who references the data at `logical`: `subvolume 5: a/b` for each
/// reference, comma separated; empty when nothing can be said.
pub(super) fn files_at(st: &mut Store, logical: u64) -> Result<String> {
    let tree = TreeId::Tree(BTRFS_EXTENT_TREE_OBJECTID);
    let mut hi = Key::new(logical, BTRFS_EXTENT_ITEM_KEY, u64::MAX);
    let lo = Key::new(0, 0, 0);
    let mut found = None;
    for _ in 0..BACK_STEPS {
        let Some((k, d)) = st.prev_item(tree, &hi, &lo)? else {
            break;
        };
        if k.ty == BTRFS_EXTENT_ITEM_KEY {
            if k.objectid <= logical && logical - k.objectid < k.offset {
                found = Some((k, d));
            }
            break;
        }
        if k.offset > 0 {
            hi = Key::new(k.objectid, k.ty, k.offset - 1);
        } else if k.ty > 0 {
            hi = Key::new(k.objectid, k.ty - 1, u64::MAX);
        } else if k.objectid > 0 {
            hi = Key::new(k.objectid - 1, u8::MAX, u64::MAX);
        } else {
            break;
        }
    }
    let Some((k, d)) = found else {
        return Ok(String::new());
    };
    let mut refs: Vec<(u64, u64)> = Vec::new();
    if let Ok(v) = parse_extent_item(&k, &d) {
        for r in v.refs {
            if let InlineRef::ExtentData { root, objectid, .. } = r {
                refs.push((root, objectid));
            }
        }
    }
    let keyed = st.items_in(
        tree,
        Key::new(k.objectid, BTRFS_EXTENT_DATA_REF_KEY, 0),
        Key::new(k.objectid, BTRFS_EXTENT_DATA_REF_KEY, u64::MAX),
    )?;
    for (_, d) in keyed.iter().take(REFS_NAMED) {
        if let Ok((r, _)) = ExtentDataRef::read_from_prefix(d) {
            refs.push((r.root.get(), r.objectid.get()));
        }
    }
    refs.dedup();
    let named: Vec<String> = refs
        .iter()
        .take(REFS_NAMED)
        .map(|&(root, ino)| match path_of(st, root, ino) {
            Some(p) => format!("subvolume {root}: {p}"),
            None => format!("subvolume {root} inode {ino}"),
        })
        .collect();
    Ok(named.join(", "))
}

/// The path of inode `ino` from the root of subvolume `root`, by the first
/// INODE_REF name at each level.
fn path_of(st: &mut Store, root: u64, ino: u64) -> Option<String> {
    let tree = TreeId::of(root);
    let mut parts: Vec<String> = Vec::new();
    let mut at = ino;
    for _ in 0..DEPTH {
        if at == BTRFS_FIRST_FREE_OBJECTID {
            parts.reverse();
            return Some(parts.join("/"));
        }
        let (k, d) = st
            .next_item(tree, &Key::new(at, BTRFS_INODE_REF_KEY, 0))
            .ok()??;
        if k.objectid != at || k.ty != BTRFS_INODE_REF_KEY || k.offset == at {
            return None;
        }
        // struct btrfs_inode_ref: index (8), name_len (2), name.
        let len = u16::from_le_bytes([*d.get(8)?, *d.get(9)?]) as usize;
        let name = d.get(10..10 + len)?;
        parts.push(String::from_utf8_lossy(name).into_owned());
        at = k.offset;
    }
    None
}
