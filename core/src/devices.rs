//! A device set: the devices a filesystem spans, matched by their
//! superblocks as `btrfs device scan` and the kernel's
//! `device_list_add` match them: one fsid, one device per devid, every
//! copy of the superblock from the same commit. What does not form one
//! filesystem is refused with the reason and the devices named: a
//! foreign fsid, a devid given twice, a device left behind at an older
//! generation, a seed device, more devices than the filesystem has.
//!
//! Which devids are missing is known from the superblock's count alone
//! only in number; their ids come from the chunk tree's device items
//! ([`DeviceSet::missing_of`]).

use crate::format::consts::*;
use crate::format::superblock::Superblock;
use crate::image::{read_superblock, Image, OpenOptions};
use crate::io::{BlockDevice, FileDevice};
use crate::util::uuid::uuid_str;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// One device of a set.
pub struct Member {
    /// The name it was given by (a path), for messages.
    pub name: String,
    /// The device.
    pub dev: Arc<dyn BlockDevice>,
    /// Its primary superblock.
    pub sb: Box<Superblock>,
}

impl Member {
    /// The device's id (its superblock's `dev_item.devid`).
    pub fn devid(&self) -> u64 {
        self.sb.dev_item.devid.get()
    }
}

/// Devices of one filesystem, by devid.
pub struct DeviceSet {
    /// The filesystem's fsid.
    pub fsid: [u8; 16],
    /// Devices the filesystem has (the superblock's `num_devices`).
    pub num_devices: u64,
    /// The generation every member's superblock is at.
    pub generation: u64,
    members: BTreeMap<u64, Member>,
}

impl DeviceSet {
    /// Match `devices` (name, device) into one filesystem by their
    /// primary superblocks. At least one device; the set may lack
    /// devices (see [`DeviceSet::missing_count`]).
    pub fn assemble(devices: Vec<(String, Arc<dyn BlockDevice>)>) -> Result<DeviceSet> {
        DeviceSet::assemble_with(devices, false)
    }

    /// [`DeviceSet::assemble`], a seed device accepted: for a change of
    /// superblock fields alone (the label, the seeding flag itself),
    /// which never writes the trees a seed must keep.
    pub fn assemble_seed_too(devices: Vec<(String, Arc<dyn BlockDevice>)>) -> Result<DeviceSet> {
        DeviceSet::assemble_with(devices, true)
    }

    fn assemble_with(
        devices: Vec<(String, Arc<dyn BlockDevice>)>,
        seed_ok: bool,
    ) -> Result<DeviceSet> {
        if devices.is_empty() {
            return Err(Error::Invalid("no device given".into()));
        }
        let mut read = Vec::with_capacity(devices.len());
        for (name, dev) in devices {
            let sb = read_superblock(dev.as_ref(), 0).map_err(|e| match e {
                Error::NotBtrfs(m) => Error::NotBtrfs(format!("{name}: {m}")),
                e => Error::Invalid(format!("{name}: {e}")),
            })?;
            read.push(Member {
                name,
                dev,
                sb: Box::new(sb),
            });
        }
        let first = &read[0];
        let fsid = first.sb.fsid;
        for m in &read[1..] {
            if !same_filesystem(&first.sb, &m.sb) {
                return Err(Error::Invalid(format!(
                    "{} belongs to filesystem {}, {} to filesystem {}: not one filesystem",
                    first.name,
                    uuid_str(&fsid),
                    m.name,
                    uuid_str(&m.sb.fsid)
                )));
            }
        }
        for m in &read {
            if m.sb.flags.get() & BTRFS_SUPER_FLAG_SEEDING != 0 && !seed_ok {
                return Err(Error::Unsupported(format!(
                    "{} is a seed device (filesystem {}): seed devices are not supported",
                    m.name,
                    uuid_str(&fsid)
                )));
            }
            // The device item's fsid names the filesystem the device was
            // added to (its metadata UUID when it has one: the fsid its
            // tree blocks carry); only a seed's sprouts differ.
            if m.sb.dev_item.fsid != m.sb.tree_fsid() {
                return Err(Error::Invalid(format!(
                    "{}: its device item belongs to filesystem {}, its superblock to {}",
                    m.name,
                    uuid_str(&m.sb.dev_item.fsid),
                    uuid_str(&fsid)
                )));
            }
        }
        let newest = read
            .iter()
            .map(|m| m.sb.generation.get())
            .max()
            .unwrap_or(0);
        // A commit writes the superblocks device by device: a power failure
        // between two leaves some devices one generation behind, which the
        // kernel mounts (from the newest superblock, its latest_dev). Older
        // than that, the device missed whole commits.
        if let Some(old) = read
            .iter()
            .find(|m| m.sb.generation.get().saturating_add(1) < newest)
        {
            let new = read
                .iter()
                .find(|m| m.sb.generation.get() == newest)
                .map_or("", |m| m.name.as_str());
            return Err(Error::Invalid(format!(
                "{} is at generation {}, {} at {newest}: a stale device (left out of later commits)",
                old.name,
                old.sb.generation.get(),
                new
            )));
        }
        let num_devices = first.sb.num_devices.get();
        if let Some(m) = read.iter().find(|m| m.sb.num_devices.get() != num_devices) {
            return Err(Error::Invalid(format!(
                "{} says the filesystem has {} devices, {} says {num_devices}",
                m.name,
                m.sb.num_devices.get(),
                first.name
            )));
        }
        let mut members: BTreeMap<u64, Member> = BTreeMap::new();
        for m in read {
            let id = m.devid();
            if let Some(other) = members.get(&id) {
                return Err(Error::Invalid(format!(
                    "{} and {} are both device {id} of filesystem {}",
                    other.name,
                    m.name,
                    uuid_str(&fsid)
                )));
            }
            members.insert(id, m);
        }
        if members.len() as u64 > num_devices {
            return Err(Error::Invalid(format!(
                "{} devices given, the filesystem {} has {num_devices}",
                members.len(),
                uuid_str(&fsid)
            )));
        }
        Ok(DeviceSet {
            fsid,
            num_devices,
            generation: newest,
            members,
        })
    }

