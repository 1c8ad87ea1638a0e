//! Phase 6: every live subvolume. Items arrive in key order, so all items of
//! one inode come together: per-inode checks (mode, generation, nbytes, size,
//! file extents, link count) run as soon as the next inode starts. Names are
//! kept as compact records and matched across inodes when the tree ends:
//! every name needs its DIR_ITEM, DIR_INDEX and INODE_REF/EXTREF, agreeing.

use super::csums::{Forbid, Need};
use super::findings::{Category, Phase, Repair, F};
use super::names::{name_errors, name_fixes, Names, Record};
use super::{Ctx, RootRec};
use crate::format::consts::*;
use crate::format::dir::{extref_hash, name_hash};
use crate::format::file_extent::FileExtent;
use crate::format::item::{decode, name_list, ItemBody, NameEntry, NameList};
use crate::format::key::Key;
use crate::tree::Node;
use std::collections::{HashMap, HashSet};

const P: Phase = Phase::Subvolumes;

use crate::fs::inode::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
/// Type, set-id, sticky and permission bits: anything else in a mode is unknown.
const VALID_MODE_BITS: u32 = S_IFMT | 0o7777;

use crate::format::dir::ftype_of_mode;

#[derive(Default)]
struct Cur {
    ino: u64,
    items: u32,
    item: Option<InodeFacts>,
    first_key: Option<Key>,
    refs: u32,
    dir_names: u64,
    dir_entries: u32,
    extents: u32,
    extent_start: Option<u64>,
    extent_end: u64,
    first_gap: Option<u64>,
    found_size: u64,
    dir_items_of_unlinked: bool,
}

#[derive(Clone, Copy)]
struct InodeFacts {
    mode: u32,
    nlink: u32,
    size: u64,
    nbytes: u64,
    flags: u64,
}

pub(crate) struct FsTree {
    root: u64,
    root_dirid: u64,
    no_holes: bool,
    link_checks: bool,
    cur: Cur,
    /// The root directory's (mode, nlink).
    root_facts: Option<(u32, u32)>,
    /// Inodes with a link count and no back reference: named in
    /// lost+found unless a directory entry still reaches them.
    unnamed: Vec<(u64, u32)>,
    names: Names,
    orphans: HashSet<u64>,
    unlinked: Vec<u64>,
    subvol_dirents: Vec<(u64, u64)>,
    lost: bool,
    inodes_checked: u64,
    /// The root directory's ".." INODE_REF (index 0) was seen.
    root_dotdot: bool,
    /// What the per-leaf checks found, handed to the context at `finish`
    /// (the leaves are checked on their own thread, beside the walk).
    out: Vec<super::Finding>,
    needs: Vec<Need>,
    forbids: Vec<Forbid>,
    csum_size: usize,
    gen: u64,
    sectorsize: u64,
    nodesize: u64,
    /// File extents here need no checksums (the data relocation tree
    /// copies extents whose csums it copies separately, prealloc ones
    /// included), as btrfs check skips them.
    csum_exempt: bool,
}

impl FsTree {
    pub fn new(cx: &Ctx, r: &RootRec) -> FsTree {
        FsTree {
            root: r.id(),
            root_dirid: r.item.root_dirid.get(),
            no_holes: cx.has_incompat(BTRFS_FEATURE_INCOMPAT_NO_HOLES),
            link_checks: r.id() != BTRFS_DATA_RELOC_TREE_OBJECTID,
            cur: Cur::default(),
            root_facts: None,
            names: Names::default(),
            orphans: HashSet::new(),
            unlinked: Vec::new(),
            unnamed: Vec::new(),
            subvol_dirents: Vec::new(),
            lost: false,
            inodes_checked: 0,
            root_dotdot: false,
            out: Vec::new(),
            needs: Vec::new(),
            forbids: Vec::new(),
            csum_size: cx.img.csum.size(),
            gen: cx.gen,
            sectorsize: cx.img.sectorsize as u64,
            nodesize: cx.img.nodesize as u64,
            csum_exempt: r.id() == BTRFS_DATA_RELOC_TREE_OBJECTID,
        }
    }

    /// A block of this tree could not be read: cross checks would only echo it.
    pub fn lost_block(&mut self) {
        self.lost = true;
    }

    fn err(&self, cat: Category) -> F {
        F::err(P, cat).tree(self.root)
    }

    pub fn leaf(&mut self, node: &Node) {
        let cs = self.csum_size;
        for (k, d) in node.items() {
            if k.objectid < self.cur.ino {
                self.names.set_disordered();
            }
            if k.objectid != self.cur.ino || self.cur.items == 0 {
                self.finish_inode();
                self.cur = Cur {
                    ino: k.objectid,
                    first_key: Some(k),
                    ..Cur::default()
                };
            }
            self.cur.items += 1;
            let Some(d) = d else {
                continue;
            };
            self.item(node.bytenr, k, d, cs);
        }
    }

