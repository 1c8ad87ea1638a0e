//! An opened filesystem, read side: superblock, chunk map, the devices it
//! spans, and tree block reads with validation and fallback from one copy
//! to the next (DUP, and the copies of RAID1/RAID10 on other devices), or
//! from a RAID5/6 stripe to its rebuild from parity.

use crate::chunk::rmw::{self, ParityWriter};
use crate::chunk::{ChunkMap, StripePiece};
use crate::csum::{verify_block, CsumType};
use crate::format::consts::*;
use crate::format::item::ItemBody;
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::format::superblock::Superblock;
use crate::io::{BlockDevice, FileDevice};
use crate::tree::node::{Expect, Node, Problem, ProblemKind, ValidateCtx};
use crate::tree::{TreeIter, TreeRoot};
use crate::CorruptKind;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use zerocopy::FromBytes;

/// How [`Image::open`] and [`Image::open_path`] open an image. The default is
/// the primary superblock, strict, read-only.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Superblock copy to use (0 primary, 1, 2).
    pub mirror: usize,
    /// Return damaged blocks with their problems instead of failing (fsck, dump).
    pub lenient: bool,
    /// Open the file read-write, for a transaction. Otherwise it is opened
    /// read-only and memory-mapped. Only [`Image::open_path`] looks at this.
    pub writable: bool,
    /// Open a filesystem on several devices with some of them missing
    /// (`mount -o degraded`): reads use the copies on the devices present.
    /// Otherwise a missing device is [`Error::MissingDevice`].
    pub degraded: bool,
    /// Use a tree block whose every copy fails its checksum when nothing
    /// else is wrong with it (as `btrfs restore` reads such blocks): for
    /// getting files out of a damaged image, never for checking it. Each
    /// block so used is kept in [`Image::trusted_bad_csum`].
    pub trust_bad_csum: bool,
    /// A second fsid tree block headers may carry: the old one of an fsid
    /// change that a rerun of btrkit-tune finishes (blocks carry either).
    pub alt_fsid: Option<[u8; 16]>,
    /// A second checksum algorithm tree blocks may carry: the other one of
    /// an unfinished checksum conversion.
    pub alt_csum: Option<CsumType>,
}

/// Reads of each kind (tree blocks, data) described in [`RebuiltReads`]
/// before the rest are only counted.
pub const REBUILT_KEPT: usize = 64;

/// Reads of RAID5/6 data or tree blocks rebuilt from parity.
#[derive(Clone, Debug, Default)]
pub struct RebuiltReads {
    /// How many pieces were rebuilt.
    pub count: u64,
    /// How many of them because their own stripe was damaged (the others:
    /// unreadable or on a missing device).
    pub damaged: u64,
    /// How many of the damaged ones were tree blocks.
    pub damaged_tree: u64,
    /// The [`REBUILT_KEPT`] tree blocks and the [`REBUILT_KEPT`] data
    /// pieces at the lowest logical addresses, in address order. Kept per
    /// kind and by address, not by arrival, so that reads running in
    /// parallel (data checksums beside the tree walk) neither crowd the
    /// tree blocks out nor make two runs of one image describe different
    /// reads.
    pub described: Vec<RebuiltRead>,
    /// Tree blocks counted already.
    tree_blocks: std::collections::BTreeSet<u64>,
}

impl RebuiltReads {
    /// Keep `read` among the described ones if it is one of the
    /// [`REBUILT_KEPT`] lowest addresses of its kind so far.
    fn describe(&mut self, read: RebuiltRead) {
        let kind = read.tree_block;
        let at = self
            .described
            .partition_point(|d| (d.logical, d.len) < (read.logical, read.len));
        self.described.insert(at, read);
        let same = |d: &RebuiltRead| d.tree_block == kind;
        if self.described.iter().filter(|d| same(d)).count() > REBUILT_KEPT {
            if let Some(last) = self.described.iter().rposition(same) {
                self.described.remove(last);
            }
        }
    }
}

/// One piece read rebuilt from parity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuiltRead {
    /// Logical address and length of the piece.
    pub logical: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Where its own stripe is: device and physical offset.
    pub devid: u64,
    /// Physical offset of its stripe on `devid`.
    pub phys: u64,
    /// Its own stripe was read and found damaged (else it could not be
    /// read: a missing device or an I/O error).
    pub damaged: bool,
    /// A tree block (else data).
    pub tree_block: bool,
}

impl RebuiltRead {
    /// One line for a report.
    pub fn describe(&self, img: &Image) -> String {
        format!(
            "{} at logical {} (its RAID5/6 stripe at physical {} on {}) {}; read rebuilt from parity",
            if self.tree_block { "tree block" } else { "data" },
            self.logical,
            self.phys,
            img.device_name(self.devid),
            if self.damaged {
                "is damaged"
            } else {
                "cannot be read"
            }
        )
    }
}

/// An opened filesystem, read side: the superblock copy in use, the chunk
/// map, the devices (by devid) and validated tree block reads that fall
/// back from copy to copy across devices (what btrfs-progs' `open_ctree`
/// sets up for reading).
pub struct Image {
    /// The device the superblock was read from (and a single-device
    /// transaction writes to).
    dev: Arc<dyn BlockDevice>,
    /// Every device present, by devid (the superblock's device among them).
    devs: BTreeMap<u64, Arc<dyn BlockDevice>>,
    /// What each device was given as (a path), for messages.
    names: BTreeMap<u64, String>,
    /// Each present device's own device item, from its superblock: what a
    /// commit writes into that device's superblocks.
    own_dev_items: BTreeMap<u64, crate::format::dev::DevItem>,
    /// Devids of the chunk tree's device items, ascending.
    pub dev_items: Vec<u64>,
    /// Devids of the chunk tree's device items with no device present
    /// (only with [`OpenOptions::degraded`]).
    pub missing: Vec<u64>,
    /// The superblock copy the image was opened from (copy `mirror`).
    pub sb: Box<Superblock>,
    /// Superblock copy in use: 0 primary, 1 or 2.
    pub mirror: usize,
    /// Checksum algorithm, from the superblock's `csum_type`.
    pub csum: CsumType,
    /// Logical-to-physical map: the superblock's sys_chunk_array, then every
    /// chunk of the chunk tree.
    pub chunks: ChunkMap,
    /// Devid of the superblock's device (its `dev_item.devid`): the one a
    /// single-device transaction writes.
    pub devid: u64,
    /// Tree block size in bytes.
    pub nodesize: u32,
    /// Sector size in bytes: the unit of data extents and of tree block
    /// alignment.
    pub sectorsize: u32,
    /// Opened with [`OpenOptions::lenient`]: damaged blocks are returned with
    /// their problems instead of failing the read.
    pub lenient: bool,
    /// Opened with [`OpenOptions::degraded`]: devices in `missing` are
    /// known to be gone, and writes go to the copies on the others.
    pub degraded: bool,
    /// Opened with [`OpenOptions::trust_bad_csum`].
    trust_bad_csum: bool,
    /// [`OpenOptions::alt_fsid`].
    pub alt_fsid: Option<[u8; 16]>,
    /// [`OpenOptions::alt_csum`].
    pub alt_csum: Option<CsumType>,
    /// Read tree blocks whose generation is newer than the superblock's,
    /// or disagrees with the parent's pointer, without calling them
    /// damaged when no copy is without that problem: set by a repair that
    /// copies such blocks (every one of them found by the check before).
    pub accept_future: bool,
    /// Read extent tree blocks whose only problems are item bodies (an
    /// extent item that cannot be parsed) without calling them damaged:
    /// set by a repair that writes those items again from the references
    /// the other trees hold.
    pub accept_extent_items: bool,
    /// Tree blocks read whose every copy failed its checksum and nothing
    /// else (with [`OpenOptions::trust_bad_csum`]).
    trusted: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// Reads of RAID5/6 chunks whose own stripe was bad or missing and
    /// that were rebuilt from parity: what fsck and dump report.
    rebuilt: std::sync::Mutex<RebuiltReads>,
    /// The one writer of this filesystem's RAID5/6 chunks (every writer of
    /// the devices shares it, see [`crate::chunk::rmw`]).
    pub parity: Arc<ParityWriter>,
    /// Problems noticed while opening that lenient mode let through.
    pub open_warnings: Vec<String>,
}

