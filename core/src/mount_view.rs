//! A read-only view of a virtually opened filesystem for `btrkit-mount`:
//! the operations a FUSE server answers (lookup, getattr, readdir, read,
//! readlink, xattrs, statfs), keyed by node ids instead of [`Loc`]s.
//!
//! FUSE names every inode by one 64-bit node id for as long as the kernel
//! holds it; Btrfs names it by (subvolume, inode number). The view hands
//! out one id per inode and keeps the mapping both ways, so two names of
//! a hard-linked file are one inode to the kernel, as on a real mount.
//! Ids are never reused: the filesystem does not change while mounted.

use crate::format::consts::BTRFS_FT_DIR;
use crate::fs::ops::Stat;
use crate::fs::{Filesystem, Loc};
use crate::io::BlockDevice;
use crate::restore::{open_virtual, ReadOptions};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// The node id FUSE gives the mount's root directory.
pub const ROOT_NODE: u64 = 1;
/// Node ids of inodes outside the start subvolume start here, above any
/// inode number a Btrfs tree hands out in practice (the allocator counts
/// up from 256). FUSE shows the node id as `st_ino`: inodes of the start
/// subvolume keep their Btrfs numbers (its root shows as 1), and the
/// numbers stay unique across the whole mount, which has one `st_dev`
/// (on the kernel's mount each subvolume has its own), so `find` and
/// `du` still tell inodes apart.
const FOREIGN_BASE: u64 = 1 << 56;

/// The node ids a mount hands out, both ways: the start subvolume's
/// inodes keep their numbers (its root is [`ROOT_NODE`]), others get ids
/// from [`FOREIGN_BASE`] up. An id is never reused: Btrfs does not reuse
/// an inode number within a mount, and foreign ids only count up.
pub(crate) struct NodeIds {
    start: Loc,
    locs: HashMap<u64, Loc>,
    nodes: HashMap<Loc, u64>,
    next_foreign: u64,
}

impl NodeIds {
    /// The ids of a mount whose root is `start`.
    pub(crate) fn new(start: Loc) -> NodeIds {
        NodeIds {
            start,
            locs: HashMap::from([(ROOT_NODE, start)]),
            nodes: HashMap::from([(start, ROOT_NODE)]),
            next_foreign: FOREIGN_BASE,
        }
    }

    /// The id of `l`, handed out on first sight.
    pub(crate) fn node_of(&mut self, l: Loc) -> u64 {
        if let Some(&n) = self.nodes.get(&l) {
            return n;
        }
        let own = l.subvol == self.start.subvol
            && !l.is_placeholder()
            && l.ino > ROOT_NODE
            && l.ino < FOREIGN_BASE;
        let n = if own {
            l.ino
        } else {
            self.next_foreign += 1;
            self.next_foreign
        };
        self.locs.insert(n, l);
        self.nodes.insert(l, n);
        n
    }

    /// The id of `l` if one was handed out.
    pub(crate) fn known(&self, l: Loc) -> Option<u64> {
        self.nodes.get(&l).copied()
    }

    /// The inode behind id `node` (ESTALE for an id never handed out).
    pub(crate) fn loc(&self, node: u64) -> Result<Loc> {
        self.locs
            .get(&node)
            .copied()
            .ok_or_else(|| Error::errno(libc::ESTALE, format!("unknown node {node}")))
    }
}

/// One directory entry as readdir lists it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its name.
    pub name: Vec<u8>,
    /// The node id of the inode it names.
    pub node: u64,
    /// File type from the entry (BTRFS_FT_*).
    pub ftype: u8,
}

/// Space figures for statfs, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Space {
    /// Size of the filesystem (every device).
    pub total: u64,
    /// Bytes allocated to extents.
    pub used: u64,
    /// The block size reported (the sector size).
    pub block: u32,
}

/// The filesystem behind a read-only mount.
pub struct ReadOnlyView {
    fs: Filesystem,
    /// Node id <-> inode.
    ids: NodeIds,
    /// The directory a node was found in (for readdir's "..").
    parents: HashMap<u64, u64>,
    /// Open directories: handle -> entries, so a listing read in several
    /// calls is one consistent snapshot, read once.
    open_dirs: HashMap<u64, Arc<Vec<Entry>>>,
    next_handle: u64,
    /// Damage read around since the last [`take_warnings`](Self::take_warnings).
    warnings: Vec<String>,
    /// Directories and files whose inode item is lost: the attributes
    /// shown instead.
    lost_dirs: HashMap<u64, Stat>,
}

