//! `fix-data-checksum`: every checksummed data sector is read, every copy
//! of it (the checker's `--check-data-csum` scan). For each sector with a
//! bad copy:
//!
//! - when another copy matches the checksum (DUP, RAID1, RAID1C3/4 and
//!   RAID10 data; for RAID5/6 the stripe rebuilt from parity), that copy
//!   is written over each bad one, in place, as a scrub repairs it;
//! - otherwise the sector is reported and left, unless `mirror` names the
//!   copy whose data is right after all (data changed under a direct I/O
//!   write after its checksum was taken, the case btrfs-progs' command
//!   exists for): that copy's checksum is recorded in the checksum tree,
//!   in one transaction, and after the commit the other copies are made
//!   equal to it.
//!
//! btrfs-progs (6.16 on; 6.14 does not have the command) names the same
//! options: `-r/--readonly` reports only, `-m/--mirror N` records the
//! checksum of copy N, counted from 1; its interactive mode (`-i`) is not
//! offered. It never rewrites a bad copy from a good one.
//!
//! Rewriting a copy is not copy-on-write: each sector is one write of the
//! right bytes over wrong ones, so an interruption leaves each copy bad or
//! good, and a second run finishes. A checksum recorded is committed
//! before any copy is made equal to it.

use super::{open_image, RescueReport, Status};
use crate::check::datacsum;
use crate::image::Image;
use crate::trans::Store;
use crate::CorruptKind;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What to do beyond rewriting bad copies from good ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Report only; write nothing (`--readonly`).
    pub readonly: bool,
    /// For sectors no copy of which matches its checksum: record the
    /// checksum of this copy's data (1: the first copy; for RAID5/6, 1 is
    /// the data stripe as it is and 2 and on its rebuilds from parity).
    pub mirror: Option<usize>,
}

/// What [`fix_data_checksum`] found and did.
#[derive(Clone, Debug, Serialize)]
pub struct FixDataChecksum {
    /// Nothing was written.
    pub readonly: bool,
    /// Checksummed sectors read.
    pub sectors_checked: u64,
    /// Each sector with a bad copy, in logical order.
    pub bad_sectors: Vec<BadSector>,
    /// Checksummed ranges that could not be read at all.
    pub unreadable: Vec<String>,
    /// Checksums recorded: the transaction was committed.
    pub committed: bool,
    /// The generation it wrote.
    pub generation: Option<u64>,
}

/// One data sector with a bad copy.
#[derive(Clone, Debug, Serialize)]
pub struct BadSector {
    /// Its logical address.
    pub logical: u64,
    /// How many ways it can be read (copies; for RAID5/6 the stripe and
    /// its rebuilds).
    pub copies: usize,
    /// The copies that fail the checksum: (device, physical offset).
    pub bad: Vec<CopyAt>,
    /// The copy (counted from 1) that matches its checksum, if any.
    pub good_mirror: Option<usize>,
    /// What was done.
    pub action: Action,
}

/// Where one copy of a sector lies.
#[derive(Clone, Debug, Serialize)]
pub struct CopyAt {
    /// Device id.
    pub devid: u64,
    /// The device as given.
    pub device: String,
    /// Physical byte offset.
    pub physical: u64,
}

/// What was done about one bad sector.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// The bad copies were written from the good one.
    Rewritten {
        /// The good copy, counted from 1.
        from_mirror: usize,
    },
    /// `--readonly`: they would be.
    WouldRewrite {
        /// The good copy, counted from 1.
        from_mirror: usize,
    },
    /// No copy matched: the checksum of copy `mirror` was recorded (and
    /// the other copies made equal to it).
    ChecksumRecorded {
        /// The copy, counted from 1.
        mirror: usize,
    },
    /// `--readonly --mirror`: it would be.
    WouldRecord {
        /// The copy, counted from 1.
        mirror: usize,
    },
    /// Left as it is.
    Left {
        /// Why.
        reason: String,
    },
}