impl Image {
    /// Open the image file or block device at `path`: read-write when
    /// [`OpenOptions::writable`], else read-only through a memory map.
    pub fn open_path(path: &Path, opts: OpenOptions) -> Result<Image> {
        let dev: Arc<dyn BlockDevice> = if opts.writable {
            Arc::new(FileDevice::open(path, true)?)
        } else {
            Arc::new(FileDevice::open_mmap(path)?)
        };
        Image::open(dev, opts)
    }

    /// Open the filesystem on `dev`: read and check superblock copy
    /// `opts.mirror`, map the system chunks from its sys_chunk_array, then read
    /// the whole chunk tree (`btrfs_read_sys_array` and `btrfs_read_chunk_tree`
    /// of `open_ctree`). A filesystem on several devices needs the others
    /// ([`Image::open_devices`]) or [`OpenOptions::degraded`].
    pub fn open(dev: Arc<dyn BlockDevice>, opts: OpenOptions) -> Result<Image> {
        Image::open_devices(dev, Vec::new(), BTreeMap::new(), opts)
    }

    /// Open the filesystem on `primary` (its superblock is the one used) and
    /// `others` (devid, device), devices already matched to it by their
    /// superblocks (`DeviceSet`). Every device item of the chunk tree must
    /// have its device unless `opts.degraded`; a device no device item names
    /// is refused.
    /// `names` (devid -> path) are for messages.
    pub fn open_devices(
        primary: Arc<dyn BlockDevice>,
        others: Vec<(u64, Arc<dyn BlockDevice>)>,
        names: BTreeMap<u64, String>,
        opts: OpenOptions,
    ) -> Result<Image> {
        let sb = Box::new(read_superblock(primary.as_ref(), opts.mirror)?);
        let mut warnings = Vec::new();
        check_superblock(&sb, primary.size(), &mut warnings)?;
        let chunks = ChunkMap::from_sys_chunk_array(&sb)?;
        let mut img = Image::assemble(primary, others, names, opts, sb, chunks, warnings)?;
        if let Err(e) = img.load_chunk_tree() {
            // The chunk tree may lie on the devices not given: say so
            // rather than what reading it ran into.
            let have = img.devs.len() as u64;
            let total = img.sb.num_devices.get();
            if total > have {
                return Err(Error::MissingDevice {
                    devids: Vec::new(),
                    what: format!(
                        "the filesystem has {total} devices and {have} {} given; its chunk tree \
                         cannot be read without the others ({e})",
                        if have == 1 { "was" } else { "were" }
                    ),
                });
            }
            return Err(e);
        }
        if !img.missing.is_empty() {
            let what = format!(
                "the filesystem has {} devices; {} {} not given",
                img.dev_items.len(),
                if img.missing.len() == 1 {
                    "devid"
                } else {
                    "devids"
                },
                list(&img.missing),
            );
            if !opts.degraded {
                return Err(Error::MissingDevice {
                    devids: img.missing.clone(),
                    what: format!(
                        "{what} (give every device, or open degraded to read what the others hold)"
                    ),
                });
            }
            img.open_warnings.push(format!("{what}: reading degraded"));
        }
        Ok(img)
    }

    /// Open the filesystem on `primary` and `others` (as
    /// [`Image::open_devices`]) with `chunks` as its chunk map, neither the
    /// superblock's sys_chunk_array nor the chunk tree read: what
    /// `chunk-recover` reads the other trees through while it rebuilds
    /// them. Every device of the filesystem must be given (the device
    /// items that would say which are missing are in the chunk tree).
    pub fn open_with_chunk_map(
        primary: Arc<dyn BlockDevice>,
        others: Vec<(u64, Arc<dyn BlockDevice>)>,
        names: BTreeMap<u64, String>,
        opts: OpenOptions,
        chunks: ChunkMap,
    ) -> Result<Image> {
        let sb = Box::new(read_superblock(primary.as_ref(), opts.mirror)?);
        let mut warnings = Vec::new();
        // The chunk tree's location is not needed here (and may be what
        // is being rebuilt): check everything else.
        let mut probe = *sb;
        if probe.chunk_root.get() == 0 || !probe.chunk_root.get().is_multiple_of(4096) {
            probe
                .chunk_root
                .set(probe.sectorsize.get().max(4096) as u64);
        }
        check_superblock(&probe, primary.size(), &mut warnings)?;
        let mut img = Image::assemble(primary, others, names, opts, sb, chunks, warnings)?;
        img.dev_items = img.devs.keys().copied().collect();
        if img.sb.num_devices.get() != img.dev_items.len() as u64 {
            return Err(Error::MissingDevice {
                devids: Vec::new(),
                what: format!(
                    "the filesystem has {} devices and {} were given: give every device",
                    img.sb.num_devices.get(),
                    img.dev_items.len()
                ),
            });
        }
        Ok(img)
    }

