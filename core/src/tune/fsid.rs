//! `-u` / `-U UUID`: a new fsid written into every tree block header (with
//! a new chunk tree UUID, as btrfstune does), every device item and every
//! superblock copy of every device.
//!
//! The sequence, each step finished before the next begins:
//! 1. every superblock copy of every device: flag CHANGING_FSID, the new
//!    fsid (and the device item's fsid), the old fsid kept in the
//!    otherwise unused `metadata_uuid` field (METADATA_UUID is refused
//!    here, so the field is free) so that a rerun knows both;
//! 2. the root tree's root block, rewritten first: its header carries the
//!    new chunk tree UUID, which a rerun reads back from it (btrfstune
//!    keeps it there too);
//! 3. every other tree block ([`super::rewrite`]), device items in the
//!    chunk tree's leaves included;
//! 4. every superblock copy again: flag cleared, `metadata_uuid` zeroed.
//!
//! Between 1 and 4 the kernel refuses the filesystem (blocks disagree with
//! the superblock, and the flag is set); `btrkit-fsck` names the flag; a
//! rerun of `-u` (or `-U` with the same UUID) finishes from wherever it
//! stopped, reading blocks in either state.

use super::rewrite::{self, Accept, Options, Planned};
use super::{Ctx, NewUuid, Outcome, Step};
use crate::csum::CsumType;
use crate::format::consts::*;
use crate::format::dev::DevItem;
use crate::format::header::{Header, Item, HEADER_SIZE, ITEM_SIZE};
use crate::format::superblock::Superblock;
use crate::image::first_valid_superblock;
use crate::io::BlockDevice;
use crate::util::uuid::{random_uuid, uuid_str};
use crate::{Error, Result};
use std::mem::offset_of;
use std::sync::Arc;
use zerocopy::FromBytes;

/// Header field offsets (`struct btrfs_header`).
const HDR_FSID: usize = offset_of!(Header, fsid);
const HDR_CHUNK_TREE_UUID: usize = offset_of!(Header, chunk_tree_uuid);
const DEV_ITEM_FSID: usize = offset_of!(DevItem, fsid);

/// `-u` / `-U`.
pub fn change(ctx: &mut Ctx, u: NewUuid) -> Result<Step> {
    super::prof("fsid: start");
    let sbs = all_primaries(ctx)?;
    let flagged = sbs
        .iter()
        .any(|sb| sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID != 0);
    let (old, new) = if flagged {
        resume_target(&sbs, u)?
    } else {
        let sb = &sbs[0];
        if sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_METADATA_UUID != 0 {
            return Err(Error::Unsupported(
                "cannot rewrite the fsid while the metadata UUID is in use (as btrfstune): make the fsid and metadata UUID match first with -M".into(),
            ));
        }
        let new = match u {
            NewUuid::Given(g) => g,
            NewUuid::Random => random_uuid(),
        };
        if new == sb.fsid {
            return Ok(Step::already(
                "fsid",
                format!("the fsid already is {}", uuid_str(&new)),
            ));
        }
        if new == [0; 16] {
            return Err(Error::Invalid("the fsid cannot be the nil UUID".into()));
        }
        (sb.fsid, new)
    };
    let csum = CsumType::from_disk(sbs[0].csum_type.get())?;

    // 1. Every superblock copy flagged, the new fsid in it.
    write_supers(ctx, |sb| {
        sb.flags
            .set(sb.flags.get() | BTRFS_SUPER_FLAG_CHANGING_FSID);
        sb.fsid = new;
        sb.dev_item.fsid = new;
        sb.metadata_uuid = old;
    })?;

    super::prof("fsid: superblocks flagged");
    // 2. The new chunk tree UUID, recorded in the root tree's root block.
    let accept = Accept {
        fsids: vec![old, new],
        csums: Vec::new(),
    };
    let img = rewrite::open_accepting(&ctx.devs, &accept)?;
    let root = img.sb.root.get();
    let node = img.read_tree_block(root, &crate::tree::node::Expect::default(), false)?;
    let chunk_uuid = if node.header().fsid == new {
        node.header().chunk_tree_uuid
    } else {
        random_uuid()
    };
    let edit = move |buf: &mut [u8]| edit_block(buf, &new, &chunk_uuid);
    let opts = Options { resumed: flagged };
    rewrite::rewrite_listed(
        &img,
        &mut rewrite::Plan::of(vec![Planned {
            bytenr: root,
            reached: true,
        }]),
        csum,
        &edit,
        opts,
        ctx.progress,
    )?;

    super::prof("fsid: root block");
    // 3. Every tree block.
    let mut plan = rewrite::plan(&img, ctx.progress)?;
    super::prof("fsid: planned");
    let stats = rewrite::rewrite_listed(&img, &mut plan, csum, &edit, opts, ctx.progress)?;
    drop(img);
    super::prof("fsid: blocks rewritten");

    // 4. Done: the flag cleared.
    write_supers(ctx, |sb| {
        sb.flags
            .set(sb.flags.get() & !BTRFS_SUPER_FLAG_CHANGING_FSID);
        sb.fsid = new;
        sb.dev_item.fsid = new;
        sb.metadata_uuid = [0; 16];
    })?;
    let mut lines = vec![
        format!("fsid {} -> {}", uuid_str(&old), uuid_str(&new)),
        format!(
            "{} tree blocks rewritten ({} already done), {} superblock devices",
            stats.written,
            stats.already,
            ctx.devs.len()
        ),
    ];
    if stats.stale > 0 {
        lines.push(format!(
            "{} stale extent records of unreadable blocks left alone",
            stats.stale
        ));
    }
    Ok(Step {
        op: "fsid",
        outcome: if flagged {
            Outcome::Resumed
        } else {
            Outcome::Done
        },
        lines,
    })
}

