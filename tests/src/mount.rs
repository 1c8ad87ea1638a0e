//! The one loop-mount helper of the tests: [`LoopMount`].
//!
//! A [`LoopMount`] attaches an image file to a loop device (`losetup --find
//! --show`, retried: parallel tests race for the same free device) and
//! mounts it as btrfs with the options given as one comma list, the way
//! `mount -o` takes them. A `device=FILE` option naming a regular file
//! attaches that file too and passes its loop device instead, so a
//! multi-device filesystem mounts as
//! `LoopMount::new(&a, &format!("device={}", b.display()))`; a `device=`
//! naming a block device is passed as it is.
//!
//! Dropping the guard, also while a test panics, unmounts (retrying while
//! the kernel reports the mount busy, lazily as a last resort), detaches
//! every loop device it attached, and removes the mount point when the
//! guard made it. [`LoopMount::unmount`] does the same now and says what
//! went wrong.
//!
//! The free functions are the probes the tests need around it: whether a
//! path is a mount point, which loop devices a file is attached to, whether
//! this machine can loop-mount at all.

use crate::sys::run;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Attach `file` to a free loop device and return the device. Two processes
/// can race for the same free device, so a failure is retried with a
/// growing pause.
///
/// The device's page cache is dropped once attached: a loop device just
/// detached from another file can still serve that file's blocks to
/// buffered readers (btrfs check reads `/dev/loopN` through the page cache)
/// when something read it while it was being switched; parallel tests
/// attach and detach constantly.
pub fn attach_loop(file: &Path) -> Result<PathBuf, String> {
    let mut last = String::new();
    for attempt in 0..20u64 {
        match run(Command::new("losetup").args(["--find", "--show"]).arg(file)) {
            Ok(out) => {
                let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if dev.starts_with("/dev/") {
                    let _ = run(Command::new("blockdev").arg("--flushbufs").arg(&dev));
                    return Ok(PathBuf::from(dev));
                }
                last = format!("losetup printed {dev:?}");
            }
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50 * (attempt + 1)));
    }
    Err(format!(
        "cannot attach {} to a loop device: {last}",
        file.display()
    ))
}