/// The generation a stand-in directory's attributes carry (no real inode
/// has it: generations start at 1).
const LOST: u64 = 0;

/// Attributes for a directory whose inode item cannot be read.
fn lost_dir_stat(l: Loc) -> Stat {
    Stat {
        subvol: l.subvol,
        ino: l.ino,
        mode: libc::S_IFDIR | 0o555,
        nlink: 1,
        generation: LOST,
        ..Default::default()
    }
}

impl ReadOnlyView {
    /// Open `devs` as [`open_virtual`] does (nothing is written to them)
    /// and serve the tree under `subvol` (the default subvolume when
    /// `None`), its metadata read ahead when `warm`.
    pub fn open(
        devs: Vec<(String, Arc<dyn BlockDevice>)>,
        o: &ReadOptions,
        subvol: Option<&str>,
        warm: bool,
    ) -> Result<ReadOnlyView> {
        let mut fs = open_virtual(devs, o)?;
        let start = crate::restore::start_dir(&mut fs, subvol)?;
        if warm {
            crate::restore::copy::warm(&mut fs, start.subvol);
        }
        let mut v = ReadOnlyView {
            fs,
            ids: NodeIds::new(start),
            parents: HashMap::new(),
            open_dirs: HashMap::new(),
            next_handle: 1,
            warnings: Vec::new(),
            lost_dirs: HashMap::new(),
        };
        v.parents.insert(ROOT_NODE, ROOT_NODE);
        Ok(v)
    }

    /// The node id of `l`, handed out the first time it is met.
    fn node_of(&mut self, l: Loc) -> u64 {
        self.ids.node_of(l)
    }

    fn loc(&self, node: u64) -> Result<Loc> {
        self.ids.loc(node)
    }

    /// lookup: the inode `name` names in directory `dir`.
    pub fn lookup(&mut self, dir: u64, name: &[u8]) -> Result<(u64, Stat)> {
        let d = self.loc(dir)?;
        let (l, ftype) = match self.fs.lookup(d, name) {
            Ok(Some(l)) => {
                let ftype =
                    crate::fs::names::lookup_name(&mut self.fs.store, d.subvol, d.ino, name)
                        .ok()
                        .flatten()
                        .map_or(0, |(_, t)| t);
                (l, ftype)
            }
            Ok(None) => return Err(Error::errno(libc::ENOENT, "no such entry")),
            // The name's DIR_ITEM is in a damaged block: its DIR_INDEX
            // twin (in another leaf, maybe) still names it.
            Err(e) => {
                let found = crate::restore::copy::salvage_readdir(&mut self.fs, d)
                    .ok()
                    .and_then(|(entries, _)| entries.into_iter().find(|x| x.0 == name));
                let Some((_, l, t)) = found else {
                    return Err(e);
                };
                (l, t)
            }
        };
        let st = match self.fs.stat(l) {
            Ok(st) => st,
            // A directory whose inode item is lost still has its entries:
            // shown without its metadata (read-only, owned by root), as
            // restore makes it.
            Err(e) if ftype == BTRFS_FT_DIR => {
                self.warnings.push(format!(
                    "directory inode {} of subvolume {}: inode unreadable, entries salvaged: {e}",
                    l.ino, l.subvol
                ));
                lost_dir_stat(l)
            }
            // A regular file whose inode item is lost and that has no
            // extent items: shown empty, as restore makes it (with extents
            // its size is not known: EIO).
            Err(e) if ftype == crate::format::consts::BTRFS_FT_REG_FILE => {
                let Ok(size) = crate::restore::copy::size_from_extents(&mut self.fs, l) else {
                    return Err(e);
                };
                self.warnings.push(format!(
                    "inode {} of subvolume {}: inode item unreadable ({e}); no extent items: shown empty",
                    l.ino, l.subvol
                ));
                Stat {
                    mode: libc::S_IFREG | 0o444,
                    size,
                    ..lost_dir_stat(l)
                }
            }
            Err(e) => return Err(e),
        };
        let n = self.node_of(l);
        if st.generation == LOST {
            self.lost_dirs.insert(n, st.clone());
        }
        self.parents.entry(n).or_insert(dir);
        Ok((n, st))
    }

