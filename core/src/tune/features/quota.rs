//! Quotas on and off, each in one commit:
//! - full qgroups: the quota tree, its status item, a level-0 qgroup
//!   (info and limit items) for the top level and every subvolume, and
//!   the counters from a rescan of the committed trees, all in the same
//!   transaction (the kernel commits between enabling and its rescan; the
//!   rescan counts the committed trees either way, and this transaction
//!   changes no subvolume);
//! - simple quotas, as btrfstune --enable-simple-quota: incompat
//!   SIMPLE_QUOTA, the status in SIMPLE_MODE with this transaction as its
//!   enable generation, every qgroup empty. Existing extents get no owner
//!   ref and count nowhere (they predate the enable generation);
//! - off (full or simple), as btrfstune --remove-simple-quota: the owner
//!   refs removed from every data extent item (the kernel rejects them
//!   without SIMPLE_QUOTA), the quota tree dropped, SIMPLE_QUOTA cleared.

use super::{done, open_store};
use crate::format::consts::*;
use crate::format::extent::{write_inline_refs, InlineRef, EXTENT_ITEM_SIZE};
use crate::trans::Store;
use crate::tune::{Ctx, QuotaChange, Step};
use crate::{Error, Result};

const EXTENT: u64 = BTRFS_EXTENT_TREE_OBJECTID;

/// What the quota tree says now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Off,
    Full,
    Simple,
}

fn state(st: &mut Store) -> Result<State> {
    let q = st.qgroups();
    if q.enabled {
        return Ok(if q.simple.is_some() {
            State::Simple
        } else {
            State::Full
        });
    }
    // A quota tree whose status says off still is a quota tree: removing
    // it is work, enabling over it is not safe.
    if st.tree_exists(BTRFS_QUOTA_TREE_OBJECTID)?
        || st.sb().incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA != 0
    {
        return Ok(State::Full);
    }
    Ok(State::Off)
}

/// Quotas on or off.
pub fn quota(ctx: &mut Ctx, q: QuotaChange) -> Result<Step> {
    let op = match q {
        QuotaChange::Enable => "enable-quota",
        QuotaChange::Disable => "disable-quota",
        QuotaChange::EnableSimple => "enable-simple-quota",
        QuotaChange::RemoveSimple => "remove-simple-quota",
    };
    let mut st = open_store(ctx)?;
    let now = state(&mut st)?;
    match (q, now) {
        (QuotaChange::Enable, State::Full) => {
            return Ok(Step::already(op, "quotas are on already"))
        }
        (QuotaChange::EnableSimple, State::Simple) => {
            return Ok(Step::already(op, "simple quotas are on already"))
        }
        (QuotaChange::Enable, State::Simple) => {
            return Err(Error::Unsupported(
                "simple quotas are on: remove them first (--remove-simple-quota), then enable full quotas".into(),
            ))
        }
        (QuotaChange::EnableSimple, State::Full) => {
            return Err(Error::Unsupported(
                "full quotas (qgroups) are on: disable them first (--disable-quota), then enable simple quotas".into(),
            ))
        }
        (QuotaChange::Disable, State::Off) => {
            return Ok(Step::already(op, "quotas are off already"))
        }
        (QuotaChange::RemoveSimple, State::Off) => {
            return Ok(Step::already(op, "simple quotas are off already"))
        }
        (QuotaChange::RemoveSimple, State::Full) => {
            return Err(Error::Unsupported(
                "the filesystem has full quotas (qgroups), not simple ones: use --disable-quota".into(),
            ))
        }
        _ => {}
    }
    let subvols = crate::fs::subvol::subvol_ids(&mut st)?;
    let mut lines = Vec::new();
    match q {
        QuotaChange::Enable => {
            ctx.progress.phase(1, "quota rescan", 1);
            st.quotas().quota_enable(&subvols)?;
            st.quotas().quota_rescan()?;
            lines.push(format!(
                "quota tree created, {} level-0 qgroups counted by a rescan",
                subvols.len() + 1
            ));
        }
        QuotaChange::EnableSimple => {
            st.quotas().quota_enable_simple(&subvols)?;
            lines.push(format!(
                "simple quotas on from generation {} ({} level-0 qgroups); existing extents count nowhere",
                st.transid(),
                subvols.len() + 1
            ));
            lines.push("incompat feature SIMPLE_QUOTA set".into());
        }
        QuotaChange::Disable | QuotaChange::RemoveSimple => {
            ctx.progress
                .phase(1, "quota removal", st.sb().bytes_used.get());
            let stripped = strip_owner_refs(&mut st, ctx)?;
            st.quotas().quota_disable()?;
            lines.push("quota tree removed".into());
            if stripped > 0 {
                lines.push(format!(
                    "{stripped} simple-quota owner refs removed from data extent items"
                ));
            }
            if now == State::Simple {
                lines.push("incompat feature SIMPLE_QUOTA cleared".into());
            }
        }
    }
    st.commit()?;
    Ok(done(op, lines))
}

/// Remove the inline EXTENT_OWNER_REF of every data extent item; returns
/// how many went. The other inline refs stay as they are, in their order.
fn strip_owner_refs(st: &mut Store, ctx: &Ctx) -> Result<u64> {
    let mut n = 0u64;
    super::each_extent_item(st, |st, key, data, v| {
        if v.tree_block_info.is_some()
            || !v.refs.iter().any(|r| matches!(r, InlineRef::Owner { .. }))
        {
            return Ok(());
        }
        let kept: Vec<InlineRef> = v
            .refs
            .iter()
            .filter(|r| !matches!(r, InlineRef::Owner { .. }))
            .copied()
            .collect();
        let mut new = data[..EXTENT_ITEM_SIZE].to_vec();
        write_inline_refs(&mut new, &kept);
        st.update_item(EXTENT, key, &new)?;
        n += 1;
        ctx.progress.advance(key.offset);
        Ok(())
    })?;
    Ok(n)
}