/// Have the kernel forget a btrfs registration under `dev` (`btrfs
/// device scan --forget`; refused, harmlessly, while it is mounted).
fn forget_registration(dev: &Path) {
    let _ = Command::new("btrfs")
        .args(["device", "scan", "--forget"])
        .arg(dev)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Detach a loop device, retrying while it fails. A device still busy (a
/// lazy unmount still holds it) is marked autoclear by the kernel and freed
/// on last close; one already gone (autoclear raced us) counts as detached.
///
/// The kernel is first told to forget a btrfs registration under the
/// device: a set's member left registered under a loop device that then
/// goes to another image is one the kernel tries again at a degraded mount
/// of that set's fsid.
pub fn detach_loop(dev: &Path) -> Result<(), String> {
    forget_registration(dev);
    let file = loop_backing_file(dev);
    let mut last = String::new();
    for _ in 0..30 {
        match run(Command::new("losetup").arg("-d").arg(dev)) {
            Ok(_) => {
                wait_released(dev, file.as_deref());
                return Ok(());
            }
            Err(e) if e.contains("No such device") => return Ok(()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("cannot detach {}: {last}", dev.display()))
}

/// `losetup -d` of a device something still holds open (udev probing a
/// device just attached, a scan) only marks it to go when that closes. Until
/// then a btrfs scan still finds the image behind it: a copy of a set with
/// the same fsid and devids, checked right after, could be assembled from
/// the device of the copy before. Wait (bounded) until the device no longer
/// shows `file`; it may already show another test's image.
fn wait_released(dev: &Path, file: Option<&Path>) {
    let Some(file) = file else { return };
    for _ in 0..100 {
        if loop_backing_file(dev).as_deref() != Some(file) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The loop devices `file` is attached to (`losetup -j`, which compares
/// device and inode, not names); empty when none or when losetup fails.
pub fn loop_devices_of(file: &Path) -> Vec<PathBuf> {
    let Ok(o) = run(Command::new("losetup").arg("-j").arg(file)) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| PathBuf::from(dev.trim())))
        .filter(|d| d.starts_with("/dev/"))
        .collect()
}

/// The file behind loop device `dev`, while it is attached.
pub fn loop_backing_file(dev: &Path) -> Option<PathBuf> {
    let name = dev.file_name()?.to_string_lossy().to_string();
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(s.trim()))
}

/// `/proc/self/mountinfo` escapes space, tab, newline and backslash in
/// paths as three octal digits.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount options (per-mount, then per-superblock) of the mount at `p`,
/// the last one when several are stacked there; None when nothing is.
fn mountinfo_options(p: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut want = vec![p.to_string_lossy().into_owned()];
    if let Ok(c) = p.canonicalize() {
        want.push(c.to_string_lossy().into_owned());
    }
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let mnt = unescape_mountinfo(f.get(4)?);
        if !want.contains(&mnt) {
            return None;
        }
        // Fields after the optional ones: "- fstype source super_options".
        let sep = f.iter().position(|x| *x == "-")?;
        Some(format!("{},{}", f.get(5)?, f.get(sep + 3).unwrap_or(&"")))
    })
}

/// Whether something is mounted at `p` (read from `/proc/self/mountinfo`).
pub fn is_mount_point(p: &Path) -> bool {
    mountinfo_options(p).is_some()
}

/// Whether this machine can loop-mount a btrfs image: root, loop devices (a
/// scratch file is attached and detached) and btrfs in the kernel (loaded
/// when it is a module). Probed once per process; `Err` says what is
/// missing. See [`crate::env::require_loop`] for the skipping form.
pub fn probe() -> Result<(), String> {
    static P: OnceLock<Result<(), String>> = OnceLock::new();
    P.get_or_init(|| {
        if !crate::sys::is_root() {
            return Err("not root, cannot set up loop devices".into());
        }
        if !Path::new("/dev/loop-control").exists() {
            return Err("/dev/loop-control missing".into());
        }
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let f = dir.path().join("probe.img");
        let file = std::fs::File::create(&f).map_err(|e| format!("create probe file: {e}"))?;
        file.set_len(1 << 20)
            .map_err(|e| format!("probe file: {e}"))?;
        let dev = attach_loop(&f).map_err(|e| format!("losetup failed: {e}"))?;
        detach_loop(&dev).map_err(|e| format!("losetup failed: {e}"))?;
        let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !fs.contains("btrfs") && run(Command::new("modprobe").arg("btrfs")).is_err() {
            return Err("kernel has no btrfs support".into());
        }
        Ok(())
    })
    .clone()
}

/// The kernel's last complaints about a device (why a mount failed), as
/// "; kernel: ..." or nothing. Other runs may log meanwhile, so only lines
/// naming the device count.
fn kernel_says(dev: &Path) -> String {
    let name = dev.file_name().map_or_else(
        || dev.to_string_lossy().into_owned(),
        |n| n.to_string_lossy().into_owned(),
    );
    let tag = format!("(device {name})");
    let Ok(o) = Command::new("dmesg").stdin(Stdio::null()).output() else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&tag) && (l.contains("critical") || l.contains("error")))
        .map(|l| l.split_once("] ").map_or(l, |(_, r)| r))
        .collect();
    let mut last: Vec<&str> = lines.iter().rev().take(3).copied().collect();
    last.reverse();
    if last.is_empty() {
        String::new()
    } else {
        format!("; kernel: {}", last.join(" / "))
    }
}

/// A btrfs image attached to a loop device and mounted; see the module
/// documentation. Dropping it unmounts and detaches, so a panicking test
/// leaves nothing behind.
pub struct LoopMount {
    mnt: PathBuf,
    /// The image file mounted (the first device).
    image: PathBuf,
    /// Every loop device this guard attached: the mounted one first, then
    /// those of `device=FILE` options.
    devs: Vec<PathBuf>,
    /// The options as passed to mount (`device=` files replaced by their
    /// loop devices).
    opts: String,
    mounted: bool,
    /// The mount point did not exist before: removed again on release.
    made_mnt: bool,
    /// The temporary mount point of [`LoopMount::new`], removed after the
    /// release.
    tmp: Option<tempfile::TempDir>,
}

impl LoopMount {
    /// Mount `image` with `opts` (a comma list, may be empty) at a new
    /// temporary directory, removed again on drop.
    pub fn new(image: &Path, opts: &str) -> Result<LoopMount, String> {
        let tmp = tempfile::Builder::new()
            .prefix("btrkit-mnt-")
            .tempdir()
            .map_err(|e| format!("mount point for {}: {e}", image.display()))?;
        let mut m = LoopMount::mount(image, tmp.path(), opts)?;
        m.tmp = Some(tmp);
        Ok(m)
    }