    /// getattr.
    pub fn getattr(&mut self, node: u64) -> Result<Stat> {
        if let Some(st) = self.lost_dirs.get(&node) {
            return Ok(st.clone());
        }
        let l = self.loc(node)?;
        self.fs.stat(l)
    }

    /// opendir: the directory's entries read once, behind a handle.
    pub fn opendir(&mut self, node: u64) -> Result<u64> {
        let l = self.loc(node)?;
        // Read around damage as restore does: a leaf lost on every copy
        // loses the entries it held, the rest are listed.
        let listed = if self.lost_dirs.contains_key(&node) {
            Err(Error::Invalid("inode item lost".into()))
        } else {
            self.fs.readdir(l)
        };
        let raw = match listed {
            Ok(v) => v,
            Err(e) if e.as_errno() == libc::ENOTDIR => return Err(e),
            Err(e) => {
                let (v, damaged) =
                    crate::restore::copy::salvage_readdir(&mut self.fs, l).map_err(|_| e)?;
                for (bytenr, why) in damaged {
                    self.warnings.push(format!(
                        "directory inode {} of subvolume {}: entries in tree block {bytenr} lost: {why}",
                        l.ino, l.subvol
                    ));
                }
                v
            }
        };
        let parent = self.parents.get(&node).copied().unwrap_or(node);
        let mut list = Vec::with_capacity(raw.len() + 2);
        list.push(Entry {
            name: b".".to_vec(),
            node,
            ftype: BTRFS_FT_DIR,
        });
        list.push(Entry {
            name: b"..".to_vec(),
            node: parent,
            ftype: BTRFS_FT_DIR,
        });
        for (name, child, ftype) in raw {
            let n = self.node_of(child);
            self.parents.entry(n).or_insert(node);
            list.push(Entry {
                name,
                node: n,
                ftype,
            });
        }
        let h = self.next_handle;
        self.next_handle += 1;
        self.open_dirs.insert(h, Arc::new(list));
        Ok(h)
    }

    /// The entries of an open directory (readdir serves them from an
    /// offset: entry `i` is at offset `i + 1`).
    pub fn dir_entries(&self, handle: u64) -> Result<Arc<Vec<Entry>>> {
        self.open_dirs
            .get(&handle)
            .cloned()
            .ok_or_else(|| Error::errno(libc::EBADF, format!("directory handle {handle}")))
    }

    /// releasedir.
    pub fn releasedir(&mut self, handle: u64) {
        self.open_dirs.remove(&handle);
    }