    fn item(&mut self, bytenr: u64, k: Key, d: &[u8], cs: usize) {
        let ino = k.objectid;
        if ino == BTRFS_ORPHAN_OBJECTID && k.ty == BTRFS_ORPHAN_ITEM_KEY {
            self.orphans.insert(k.offset);
            return;
        }
        if ino == BTRFS_FREE_INO_OBJECTID || ino == BTRFS_FREE_SPACE_OBJECTID {
            self.out.push(
                self.err(Category::InodeCache)
                    .at(bytenr)
                    .key(k)
                    .fix(Repair::ClearInodeCache { tree: self.root })
                    .msg("deprecated inode cache item (mount option inode_cache was removed)"),
            );
            return;
        }
        if !(BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&ino) {
            self.out.push(
                self.err(Category::UnknownKey)
                    .at(bytenr)
                    .key(k)
                    .msg(format!(
                        "unexpected objectid {} in a subvolume tree",
                        ino as i64
                    )),
            );
            return;
        }
        let body = match k.ty {
            BTRFS_INODE_REF_KEY
            | BTRFS_INODE_EXTREF_KEY
            | BTRFS_XATTR_ITEM_KEY
            | BTRFS_DIR_ITEM_KEY
            | BTRFS_DIR_INDEX_KEY => {
                // The tree block check already reported a malformed item.
                if let Ok(names) = name_list(&k, d) {
                    self.names_item(bytenr, k, &names);
                }
                return;
            }
            BTRFS_INODE_ITEM_KEY | BTRFS_EXTENT_DATA_KEY => match decode(&k, d, cs) {
                Ok(b) => b,
                // The tree block check already reported the malformed item.
                Err(_) => return,
            },
            BTRFS_VERITY_DESC_ITEM_KEY | BTRFS_VERITY_MERKLE_ITEM_KEY => return,
            t => {
                self.out.push(
                    self.err(Category::UnknownKey)
                        .at(bytenr)
                        .key(k)
                        .msg(format!("unknown item type {t} in a subvolume tree")),
                );
                return;
            }
        };
        let gen_limit = self.gen.saturating_add(1);
        match body {
            ItemBody::InodeItem(ii) => {
                if self.cur.item.is_some() {
                    return;
                }
                let mode = ii.mode.get();
                let fix = Repair::InodeMode {
                    tree: self.root,
                    ino,
                };
                if ftype_of_mode(mode).is_none() {
                    self.out.push(
                        self.err(Category::InodeMode)
                            .at(bytenr)
                            .key(k)
                            .fix(fix)
                            .msg(format!("inode {ino} has invalid mode 0{mode:o}")),
                    );
                } else if mode & !VALID_MODE_BITS != 0 {
                    self.out.push(
                        self.err(Category::InodeMode)
                            .at(bytenr)
                            .key(k)
                            .fix(fix)
                            .msg(format!(
                                "inode {ino} mode 0{mode:o} has unknown bits 0{:o}",
                                mode & !VALID_MODE_BITS
                            )),
                    );
                }
                if mode & S_IFMT == S_IFDIR && ii.nlink.get() > 1 {
                    self.out.push(
                        self.err(Category::InodeNlink)
                            .at(bytenr)
                            .key(k)
                            .msg(format!(
                                "directory {ino} has nlink {} (a directory has no hard links)",
                                ii.nlink.get()
                            )),
                    );
                }
                if ii.generation.get() > gen_limit || ii.transid.get() > gen_limit {
                    self.out.push(
                        self.err(Category::InodeGeneration)
                            .at(bytenr)
                            .key(k)
                            .fix(Repair::InodeGeneration {
                                tree: self.root,
                                ino,
                            })
                            .msg(format!(
                            "inode {ino} generation {} / transid {} newer than the filesystem ({})",
                            ii.generation.get(),
                            ii.transid.get(),
                            self.gen
                        )),
                    );
                }
                // Low 32 bits: inode flags; high 32 bits: read-only compat flags (verity).
                let flags = ii.flags.get();
                for (sev, m, clear) in inode_flag_problems(mode, flags) {
                    let mut f = if sev {
                        self.err(Category::InodeFlags)
                    } else {
                        F::warn(P, Category::InodeFlags).tree(self.root)
                    };
                    // Flags the kernel refuses or the type cannot carry
                    // mean nothing for the data: cleared.
                    if clear != 0 {
                        f = f.fix(Repair::InodeFlags {
                            tree: self.root,
                            ino,
                            clear,
                        });
                    }
                    self.out
                        .push(f.at(bytenr).key(k).msg(format!("inode {ino}: {m}")));
                }
                if self
                    .cur
                    .first_key
                    .is_some_and(|f| f.ty != BTRFS_INODE_ITEM_KEY)
                {
                    // Items sorted before the inode item are impossible in a valid tree.
                    self.out.push(
                        self.err(Category::Inode)
                            .at(bytenr)
                            .key(k)
                            .msg(format!("inode {ino} has items before its inode item")),
                    );
                }
                let f = InodeFacts {
                    mode,
                    nlink: ii.nlink.get(),
                    size: ii.size.get(),
                    nbytes: ii.nbytes.get(),
                    flags: ii.flags.get(),
                };
                self.cur.item = Some(f);
                if self.link_checks {
                    self.names.push_inode(ino, mode);
                }
                if ino == self.root_dirid {
                    self.root_facts = Some((mode, f.nlink));
                }
            }
            ItemBody::FileExtent(fe) => self.file_extent(bytenr, k, fe),
            _ => {}
        }
    }

