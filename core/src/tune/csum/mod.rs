//! `--csum ALGO`: every data and metadata checksum converted to another
//! algorithm, each old checksum verified before its new one is written.
//!
//! The sequence (the on-disk markers are btrfs-progs'; the data phase's
//! progress record is ours):
//! 1. one commit inserts the temporary item (CSUM_CHANGE, TEMPORARY_ITEM,
//!    new type) in the root tree, its payload a [`Marker`] (the old type
//!    and the progress boundary, 0), and sets CHANGING_DATA_CSUM;
//! 2. data phase ([`data`]): commit after commit, the EXTENT_CSUM items of
//!    the next range of logical addresses are replaced by items in the new
//!    algorithm and the boundary moves past them; the last of these commits
//!    also swaps CHANGING_DATA_CSUM for CHANGING_META_CSUM;
//! 3. metadata phase ([`meta`]): every tree block rewritten in place with
//!    the new checksum (every copy, parity kept), then every superblock copy
//!    of every device written with the new `csum_type` (checksummed in the
//!    new algorithm; CHANGING_META_CSUM still set);
//! 4. one commit of the engine, now in the new algorithm, deletes the
//!    temporary item and clears CHANGING_META_CSUM.
//!
//! Between 1 and 4 the kernel refuses to mount (it knows neither flag) and
//! `btrkit-fsck` names the unfinished conversion; a rerun of the same
//! command resumes from the flags: in the data phase at the marker's
//! boundary, in the metadata phase by rewriting what is not yet new (blocks
//! already carrying the new checksum are skipped). A conversion btrfstune
//! left unfinished has a temporary item without our payload: it is refused,
//! btrfstune has to finish it.
//!
//! Compressed extents are checksummed on their on-disk bytes and nodatasum
//! files have no checksums: both fall out of converting the csum tree as it
//! is. The free space cache (v1) carries its own crc32c and is untouched.

mod data;
mod meta;

use super::{guard, Ctx, Outcome, Step};
use crate::csum::CsumType;
use crate::devices::{Devices, Single};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::image::{Image, OpenOptions};
use crate::trans::{Store, TreeId};
use crate::{Error, Result};

/// Bad sectors named one by one in the report; the rest are counted.
const BAD_NAMED: usize = 20;

/// The temporary item's payload: what a rerun needs to resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The algorithm converted from.
    pub old: CsumType,
    /// Every EXTENT_CSUM item keyed below this logical address is in the
    /// new algorithm, every one at or above it in the old.
    pub boundary: u64,
    /// Sectors found bad so far (every run of the conversion).
    pub bad: u64,
}

/// First bytes of [`Marker::encode`]: tells our payload from btrfstune's
/// (which has none) and from anything else.
const MARKER_MAGIC: &[u8; 8] = b"BTRKCSUM";
/// Layout version after the magic.
const MARKER_VERSION: u16 = 1;
/// Encoded size: magic, version, old type, boundary, bad count.
const MARKER_SIZE: usize = 8 + 2 + 2 + 8 + 8;

impl Marker {
    /// The payload bytes (little-endian fields after the magic).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MARKER_SIZE);
        v.extend_from_slice(MARKER_MAGIC);
        v.extend_from_slice(&MARKER_VERSION.to_le_bytes());
        v.extend_from_slice(&self.old.to_disk().to_le_bytes());
        v.extend_from_slice(&self.boundary.to_le_bytes());
        v.extend_from_slice(&self.bad.to_le_bytes());
        v
    }

    /// A payload [`encode`](Marker::encode) wrote; None for any other.
    pub fn decode(d: &[u8]) -> Option<Marker> {
        if d.len() != MARKER_SIZE || &d[..8] != MARKER_MAGIC {
            return None;
        }
        let u16_at = |i: usize| u16::from_le_bytes([d[i], d[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().unwrap_or([0; 8]));
        if u16_at(8) != MARKER_VERSION {
            return None;
        }
        Some(Marker {
            old: CsumType::from_disk(u16_at(10)).ok()?,
            boundary: u64_at(12),
            bad: u64_at(20),
        })
    }
}

/// The key of the temporary item of a conversion to `to`.
pub(crate) fn temp_key(to: CsumType) -> Key {
    Key::new(
        BTRFS_CSUM_CHANGE_OBJECTID,
        BTRFS_TEMPORARY_ITEM_KEY,
        to.to_disk() as u64,
    )
}

/// The algorithm an unfinished conversion converts to
/// ([`Image::unfinished_csum_target`]).
pub fn unfinished_target(img: &Image) -> Option<CsumType> {
    img.unfinished_csum_target()
}

/// Where an interrupted conversion stands, from the superblock flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    None,
    Data,
    Meta,
}