    /// read: up to `len` bytes at `off` (short only at end of file);
    /// compressed extents decompressed, holes and preallocated ranges as
    /// zeros, data checksums verified (a mismatch on every copy is EIO).
    pub fn read(&mut self, node: u64, off: u64, len: u64) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        if let Some(st) = self.lost_dirs.get(&node) {
            if st.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(Error::errno(libc::EISDIR, "read: is a directory"));
            }
            return crate::fs::read::read_range(
                &mut self.fs.store,
                l.subvol,
                l.ino,
                st.size,
                off,
                len,
                true,
            );
        }
        self.fs.read_untracked(l, off, len)
    }

    /// The whole contents of a regular file of at most `max` bytes whose
    /// data is inline (in its inode's leaf, read already): what a mount
    /// can hand the kernel's page cache with the listing, so reading the
    /// file costs no request. None for any other file.
    pub fn inline_contents(&mut self, node: u64, size: u64, max: u64) -> Option<Vec<u8>> {
        use crate::format::consts::BTRFS_EXTENT_DATA_KEY;
        use crate::format::file_extent::{parse_file_extent, FileExtent};
        if size == 0 || size > max {
            return None;
        }
        let l = self.ids.loc(node).ok()?;
        let k = crate::format::key::Key::new(l.ino, BTRFS_EXTENT_DATA_KEY, 0);
        let item = self
            .fs
            .store
            .lookup(crate::trans::TreeId::Tree(l.subvol), &k)
            .ok()??;
        match parse_file_extent(&item).ok()? {
            FileExtent::Inline { .. } => {}
            _ => return None,
        }
        let data = self.fs.read_untracked(l, 0, size).ok()?;
        (data.len() as u64 == size).then_some(data)
    }

    /// readlink.
    pub fn readlink(&mut self, node: u64) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        self.fs.read_link(l)
    }

    /// listxattr: the names, each followed by a NUL, as the syscall
    /// returns them.
    pub fn listxattr(&mut self, node: u64) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        if l.is_placeholder() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (name, _) in self.fs.xattrs().list_xattrs(l)? {
            out.extend_from_slice(&name);
            out.push(0);
        }
        Ok(out)
    }

    /// getxattr (ENODATA when the inode has no such attribute).
    pub fn getxattr(&mut self, node: u64, name: &[u8]) -> Result<Vec<u8>> {
        let l = self.loc(node)?;
        if l.is_placeholder() {
            return Err(Error::errno(libc::ENODATA, "no such attribute"));
        }
        self.fs
            .xattrs()
            .get_xattr(l, name)?
            .ok_or_else(|| Error::errno(libc::ENODATA, "no such attribute"))
    }

    /// statfs: the superblock's size and bytes used.
    pub fn space(&self) -> Space {
        let sb = &self.fs.store.image().sb;
        Space {
            total: sb.total_bytes.get(),
            used: sb.bytes_used.get(),
            block: sb.sectorsize.get(),
        }
    }

    /// What was read around since the last call (a directory listed
    /// without the entries a damaged block held): for the user, never
    /// silent.
    pub fn take_warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.warnings);
        w.extend(crate::restore::rebuilt_warnings(self.fs.store.image()));
        w
    }

    /// Tree blocks read although every copy failed its checksum (see
    /// [`crate::restore::RestoreReport::bad_csum_blocks`]).
    pub fn bad_csum_blocks(&self) -> Vec<u64> {
        self.fs.store.image().trusted_bad_csum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;

    fn image_with_files() -> Arc<MemDevice> {
        let mem = Arc::new(MemDevice::zeroed(256 << 20));
        let dev: Arc<dyn BlockDevice> = mem.clone();
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        let mut fs = Filesystem::mount(
            dev.clone(),
            Default::default(),
            crate::log::LogState::boxed(),
        )
        .unwrap();
        let root = fs.root();
        let d = fs.mkdir(root, b"d", 0o755).unwrap();
        let f = fs.create(d, b"f", 0o644).unwrap();
        fs.write(f, 0, b"hello").unwrap();
        fs.link(f, d, b"g").unwrap();
        fs.xattrs().set_xattr(f, b"user.k", b"v").unwrap();
        fs.symlink(root, b"s", b"d/f").unwrap();
        fs.sync().unwrap();
        drop(fs);
        mem
    }

    #[test]
    fn names_resolve_to_one_node_per_inode() {
        let mem = image_with_files();
        let before = mem.snapshot();
        let dev: Arc<dyn BlockDevice> = mem.clone();
        let mut v = ReadOnlyView::open(
            vec![("img".into(), dev.clone())],
            &ReadOptions::default(),
            None,
            true,
        )
        .unwrap();
        let (d, st) = v.lookup(ROOT_NODE, b"d").unwrap();
        assert_eq!(st.mode & libc::S_IFMT, libc::S_IFDIR);
        let (f, st) = v.lookup(d, b"f").unwrap();
        assert_eq!((st.size, st.nlink), (5, 2));
        let (g, _) = v.lookup(d, b"g").unwrap();
        assert_eq!(f, g, "two names of one inode are one node");
        assert_eq!(v.read(f, 1, 100).unwrap(), b"ello");
        assert_eq!(v.getxattr(f, b"user.k").unwrap(), b"v");
        assert_eq!(v.listxattr(f).unwrap(), b"user.k\0");
        assert_eq!(
            v.getxattr(f, b"user.none").unwrap_err().as_errno(),
            libc::ENODATA
        );
        let (s, _) = v.lookup(ROOT_NODE, b"s").unwrap();
        assert_eq!(v.readlink(s).unwrap(), b"d/f");
        assert_eq!(
            v.lookup(ROOT_NODE, b"nope").unwrap_err().as_errno(),
            libc::ENOENT
        );
        let h = v.opendir(d).unwrap();
        let names: Vec<Vec<u8>> = v
            .dir_entries(h)
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(
            names,
            vec![b".".to_vec(), b"..".to_vec(), b"f".to_vec(), b"g".to_vec()]
        );
        assert_eq!(v.dir_entries(h).unwrap()[1].node, ROOT_NODE);
        v.releasedir(h);
        assert!(v.dir_entries(h).is_err());
        assert_eq!(v.getattr(12345).unwrap_err().as_errno(), libc::ESTALE);
        assert!(v.space().total >= v.space().used);
        drop(v);
        assert!(before == mem.snapshot(), "the view wrote the image");
    }
}