    /// An INODE_REF, INODE_EXTREF, DIR_ITEM, DIR_INDEX or XATTR_ITEM of
    /// the inode being read, its names listed.
    fn names_item(&mut self, bytenr: u64, k: Key, names: &NameList) {
        let ino = k.objectid;
        match k.ty {
            BTRFS_INODE_REF_KEY => {
                for n in names.iter() {
                    let NameEntry::Ref(e) = n else { continue };
                    if k.offset == ino && ino == self.root_dirid && e.name == b".." {
                        if e.index != 0 {
                            self.out
                                .push(self.err(Category::Name).at(bytenr).key(k).msg(format!(
                                    "root directory {ino} '..' ref has index {} (must be 0)",
                                    e.index
                                )));
                        }
                        self.root_dotdot = true;
                        continue;
                    }
                    self.refused_name(bytenr, k, k.offset, e.name);
                    self.cur.refs += 1;
                    self.add_name(
                        ino,
                        (k.offset, ino, name_hash(e.name) as u32),
                        Record::Ref { index: e.index },
                    );
                }
            }
            BTRFS_INODE_EXTREF_KEY => {
                for n in names.iter() {
                    let NameEntry::Extref(e) = n else { continue };
                    if extref_hash(e.parent, e.name) != k.offset {
                        self.out
                            .push(self.err(Category::Name).at(bytenr).key(k).msg(format!(
                                "inode {ino} extref key offset is not the hash of its name"
                            )));
                    }
                    self.refused_name(bytenr, k, e.parent, e.name);
                    self.cur.refs += 1;
                    self.add_name(
                        ino,
                        (e.parent, ino, name_hash(e.name) as u32),
                        Record::Ref { index: e.index },
                    );
                }
            }
            _ => {
                let is_index = k.ty == BTRFS_DIR_INDEX_KEY;
                let is_xattr = k.ty == BTRFS_XATTR_ITEM_KEY;
                // A directory with no links is being deleted (its orphan
                // item is checked): the kernel drops its entries lazily,
                // so those left are neither names nor part of its size.
                if !is_xattr && self.cur.item.is_some_and(|f| f.nlink == 0) {
                    self.cur.dir_items_of_unlinked = true;
                    return;
                }
                for (i, n) in names.iter().enumerate() {
                    let NameEntry::Dir(e) = n else { continue };
                    let h = name_hash(e.name);
                    let misfiled = !is_index && h != k.offset;
                    if misfiled {
                        // The entry is under another name's hash: no
                        // lookup finds it. It goes; the name is re-added
                        // where it belongs when its other records agree
                        // (it does not count as this name's DIR_ITEM).
                        let loc = Key::from(&e.item.location);
                        let mut f = self.err(Category::Name).at(bytenr).key(k);
                        if !is_xattr && loc.ty == BTRFS_INODE_ITEM_KEY {
                            f = f.fix(Repair::RemoveDirEntry {
                                tree: self.root,
                                dir: ino,
                                ino: loc.objectid,
                                key_type: BTRFS_DIR_ITEM_KEY,
                                offset: k.offset,
                            });
                        }
                        self.out.push(f.msg(format!(
                            "{} '{}' hash 0x{h:x} does not match key offset 0x{:x}",
                            if is_xattr { "xattr" } else { "dir item" },
                            String::from_utf8_lossy(e.name),
                            k.offset
                        )));
                    }
                    if is_xattr && e.name.is_empty() {
                        self.out
                            .push(self.err(Category::Name).at(bytenr).key(k).msg("empty name"));
                    }
                    if !is_xattr {
                        self.refused_name(bytenr, k, ino, e.name);
                    }
                    if names
                        .iter()
                        .take(i)
                        .any(|x| matches!(x, NameEntry::Dir(x) if x.name == e.name))
                    {
                        self.out
                            .push(self.err(Category::Name).at(bytenr).key(k).msg(format!(
                                "duplicate name '{}' in directory {ino}",
                                String::from_utf8_lossy(e.name)
                            )));
                    }
                    if is_xattr {
                        continue;
                    }
                    self.cur.dir_names += e.name.len() as u64;
                    self.cur.dir_entries += 1;
                    let loc = Key::from(&e.item.location);
                    let ft = e.item.type_ & !BTRFS_FT_ENCRYPTED;
                    if ft == BTRFS_FT_UNKNOWN || ft >= BTRFS_FT_XATTR {
                        self.out
                            .push(self.err(Category::Name).at(bytenr).key(k).msg(format!(
                                "dir entry '{}' has invalid type {ft}",
                                String::from_utf8_lossy(e.name)
                            )));
                    }
                    match loc.ty {
                        BTRFS_INODE_ITEM_KEY if misfiled => {}
                        BTRFS_INODE_ITEM_KEY => self.add_name(
                            ino,
                            (ino, loc.objectid, h as u32),
                            if is_index {
                                Record::Index {
                                    index: k.offset,
                                    ftype: ft,
                                }
                            } else {
                                Record::Item { ftype: ft }
                            },
                        ),
                        BTRFS_ROOT_ITEM_KEY => {
                            if !is_index {
                                self.subvol_dirents.push((ino, loc.objectid));
                            }
                        }
                        t => self.out.push(
                            self.err(Category::Name)
                                .at(bytenr)
                                .key(k)
                                .msg(format!("dir entry location has key type {t}")),
                        ),
                    }
                }
            }
        }
    }