    /// Open the image files or block devices at `paths` (read-only; memory
    /// mapped when `mmap`, else read with positioned reads) and match them
    /// into one filesystem.
    pub fn open_files(paths: &[PathBuf], mmap: bool) -> Result<DeviceSet> {
        Devices::open_paths(
            paths,
            Access {
                writable: false,
                mmap,
            },
        )?
        .set()
    }

    /// The member whose superblock the filesystem is opened from: the
    /// newest generation, the lowest devid among those.
    pub fn primary(&self) -> Option<&Member> {
        self.members
            .values()
            .find(|m| m.sb.generation.get() == self.generation)
    }

    /// Open the filesystem the set holds, from the superblock of its
    /// [`primary`](Self::primary) member ([`Image::open_devices`]).
    pub fn open(&self, opts: OpenOptions) -> Result<Image> {
        let first = self
            .primary()
            .ok_or_else(|| Error::Invalid("no device given".into()))?;
        let others = self
            .members
            .values()
            .filter(|m| m.devid() != first.devid())
            .map(|m| (m.devid(), m.dev.clone()))
            .collect();
        let names = self
            .members
            .iter()
            .map(|(&id, m)| (id, m.name.clone()))
            .collect();
        Image::open_devices(first.dev.clone(), others, names, opts)
    }

    /// Open the filesystem on the devices at `paths` (read-only, memory
    /// mapped): one path as [`Image::open_path`] opens it (any superblock
    /// copy), several matched into one set first.
    pub fn open_paths(paths: &[PathBuf], opts: OpenOptions) -> Result<Image> {
        match paths {
            [] => Err(Error::Invalid("no device given".into())),
            [one] => Image::open_path(one, opts),
            _ => DeviceSet::open_files(paths, true)?.open(opts),
        }
    }

    /// The member with devid `devid`, if present.
    pub fn get(&self, devid: u64) -> Option<&Member> {
        self.members.get(&devid)
    }

    /// Every member, by devid.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// How many devices of the filesystem were not given.
    pub fn missing_count(&self) -> u64 {
        self.num_devices.saturating_sub(self.members.len() as u64)
    }

    /// Of the devids the chunk tree's device items name, those not in
    /// the set, ascending.
    pub fn missing_of(&self, devids: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut v: Vec<u64> = devids
            .into_iter()
            .filter(|d| !self.members.contains_key(d))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Whether two devices' primary superblocks belong to one filesystem:
/// the same fsid and the same fsid in their tree blocks (metadata UUID).
/// While a metadata UUID change is under way on a set
/// (CHANGING_FSID_V2 on both), their fsids may differ: `btrfstune -m`
/// rewrites the superblocks device by device and the tree blocks, which
/// it never touches, still say which filesystem both belong to.
pub(crate) fn same_filesystem(a: &Superblock, b: &Superblock) -> bool {
    let changing = |s: &Superblock| s.flags.get() & BTRFS_SUPER_FLAG_CHANGING_FSID_V2 != 0;
    a.tree_fsid() == b.tree_fsid() && (a.fsid == b.fsid || (changing(a) && changing(b)))
}

/// How the devices at some paths are opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Open them for writing (else read-only).
    pub writable: bool,
    /// Read them through a memory map (read-only only), else with
    /// positioned reads.
    pub mmap: bool,
}

/// How one device given alone is opened; several are always matched
/// into a [`DeviceSet`] first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Single {
    /// Matched as a set of one, as several are: its primary superblock
    /// must be readable, and errors name it.
    AsSet,
    /// Opened as it is, from superblock copy `mirror` of the options.
    Direct,
    /// Opened from copy `mirror` of the options or, when that copy is
    /// unusable (not when the device cannot be read or devices are
    /// missing), from the first later copy that is usable; the error of
    /// the copy asked for when none is.
    AnyMirror,
}