/// Convert every checksum to `to`.
pub fn convert(ctx: &mut Ctx, to: CsumType) -> Result<Step> {
    let sbs = guard::primaries(ctx);
    if sbs.is_empty() {
        return Err(Error::Invalid("no valid superblock on any device".into()));
    }
    let flags = sbs.iter().fold(0, |f, (_, sb)| f | sb.flags.get());
    let phase = match (
        flags & BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM != 0,
        flags & BTRFS_SUPER_FLAG_CHANGING_META_CSUM != 0,
    ) {
        (false, false) => Phase::None,
        (true, false) => Phase::Data,
        (false, true) => Phase::Meta,
        (true, true) => {
            return Err(Error::Unsupported(
                "both CHANGING_DATA_CSUM and CHANGING_META_CSUM are set: not a state a checksum conversion leaves; refusing to touch it".into(),
            ))
        }
    };
    let mut lines = Vec::new();
    prof("start");
    let (marker, outcome) = match phase {
        Phase::None => {
            // The data phase's later commits read back csum leaves holding
            // items of both sizes: accept both from the start.
            let mut st = open_store(ctx, Some(to))?;
            let from = st.image().csum;
            if from == to {
                return Ok(Step::already(
                    "csum",
                    format!("the filesystem already uses {}", to.name()),
                ));
            }
            refuse_foreign(&mut st)?;
            let marker = Marker {
                old: from,
                boundary: 0,
                bad: 0,
            };
            // The conversion's first commit: from here on the kernel
            // refuses to mount until the last commit.
            st.insert_item(TreeId::Root, &temp_key(to), &marker.encode())?;
            st.update_superblock(|sb| {
                sb.flags
                    .set(sb.flags.get() | BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM)
            });
            st.commit()?;
            lines.push(format!(
                "converting from {} to {} (superblock flag CHANGING_DATA_CSUM set)",
                from.name(),
                to.name()
            ));
            let m = data_phase(ctx, st, marker, to, &mut lines)?;
            (m, Outcome::Done)
        }
        Phase::Data => {
            let mut st = open_store(ctx, Some(to))?;
            let marker = read_marker(&mut st, to)?;
            if st.image().csum != marker.old {
                return Err(Error::Unsupported(format!(
                    "CHANGING_DATA_CSUM is set but the superblock names {}, not {} the conversion started from: refusing",
                    st.image().csum.name(),
                    marker.old.name()
                )));
            }
            lines.push(format!(
                "resuming the conversion from {} to {}: data checksums converted below logical {}",
                marker.old.name(),
                to.name(),
                marker.boundary
            ));
            let m = data_phase(ctx, st, marker, to, &mut lines)?;
            (m, Outcome::Resumed)
        }
        Phase::Meta => {
            let mut st = open_store(ctx, Some(to))?;
            let marker = read_marker(&mut st, to)?;
            lines.push(format!(
                "resuming the conversion from {} to {}: data checksums done, tree blocks next",
                marker.old.name(),
                to.name()
            ));
            drop(st);
            (marker, Outcome::Resumed)
        }
    };
    prof("data phase");
    let stats = meta::run(ctx, marker.old, to, phase == Phase::Meta)?;
    prof("metadata phase");
    lines.extend(stats);
    // The last commit, in the new algorithm: the temporary item and the
    // flag go together.
    let mut st = open_store(ctx, None)?;
    if st.image().csum != to {
        return Err(Error::Internal(format!(
            "the superblocks still name {} after the metadata phase",
            st.image().csum.name()
        )));
    }
    st.delete_item(TreeId::Root, &temp_key(to))?;
    st.update_superblock(|sb| {
        sb.flags.set(
            sb.flags.get()
                & !(BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM | BTRFS_SUPER_FLAG_CHANGING_META_CSUM),
        )
    });
    st.commit()?;
    prof("final commit");
    lines.push(format!(
        "checksums converted from {} to {}",
        marker.old.name(),
        to.name()
    ));
    if marker.bad > 0 {
        lines.push(format!(
            "{} data sector{} failed {} on every copy: left failing (a read of {} gives EIO)",
            marker.bad,
            if marker.bad == 1 { "" } else { "s" },
            marker.old.name(),
            if marker.bad == 1 { "it" } else { "them" },
        ));
    }
    Ok(Step {
        op: "csum",
        outcome,
        lines,
    })
}