    fn file_extent(&mut self, bytenr: u64, k: Key, fe: FileExtent) {
        let ss = self.sectorsize;
        let mask = ss - 1;
        let c = &mut self.cur;
        c.extents += 1;
        let mut bad = Vec::<String>::new();
        let mut fix = None;
        if c.extent_start.is_none() {
            c.extent_start = Some(k.offset);
            c.extent_end = k.offset;
        }
        if c.extent_end > k.offset {
            bad.push(format!(
                "file extent at {} overlaps the previous one ending at {}",
                k.offset, c.extent_end
            ));
        } else if c.extent_end < k.offset && c.first_gap.is_none() {
            c.first_gap = Some(c.extent_end);
        }
        let generation = match &fe {
            FileExtent::Inline { head, .. } => head.generation.get(),
            FileExtent::Disk { head, .. } => head.generation.get(),
        };
        if generation > self.gen.saturating_add(1) {
            // btrfs check counts it against the extent it uses.
            self.out.push(
                self.err(Category::ExtentGeneration)
                    .at(bytenr)
                    .key(k)
                    .fix(Repair::FileExtentGeneration {
                        tree: self.root,
                        ino: k.objectid,
                        offset: k.offset,
                    })
                    .msg(format!(
                        "inode {} file extent at {}: generation {generation} newer than the filesystem's {}",
                        k.objectid,
                        k.offset,
                        self.gen
                    )),
            );
        }
        let c = &mut self.cur;
        let facts = c.item;
        let nodatasum = facts.is_some_and(|f| f.flags & BTRFS_INODE_NODATASUM != 0);
        let is_lnk = facts.is_some_and(|f| f.mode & S_IFMT == S_IFLNK);
        let num_bytes;
        match fe {
            FileExtent::Inline { head, data } => {
                let ram = head.ram_bytes.get();
                if ram == 0 {
                    bad.push("inline extent with ram_bytes 0".into());
                }
                let max_inline = mask.min(crate::format::file_extent::max_inline_data_size(
                    self.nodesize as u32,
                ));
                if head.compression != BTRFS_COMPRESS_NONE {
                    if data.len() as u64 > max_inline || ram > ss {
                        bad.push(format!(
                            "compressed inline extent too large ({} bytes, ram {ram})",
                            data.len()
                        ));
                    }
                } else {
                    if ram > max_inline {
                        bad.push(format!(
                            "inline extent ram_bytes {ram} exceeds the inline limit {max_inline}"
                        ));
                    }
                    if data.len() as u64 != ram {
                        bad.push(format!(
                            "inline extent holds {} bytes but ram_bytes says {ram}",
                            data.len()
                        ));
                    }
                    // Uncompressed, the bytes held are the truth.
                    if data.len() as u64 != ram
                        && !data.is_empty()
                        && data.len() as u64 <= max_inline
                        && k.offset == 0
                    {
                        fix = Some(Repair::InlineRamBytes {
                            tree: self.root,
                            ino: k.objectid,
                        });
                    }
                }
                if k.offset != 0 {
                    bad.push(format!("inline extent at file offset {}", k.offset));
                }
                c.found_size = c.found_size.saturating_add(ram);
                num_bytes = ram.saturating_add(mask) & !mask;
            }
            FileExtent::Disk { head, item } => {
                num_bytes = item.num_bytes.get();
                let disk = item.disk_bytenr.get();
                let off = item.offset.get();
                if num_bytes == 0 || num_bytes & mask != 0 {
                    bad.push(format!("file extent num_bytes {num_bytes} is not a positive multiple of the sector size"));
                }
                if num_bytes.saturating_add(off) > head.ram_bytes.get() {
                    bad.push(format!(
                        "file extent offset {off} + num_bytes {num_bytes} exceeds ram_bytes {}",
                        head.ram_bytes.get()
                    ));
                }
                let prealloc = head.type_ == BTRFS_FILE_EXTENT_PREALLOC;
                if prealloc
                    && (head.compression != 0
                        || head.encryption != 0
                        || head.other_encoding.get() != 0)
                {
                    bad.push("prealloc extent with compression or encoding".into());
                }
                if head.compression != 0 && nodatasum {
                    bad.push("compressed extent in a nodatasum inode".into());
                }
                if disk != 0 {
                    c.found_size = c.found_size.saturating_add(num_bytes);
                    if disk & mask != 0
                        || item.disk_num_bytes.get() & mask != 0
                        || item.disk_num_bytes.get() == 0
                    {
                        bad.push(format!(
                            "file extent disk range {disk}+{} is not sector aligned",
                            item.disk_num_bytes.get()
                        ));
                    }
                    let (s, l) = if head.compression != 0 {
                        (disk, item.disk_num_bytes.get())
                    } else {
                        (disk.saturating_add(off), num_bytes)
                    };
                    let regular_file =
                        facts.is_some_and(|f| matches!(f.mode & S_IFMT, S_IFREG | S_IFLNK));
                    if !self.csum_exempt && facts.is_some() {
                        if !prealloc && !nodatasum {
                            self.needs.push(Need {
                                start: s,
                                len: l,
                                root: self.root,
                                ino: k.objectid,
                            });
                        } else if regular_file {
                            // nodatasum data, and prealloc extents never
                            // written, have no checksums (I_ERR_ODD_CSUM_ITEM).
                            self.forbids.push(Forbid {
                                start: s,
                                len: l,
                                root: self.root,
                                ino: k.objectid,
                                prealloc_of: prealloc.then_some(disk),
                            });
                        }
                    }
                }
                if is_lnk {
                    bad.push("symlink with a regular (non-inline) extent".into());
                }
            }
        }
        c.extent_end = k.offset.saturating_add(num_bytes);
        for m in bad {
            let mut e = self.err(Category::FileExtent).at(bytenr).key(k);
            if let Some(r) = &fix {
                e = e.fix(r.clone());
            }
            self.out.push(e.msg(format!("inode {}: {m}", k.objectid)));
        }
    }