/// A filesystem opened by [`Devices::open`].
pub struct Opened {
    /// The filesystem.
    pub img: Image,
    /// The name of the device whose superblock it was opened from.
    pub name: String,
    /// When [`Single::AnyMirror`] had to use another superblock copy: the
    /// copy used and why the one asked for could not be.
    pub fallback: Option<(usize, Error)>,
}

/// The devices given for one filesystem (image files, block devices, or
/// devices already open), each with the name messages call it by, in the
/// order given: the one way the tools open them as a filesystem, read-only
/// or writable, whole or degraded.
#[derive(Clone)]
pub struct Devices {
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
}

impl Devices {
    /// Devices already open, (name, device).
    pub fn new(devs: Vec<(String, Arc<dyn BlockDevice>)>) -> Devices {
        Devices { devs }
    }

    /// Open the image files or block devices at `paths`, each named by
    /// its path. None is `no device given`.
    pub fn open_paths(paths: &[PathBuf], access: Access) -> Result<Devices> {
        if paths.is_empty() {
            return Err(Error::Invalid("no device given".into()));
        }
        if access.mmap && !access.writable {
            return Ok(Devices::new(FileDevice::open_all_mmap(paths)?));
        }
        let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::with_capacity(paths.len());
        for p in paths {
            devs.push((
                p.display().to_string(),
                Arc::new(FileDevice::open(p, access.writable)?),
            ));
        }
        Ok(Devices::new(devs))
    }

