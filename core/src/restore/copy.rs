//! Copying a tree of the image to a host directory (`btrkit-restore`).
//!
//! The image is hostile: its names, links and directory graph are taken as
//! data, never as paths. Everything is made through [`super::dest`]
//! relative to open directories of the destination; a name the kernel
//! would never make (`/`, NUL, empty, `.`, `..`), a second entry with a
//! name already restored in its directory, and a directory reached a
//! second time (a cycle, or a directory with two names) are each listed as
//! lost, and the walk goes on. Privilege is opt-in: device nodes only with
//! `devices`, `security.`/`trusted.`/`system.` attributes only with
//! `privileged_xattrs`, set-id bits only with `metadata`.

use super::dest::{self, Created, DestDir, MadeDir, SharedDir};
use crate::format::consts::{
    BTRFS_DIR_INDEX_KEY, BTRFS_FIRST_FREE_OBJECTID, BTRFS_FT_DIR, BTRFS_ROOT_ITEM_KEY,
};
use crate::fs::ops::Stat;
use crate::fs::read::MapKind;
use crate::fs::{Filesystem, Loc};
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// What [`restore`] copies and how.
#[derive(Default)]
pub struct RestoreOptions<'a> {
    /// Owner, mode (set-id bits included) and times too (`btrfs restore -m`).
    pub metadata: bool,
    /// Replace files that exist at the destination (else they are skipped).
    /// A directory there is never replaced; a symlink there is replaced
    /// itself, never followed.
    pub overwrite: bool,
    /// List what would be restored; write nothing.
    pub dry_run: bool,
    /// Descend into snapshots (subvolumes made as snapshots are skipped
    /// otherwise, as `btrfs restore` skips them without `-s`).
    pub snapshots: bool,
    /// Make block and character device nodes (else counted and listed in
    /// `skipped_devices`, as tar without root and btrfs restore do).
    pub devices: bool,
    /// Set `security.*`, `trusted.*` and `system.*` extended attributes
    /// (capabilities, SELinux labels, ACLs); `user.*` ones are always set.
    pub privileged_xattrs: bool,
    /// Write data that fails its checksum (every copy), listing the bad
    /// ranges in `bad_data`; without it such a file is lost.
    pub write_bad_data: bool,
    /// Only paths (from the start, `/a/b`) this accepts are restored;
    /// directories are always descended.
    pub select: Option<&'a dyn Fn(&str) -> bool>,
}

/// Something that could not be restored.
#[derive(Clone, Debug, Serialize)]
pub struct Lost {
    /// Its path from the start of the restore (bytes that are not
    /// printable ASCII escaped as `\xNN`).
    pub path: String,
    /// Subvolume (root objectid).
    pub subvol: u64,
    /// Inode number.
    pub ino: u64,
    /// Why: the error met reading it (naming the block where it is a
    /// damaged tree block), "name refused", "duplicate name", "directory
    /// reached twice".
    pub what: String,
}

/// A file written with data that failed its checksum on every copy.
#[derive(Clone, Debug, Serialize)]
pub struct BadData {
    /// Its path from the start of the restore.
    pub path: String,
    /// The ranges (file offset, length) whose bytes failed verification.
    pub ranges: Vec<(u64, u64)>,
}

/// What [`restore`] did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestoreReport {
    /// Regular files written (hard links not counted).
    pub files: u64,
    /// Directories made (the destination itself not counted).
    pub dirs: u64,
    /// Symbolic links made.
    pub symlinks: u64,
    /// Further names of files already restored, made as hard links.
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes made.
    pub special: u64,
    /// File bytes written (data, not holes).
    pub bytes: u64,
    /// Files left alone because they exist at the destination.
    pub skipped_existing: u64,
    /// Snapshots not descended into.
    pub skipped_snapshots: u64,
    /// Device nodes not made (no `devices`): their paths.
    pub skipped_devices: Vec<String>,
    /// Privileged extended attributes not set (no `privileged_xattrs`).
    pub skipped_xattrs: u64,
    /// Files and directories given set-user-id or set-group-id bits
    /// (only with `metadata`).
    pub setid: u64,
    /// What could not be read, with why.
    pub lost: Vec<Lost>,
    /// Files written with data that failed its checksum (`write_bad_data`).
    pub bad_data: Vec<BadData>,
    /// The fsync log could not be replayed: what was read instead.
    pub log_fallback: Option<String>,
    /// Extended attributes or metadata the destination refused (the file
    /// itself was restored): path and why.
    pub warnings: Vec<String>,
    /// With `dry_run`: every path that would be restored, with its size.
    pub listed: Vec<(String, u64)>,
    /// Tree blocks read although every copy failed its checksum (nothing
    /// else was wrong with them); what they hold was restored as it stands.
    pub bad_csum_blocks: Vec<u64>,
}

/// Largest read of file data at once.
const READ_CHUNK: u64 = 4 << 20;

/// A directory's place in the destination: its name in its parent. A
/// path is rebuilt from it (and reopened component by component, never
/// through a symlink) only for what is done at the end: hard links and
/// directory times. Holding no descriptor, any number of them may wait.
struct DirPath {
    parent: Option<Arc<DirPath>>,
    name: Vec<u8>,
}

impl DirPath {
    fn components(&self) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut cur = Some(self);
        while let Some(d) = cur {
            if d.parent.is_some() {
                v.push(d.name.clone());
            }
            cur = d.parent.as_deref();
        }
        v.reverse();
        v
    }
}

/// One entry waiting to be restored.
struct Entry {
    /// Its path as reports show it.
    shown: String,
    l: Loc,
    /// Directory entry type (FT_DIR for the start).
    ft: u8,
    /// The directory it goes in and its name there; None for the start.
    at: Option<Place>,
}

/// Where an entry goes: an open directory of the destination (None on a
/// dry run), its place, whether this restore made it, and the name.
struct Place {
    dir: Option<SharedDir>,
    path: Arc<DirPath>,
    fresh: bool,
    name: Vec<u8>,
}

/// A directory whose owner, mode and times are set once its contents are
/// in (a read-only mode would stop its filling; times would move).
struct DirMeta {
    path: Arc<DirPath>,
    owner_mode: Option<(u32, u32, u32)>,
    times: ((i64, u32), (i64, u32)),
}