    fn finish_inode(&mut self) {
        let ino = self.cur.ino;
        self.check_inode();
        self.names.end_of_inode(ino);
    }

    /// Report `name`, of an entry of directory `dir` (a DIR_ITEM, DIR_INDEX,
    /// INODE_REF or INODE_EXTREF at `k`), when the kernel would refuse it
    /// as a path component: empty, `.`, `..`, with a `/` or a NUL. No
    /// lookup can reach such an entry, and a walker taking it as it
    /// stands would leave the directory (or fail on it).
    fn refused_name(&mut self, bytenr: u64, k: Key, dir: u64, name: &[u8]) {
        if let Some(why) = crate::format::dir::name_fault(name) {
            self.out
                .push(self.err(Category::Name).at(bytenr).key(k).msg(format!(
                    "directory {dir}: name \"{}\" {why}, a name the kernel refuses",
                    crate::log::inspect::escape_bytes(name)
                )));
        }
    }

    /// A record of a name, found among the items of inode `cur`.
    fn add_name(&mut self, cur: u64, key: super::names::NameKey, rec: Record) {
        if self.link_checks {
            self.names.add(cur, key, rec);
        }
    }

    /// The per-inode checks of the inode whose items just ended.
    fn check_inode(&mut self) {
        let c = std::mem::take(&mut self.cur);
        if c.items == 0 || c.ino < BTRFS_FIRST_FREE_OBJECTID || c.ino > BTRFS_LAST_FREE_OBJECTID {
            return;
        }
        self.inodes_checked += 1;
        let ino = c.ino;
        let Some(f) = c.item else {
            if !self.lost {
                self.out.push(
                    self.err(Category::Inode)
                        .opt_key(c.first_key)
                        .fix(Repair::RecreateInodeItem {
                            tree: self.root,
                            ino,
                        })
                        .msg(format!("inode {ino} has items but no inode item")),
                );
            }
            return;
        };
        let fmt = f.mode & S_IFMT;
        let tree = self.root;
        let mut errs = Vec::<(String, Option<Repair>)>::new();
        if fmt == S_IFDIR {
            if c.dir_names != f.size {
                errs.push((
                    format!(
                        "directory size {} but its entries add up to {}",
                        f.size, c.dir_names
                    ),
                    (!self.lost).then_some(Repair::SetSize {
                        tree,
                        ino,
                        size: c.dir_names,
                    }),
                ));
            }
            if c.extents > 0 {
                errs.push(("directory with file extents".into(), None));
            }
        } else if fmt == S_IFREG || fmt == S_IFLNK {
            if c.dir_entries > 0 || c.dir_items_of_unlinked {
                errs.push(("non-directory with directory entries".into(), None));
            }
            if f.nlink > 0 && c.found_size != f.nbytes {
                errs.push((
                    format!(
                        "nbytes {} but its extents add up to {}",
                        f.nbytes, c.found_size
                    ),
                    (!self.lost).then_some(Repair::SetNbytes {
                        tree,
                        ino,
                        nbytes: c.found_size,
                    }),
                ));
            }
            let gap_before_size = c.first_gap.is_some_and(|g| g < f.size);
            if f.nlink > 0
                && !self.no_holes
                && f.size > 0
                && (c.extent_end < f.size || c.extent_start != Some(0) || gap_before_size)
            {
                errs.push((
                    format!(
                        "file extents do not cover the file (size {}): missing extent or hole item",
                        f.size
                    ),
                    (!self.lost).then_some(Repair::FileHoles { tree, ino }),
                ));
            }
        }
        if self.link_checks && ino != self.root_dirid {
            if f.nlink == 0 {
                self.unlinked.push(ino);
            }
            if c.refs == 0 && f.nlink > 0 && !self.lost {
                // Reported once the names are matched: a directory entry
                // may still reach it.
                self.unnamed.push((ino, f.nlink));
            } else if c.refs != f.nlink && !self.lost {
                // The names are the truth when there are any.
                errs.push((
                    format!("link count {} but {} names refer to it", f.nlink, c.refs),
                    (c.refs > 0).then_some(Repair::SetNlink {
                        tree,
                        ino,
                        nlink: c.refs,
                    }),
                ));
            }
        }
        for (m, fix) in errs {
            let mut e = self.err(Category::Inode).opt_key(c.first_key);
            if let Some(r) = fix {
                e = e.fix(r);
            }
            self.out.push(e.msg(format!("inode {ino}: {m}")));
        }
    }