/// The primary superblock of every device (each must have one).
fn all_primaries(ctx: &Ctx) -> Result<Vec<Superblock>> {
    let mut out = Vec::with_capacity(ctx.devs.len());
    for (name, d) in &ctx.devs {
        out.push(
            first_valid_superblock(d.as_ref())
                .map_err(|e| Error::Invalid(format!("{name}: no valid primary superblock: {e}")))?,
        );
    }
    Ok(out)
}

/// (old, new) fsid of an interrupted change, checked against `u`.
fn resume_target(sbs: &[Superblock], u: NewUuid) -> Result<([u8; 16], [u8; 16])> {
    let f = sbs
        .iter()
        .find(|sb| sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID != 0)
        .ok_or_else(|| Error::Internal("no flagged superblock".into()))?;
    let (new, old) = (f.fsid, f.metadata_uuid);
    if old == [0; 16] {
        return Err(Error::Unsupported(
            "an fsid change begun by btrfstune is unfinished: finish it with btrfstune -u".into(),
        ));
    }
    if let NewUuid::Given(g) = u {
        if g != new {
            return Err(Error::Unsupported(format!(
                "an fsid change to {} is unfinished: rerun with -u or -U {}",
                uuid_str(&new),
                uuid_str(&new)
            )));
        }
    }
    // Devices not flagged carry the old fsid (not yet begun) or the new
    // one (already finished, step 4 cut short on another device):
    // anything else is another filesystem.
    for sb in sbs {
        let flagged = sb.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID != 0;
        let ok = if flagged {
            sb.fsid == new && sb.metadata_uuid == old
        } else {
            sb.fsid == old || sb.fsid == new
        };
        if !ok {
            return Err(Error::Invalid(format!(
                "device {} belongs to another filesystem ({})",
                sb.dev_item.devid.get(),
                uuid_str(&sb.fsid)
            )));
        }
    }
    Ok((old, new))
}

/// Write every superblock copy of every device, each device's own
/// superblock changed by `change`, then flush each device. Each copy is
/// one whole 4 KiB write, so every copy is at any moment the old one or
/// the new one.
fn write_supers(ctx: &Ctx, change: impl Fn(&mut Superblock)) -> Result<()> {
    for (name, d) in &ctx.devs {
        let mut sb = first_valid_superblock(d.as_ref())
            .map_err(|e| Error::Invalid(format!("{name}: no valid primary superblock: {e}")))?;
        change(&mut sb);
        let sb_csum = CsumType::from_disk(sb.csum_type.get())?;
        write_all_copies(d, &sb, sb_csum)?;
    }
    Ok(())
}