use super::prof;

/// The filesystem opened for a transaction; `alt` a second algorithm its
/// tree blocks and csum items may be in (an unfinished conversion).
fn open_store(ctx: &Ctx, alt: Option<CsumType>) -> Result<Store> {
    let opened = Devices::new(ctx.devs.clone()).open(
        OpenOptions {
            alt_csum: alt,
            ..Default::default()
        },
        Single::AsSet,
    )?;
    let mut img = opened.img;
    // A half-converted image's superblock may name either algorithm.
    if img.alt_csum == Some(img.csum) {
        img.alt_csum = None;
    }
    Store::from_image(img)
}

/// Refuse a filesystem that holds a conversion record we did not write
/// (btrfstune's, interrupted and its flag lost): nothing is written.
fn refuse_foreign(st: &mut Store) -> Result<()> {
    if let Some((k, _)) = first_temp(st)? {
        return Err(Error::Unsupported(format!(
            "the root tree holds a checksum conversion item (to {}) but no conversion flag is set: an interrupted btrfstune run? refusing to start another",
            type_name(k.offset)
        )));
    }
    Ok(())
}

/// The first (CSUM_CHANGE, TEMPORARY_ITEM, *) item of the root tree.
fn first_temp(st: &mut Store) -> Result<Option<(Key, Vec<u8>)>> {
    let k = Key::new(BTRFS_CSUM_CHANGE_OBJECTID, BTRFS_TEMPORARY_ITEM_KEY, 0);
    Ok(st
        .next_item(TreeId::Root, &k)?
        .filter(|(f, _)| f.objectid == k.objectid && f.ty == k.ty))
}

fn type_name(t: u64) -> String {
    u16::try_from(t)
        .ok()
        .and_then(|t| CsumType::from_disk(t).ok())
        .map(|c| c.name().to_string())
        .unwrap_or_else(|| format!("unknown type {t}"))
}

/// The marker of the unfinished conversion, which must be one to `to`
/// and ours.
fn read_marker(st: &mut Store, to: CsumType) -> Result<Marker> {
    let Some((k, d)) = first_temp(st)? else {
        return Err(Error::Unsupported(
            "a checksum conversion flag is set but the root tree has no conversion item (CSUM_CHANGE, TEMPORARY_ITEM): cannot tell where it stopped; refusing".into(),
        ));
    };
    let target = type_name(k.offset);
    if k.offset != to.to_disk() as u64 {
        return Err(Error::Unsupported(format!(
            "an interrupted conversion to {target} is unfinished: finish it with btrkit-tune --csum {target} first"
        )));
    }
    match Marker::decode(&d) {
        Some(m) if m.old != to => Ok(m),
        _ => Err(Error::Unsupported(format!(
            "an interrupted btrfstune --csum {target} is unfinished (its conversion item carries no btrkit progress record): finish it with btrfstune --csum {target}"
        ))),
    }
}

/// Run the data phase on `st` and add its report to `lines`.
fn data_phase(
    ctx: &Ctx,
    mut st: Store,
    mut marker: Marker,
    to: CsumType,
    lines: &mut Vec<String>,
) -> Result<Marker> {
    ctx.progress.phase(1, "data checksums", 0);
    let key = temp_key(to);
    let out = data::run(&mut st, &key, &mut marker, to, ctx.progress)?;
    lines.push(format!(
        "{} data sectors verified and converted in {} commit{}",
        out.sectors,
        out.commits,
        if out.commits == 1 { "" } else { "s" }
    ));
    for &l in out.bad.iter().take(BAD_NAMED) {
        let file = describe::files_at(&mut st, l).unwrap_or_default();
        lines.push(format!(
            "data at logical {l} matches its {} checksum on no copy{}: its new checksum keeps it failing",
            marker.old.name(),
            if file.is_empty() {
                String::new()
            } else {
                format!(" ({file})")
            }
        ));
    }
    if out.bad.len() > BAD_NAMED {
        lines.push(format!(
            "and {} more bad sectors",
            out.bad.len() - BAD_NAMED
        ));
    }
    Ok(marker)
}

mod describe;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trip() {
        let m = Marker {
            old: CsumType::Sha256,
            boundary: 123 << 20,
            bad: 7,
        };
        assert_eq!(Marker::decode(&m.encode()), Some(m));
        assert_eq!(Marker::decode(&[]), None);
        let mut e = m.encode();
        e[0] ^= 1;
        assert_eq!(Marker::decode(&e), None);
    }
}