/// Seconds since the epoch (signed), nanoseconds below 10^9.
fn signed(t: (i64, u32)) -> (i64, u32) {
    (t.0, t.1.min(999_999_999))
}

/// Whether an extended attribute needs privilege to set, or gives it.
fn privileged_xattr(name: &[u8]) -> bool {
    name.starts_with(b"security.") || name.starts_with(b"trusted.") || name.starts_with(b"system.")
}

/// Copy the tree under `start` to `dest` (made if missing). Errors only for
/// what stops the whole restore (the destination cannot be written); what
/// cannot be read or made is recorded in the report's `lost`.
pub fn restore(
    fs: &mut Filesystem,
    start: Loc,
    dest_path: &Path,
    o: &RestoreOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RestoreReport> {
    let root = if o.dry_run {
        None
    } else {
        Some(Arc::new(DestDir::open_root(dest_path, true)?))
    };
    fs.store.cache_control().set_limit(BLOCK_CACHE);
    fs.store.set_item_cache_limit(ITEM_CACHE);
    warm(fs, start.subvol);
    let mut walk = Walk {
        o,
        progress,
        r: RestoreReport::default(),
        root,
        root_path: Arc::new(DirPath {
            parent: None,
            name: Vec::new(),
        }),
        linked: HashMap::new(),
        links: Vec::new(),
        dir_meta: Vec::new(),
        dirs_seen: HashMap::new(),
        writers: Writers::start(),
    };
    let mut stack: Vec<Entry> = vec![Entry {
        shown: String::new(),
        l: start,
        ft: BTRFS_FT_DIR,
        at: None,
    }];
    // Bounded memory: the engine's caches trimmed every so many entries
    // (a restore only reads, so nothing else would trim them).
    let mut visited = 0u64;
    while let Some(e) = stack.pop() {
        walk.visit(fs, e, &mut stack)?;
        visited += 1;
        if visited.is_multiple_of(TRIM_EVERY) {
            fs.trim_caches();
        }
    }
    walk.finish(fs)
}

/// Entries restored between two trims of the engine's caches.
const TRIM_EVERY: u64 = 1024;

/// Clean tree blocks a restore keeps: it walks each directory once, in
/// key order, so what it reads again soon is the path above it and the
/// extent and checksum leaves it is in; the image's pages stay in the
/// page cache beyond this for the rest.
const BLOCK_CACHE: usize = 8 << 20;

/// Inode and dir items a restore keeps cached (about 200 bytes each): it
/// reads each once, so the cache serves only the lookups of one directory.
const ITEM_CACHE: usize = 16 << 10;

/// A name of a file in the destination: its directory and the name there.
type NamePlace = (Arc<DirPath>, Vec<u8>);

/// A directory made (or found) in the destination for a directory of the
/// image: open (None on a dry run or under a directory not made), its
/// place, and whether this restore made it.
struct DirPlace {
    dir: Option<SharedDir>,
    path: Arc<DirPath>,
    fresh: bool,
}

/// The state of one [`restore`]: the walk's report and what is done once
/// every entry is walked.
struct Walk<'w, 'a> {
    o: &'w RestoreOptions<'a>,
    progress: &'w mut dyn FnMut(u64, u64),
    r: RestoreReport,
    /// The destination (None on a dry run).
    root: Option<SharedDir>,
    root_path: Arc<DirPath>,
    /// (subvol, ino) of files with several names -> where the first went.
    linked: HashMap<(u64, u64), NamePlace>,
    /// Further names of files handed to the writers: linked once all are
    /// made (the first name, this name, the path shown).
    links: Vec<(NamePlace, NamePlace, String)>,
    dir_meta: Vec<DirMeta>,
    /// Every directory walked: one reached again is a cycle or a second
    /// name, and is not walked again (the walk is bounded by the tree).
    dirs_seen: HashMap<(u64, u64), String>,
    writers: Writers,
}

impl Walk<'_, '_> {
    /// Record the entry at `shown` as lost.
    fn lose(&mut self, shown: &str, l: Loc, what: String) {
        self.r.lost.push(Lost {
            path: shown.to_string(),
            subvol: l.subvol,
            ino: l.ino,
            what,
        })
    }

    /// The progress callback, with the entries made and bytes copied.
    fn tick(&mut self) {
        let r = &self.r;
        (self.progress)(r.files + r.symlinks + r.special, r.bytes);
    }

    /// Restore one entry: a directory is made and its entries pushed on
    /// `stack`; anything else is made, a small file handed to the writers.
    fn visit(&mut self, fs: &mut Filesystem, e: Entry, stack: &mut Vec<Entry>) -> Result<()> {
        let Entry { shown, l, ft, at } = e;
        let shown = if shown.is_empty() {
            "/".to_string()
        } else {
            shown
        };
        if l.ino == crate::format::consts::BTRFS_EMPTY_SUBVOL_DIR_OBJECTID {
            return self.empty_subvol(&shown, l, at.as_ref());
        }
        let Some(st) = self.stat(fs, &shown, l, ft, at.as_ref())? else {
            return Ok(());
        };
        let kind = st.as_ref().map_or(libc::S_IFDIR, |s| s.mode & libc::S_IFMT);
        if kind == libc::S_IFDIR {
            return self.visit_dir(fs, &shown, l, at.as_ref(), st.as_ref(), stack);
        }
        let Some(st) = st else { return Ok(()) };
        if self.o.select.is_some_and(|f| !f(&shown)) {
            return Ok(());
        }
        if self.o.dry_run {
            self.r.listed.push((shown, st.size));
            return Ok(());
        }
        let Some(p) = at else { return Ok(()) };
        self.visit_file(fs, shown, l, kind, &st, p)
    }

    /// A subvolume whose root is not there: an empty directory, as the
    /// kernel shows it.
    fn empty_subvol(&mut self, shown: &str, l: Loc, at: Option<&Place>) -> Result<()> {
        if let Some(p) = at {
            if let Some(d) = &p.dir {
                match d.make_dir(&p.name) {
                    Ok(MadeDir::Fresh(_)) => self.r.dirs += 1,
                    Ok(MadeDir::Existing(_)) => {}
                    Err(e) => host_failure(&mut self.r, shown, l, "cannot make it", e)?,
                }
            }
        }
        Ok(())
    }

    /// The entry's inode: `Some(None)` for a directory whose inode item
    /// is lost (its entries are still walked), `None` when nothing more
    /// is done with the entry.
    fn stat(
        &mut self,
        fs: &mut Filesystem,
        shown: &str,
        l: Loc,
        ft: u8,
        at: Option<&Place>,
    ) -> Result<Option<Option<Stat>>> {
        match fs.stat(l) {
            Ok(s) => Ok(Some(Some(s))),
            // A directory whose inode item is lost still has its entries
            // (DIR_INDEX items of its own, in other leaves maybe): restore
            // them into a directory without its metadata.
            Err(e) if ft == BTRFS_FT_DIR => {
                self.r.warnings.push(format!(
                    "{shown}: directory inode unreadable, entries salvaged: {e}"
                ));
                Ok(Some(None))
            }
            Err(e) if ft == crate::format::consts::BTRFS_FT_REG_FILE => {
                self.file_without_inode(fs, shown, l, at, e)?;
                Ok(None)
            }
            Err(e) => {
                self.lose(shown, l, e.to_string());
                Ok(None)
            }
        }
    }

    /// A regular file whose inode item is lost and that has no extent
    /// items is made empty, as btrfs restore makes it; with extents its
    /// size is not known and it is lost.
    fn file_without_inode(
        &mut self,
        fs: &mut Filesystem,
        shown: &str,
        l: Loc,
        at: Option<&Place>,
        e: Error,
    ) -> Result<()> {
        if self.o.dry_run {
            self.lose(shown, l, e.to_string());
            return Ok(());
        }
        if self.o.select.is_some_and(|f| !f(shown)) {
            return Ok(());
        }
        let Some(p) = at else { return Ok(()) };
        let Some(d) = &p.dir else { return Ok(()) };
        match size_from_extents(fs, l) {
            Err(e2) => self.lose(shown, l, format!("{e}; from its extents: {e2}")),
            Ok(_) => match d.create_file(&p.name, self.o.overwrite) {
                Ok(Created::File(_)) => {
                    self.r.files += 1;
                    self.r.warnings.push(format!(
                        "{shown}: inode item unreadable ({e}); it has no extent \
                         items: made empty, mode and owner not known"
                    ));
                }
                Ok(Created::Exists) => self.r.skipped_existing += 1,
                Err(he) => host_failure(&mut self.r, shown, l, "cannot create it", he)?,
            },
        }
        Ok(())
    }

    /// A directory: made in the destination, its entries pushed on
    /// `stack` (popped in name order), its xattrs set and its owner, mode
    /// and times kept for the end.
    fn visit_dir(
        &mut self,
        fs: &mut Filesystem,
        shown: &str,
        l: Loc,
        at: Option<&Place>,
        st: Option<&Stat>,
        stack: &mut Vec<Entry>,
    ) -> Result<()> {
        if let Some(first) = self.dirs_seen.get(&(l.subvol, l.ino)) {
            let what = format!(
                "directory reached twice (a directory cycle or a second name; \
                 restored at {first})"
            );
            self.lose(shown, l, what);
            return Ok(());
        }
        self.dirs_seen.insert((l.subvol, l.ino), shown.to_string());
        let Some(entries) = self.dir_entries(fs, shown, l, st.is_some()) else {
            return Ok(());
        };
        let Some(here) = self.dest_dir(shown, l, at)? else {
            return Ok(());
        };
        let mut children = self.children(fs, shown, l, &entries, &here);
        // Popped in name order.
        children.sort_by(|a, b| b.shown.cmp(&a.shown));
        stack.extend(children);
        if let (Some(d), Some(st)) = (&here.dir, st) {
            self.dir_attrs(fs, shown, l, d, st, &here.path);
        }
        Ok(())
    }

    /// A directory's entries, read around damage: a leaf lost loses the
    /// entries it held. None when none can be read (the directory lost).
    fn dir_entries(
        &mut self,
        fs: &mut Filesystem,
        shown: &str,
        l: Loc,
        has_inode: bool,
    ) -> Option<Vec<(Vec<u8>, Loc, u8)>> {
        let listed = if has_inode { Some(fs.readdir(l)) } else { None };
        if let Some(Ok(v)) = listed {
            return Some(v);
        }
        match salvage_readdir(fs, l) {
            Ok((v, damaged)) => {
                for (bytenr, why) in damaged {
                    self.r.lost.push(Lost {
                        path: format!("{shown} (entries in tree block {bytenr})"),
                        subvol: l.subvol,
                        ino: l.ino,
                        what: why,
                    });
                }
                Some(v)
            }
            Err(e) => {
                self.lose(shown, l, e.to_string());
                None
            }
        }
    }

    /// This directory in the destination (the start is `dest`); None when
    /// it cannot be made (recorded).
    fn dest_dir(&mut self, shown: &str, l: Loc, at: Option<&Place>) -> Result<Option<DirPlace>> {
        let Some(p) = at else {
            return Ok(Some(DirPlace {
                dir: self.root.clone(),
                path: self.root_path.clone(),
                fresh: false,
            }));
        };
        let path = Arc::new(DirPath {
            parent: Some(p.path.clone()),
            name: p.name.clone(),
        });
        let Some(d) = &p.dir else {
            return Ok(Some(DirPlace {
                dir: None,
                path,
                fresh: false,
            }));
        };
        let (nd, fresh) = match d.make_dir(&p.name) {
            Ok(MadeDir::Fresh(nd)) => {
                self.r.dirs += 1;
                (nd, true)
            }
            Ok(MadeDir::Existing(nd)) => (nd, false),
            Err(e) => {
                host_failure(&mut self.r, shown, l, "cannot make it", e)?;
                return Ok(None);
            }
        };
        Ok(Some(DirPlace {
            dir: Some(Arc::new(nd)),
            path,
            fresh,
        }))
    }

    /// The entries of a directory to restore: refused and duplicate names
    /// lost, snapshots skipped unless asked for.
    fn children(
        &mut self,
        fs: &mut Filesystem,
        shown: &str,
        l: Loc,
        entries: &[(Vec<u8>, Loc, u8)],
        here: &DirPlace,
    ) -> Vec<Entry> {
        let base = if shown == "/" { "" } else { shown };
        let mut names: HashSet<&[u8]> = HashSet::with_capacity(entries.len());
        let mut children = Vec::with_capacity(entries.len());
        for (name, child, ty) in entries {
            let child_shown = format!("{base}/{}", dest::escape_name(name));
            if let Some(why) = dest::refused_name(name) {
                self.r.lost.push(Lost {
                    path: child_shown,
                    subvol: child.subvol,
                    ino: child.ino,
                    what: format!("name refused: {why} (the kernel never makes such a name)"),
                });
                continue;
            }
            if !names.insert(name.as_slice()) {
                self.r.lost.push(Lost {
                    path: child_shown,
                    subvol: child.subvol,
                    ino: child.ino,
                    what: "duplicate name: another entry of this directory has it and \
                           was restored"
                        .into(),
                });
                continue;
            }
            if child.subvol != l.subvol && !self.o.snapshots && is_snapshot(fs, child.subvol) {
                self.r.skipped_snapshots += 1;
                continue;
            }
            children.push(Entry {
                shown: child_shown,
                l: *child,
                ft: *ty,
                at: Some(Place {
                    dir: here.dir.clone(),
                    path: here.path.clone(),
                    fresh: here.fresh,
                    name: name.clone(),
                }),
            });
        }
        children
    }

    /// A directory's xattrs, set now; its owner, mode and times (with
    /// `metadata`) kept for the end.
    fn dir_attrs(
        &mut self,
        fs: &mut Filesystem,
        shown: &str,
        l: Loc,
        d: &SharedDir,
        st: &Stat,
        path: &Arc<DirPath>,
    ) {
        match fs.xattrs().list_xattrs(l) {
            Ok(list) => {
                for (n, v) in list {
                    if privileged_xattr(&n) && !self.o.privileged_xattrs {
                        self.r.skipped_xattrs += 1;
                        continue;
                    }
                    if let Err(e) = d.set_own_xattr(&n, &v) {
                        self.r
                            .warnings
                            .push(format!("{shown}: xattr {}: {e}", dest::escape_name(&n)));
                    }
                }
            }
            Err(e) => self.r.warnings.push(format!("{shown}: xattrs: {e}")),
        }
        if self.o.metadata {
            if st.mode & 0o6000 != 0 {
                self.r.setid += 1;
            }
            self.dir_meta.push(DirMeta {
                path: path.clone(),
                owner_mode: Some((st.uid, st.gid, st.mode)),
                times: (signed(st.atime), signed(st.mtime)),
            });
        }
    }

    /// Anything but a directory, at `p`: a further name of a file already
    /// restored kept for the end, a small file read and handed to the
    /// writers, anything else made here.
    fn visit_file(
        &mut self,
        fs: &mut Filesystem,
        shown: String,
        l: Loc,
        kind: u32,
        st: &Stat,
        p: Place,
    ) -> Result<()> {
        let Some(d) = p.dir.clone() else {
            return Ok(());
        };
        // In a directory this restore made, nothing can exist yet.
        if !p.fresh && !self.clear_place(&d, &p.name, &shown, l)? {
            return Ok(());
        }
        if st.nlink > 1 && kind != libc::S_IFDIR {
            if let Some(first) = self.linked.get(&(l.subvol, l.ino)) {
                self.links
                    .push((first.clone(), (p.path.clone(), p.name.clone()), shown));
                self.r.hardlinks += 1;
                return Ok(());
            }
        }
        let meta = self.o.metadata.then(|| Meta {
            uid: st.uid,
            gid: st.gid,
            mode: st.mode,
            atime: signed(st.atime),
            mtime: signed(st.mtime),
        });
        if self.o.metadata && kind != libc::S_IFLNK && st.mode & 0o6000 != 0 {
            self.r.setid += 1;
        }
        let xattrs = self.file_xattrs(fs, &shown, l);
        if kind == libc::S_IFREG && st.size <= SMALL_FILE {
            let mut bad = Vec::new();
            match read_small(fs, l, st.size, self.o.write_bad_data, &mut bad) {
                Ok(data) => {
                    if !bad.is_empty() {
                        self.r.bad_data.push(BadData {
                            path: shown.clone(),
                            ranges: bad,
                        });
                    }
                    self.r.bytes += data.iter().map(|d| d.1.len() as u64).sum::<u64>();
                    self.r.files += 1;
                    if st.nlink > 1 {
                        self.linked
                            .insert((l.subvol, l.ino), (p.path.clone(), p.name.clone()));
                    }
                    let job = FileJob {
                        dir: d,
                        name: p.name,
                        shown,
                        size: st.size,
                        data,
                        xattrs,
                        meta,
                    };
                    self.writers.send(job, &mut self.r)?;
                    self.tick();
                }
                Err(e) => self.lose(&shown, l, e.to_string()),
            }
            return Ok(());
        }
        let made = match kind {
            libc::S_IFCHR | libc::S_IFBLK if !self.o.devices => {
                self.r.skipped_devices.push(shown);
                return Ok(());
            }
            _ => self.make_node(fs, l, kind, st, &d, &p.name, &shown, &xattrs, meta.as_ref()),
        };
        match made {
            Ok(()) => {}
            Err(Failure::Image(e)) => {
                let _ = d.remove_for_overwrite(&p.name);
                self.lose(&shown, l, e.to_string());
                return Ok(());
            }
            Err(Failure::Host(e)) => {
                let _ = d.remove_for_overwrite(&p.name);
                host_failure(&mut self.r, &shown, l, "cannot make it", e)?;
                return Ok(());
            }
        }
        if st.nlink > 1 {
            self.linked
                .insert((l.subvol, l.ino), (p.path.clone(), p.name.clone()));
        }
        if kind != libc::S_IFREG {
            finish_named(
                &d,
                &p.name,
                kind,
                &xattrs,
                meta.as_ref(),
                &shown,
                &mut self.r.warnings,
            );
        }
        self.tick();
        Ok(())
    }

    /// What is at `name` in a directory this restore did not make: kept
    /// (false) unless `overwrite`, then removed. False too when it cannot
    /// be looked at or removed (recorded).
    fn clear_place(&mut self, d: &DestDir, name: &[u8], shown: &str, l: Loc) -> Result<bool> {
        match d.stat(name) {
            Ok(None) => Ok(true),
            Ok(Some(_)) if !self.o.overwrite => {
                self.r.skipped_existing += 1;
                Ok(false)
            }
            Ok(Some(_)) => match d.remove_for_overwrite(name) {
                Ok(_) => Ok(true),
                Err(e) => {
                    host_failure(&mut self.r, shown, l, "cannot replace it", e)?;
                    Ok(false)
                }
            },
            Err(e) => {
                host_failure(&mut self.r, shown, l, "cannot look at it", e)?;
                Ok(false)
            }
        }
    }

    /// A file's xattrs to set: privileged ones dropped (counted) unless
    /// asked for; none when they cannot be read (a warning).
    fn file_xattrs(&mut self, fs: &mut Filesystem, shown: &str, l: Loc) -> Vec<(Vec<u8>, Vec<u8>)> {
        match fs.xattrs().list_xattrs(l) {
            Ok(x) => x
                .into_iter()
                .filter(|(n, _)| {
                    let keep = self.o.privileged_xattrs || !privileged_xattr(n);
                    if !keep {
                        self.r.skipped_xattrs += 1;
                    }
                    keep
                })
                .collect(),
            Err(e) => {
                self.r.warnings.push(format!("{shown}: xattrs: {e}"));
                Vec::new()
            }
        }
    }

    /// A large regular file copied (its metadata set on it), a symlink or
    /// a special file made.
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &mut self,
        fs: &mut Filesystem,
        l: Loc,
        kind: u32,
        st: &Stat,
        d: &DestDir,
        name: &[u8],
        shown: &str,
        xattrs: &[(Vec<u8>, Vec<u8>)],
        meta: Option<&Meta>,
    ) -> std::result::Result<(), Failure> {
        let r = &mut self.r;
        match kind {
            libc::S_IFREG => copy_file(fs, l, st.size, d, name, shown, self.o, r).map(|f| {
                if let Some(f) = f {
                    finish_file(&f, xattrs, meta, shown, &mut r.warnings);
                }
            }),
            libc::S_IFLNK => match fs.read_link(l) {
                Ok(t) => d
                    .symlink(&t, name)
                    .map(|_| r.symlinks += 1)
                    .map_err(Failure::Host),
                Err(e) => Err(Failure::Image(e)),
            },
            _ => d
                .mknod(name, st.mode, st.rdev)
                .map(|_| r.special += 1)
                .map_err(Failure::Host),
        }
    }

    /// After the walk: the writers' files in, the further names of files
    /// linked, directories' owners, modes and times set; the report.
    fn finish(self, fs: &mut Filesystem) -> Result<RestoreReport> {
        let Walk {
            mut r,
            root,
            links,
            dir_meta,
            writers,
            ..
        } = self;
        writers.finish(&mut r)?;
        if let Some(root) = &root {
            link_names(root, links, &mut r)?;
            set_dir_meta(root, &dir_meta, &mut r);
        }
        r.bad_csum_blocks = fs.store.image().trusted_bad_csum();
        r.warnings.extend(super::rebuilt_warnings(fs.store.image()));
        Ok(r)
    }
}

