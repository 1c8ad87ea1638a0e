//! `btrfs filesystem resize` and `btrfs inspect-internal min-dev-size`
//! offline. Growing sets the device's size (the image file is extended by
//! the caller first); shrinking lowers where new chunks may go, relocates
//! every block group with a stripe past the new end (highest first, as
//! btrfs_shrink_device), then sets the size in one commit. Until that
//! commit the device items keep the old size, so a cut anywhere leaves a
//! consistent filesystem of the old size; the image file is cut only
//! after it.

use crate::format::consts::*;
use crate::format::dev::DevExtent;
use crate::format::key::Key;
use crate::trans::Store;
use crate::{Error, Result};

const MIB: u64 = 1 << 20;

/// Smallest size the kernel resizes a device to.
pub const MIN_DEVICE_SIZE: u64 = 256 * MIB;

/// The size argument of `btrfs filesystem resize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `max`: the whole device (the image file as it is).
    Max,
    /// `SIZE`: exactly this.
    To(u64),
    /// `+SIZE`.
    Grow(u64),
    /// `-SIZE`.
    Shrink(u64),
}

/// Parse `[DEVID:][+/-]SIZE[kKmMgGtTpPeE]|[DEVID:]max` (sizes in binary
/// units, as btrfs-progs and the kernel read them). Returns the devid
/// (None: device 1) and the change.
pub fn parse_spec(s: &str) -> Result<(Option<u64>, Change)> {
    let bad = || Error::Invalid(format!("invalid size argument: '{s}'"));
    let (devid, rest) = match s.split_once(':') {
        Some((d, r)) => (Some(d.parse::<u64>().map_err(|_| bad())?), r),
        None => (None, s),
    };
    if devid == Some(0) {
        return Err(Error::Invalid("invalid device id 0".into()));
    }
    if rest == "max" {
        return Ok((devid, Change::Max));
    }
    if rest == "cancel" {
        return Err(Error::Invalid(
            "nothing to cancel: an offline resize runs to its end or is cut".into(),
        ));
    }
    let (sign, num) = match rest.as_bytes().first() {
        Some(b'+') => (1, &rest[1..]),
        Some(b'-') => (-1, &rest[1..]),
        _ => (0, rest),
    };
    let n = parse_size(num).ok_or_else(bad)?;
    Ok((
        devid,
        match sign {
            1 => Change::Grow(n),
            -1 => Change::Shrink(n),
            _ => Change::To(n),
        },
    ))
}

/// A size with an optional binary unit suffix (k, m, g, t, p, e).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last()? {
        c if c.is_ascii_digit() => (s, 1u64),
        c => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                'p' => 50,
                'e' => 60,
                _ => return None,
            };
            (&s[..s.len() - 1], 1u64 << shift)
        }
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// The new size of a device now `old` bytes (its item's total_bytes) on a
/// device of `dev_size` bytes, rounded down to `sectorsize`, checked as
/// the kernel's resize ioctl checks it.
pub fn target_size(change: Change, old: u64, dev_size: u64, sectorsize: u64) -> Result<u64> {
    let new = match change {
        Change::Max => dev_size,
        Change::To(n) => n,
        Change::Grow(n) => old
            .checked_add(n)
            .ok_or_else(|| Error::Invalid("new size overflows".into()))?,
        Change::Shrink(n) => old.checked_sub(n).ok_or_else(|| {
            Error::Invalid(format!("unable to shrink by {n} bytes a device of {old}"))
        })?,
    };
    if new < MIN_DEVICE_SIZE {
        return Err(Error::Invalid(format!(
            "new size {new} is below the smallest device btrfs accepts ({MIN_DEVICE_SIZE} bytes)"
        )));
    }
    Ok(new / sectorsize * sectorsize)
}

/// The device extents of `devid` as (start, length, chunk logical),
/// ascending.
pub(crate) fn dev_extents(st: &mut Store, devid: u64) -> Result<Vec<(u64, u64, u64)>> {
    let mut out = Vec::new();
    for (k, d) in st.items_in(
        BTRFS_DEV_TREE_OBJECTID,
        Key::new(devid, BTRFS_DEV_EXTENT_KEY, 0),
        Key::new(devid, BTRFS_DEV_EXTENT_KEY, u64::MAX),
    )? {
        let de: &DevExtent = crate::format::view(&d, "dev extent").map_err(|e| e.at(0, k))?;
        out.push((k.offset, de.length.get(), de.chunk_offset.get()));
    }
    Ok(out)
}

/// `btrfs inspect-internal min-dev-size`: the smallest size device
/// `devid` can be shrunk to, as btrfs-progs estimates it: 1 MiB, plus
/// every dev extent; an extent past that sum must fit a hole before it
/// (pessimistically one more extent when the hole holds a superblock
/// copy), and any relocation needs room for the largest moved extent and
/// a system chunk.
pub fn min_dev_size(st: &mut Store, devid: u64) -> Result<u64> {
    if st.chunks().device_item(devid).is_none() {
        return Err(Error::Invalid(format!(
            "no device {devid} in the filesystem"
        )));
    }
    let exts = dev_extents(st, devid)?;
    let mut min = MIB;
    let mut holes: Vec<(u64, u64)> = Vec::new();
    let mut last: Option<u64> = None;
    for &(start, len, _) in &exts {
        min += len;
        if let Some(l) = last {
            if l != start {
                holes.push((l, start - 1));
            }
        }
        last = Some(start + len);
    }
    // Largest end first.
    let mut by_end: Vec<(u64, u64)> = exts.iter().map(|&(s, l, _)| (s, s + l - 1)).collect();
    by_end.reverse();
    let mut scratch = 0u64;
    for (s, e) in by_end {
        if e <= min {
            break;
        }
        let len = e - s + 1;
        let Some(i) = holes.iter().position(|&(hs, he)| he - hs + 1 >= len) else {
            min = e + 1;
            break;
        };
        let (hs, he) = holes[i];
        if (0..BTRFS_SUPER_MIRROR_MAX)
            .map(btrfs_sb_offset)
            .any(|b| b >= hs && b < hs + len)
        {
            min += len;
        }
        if he - hs + 1 > len {
            holes[i].0 += len;
        } else {
            holes.remove(i);
        }
        scratch = scratch.max(len);
    }
    if scratch > 0 {
        min += scratch + 32 * MIB;
    }
    Ok(min)
}

