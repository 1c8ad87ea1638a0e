//! Superblock fields alone: the label and the seeding flag; and the
//! superblock-copy rewriting that they and the metadata UUID share.
//!
//! No tree is read or written and the generation is kept: each copy is
//! read, changed, and written back whole (one 4 KiB write), as
//! btrfs-progs writes superblock copies. A device's mirrors are written
//! and flushed before its primary, so a device whose primary carries the
//! change has it in every copy; an interruption leaves each copy the old
//! one or the new one, and the kernel and `btrfs check` read the primary.

use super::{Ctx, Outcome, Step};
use crate::csum::CsumType;
use crate::format::consts::*;
use crate::format::superblock::Superblock;
use crate::image::{read_superblock, read_superblock_raw};
use crate::rescue::{copies_on, write_super_copy};
use crate::util::uuid::uuid_str;
use crate::{Error, Result};
use zerocopy::IntoBytes;

/// One superblock copy of one device, as read.
#[derive(Clone)]
pub(super) struct Copy {
    /// Index of the device in [`Ctx::devs`].
    pub dev: usize,
    /// Copy number (0 primary).
    pub mirror: usize,
    /// What it holds.
    pub sb: Superblock,
}

/// Every superblock copy of every device of `ctx` that belongs to the
/// filesystem (valid, the tree fsid of its device's primary), primaries
/// first device by device, then the devices' mirrors. A device without a
/// valid primary is an error naming it; a mirror that is not valid (never
/// written, damaged) is left alone and counted in the second value.
pub(super) fn copies(ctx: &Ctx) -> Result<(Vec<Copy>, usize)> {
    let mut out = Vec::new();
    let mut skipped = 0;
    for (i, (name, dev)) in ctx.devs.iter().enumerate() {
        let primary = read_superblock(dev.as_ref(), 0)
            .map_err(|e| Error::Invalid(format!("{name}: primary superblock: {e}")))?;
        let tree_fsid = primary.tree_fsid();
        out.push(Copy {
            dev: i,
            mirror: 0,
            sb: primary,
        });
        for mirror in 1..copies_on(dev.size()) {
            match read_superblock_raw(dev.as_ref(), mirror) {
                Ok((sb, st)) if st.is_valid() && sb.tree_fsid() == tree_fsid => {
                    out.push(Copy { dev: i, mirror, sb })
                }
                Ok((_, st)) if st.all_zero => {}
                _ => skipped += 1,
            }
        }
    }
    Ok((out, skipped))
}

/// Write `change(copy)` over every copy in `copies` where it differs,
/// device by device: the mirrors, a flush, the primary, a flush. Returns
/// how many copies were written (0: every copy was already so).
pub(super) fn rewrite(
    ctx: &Ctx,
    copies: &[Copy],
    change: &dyn Fn(&Copy) -> Superblock,
) -> Result<usize> {
    let mut written = 0;
    for (i, (name, dev)) in ctx.devs.iter().enumerate() {
        let mine: Vec<&Copy> = copies.iter().filter(|c| c.dev == i).collect();
        // Mirrors before the primary: see the module docs.
        for primary in [false, true] {
            let mut any = false;
            for c in mine.iter().filter(|c| (c.mirror == 0) == primary) {
                let new = change(c);
                if new.as_bytes() == c.sb.as_bytes() {
                    continue;
                }
                let csum = CsumType::from_disk(new.csum_type.get())?;
                write_super_copy(dev.as_ref(), &new, c.mirror, csum).map_err(|e| named(e, name))?;
                written += 1;
                any = true;
            }
            if any {
                dev.flush().map_err(|e| named(e, name))?;
            }
        }
    }
    Ok(written)
}

/// An I/O error names the device it happened on.
fn named(e: Error, name: &str) -> Error {
    match e {
        Error::Io { context, err } => Error::Io {
            context: format!("{name}: {context}"),
            err,
        },
        e => e,
    }
}

/// A note on mirrors left alone, if any.
pub(super) fn skipped_note(skipped: usize) -> Option<String> {
    (skipped > 0).then(|| {
        format!("{skipped} superblock mirror(s) not valid, left alone (btrkit-fsck rescue super-recover rewrites them)")
    })
}