/// The further names of files restored, each linked to the first.
fn link_names(
    root: &DestDir,
    links: Vec<(NamePlace, NamePlace, String)>,
    r: &mut RestoreReport,
) -> Result<()> {
    for (first, second, shown) in links {
        let made = root.open_beneath(&first.0.components()).and_then(|a| {
            root.open_beneath(&second.0.components())
                .and_then(|b| b.link_from(&a, &first.1, &second.1))
        });
        if let Err(e) = made {
            r.hardlinks -= 1;
            host_failure(r, &shown, Loc::new(0, 0), "cannot link it", e)?;
        }
    }
    Ok(())
}

/// Directories' owners, modes and times, innermost first: a directory's
/// times after its contents, its parent's after it.
fn set_dir_meta(root: &DestDir, dir_meta: &[DirMeta], r: &mut RestoreReport) {
    for m in dir_meta.iter().rev() {
        let shown = format!("/{}", dest::escape_name(&m.path.components().join(&b'/')));
        let d = match root.open_beneath(&m.path.components()) {
            Ok(d) => d,
            Err(e) => {
                r.warnings.push(format!("{shown}: cannot reopen it: {e}"));
                continue;
            }
        };
        if let Some((uid, gid, mode)) = m.owner_mode {
            if let Err(e) = d.set_own_meta(uid, gid, mode) {
                r.warnings.push(format!("{shown}: owner and mode: {e}"));
            }
        }
        if let Err(e) = d.set_own_times(m.times.0, m.times.1) {
            r.warnings.push(format!("{shown}: times: {e}"));
        }
    }
}