impl RescueReport for FixDataChecksum {
    fn status(&self) -> Status {
        let left = !self.unreadable.is_empty()
            || self
                .bad_sectors
                .iter()
                .any(|b| matches!(b.action, Action::Left { .. }));
        if left {
            Status::ErrorsLeft
        } else if self.bad_sectors.is_empty() {
            Status::NothingToDo
        } else if self.readonly {
            Status::WouldChange
        } else {
            Status::Done
        }
    }
    fn lines(&self) -> Vec<String> {
        let mut v = Vec::new();
        for b in &self.bad_sectors {
            let at: Vec<String> = b
                .bad
                .iter()
                .map(|c| format!("physical {} on {}", c.physical, c.device))
                .collect();
            let what = match &b.action {
                Action::Rewritten { from_mirror } => {
                    format!("rewritten from copy {from_mirror}")
                }
                Action::WouldRewrite { from_mirror } => {
                    format!("would be rewritten from copy {from_mirror}")
                }
                Action::ChecksumRecorded { mirror } => {
                    format!("no copy matched; the checksum of copy {mirror} recorded")
                }
                Action::WouldRecord { mirror } => {
                    format!("no copy matched; the checksum of copy {mirror} would be recorded")
                }
                Action::Left { reason } => format!("left: {reason}"),
            };
            v.push(format!(
                "data sector {} ({} of {} copies bad: {}): {what}",
                b.logical,
                b.bad.len(),
                b.copies,
                at.join(", ")
            ));
        }
        v.extend(self.unreadable.iter().map(|u| format!("left: {u}")));
        v.push(format!(
            "{} checksummed sectors read, {} with a bad copy",
            self.sectors_checked,
            self.bad_sectors.len()
        ));
        if let Some(g) = self.generation {
            v.push(format!("checksums committed (generation {g})"));
        }
        match self.status() {
            Status::WouldChange => v.push("read-only: nothing written".into()),
            Status::ErrorsLeft if self.readonly => v.push("read-only: nothing written".into()),
            _ => {}
        }
        v
    }
}