    /// Everything left once the last leaf is in: the last inode, the root
    /// directory, orphans, and the names still open. Runs on the
    /// checker's thread; `deliver` hands the results over.
    pub fn finish(&mut self) {
        self.finish_inode();
        self.names.end_of_tree();
        let mut out = Vec::new();
        match self.root_facts {
            None if !self.lost => out.push(self.err(Category::Inode).msg(format!(
                "root directory {} has no inode item",
                self.root_dirid
            ))),
            Some((mode, nlink)) if self.link_checks => {
                if mode & S_IFMT != S_IFDIR {
                    out.push(self.err(Category::InodeMode).msg(format!(
                        "root directory {} is not a directory (mode 0{mode:o})",
                        self.root_dirid
                    )));
                }
                if nlink != 1 && mode & S_IFMT == S_IFDIR {
                    out.push(
                        self.err(Category::InodeNlink)
                            .fix(Repair::SetNlink {
                                tree: self.root,
                                ino: self.root_dirid,
                                nlink: 1,
                            })
                            .msg(format!(
                                "root directory {} has nlink {nlink} (must be 1)",
                                self.root_dirid
                            )),
                    );
                }
                if !self.root_dotdot && !self.lost {
                    out.push(self.err(Category::Name).msg(format!(
                        "root directory {} has no '..' INODE_REF",
                        self.root_dirid
                    )));
                }
            }
            _ => {}
        }
        // Orphan items the kernel's orphan cleanup acts on at the next
        // read-write mount (fs::inode::clean_orphan): an unlinked inode
        // deleted with its data, a linked one's fs-verity items dropped, the
        // item dropped in every case. Not errors; --repair does the same now.
        if self.link_checks && !self.lost {
            let mut orphans: Vec<u64> = self.orphans.iter().copied().collect();
            orphans.sort_unstable();
            let unlinked: HashSet<u64> = if orphans.is_empty() {
                HashSet::new()
            } else {
                self.unlinked.iter().copied().collect()
            };
            for ino in orphans {
                let what = if !self.names.exists(ino) {
                    "names no inode: the kernel drops the item"
                } else if unlinked.contains(&ino) {
                    "is for an unlinked inode: the kernel deletes it with its data"
                } else {
                    "is for an inode with links (an unfinished fs-verity build, or a truncate of a kernel before 4.18): the kernel drops the item and any fs-verity items"
                };
                out.push(
                    super::findings::F::warn(Phase::Subvolumes, Category::Orphan)
                        .tree(self.root)
                        .key(Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, ino))
                        .fix(Repair::OrphanCleanup {
                            tree: self.root,
                            ino,
                        })
                        .msg(format!(
                            "orphan item {ino} {what} at the next read-write mount"
                        )),
                );
            }
        }
        // An unlinked inode no name refers to is what the kernel's orphan
        // cleanup deletes; one that something still names is a link count
        // problem, reported with the names.
        for ino in std::mem::take(&mut self.unlinked) {
            if !self.orphans.contains(&ino) {
                let mut e = self.err(Category::Orphan);
                if !self.names.named(ino) && !self.lost {
                    e = e.fix(Repair::DeleteUnlinkedInode {
                        tree: self.root,
                        ino,
                    });
                }
                out.push(e.msg(format!("inode {ino} has no links and no orphan item")));
            }
        }
        for (ino, nlink) in std::mem::take(&mut self.unnamed) {
            let mut e = self.err(Category::Inode);
            if !self.names.named(ino) {
                e = e.fix(Repair::LinkToLostFound {
                    tree: self.root,
                    ino,
                });
            }
            out.push(e.msg(format!(
                "inode {ino}: link count {nlink} but 0 names refer to it"
            )));
        }
        self.out.extend(out);
        if self.link_checks && !self.lost {
            self.report_names();
        }
    }

    /// Hand what the checks found to the context.
    pub fn deliver(mut self, cx: &mut Ctx) {
        super::reuse::checked(cx, self.root, self.out.is_empty(), || {
            super::reuse::FsFacts {
                needs: self.needs.clone(),
                forbids: self.forbids.clone(),
                inodes_checked: self.inodes_checked,
                subvol_dirents: self.subvol_dirents.clone(),
            }
        });
        for f in std::mem::take(&mut self.out) {
            cx.report(f);
        }
        cx.csum_needed.append(&mut self.needs);
        cx.csum_forbidden.append(&mut self.forbids);
        cx.sink.checked(P, self.inodes_checked);
        for (dir, child) in std::mem::take(&mut self.subvol_dirents) {
            cx.subvol_dirents.push(super::SubvolDirent {
                tree: self.root,
                dir,
                child,
            });
        }
    }

    /// Every name whose records disagree, with the repairs two agreeing
    /// records determine.
    fn report_names(&mut self) {
        for ((p, ch, hash), index, what) in self.names.dir_link_problems(self.root_dirid) {
            let key = match index {
                Some(i) => Key::new(p, BTRFS_DIR_INDEX_KEY, i),
                None => Key::new(p, BTRFS_DIR_ITEM_KEY, hash as u64),
            };
            self.out.push(
                self.err(Category::DirLink)
                    .key(key)
                    .msg(format!("directory {p}: entry for directory {ch} {what}")),
            );
        }
        for (key, g) in self.names.take_bad() {
            let (p, ch, _) = key;
            let child = self.names.table.mode(ch);
            let parent = self.names.table.mode(p);
            let errs = name_errors(&g, child, parent);
            let fixes = name_fixes(self.root, key, &g, child, parent, self.names.confirmed(ch));
            for (i, e) in errs.into_iter().enumerate() {
                let mut f = self.err(Category::Name);
                // Every repair of the group rides on its first finding.
                if i == 0 {
                    for r in fixes.iter().skip(1) {
                        self.out.push(
                            self.err(Category::Name)
                                .fix(r.clone())
                                .msg(format!("name in directory {p} for inode {ch} (also)")),
                        );
                    }
                    if let Some(r) = fixes.first() {
                        f = f.fix(r.clone());
                    }
                }
                self.out
                    .push(f.msg(format!("name in directory {p} for inode {ch} {e}")));
            }
        }
    }
}

