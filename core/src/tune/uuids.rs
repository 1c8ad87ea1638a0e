//! The metadata UUID (`-m`, `-M`) and new subvolume UUIDs.
//!
//! **Metadata UUID.** The fsid a filesystem is known by (the kernel's
//! device scan, `blkid`) lives in the superblocks; every tree block
//! carries the fsid it was made with. `-m` changes the superblocks' fsid
//! only and keeps the old one as `metadata_uuid`, under the incompat
//! flag METADATA_UUID, so the tree blocks stay valid; `-M` with the
//! metadata UUID itself turns the flag off again. Whatever the state
//! before, the result depends only on the UUID asked for and on the fsid
//! of the tree blocks (which no step here changes): fsid = the UUID,
//! metadata_uuid = the tree fsid (or zero, flag off, when they are
//! equal), as btrfstune's `set_metadata_uuid` leaves it. The device
//! items keep the tree fsid, which the kernel requires of them.
//!
//! Crash safety. On one device, each superblock copy is one write of the
//! final state (mirrors first, flushed, then the primary): the primary is
//! the old one or the new one, and the kernel reads the primary. On a set
//! the devices would be matched by fsid and could be found disagreeing,
//! so, as btrfstune does, the superblocks first carry the flag
//! CHANGING_FSID_V2 (all of them, flushed), then the new fsid (all,
//! flushed), then lose the flag. A set with the flag on a primary is not
//! mounted by the kernel (6.7 and later refuse it) and `btrkit-tune`
//! refuses everything but `-m`/`-M` on it; since the result does not
//! depend on the state found, a rerun with any UUID (the same one, to
//! get what the first run meant) finishes it.
//!
//! **Subvolume UUIDs.** A clone of an image has the same subvolume UUIDs
//! as its original, which `btrfs send`/`receive` and `btrfs subvolume
//! list -u -q` use to find subvolumes. Every live subvolume (the top one
//! and every id from 256) gets a random UUID in one transaction; a
//! parent or received UUID naming one of this filesystem's own old UUIDs
//! follows it, and the UUID tree is rebuilt from the new root items.

use super::guard::{primaries, Unfinished};
use super::superblock::{copies, rewrite, skipped_note, Copy};
use super::{Ctx, NewUuid, Outcome, Step};
use crate::devices::{Devices, Single};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::format::superblock::Superblock;
use crate::image::OpenOptions;
use crate::trans::{Store, TreeId};
use crate::util::uuid::{random_uuid, uuid_str};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use zerocopy::IntoBytes;

/// Superblock `sb` with fsid `z`: the tree fsid kept as metadata UUID
/// (or, when `z` is the tree fsid, the feature off and the field zero),
/// CHANGING_FSID_V2 set when `changing`.
fn with_fsid(sb: &Superblock, z: [u8; 16], changing: bool) -> Superblock {
    let mut n = *sb;
    let tree = sb.tree_fsid();
    let inc = n.incompat_flags.get();
    if z == tree {
        n.fsid = tree;
        n.metadata_uuid = [0; 16];
        n.incompat_flags
            .set(inc & !BTRFS_FEATURE_INCOMPAT_METADATA_UUID);
    } else {
        n.fsid = z;
        n.metadata_uuid = tree;
        n.incompat_flags
            .set(inc | BTRFS_FEATURE_INCOMPAT_METADATA_UUID);
    }
    with_flag(&n, changing)
}

/// Superblock `sb` with CHANGING_FSID_V2 set or cleared.
fn with_flag(sb: &Superblock, changing: bool) -> Superblock {
    let mut n = *sb;
    let f = n.flags.get();
    n.flags.set(if changing {
        f | BTRFS_SUPER_FLAG_CHANGING_FSID_V2
    } else {
        f & !BTRFS_SUPER_FLAG_CHANGING_FSID_V2
    });
    n
}

fn changing(sb: &Superblock) -> bool {
    sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID_V2 != 0
}

