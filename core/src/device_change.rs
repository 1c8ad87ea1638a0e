//! `btrfs device add`, `btrfs device remove` and `btrfs replace start`
//! on unmounted images.
//!
//! - add: the new device gets the next devid and a device item; the next
//!   commit writes its superblocks (btrfs_init_new_device). Nothing moves.
//! - remove: no new chunk may use the device, every block group with a
//!   stripe on it is relocated (btrfs_shrink_device to 0), then its device
//!   item goes in one commit and its superblocks are scratched
//!   (btrfs_rm_device). A cut before that commit leaves the device in the
//!   filesystem, holding less; running the command again finishes.
//! - replace: every dev extent of the source is copied to the same place
//!   on the target, from the source or, when it is missing, rebuilt from
//!   the other copies or from parity; then the target takes the source's
//!   devid and device uuid (btrfs_dev_replace_finishing) in one commit,
//!   and the source's superblocks are scratched. Until that commit the
//!   target is nobody's: a cut leaves the filesystem as it was.

use crate::chunk::parity;
use crate::format::consts::*;
use crate::io::{BlockDevice, FileDevice};
use crate::offline::Offline;
use crate::trans::Store;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// Bytes copied at once by a replace.
const COPY_PIECE: u64 = 4 * MIB;

/// Smallest device btrfs adds (what mkfs.btrfs and btrfs-progs' device
/// add require of a device).
pub const MIN_NEW_DEVICE: u64 = crate::resize::MIN_DEVICE_SIZE;

/// Whether a device holds a btrfs superblock in any copy.
fn has_btrfs(dev: &dyn BlockDevice) -> bool {
    (0..BTRFS_SUPER_MIRROR_MAX).any(|m| crate::image::read_superblock(dev, m).is_ok())
}

/// Open a device to join the filesystem: present, not in use by a mount,
/// large enough, holding no filesystem of btrfs unless `force`.
fn open_new(path: &Path, force: bool) -> Result<Arc<FileDevice>> {
    if let Some(why) = crate::tune::guard::in_use(path)? {
        return Err(Error::Unsupported(format!(
            "{} is in use ({why})",
            path.display()
        )));
    }
    let dev = Arc::new(FileDevice::open(path, true)?);
    if dev.size() < MIN_NEW_DEVICE {
        return Err(Error::Invalid(format!(
            "{} is too small: {} bytes, a device needs at least {MIN_NEW_DEVICE}",
            path.display(),
            dev.size()
        )));
    }
    if !force && has_btrfs(dev.as_ref()) {
        return Err(Error::Invalid(format!(
            "{} holds a btrfs filesystem: use --force to overwrite it",
            path.display()
        )));
    }
    Ok(dev)
}

/// Zero what a new device may carry of an old filesystem where btrfs
/// looks for one: its first MiB and every superblock copy.
fn wipe_signatures(dev: &dyn BlockDevice) -> Result<()> {
    let size = dev.size();
    dev.write_at(0, &vec![0u8; MIB.min(size) as usize])?;
    for m in 0..BTRFS_SUPER_MIRROR_MAX {
        let off = btrfs_sb_offset(m);
        if off + BTRFS_SUPER_INFO_SIZE as u64 <= size {
            dev.write_at(off, &[0u8; BTRFS_SUPER_INFO_SIZE])?;
        }
    }
    dev.flush()
}

/// Zero the magic of every superblock copy of a device that left the
/// filesystem (btrfs_scratch_superblocks): nothing finds it any more.
fn scratch_superblocks(dev: &dyn BlockDevice) -> Result<()> {
    const MAGIC_AT: u64 = 0x40;
    for m in 0..BTRFS_SUPER_MIRROR_MAX {
        let off = btrfs_sb_offset(m);
        if off + BTRFS_SUPER_INFO_SIZE as u64 <= dev.size() {
            dev.write_at(off + MAGIC_AT, &[0u8; 8])?;
        }
    }
    dev.flush()
}

/// What a device change did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The device added, removed or replaced.
    pub devid: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Block groups relocated off it (remove).
    pub relocated: u64,
    /// Bytes copied or rebuilt onto the target (replace).
    pub copied: u64,
    /// Of those, bytes rebuilt from other copies or parity.
    pub rebuilt: u64,
}