/// ROOT_REF / ROOT_BACKREF pairs, and the directory entries naming subvolumes.
pub(super) fn check_root_refs(cx: &mut Ctx) {
    let links = std::mem::take(&mut cx.root_links);
    let mut refs: HashMap<(u64, u64), &super::RootLink> = HashMap::new();
    let mut backrefs: HashMap<(u64, u64), &super::RootLink> = HashMap::new();
    for l in &links {
        if l.key.ty == BTRFS_ROOT_REF_KEY {
            refs.insert((l.key.objectid, l.key.offset), l);
        } else {
            backrefs.insert((l.key.offset, l.key.objectid), l);
        }
    }
    for (&(parent, child), r) in &refs {
        match backrefs.get(&(parent, child)) {
            None => cx.report(
                F::err(P, Category::RootRef)
                    .tree(1)
                    .key(r.key)
                    .msg(format!("root ref {parent} -> {child} has no root backref")),
            ),
            Some(b) => {
                if b.dirid != r.dirid || b.sequence != r.sequence || b.name != r.name {
                    cx.report(F::err(P, Category::RootRef).tree(1).key(r.key).msg(format!(
                        "root ref and backref of {parent} -> {child} disagree"
                    )));
                }
            }
        }
    }
    for (&(parent, child), b) in &backrefs {
        if !refs.contains_key(&(parent, child)) {
            cx.report(
                F::err(P, Category::RootRef)
                    .tree(1)
                    .key(b.key)
                    .msg(format!("root backref {child} <- {parent} has no root ref")),
            );
        }
    }
    let live: HashSet<u64> = cx
        .roots
        .iter()
        .filter(|r| {
            r.key.objectid >= BTRFS_FIRST_FREE_OBJECTID
                && r.key.objectid <= BTRFS_LAST_FREE_OBJECTID
        })
        .filter(|r| {
            r.item.refs.get() > 0 && r.drop_key().is_none() && !cx.orphan_roots.contains(&r.id())
        })
        .map(|r| r.id())
        .collect();
    for id in &live {
        if !backrefs.keys().any(|(_, c)| c == id) {
            cx.report(F::err(P, Category::RootRef).tree(*id).msg(format!(
                "subvolume {id} has no root backref: it is not linked anywhere"
            )));
        }
    }
    // A subvolume is linked once (root item refs 1) or deleted (refs 0):
    // a deleted one waits for the cleaner with an orphan item in the root
    // tree, without which it is never dropped (btrfs check: "missing
    // orphan item"), and it must not be linked any more.
    let mut orphans_missing = Vec::new();
    let mut found = Vec::new();
    for r in &cx.roots {
        let id = r.id();
        if !(BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&id) {
            continue;
        }
        let refs = r.item.refs.get();
        if refs > 1 {
            found.push(
                F::err(P, Category::RootRef)
                    .tree(id)
                    .key(r.key)
                    .msg(format!(
                "subvolume {id} root item has refs {refs}; a subvolume is linked at most once"
            )),
            );
        }
        if refs == 0 {
            if !cx.orphan_roots.contains(&id) {
                orphans_missing.push((id, r.key));
            }
            if let Some((p, _)) = backrefs.keys().find(|(_, c)| *c == id) {
                found.push(
                    F::err(P, Category::RootRef)
                        .tree(id)
                        .key(r.key)
                        .msg(format!(
                            "deleted subvolume {id} (root item refs 0) is still linked from {p}"
                        )),
                );
            }
        }
    }
    for &id in &cx.orphan_roots {
        if !cx.roots.iter().any(|r| r.id() == id) {
            found.push(F::warn(P, Category::RootOrphan).tree(id).msg(format!(
                "orphan item for subvolume {id}, which has no root item"
            )));
        }
    }
    for f in found {
        cx.report(f);
    }
    for (id, key) in orphans_missing {
        cx.report(F::err(P, Category::RootOrphan).tree(id).key(key).fix(Repair::AddRootOrphan { tree: id }).msg(format!(
            "deleted subvolume {id} (root item refs 0) has no orphan item in the root tree: it would never be dropped"
        )));
    }

    let dirents = std::mem::take(&mut cx.subvol_dirents);
    // A snapshot keeps the directory entries of subvolumes nested in its
    // source without their root refs (they read as empty directories), so
    // only the other direction is checked: a root ref needs its entry.
    for ((parent, child), r) in &refs {
        if live.contains(parent) || *parent == BTRFS_FS_TREE_OBJECTID {
            let ok = dirents
                .iter()
                .any(|d| d.tree == *parent && d.child == *child && d.dir == r.dirid);
            if !ok && live.contains(child) {
                cx.report(
                    F::err(P, Category::RootRef)
                        .tree(*parent)
                        .key(r.key)
                        .msg(format!(
                            "root ref {parent} -> {child} has no directory entry"
                        )),
                );
            }
        }
    }
    cx.root_links = links;
    cx.sink.checked(P, 0);
}