/// The primaries of `copies` form one whole filesystem whose fsid may be
/// changed: what [`super::guard::complete_set`] checks, again here
/// because a set found mid-change is not matched by fsid.
fn one_whole_filesystem(ctx: &Ctx, copies: &[Copy]) -> Result<()> {
    let prim: Vec<&Copy> = copies.iter().filter(|c| c.mirror == 0).collect();
    let Some(first) = prim.first() else {
        return Err(Error::Invalid("no device given".into()));
    };
    let name = |c: &Copy| ctx.devs[c.dev].0.clone();
    let tree = first.sb.tree_fsid();
    let resuming = prim.iter().any(|c| changing(&c.sb));
    let mut devids = BTreeMap::new();
    for c in &prim {
        if c.sb.tree_fsid() != tree || (!resuming && c.sb.fsid != first.sb.fsid) {
            return Err(Error::Invalid(format!(
                "{} and {} are not one filesystem (fsid {} and {})",
                name(first),
                name(c),
                uuid_str(&first.sb.fsid),
                uuid_str(&c.sb.fsid)
            )));
        }
        if c.sb.flags.get() & BTRFS_SUPER_FLAG_SEEDING != 0 {
            return Err(Error::Unsupported(format!(
                "{} is a seed device: a metadata UUID cannot be set on a seed (as in btrfstune); clear the seeding flag first (-S 0 -f)",
                name(c)
            )));
        }
        // A sprout's devices name the filesystem they were added to.
        if c.sb.dev_item.fsid != tree {
            return Err(Error::Unsupported(format!(
                "{}: its device item names filesystem {}, its blocks {}: a sprouted filesystem, not supported",
                name(c),
                uuid_str(&c.sb.dev_item.fsid),
                uuid_str(&tree)
            )));
        }
        if let Some(other) = devids.insert(c.sb.dev_item.devid.get(), name(c)) {
            return Err(Error::Invalid(format!(
                "{other} and {} are both device {}",
                name(c),
                c.sb.dev_item.devid.get()
            )));
        }
        if c.sb.num_devices.get() != prim.len() as u64 {
            return Err(Error::MissingDevice {
                devids: Vec::new(),
                what: format!(
                    "the filesystem has {} devices and {} were given: a new fsid goes on every device, give them all",
                    c.sb.num_devices.get(),
                    prim.len()
                ),
            });
        }
    }
    Ok(())
}

/// `-m` / `-M UUID`.
pub fn metadata_uuid(ctx: &mut Ctx, u: NewUuid) -> Result<Step> {
    let (found, skipped) = copies(ctx)?;
    one_whole_filesystem(ctx, &found)?;
    let first = found[0].sb;
    let tree = first.tree_fsid();
    let resuming = found.iter().any(|c| c.mirror == 0 && changing(&c.sb));
    let z = match u {
        NewUuid::Given(z) => z,
        // A random UUID that happened to be the tree fsid would turn the
        // feature off instead: draw again (bounded, /dev/urandom cannot
        // repeat itself that often).
        NewUuid::Random => (0..8)
            .map(|_| random_uuid())
            .find(|z| *z != tree && *z != [0; 16])
            .ok_or_else(|| Error::Internal("no random UUID".into()))?,
    };
    if z == [0; 16] {
        return Err(Error::Invalid("the fsid cannot be the null UUID".into()));
    }
    if found
        .iter()
        .all(|c| with_fsid(&c.sb, z, false).as_bytes() == c.sb.as_bytes())
    {
        return Ok(Step::already(
            "metadata-uuid",
            format!("the fsid already is {}", uuid_str(&z)),
        ));
    }
    let multi = ctx.devs.len() > 1;
    ctx.progress.phase(
        1,
        "metadata uuid",
        (found.len() * if multi { 3 } else { 1 }) as u64,
    );
    let mut written = 0;
    if multi {
        // See the module docs: flag everywhere, then the fsid, then the
        // flag off, each pass flushed on every device before the next.
        // Each pass reads the copies again: the next one compares with
        // what the last one wrote.
        written += rewrite(ctx, &found, &|c| with_flag(&c.sb, true))?;
        ctx.progress.advance(found.len() as u64);
        let now = copies(ctx)?.0;
        written += rewrite(ctx, &now, &|c| with_fsid(&c.sb, z, true))?;
        ctx.progress.advance(found.len() as u64);
        let now = copies(ctx)?.0;
        written += rewrite(ctx, &now, &|c| with_flag(&c.sb, false))?;
    } else {
        written += rewrite(ctx, &found, &|c| with_fsid(&c.sb, z, false))?;
    }
    ctx.progress.advance(found.len() as u64);
    let mut lines = Vec::new();
    if resuming {
        lines.push(
            "an interrupted metadata UUID change (CHANGING_FSID_V2) was found and finished".into(),
        );
    }
    lines.push(if z == tree {
        format!(
            "fsid {} -> {}: the metadata UUID again, incompat METADATA_UUID off",
            uuid_str(&first.fsid),
            uuid_str(&z)
        )
    } else {
        format!(
            "fsid {} -> {}; the tree blocks keep {} as metadata UUID (incompat METADATA_UUID)",
            uuid_str(&first.fsid),
            uuid_str(&z),
            uuid_str(&tree)
        )
    });
    lines.push(format!(
        "{written} superblock writes on {} device(s), generation {} kept",
        ctx.devs.len(),
        first.generation.get()
    ));
    lines.extend(skipped_note(skipped));
    Ok(Step {
        op: "metadata-uuid",
        outcome: if resuming {
            Outcome::Resumed
        } else {
            Outcome::Done
        },
        lines,
    })
}

