//! Changing an unmounted image as btrfs(8) changes a mounted filesystem:
//! the devices are opened read-write (refusing any a mount uses), mounted
//! by the engine (a pending log replayed, orphans cleaned, deleted
//! subvolumes dropped), changed, and committed. What the `btrkit` commands
//! that write (balance, resize) stand on.

use crate::fs::{Filesystem, MountOptions};
use crate::io::{BlockDevice, FileDevice};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An image (or a device set) mounted by the engine for a change.
pub struct Offline {
    fs: Filesystem,
    /// (devid, path) of every device given.
    devices: Vec<(u64, PathBuf)>,
}

/// The devid each path's superblock names, checking none is in use by a
/// mount.
fn devids(paths: &[PathBuf]) -> Result<Vec<(u64, PathBuf)>> {
    if paths.is_empty() {
        return Err(Error::Invalid("no image given".into()));
    }
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        if let Some(why) = crate::tune::guard::in_use(p)? {
            return Err(Error::Unsupported(format!(
                "{} is in use ({why}): btrkit changes filesystems offline only; unmount it first",
                p.display()
            )));
        }
        let dev = FileDevice::open(p, false)?;
        let sb = crate::image::read_superblock(&dev, 0)
            .map_err(|e| Error::Invalid(format!("{}: not a btrfs image: {e}", p.display())))?;
        out.push((sb.dev_item.devid.get(), p.clone()));
    }
    Ok(out)
}

impl Offline {
    /// Open and mount the filesystem on `paths` (every device of a set).
    pub fn open(paths: &[PathBuf]) -> Result<Offline> {
        Offline::open_with(paths, false)
    }

    /// [`Offline::open`] with devices of the set missing (a replace of a
    /// missing device): chunks go where the devices present allow.
    pub fn open_degraded(paths: &[PathBuf]) -> Result<Offline> {
        Offline::open_with(paths, true)
    }

    fn open_with(paths: &[PathBuf], degraded: bool) -> Result<Offline> {
        let devices = devids(paths)?;
        let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::with_capacity(paths.len());
        for (_, p) in &devices {
            devs.push((
                p.display().to_string(),
                Arc::new(FileDevice::open(p, true)?),
            ));
        }
        check_writable(&devs)?;
        // Paths name things from the top level, whatever the default.
        let opts = MountOptions::parse(&["subvolid=5"])?;
        let mut fs = crate::log::replay::mount_devices(devs, opts, degraded)?;
        fs.subvols().drop_deleted_now()?;
        // Data writes go to the devices on a thread of their own while
        // the next reads are served (a relocation copies both ways).
        fs.store.data().start_data_writer()?;
        Ok(Offline { fs, devices })
    }

    /// The mounted filesystem.
    pub fn fs(&mut self) -> &mut Filesystem {
        &mut self.fs
    }

    /// (devid, path) of every device given.
    pub fn devices(&self) -> &[(u64, PathBuf)] {
        &self.devices
    }

    /// The path of device `devid`, when it was given.
    pub fn path_of(&self, devid: u64) -> Option<&Path> {
        self.devices
            .iter()
            .find(|(d, _)| *d == devid)
            .map(|(_, p)| p.as_path())
    }

    /// Unmount: everything written back and committed.
    pub fn close(mut self) -> Result<()> {
        self.fs.close_all()?;
        self.fs.sync()
    }
}

/// Refuse, before anything is written (a log replay, an orphan cleanup),
/// a filesystem with compat_ro features the engine does not know: the
/// kernel mounts those read-only only.
pub fn check_writable(devs: &[(String, Arc<dyn BlockDevice>)]) -> Result<()> {
    use crate::format::consts::SUPPORTED_COMPAT_RO;
    for (name, dev) in devs {
        let sb = crate::image::read_superblock(dev.as_ref(), 0)
            .map_err(|e| Error::Invalid(format!("{name}: not a btrfs image: {e}")))?;
        let unknown = sb.compat_ro_flags.get() & !SUPPORTED_COMPAT_RO;
        if unknown != 0 {
            return Err(Error::Unsupported(format!(
                "{name}: compat_ro feature flags 0x{unknown:x} unknown to btrkit: it reads this filesystem but does not write it"
            )));
        }
    }
    Ok(())
}

/// `btrfs filesystem resize SPEC` on the image files or devices `paths`:
/// an image file grown to the new size first (sparse), the filesystem
/// resized, and an image file cut to the new size once that is
/// committed. `progress(done, total)` counts relocated block groups.
pub fn resize_images(
    paths: &[PathBuf],
    spec: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<crate::resize::Report> {
    let (devid, change) = crate::resize::parse_spec(spec)?;
    let devid = devid.unwrap_or(1);
    let devices = devids(paths)?;
    let path = devices
        .iter()
        .find(|(d, _)| *d == devid)
        .map(|(_, p)| p.clone())
        .ok_or_else(|| Error::Invalid(format!("device {devid} is not among the images given")))?;
    let meta = std::fs::metadata(&path).map_err(|e| Error::io(path.display().to_string(), e))?;
    let is_file = meta.is_file();
    let (old, sectorsize) = {
        let dev = FileDevice::open(&path, false)?;
        let sb = crate::image::read_superblock(&dev, 0)?;
        (sb.dev_item.total_bytes.get(), sb.sectorsize.get() as u64)
    };
    let dev_size = FileDevice::open(&path, false)?.size();
    let new = crate::resize::target_size(change, old, dev_size, sectorsize)?;
    if new > dev_size {
        if !is_file {
            return Err(Error::Invalid(format!(
                "{} holds {dev_size} bytes, less than the new size {new}",
                path.display()
            )));
        }
        set_file_size(&path, new, "extending")?;
    }
    let mut o = Offline::open(paths)?;
    let report = crate::resize::resize(&mut o.fs().store, devid, new, progress)?;
    o.close()?;
    if is_file && new < dev_size {
        set_file_size(&path, new, "cutting")?;
    }
    Ok(report)
}

/// Make the image file at `path` `size` bytes long, durably (`what` it
/// is doing, for the error).
fn set_file_size(path: &Path, size: u64, what: &str) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path.display().to_string(), e))?;
    f.set_len(size)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(format!("{what} {}", path.display()), e))
}