    /// Mount `image` with `opts` (a comma list, may be empty) at `mnt`,
    /// created when missing (and then removed again on unmount).
    ///
    /// A failed mount is retried, on a fresh loop device, only when the
    /// kernel reports a busy or racing device; a refused filesystem fails at
    /// once, with the kernel's complaints about the device in the error.
    pub fn mount(image: &Path, mnt: &Path, opts: &str) -> Result<LoopMount, String> {
        let made = !mnt.exists();
        std::fs::create_dir_all(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        let r = Self::try_mount(image, mnt, opts);
        match r {
            Ok(mut m) => {
                m.made_mnt = made;
                Ok(m)
            }
            Err(e) => {
                if made {
                    let _ = std::fs::remove_dir(mnt);
                }
                Err(e)
            }
        }
    }

    fn try_mount(image: &Path, mnt: &Path, opts: &str) -> Result<LoopMount, String> {
        let mut last = String::new();
        for attempt in 0..8u64 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(150 * attempt));
            }
            // From here the guard owns every loop device it attaches,
            // mounted or not: dropping it detaches them.
            let mut g = LoopMount {
                mnt: mnt.to_path_buf(),
                image: image.to_path_buf(),
                devs: Vec::new(),
                opts: String::new(),
                mounted: false,
                made_mnt: false,
                tmp: None,
            };
            let mut o = Vec::new();
            for opt in opts.split(',').filter(|s| !s.is_empty()) {
                match opt.strip_prefix("device=") {
                    Some(f) if Path::new(f).is_file() => {
                        let dev = attach_loop(Path::new(f))?;
                        o.push(format!("device={}", dev.display()));
                        g.devs.push(dev);
                    }
                    _ => o.push(opt.to_string()),
                }
            }
            let dev = attach_loop(image)?;
            g.devs.insert(0, dev.clone());
            g.opts = o.join(",");
            // A loop device number is reused: the kernel may still hold a
            // registration of another filesystem under it (it then
            // refuses the mount: "fsid doesn't match fsid of
            // fs_devices"). Forget whatever it holds for these devices.
            for d in &g.devs {
                forget_registration(d);
            }
            let mut cmd = Command::new("mount");
            cmd.args(["-t", "btrfs"]);
            if !g.opts.is_empty() {
                cmd.args(["-o", &g.opts]);
            }
            match run(cmd.arg(&dev).arg(mnt)) {
                Ok(_) => {
                    g.mounted = true;
                    return Ok(g);
                }
                Err(e) => {
                    last = format!(
                        "mount -t btrfs -o {} {} ({}) at {}: {e}{}",
                        g.opts,
                        image.display(),
                        dev.display(),
                        mnt.display(),
                        kernel_says(&dev)
                    );
                }
            }
            drop(g);
            // Only a busy or racing device is worth another try; a refused
            // filesystem is refused again.
            if !(last.contains("busy")
                || last.contains("already")
                || last.contains("No such device"))
            {
                break;
            }
        }
        Err(last)
    }

    /// The mount point (the filesystem's root while mounted).
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The image file mounted.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The loop device mounted.
    pub fn device(&self) -> &Path {
        &self.devs[0]
    }

    /// Every loop device of the mount: the mounted one, then those attached
    /// for `device=` options.
    pub fn devices(&self) -> &[PathBuf] {
        &self.devs
    }

    /// The options passed to mount (`device=` files given as their loop
    /// devices).
    pub fn options(&self) -> &str {
        &self.opts
    }

    /// Whether the mount is still there (read from the kernel's mount table,
    /// so an unmount behind the guard's back shows).
    pub fn is_mounted(&self) -> bool {
        self.mounted && is_mount_point(&self.mnt)
    }

    /// Whether the kernel has the filesystem mounted read-only (asked with
    /// `ro`, remounted so, or forced so after an error).
    pub fn is_read_only(&self) -> bool {
        self.mounted
            && mountinfo_options(&self.mnt).is_some_and(|o| o.split(',').any(|x| x == "ro"))
    }

    /// `mount -o remount,OPTS`: change the options of the live mount (`ro`,
    /// `rw`, `commit=N`, ...) without unmounting.
    pub fn remount(&mut self, opts: &str) -> Result<(), String> {
        if !self.mounted {
            return Err(format!("{} is not mounted", self.mnt.display()));
        }
        let o = if opts.is_empty() {
            "remount".to_string()
        } else {
            format!("remount,{opts}")
        };
        run(Command::new("mount").args(["-o", &o]).arg(&self.mnt))
            .map_err(|e| format!("{e}{}", kernel_says(&self.devs[0])))?;
        Ok(())
    }

    /// Unmount and detach now, reporting failure (Drop can only try): a
    /// mount that stayed busy (then unmounted lazily) or a loop device that
    /// would not detach.
    pub fn unmount(mut self) -> Result<(), String> {
        self.release()
    }

    fn release(&mut self) -> Result<(), String> {
        let mut err = None;
        if self.mounted {
            let mut ok = false;
            let mut last = String::new();
            for i in 0..60 {
                match run(Command::new("umount").arg(&self.mnt)) {
                    Ok(_) => {
                        ok = true;
                        break;
                    }
                    Err(e) => last = e,
                }
                // Unmounted behind our back: nothing left to do.
                if !is_mount_point(&self.mnt) {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(if i < 10 { 100 } else { 500 }));
            }
            if !ok {
                let _ = run(Command::new("umount").arg("-l").arg(&self.mnt));
                err = Some(format!(
                    "umount {}: {last} (lazily unmounted)",
                    self.mnt.display()
                ));
            }
            self.mounted = false;
        }
        for dev in std::mem::take(&mut self.devs) {
            if let Err(e) = detach_loop(&dev) {
                err.get_or_insert(e);
            }
        }
        if is_mount_point(&self.mnt) {
            // Never delete a directory a filesystem is still mounted on: the
            // removal would descend into it.
            if let Some(t) = self.tmp.take() {
                let _ = t.keep();
            }
            err.get_or_insert(format!("{} is still mounted", self.mnt.display()));
        } else if self.made_mnt {
            let _ = std::fs::remove_dir(&self.mnt);
        }
        self.made_mnt = false;
        err.map_or(Ok(()), Err)
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("warning: {e}");
        }
    }
}

