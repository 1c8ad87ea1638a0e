//! The fsync log as a person wants to read it: for each subvolume that has a
//! log tree, the logged items grouped by inode (inode item, names, directory
//! entries and dir-log ranges, xattrs, file extents, orphan marks), the data
//! checksum ranges the log carries, and everything else as "other items".
//!
//! Inspection reads the log with the shared reader ([`super::reader`]) in
//! its lenient mode: damaged or unreadable log blocks become [`LogProblem`]s
//! and the walk goes on with whatever is still reachable, so a damaged log
//! can still be looked at. Nothing here fails.

pub use super::reader::LogProblem;
use super::reader::{covered_bytes, read_log, LogTree, OnDamage, ReadOptions, TreeRead};
use crate::format::consts::*;
use crate::format::file_extent::FileExtent;
use crate::format::inode::InodeItem;
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::format::names::key_type_name;
use crate::image::Image;
use crate::tree::{TreeIter, TreeRoot};
use crate::Error;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The whole log of an image whose superblock has a non-zero `log_root`.
#[derive(Clone, Debug, Serialize)]
pub struct LogDump {
    /// Generation of the last committed transaction; the log belongs to the
    /// next one.
    pub super_generation: u64,
    /// The superblock's deprecated `log_root_transid` (0 on current kernels).
    pub log_root_transid: u64,
    /// The log root tree, which holds one ROOT_ITEM per subvolume log.
    pub log_root: TreeInfo,
    /// One entry per subvolume log tree, in log root tree key order.
    pub subvols: Vec<SubvolLog>,
    /// Items of the log root tree that are not log tree ROOT_ITEMs.
    pub other: Vec<OtherItem>,
    /// Damage found in the log root tree itself.
    pub problems: Vec<LogProblem>,
}

impl LogDump {
    /// Every problem, in the log root tree and in each subvolume log.
    pub fn problem_count(&self) -> usize {
        self.problems.len() + self.subvols.iter().map(|s| s.problems.len()).sum::<usize>()
    }
    /// Whether any problem was found anywhere in the log.
    pub fn is_damaged(&self) -> bool {
        self.problem_count() > 0
    }
}

/// Where a tree starts and how much of it was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeInfo {
    /// Logical address of the tree's root block.
    pub bytenr: u64,
    /// Level of the root block, as its referrer gives it.
    pub level: u8,
    /// Generation the referrer (superblock or root item) expects of the root block.
    pub generation: u64,
    /// Generation in the root block's header, when that block could be read.
    pub block_generation: Option<u64>,
    /// Blocks whose contents were used.
    pub blocks: usize,
    /// Leaves among those blocks.
    pub leaves: usize,
    /// Items read from the tree.
    pub items: usize,
}

impl TreeInfo {
    fn of(r: &TreeRead, items: usize) -> TreeInfo {
        TreeInfo {
            bytenr: r.root.bytenr,
            level: r.root.level,
            generation: r.root.generation,
            block_generation: r.root_block_generation,
            blocks: r.blocks.len(),
            leaves: r.leaves(),
            items,
        }
    }
}

/// The log tree of one subvolume.
#[derive(Clone, Debug, Serialize)]
pub struct SubvolLog {
    /// Subvolume (fs tree) id: the offset of the log's ROOT_ITEM key.
    pub subvol: u64,
    /// Where the subvolume's log tree starts and how much of it was read.
    pub tree: TreeInfo,
    /// Logged inodes in inode number order.
    pub inodes: Vec<LoggedInode>,
    /// EXTENT_CSUM items: checksums of data written since the last commit.
    pub csums: Vec<CsumRange>,
    /// Items that belong to no inode.
    pub other: Vec<OtherItem>,
    /// Damage found in this log tree.
    pub problems: Vec<LogProblem>,
}

/// Everything the log holds about one inode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LoggedInode {
    /// Inode number.
    pub ino: u64,
    /// A path inside the subvolume for orientation, built from the names in
    /// the log and, for ancestors the log does not name, from the committed
    /// fs tree. `<ino N>` stands for an ancestor whose name was not found;
    /// None when the inode itself has no name anywhere.
    pub path: Option<String>,
    /// The logged INODE_ITEM, decoded; `None` when the log has none for the inode.
    pub inode: Option<InodeSummary>,
    /// Its INODE_REF and INODE_EXTREF names.
    pub names: Vec<LoggedName>,
    /// Its DIR_ITEM and DIR_INDEX entries (directories).
    pub dir_entries: Vec<LoggedDirEntry>,
    /// Its DIR_LOG_ITEM / DIR_LOG_INDEX ranges (directories).
    pub dir_log_ranges: Vec<DirLogRange>,
    /// Its XATTR_ITEMs.
    pub xattrs: Vec<LoggedXattr>,
    /// Its EXTENT_DATA items, in file offset order.
    pub extents: Vec<LoggedExtent>,
    /// The log holds an ORPHAN_ITEM for this inode (a fsynced inode with no
    /// links left, such as an O_TMPFILE).
    pub orphan: bool,
    /// Its items of other types, or whose body did not decode.
    pub other: Vec<OtherItem>,
}

/// A timestamp of an inode item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Time {
    /// Seconds since the epoch (negative before 1970).
    pub sec: i64,
    /// Nanoseconds within the second (an on-disk count of 10^9 or more
    /// clamped to 999,999,999).
    pub nsec: u32,
}