fn label_bytes(l: &str) -> Result<[u8; BTRFS_LABEL_SIZE]> {
    let b = l.as_bytes();
    // The last byte stays NUL: the kernel and btrfs-progs read the label
    // as a C string.
    if b.len() >= BTRFS_LABEL_SIZE || b.contains(&0) || b.contains(&b'\n') {
        return Err(Error::Unsupported(format!(
            "label of {} bytes: at most {} fit, without NUL or newline",
            b.len(),
            BTRFS_LABEL_SIZE - 1
        )));
    }
    let mut out = [0u8; BTRFS_LABEL_SIZE];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

/// `-L LABEL`: the label of every superblock copy of every device.
pub fn label(ctx: &mut Ctx, l: &str) -> Result<Step> {
    let want = label_bytes(l)?;
    let (copies, skipped) = copies(ctx)?;
    ctx.progress.phase(1, "label", copies.len() as u64);
    let old = copies.first().map(|c| c.sb.label_str()).unwrap_or_default();
    let n = rewrite(ctx, &copies, &|c| {
        let mut sb = c.sb;
        sb.label = want;
        sb
    })?;
    ctx.progress.advance(copies.len() as u64);
    if n == 0 {
        return Ok(Step::already(
            "label",
            format!("the label already is {l:?}"),
        ));
    }
    let mut lines = vec![format!(
        "label {old:?} -> {l:?} ({n} superblock copies on {} device(s))",
        ctx.devs.len()
    )];
    lines.extend(skipped_note(skipped));
    Ok(Step {
        op: "label",
        outcome: Outcome::Done,
        lines,
    })
}

/// `-S 0|1`: the SEEDING superblock flag on every copy of every device.
/// Refused, as btrfstune refuses it, on a filesystem with a metadata UUID
/// (a seed's sprouts find it by its fsid, which then is not what its
/// blocks carry) and, to set it, with an fsync log not replayed (a seed
/// is never written, so the log could never be replayed).
pub fn seeding(ctx: &mut Ctx, on: bool) -> Result<Step> {
    let (copies, skipped) = copies(ctx)?;
    let Some(first) = copies.first() else {
        return Err(Error::Invalid("no device given".into()));
    };
    if copies
        .iter()
        .any(|c| c.sb.has_incompat(BTRFS_FEATURE_INCOMPAT_METADATA_UUID))
    {
        return Err(Error::Unsupported(format!(
            "filesystem {} has a metadata UUID (btrfstune -m): the seeding flag cannot be changed on it (as in btrfstune); set the metadata UUID back first (-M {})",
            uuid_str(&first.sb.fsid),
            uuid_str(&first.sb.tree_fsid())
        )));
    }
    if on
        && copies
            .iter()
            .any(|c| c.mirror == 0 && c.sb.log_root.get() != 0)
    {
        return Err(Error::Unsupported(
            "the filesystem has an fsync log to replay: a seed is never written, replay it first (btrkit-replay)".into(),
        ));
    }
    ctx.progress.phase(1, "seeding flag", copies.len() as u64);
    let n = rewrite(ctx, &copies, &|c| {
        let mut sb = c.sb;
        let f = sb.flags.get();
        sb.flags.set(if on {
            f | BTRFS_SUPER_FLAG_SEEDING
        } else {
            f & !BTRFS_SUPER_FLAG_SEEDING
        });
        sb
    })?;
    ctx.progress.advance(copies.len() as u64);
    let what = if on { "set" } else { "cleared" };
    if n == 0 {
        return Ok(Step::already(
            "seeding",
            format!(
                "the seeding flag already is {}",
                if on { "set" } else { "clear" }
            ),
        ));
    }
    let mut lines = vec![format!(
        "seeding flag {what} ({n} superblock copies on {} device(s))",
        ctx.devs.len()
    )];
    if !on {
        lines.push("a filesystem sprouted from this seed may no longer mount".into());
    }
    lines.extend(skipped_note(skipped));
    Ok(Step {
        op: "seeding",
        outcome: Outcome::Done,
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_fit_with_their_nul() {
        assert_eq!(&label_bytes("data").unwrap()[..5], b"data\0");
        assert!(label_bytes(&"x".repeat(BTRFS_LABEL_SIZE - 1)).is_ok());
        assert!(label_bytes(&"x".repeat(BTRFS_LABEL_SIZE)).is_err());
        assert!(label_bytes("a\0b").is_err());
        assert_eq!(label_bytes("").unwrap(), [0u8; BTRFS_LABEL_SIZE]);
    }
}