/// What a resize did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The device.
    pub devid: u64,
    /// Its size before and after.
    pub old_size: u64,
    /// Its new size.
    pub new_size: u64,
    /// Block groups relocated off the cut end.
    pub relocated: u64,
    /// Data bytes they moved.
    pub data_bytes: u64,
}

/// Resize device `devid` of an open filesystem to `new_size` (see
/// [`target_size`]): grow (the device must already be that large) or
/// shrink (relocating what lies past the new end). Commits;
/// `progress(done, total)` after each relocated group.
pub fn resize(
    st: &mut Store,
    devid: u64,
    new_size: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Report> {
    let di = st
        .chunks()
        .device_item(devid)
        .ok_or_else(|| Error::Invalid(format!("no device {devid} in the filesystem")))?;
    let old = di.total_bytes.get();
    let mut report = Report {
        devid,
        old_size: old,
        new_size,
        ..Default::default()
    };
    if st.sb().flags.get() & BTRFS_SUPER_FLAG_SEEDING != 0 {
        return Err(Error::Unsupported("resizing a seed device".into()));
    }
    if new_size == old {
        return Ok(report);
    }
    if new_size > old {
        st.chunks().set_device_size(devid, new_size)?;
        st.commit()?;
        return Ok(report);
    }
    let (relocated, data_bytes) = move_off(st, devid, new_size, progress).map_err(|e| match e {
        Error::NoSpace(m) => Error::NoSpace(format!(
            "{m}: not enough room below {new_size} bytes for what lies past it \
                 (nothing past the groups already moved was changed; see min-dev-size)"
        )),
        e => e,
    })?;
    report.relocated = relocated;
    report.data_bytes = data_bytes;
    st.chunks().set_device_size(devid, new_size)?;
    st.commit()?;
    Ok(report)
}

/// Relocate every block group with a stripe of device `devid` past byte
/// `end` (0: all of them), highest stripe first, no new chunk placed
/// there meanwhile (a shrink, a device removal). All of them are fenced
/// at once, so one's extents do not land in another that goes next.
/// `progress(done, total)` after each. Returns the groups relocated and
/// the data bytes they moved.
pub(crate) fn move_off(
    st: &mut Store,
    devid: u64,
    end: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(u64, u64)> {
    let mut groups: Vec<(u64, u64)> = dev_extents(st, devid)?
        .into_iter()
        .filter(|&(s, l, _)| s + l > end)
        .map(|(s, _, chunk)| (s, chunk))
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.0));
    let mut chunks: Vec<u64> = Vec::new();
    for (_, c) in groups {
        if !chunks.contains(&c) {
            chunks.push(c);
        }
    }
    st.chunks().set_alloc_limit(devid, Some(end));
    st.chunks().set_read_only(&chunks, true);
    let total = chunks.len() as u64;
    let (mut relocated, mut data_bytes) = (0u64, 0u64);
    let mut r = Ok(());
    for &c in &chunks {
        match st.relocation().relocate_group(c) {
            Ok(m) => {
                relocated += 1;
                data_bytes += m.data_bytes;
            }
            Err(e) => {
                r = Err(e);
                break;
            }
        }
        progress(relocated, total);
    }
    st.chunks().set_read_only(&chunks, false);
    st.chunks().set_alloc_limit(devid, None);
    r?;
    if let Some((s, l, _)) = dev_extents(st, devid)?
        .into_iter()
        .find(|&(s, l, _)| s + l > end)
    {
        return Err(Error::Internal(format!(
            "device {devid} still has a dev extent at {s}+{l} past {end}"
        )));
    }
    Ok((relocated, data_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arguments_parse_as_btrfs() {
        assert_eq!(parse_spec("max").unwrap(), (None, Change::Max));
        assert_eq!(parse_spec("2:max").unwrap(), (Some(2), Change::Max));
        assert_eq!(parse_spec("+1g").unwrap(), (None, Change::Grow(1 << 30)));
        assert_eq!(
            parse_spec("-100M").unwrap(),
            (None, Change::Shrink(100 << 20))
        );
        assert_eq!(
            parse_spec("1:512m").unwrap(),
            (Some(1), Change::To(512 << 20))
        );
        assert_eq!(parse_spec("4096").unwrap(), (None, Change::To(4096)));
        assert!(parse_spec("0:max").is_err());
        assert!(parse_spec("1x").is_err());
        assert!(parse_spec("cancel").is_err());
        assert!(parse_spec("+").is_err());
    }

    #[test]
    fn targets_are_checked_as_the_kernel_checks_them() {
        let g = 1u64 << 30;
        assert_eq!(target_size(Change::Max, g, 2 * g, 4096).unwrap(), 2 * g);
        assert_eq!(
            target_size(Change::Shrink(g / 2), g, g, 4096).unwrap(),
            g / 2
        );
        assert_eq!(target_size(Change::To(g + 100), g, 2 * g, 4096).unwrap(), g);
        assert!(target_size(Change::To(100 << 20), g, g, 4096).is_err());
        assert!(target_size(Change::Shrink(2 * g), g, g, 4096).is_err());
    }
}