/// `btrfs device add NEW` on the filesystem on `paths`.
pub fn add(paths: &[PathBuf], new: &Path, force: bool) -> Result<Report> {
    if paths.iter().any(|p| same_file(p, new)) {
        return Err(Error::Invalid(format!(
            "{} is already a device of the filesystem",
            new.display()
        )));
    }
    let dev = open_new(new, force)?;
    let size = dev.size();
    let mut o = Offline::open(paths)?;
    if o.fs().store.sb().flags.get() & BTRFS_SUPER_FLAG_SEEDING != 0 {
        return Err(Error::Unsupported(
            "adding a device to a seed filesystem (it makes a new filesystem sprout)".into(),
        ));
    }
    wipe_signatures(dev.as_ref())?;
    let devid = o
        .fs()
        .store
        .membership()
        .add_device(new.display().to_string(), dev, size)?;
    o.fs().commit("device add")?;
    o.close()?;
    Ok(Report {
        devid,
        size,
        ..Default::default()
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The devid `which` names: a number, or the path of one of `o`'s devices.
fn resolve(o: &Offline, which: &str) -> Result<u64> {
    if let Ok(n) = which.parse::<u64>() {
        return Ok(n);
    }
    let p = Path::new(which);
    o.devices()
        .iter()
        .find(|(_, q)| same_file(q, p))
        .map(|(d, _)| *d)
        .ok_or_else(|| Error::Invalid(format!("{which} is not a device of the filesystem")))
}

/// `btrfs device remove DEVID|PATH|missing` on the filesystem on `paths`;
/// `progress(done, total)` counts relocated block groups.
pub fn remove(
    paths: &[PathBuf],
    which: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Report> {
    // `missing` (a device of the set not given) is removed from what the
    // others hold: its copies are read from mirrors or parity.
    let mut o = match Offline::open(paths) {
        Err(Error::MissingDevice { .. }) if which == "missing" => Offline::open_degraded(paths)?,
        r => r?,
    };
    let devid = if which == "missing" {
        *o.fs()
            .store
            .membership()
            .missing_devices()
            .first()
            .ok_or_else(|| Error::Invalid("no device of the filesystem is missing".into()))?
    } else {
        resolve(&o, which)?
    };
    let st = &mut o.fs().store;
    let size = st
        .membership()
        .tree_device_item(devid)?
        .ok_or_else(|| Error::Invalid(format!("no device {devid} in the filesystem")))?
        .total_bytes
        .get();
    let n = st.sb().num_devices.get();
    if n <= 1 {
        return Err(Error::Invalid(
            "unable to remove the only device of a filesystem".into(),
        ));
    }
    // btrfs_check_raid_min_devices: every profile in use must keep its
    // fewest devices.
    let profiles = st.block_groups().fold(0u64, |a, g| a | g.flags);
    for bit in [
        BTRFS_BLOCK_GROUP_RAID1C4,
        BTRFS_BLOCK_GROUP_RAID1C3,
        BTRFS_BLOCK_GROUP_RAID6,
        BTRFS_BLOCK_GROUP_RAID5,
        BTRFS_BLOCK_GROUP_RAID10,
        BTRFS_BLOCK_GROUP_RAID1,
    ] {
        if profiles & bit == 0 {
            continue;
        }
        let min = crate::chunk::RaidAttr::of(bit).map_or(1, |a| a.devs_min);
        if n - 1 < min {
            return Err(Error::Invalid(format!(
                "unable to go below {min} devices on {}: convert first (btrkit balance start -dconvert=... -mconvert=...)",
                crate::format::names::profile_name(bit)
            )));
        }
    }
    let (relocated, _) = crate::resize::move_off(st, devid, 0, progress).map_err(|e| match e {
        Error::NoSpace(m) => Error::NoSpace(format!(
            "{m}: the other devices have no room for what device {devid} holds"
        )),
        e => e,
    })?;
    let gone = st.membership().remove_device(devid)?;
    st.commit()?;
    o.close()?;
    if let Some(dev) = gone {
        scratch_superblocks(dev.as_ref())?;
    }
    Ok(Report {
        devid,
        size,
        relocated,
        ..Default::default()
    })
}

/// `btrfs replace start SRC NEW` on the filesystem on `paths` (the source
/// among them, or missing: then the filesystem is opened degraded and
/// the source rebuilt). `progress(done, total)` in bytes.
pub fn replace(
    paths: &[PathBuf],
    src: &str,
    new: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Report> {
    if paths.iter().any(|p| same_file(p, new)) {
        return Err(Error::Invalid(format!(
            "{} is already a device of the filesystem",
            new.display()
        )));
    }
    let target = open_new(new, force)?;
    let mut o = match Offline::open(paths) {
        Ok(o) => o,
        Err(Error::MissingDevice { .. }) => Offline::open_degraded(paths)?,
        Err(e) => return Err(e),
    };
    let devid = match src.parse::<u64>() {
        Ok(n) => n,
        Err(_) => resolve(&o, src)?,
    };
    let st = &mut o.fs().store;
    let item = st
        .membership()
        .tree_device_item(devid)?
        .ok_or_else(|| Error::Invalid(format!("no device {devid} in the filesystem")))?;
    let size = item.total_bytes.get();
    if target.size() < size {
        return Err(Error::Invalid(format!(
            "target device is smaller than the source: {} bytes, the source {size}",
            target.size()
        )));
    }
    wipe_signatures(target.as_ref())?;
    let source = st.chunk_map_device(devid);
    let exts = crate::resize::dev_extents(st, devid)?;
    let total: u64 = exts.iter().map(|e| e.1).sum();
    let mut copied = 0u64;
    let mut rebuilt = 0u64;
    for &(phys, len, chunk) in &exts {
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(COPY_PIECE);
            let mut buf = vec![0u8; n as usize];
            let from_source = match &source {
                Some(d) => d.read_at(phys + off, &mut buf).is_ok(),
                None => false,
            };
            if !from_source {
                rebuild_piece(st, devid, chunk, phys, phys + off, &mut buf)?;
                rebuilt += n;
            }
            target.write_at(phys + off, &buf)?;
            off += n;
            copied += n;
            progress(copied, total);
        }
    }
    target.flush()?;
    // The target takes the source's place: devid, device uuid, size.
    let old = st
        .membership()
        .swap_device(devid, new.display().to_string(), target)?;
    st.commit()?;
    o.close()?;
    if let Some(dev) = old {
        scratch_superblocks(dev.as_ref())?;
    }
    Ok(Report {
        devid,
        size,
        copied,
        rebuilt,
        ..Default::default()
    })
}

/// Rebuild `buf.len()` bytes at physical `at` of device `devid`'s stripe
/// (starting at `stripe_phys`) of chunk `logical`, from the chunk's other
/// stripes: a mirror's copy, or the row's other columns and parity.
fn rebuild_piece(
    st: &Store,
    devid: u64,
    logical: u64,
    stripe_phys: u64,
    at: u64,
    buf: &mut [u8],
) -> Result<()> {
    let m = st
        .chunk_map()
        .lookup(logical)
        .ok_or_else(|| Error::Invalid(format!("no chunk at {logical}")))?
        .clone();
    let me = m
        .stripes
        .iter()
        .position(|&(d, p)| d == devid && p == stripe_phys)
        .ok_or_else(|| {
            Error::Internal(format!(
                "chunk {logical} has no stripe of device {devid} at {stripe_phys}"
            ))
        })?;
    let profile = m.type_flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    let n = m.stripes.len();
    let lost = || Error::MissingDevice {
        devids: vec![devid],
        what: format!(
            "chunk {logical} ({}) has no other copy of what device {devid} held",
            crate::format::names::block_group_flags_str(m.type_flags)
        ),
    };
    let read = |d: u64, p: u64, out: &mut [u8]| -> bool {
        st.chunk_map_device(d)
            .is_some_and(|dev| dev.read_at(p, out).is_ok())
    };
    let rel = at - stripe_phys;
    let mirrors: Vec<usize> = if profile
        & (BTRFS_BLOCK_GROUP_RAID1 | BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4)
        != 0
    {
        (0..n).filter(|&i| i != me).collect()
    } else if profile & BTRFS_BLOCK_GROUP_RAID10 != 0 {
        let sub = usize::from(m.sub_stripes.max(1));
        let first = me / sub * sub;
        (first..first + sub).filter(|&i| i != me).collect()
    } else {
        Vec::new()
    };
    if !mirrors.is_empty() {
        for i in mirrors {
            let (d, p) = m.stripes[i];
            if d != devid && read(d, p + rel, buf) {
                return Ok(());
            }
        }
        return Err(lost());
    }
    let np = if profile & BTRFS_BLOCK_GROUP_RAID6 != 0 {
        2
    } else if profile & BTRFS_BLOCK_GROUP_RAID5 != 0 {
        1
    } else {
        return Err(lost());
    };
    // Row by row (a stripe unit each): the columns of the row in data,
    // P, Q order; this device's one lost.
    let unit = m.stripe_len;
    let mut done = 0usize;
    while done < buf.len() {
        let pos = rel + done as u64;
        let row = pos / unit;
        let in_unit = pos % unit;
        let len = ((unit - in_unit) as usize).min(buf.len() - done);
        let mut cols: Vec<Vec<u8>> = vec![vec![0u8; len]; n];
        let mut lost_cols = vec![false; n];
        for (i, col) in cols.iter_mut().enumerate() {
            let k = ((row as usize) + i) % n;
            let (d, p) = m.stripes[k];
            if k == me || !read(d, p + pos, col) {
                lost_cols[i] = true;
            }
        }
        parity::rebuild(&mut cols, &lost_cols, np).map_err(|e| Error::MissingDevice {
            devids: vec![devid],
            what: format!("chunk {logical}: {e}"),
        })?;
        let i = (me + n - (row as usize % n)) % n;
        buf[done..done + len].copy_from_slice(&cols[i]);
        done += len;
    }
    Ok(())
}
