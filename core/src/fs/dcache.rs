//! The dentry cache: which inode a name in a directory leads to, as path
//! walks found it or a create made it (d_instantiate), so a walk down a
//! path it has taken before does not search the trees again for each
//! component (the kernel's dcache, positive dentries only).
//!
//! Invariant: an entry is what `Filesystem::lookup` of the name would
//! give now, with the file type of the inode. Adding a name changes no
//! entry; removing or moving one (unlink, rmdir, rename, a subvolume's
//! entry going) clears the whole cache, as does `drop_caches`, so no
//! entry outlives the name it caches. An inode's type never changes, so
//! the mode kept answers "directory?" and "symlink?" for as long as the
//! entry lives (its permission bits may be stale: nothing reads them
//! here). Symlinks (a walk must read their target) and the
//! empty-subvolume placeholder (its item is made up at every lookup) are
//! never kept.

use super::filesystem::Loc;
use crate::util::hash::FastMap as HashMap;

/// Names cached before the cache is emptied and starts again.
const MAX_ENTRIES: usize = 1 << 14;

/// (directory, name) -> (inode it leads to, its mode).
#[derive(Default)]
pub struct DentryCache {
    map: HashMap<Loc, HashMap<Box<[u8]>, (Loc, u32)>>,
    len: usize,
}

impl DentryCache {
    /// The inode `name` in `dir` leads to, with its mode, if cached.
    pub fn get(&self, dir: Loc, name: &[u8]) -> Option<(Loc, u32)> {
        self.map.get(&dir)?.get(name).copied()
    }

    /// Remember that `name` in `dir` leads to `to` (mode `mode`).
    pub fn insert(&mut self, dir: Loc, name: &[u8], to: Loc, mode: u32) {
        if to.is_placeholder() || super::inode::is_symlink(mode) {
            return;
        }
        if self.len >= MAX_ENTRIES {
            self.clear();
        }
        if self
            .map
            .entry(dir)
            .or_default()
            .insert(name.into(), (to, mode))
            .is_none()
        {
            self.len += 1;
        }
    }

    /// Forget everything (a name went or moved; `drop_caches`).
    pub fn clear(&mut self) {
        if self.len > 0 {
            self.map.clear();
            self.len = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_names_until_cleared() {
        let mut c = DentryCache::default();
        let d = Loc::new(5, 256);
        let e = Loc::new(5, 257);
        assert_eq!(c.get(d, b"a"), None);
        c.insert(d, b"a", e, 0o40755);
        assert_eq!(c.get(d, b"a"), Some((e, 0o40755)));
        assert_eq!(c.get(d, b"b"), None);
        assert_eq!(c.get(e, b"a"), None);
        c.clear();
        assert_eq!(c.get(d, b"a"), None);
    }

    fn fresh() -> crate::fs::Filesystem {
        let dev: std::sync::Arc<dyn crate::io::BlockDevice> =
            std::sync::Arc::new(crate::io::MemDevice::zeroed(256 << 20));
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        crate::fs::Filesystem::mount(dev, Default::default(), crate::log::LogState::boxed())
            .unwrap()
    }

    /// Path walks through cached directories see every later change of
    /// the names they cached.
    #[test]
    fn walks_follow_name_changes() {
        let mut fs = fresh();
        let root = fs.root();
        let a = fs.mkdir(root, b"a", 0o755).unwrap();
        fs.mkdir(a, b"b", 0o755).unwrap();
        let f = fs.create(a, b"f", 0o644).unwrap();
        assert_eq!(fs.resolve("/a/f", true).unwrap(), f);
        assert!(fs.dcache.get(root, b"a").is_some());
        // rename away, a new directory under the old name
        fs.rename(root, b"a", root, b"old").unwrap();
        assert!(fs.resolve("/a/f", true).is_err());
        let a2 = fs.mkdir(root, b"a", 0o755).unwrap();
        assert_ne!(a2, a);
        assert!(fs.resolve("/a/f", true).is_err());
        assert_eq!(fs.resolve("/old/f", true).unwrap(), f);
        let f2 = fs.create(a2, b"f", 0o644).unwrap();
        assert_eq!(fs.resolve("/a/f", true).unwrap(), f2);
        // rmdir and a file under the old name
        fs.rmdir(a, b"b").unwrap();
        assert_eq!(
            fs.resolve_parent("/old/b/x")
                .map(|_| ())
                .unwrap_err()
                .as_errno(),
            libc::ENOENT
        );
        let fb = fs.create(a, b"b", 0o644).unwrap();
        assert_eq!(fs.resolve("/old/b", true).unwrap(), fb);
        assert_eq!(
            fs.resolve_parent("/old/b/x")
                .map(|_| ())
                .unwrap_err()
                .as_errno(),
            libc::ENOTDIR
        );
        // a symlink to a directory is followed, never cached; files are
        fs.symlink(root, b"s", b"/old").unwrap();
        assert_eq!(fs.resolve("/s/f", true).unwrap(), f);
        assert!(fs.dcache.get(root, b"s").is_none());
        assert!(fs.dcache.get(a, b"f").is_some());
        // drop_caches empties it
        fs.evict();
        assert!(fs.dcache.get(root, b"old").is_none());
        assert_eq!(fs.resolve("/old/f", true).unwrap(), f);
    }

    #[test]
    fn bounded() {
        let mut c = DentryCache::default();
        let d = Loc::new(5, 256);
        for i in 0..MAX_ENTRIES as u64 + 10 {
            c.insert(d, &i.to_le_bytes(), Loc::new(5, 300 + i), 0o40755);
        }
        assert!(c.len <= MAX_ENTRIES);
    }
}