/// Whether tree `id` is a subvolume: the top one or a subvolume id (not
/// the data relocation tree, whose id is negative).
fn is_subvol(id: u64) -> bool {
    id == BTRFS_FS_TREE_OBJECTID
        || (BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&id)
}

/// The UUID tree key of `u` (its halves little-endian, as the kernel's
/// `btrfs_uuid_to_key`).
fn uuid_key(u: &[u8; 16], ty: u8) -> Key {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&u[..8]);
    b.copy_from_slice(&u[8..]);
    Key::new(u64::from_le_bytes(a), ty, u64::from_le_bytes(b))
}

/// What one subvolume's root item becomes.
struct Renewal {
    id: u64,
    old: Option<[u8; 16]>,
    uuid: [u8; 16],
    /// The extended fields were stale (an item written by a kernel that
    /// did not know them): reset, as the kernel resets them on reading.
    reset: bool,
}

/// New UUIDs for every subvolume, the UUID tree rebuilt.
pub fn subvol_uuids(ctx: &mut Ctx) -> Result<Step> {
    // Finishing an interrupted fsid change: the run that started it renewed
    // the subvolume UUIDs (in its own commit, before it touched the fsid),
    // and a set mid-change is not written through a transaction.
    if let Some(u) = primaries(ctx).iter().find_map(|(_, sb)| Unfinished::of(sb)) {
        if matches!(u, Unfinished::MetadataUuid | Unfinished::Fsid) {
            return Ok(Step::already(
                "subvol-uuids",
                "left as they are: finishing an interrupted fsid change, whose first run renewed them",
            ));
        }
    }
    let opened = Devices::new(ctx.devs.clone()).open(
        OpenOptions {
            writable: true,
            ..OpenOptions::default()
        },
        Single::AsSet,
    )?;
    let mut st = Store::from_image(opened.img)?;
    let items = st.items_in(
        TreeId::Root,
        Key::new(BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0),
        Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
    )?;
    ctx.progress.phase(1, "subvolume uuids", items.len() as u64);
    let mut renew = Vec::new();
    let mut dead = 0usize;
    for (k, d) in &items {
        if k.ty != BTRFS_ROOT_ITEM_KEY || !is_subvol(k.objectid) {
            continue;
        }
        let ri = RootItem::parse(d).map_err(|e| e.at(0, *k))?;
        if ri.refs.get() == 0 {
            // Deleted, waiting for the cleaner: not in the UUID tree,
            // gone at the next mount.
            dead += 1;
            continue;
        }
        let reset = !ri.has_v2();
        renew.push(Renewal {
            id: k.objectid,
            old: (!reset && ri.uuid != [0; 16]).then_some(ri.uuid),
            uuid: random_uuid(),
            reset,
        });
    }
    let map: HashMap<[u8; 16], [u8; 16]> = renew
        .iter()
        .filter_map(|r| r.old.map(|o| (o, r.uuid)))
        .collect();
    let follow = |u: [u8; 16]| map.get(&u).copied().unwrap_or(u);
    // (key, subvolume ids) of the rebuilt UUID tree.
    let mut entries: BTreeMap<Key, Vec<u64>> = BTreeMap::new();
    let (mut parents, mut received) = (0usize, 0usize);
    for r in &renew {
        let mut after = None;
        st.update_root_item(r.id, |ri| {
            if r.reset {
                // What the kernel does to such an item when it reads it
                // (btrfs_read_root_item): the extended part zeroed, a
                // fresh UUID; the commit sets generation_v2.
                let g = ri.generation.get();
                let mut fresh: RootItem = *ri;
                let keep = std::mem::offset_of!(RootItem, generation_v2);
                let bytes = fresh.as_mut_bytes();
                bytes[keep..].fill(0);
                fresh.generation_v2.set(g);
                *ri = fresh;
            }
            ri.uuid = r.uuid;
            let (p, q) = (follow(ri.parent_uuid), follow(ri.received_uuid));
            if p != ri.parent_uuid {
                parents += 1;
            }
            if q != ri.received_uuid {
                received += 1;
            }
            ri.parent_uuid = p;
            ri.received_uuid = q;
            after = Some(q);
        })?;
        entries
            .entry(uuid_key(&r.uuid, BTRFS_UUID_KEY_SUBVOL))
            .or_default()
            .push(r.id);
        if let Some(q) = after.filter(|q| *q != [0; 16]) {
            entries
                .entry(uuid_key(&q, BTRFS_UUID_KEY_RECEIVED_SUBVOL))
                .or_default()
                .push(r.id);
        }
        ctx.progress.advance(1);
    }
    let mut lines = vec![format!(
        "{} subvolume(s) given new UUIDs; {parents} parent and {received} received UUID(s) follow their subvolume",
        renew.len()
    )];
    let resets = renew.iter().filter(|r| r.reset).count();
    if resets > 0 {
        lines.push(format!(
            "{resets} root item(s) from before subvolume UUIDs existed got the extended fields (as the kernel gives them)"
        ));
    }
    if dead > 0 {
        lines.push(format!(
            "{dead} deleted subvolume(s) awaiting cleanup left as they are"
        ));
    }
    if st.tree_exists(BTRFS_UUID_TREE_OBJECTID)? {
        let removed = st.repair().empty_tree(BTRFS_UUID_TREE_OBJECTID)?;
        for (k, ids) in &entries {
            let v: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
            st.insert_item(BTRFS_UUID_TREE_OBJECTID, k, &v)?;
        }
        // The tree now holds what the kernel's scan would find: no rescan
        // is due at the next mount.
        let t = st.transid();
        st.update_superblock(|sb| sb.uuid_tree_generation.set(t));
        lines.push(format!(
            "UUID tree rebuilt: {removed} item(s) out, {} in",
            entries.len()
        ));
    } else {
        lines.push(
            "the filesystem has no UUID tree: the kernel builds it at the next read-write mount"
                .into(),
        );
    }
    st.commit()?;
    lines.push(format!(
        "committed (generation {})",
        st.image().sb.generation.get()
    ));
    Ok(Step {
        op: "subvol-uuids",
        outcome: Outcome::Done,
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(fsid: u8, md: Option<u8>) -> Superblock {
        let mut s: Superblock = zerocopy::FromZeros::new_zeroed();
        s.fsid = [fsid; 16];
        if let Some(m) = md {
            s.metadata_uuid = [m; 16];
            s.incompat_flags.set(BTRFS_FEATURE_INCOMPAT_METADATA_UUID);
        }
        s
    }

    #[test]
    fn the_result_depends_on_the_tree_fsid_and_the_uuid_only() {
        // First change: the old fsid becomes the metadata UUID.
        let a = with_fsid(&sb(1, None), [2; 16], false);
        assert_eq!(
            (a.fsid, a.metadata_uuid, a.tree_fsid()),
            ([2; 16], [1; 16], [1; 16])
        );
        // From there, or from a third fsid, the same.
        let same = |x: Superblock, y: Superblock| x.as_bytes() == y.as_bytes();
        assert!(same(
            with_fsid(&a, [3; 16], false),
            with_fsid(&sb(1, None), [3; 16], false)
        ));
        assert!(same(
            with_fsid(&sb(2, Some(1)), [3; 16], false),
            with_fsid(&a, [3; 16], false)
        ));
        // Back to the metadata UUID: the feature off, the field zero.
        let b = with_fsid(&a, [1; 16], false);
        assert!(same(b, sb(1, None)));
        assert!(!b.has_incompat(BTRFS_FEATURE_INCOMPAT_METADATA_UUID));
        // The flag.
        let c = with_fsid(&a, [3; 16], true);
        assert!(changing(&c));
        assert!(same(with_flag(&c, false), with_fsid(&a, [3; 16], false)));
    }

    /// A root item of the old size (239 bytes, no UUID) gets the extended
    /// fields and a UUID, and an entry in the UUID tree.
    #[test]
    fn old_root_items_get_the_extended_fields() {
        use crate::check::{check_device, CheckOptions, NoProgress};
        use crate::format::root::ROOT_ITEM_LEGACY_SIZE;
        use crate::image::Image;
        use crate::io::{BlockDevice, MemDevice};
        use std::sync::Arc;
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::zeroed(256 << 20));
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        let open = || {
            let img = Image::open(
                dev.clone(),
                OpenOptions {
                    writable: true,
                    ..OpenOptions::default()
                },
            )
            .unwrap();
            Store::from_image(img).unwrap()
        };
        let mut st = open();
        let key = st.root_key(BTRFS_FS_TREE_OBJECTID).unwrap();
        let old = st.lookup(TreeId::Root, &key).unwrap().unwrap();
        st.update_item(TreeId::Root, &key, &old[..ROOT_ITEM_LEGACY_SIZE])
            .unwrap();
        st.commit().unwrap();
        drop(st);
        let req = super::super::Request {
            subvol_uuids: true,
            ..Default::default()
        };
        let r = super::super::tune_devices(vec![("mem".into(), dev.clone())], &req, &NoProgress)
            .unwrap();
        assert!(
            r.steps[0]
                .lines
                .iter()
                .any(|l| l.contains("extended fields")),
            "{r:?}"
        );
        let mut st = open();
        let now = st.lookup(TreeId::Root, &key).unwrap().unwrap();
        assert_eq!(now.len(), crate::format::root::ROOT_ITEM_SIZE);
        let ri = RootItem::parse(&now).unwrap();
        assert!(ri.has_v2() && ri.uuid != [0; 16]);
        let entry = st
            .lookup(
                BTRFS_UUID_TREE_OBJECTID,
                &uuid_key(&ri.uuid, BTRFS_UUID_KEY_SUBVOL),
            )
            .unwrap()
            .unwrap();
        assert_eq!(entry, BTRFS_FS_TREE_OBJECTID.to_le_bytes());
        drop(st);
        let report = check_device(dev, CheckOptions::own_writes(), &NoProgress).unwrap();
        assert!(report.is_clean(), "{:?}", report.findings);
    }

    #[test]
    fn uuid_keys_are_little_endian_halves() {
        let mut u = [0u8; 16];
        u[0] = 1;
        u[8] = 2;
        let k = uuid_key(&u, BTRFS_UUID_KEY_SUBVOL);
        assert_eq!((k.objectid, k.ty, k.offset), (1, BTRFS_UUID_KEY_SUBVOL, 2));
    }
}