    /// Every device put behind `wrap` (an overlay that keeps writes in
    /// memory, say).
    pub fn wrap(self, wrap: &dyn Fn(Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice>) -> Devices {
        Devices::new(self.devs.into_iter().map(|(n, d)| (n, wrap(d))).collect())
    }

    /// The devices, (name, device), in the order given.
    pub fn list(&self) -> &[(String, Arc<dyn BlockDevice>)] {
        &self.devs
    }

    /// The devices matched into one filesystem by their primary
    /// superblocks ([`DeviceSet::assemble`]).
    pub fn set(&self) -> Result<DeviceSet> {
        DeviceSet::assemble(self.devs.clone())
    }

    /// When `set` (these devices matched) lacks devices of the
    /// filesystem: the error naming the devices given, how many the
    /// filesystem has and how many were not given, ending with `hint`
    /// (what the user can do).
    pub fn missing(&self, set: &DeviceSet, hint: &str) -> Option<Error> {
        let missing = set.missing_count();
        if missing == 0 {
            return None;
        }
        let given = self
            .devs
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Some(Error::MissingDevice {
            devids: Vec::new(),
            what: format!(
                "{given}: the filesystem has {} devices and {missing} {} not given; {hint}",
                set.num_devices,
                if missing == 1 { "was" } else { "were" }
            ),
        })
    }

    /// Open the filesystem the devices hold: several matched into a
    /// [`DeviceSet`] and opened from its primary member's superblock, one
    /// as `single` says. `opts` says writable or not, degraded or not
    /// (devices of the filesystem missing: an error unless degraded),
    /// which superblock copy.
    pub fn open(&self, opts: OpenOptions, single: Single) -> Result<Opened> {
        let one = match self.devs.as_slice() {
            [] => return Err(Error::Invalid("no device given".into())),
            [one] if single != Single::AsSet => one,
            _ => {
                let set = self.set()?;
                let img = set.open(opts)?;
                let name = set.get(img.devid).map(|m| m.name.clone());
                return Ok(Opened {
                    img,
                    name: name.unwrap_or_default(),
                    fallback: None,
                });
            }
        };
        let (name, dev) = (one.0.clone(), one.1.clone());
        let open = |mirror| Image::open(dev.clone(), OpenOptions { mirror, ..opts });
        let asked = match open(opts.mirror) {
            Ok(img) => {
                return Ok(Opened {
                    img,
                    name,
                    fallback: None,
                })
            }
            Err(e) if single == Single::Direct => return Err(e),
            Err(e @ (Error::Io { .. } | Error::MissingDevice { .. })) => return Err(e),
            Err(e) => e,
        };
        for mirror in opts.mirror + 1..BTRFS_SUPER_MIRROR_MAX {
            if let Ok(img) = open(mirror) {
                return Ok(Opened {
                    img,
                    name,
                    fallback: Some((mirror, asked)),
                });
            }
        }
        Err(asked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;
    use zerocopy::IntoBytes;

    /// A fresh filesystem's primary superblock on a device of its own.
    fn fresh() -> Superblock {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::zeroed(256 << 20));
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        read_superblock(dev.as_ref(), 0).unwrap()
    }

    /// A device holding `sb` (checksummed) as its primary superblock.
    fn device(sb: &Superblock) -> Arc<dyn BlockDevice> {
        let dev = MemDevice::zeroed(1 << 20);
        let mut bytes = sb.as_bytes().to_vec();
        let csum = crate::csum::CsumType::from_disk(sb.csum_type.get()).unwrap();
        let c = crate::csum::block_csum(csum, &bytes);
        bytes[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        dev.write_at(BTRFS_SUPER_INFO_OFFSET, &bytes).unwrap();
        Arc::new(dev)
    }

    /// Superblocks of a set of `n` devices of one filesystem.
    fn set_of(n: u64) -> Vec<Superblock> {
        let base = fresh();
        (1..=n)
            .map(|id| {
                let mut sb = base;
                sb.num_devices.set(n);
                sb.dev_item.devid.set(id);
                sb
            })
            .collect()
    }

    fn assemble(sbs: &[Superblock]) -> Result<DeviceSet> {
        DeviceSet::assemble(
            sbs.iter()
                .enumerate()
                .map(|(i, sb)| (format!("d{i}.img"), device(sb)))
                .collect(),
        )
    }

    fn message(r: Result<DeviceSet>) -> String {
        match r {
            Ok(_) => panic!("assembled"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_whole_set_and_a_partial_one() {
        let sbs = set_of(3);
        let s = assemble(&sbs).unwrap();
        assert_eq!(s.missing_count(), 0);
        assert_eq!(
            s.members().map(Member::devid).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        // Given in any order, matched by devid.
        let s = assemble(&[sbs[2], sbs[0]]).unwrap();
        assert_eq!(s.missing_count(), 1);
        assert_eq!(s.missing_of([1, 2, 3]), [2]);
        assert_eq!(s.get(3).unwrap().name, "d0.img");
    }

    #[test]
    fn what_does_not_form_one_filesystem_is_named() {
        let sbs = set_of(2);
        let mut foreign = sbs[1];
        foreign.fsid[0] ^= 1;
        foreign.dev_item.fsid = foreign.fsid;
        let m = message(assemble(&[sbs[0], foreign]));
        assert!(
            m.contains("d1.img") && m.contains("not one filesystem"),
            "{m}"
        );

        let m = message(assemble(&[sbs[0], sbs[0]]));
        assert!(m.contains("both device 1"), "{m}");

        // One generation behind: the last commit's superblock writes
        // reached the other device only; the set opens from the newest.
        let mut behind = sbs[1];
        behind.generation.set(sbs[1].generation.get() - 1);
        let set = assemble(&[sbs[0], behind]).unwrap();
        assert_eq!(set.primary().map(Member::devid), Some(1));
        let mut first_behind = sbs[0];
        first_behind.generation.set(sbs[0].generation.get() - 1);
        let set = assemble(&[first_behind, sbs[1]]).unwrap();
        assert_eq!(set.primary().map(Member::devid), Some(2));
        let mut stale = sbs[1];
        stale.generation.set(sbs[1].generation.get() - 2);
        let m = message(assemble(&[sbs[0], stale]));
        assert!(
            m.contains("d1.img is at generation") && m.contains("stale"),
            "{m}"
        );

        let mut seed = sbs[1];
        seed.flags.set(seed.flags.get() | BTRFS_SUPER_FLAG_SEEDING);
        assert!(matches!(
            assemble(&[sbs[0], seed]),
            Err(Error::Unsupported(_))
        ));

        let mut three = set_of(3);
        three[1].num_devices.set(2);
        let m = message(assemble(&three));
        assert!(m.contains("has 2 devices"), "{m}");

        let mut one = set_of(1);
        one.push(one[0]);
        one[1].dev_item.devid.set(2);
        let m = message(assemble(&one));
        assert!(m.contains("2 devices given"), "{m}");

        let junk: Arc<dyn BlockDevice> = Arc::new(MemDevice::zeroed(1 << 20));
        let r = DeviceSet::assemble(vec![("junk.img".into(), junk)]);
        assert!(matches!(r, Err(Error::NotBtrfs(ref m)) if m.starts_with("junk.img")));
        assert!(DeviceSet::assemble(Vec::new()).is_err());
    }
}