/// A logged INODE_ITEM, field by field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InodeSummary {
    /// File type and permission bits.
    pub mode: u32,
    /// File type from the mode: file, dir, symlink, chrdev, blkdev, fifo, sock.
    pub kind: &'static str,
    /// i_size (bytes); for a directory, twice the length of its names.
    pub size: u64,
    /// Bytes of data extents the inode references (the kernel's inode_get_bytes).
    pub nbytes: u64,
    /// Link count.
    pub nlink: u32,
    /// Transid that created the inode; 0 in the log marks an inode logged only
    /// to say it exists (LOG_INODE_EXISTS), whose committed item replay keeps.
    pub generation: u64,
    /// Transid of the last change to the inode.
    pub transid: u64,
    /// Inode flags (BTRFS_INODE_*).
    pub flags: u64,
    /// Names of the set `flags`.
    pub flag_names: Vec<String>,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Encoded device number (device nodes).
    pub rdev: u64,
    /// Change counter (`i_version`).
    pub sequence: u64,
    /// Block group hint; unused by current kernels.
    pub block_group: u64,
    /// Access time.
    pub atime: Time,
    /// Change time.
    pub ctime: Time,
    /// Modification time.
    pub mtime: Time,
    /// Creation time.
    pub otime: Time,
}

/// Which item holds a logged name of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameKind {
    /// INODE_REF: the parent is the key offset.
    Ref,
    /// INODE_EXTREF: the parent is stored in the entry.
    Extref,
}

/// One name of a logged inode, from its INODE_REF or INODE_EXTREF.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoggedName {
    /// Which item the name is in.
    pub kind: NameKind,
    /// Inode number of the directory holding the name.
    pub parent: u64,
    /// DIR_INDEX of the name in `parent`.
    pub index: u64,
    /// The name, with bytes that are not printable UTF-8 escaped as `\xNN`.
    pub name: String,
}

/// Which item holds a logged directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirEntryKind {
    /// DIR_ITEM: the key offset is the name hash.
    DirItem,
    /// DIR_INDEX: the key offset is the directory index.
    DirIndex,
}

/// One logged directory entry (of a DIR_ITEM or DIR_INDEX).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoggedDirEntry {
    /// Which item the entry is in.
    pub kind: DirEntryKind,
    /// Offset of the item's key: the name hash or the directory index.
    pub key_offset: u64,
    /// The name, with bytes that are not printable UTF-8 escaped as `\xNN`.
    pub name: String,
    /// What the entry points to: (inode, INODE_ITEM, 0) or a subvolume's
    /// (root id, ROOT_ITEM, -1).
    pub location: Key,
    /// File type of the target (BTRFS_FT_*).
    pub file_type: u8,
    /// `file_type` as a word (`file`, `dir`, `symlink`, ...).
    pub type_name: String,
    /// Transid recorded in the entry.
    pub transid: u64,
}

/// Which index of a directory a dir-log range covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirLogKind {
    /// DIR_LOG_ITEM: a range of DIR_ITEM key offsets (name hashes).
    DirLogItem,
    /// DIR_LOG_INDEX: a range of DIR_INDEX key offsets (directory indexes).
    DirLogIndex,
}

/// A DIR_LOG_ITEM / DIR_LOG_INDEX: the key offset range `[start, end]` of
/// the directory whose entries the log holds completely, so replay deletes
/// entries in that range that the log does not have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DirLogRange {
    /// Which index the range covers.
    pub kind: DirLogKind,
    /// First key offset of the range (the item's key offset).
    pub start: u64,
    /// Last key offset of the range, inclusive (the item's body).
    pub end: u64,
}

/// One logged extended attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoggedXattr {
    /// The attribute name, escaped as names are.
    pub name: String,
    /// Length of the value (bytes).
    pub value_len: usize,
    /// Printable values in double quotes, others as hex; cut at 64 bytes
    /// (then ending in `...`).
    pub value_preview: String,
}

/// Type of a file extent item (BTRFS_FILE_EXTENT_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtentKind {
    /// Data stored in the item itself.
    Inline,
    /// Data in a disk extent (or a hole, when `disk_bytenr` is 0).
    Regular,
    /// Preallocated disk extent not yet written (reads as zeros).
    Prealloc,
}

/// One logged EXTENT_DATA item, with the checksum coverage replay needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoggedExtent {
    /// File offset: the key offset.
    pub file_offset: u64,
    /// Type of the extent.
    pub kind: ExtentKind,
    /// Transid in which the extent was written.
    pub generation: u64,
    /// Compression name (`none`, `zlib`, `lzo`, `zstd`, or `unknown(N)`).
    pub compression: String,
    /// Encryption field of the item (always 0 on btrfs).
    pub encryption: u8,
    /// Other-encoding field of the item (always 0 on btrfs).
    pub other_encoding: u16,
    /// Uncompressed size of the data (bytes; of the whole disk extent for
    /// regular and prealloc extents).
    pub ram_bytes: u64,
    /// Bytes of inline data in the item (inline extents only).
    pub inline_len: Option<u64>,
    /// The on-disk extent (regular and prealloc only; 0 is a hole).
    pub disk_bytenr: Option<u64>,
    /// Size of the on-disk extent (bytes; compressed size when compressed).
    pub disk_num_bytes: Option<u64>,
    /// Offset into the on-disk extent where this file range starts.
    pub offset: Option<u64>,
    /// Length of the file range.
    pub num_bytes: Option<u64>,
    /// Bytes of data checksums replay needs for this extent, by the one
    /// rule of [`LogTree::csum_needs`]: what a regular extent refers to of
    /// its disk extent (all of it when compressed), for an inode that keeps
    /// checksums. None when nothing is needed (inline, prealloc, hole,
    /// NODATASUM).
    pub csum_bytes_needed: Option<u64>,
    /// How many of the needed bytes the log's EXTENT_CSUM items cover; less
    /// than `csum_bytes_needed` means replay must find the rest in the csum
    /// tree (data committed before) or the log lacks them.
    pub csum_bytes_in_log: Option<u64>,
}