    /// The image on `primary` (superblock `sb`) and `others`, with
    /// `chunks` as its chunk map so far.
    fn assemble(
        primary: Arc<dyn BlockDevice>,
        others: Vec<(u64, Arc<dyn BlockDevice>)>,
        names: BTreeMap<u64, String>,
        opts: OpenOptions,
        sb: Box<Superblock>,
        chunks: ChunkMap,
        warnings: Vec<String>,
    ) -> Result<Image> {
        let csum = CsumType::from_disk(sb.csum_type.get())?;
        let devid = sb.dev_item.devid.get();
        let mut devs = BTreeMap::from([(devid, primary.clone())]);
        let mut own_dev_items = BTreeMap::from([(devid, sb.dev_item)]);
        for (id, d) in others {
            let theirs = first_valid_superblock(d.as_ref())?;
            if theirs.dev_item.devid.get() != id || !crate::devices::same_filesystem(&sb, &theirs) {
                return Err(Error::Invalid(format!(
                    "device {id} holds device {} of filesystem {}",
                    theirs.dev_item.devid.get(),
                    crate::util::uuid::uuid_str(&theirs.fsid)
                )));
            }
            own_dev_items.insert(id, theirs.dev_item);
            if devs.insert(id, d).is_some() {
                return Err(Error::Invalid(format!("device {id} given twice")));
            }
        }
        Ok(Image {
            dev: primary,
            devs,
            names,
            own_dev_items,
            dev_items: Vec::new(),
            missing: Vec::new(),
            devid,
            nodesize: sb.nodesize.get(),
            sectorsize: sb.sectorsize.get(),
            csum,
            chunks,
            sb,
            mirror: opts.mirror,
            lenient: opts.lenient,
            degraded: opts.degraded,
            trust_bad_csum: opts.trust_bad_csum,
            alt_fsid: opts.alt_fsid,
            alt_csum: opts.alt_csum,
            accept_future: false,
            accept_extent_items: false,
            trusted: Default::default(),
            rebuilt: Default::default(),
            parity: Arc::new(ParityWriter::new()),
            open_warnings: warnings,
        })
    }

    /// The device the superblock was read from (and a single-device
    /// transaction writes to).
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The device with id `devid`, if present.
    pub fn device_of(&self, devid: u64) -> Option<&Arc<dyn BlockDevice>> {
        self.devs.get(&devid)
    }

    /// Every device present: (devid, device), by devid.
    pub fn devices(&self) -> impl Iterator<Item = (u64, &Arc<dyn BlockDevice>)> {
        self.devs.iter().map(|(&id, d)| (id, d))
    }

    /// Every device present, by devid (what the parity writer reads and
    /// writes through).
    pub fn device_map(&self) -> &BTreeMap<u64, Arc<dyn BlockDevice>> {
        &self.devs
    }

    /// Every device present, by devid, as shared handles.
    pub fn device_list(&self) -> Vec<(u64, Arc<dyn BlockDevice>)> {
        self.devs.iter().map(|(&id, d)| (id, d.clone())).collect()
    }

    /// A device joins the filesystem (`btrfs device add`): it is read and
    /// written from now on, its superblocks written by the next commit
    /// with `item`.
    pub fn add_device(
        &mut self,
        name: String,
        dev: Arc<dyn BlockDevice>,
        item: crate::format::dev::DevItem,
    ) {
        let devid = item.devid.get();
        self.devs.insert(devid, dev);
        self.names.insert(devid, name);
        self.own_dev_items.insert(devid, item);
        if let Err(i) = self.dev_items.binary_search(&devid) {
            self.dev_items.insert(i, devid);
        }
    }

    /// A device leaves the filesystem (`btrfs device remove`, after
    /// everything on it moved): no longer read, written or given
    /// superblocks. Returns it.
    pub fn remove_device(&mut self, devid: u64) -> Option<Arc<dyn BlockDevice>> {
        self.names.remove(&devid);
        self.own_dev_items.remove(&devid);
        self.dev_items.retain(|&d| d != devid);
        self.missing.retain(|&d| d != devid);
        let gone = self.devs.remove(&devid);
        if devid == self.devid {
            if let Some((&id, d)) = self.devs.iter().next() {
                self.devid = id;
                self.dev = d.clone();
            }
        }
        gone
    }

    /// Device `dev` takes device `devid`'s place (a replace): the same
    /// devid and device item, read and written from now on; the one it
    /// replaces (None when it was missing) is returned.
    pub fn replace_device(
        &mut self,
        devid: u64,
        name: String,
        dev: Arc<dyn BlockDevice>,
    ) -> Option<Arc<dyn BlockDevice>> {
        self.names.insert(devid, name);
        self.missing.retain(|&d| d != devid);
        if devid == self.devid {
            self.dev = dev.clone();
        }
        self.devs.insert(devid, dev)
    }

    /// The name (path) device `devid` was given by, None when missing.
    pub fn device_path(&self, devid: u64) -> Option<&str> {
        self.names.get(&devid).map(|s| s.as_str())
    }

    /// The device item device `devid` carries in its own superblocks.
    pub fn own_dev_item(&self, devid: u64) -> Option<&crate::format::dev::DevItem> {
        self.own_dev_items.get(&devid)
    }

    /// Open the same devices again with `opts` (the superblock as it is on
    /// disk now); degraded if this one was.
    pub fn reopen(&self, mut opts: OpenOptions) -> Result<Image> {
        opts.degraded |= self.degraded;
        let others = self
            .devs
            .iter()
            .filter(|(&id, _)| id != self.devid)
            .map(|(&id, d)| (id, d.clone()))
            .collect();
        Image::open_devices(self.dev.clone(), others, self.names.clone(), opts)
    }