/// Why an entry was not made: the image (the entry is lost) or the host.
enum Failure {
    Image(Error),
    Host(std::io::Error),
}

/// A host error making one entry: the restore stops when the destination
/// can take nothing more (no space, read-only, I/O error), else the entry
/// is listed as lost and the walk goes on.
fn host_failure(
    r: &mut RestoreReport,
    shown: &str,
    l: Loc,
    doing: &str,
    e: std::io::Error,
) -> Result<()> {
    if dest::is_fatal(&e) {
        return Err(Error::io(format!("{shown}: {doing}"), e));
    }
    r.lost.push(Lost {
        path: shown.to_string(),
        subvol: l.subvol,
        ino: l.ino,
        what: format!("{doing} at the destination: {e}"),
    });
    Ok(())
}

/// Owner, mode and times of a restored file (with `metadata`).
#[derive(Clone, Copy)]
struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    atime: (i64, u32),
    mtime: (i64, u32),
}

/// A regular file's owner and mode, then its extended attributes (after
/// the owner: changing it drops `security.capability`), then its times.
fn finish_file(
    f: &std::fs::File,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    meta: Option<&Meta>,
    shown: &str,
    warnings: &mut Vec<String>,
) {
    let fd = f.as_raw_fd();
    if let Some(m) = meta {
        if let Err(e) = dest::set_fd_owner_mode(fd, m.uid, m.gid, m.mode) {
            warnings.push(format!("{shown}: owner and mode: {e}"));
        }
    }
    for (n, v) in xattrs {
        if let Err(e) = dest::set_fd_xattr(fd, n, v) {
            warnings.push(format!("{shown}: xattr {}: {e}", dest::escape_name(n)));
        }
    }
    if let Some(m) = meta {
        if let Err(e) = dest::set_fd_times(fd, m.atime, m.mtime) {
            warnings.push(format!("{shown}: times: {e}"));
        }
    }
}