/// One EXTENT_CSUM item: checksums of `csums` data sectors from `start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CsumRange {
    /// Logical address of the first data sector covered (the key offset).
    pub start: u64,
    /// Bytes of data covered: `csums` times the sector size.
    pub len: u64,
    /// Number of checksums in the item, one per data sector.
    pub csums: u64,
}

/// An item shown only by its key and size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OtherItem {
    /// The item's key.
    pub key: Key,
    /// Name of the key type.
    pub type_name: String,
    /// Size of the item body (bytes).
    pub size: usize,
    /// Why the item's body could not be decoded, if it could not.
    pub error: Option<String>,
}

/// Read the log of `img`: None when the superblock has no log root.
pub fn inspect_log(img: &Image) -> Option<LogDump> {
    // Lenient reading fails only without a log.
    let read = read_log(img, ReadOptions::new(OnDamage::Keep)).ok()??;
    let other = read
        .root_tree_other
        .iter()
        .map(|(k, size, err)| other_item(*k, *size, err.clone()))
        .collect();
    let root_items = read.roots.len() + read.root_tree_other.len();
    let subvols = read
        .trees
        .iter()
        .map(|t| inspect_subvol_log(img, t))
        .collect();
    Some(LogDump {
        super_generation: read.super_generation,
        log_root_transid: read.log_root_transid,
        log_root: TreeInfo::of(&read.root_tree, root_items),
        subvols,
        other,
        problems: read.root_tree.problems.clone(),
    })
}

/// Group the items of one log tree by inode.
fn inspect_subvol_log(img: &Image, tree: &LogTree) -> SubvolLog {
    let mut problems = tree.read.problems.clone();
    let mut g = LogGrouper::new(img.csum.size(), img.sectorsize);
    for (i, (key, data)) in tree.items.iter().enumerate() {
        if let Err(e) = g.add(*key, data) {
            // Validation may have named this item already.
            if !problems.iter().any(|p| p.key == Some(*key)) {
                let bytenr = tree.leaf_of(i);
                problems.push(LogProblem {
                    bytenr,
                    key: Some(*key),
                    message: error_text(&e),
                    class: super::reader::ProblemClass::Item,
                    slot: None,
                });
            }
        }
    }
    let (mut inodes, csums, other) = g.finish();
    fill_csum_coverage(&mut inodes, tree, img.csum.size(), img.sectorsize);
    // Ancestors the log does not name are looked up in the committed fs tree
    // of the subvolume; a damaged or missing fs tree only costs path detail.
    let subvol = tree.subvol;
    let fs_root = img.find_root(subvol).ok().flatten();
    let mut cache: HashMap<u64, Option<(u64, String)>> = HashMap::new();
    resolve_paths(&mut inodes, |ino| {
        cache
            .entry(ino)
            .or_insert_with(|| fs_root.and_then(|r| committed_name(img, r, ino)))
            .clone()
    });
    SubvolLog {
        subvol,
        tree: TreeInfo::of(&tree.read, tree.items.len()),
        inodes,
        csums,
        other,
        problems,
    }
}

fn error_text(e: &Error) -> String {
    super::reader::error_text(e)
}

fn other_item(key: Key, size: usize, error: Option<String>) -> OtherItem {
    let type_name = match key_type_name(key.objectid, key.ty) {
        Some(n) => n.to_string(),
        None => format!("UNKNOWN.{}", key.ty),
    };
    OtherItem {
        key,
        type_name,
        size,
        error,
    }
}

/// The first name of `ino` in the committed tree `root`: (parent, name).
pub(crate) fn committed_name(img: &Image, root: TreeRoot, ino: u64) -> Option<(u64, String)> {
    let mut it = TreeIter::new(img, root, Key::new(ino, BTRFS_INODE_REF_KEY, 0)).ok()?;
    let item = it.next_item()?.ok()?;
    if item.key.objectid != ino {
        return None;
    }
    let (key, body) = item.decode(img.csum.size()).ok()?;
    match body {
        ItemBody::InodeRef(v) => v.first().map(|r| (key.offset, escape_bytes(r.name))),
        ItemBody::InodeExtref(v) => v.first().map(|r| (r.parent, escape_bytes(r.name))),
        _ => None,
    }
}

/// Sorts log items into per-inode sections. Separate from any I/O so the
/// grouping can be tested on synthetic items.
pub struct LogGrouper {
    csum_size: usize,
    sectorsize: u32,
    inodes: BTreeMap<u64, LoggedInode>,
    csums: Vec<CsumRange>,
    other: Vec<OtherItem>,
}

impl LogGrouper {
    /// A grouper for a filesystem with checksums of `csum_size` bytes per
    /// `sectorsize`-byte data sector.
    pub fn new(csum_size: usize, sectorsize: u32) -> LogGrouper {
        LogGrouper {
            csum_size,
            sectorsize,
            inodes: BTreeMap::new(),
            csums: Vec::new(),
            other: Vec::new(),
        }
    }