    /// Tree blocks used although every copy failed its checksum (opened
    /// with [`OpenOptions::trust_bad_csum`]), ascending.
    pub fn trusted_bad_csum(&self) -> Vec<u64> {
        self.trusted
            .lock()
            .map(|t| t.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Reads rebuilt from parity so far (the first [`REBUILT_KEPT`]
    /// described, then counted), and forget them.
    pub fn take_rebuilt_reads(&self) -> RebuiltReads {
        self.rebuilt
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }

    fn note_rebuilt(&self, p: &StripePiece, logical: u64, damaged: bool, tree_block: bool) {
        if let Ok(mut r) = self.rebuilt.lock() {
            // A tree block read again (each walk that meets it) counts once.
            if tree_block && !r.tree_blocks.insert(logical) {
                return;
            }
            r.count += 1;
            r.damaged += damaged as u64;
            r.damaged_tree += (damaged && tree_block) as u64;
            let (devid, phys) = p.copies.first().copied().unwrap_or((0, 0));
            r.describe(RebuiltRead {
                logical,
                len: p.len,
                devid,
                phys,
                damaged,
                tree_block,
            });
        }
    }

    /// How many ways `p` can be read: its copies, or for RAID5/6 its own
    /// stripe and then each rebuild from parity.
    pub fn ways_of(p: &StripePiece) -> usize {
        match &p.parity {
            Some(c) => 1 + rmw::rebuild_attempts(c).len(),
            None => p.copies.len(),
        }
    }

    /// Read the piece `p` (one stripe unit, `buf.len()` = `p.len`) the
    /// `way`th way (see [`Image::ways_of`]).
    pub fn read_way(&self, p: &StripePiece, way: usize, buf: &mut [u8]) -> Result<()> {
        match &p.parity {
            Some(c) if way > 0 => {
                let how = rmw::rebuild_attempts(c)
                    .get(way - 1)
                    .copied()
                    .ok_or_else(|| Error::Internal(format!("read way {way} of a parity piece")))?;
                rmw::read_column(c, how, &self.devs, buf)
            }
            _ => {
                let &(devid, phys) = p.copies.get(way).ok_or_else(|| {
                    Error::Internal(format!("read way {way} of {} copies", p.copies.len()))
                })?;
                self.read_copy(devid, phys, buf)
            }
        }
    }

    /// `[logical, logical + len)` cut at stripe units, each piece with its
    /// copies (or its parity column); offsets are logical addresses.
    pub fn pieces(&self, logical: u64, len: u64) -> Result<Vec<StripePiece>> {
        self.chunks.pieces(logical, len)
    }

    /// Read `buf.len()` bytes at logical `logical`, each stripe unit the
    /// first way `accept(logical of the piece, bytes)` takes: its copies in
    /// mirror order, or its own stripe then rebuilds from parity. Unreadable
    /// ways (missing devices, I/O errors) are skipped. A piece no way
    /// passes is left as its first readable way gave it, and its logical
    /// address returned. A rebuilt piece that passes is noted
    /// ([`Image::take_rebuilt_reads`]).
    pub fn read_logical_checked(
        &self,
        logical: u64,
        buf: &mut [u8],
        accept: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<Vec<u64>> {
        let mut failed = Vec::new();
        let mut at = 0usize;
        for p in self.pieces(logical, buf.len() as u64)? {
            let part = &mut buf[at..at + p.len as usize];
            at += p.len as usize;
            let mut first_ok: Option<Vec<u8>> = None;
            let mut err = None;
            let mut done = false;
            for way in 0..Image::ways_of(&p) {
                match self.read_way(&p, way, part) {
                    Ok(()) => {
                        if accept(p.offset, part) {
                            if way > 0 && p.parity.is_some() {
                                self.note_rebuilt(&p, p.offset, first_ok.is_some(), false);
                            }
                            done = true;
                            break;
                        }
                        if first_ok.is_none() {
                            first_ok = Some(part.to_vec());
                        }
                    }
                    Err(e) => {
                        err.get_or_insert(e);
                    }
                }
            }
            if !done {
                match first_ok {
                    Some(v) => {
                        part.copy_from_slice(&v);
                        failed.push(p.offset);
                    }
                    None => {
                        return Err(err.unwrap_or_else(|| {
                            Error::corrupt_as(CorruptKind::Lost, "no copy", p.offset)
                        }))
                    }
                }
            }
        }
        Ok(failed)
    }

    /// The filesystem spans more than one device (present or not).
    pub fn multi_device(&self) -> bool {
        self.dev_items.len() > 1 || self.devs.len() > 1
    }

    /// A device for a message: `devid 2 (b.img)`, or `devid 2`.
    pub fn device_name(&self, devid: u64) -> String {
        match self.names.get(&devid) {
            Some(n) => format!("devid {devid} ({n})"),
            None => format!("devid {devid}"),
        }
    }

    /// Read `buf.len()` bytes at `phys` on device `devid`: the one read of
    /// one copy, whatever profile put it there.
    pub fn read_copy(&self, devid: u64, phys: u64, buf: &mut [u8]) -> Result<()> {
        self.copy_device(devid)?.read_at(phys, buf)
    }

    /// The device a copy lies on; a missing one is [`Error::MissingDevice`].
    pub fn copy_device(&self, devid: u64) -> Result<&Arc<dyn BlockDevice>> {
        self.devs.get(&devid).ok_or_else(|| Error::MissingDevice {
            devids: vec![devid],
            what: format!("device {devid} is missing"),
        })
    }

    /// Fill the chunk map from the chunk tree and match its device items
    /// against the devices given (`missing` says which have none).
    fn load_chunk_tree(&mut self) -> Result<()> {
        let root = self.chunk_tree();
        let mut map = self.chunks.clone();
        let mut devs = Vec::new();
        let mut warnings = Vec::new();
        let mut it = TreeIter::new(self, root, Key::MIN)?;
        while let Some(r) = it.next_item() {
            let item = r?;
            match item.key.ty {
                BTRFS_CHUNK_ITEM_KEY => {
                    let (_, body) = item.decode(self.csum.size())?;
                    if let ItemBody::Chunk(c, s) = body {
                        if let Err(e) = map.insert(item.key.offset, c, s) {
                            match e {
                                Error::Unsupported(_) => return Err(e),
                                e if self.lenient => {
                                    warnings.push(e.at(item.node.bytenr, item.key).to_string())
                                }
                                e => return Err(e.at(item.node.bytenr, item.key)),
                            }
                        }
                    }
                }
                BTRFS_DEV_ITEM_KEY => devs.push(item.key.offset),
                _ => {}
            }
        }
        drop(it);
        self.open_warnings.extend(warnings);
        devs.sort_unstable();
        devs.dedup();
        if let Some(stray) = self.devs.keys().find(|d| devs.binary_search(d).is_err()) {
            return Err(Error::Invalid(format!(
                "{} is not a device of this filesystem (its chunk tree has devices {})",
                self.device_name(*stray),
                list(&devs)
            )));
        }
        let missing: Vec<u64> = devs
            .iter()
            .copied()
            .filter(|d| !self.devs.contains_key(d))
            .collect();
        if self.sb.num_devices.get() != devs.len() as u64 {
            self.open_warnings.push(format!(
                "superblock num_devices is {} but the chunk tree has {} device{}",
                self.sb.num_devices.get(),
                devs.len(),
                if devs.len() == 1 { "" } else { "s" }
            ));
        }
        self.dev_items = devs;
        self.missing = missing;
        self.chunks = map;
        Ok(())
    }

    /// What a tree block of this filesystem is validated against. `log`: the
    /// block belongs to a log tree, written in the transaction after the
    /// superblock's generation, so one generation more is allowed.
    pub fn ctx(&self, log: bool) -> ValidateCtx {
        ValidateCtx {
            nodesize: self.nodesize,
            sectorsize: self.sectorsize,
            csum: self.csum,
            fsid: self.sb.tree_fsid(),
            alt_fsid: self.alt_fsid,
            alt_csum: self.alt_csum,
            max_generation: if self.accept_future {
                u64::MAX
            } else {
                self.sb.generation.get().saturating_add(log as u64)
            },
        }
    }

    /// Read `buf.len()` bytes at logical address `logical`: each stripe unit
    /// the range crosses from the first of its copies that can be read, a
    /// RAID5/6 stripe on a missing device rebuilt from parity (no checksum
    /// is known here to choose by; [`Image::read_logical_checked`] has one).
    pub fn read_logical(&self, logical: u64, buf: &mut [u8]) -> Result<()> {
        self.read_logical_checked(logical, buf, &mut |_, _| true)
            .map(|_| ())
    }

    /// Every copy of a tree block, in mirror order; a copy that cannot be
    /// read (or lies on a missing device) is an Err in its slot.
    pub fn read_block_copies(&self, bytenr: u64) -> Result<Vec<Result<Vec<u8>>>> {
        Ok(self
            .block_copy_addrs(bytenr)?
            .into_iter()
            .map(|(d, p)| self.read_block_at(d, p))
            .collect())
    }

    /// A tree block's one stripe piece: its copies, or its RAID5/6 column.
    pub fn block_piece(&self, bytenr: u64) -> Result<StripePiece> {
        self.block_aligned(bytenr)?;
        let mut v = self.chunks.pieces(bytenr, self.nodesize as u64)?;
        if v.len() != 1 {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!("tree block {bytenr} crosses a stripe boundary"),
                bytenr,
            ));
        }
        Ok(v.swap_remove(0))
    }

    /// Every copy of a tree block, (devid, physical) in mirror order (a
    /// RAID5/6 block has one, its data stripe; its parity is in
    /// [`Image::block_piece`]).
    pub fn block_copy_addrs(&self, bytenr: u64) -> Result<Vec<(u64, u64)>> {
        self.block_aligned(bytenr)?;
        self.chunks.copies(bytenr, self.nodesize as u64)
    }

    /// A tree block address must be sector aligned.
    fn block_aligned(&self, bytenr: u64) -> Result<()> {
        if !bytenr.is_multiple_of(self.sectorsize as u64) {
            return Err(Error::corrupt_as(
                CorruptKind::ChunkMap,
                format!(
                    "tree block address {bytenr} is not aligned to sectorsize {}",
                    self.sectorsize
                ),
                bytenr,
            ));
        }
        Ok(())
    }

    /// Start reading the first present copy of a tree block in the
    /// background (a whole-tree walk calls this for the blocks it will visit
    /// next).
    pub fn prefetch_tree_block(&self, bytenr: u64) {
        if let Ok(copies) = self.block_copy_addrs(bytenr) {
            if let Some((d, p)) = copies
                .iter()
                .find_map(|&(d, p)| Some((self.devs.get(&d)?, p)))
            {
                d.prefetch(p, self.nodesize as u64);
            }
        }
    }

    /// Start reading every leaf of the tree rooted at `bytenr` (`level`)
    /// in the background: its internal nodes are read here to find them
    /// (at most 4096). Only a hint: anything unreadable ends it quietly.
    pub fn prefetch_leaves(&self, bytenr: u64, level: u8) {
        let mut level = level;
        let mut frontier = vec![bytenr];
        let mut budget = 4096usize;
        while level > 0 && !frontier.is_empty() {
            let mut next = Vec::new();
            for &b in &frontier {
                if budget == 0 {
                    return;
                }
                budget -= 1;
                let expect = Expect {
                    level: Some(level),
                    ..Default::default()
                };
                let Ok(node) = self.read_tree_block(b, &expect, false) else {
                    continue;
                };
                for slot in 0..node.nr_safe() {
                    if let Some(p) = node.key_ptr(slot) {
                        next.push(p.blockptr.get());
                    }
                }
            }
            level -= 1;
            if level == 0 {
                for &b in &next {
                    self.prefetch_tree_block(b);
                }
            }
            frontier = next;
        }
    }

    /// Ask the devices to read ahead the first copy of data extents
    /// (logical address, length), in runs of touching extents.
    pub fn prefetch_data(&self, extents: &[(u64, u64)]) {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &(s, l) in extents {
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == s => r.1 += l,
                _ => runs.push((s, l)),
            }
        }
        for (s, l) in runs {
            let Ok(pieces) = self.chunks.pieces(s, l) else {
                continue;
            };
            for p in pieces {
                if let Some(&(devid, phys)) = p.copies.first() {
                    if let Some(d) = self.device_of(devid) {
                        d.prefetch(phys, p.len);
                    }
                }
            }
        }
    }

    fn read_block_at(&self, devid: u64, phys: u64) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.nodesize as usize];
        self.read_copy(devid, phys, &mut v).map(|_| v)
    }

    /// Read and validate a tree block. The first copy with no problem wins;
    /// in strict mode a block with problems in every copy is an error, in
    /// lenient mode the copy with the fewest problems is returned with them.
    pub fn read_tree_block_checked(
        &self,
        bytenr: u64,
        expect: &Expect,
        log: bool,
    ) -> Result<(Node, Vec<Problem>)> {
        self.read_tree_block_as(bytenr, expect, log, self.lenient)
    }

    /// [`read_tree_block_checked`](Self::read_tree_block_checked) as a
    /// lenient image reads, whatever this one's mode: for a repair that
    /// rewrites a block it has found damaged.
    pub fn read_damaged_tree_block(
        &self,
        bytenr: u64,
        expect: &Expect,
    ) -> Result<(Node, Vec<Problem>)> {
        self.read_tree_block_as(bytenr, expect, false, true)
    }

    fn read_tree_block_as(
        &self,
        bytenr: u64,
        expect: &Expect,
        log: bool,
        lenient: bool,
    ) -> Result<(Node, Vec<Problem>)> {
        let ctx = self.ctx(log);
        let mut best: Option<(Node, Vec<Problem>)> = None;
        let mut io_err = None;
        let piece = self.block_piece(bytenr)?;
        // Later copies (and rebuilds) are only read when the earlier ones
        // are bad.
        for way in 0..Image::ways_of(&piece) {
            let mut buf = vec![0u8; self.nodesize as usize];
            if let Err(e) = self.read_way(&piece, way, &mut buf) {
                io_err.get_or_insert(e);
                continue;
            }
            let node = Node::from_vec(bytenr, buf)?;
            let problems = node.validate(&ctx, expect);
            if problems.is_empty() {
                if way > 0 && piece.parity.is_some() {
                    self.note_rebuilt(&piece, bytenr, best.is_some(), true);
                }
                return Ok((node, problems));
            }
            if best.as_ref().is_none_or(|(_, p)| problems.len() < p.len()) {
                best = Some((node, problems));
            }
        }
        match best {
            Some((node, problems))
                if self.accept_future
                    && problems
                        .iter()
                        .all(|p| p.kind == ProblemKind::ParentTransid) =>
            {
                Ok((node, Vec::new()))
            }
            Some((node, problems))
                if self.accept_extent_items
                    && node.owner() == BTRFS_EXTENT_TREE_OBJECTID
                    && problems.iter().all(|p| p.kind == ProblemKind::ItemBody) =>
            {
                Ok((node, Vec::new()))
            }
            Some((node, problems))
                if self.trust_bad_csum
                    && problems.iter().all(|p| p.kind == ProblemKind::Checksum) =>
            {
                if let Ok(mut t) = self.trusted.lock() {
                    t.insert(bytenr);
                }
                Ok((node, Vec::new()))
            }
            Some((node, problems)) => {
                if lenient
                    && !problems
                        .iter()
                        .any(|p| p.kind == ProblemKind::Level && expect.level.is_some())
                {
                    Ok((node, problems))
                } else {
                    Err(problems
                        .into_iter()
                        .next()
                        .map(Problem::into_error)
                        .unwrap_or_else(|| Error::corrupt("tree block", bytenr)))
                }
            }
            None => Err(io_err.unwrap_or_else(|| {
                Error::corrupt_as(CorruptKind::Lost, "tree block unreadable", bytenr)
            })),
        }
    }

    /// [`read_tree_block_checked`](Self::read_tree_block_checked), dropping the
    /// problems a lenient read lets through.
    pub fn read_tree_block(&self, bytenr: u64, expect: &Expect, log: bool) -> Result<Node> {
        self.read_tree_block_checked(bytenr, expect, log)
            .map(|(n, _)| n)
    }

    /// The root tree, from the superblock's `root`, `root_level` and
    /// `generation`.
    pub fn root_tree(&self) -> TreeRoot {
        TreeRoot {
            id: BTRFS_ROOT_TREE_OBJECTID,
            bytenr: self.sb.root.get(),
            level: self.sb.root_level,
            generation: self.sb.generation.get(),
        }
    }
    /// The chunk tree, from the superblock's `chunk_root`, `chunk_root_level`
    /// and `chunk_root_generation`.
    pub fn chunk_tree(&self) -> TreeRoot {
        TreeRoot {
            id: BTRFS_CHUNK_TREE_OBJECTID,
            bytenr: self.sb.chunk_root.get(),
            level: self.sb.chunk_root_level,
            generation: self.sb.chunk_root_generation.get(),
        }
    }
    /// The log root tree, when the superblock says a log must be replayed.
    pub fn log_root_tree(&self) -> Option<TreeRoot> {
        let b = self.sb.log_root.get();
        (b != 0).then(|| TreeRoot {
            id: BTRFS_TREE_LOG_OBJECTID,
            bytenr: b,
            level: self.sb.log_root_level,
            generation: self.sb.generation.get().saturating_add(1),
        })
    }

    /// Every ROOT_ITEM in `tree` (the root tree or the log root tree).
    pub fn root_items_in(&self, tree: TreeRoot) -> Result<Vec<(Key, RootItem)>> {
        let mut out = Vec::new();
        let mut it = TreeIter::new(self, tree, Key::MIN)?;
        while let Some(r) = it.next_item() {
            let item = r?;
            if item.key.ty != BTRFS_ROOT_ITEM_KEY {
                continue;
            }
            let ri = RootItem::parse(item.data()?).map_err(|e| e.at(item.node.bytenr, item.key))?;
            out.push((item.key, ri));
        }
        Ok(out)
    }

    /// The algorithm an unfinished checksum conversion (superblock flag
    /// CHANGING_DATA_CSUM or CHANGING_META_CSUM) converts to, from its
    /// temporary item in the root tree (btrkit-tune's or btrfstune's);
    /// None when there is none or the root tree cannot be read.
    pub fn unfinished_csum_target(&self) -> Option<CsumType> {
        if self.sb.flags.get()
            & (BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM | BTRFS_SUPER_FLAG_CHANGING_META_CSUM)
            == 0
        {
            return None;
        }
        let start = Key::new(BTRFS_CSUM_CHANGE_OBJECTID, BTRFS_TEMPORARY_ITEM_KEY, 0);
        let mut it = TreeIter::new(self, self.root_tree(), start).ok()?;
        let item = it.next_item()?.ok()?;
        if item.key.objectid != start.objectid || item.key.ty != start.ty {
            return None;
        }
        CsumType::from_disk(u16::try_from(item.key.offset).ok()?).ok()
    }

    /// The newest ROOT_ITEM of tree `id` in the root tree.
    pub fn find_root(&self, id: u64) -> Result<Option<TreeRoot>> {
        let mut it = TreeIter::new(self, self.root_tree(), Key::new(id, BTRFS_ROOT_ITEM_KEY, 0))?;
        let mut found = None;
        while let Some(r) = it.next_item() {
            let item = r?;
            if item.key.objectid != id || item.key.ty != BTRFS_ROOT_ITEM_KEY {
                break;
            }
            let ri = RootItem::parse(item.data()?).map_err(|e| e.at(item.node.bytenr, item.key))?;
            found = Some(tree_root_of(id, &ri));
        }
        Ok(found)
    }
}

