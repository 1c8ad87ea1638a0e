//! `zero-log`: clear `log_root` and `log_root_level` in every superblock
//! copy of every device (btrfs-progs `btrfs rescue zero-log`). What the
//! log holds (data and names that fsync made durable since the last
//! commit) is thrown away: `btrkit-replay` replays it instead, and is what
//! to run unless the log itself is what stops everything else.
//!
//! Only superblocks change, each copy written whole with its generation
//! kept (as btrfs-progs writes them): no tree is read, so this works when
//! nothing else can open the filesystem. Interrupted, each copy is either
//! the old one or the cleared one; the kernel reads the primary.

use super::{copies_on, open_devices, write_super_copy, RescueReport, Status};
use crate::csum::CsumType;
use crate::devices::DeviceSet;
use crate::image::read_superblock_raw;
use crate::{Error, Result};
use serde::Serialize;
use std::path::PathBuf;

/// What [`zero_log`] found and did.
#[derive(Clone, Debug, Serialize)]
pub struct ZeroLog {
    /// Only looked: nothing written.
    pub dry_run: bool,
    /// The log root the primary superblock named (0: none).
    pub log_root: u64,
    /// Its level.
    pub log_root_level: u8,
    /// The superblocks' generation (kept).
    pub generation: u64,
    /// Every superblock copy, what it held and what was done.
    pub copies: Vec<CopyDone>,
}

/// One superblock copy.
#[derive(Clone, Debug, Serialize)]
pub struct CopyDone {
    /// The device, as given.
    pub device: String,
    /// Copy number (0 primary, 1, 2).
    pub mirror: usize,
    /// Byte offset of the copy.
    pub offset: u64,
    /// The log root it named (None: the copy is not valid, left alone).
    pub log_root: Option<u64>,
    /// Whether it was written (or, in a dry run, would be).
    pub cleared: bool,
    /// Nothing was ever written there (all zeroes): no copy to clear.
    pub absent: bool,
}

impl RescueReport for ZeroLog {
    fn status(&self) -> Status {
        match (self.copies.iter().any(|c| c.cleared), self.dry_run) {
            (false, _) => Status::NothingToDo,
            (true, true) => Status::WouldChange,
            (true, false) => Status::Done,
        }
    }
    fn lines(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.log_root != 0 {
            v.push(format!(
                "log root {} (level {}) at generation {}: the data and names it holds (fsync'd since the last commit) are thrown away; btrkit-replay replays them instead",
                self.log_root, self.log_root_level, self.generation
            ));
        }
        for c in &self.copies {
            let what = match (c.log_root, c.cleared) {
                (None, _) if c.absent => "none there (never written)".into(),
                (None, _) => {
                    "not a valid copy, left alone (btrkit-fsck rescue super-recover)".into()
                }
                (Some(0), _) => "no log".to_string(),
                (Some(l), true) if self.dry_run => format!("log root {l}: would be cleared"),
                (Some(l), true) => format!("log root {l}: cleared"),
                (Some(l), false) => format!("log root {l}: left"),
            };
            v.push(format!(
                "{} superblock copy {} (byte {}): {what}",
                c.device, c.mirror, c.offset
            ));
        }
        match self.status() {
            Status::NothingToDo => v.push("no log to clear: nothing to do".into()),
            Status::WouldChange => v.push("dry run: nothing written".into()),
            _ => {}
        }
        v
    }
}

/// Clear the log pointer of every valid superblock copy on the devices at
/// `paths` (every device of the filesystem).
pub fn zero_log(paths: &[PathBuf], dry_run: bool) -> Result<ZeroLog> {
    let set = DeviceSet::assemble(open_devices(paths, dry_run)?)?;
    if set.missing_count() > 0 {
        return Err(Error::MissingDevice {
            devids: Vec::new(),
            what: format!(
                "the filesystem has {} devices and {} were given: clear the log on every device",
                set.num_devices,
                set.members().count()
            ),
        });
    }
    let primary = set
        .primary()
        .ok_or_else(|| Error::Invalid("no device given".into()))?;
    let mut out = ZeroLog {
        dry_run,
        log_root: primary.sb.log_root.get(),
        log_root_level: primary.sb.log_root_level,
        generation: primary.sb.generation.get(),
        copies: Vec::new(),
    };
    for m in set.members() {
        for mirror in 0..copies_on(m.dev.size()) {
            let (mut sb, st) = read_superblock_raw(m.dev.as_ref(), mirror)?;
            let valid = st.is_valid() && sb.fsid == set.fsid;
            let log = valid.then(|| sb.log_root.get());
            let clear = valid && (sb.log_root.get() != 0 || sb.log_root_level != 0);
            if clear && !dry_run {
                let csum = CsumType::from_disk(sb.csum_type.get())?;
                sb.log_root.set(0);
                sb.log_root_level = 0;
                sb.log_root_transid.set(0);
                write_super_copy(m.dev.as_ref(), &sb, mirror, csum)?;
            }
            out.copies.push(CopyDone {
                device: m.name.clone(),
                mirror,
                offset: st.offset,
                log_root: log,
                cleared: clear,
                absent: st.all_zero,
            });
        }
        if !dry_run {
            m.dev.flush()?;
        }
    }
    Ok(out)
}