    fn inode(&mut self, ino: u64) -> &mut LoggedInode {
        self.inodes.entry(ino).or_insert_with(|| LoggedInode {
            ino,
            ..Default::default()
        })
    }

    /// Place one log tree item. An item whose body does not decode is kept
    /// as an "other" item carrying the error, which is also returned.
    pub fn add(&mut self, key: Key, data: &[u8]) -> Result<(), Error> {
        // Inode numbers are everything below the reserved negative ids.
        let is_inode = key.objectid <= BTRFS_LAST_FREE_OBJECTID;
        let body = match decode(&key, data, self.csum_size) {
            Ok(b) => b,
            Err(e) => {
                let o = other_item(key, data.len(), Some(error_text(&e)));
                if is_inode {
                    self.inode(key.objectid).other.push(o);
                } else {
                    self.other.push(o);
                }
                return Err(e);
            }
        };
        if key.objectid == BTRFS_EXTENT_CSUM_OBJECTID && key.ty == BTRFS_EXTENT_CSUM_KEY {
            if let ItemBody::ExtentCsum(d) = body {
                // decode guarantees a non-zero csum_size dividing the item.
                let csums = (d.len() / self.csum_size.max(1)) as u64;
                self.csums.push(CsumRange {
                    start: key.offset,
                    len: csums * self.sectorsize as u64,
                    csums,
                });
                return Ok(());
            }
        }
        if key.objectid == BTRFS_ORPHAN_OBJECTID && key.ty == BTRFS_ORPHAN_ITEM_KEY {
            self.inode(key.offset).orphan = true;
            return Ok(());
        }
        if !is_inode {
            self.other.push(other_item(key, data.len(), None));
            return Ok(());
        }
        let ino = self.inode(key.objectid);
        match body {
            ItemBody::InodeItem(i) if key.ty == BTRFS_INODE_ITEM_KEY => {
                ino.inode = Some(summarize_inode(i))
            }
            ItemBody::InodeRef(v) => ino.names.extend(v.iter().map(|r| LoggedName {
                kind: NameKind::Ref,
                parent: key.offset,
                index: r.index,
                name: escape_bytes(r.name),
            })),
            ItemBody::InodeExtref(v) => ino.names.extend(v.iter().map(|r| LoggedName {
                kind: NameKind::Extref,
                parent: r.parent,
                index: r.index,
                name: escape_bytes(r.name),
            })),
            ItemBody::DirItem(v) if key.ty == BTRFS_XATTR_ITEM_KEY => {
                ino.xattrs.extend(v.iter().map(|e| LoggedXattr {
                    name: escape_bytes(e.name),
                    value_len: e.data.len(),
                    value_preview: preview_value(e.data),
                }))
            }
            ItemBody::DirItem(v) => {
                let kind = if key.ty == BTRFS_DIR_INDEX_KEY {
                    DirEntryKind::DirIndex
                } else {
                    DirEntryKind::DirItem
                };
                ino.dir_entries.extend(v.iter().map(|e| LoggedDirEntry {
                    kind,
                    key_offset: key.offset,
                    name: escape_bytes(e.name),
                    location: Key::from(&e.item.location),
                    file_type: e.item.type_,
                    type_name: file_type_name(e.item.type_),
                    transid: e.item.transid.get(),
                }))
            }
            ItemBody::DirLog(d) => ino.dir_log_ranges.push(DirLogRange {
                kind: if key.ty == BTRFS_DIR_LOG_INDEX_KEY {
                    DirLogKind::DirLogIndex
                } else {
                    DirLogKind::DirLogItem
                },
                start: key.offset,
                end: d.end.get(),
            }),
            ItemBody::FileExtent(fe) => ino.extents.push(summarize_extent(key.offset, &fe)),
            _ => ino.other.push(other_item(key, data.len(), None)),
        }
        Ok(())
    }

    /// The inodes in number order, the checksum ranges and the other items,
    /// each in the order they were added (tree key order for a walk).
    pub fn finish(self) -> (Vec<LoggedInode>, Vec<CsumRange>, Vec<OtherItem>) {
        (self.inodes.into_values().collect(), self.csums, self.other)
    }
}

/// Set `csum_bytes_needed` and `csum_bytes_in_log` of every extent of
/// `inodes` from the shared rule and the log's checksum items.
pub fn fill_csum_coverage(
    inodes: &mut [LoggedInode],
    tree: &LogTree,
    csum_size: usize,
    sectorsize: u32,
) {
    let have = tree.csum_ranges(csum_size, sectorsize);
    let needs: HashMap<(u64, u64), (u64, u64)> = tree
        .csum_needs()
        .into_iter()
        .map(|n| ((n.ino, n.file_offset), (n.start, n.end)))
        .collect();
    for i in inodes.iter_mut() {
        for e in i.extents.iter_mut() {
            if let Some(&(start, end)) = needs.get(&(i.ino, e.file_offset)) {
                e.csum_bytes_needed = Some(end - start);
                e.csum_bytes_in_log = Some(covered_bytes(&have, start, end));
            }
        }
    }
}