/// The root of tree `id` as its ROOT_ITEM `ri` records it (`bytenr`,
/// `level`, `generation`).
pub fn tree_root_of(id: u64, ri: &RootItem) -> TreeRoot {
    TreeRoot {
        id,
        bytenr: ri.bytenr.get(),
        level: ri.level,
        generation: ri.generation.get(),
    }
}

/// Devids as `1, 2, 3`.
fn list(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first copy of the superblock of `dev` that reads and verifies
/// (primary first): what a device of a set is known by when its own
/// primary copy is damaged. The primary's error when none does.
pub fn first_valid_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut first = None;
    for mirror in 0..BTRFS_SUPER_MIRROR_MAX {
        match read_superblock(dev, mirror) {
            Ok(sb) => return Ok(sb),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| Error::NotBtrfs("no superblock".into())))
}

/// Read and verify superblock copy `mirror`.
pub fn read_superblock(dev: &dyn BlockDevice, mirror: usize) -> Result<Superblock> {
    if mirror >= BTRFS_SUPER_MIRROR_MAX {
        return Err(Error::Invalid(format!(
            "superblock mirror {mirror} does not exist (0, 1 or 2)"
        )));
    }
    let off = btrfs_sb_offset(mirror);
    let size = dev.size();
    if size < off + BTRFS_SUPER_INFO_SIZE as u64 {
        return Err(if mirror == 0 {
            Error::NotBtrfs(format!(
                "image is {size} bytes, too small to hold a superblock at 64 KiB"
            ))
        } else {
            Error::Invalid(format!(
                "image of {size} bytes has no superblock mirror {mirror} (at byte {off})"
            ))
        });
    }
    let (sb, status) = read_superblock_raw(dev, mirror)?;
    if !status.magic_ok {
        return Err(Error::NotBtrfs(format!(
            "no btrfs magic in the superblock at byte {off}"
        )));
    }
    let csum = CsumType::from_disk(sb.csum_type.get())?;
    if status.csum_ok != Some(true) {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            format!("superblock {} checksum mismatch", csum.name()),
            off,
        ));
    }
    if !status.bytenr_ok {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            format!(
                "superblock says it lives at byte {} but was read at {off}",
                sb.bytenr.get()
            ),
            off,
        ));
    }
    Ok(sb)
}

