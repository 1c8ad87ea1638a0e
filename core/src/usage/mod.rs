//! Space accounting of an image, offline: what `btrfs filesystem usage`,
//! `df` and `du` and compsize print on a mount of it (`btrkit filesystem
//! ...`). Nothing here writes: the filesystem is opened as restore opens
//! it, behind in-memory overlays, with the fsync log replayed in memory
//! (the state the kernel shows after its mount), or the last commit when
//! asked (`LogMode::Ignore`).

use crate::fs::Filesystem;
use crate::io::BlockDevice;
use crate::restore::ReadOptions;
use crate::Result;
use std::collections::BTreeMap;
use std::sync::Arc;

pub mod compsize;
pub mod du;
pub mod space;

pub use compsize::{compsize, CompsizeReport};
pub use du::{du, DuEntry, DuReport};
pub use space::{space_report, SpaceReport};

/// The filesystem opened for reading only, with what it was opened from.
pub struct Opened {
    /// The filesystem (see [`crate::restore::open_virtual_fallback`]).
    pub fs: Filesystem,
    /// When the log could not be replayed: what was read instead.
    pub note: Option<String>,
    /// The name each device was given by, by devid (from its superblock).
    pub names: BTreeMap<u64, String>,
}

/// Open the filesystem on `devs` (name, device) for reading only.
pub fn open(devs: Vec<(String, Arc<dyn BlockDevice>)>, o: &ReadOptions) -> Result<Opened> {
    let mut names = BTreeMap::new();
    for (n, d) in &devs {
        if let Ok(sb) = crate::image::first_valid_superblock(d.as_ref()) {
            names.insert(sb.dev_item.devid.get(), n.clone());
        }
    }
    let (fs, note) = crate::restore::open_virtual_fallback(devs, o)?;
    Ok(Opened { fs, note, names })
}