/// Fill in `path` of every inode. `committed` gives (parent, name) of an
/// inode that the log does not name, or None.
pub fn resolve_paths<F>(inodes: &mut [LoggedInode], mut committed: F)
where
    F: FnMut(u64) -> Option<(u64, String)>,
{
    let logged: HashMap<u64, (u64, String)> = inodes
        .iter()
        .filter_map(|i| i.names.first().map(|n| (i.ino, (n.parent, n.name.clone()))))
        .collect();
    for i in inodes.iter_mut() {
        i.path = path_of(i.ino, &logged, &mut committed);
    }
}

/// None when the inode itself has no name anywhere (an O_TMPFILE, or an
/// inode whose names are all gone).
fn path_of<F>(ino: u64, logged: &HashMap<u64, (u64, String)>, committed: &mut F) -> Option<String>
where
    F: FnMut(u64) -> Option<(u64, String)>,
{
    let mut parts: Vec<String> = Vec::new();
    let mut cur = ino;
    // Names can form a loop in a damaged image; a path deeper than this is
    // cut short rather than followed forever.
    for _ in 0..256 {
        if cur == BTRFS_FIRST_FREE_OBJECTID {
            parts.reverse();
            return Some(format!("/{}", parts.join("/")));
        }
        let next = logged.get(&cur).cloned().or_else(|| committed(cur));
        match next {
            Some((parent, name)) if parent != cur => {
                parts.push(name);
                cur = parent;
            }
            _ => break,
        }
    }
    if parts.is_empty() {
        return None;
    }
    parts.push(format!("<ino {cur}>"));
    parts.reverse();
    Some(parts.join("/"))
}

fn summarize_inode(i: &InodeItem) -> InodeSummary {
    let t = |ts: &crate::format::inode::Timespec| {
        let (sec, nsec) = ts.get();
        Time { sec, nsec }
    };
    let mode = i.mode.get();
    InodeSummary {
        mode,
        kind: mode_kind(mode),
        size: i.size.get(),
        nbytes: i.nbytes.get(),
        nlink: i.nlink.get(),
        generation: i.generation.get(),
        transid: i.transid.get(),
        flags: i.flags.get(),
        flag_names: inode_flag_names(i.flags.get()),
        uid: i.uid.get(),
        gid: i.gid.get(),
        rdev: i.rdev.get(),
        sequence: i.sequence.get(),
        block_group: i.block_group.get(),
        atime: t(&i.atime),
        ctime: t(&i.ctime),
        mtime: t(&i.mtime),
        otime: t(&i.otime),
    }
}

fn summarize_extent(file_offset: u64, fe: &FileExtent<'_>) -> LoggedExtent {
    let h = fe.head();
    let mut e = LoggedExtent {
        file_offset,
        kind: ExtentKind::Inline,
        generation: h.generation.get(),
        compression: compression_name(h.compression),
        encryption: h.encryption,
        other_encoding: h.other_encoding.get(),
        ram_bytes: h.ram_bytes.get(),
        inline_len: None,
        disk_bytenr: None,
        disk_num_bytes: None,
        offset: None,
        num_bytes: None,
        csum_bytes_needed: None,
        csum_bytes_in_log: None,
    };
    match fe {
        FileExtent::Inline { data, .. } => e.inline_len = Some(data.len() as u64),
        FileExtent::Disk { head, item } => {
            e.kind = if head.type_ == BTRFS_FILE_EXTENT_PREALLOC {
                ExtentKind::Prealloc
            } else {
                ExtentKind::Regular
            };
            e.disk_bytenr = Some(item.disk_bytenr.get());
            e.disk_num_bytes = Some(item.disk_num_bytes.get());
            e.offset = Some(item.offset.get());
            e.num_bytes = Some(item.num_bytes.get());
        }
    }
    e
}

/// File type of `mode` as a word: file, dir, symlink, chrdev, blkdev, fifo,
/// sock, or unknown.
pub fn mode_kind(mode: u32) -> &'static str {
    match mode & 0o170000 {
        0o100000 => "file",
        0o040000 => "dir",
        0o120000 => "symlink",
        0o020000 => "chrdev",
        0o060000 => "blkdev",
        0o010000 => "fifo",
        0o140000 => "sock",
        _ => "unknown",
    }
}

/// A directory entry's file type (BTRFS_FT_*) as a word, with `+encrypted`
/// for the encrypted flag and `type N` for unknown values.
pub fn file_type_name(t: u8) -> String {
    let base = match t & !BTRFS_FT_ENCRYPTED {
        BTRFS_FT_UNKNOWN => "unknown",
        BTRFS_FT_REG_FILE => "file",
        BTRFS_FT_DIR => "dir",
        BTRFS_FT_CHRDEV => "chrdev",
        BTRFS_FT_BLKDEV => "blkdev",
        BTRFS_FT_FIFO => "fifo",
        BTRFS_FT_SOCK => "sock",
        BTRFS_FT_SYMLINK => "symlink",
        BTRFS_FT_XATTR => "xattr",
        other => return format!("type {other}"),
    };
    if t & BTRFS_FT_ENCRYPTED != 0 {
        format!("{base}+encrypted")
    } else {
        base.to_string()
    }
}

/// A compression type's name, `unknown(N)` for one the format does not
/// define.
pub fn compression_name(c: u8) -> String {
    crate::format::names::compression_name(c)
        .map_or_else(|| format!("unknown({c})"), str::to_string)
}

pub use crate::format::names::inode_flag_names;