/// Invalid or contradictory inode flags: (is an error, message). The low 32
/// bits are the flags, the high 32 the read-only compat flags (verity).
pub(crate) fn inode_flag_problems(mode: u32, flags: u64) -> Vec<(bool, String, u64)> {
    let mut out = Vec::new();
    let known = ((BTRFS_INODE_COMPRESS << 1) - 1) | BTRFS_INODE_ROOT_ITEM_INIT;
    let (lo, ro) = (flags & 0xffff_ffff, flags >> 32);
    if lo & !known != 0 {
        out.push((
            true,
            format!("unknown inode flags 0x{:x}", lo & !known),
            lo & !known,
        ));
    }
    if ro & !1 != 0 {
        out.push((
            true,
            format!("unknown read-only inode flags 0x{:x}", ro & !1),
            (ro & !1) << 32,
        ));
    }
    // btrfs check: a symlink can be neither immutable nor append-only.
    if mode & S_IFMT == S_IFLNK && lo & (BTRFS_INODE_IMMUTABLE | BTRFS_INODE_APPEND) != 0 {
        out.push((
            true,
            "symlink with the immutable or append-only flag".into(),
            lo & (BTRFS_INODE_IMMUTABLE | BTRFS_INODE_APPEND),
        ));
    }
    // The kernel clears one whenever it sets the other.
    if lo & BTRFS_INODE_COMPRESS != 0 && lo & BTRFS_INODE_NOCOMPRESS != 0 {
        out.push((true, "both the compress and the nocompress flags".into(), 0));
    }
    // The kernel refuses these together since 5.x, and sets nodatasum with
    // nodatacow on every file; older kernels may have left either.
    if mode & S_IFMT == S_IFREG && lo & BTRFS_INODE_COMPRESS != 0 && lo & BTRFS_INODE_NODATACOW != 0
    {
        out.push((false, "both the compress and the nodatacow flags".into(), 0));
    }
    if mode & S_IFMT == S_IFREG
        && lo & BTRFS_INODE_NODATACOW != 0
        && lo & BTRFS_INODE_NODATASUM == 0
    {
        out.push((false, "nodatacow without nodatasum".into(), 0));
    }
    out
}