/// What a raw read of one superblock copy found. A copy is usable only when
/// [`SuperStatus::is_valid`]; the other fields say what is wrong otherwise.
/// This is the one judgement of a copy: [`read_superblock`], the checker's
/// mirror phase and dump's `super` all take it from here.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SuperStatus {
    /// Copy number: 0 primary (at 64 KiB), 1 (64 MiB) or 2 (256 GiB).
    pub mirror: usize,
    /// Byte offset the copy was read from.
    pub offset: u64,
    /// The `magic` field is `_BHRfS_M` (`BTRFS_MAGIC`).
    pub magic_ok: bool,
    /// None when the checksum type is not one this engine knows, so the
    /// checksum cannot be verified at all.
    pub csum_ok: Option<bool>,
    /// The copy's `bytenr` field names the offset it was read from.
    pub bytenr_ok: bool,
    /// The stored checksum, `csum_size` bytes (all 32 when the type is unknown).
    pub stored_csum: Vec<u8>,
    /// The checksum computed over the copy, when the type is known.
    pub computed_csum: Option<Vec<u8>>,
    /// Every byte of the copy is zero: no superblock was ever written there.
    pub all_zero: bool,
}

impl SuperStatus {
    /// The copy is usable: magic, checksum and `bytenr` all hold (what the
    /// kernel's `btrfs_read_dev_one_super` and `btrfs_check_super_csum` ask).
    pub fn is_valid(&self) -> bool {
        self.magic_ok && self.csum_ok == Some(true) && self.bytenr_ok
    }
    /// One line naming every defect, empty for a valid copy.
    pub fn defects(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.magic_ok {
            v.push("bad magic".to_string());
        }
        match self.csum_ok {
            Some(true) => {}
            Some(false) => v.push("checksum MISMATCH".to_string()),
            None => v.push("unknown checksum type".to_string()),
        }
        if !self.bytenr_ok {
            v.push("bytenr field does not match its offset".to_string());
        }
        v
    }
}