/// Bytes as text: printable UTF-8 as is, a backslash doubled, everything
/// else as `\xNN`, so any name can be shown on one line and told apart.
pub fn escape_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                s.push_str("\\\\");
            } else if c.is_control() {
                let mut buf = [0u8; 4];
                for byte in c.encode_utf8(&mut buf).bytes() {
                    s.push_str(&format!("\\x{byte:02x}"));
                }
            } else {
                s.push(c);
            }
        }
        for byte in chunk.invalid() {
            s.push_str(&format!("\\x{byte:02x}"));
        }
    }
    s
}

const PREVIEW_MAX: usize = 64;

fn preview_value(v: &[u8]) -> String {
    let cut = &v[..v.len().min(PREVIEW_MAX)];
    let more = if v.len() > PREVIEW_MAX { "..." } else { "" };
    let text = std::str::from_utf8(cut)
        .ok()
        .filter(|t| !t.chars().any(|c| c.is_control() && c != '\n' && c != '\t'));
    match text {
        Some(t) => format!("\"{}\"{more}", t.escape_debug()),
        None => {
            let hex: String = cut.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}{more}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dir::{DirItem, DirLogItem};
    use crate::format::file_extent::FileExtentItem;
    use crate::format::inode::{InodeExtref, InodeRef};
    use zerocopy::{FromBytes, IntoBytes};

    fn inode_item(mode: u32, size: u64, nlink: u32) -> Vec<u8> {
        let i = InodeItem {
            mode: mode.into(),
            size: size.into(),
            nlink: nlink.into(),
            generation: 7.into(),
            transid: 9.into(),
            flags: (BTRFS_INODE_NODATASUM | 1 << 40).into(),
            ..Default::default()
        };
        i.as_bytes().to_vec()
    }

    fn inode_ref(index: u64, name: &[u8]) -> Vec<u8> {
        let mut v = InodeRef {
            index: index.into(),
            name_len: (name.len() as u16).into(),
        }
        .as_bytes()
        .to_vec();
        v.extend_from_slice(name);
        v
    }

    fn dir_item(loc: Key, ty: u8, name: &[u8], data: &[u8]) -> Vec<u8> {
        let mut v = DirItem {
            location: loc.to_disk(),
            transid: 9.into(),
            data_len: (data.len() as u16).into(),
            name_len: (name.len() as u16).into(),
            type_: ty,
        }
        .as_bytes()
        .to_vec();
        v.extend_from_slice(name);
        v.extend_from_slice(data);
        v
    }

    fn reg_extent(ty: u8, disk: u64, len: u64) -> Vec<u8> {
        FileExtentItem {
            generation: 9.into(),
            ram_bytes: len.into(),
            compression: BTRFS_COMPRESS_ZSTD,
            encryption: 0,
            other_encoding: 0.into(),
            type_: ty,
            disk_bytenr: disk.into(),
            disk_num_bytes: len.into(),
            offset: 0.into(),
            num_bytes: len.into(),
        }
        .as_bytes()
        .to_vec()
    }

    #[test]
    fn groups_items_by_inode() {
        let k = Key::new;
        let mut items: Vec<(Key, Vec<u8>)> = Vec::new();
        let mut add = |key: Key, data: &[u8]| items.push((key, data.to_vec()));
        add(k(257, BTRFS_INODE_ITEM_KEY, 0), &inode_item(0o40755, 48, 1));
        add(k(257, BTRFS_INODE_REF_KEY, 256), &inode_ref(2, b"d"));
        add(
            k(257, BTRFS_DIR_LOG_INDEX_KEY, 2),
            DirLogItem {
                end: u64::MAX.into(),
            }
            .as_bytes(),
        );
        add(
            k(257, BTRFS_DIR_INDEX_KEY, 5),
            &dir_item(
                k(258, BTRFS_INODE_ITEM_KEY, 0),
                BTRFS_FT_REG_FILE,
                b"f\x01",
                b"",
            ),
        );
        add(
            k(258, BTRFS_INODE_ITEM_KEY, 0),
            &inode_item(0o100644, 8192, 2),
        );
        add(k(258, BTRFS_INODE_REF_KEY, 257), &inode_ref(5, b"f\x01"));
        let mut ext = InodeExtref {
            parent_objectid: 256.into(),
            index: 9.into(),
            name_len: 1.into(),
        }
        .as_bytes()
        .to_vec();
        ext.push(b'x');
        add(k(258, BTRFS_INODE_EXTREF_KEY, 1234), &ext);
        add(
            k(258, BTRFS_XATTR_ITEM_KEY, 99),
            &dir_item(Key::MIN, BTRFS_FT_XATTR, b"user.a", b"blue"),
        );
        add(
            k(258, BTRFS_EXTENT_DATA_KEY, 0),
            &reg_extent(BTRFS_FILE_EXTENT_REG, 1 << 20, 4096),
        );
        add(
            k(258, BTRFS_EXTENT_DATA_KEY, 4096),
            &reg_extent(BTRFS_FILE_EXTENT_PREALLOC, 2 << 20, 4096),
        );
        add(k(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 300), &[]);
        add(
            k(BTRFS_EXTENT_CSUM_OBJECTID, BTRFS_EXTENT_CSUM_KEY, 1 << 20),
            &[0u8; 8],
        );
        add(k(258, BTRFS_VERITY_DESC_ITEM_KEY, 5), &[1, 2, 3]);
        add(k(BTRFS_FREE_SPACE_OBJECTID, 0, 0), &[0; 3]);
        // A body that does not decode is kept and reported.
        add(k(259, BTRFS_INODE_ITEM_KEY, 0), &[0u8; 10]);
        // An inode that keeps checksums, with a compressed extent and an
        // uncompressed one referring to the middle of its disk extent.
        let mut plain = inode_item(0o100644, 8192, 1);
        plain[64..72].copy_from_slice(&0u64.to_le_bytes());
        add(k(260, BTRFS_INODE_ITEM_KEY, 0), &plain);
        add(
            k(260, BTRFS_EXTENT_DATA_KEY, 0),
            &reg_extent(BTRFS_FILE_EXTENT_REG, 1 << 20, 4096),
        );
        let mut mid =
            FileExtentItem::read_from_bytes(&reg_extent(BTRFS_FILE_EXTENT_REG, 1 << 20, 16384))
                .unwrap();
        mid.compression = BTRFS_COMPRESS_NONE;
        mid.offset.set(4096);
        mid.num_bytes.set(8192);
        add(k(260, BTRFS_EXTENT_DATA_KEY, 4096), mid.as_bytes());
        items.sort_by_key(|i| i.0);

        let mut g = LogGrouper::new(4, 4096);
        let errors = items
            .iter()
            .filter(|(key, d)| g.add(*key, d).is_err())
            .count();
        assert_eq!(errors, 1);
        let root = TreeRoot {
            id: BTRFS_TREE_LOG_OBJECTID,
            bytenr: 0,
            level: 0,
            generation: 0,
        };
        let tree = LogTree {
            subvol: 5,
            items,
            read: TreeRead::new(root),
        };
        let (mut inodes, csums, other) = g.finish();
        fill_csum_coverage(&mut inodes, &tree, 4, 4096);
        assert_eq!(
            inodes.iter().map(|i| i.ino).collect::<Vec<_>>(),
            vec![257, 258, 259, 260, 300]
        );
        let d = &inodes[0];
        assert_eq!(d.inode.as_ref().unwrap().kind, "dir");
        assert_eq!(
            d.dir_log_ranges,
            vec![DirLogRange {
                kind: DirLogKind::DirLogIndex,
                start: 2,
                end: u64::MAX
            }]
        );
        assert_eq!(d.dir_entries.len(), 1);
        assert_eq!(d.dir_entries[0].name, "f\\x01");
        assert_eq!(d.dir_entries[0].location, k(258, BTRFS_INODE_ITEM_KEY, 0));
        assert_eq!(d.dir_entries[0].type_name, "file");
        let f = &inodes[1];
        let s = f.inode.as_ref().unwrap();
        assert_eq!((s.kind, s.size, s.nlink), ("file", 8192, 2));
        assert_eq!(
            s.flag_names,
            vec!["NODATASUM".to_string(), "0x10000000000".to_string()]
        );
        assert_eq!(f.names.len(), 2);
        assert_eq!(
            f.names[0],
            LoggedName {
                kind: NameKind::Ref,
                parent: 257,
                index: 5,
                name: "f\\x01".into()
            }
        );
        assert_eq!(
            f.names[1],
            LoggedName {
                kind: NameKind::Extref,
                parent: 256,
                index: 9,
                name: "x".into()
            }
        );
        assert_eq!(
            f.xattrs,
            vec![LoggedXattr {
                name: "user.a".into(),
                value_len: 4,
                value_preview: "\"blue\"".into()
            }]
        );
        assert_eq!(f.extents.len(), 2);
        assert_eq!(f.extents[0].kind, ExtentKind::Regular);
        assert_eq!(f.extents[0].compression, "zstd");
        assert_eq!(f.extents[1].kind, ExtentKind::Prealloc);
        assert_eq!(f.extents[1].disk_bytenr, Some(2 << 20));
        assert_eq!(f.other.len(), 1);
        assert_eq!(f.other[0].type_name, "VERITY_DESC_ITEM");
        assert!(inodes[2].other[0].error.is_some());
        assert!(inodes[4].orphan && inodes[4].inode.is_none());
        assert_eq!(
            csums,
            vec![CsumRange {
                start: 1 << 20,
                len: 8192,
                csums: 2
            }]
        );
        // 258 is NODATASUM: nothing needed. 260 keeps checksums: its
        // compressed extent needs the whole 4 KiB disk extent (covered), its
        // uncompressed one what it refers to, [+4096, +12288), half covered.
        assert_eq!(inodes[1].extents[0].csum_bytes_needed, None);
        assert_eq!(inodes[1].extents[1].csum_bytes_in_log, None);
        let c = inodes.iter().find(|i| i.ino == 260).unwrap();
        assert_eq!(
            (
                c.extents[0].csum_bytes_needed,
                c.extents[0].csum_bytes_in_log
            ),
            (Some(4096), Some(4096))
        );
        assert_eq!(
            (
                c.extents[1].csum_bytes_needed,
                c.extents[1].csum_bytes_in_log
            ),
            (Some(8192), Some(4096))
        );
        inodes.retain(|i| i.ino != 260);
        assert_eq!(other.len(), 1);

        // 257 and 258 are named in the log; 300 only in the "committed" tree,
        // 259 nowhere.
        resolve_paths(&mut inodes, |ino| {
            (ino == 300).then(|| (257, "tmp".to_string()))
        });
        let paths: Vec<_> = inodes.iter().map(|i| i.path.clone()).collect();
        let want = [Some("/d"), Some("/d/f\\x01"), None, Some("/d/tmp")];
        assert_eq!(paths, want.map(|p| p.map(String::from)));
    }

    #[test]
    fn path_loops_end() {
        let mut inodes = vec![
            LoggedInode {
                ino: 500,
                names: vec![LoggedName {
                    kind: NameKind::Ref,
                    parent: 501,
                    index: 2,
                    name: "a".into(),
                }],
                ..Default::default()
            },
            LoggedInode {
                ino: 501,
                names: vec![LoggedName {
                    kind: NameKind::Ref,
                    parent: 500,
                    index: 2,
                    name: "b".into(),
                }],
                ..Default::default()
            },
        ];
        resolve_paths(&mut inodes, |_| None);
        assert!(inodes[0].path.as_ref().unwrap().starts_with("<ino "));

        // An ancestor the committed tree does not know either.
        let mut inodes = vec![LoggedInode {
            ino: 600,
            names: vec![LoggedName {
                kind: NameKind::Ref,
                parent: 601,
                index: 2,
                name: "c".into(),
            }],
            ..Default::default()
        }];
        resolve_paths(&mut inodes, |_| None);
        assert_eq!(inodes[0].path.as_deref(), Some("<ino 601>/c"));
    }

    /// Extract a btrfs-progs fsck fixture into `dir`, or say why not.
    fn fixture(name: &str, dir: &std::path::Path) -> Option<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures/btrfs-progs-fsck");
        let tar = root.join(format!("{name}.tar.xz"));
        if !tar.exists() {
            eprintln!("SKIP: fixture {} not present", tar.display());
            return None;
        }
        let st = std::process::Command::new("tar")
            .arg("-xJf")
            .arg(&tar)
            .arg("-C")
            .arg(dir)
            .status();
        if !matches!(st, Ok(s) if s.success()) {
            eprintln!("SKIP: cannot extract {} with tar", tar.display());
            return None;
        }
        let raw = dir.join(format!("{name}.raw"));
        raw.exists().then_some(raw).or_else(|| {
            eprintln!("SKIP: {name}.raw not in the archive");
            None
        })
    }

    /// A kernel-written log (btrfs-progs fsck test 065): one compressed
    /// extent fsynced, then the same log with its only leaf damaged.
    #[test]
    fn kernel_log_fixture() {
        use crate::image::OpenOptions;
        let tmp = tempfile::tempdir().unwrap();
        let Some(raw) = fixture("065-valid-log-tree--compressed", tmp.path()) else {
            return;
        };
        let img = Image::open_path(&raw, OpenOptions::default()).unwrap();
        let d = inspect_log(&img).expect("the fixture has a log");
        assert!(!d.is_damaged(), "{:?}", d.problems);
        assert_eq!(d.log_root.generation, d.super_generation + 1);
        assert_eq!(d.subvols.len(), 1);
        let s = &d.subvols[0];
        assert_eq!(s.subvol, BTRFS_FS_TREE_OBJECTID);
        assert!(s.problems.is_empty() && s.other.is_empty());
        assert_eq!(s.inodes.len(), 1);
        let f = &s.inodes[0];
        assert_eq!((f.ino, f.path.as_deref()), (257, Some("/file")));
        assert_eq!(f.inode.as_ref().map(|i| i.kind), Some("file"));
        assert_eq!(f.names.len(), 1);
        assert_eq!(f.extents.len(), 1);
        assert_eq!(
            (f.extents[0].kind, f.extents[0].compression.as_str()),
            (ExtentKind::Regular, "zlib")
        );
        assert_eq!(s.csums.len(), 1);
        assert_eq!(s.csums[0].start, f.extents[0].disk_bytenr.unwrap());
        assert_eq!(f.extents[0].csum_bytes_in_log, f.extents[0].disk_num_bytes);
        let leaf = s.tree.bytenr;
        let copies = img
            .chunks
            .map(leaf, img.nodesize as u64, img.devid)
            .unwrap();
        drop(img);

        // Damage every copy of the log leaf: still shown, reported damaged.
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
            for p in copies {
                f.write_all_at(&[0xa5; 8], p + 0x300).unwrap();
            }
        }
        let img = Image::open_path(
            &raw,
            OpenOptions {
                lenient: true,
                ..Default::default()
            },
        )
        .unwrap();
        let d = inspect_log(&img).unwrap();
        assert!(d.is_damaged());
        assert_eq!(d.subvols[0].problems[0].bytenr, leaf);
        assert_eq!(d.subvols[0].inodes.len(), 1);
        // A strict image cannot read the block at all; that too is a problem.
        let img = Image::open_path(&raw, OpenOptions::default()).unwrap();
        let d = inspect_log(&img).unwrap();
        assert!(d.subvols[0].problems[0].message.contains("unreadable"));
        assert!(d.subvols[0].inodes.is_empty());
    }

    #[test]
    fn escaping_and_previews() {
        assert_eq!(escape_bytes(b"plain"), "plain");
        assert_eq!(escape_bytes("é\\".as_bytes()), "é\\\\");
        assert_eq!(escape_bytes(b"a\xffb\n"), "a\\xffb\\x0a");
        assert_eq!(preview_value(b"blue"), "\"blue\"");
        assert_eq!(preview_value(&[0, 1, 2]), "0x000102");
        assert!(preview_value(&[b'a'; 100]).ends_with("\"..."));
        assert_eq!(
            file_type_name(BTRFS_FT_DIR | BTRFS_FT_ENCRYPTED),
            "dir+encrypted"
        );
        assert_eq!(compression_name(9), "unknown(9)");
        assert_eq!(mode_kind(0o120777), "symlink");
    }
}
