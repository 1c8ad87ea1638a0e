//! Feature conversions, each one transaction of the engine ending in one
//! commit: an interruption at any write leaves the filesystem as it was
//! or fully converted (the commit's superblock write is the switch), so
//! none of them needs a superblock flag of its own.
//!
//! - [`bgt`]: block group items into the block group tree and back;
//! - [`fst`]: the free space tree built, the v1 space cache dropped;
//! - [`incompat`]: no-holes and extended refs (flags only) and skinny
//!   metadata (every tree block's extent item rewritten);
//! - [`quota`]: full qgroups (counted by a rescan in the same
//!   transaction) and simple quotas, on and off.
//!
//! Each step opens the filesystem afresh (an earlier step of the same
//! run committed), finds out whether there is anything to do (else
//! [`Outcome::AlreadySo`](super::Outcome::AlreadySo), nothing written),
//! checks its preconditions before the first change (a refusal writes
//! nothing) and commits once.

pub mod bgt;
pub mod fst;
pub mod incompat;
pub mod quota;

pub use bgt::block_group_tree;
pub use fst::free_space_tree;
pub use incompat::{extref, no_holes, skinny_metadata};
pub use quota::quota;

use super::{Ctx, Outcome, Step};
use crate::devices::{Devices, Single};
use crate::image::OpenOptions;
use crate::trans::Store;
use crate::{Error, Result};

/// A transaction on every device of the filesystem. A log to replay is
/// refused (the guard said so already; a store never opens with one).
pub(crate) fn open_store(ctx: &Ctx) -> Result<Store> {
    let opened = Devices::new(ctx.devs.clone()).open(
        OpenOptions {
            writable: true,
            ..Default::default()
        },
        Single::AsSet,
    )?;
    if opened.img.sb.log_root.get() != 0 {
        return Err(Error::Unsupported(
            "the filesystem has an fsync log to replay: run btrkit-replay first".into(),
        ));
    }
    Store::from_image(opened.img)
}

/// A step that changed the filesystem.
pub(crate) fn done(op: &'static str, lines: Vec<String>) -> Step {
    Step {
        op,
        outcome: Outcome::Done,
        lines,
    }
}

/// Every EXTENT_ITEM of the extent tree, parsed, leaf by leaf, handed to
/// `visit` with the store so that it may rewrite the item. The walk
/// resumes past each leaf's last key and stops when a leaf brings no key
/// past the last one seen, so it ends whatever the visits changed.
pub(super) fn each_extent_item(
    st: &mut Store,
    mut visit: impl FnMut(
        &mut Store,
        &crate::format::key::Key,
        &[u8],
        crate::format::extent::ExtentView<'_>,
    ) -> Result<()>,
) -> Result<()> {
    use crate::format::key::Key;
    const EXTENT: u64 = crate::format::consts::BTRFS_EXTENT_TREE_OBJECTID;
    let mut k = Key::MIN;
    let mut last_seen: Option<Key> = None;
    while let Some((_, items)) = st.leaf_from(EXTENT, &k)? {
        let Some(last) = items.last().map(|(k, _)| *k) else {
            break;
        };
        if last_seen.is_some_and(|l| last <= l) {
            break;
        }
        last_seen = Some(last);
        for (key, data) in &items {
            if key.ty != crate::format::consts::BTRFS_EXTENT_ITEM_KEY {
                continue;
            }
            let v =
                crate::format::extent::parse_extent_item(key, data).map_err(|e| e.at(0, *key))?;
            visit(st, key, data, v)?;
        }
        if last == Key::MAX {
            break;
        }
        k = crate::trans::next_key(&last);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::check::{check_device, CheckOptions, NoProgress};
    use crate::format::consts::*;
    use crate::image::read_superblock;
    use crate::io::{BlockDevice, MemDevice};
    use crate::mkfs::{Features, MkfsOptions};
    use crate::tune::{tune_devices, Outcome, QuotaChange, Request};
    use std::sync::Arc;

    /// A filesystem with every optional feature off, some files in it.
    fn bare() -> Arc<dyn BlockDevice> {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::zeroed(256 << 20));
        let mut features = Features::default();
        features.no_holes = false;
        features.skinny_metadata = false;
        features.extref = false;
        features.free_space_tree = false;
        features.block_group_tree = false;
        let o = MkfsOptions {
            features,
            ..Default::default()
        };
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &o).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        dev
    }

    fn run(dev: &Arc<dyn BlockDevice>, req: Request) -> Outcome {
        let r = tune_devices(vec![("m".into(), dev.clone())], &req, &NoProgress).unwrap();
        let rep = check_device(dev.clone(), CheckOptions::own_writes(), &NoProgress).unwrap();
        assert!(rep.is_clean(), "{req:?}: {:#?}", rep.findings);
        r.steps[0].outcome
    }

    #[test]
    fn every_conversion_checks_clean_and_twice_is_already_so() {
        let dev = bare();
        let reqs = [
            Request {
                no_holes: true,
                ..Default::default()
            },
            Request {
                extref: true,
                ..Default::default()
            },
            Request {
                skinny_metadata: true,
                ..Default::default()
            },
            Request {
                free_space_tree: true,
                ..Default::default()
            },
            Request {
                block_group_tree: Some(true),
                ..Default::default()
            },
            Request {
                quota: Some(QuotaChange::Enable),
                ..Default::default()
            },
            Request {
                quota: Some(QuotaChange::Disable),
                ..Default::default()
            },
            Request {
                quota: Some(QuotaChange::EnableSimple),
                ..Default::default()
            },
            Request {
                quota: Some(QuotaChange::RemoveSimple),
                ..Default::default()
            },
            Request {
                block_group_tree: Some(false),
                ..Default::default()
            },
        ];
        for req in reqs {
            assert_eq!(run(&dev, req.clone()), Outcome::Done, "{req:?}");
            assert_eq!(run(&dev, req.clone()), Outcome::AlreadySo, "{req:?} again");
        }
        let sb = read_superblock(dev.as_ref(), 0).unwrap();
        let want = BTRFS_FEATURE_INCOMPAT_NO_HOLES
            | BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF
            | BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA;
        assert_eq!(sb.incompat_flags.get() & want, want);
        assert_eq!(
            sb.incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA,
            0
        );
        assert_eq!(
            sb.compat_ro_flags.get()
                & (BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID
                    | BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE),
            BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID
        );
    }

    #[test]
    fn block_group_tree_without_free_space_tree_writes_nothing() {
        let dev = bare();
        let before = dev.size();
        let mut img = vec![0u8; before as usize];
        dev.read_at(0, &mut img).unwrap();
        let req = Request {
            block_group_tree: Some(true),
            ..Default::default()
        };
        let e = tune_devices(vec![("m".into(), dev.clone())], &req, &NoProgress).unwrap_err();
        assert!(e.to_string().contains("free space tree"), "{e}");
        let mut after = vec![0u8; before as usize];
        dev.read_at(0, &mut after).unwrap();
        assert!(img == after);
    }
}