/// Read superblock copy `mirror` without judging it: the fields are returned
/// whatever the magic, checksum and bytenr say, with a [`SuperStatus`] saying
/// which of them hold. Fails only when the copy does not exist (mirror number
/// out of range, image too small) or cannot be read.
pub fn read_superblock_raw(
    dev: &dyn BlockDevice,
    mirror: usize,
) -> Result<(Superblock, SuperStatus)> {
    if mirror >= BTRFS_SUPER_MIRROR_MAX {
        return Err(Error::Invalid(format!(
            "superblock mirror {mirror} does not exist (0, 1 or 2)"
        )));
    }
    let off = btrfs_sb_offset(mirror);
    let size = dev.size();
    if size < off + BTRFS_SUPER_INFO_SIZE as u64 {
        return Err(Error::Invalid(format!(
            "image of {size} bytes has no superblock mirror {mirror} (at byte {off})"
        )));
    }
    let mut buf = [0u8; BTRFS_SUPER_INFO_SIZE];
    dev.read_at(off, &mut buf)?;
    let sb = Superblock::read_from_bytes(&buf)
        .map_err(|_| Error::corrupt_as(CorruptKind::Superblock, "superblock", off))?;
    let (csum_ok, stored_csum, computed_csum) = match CsumType::from_disk(sb.csum_type.get()) {
        Ok(t) => {
            let c = crate::csum::block_csum(t, &buf);
            (
                Some(verify_block(t, &buf)),
                sb.csum[..t.size()].to_vec(),
                Some(c[..t.size()].to_vec()),
            )
        }
        Err(_) => (None, sb.csum.to_vec(), None),
    };
    let status = SuperStatus {
        mirror,
        offset: off,
        magic_ok: sb.magic.get() == BTRFS_MAGIC,
        csum_ok,
        bytenr_ok: sb.bytenr.get() == off,
        stored_csum,
        computed_csum,
        all_zero: buf.iter().all(|&b| b == 0),
    };
    Ok((sb, status))
}