/// Every superblock copy of `d` that fits on it, primary first, then a
/// flush.
pub(super) fn write_all_copies(
    d: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    csum: CsumType,
) -> Result<()> {
    let copies = (0..BTRFS_SUPER_MIRROR_MAX)
        .take_while(|&m| btrfs_sb_offset(m) + BTRFS_SUPER_INFO_SIZE as u64 <= d.size())
        .count();
    for m in 0..copies {
        let off = btrfs_sb_offset(m);
        let bytes = crate::trans::super_bytes(sb, off, csum);
        d.write_at(off, &bytes)?;
    }
    d.flush()
}

/// The new fsid and chunk tree UUID in a block's header, and the new fsid
/// in every device item of a chunk tree leaf. Returns whether anything
/// changed.
fn edit_block(buf: &mut [u8], fsid: &[u8; 16], chunk_uuid: &[u8; 16]) -> bool {
    let mut changed = false;
    let mut put = |buf: &mut [u8], at: usize, v: &[u8; 16]| {
        if let Some(dst) = buf.get_mut(at..at + 16) {
            if dst != v {
                dst.copy_from_slice(v);
                changed = true;
            }
        }
    };
    put(buf, HDR_FSID, fsid);
    put(buf, HDR_CHUNK_TREE_UUID, chunk_uuid);
    let Ok((h, _)) = Header::read_from_prefix(buf) else {
        return changed;
    };
    if h.owner.get() != BTRFS_CHUNK_TREE_OBJECTID || h.level != 0 {
        return changed;
    }
    // Bounded by the leaf: a slot whose item lies outside it is skipped
    // (the block was validated before; this is only belt and braces).
    let n = (h.nritems.get() as usize).min((buf.len().saturating_sub(HEADER_SIZE)) / ITEM_SIZE);
    for slot in 0..n {
        let at = HEADER_SIZE + slot * ITEM_SIZE;
        let Ok((it, _)) = Item::read_from_prefix(&buf[at..]) else {
            break;
        };
        if it.key.objectid.get() != BTRFS_DEV_ITEMS_OBJECTID || it.key.type_ != BTRFS_DEV_ITEM_KEY {
            continue;
        }
        if (it.size.get() as usize) < std::mem::size_of::<DevItem>() {
            continue;
        }
        let data = HEADER_SIZE + it.offset.get() as usize;
        put(buf, data + DEV_ITEM_FSID, fsid);
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_items_of_chunk_leaves_follow_the_fsid() {
        let mut buf = vec![0u8; 4096];
        crate::tree::edit::init_block(
            &mut buf,
            4096 * 4,
            0,
            BTRFS_CHUNK_TREE_OBJECTID,
            7,
            &[1; 16],
            &[2; 16],
        );
        // One DEV_ITEM at the end of the leaf.
        let size = std::mem::size_of::<DevItem>();
        let off = 4096 - HEADER_SIZE - size;
        buf[HEADER_SIZE..HEADER_SIZE + 8].copy_from_slice(&BTRFS_DEV_ITEMS_OBJECTID.to_le_bytes());
        buf[HEADER_SIZE + 8] = BTRFS_DEV_ITEM_KEY;
        buf[HEADER_SIZE + 9..HEADER_SIZE + 17].copy_from_slice(&1u64.to_le_bytes());
        buf[HEADER_SIZE + 17..HEADER_SIZE + 21].copy_from_slice(&(off as u32).to_le_bytes());
        buf[HEADER_SIZE + 21..HEADER_SIZE + 25].copy_from_slice(&(size as u32).to_le_bytes());
        let nr = offset_of!(Header, nritems);
        buf[nr..nr + 4].copy_from_slice(&1u32.to_le_bytes());
        assert!(edit_block(&mut buf, &[9; 16], &[8; 16]));
        assert_eq!(&buf[HDR_FSID..HDR_FSID + 16], &[9; 16]);
        assert_eq!(
            &buf[HDR_CHUNK_TREE_UUID..HDR_CHUNK_TREE_UUID + 16],
            &[8; 16]
        );
        let fsid_at = HEADER_SIZE + off + DEV_ITEM_FSID;
        assert_eq!(&buf[fsid_at..fsid_at + 16], &[9; 16]);
        // Done already: nothing changes.
        assert!(!edit_block(&mut buf, &[9; 16], &[8; 16]));
    }
}