/// As [`finish_file`] for a symlink or special file, by name in its
/// directory (a symlink's own owner and attributes; never its target).
fn finish_named(
    d: &DestDir,
    name: &[u8],
    kind: u32,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    meta: Option<&Meta>,
    shown: &str,
    warnings: &mut Vec<String>,
) {
    if let Some(m) = meta {
        if let Err(e) = d.chown(name, m.uid, m.gid) {
            warnings.push(format!("{shown}: owner: {e}"));
        }
        if kind != libc::S_IFLNK {
            if let Err(e) = d.chmod_special(name, m.mode & 0o7777) {
                warnings.push(format!("{shown}: mode: {e}"));
            }
        }
    }
    for (n, v) in xattrs {
        if let Err(e) = d.set_xattr(name, n, v) {
            warnings.push(format!("{shown}: xattr {}: {e}", dest::escape_name(n)));
        }
    }
    if let Some(m) = meta {
        if let Err(e) = d.set_times(name, m.atime, m.mtime) {
            warnings.push(format!("{shown}: times: {e}"));
        }
    }
}

/// Read the tree blocks of subvolume `subvol` and of the checksum tree
/// ahead, in block order with many reads in flight, so the walk's
/// lookups (an inode, its directory, its extents and checksums: several
/// searches per file, in no order the disk likes) find them cached. Damage
/// is left for the walk to meet and report.
pub(crate) fn warm(fs: &mut Filesystem, subvol: u64) {
    use crate::tree::walk::{walk, OnDamage, Place, WalkOptions};
    use std::ops::ControlFlow;
    let img = fs.store.image();
    let opts = WalkOptions {
        on_damage: OnDamage::Skip,
        prefetch: true,
        ..Default::default()
    };
    for id in [subvol, crate::format::consts::BTRFS_CSUM_TREE_OBJECTID] {
        let Ok(Some(root)) = img.find_root(id) else {
            continue;
        };
        let mut seen = std::collections::HashSet::new();
        let start = Place::start(root.bytenr, crate::tree::Expect::root(&root));
        let _ = walk::<()>(img, start, &opts, &mut seen, |_| {
            ControlFlow::Continue(true)
        });
    }
}