impl std::fmt::Debug for LoopMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopMount")
            .field("image", &self.image)
            .field("mnt", &self.mnt)
            .field("devs", &self.devs)
            .field("opts", &self.opts)
            .field("mounted", &self.mounted)
            .finish()
    }
}

/// A `btrkit-mount` FUSE mount (started as a user starts it: it returns
/// once the mount is up and serves from a process of its own); dropping
/// it unmounts with `fusermount3 -u`, as a user would.
pub struct FuseMount {
    mnt: PathBuf,
    mounted: bool,
}

impl FuseMount {
    /// Mount `images` (with `args` after them) on `mnt` (made if missing).
    pub fn mount(images: &[&Path], mnt: &Path, args: &[&str]) -> Result<FuseMount, String> {
        std::fs::create_dir_all(mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        let o = Command::new(crate::bin_path("btrkit-mount"))
            .args(images)
            .arg(mnt)
            .args(args)
            .output()
            .map_err(|e| format!("btrkit-mount: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "btrkit-mount {args:?} exit {:?}: {}",
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(FuseMount {
            mnt: mnt.to_path_buf(),
            mounted: true,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// Unmount now, waiting until the serving process is gone (its mount
    /// point no longer listed), so the image is free afterwards.
    pub fn unmount(mut self) -> Result<(), String> {
        self.release()
    }

    fn release(&mut self) -> Result<(), String> {
        if !self.mounted {
            return Ok(());
        }
        self.mounted = false;
        // Busy for a moment when another thread of the test forks while
        // a file of the mount is open (the child holds it until its exec):
        // retried, as the loop mounts are.
        let mut tries = 0;
        let o = loop {
            let o = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output()
                .map_err(|e| format!("fusermount3: {e}"))?;
            tries += 1;
            if o.status.success()
                || tries >= 50
                || !String::from_utf8_lossy(&o.stderr).contains("busy")
            {
                break o;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if !o.status.success() {
            // Busy: detach it lazily so nothing is left mounted.
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
            return Err(format!(
                "fusermount3 -u {}: {}",
                self.mnt.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(())
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("warning: {e}");
        }
    }
}

/// FUSE can be used here: /dev/fuse and fusermount3 (package fuse3).
pub fn fuse_probe() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse missing".into());
    }
    match Command::new("fusermount3").arg("-V").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("fusermount3 not found (package fuse3)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/x\\134y\\011"), "/x\\y\t");
        assert_eq!(unescape_mountinfo("/end\\04"), "/end\\04");
    }
}