/// Sanity checks of a superblock that make reading possible at all; what
/// only indicates damage elsewhere is a warning.
pub fn check_superblock(sb: &Superblock, dev_size: u64, warnings: &mut Vec<String>) -> Result<()> {
    let off = sb.bytenr.get();
    let ns = sb.nodesize.get();
    let ss = sb.sectorsize.get();
    if !ss.is_power_of_two() || !(4096..=65536).contains(&ss) {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            format!("superblock sectorsize {ss} invalid"),
            off,
        ));
    }
    if !ns.is_power_of_two() || ns < ss || ns > BTRFS_MAX_NODESIZE {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            format!("superblock nodesize {ns} invalid"),
            off,
        ));
    }
    let unknown = sb.incompat_flags.get() & !SUPPORTED_INCOMPAT;
    if unknown != 0 {
        let names = crate::format::names::incompat_names(unknown).join(", ");
        return Err(Error::Unsupported(format!(
            "incompat feature flags 0x{unknown:x} ({names})"
        )));
    }
    let unknown_ro = sb.compat_ro_flags.get() & !SUPPORTED_COMPAT_RO;
    if unknown_ro != 0 {
        warnings.push(format!(
            "unknown compat_ro flags 0x{unknown_ro:x}: read-only access only"
        ));
    }
    for (name, v) in [("root", sb.root.get()), ("chunk_root", sb.chunk_root.get())] {
        if v == 0 || v % ss as u64 != 0 {
            return Err(Error::corrupt_as(
                CorruptKind::Superblock,
                format!("superblock {name} {v} is not a sector-aligned address"),
                off,
            ));
        }
    }
    if !sb.log_root.get().is_multiple_of(ss as u64) {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            format!(
                "superblock log_root {} is not sector aligned",
                sb.log_root.get()
            ),
            off,
        ));
    }
    for (name, l) in [
        ("root_level", sb.root_level),
        ("chunk_root_level", sb.chunk_root_level),
        ("log_root_level", sb.log_root_level),
    ] {
        if l >= BTRFS_MAX_LEVEL {
            return Err(Error::corrupt_as(
                CorruptKind::Superblock,
                format!("superblock {name} {l} exceeds {}", BTRFS_MAX_LEVEL - 1),
                off,
            ));
        }
    }
    if sb.num_devices.get() == 0 {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            "superblock num_devices is 0",
            off,
        ));
    }
    if sb.total_bytes.get() > dev_size.max(sb.dev_item.total_bytes.get())
        && dev_size < sb.dev_item.total_bytes.get()
    {
        warnings.push(format!(
            "image is {dev_size} bytes but the device item says {}: the image may be truncated",
            sb.dev_item.total_bytes.get()
        ));
    }
    if sb.sys_chunk_array_size.get() as usize > BTRFS_SYSTEM_CHUNK_ARRAY_SIZE {
        return Err(Error::corrupt_as(
            CorruptKind::Superblock,
            format!(
                "superblock sys_chunk_array_size {} too large",
                sb.sys_chunk_array_size.get()
            ),
            off,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;
    use zerocopy::{FromZeros, IntoBytes};

    /// Many data pieces rebuilt before (and after) a few tree blocks, in a
    /// scrambled order: the tree blocks are all described, and of each
    /// kind the lowest addresses, whatever the order of arrival.
    #[test]
    fn rebuilt_reads_keep_each_kind_by_address() {
        let piece = |logical: u64, tree_block: bool| RebuiltRead {
            logical,
            len: 4096,
            devid: 1,
            phys: logical,
            damaged: true,
            tree_block,
        };
        let mut order: Vec<(u64, bool)> = (0..300u64).map(|i| (i * 4096, false)).collect();
        order.extend((0..5u64).map(|i| ((1 << 30) | (i * 16384), true)));
        // A fixed shuffle: multiplying by a unit modulo the length.
        let n = order.len();
        let mut r = RebuiltReads::default();
        for i in 0..n {
            let (logical, tree) = order[(i * 97) % n];
            r.describe(piece(logical, tree));
        }
        let trees: Vec<u64> = r
            .described
            .iter()
            .filter(|d| d.tree_block)
            .map(|d| d.logical)
            .collect();
        assert_eq!(
            trees,
            (0..5u64)
                .map(|i| (1 << 30) | (i * 16384))
                .collect::<Vec<_>>()
        );
        let data: Vec<u64> = r
            .described
            .iter()
            .filter(|d| !d.tree_block)
            .map(|d| d.logical)
            .collect();
        assert_eq!(
            data,
            (0..REBUILT_KEPT as u64)
                .map(|i| i * 4096)
                .collect::<Vec<_>>()
        );
        assert!(r.described.windows(2).all(|w| w[0].logical <= w[1].logical));
    }

    /// A device holding one crc32c superblock copy at mirror 0.
    fn dev_with_super(size: usize) -> MemDevice {
        let mut sb = Superblock::new_zeroed();
        sb.magic = BTRFS_MAGIC.into();
        sb.bytenr = btrfs_sb_offset(0).into();
        sb.generation = 42.into();
        let mut buf = sb.as_bytes().to_vec();
        let c = crate::csum::block_csum(CsumType::Crc32c, &buf);
        buf[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        let mut img = vec![0u8; size];
        let off = btrfs_sb_offset(0) as usize;
        img[off..off + BTRFS_SUPER_INFO_SIZE].copy_from_slice(&buf);
        MemDevice::new(img)
    }

    #[test]
    fn raw_superblock_reports_instead_of_failing() {
        let dev = dev_with_super(1 << 20);
        let (sb, st) = read_superblock_raw(&dev, 0).unwrap();
        assert!(st.is_valid() && !st.all_zero, "{:?}", st.defects());
        assert_eq!(sb.generation.get(), 42);
        assert_eq!(st.stored_csum.len(), 4);
        assert_eq!(Some(st.stored_csum.clone()), st.computed_csum);

        // A flipped byte: fields still returned, checksum reported bad.
        let mut bytes = dev.snapshot();
        bytes[btrfs_sb_offset(0) as usize + 0x200] ^= 1;
        let dev = MemDevice::new(bytes);
        let (sb, st) = read_superblock_raw(&dev, 0).unwrap();
        assert_eq!(sb.generation.get(), 42);
        assert_eq!(st.csum_ok, Some(false));
        assert!(!st.is_valid());
        assert!(read_superblock(&dev, 0).is_err());

        // Zeroes where mirror 0 should be: bad magic, and the all-zero
        // csum_type is crc32c, whose checksum of zeroes is not zero.
        let dev = MemDevice::zeroed(1 << 20);
        let (_, st) = read_superblock_raw(&dev, 0).unwrap();
        assert!(!st.magic_ok && !st.bytenr_ok && st.csum_ok == Some(false) && st.all_zero);
        assert_eq!(st.defects().len(), 3);

        // Mirrors beyond the image end do not exist.
        assert!(read_superblock_raw(&dev, 1).is_err());
        assert!(read_superblock_raw(&dev, 3).is_err());
        assert!(read_superblock_raw(&MemDevice::zeroed(4096), 0).is_err());
    }

    #[test]
    fn raw_superblock_unknown_csum_type() {
        let mut bytes = dev_with_super(1 << 20).snapshot();
        let off = btrfs_sb_offset(0) as usize;
        bytes[off + 0xc4] = 77;
        let (_, st) = read_superblock_raw(&MemDevice::new(bytes), 0).unwrap();
        assert_eq!(st.csum_ok, None);
        assert_eq!(st.stored_csum.len(), BTRFS_CSUM_SIZE);
        assert!(st.computed_csum.is_none());
    }
}