/// Check every data checksum of the filesystem at `paths` and repair what
/// `opts` allows.
pub fn fix_data_checksum(paths: &[PathBuf], opts: Options) -> Result<FixDataChecksum> {
    if opts.mirror == Some(0) {
        return Err(Error::Invalid("copies are counted from 1".into()));
    }
    let img = open_image(paths, !opts.readonly)?;
    let scan = datacsum::scan(&img);
    let mut by_sector: BTreeMap<u64, Vec<datacsum::BadCopy>> = BTreeMap::new();
    for b in scan.bad {
        by_sector.entry(b.logical).or_default().push(b);
    }
    let ss = img.sectorsize as usize;
    let cs = img.csum.size();
    let mut out = FixDataChecksum {
        readonly: opts.readonly,
        sectors_checked: scan.sectors,
        bad_sectors: Vec::new(),
        unreadable: scan.unmapped.into_iter().map(|(_, m)| m).collect(),
        committed: false,
        generation: None,
    };
    // Sectors whose chosen copy's checksum is to be recorded: (logical,
    // its checksum, its bytes, the copy).
    let mut record: Vec<(u64, Vec<u8>, Vec<u8>, usize)> = Vec::new();
    let mut touched = std::collections::BTreeSet::new();
    for (logical, copies) in by_sector {
        let want = &copies[0].want[..cs];
        let mut bad: Vec<CopyAt> = Vec::new();
        for c in &copies {
            if !bad
                .iter()
                .any(|b| b.devid == c.devid && b.physical == c.phys)
            {
                bad.push(CopyAt {
                    devid: c.devid,
                    device: match paths {
                        [one] => one.display().to_string(),
                        _ => img.device_name(c.devid),
                    },
                    physical: c.phys,
                });
            }
        }
        let piece = match img.pieces(logical, ss as u64) {
            Ok(mut v) if v.len() == 1 => v.swap_remove(0),
            Ok(_) | Err(_) => {
                out.bad_sectors.push(BadSector {
                    logical,
                    copies: 0,
                    bad,
                    good_mirror: None,
                    action: Action::Left {
                        reason: "the sector cannot be mapped to its copies".into(),
                    },
                });
                continue;
            }
        };
        let ways = Image::ways_of(&piece);
        let mut reads: Vec<Option<Vec<u8>>> = Vec::with_capacity(ways);
        for way in 0..ways {
            let mut buf = vec![0u8; ss];
            reads.push(img.read_way(&piece, way, &mut buf).ok().map(|_| buf));
        }
        let good = reads
            .iter()
            .position(|r| r.as_deref().is_some_and(|d| img.csum.verify(d, want)));
        let action = match (good, opts.mirror) {
            (Some(g), _) if opts.readonly => Action::WouldRewrite { from_mirror: g + 1 },
            (Some(g), _) => {
                let data = reads[g].as_deref().unwrap_or_default();
                for b in &bad {
                    let dev = img.copy_device(b.devid)?;
                    dev.write_at(b.physical, data)?;
                    touched.insert(b.devid);
                }
                Action::Rewritten { from_mirror: g + 1 }
            }
            (None, Some(m)) if m > ways => Action::Left {
                reason: format!("no copy matches its checksum, and it has no copy {m}"),
            },
            (None, Some(m)) => match &reads[m - 1] {
                None => Action::Left {
                    reason: format!("no copy matches its checksum, and copy {m} cannot be read"),
                },
                Some(_) if opts.readonly => Action::WouldRecord { mirror: m },
                Some(d) => {
                    let sum = img.csum.compute(d)[..cs].to_vec();
                    record.push((logical, sum, d.clone(), m));
                    Action::ChecksumRecorded { mirror: m }
                }
            },
            (None, None) => Action::Left {
                reason: "no copy matches its checksum (--mirror N records the checksum of copy N)"
                    .into(),
            },
        };
        out.bad_sectors.push(BadSector {
            logical,
            copies: ways,
            bad,
            good_mirror: good.map(|g| g + 1),
            action,
        });
    }
    for devid in &touched {
        img.copy_device(*devid)?.flush()?;
    }
    if record.is_empty() {
        return Ok(out);
    }
    // The checksums first, in one commit; then the other copies follow
    // the one whose checksum is now recorded.
    let devices = img.device_list();
    let mut pieces = Vec::new();
    for (logical, _, _, _) in &record {
        let piece = img.pieces(*logical, ss as u64)?.into_iter().next();
        pieces.push(piece.ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::ChunkMap,
                "data sector maps to nothing",
                *logical,
            )
        })?);
    }
    let mut st = Store::from_image(img)?;
    for (logical, sum, _, _) in &record {
        st.csums().csum_delete(*logical, ss as u64)?;
        st.csums().csum_insert(*logical, sum)?;
    }
    st.commit()?;
    out.committed = true;
    out.generation = Some(st.image().sb.generation.get());
    let img = st.image();
    let mut touched = std::collections::BTreeSet::new();
    for ((_, _, data, m), piece) in record.iter().zip(&pieces) {
        if piece.parity.is_some() {
            // Copy 1 is the data stripe itself; a rebuild is written to
            // it (its parity already agrees with the rebuilt bytes).
            if *m > 1 {
                let (devid, phys) = piece.copies[0];
                img.copy_device(devid)?.write_at(phys, data)?;
                touched.insert(devid);
            }
            continue;
        }
        for (i, &(devid, phys)) in piece.copies.iter().enumerate() {
            if i + 1 == *m {
                continue;
            }
            let Some((_, dev)) = devices.iter().find(|(id, _)| *id == devid) else {
                continue;
            };
            let mut cur = vec![0u8; ss];
            if dev.read_at(phys, &mut cur).is_err() || cur != *data {
                dev.write_at(phys, data)?;
                touched.insert(devid);
            }
        }
    }
    for (devid, dev) in &devices {
        if touched.contains(devid) {
            dev.flush()?;
        }
    }
    Ok(out)
}