/// A small file read whole, for a writer thread to make.
struct FileJob {
    dir: SharedDir,
    name: Vec<u8>,
    shown: String,
    size: u64,
    /// Data runs: (file offset, bytes).
    data: Vec<(u64, Vec<u8>)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    meta: Option<Meta>,
}

#[derive(Default)]
struct WriterState {
    /// The first write that failed for want of room: the restore stops.
    fatal: Option<Error>,
    /// Files a writer could not make (the host refused the name...).
    lost: Vec<Lost>,
    /// Files found at the destination (made since the walk looked).
    existing: u64,
    warnings: Vec<String>,
}

/// Small files handed to a writer at once.
const BATCH: usize = 64;
/// Most file bytes read and not yet written (the reader waits above it).
const IN_FLIGHT_BYTES: u64 = 8 << 20;
/// Most files read and not yet written.
const IN_FLIGHT_FILES: u64 = 8 << 10;
/// Most batches in flight: each holds its directory open, so this bounds
/// the descriptors a restore holds whatever the tree's shape.
const IN_FLIGHT_BATCHES: u64 = 256;

/// Work handed over and not done: what bounds the reader's lead.
#[derive(Default)]
struct InFlight {
    files: u64,
    bytes: u64,
    batches: u64,
}

/// Threads that make small files while the tree is read: creating files
/// on the host is most of a restore's time, and it runs in parallel.
///
/// Each directory's files go to one writer, the next directory's to the
/// next: writers creating files in one host directory at once queue on
/// its lock (the host kernel spins on it, which costs more than the
/// files), while the reader, far faster, runs several directories ahead.
/// Files go over in batches (a hand-over per file costs a wake-up), and
/// what is read ahead is bounded in files, bytes and directories.
struct Writers {
    txs: Vec<std::sync::mpsc::Sender<Vec<FileJob>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    state: Arc<std::sync::Mutex<WriterState>>,
    flight: Arc<(std::sync::Mutex<InFlight>, std::sync::Condvar)>,
    /// The directory being filled (by identity), its writer, and its jobs
    /// not handed over.
    dir: Option<*const DestDir>,
    next: usize,
    batch: Vec<FileJob>,
}

fn job_bytes(j: &FileJob) -> u64 {
    j.data.iter().map(|d| d.1.len() as u64).sum::<u64>() + 256
}

impl Writers {
    fn start() -> Writers {
        let n = std::thread::available_parallelism()
            .map_or(2, |n| n.get() * 2)
            .clamp(2, 8);
        let state: Arc<std::sync::Mutex<WriterState>> = Arc::default();
        let flight: Arc<(std::sync::Mutex<InFlight>, std::sync::Condvar)> = Arc::default();
        let mut txs = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<FileJob>>();
            let (state, flight) = (state.clone(), flight.clone());
            let t = std::thread::Builder::new()
                .name(format!("btrkit-restore-{i}"))
                .spawn(move || {
                    while let Ok(batch) = rx.recv() {
                        let mut out = WriterState::default();
                        for job in &batch {
                            write_job(job, &mut out);
                        }
                        let bytes = batch.iter().map(job_bytes).sum::<u64>();
                        let files = batch.len() as u64;
                        drop(batch);
                        if let Ok(mut s) = state.lock() {
                            s.warnings.append(&mut out.warnings);
                            s.lost.append(&mut out.lost);
                            s.existing += out.existing;
                            if let Some(e) = out.fatal {
                                s.fatal.get_or_insert(e);
                            }
                        }
                        let (m, cv) = &*flight;
                        if let Ok(mut f) = m.lock() {
                            f.files -= files;
                            f.bytes -= bytes;
                            f.batches -= 1;
                        }
                        cv.notify_all();
                    }
                });
            if let Ok(t) = t {
                txs.push(tx);
                threads.push(t);
            }
        }
        Writers {
            txs,
            threads,
            state,
            flight,
            dir: None,
            next: 0,
            batch: Vec::with_capacity(BATCH),
        }
    }

    /// Hand `job` to a writer (made here if no writer thread runs).
    fn send(&mut self, job: FileJob, r: &mut RestoreReport) -> Result<()> {
        if self.txs.is_empty() {
            let mut out = WriterState::default();
            write_job(&job, &mut out);
            r.warnings.append(&mut out.warnings);
            r.lost.append(&mut out.lost);
            r.skipped_existing += out.existing;
            return out.fatal.map_or(Ok(()), Err);
        }
        let id = Arc::as_ptr(&job.dir);
        if Some(id) != self.dir {
            self.flush()?;
            self.dir = Some(id);
            self.next = (self.next + 1) % self.txs.len();
        }
        self.batch.push(job);
        if self.batch.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if let Some(e) = self.state.lock().ok().and_then(|mut s| s.fatal.take()) {
            return Err(e);
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        let (files, bytes) = (batch.len() as u64, batch.iter().map(job_bytes).sum::<u64>());
        {
            let (m, cv) = &*self.flight;
            let mut f = m
                .lock()
                .map_err(|_| Error::Internal("restore writer state poisoned".into()))?;
            // Wait for room (work in flight always drains: writers never
            // wait on the reader).
            while f.files > 0
                && (f.files + files > IN_FLIGHT_FILES
                    || f.bytes + bytes > IN_FLIGHT_BYTES
                    || f.batches >= IN_FLIGHT_BATCHES)
            {
                f = cv
                    .wait(f)
                    .map_err(|_| Error::Internal("restore writer state poisoned".into()))?;
            }
            f.files += files;
            f.bytes += bytes;
            f.batches += 1;
        }
        self.txs[self.next]
            .send(batch)
            .map_err(|_| Error::Internal("restore writers stopped".into()))
    }

    /// Wait for every file handed over; the first failure, if any.
    fn finish(mut self, r: &mut RestoreReport) -> Result<()> {
        let flushed = self.flush();
        self.txs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        flushed?;
        let mut s = self
            .state
            .lock()
            .map_err(|_| Error::Internal("restore writer state poisoned".into()))?;
        // Counted as written when handed over.
        r.files = r.files.saturating_sub(s.lost.len() as u64 + s.existing);
        r.warnings.append(&mut s.warnings);
        r.lost.append(&mut s.lost);
        r.skipped_existing += s.existing;
        match s.fatal.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Make one small file: data, size, then owner and mode, xattrs, times.
fn write_job(j: &FileJob, out: &mut WriterState) {
    let fail = |out: &mut WriterState, doing: &str, e: std::io::Error| {
        if dest::is_fatal(&e) {
            out.fatal
                .get_or_insert(Error::io(format!("{}: {doing}", j.shown), e));
        } else {
            out.lost.push(Lost {
                path: j.shown.clone(),
                subvol: 0,
                ino: 0,
                what: format!("{doing} at the destination: {e}"),
            });
        }
    };
    // The walk looked (or made the directory); O_EXCL holds if something
    // appeared since: it is kept.
    let f = match j.dir.create_file(&j.name, false) {
        Ok(Created::File(f)) => f,
        Ok(Created::Exists) => {
            out.existing += 1;
            return;
        }
        Err(e) => return fail(out, "cannot create it", e),
    };
    let mut end = 0;
    for (at, data) in &j.data {
        if let Err(e) = f.write_all_at(data, *at) {
            return fail(out, "cannot write it", e);
        }
        end = at + data.len() as u64;
    }
    if end != j.size {
        if let Err(e) = f.set_len(j.size) {
            return fail(out, "cannot size it", e);
        }
    }
    finish_file(&f, &j.xattrs, j.meta.as_ref(), &j.shown, &mut out.warnings);
}

/// Largest file read whole and handed to a writer thread; larger ones are
/// copied a piece at a time on the reading thread.
const SMALL_FILE: u64 = 4 << 20;

/// The entries of directory `l` from its DIR_INDEX items, read around
/// damage: the subvolume tree is walked over the directory's key range
/// only, and a block that cannot be read loses just the entries it held.
/// Returns the entries (name, inode, type) in index order and the
/// damaged blocks with why.
#[allow(clippy::type_complexity)]
pub(crate) fn salvage_readdir(
    fs: &mut Filesystem,
    l: Loc,
) -> Result<(Vec<(Vec<u8>, Loc, u8)>, Vec<(u64, String)>)> {
    use crate::format::key::Key;
    use crate::tree::walk::{walk, OnDamage, Place, WalkEvent, WalkOptions};
    use std::ops::ControlFlow;
    let img = fs.store.image();
    let root = img
        .find_root(l.subvol)?
        .ok_or_else(|| Error::Invalid(format!("subvolume {} has no root", l.subvol)))?;
    let (lo, hi) = (
        Key::new(l.ino, BTRFS_DIR_INDEX_KEY, 0),
        Key::new(l.ino, BTRFS_DIR_INDEX_KEY, u64::MAX),
    );
    let mut out = Vec::new();
    let mut damaged = Vec::new();
    let opts = WalkOptions {
        on_damage: OnDamage::Skip,
        ..Default::default()
    };
    let mut seen = std::collections::HashSet::new();
    let start = Place::start(root.bytenr, crate::tree::Expect::root(&root));
    let _ = walk::<()>(img, start, &opts, &mut seen, |ev| match ev {
        WalkEvent::Block {
            node, problems, at, ..
        } => {
            // Only blocks whose key range meets the directory's.
            if at.lo > hi || at.hi.is_some_and(|h| h <= lo) {
                return ControlFlow::Continue(false);
            }
            if !problems.is_empty() {
                damaged.push((node.bytenr, problems[0].message.clone()));
                return ControlFlow::Continue(false);
            }
            if node.is_leaf() {
                for slot in 0..node.nritems() {
                    let Some(k) = node.key(slot) else { continue };
                    if k < lo || k > hi {
                        continue;
                    }
                    let Ok(data) = node.item_data(slot) else {
                        continue;
                    };
                    let Ok(ents) = crate::format::dir::parse_dir_items(data) else {
                        continue;
                    };
                    for e in ents {
                        let loc = Key::from(e.item.location);
                        let child = if loc.ty == BTRFS_ROOT_ITEM_KEY {
                            Loc {
                                subvol: loc.objectid,
                                ino: BTRFS_FIRST_FREE_OBJECTID,
                                parent: 0,
                            }
                        } else {
                            Loc {
                                subvol: l.subvol,
                                ino: loc.objectid,
                                parent: 0,
                            }
                        };
                        out.push((e.name.to_vec(), child, e.item.type_));
                    }
                }
            }
            ControlFlow::Continue(true)
        }
        WalkEvent::Unreadable {
            bytenr, error, at, ..
        } => {
            if !(at.lo > hi || at.hi.is_some_and(|h| h <= lo)) {
                damaged.push((bytenr, error.to_string()));
            }
            ControlFlow::Continue(false)
        }
        _ => ControlFlow::Continue(false),
    });
    Ok((out, damaged))
}

/// Whether subvolume `id` was made as a snapshot (its root item names a
/// parent).
fn is_snapshot(fs: &mut Filesystem, id: u64) -> bool {
    fs.store
        .root_state(id)
        .ok()
        .and_then(|s| s.item.as_ref().map(|(_, ri)| ri.parent_uuid != [0u8; 16]))
        .unwrap_or(false)
}

/// Read `[at, at+n)` of a file, checksums verified. With `allow_bad`,
/// data no copy of which passes is read as it stands, sector by sector,
/// and the failing ranges are added to `bad` (merged).
fn read_checked(
    fs: &mut Filesystem,
    l: Loc,
    at: u64,
    n: u64,
    allow_bad: bool,
    bad: &mut Vec<(u64, u64)>,
) -> Result<Vec<u8>> {
    match fs.read_untracked(l, at, n) {
        Ok(d) => Ok(d),
        Err(e) if allow_bad && e.as_errno() == libc::EIO => {
            let ss = u64::from(fs.store.sectorsize()).max(512);
            let mut out = Vec::with_capacity(n.min(READ_CHUNK) as usize);
            let mut pos = at;
            let end = at.saturating_add(n);
            while pos < end {
                let piece = (end - pos).min(ss - pos % ss);
                match fs.read_untracked(l, pos, piece) {
                    Ok(d) => out.extend_from_slice(&d),
                    Err(_) => {
                        let d = fs.read_unverified(l, pos, piece)?;
                        match bad.last_mut() {
                            Some(last) if last.0 + last.1 == pos => last.1 += piece,
                            _ => bad.push((pos, piece)),
                        }
                        out.extend_from_slice(&d);
                    }
                }
                pos += piece;
            }
            Ok(out)
        }
        Err(e) => Err(e),
    }
}

/// A small file's data runs, read whole (decompressed, checksums verified).
fn read_small(
    fs: &mut Filesystem,
    l: Loc,
    size: u64,
    allow_bad: bool,
    bad: &mut Vec<(u64, u64)>,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    for (s, e, kind) in crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino)? {
        if kind != MapKind::Data || s >= size {
            continue;
        }
        let end = e.min(size);
        out.push((s, read_checked(fs, l, s, end - s, allow_bad, bad)?));
    }
    Ok(out)
}

/// Write a regular file's data: its data runs read (decompressed, with
/// checksums verified) and written where they are; holes and
/// preallocated space left as holes; the size set last. The file, open,
/// for its metadata; None when one was found there (made since the walk
/// looked) and kept.
#[allow(clippy::too_many_arguments)]
fn copy_file(
    fs: &mut Filesystem,
    l: Loc,
    size: u64,
    d: &DestDir,
    name: &[u8],
    shown: &str,
    o: &RestoreOptions,
    r: &mut RestoreReport,
) -> std::result::Result<Option<std::fs::File>, Failure> {
    let runs =
        crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino).map_err(Failure::Image)?;
    let f = match d.create_file(name, false).map_err(Failure::Host)? {
        Created::File(f) => f,
        Created::Exists => {
            r.skipped_existing += 1;
            return Ok(None);
        }
    };
    let mut bad = Vec::new();
    for (s, e, kind) in runs {
        if kind != MapKind::Data {
            continue;
        }
        let (mut at, end) = (s, e.min(size));
        while at < end {
            let n = (end - at).min(READ_CHUNK);
            let data =
                read_checked(fs, l, at, n, o.write_bad_data, &mut bad).map_err(Failure::Image)?;
            f.write_all_at(&data, at).map_err(Failure::Host)?;
            r.bytes += data.len() as u64;
            at += n;
        }
    }
    f.set_len(size).map_err(Failure::Host)?;
    if !bad.is_empty() {
        r.bad_data.push(BadData {
            path: shown.to_string(),
            ranges: bad,
        });
    }
    r.files += 1;
    Ok(Some(f))
}

/// The size of a file whose inode item is lost, where it is known: 0 when
/// it has no extent items either (an empty file under its name, as btrfs
/// restore makes it). With extents, the size is not known (the last
/// extent ends on a sector boundary, i_size anywhere before it): the
/// file is lost rather than restored with contents that may be wrong.
pub(crate) fn size_from_extents(fs: &mut Filesystem, l: Loc) -> Result<u64> {
    let runs = crate::fs::read::extent_map(&mut fs.store, l.subvol, l.ino)?;
    if runs.is_empty() {
        Ok(0)
    } else {
        Err(Error::Invalid(format!(
            "its size is not known ({} extent items, up to byte {})",
            runs.len(),
            runs.iter().map(|x| x.1).max().unwrap_or(0)
        )))
    }
}
