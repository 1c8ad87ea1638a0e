//! What the checker reports: findings tagged by phase, and a per-phase
//! summary. Storage is capped so a badly damaged image cannot make the
//! report itself grow without bound; counts stay exact.

use crate::format::key::Key;
use serde::Serialize;

/// How bad a [`Finding`] is. Any error makes the report unclean (fsck exits
/// 4); a warning is reported but leaves the image clean. Ordered so that
/// `Error > Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something the kernel tolerates or reads around (a bad DUP mirror copy,
    /// a stale v1 space cache, out-of-date qgroup counts): reported, but the
    /// image stays clean.
    Warning,
    /// A real inconsistency of the image (what `btrfs check` counts as an
    /// error): the report is not clean.
    Error,
}

/// What kind of problem a [`Finding`] is: a short, stable kebab-case tag
/// (`"superblock"`, `"extent-ref"`, `"mirror-copy"`...) in the reports, for
/// grouping and for scripts. Reports write it as [`Category::as_str`] gives
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// `backup-root`: A backup root slot of the superblock.
    BackupRoot,
    /// `block-group`: A block group item or its used bytes.
    BlockGroup,
    /// `checksum`: A tree block whose checksum does not match.
    Checksum,
    /// `chunk`: A chunk item, or the chunk tree.
    Chunk,
    /// `csum-item`: A checksum item's shape (size, alignment).
    CsumItem,
    /// `csum-missing`: Data that should have checksums and has none.
    CsumMissing,
    /// `csum-odd`: Checksums for data that must have none.
    CsumOdd,
    /// `csum-orphan`: Checksums of bytes no extent holds.
    CsumOrphan,
    /// `csum-overlap`: Checksum items covering the same bytes twice.
    CsumOverlap,
    /// `data-csum`: Data that does not match its checksum.
    DataCsum,
    /// `dev-extent`: A dev extent item.
    DevExtent,
    /// `dev-item`: A device item or a device's size.
    DevItem,
    /// `dir-link`: A directory linked more than once.
    DirLink,
    /// `extent-generation`: An extent item's generation from the future.
    ExtentGeneration,
    /// `extent-item`: An extent item's body.
    ExtentItem,
    /// `extent-missing`: An extent the trees use with no extent item.
    ExtentMissing,
    /// `extent-overlap`: Extent items over the same bytes.
    ExtentOverlap,
    /// `extent-placement`: An extent outside the block groups, or of the wrong type for its block group.
    ExtentPlacement,
    /// `extent-ref`: One back reference of an extent.
    ExtentRef,
    /// `extent-refs`: An extent's reference counts.
    ExtentRefs,
    /// `features`: The superblock's feature flags.
    Features,
    /// `file-extent`: A file extent item.
    FileExtent,
    /// `free-space`: The free space tree.
    FreeSpace,
    /// `free-space-stale`: A free space tree or cache that is out of date.
    FreeSpaceStale,
    /// `header`: A tree block's header (generation, owner, level).
    Header,
    /// `inode`: An inode item or its counts.
    Inode,
    /// `inode-cache`: Items of the removed inode cache.
    InodeCache,
    /// `inode-flags`: Inode flags its type cannot carry.
    InodeFlags,
    /// `inode-generation`: An inode's generation or transid from the future.
    InodeGeneration,
    /// `inode-mode`: An inode's mode (its type bits).
    InodeMode,
    /// `inode-nlink`: An inode's link count.
    InodeNlink,
    /// `item`: A tree item whose body is malformed.
    Item,
    /// `item-bounds`: Item offsets or sizes outside their block.
    ItemBounds,
    /// `key-order`: Keys out of order, or a block's first key not its parent's.
    KeyOrder,
    /// `log-block`: A block of a log tree.
    LogBlock,
    /// `log-csum`: Checksums in a log tree.
    LogCsum,
    /// `log-dir-range`: Directory ranges logged.
    LogDirRange,
    /// `log-extent`: A file extent a log tree holds.
    LogExtent,
    /// `log-generation`: A log tree's generation.
    LogGeneration,
    /// `log-root`: The log root tree.
    LogRoot,
    /// `log-shape`: A log tree's items.
    LogShape,
    /// `mirror-copy`: A damaged copy of a tree block (reads use another).
    MirrorCopy,
    /// `name`: Directory entries and inode back references.
    Name,
    /// `open`: What opening the filesystem warned about.
    Open,
    /// `orphan`: An orphan item.
    Orphan,
    /// `parent-transid`: A tree block's generation not the one its parent expects.
    ParentTransid,
    /// `parity`: RAID5/6 parity that does not match the data.
    Parity,
    /// `parity-rebuild`: Blocks read only by rebuilding them from parity.
    ParityRebuild,
    /// `qgroup-count`: A quota group's counts.
    QgroupCount,
    /// `qgroup-info`: A quota group's info item.
    QgroupInfo,
    /// `qgroup-item`: An item of the quota tree.
    QgroupItem,
    /// `qgroup-limit`: A quota group's limit item.
    QgroupLimit,
    /// `qgroup-relation`: A quota group relation.
    QgroupRelation,
    /// `qgroup-status`: The quota status item.
    QgroupStatus,
    /// `root-item`: A root item.
    RootItem,
    /// `root-orphan`: The orphan item of a deleted subvolume.
    RootOrphan,
    /// `root-ref`: A subvolume's root references.
    RootRef,
    /// `space-cache`: The v1 free space cache.
    SpaceCache,
    /// `superblock`: A superblock copy.
    Superblock,
    /// `suppressed`: Findings counted but not stored (the repair plan's note of them).
    Suppressed,
    /// `sys-chunk-array`: The superblock's system chunk array.
    SysChunkArray,
    /// `tree-shape`: A block referenced twice in one tree.
    TreeShape,
    /// `unknown-key`: An item of a key type the checker does not know.
    UnknownKey,
    /// `unreadable`: A tree block that cannot be read.
    Unreadable,
    /// `uuid-tree`: The UUID tree.
    UuidTree,
}

impl Category {
    /// A copy of a block lost (a damaged mirror copy, a block read only by
    /// rebuilding it from parity): the image is clean, but not pristine.
    pub fn is_lost_copy(self) -> bool {
        match self {
            Category::MirrorCopy | Category::ParityRebuild => true,
            Category::BackupRoot
            | Category::BlockGroup
            | Category::Checksum
            | Category::Chunk
            | Category::CsumItem
            | Category::CsumMissing
            | Category::CsumOdd
            | Category::CsumOrphan
            | Category::CsumOverlap
            | Category::DataCsum
            | Category::DevExtent
            | Category::DevItem
            | Category::DirLink
            | Category::ExtentGeneration
            | Category::ExtentItem
            | Category::ExtentMissing
            | Category::ExtentOverlap
            | Category::ExtentPlacement
            | Category::ExtentRef
            | Category::ExtentRefs
            | Category::Features
            | Category::FileExtent
            | Category::FreeSpace
            | Category::FreeSpaceStale
            | Category::Header
            | Category::Inode
            | Category::InodeCache
            | Category::InodeFlags
            | Category::InodeGeneration
            | Category::InodeMode
            | Category::InodeNlink
            | Category::Item
            | Category::ItemBounds
            | Category::KeyOrder
            | Category::LogBlock
            | Category::LogCsum
            | Category::LogDirRange
            | Category::LogExtent
            | Category::LogGeneration
            | Category::LogRoot
            | Category::LogShape
            | Category::Name
            | Category::Open
            | Category::Orphan
            | Category::ParentTransid
            | Category::Parity
            | Category::QgroupCount
            | Category::QgroupInfo
            | Category::QgroupItem
            | Category::QgroupLimit
            | Category::QgroupRelation
            | Category::QgroupStatus
            | Category::RootItem
            | Category::RootOrphan
            | Category::RootRef
            | Category::SpaceCache
            | Category::Superblock
            | Category::Suppressed
            | Category::SysChunkArray
            | Category::TreeShape
            | Category::UnknownKey
            | Category::Unreadable
            | Category::UuidTree => false,
        }
    }

    /// A damaged copy of a tree block, which reads go around (only a
    /// warning; an image this engine wrote must have none).
    pub fn is_damaged_copy(self) -> bool {
        match self {
            Category::MirrorCopy => true,
            Category::BackupRoot
            | Category::BlockGroup
            | Category::Checksum
            | Category::Chunk
            | Category::CsumItem
            | Category::CsumMissing
            | Category::CsumOdd
            | Category::CsumOrphan
            | Category::CsumOverlap
            | Category::DataCsum
            | Category::DevExtent
            | Category::DevItem
            | Category::DirLink
            | Category::ExtentGeneration
            | Category::ExtentItem
            | Category::ExtentMissing
            | Category::ExtentOverlap
            | Category::ExtentPlacement
            | Category::ExtentRef
            | Category::ExtentRefs
            | Category::Features
            | Category::FileExtent
            | Category::FreeSpace
            | Category::FreeSpaceStale
            | Category::Header
            | Category::Inode
            | Category::InodeCache
            | Category::InodeFlags
            | Category::InodeGeneration
            | Category::InodeMode
            | Category::InodeNlink
            | Category::Item
            | Category::ItemBounds
            | Category::KeyOrder
            | Category::LogBlock
            | Category::LogCsum
            | Category::LogDirRange
            | Category::LogExtent
            | Category::LogGeneration
            | Category::LogRoot
            | Category::LogShape
            | Category::Name
            | Category::Open
            | Category::Orphan
            | Category::ParentTransid
            | Category::Parity
            | Category::ParityRebuild
            | Category::QgroupCount
            | Category::QgroupInfo
            | Category::QgroupItem
            | Category::QgroupLimit
            | Category::QgroupRelation
            | Category::QgroupStatus
            | Category::RootItem
            | Category::RootOrphan
            | Category::RootRef
            | Category::SpaceCache
            | Category::Superblock
            | Category::Suppressed
            | Category::SysChunkArray
            | Category::TreeShape
            | Category::UnknownKey
            | Category::Unreadable
            | Category::UuidTree => false,
        }
    }

    /// The tag the reports write (JSON and text).
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::BackupRoot => "backup-root",
            Category::BlockGroup => "block-group",
            Category::Checksum => "checksum",
            Category::Chunk => "chunk",
            Category::CsumItem => "csum-item",
            Category::CsumMissing => "csum-missing",
            Category::CsumOdd => "csum-odd",
            Category::CsumOrphan => "csum-orphan",
            Category::CsumOverlap => "csum-overlap",
            Category::DataCsum => "data-csum",
            Category::DevExtent => "dev-extent",
            Category::DevItem => "dev-item",
            Category::DirLink => "dir-link",
            Category::ExtentGeneration => "extent-generation",
            Category::ExtentItem => "extent-item",
            Category::ExtentMissing => "extent-missing",
            Category::ExtentOverlap => "extent-overlap",
            Category::ExtentPlacement => "extent-placement",
            Category::ExtentRef => "extent-ref",
            Category::ExtentRefs => "extent-refs",
            Category::Features => "features",
            Category::FileExtent => "file-extent",
            Category::FreeSpace => "free-space",
            Category::FreeSpaceStale => "free-space-stale",
            Category::Header => "header",
            Category::Inode => "inode",
            Category::InodeCache => "inode-cache",
            Category::InodeFlags => "inode-flags",
            Category::InodeGeneration => "inode-generation",
            Category::InodeMode => "inode-mode",
            Category::InodeNlink => "inode-nlink",
            Category::Item => "item",
            Category::ItemBounds => "item-bounds",
            Category::KeyOrder => "key-order",
            Category::LogBlock => "log-block",
            Category::LogCsum => "log-csum",
            Category::LogDirRange => "log-dir-range",
            Category::LogExtent => "log-extent",
            Category::LogGeneration => "log-generation",
            Category::LogRoot => "log-root",
            Category::LogShape => "log-shape",
            Category::MirrorCopy => "mirror-copy",
            Category::Name => "name",
            Category::Open => "open",
            Category::Orphan => "orphan",
            Category::ParentTransid => "parent-transid",
            Category::Parity => "parity",
            Category::ParityRebuild => "parity-rebuild",
            Category::QgroupCount => "qgroup-count",
            Category::QgroupInfo => "qgroup-info",
            Category::QgroupItem => "qgroup-item",
            Category::QgroupLimit => "qgroup-limit",
            Category::QgroupRelation => "qgroup-relation",
            Category::QgroupStatus => "qgroup-status",
            Category::RootItem => "root-item",
            Category::RootOrphan => "root-orphan",
            Category::RootRef => "root-ref",
            Category::SpaceCache => "space-cache",
            Category::Superblock => "superblock",
            Category::Suppressed => "suppressed",
            Category::SysChunkArray => "sys-chunk-array",
            Category::TreeShape => "tree-shape",
            Category::UnknownKey => "unknown-key",
            Category::Unreadable => "unreadable",
            Category::UuidTree => "uuid-tree",
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Category {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A category against its tag, for scripts and tests that hold the tag.
impl PartialEq<str> for Category {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// A category against its tag, for scripts and tests that hold the tag.
impl PartialEq<&str> for Category {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A phase of the check, numbered 1 to 9 in the order a report lists them
/// ([`PHASES`]); reports write the number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Phase {
    /// Of no phase: the repair plan's note of findings not stored.
    #[default]
    None = 0,
    /// 1: superblocks.
    Superblocks = 1,
    /// 2: chunks, devices, block groups.
    Chunks = 2,
    /// 3: tree blocks.
    TreeBlocks = 3,
    /// 4: extent tree.
    Extents = 4,
    /// 5: free space tree and cache.
    FreeSpace = 5,
    /// 6: subvolumes.
    Subvolumes = 6,
    /// 7: checksums.
    Checksums = 7,
    /// 8: log trees.
    Logs = 8,
    /// 9: quota groups.
    Qgroups = 9,
}

impl Phase {
    /// Every phase 1 to 9, in order.
    pub const ALL: [Phase; 9] = [
        Phase::Superblocks,
        Phase::Chunks,
        Phase::TreeBlocks,
        Phase::Extents,
        Phase::FreeSpace,
        Phase::Subvolumes,
        Phase::Checksums,
        Phase::Logs,
        Phase::Qgroups,
    ];

    /// Its number, 1 to 9 (0 for [`Phase::None`]).
    pub const fn number(self) -> u8 {
        self as u8
    }

    /// Its name, as [`PHASES`] lists it (`"?"` for [`Phase::None`]).
    pub fn name(self) -> &'static str {
        phase_name(self.number())
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl Serialize for Phase {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u8(self.number())
    }
}

/// A phase against its number.
impl PartialEq<u8> for Phase {
    fn eq(&self, other: &u8) -> bool {
        self.number() == *other
    }
}

/// The phases, in the order a report lists them.
pub const PHASES: [(u8, &str); 9] = [
    (1, "superblocks"),
    (2, "chunks, devices, block groups"),
    (3, "tree blocks"),
    (4, "extent tree"),
    (5, "free space tree and cache"),
    (6, "subvolumes"),
    (7, "checksums"),
    (8, "log trees"),
    (9, "quota groups"),
];

/// The name of phase `p` as [`PHASES`] lists it, or `"?"` for a number not
/// in the list.
pub fn phase_name(p: u8) -> &'static str {
    PHASES
        .iter()
        .find(|(n, _)| *n == p)
        .map(|(_, s)| *s)
        .unwrap_or("?")
}

/// One inconsistency found by the checker, with where it is and what is
/// wrong. The fields other than `phase`, `category`, `severity` and
/// `message` are filled only when they apply.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// Phase that found it, 1 to 9 (see [`PHASES`]).
    pub phase: Phase,
    /// The kind of problem.
    pub category: Category,
    /// Whether this makes the image unclean.
    pub severity: Severity,
    /// Tree id the finding is about, when it is about one tree.
    pub tree: Option<u64>,
    /// Address the finding is about: a logical byte address (tree block,
    /// extent, chunk, block group), a physical byte offset on the device for
    /// device extents and superblocks.
    pub bytenr: Option<u64>,
    /// Item key the finding is about, when it is about one item.
    pub key: Option<Key>,
    /// Human-readable description of the problem.
    pub message: String,
    /// What `btrkit-fsck --repair` does about it, when what is on disk
    /// determines the right answer; None: not repairable (see
    /// [`crate::check::repair`] for the reason given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<Repair>,
}

/// A repair the checker proposes for a finding. Each is determined by what
/// is on disk (the value it writes is the one the checker derived from the
/// items that record it); applying them is [`crate::check::repair`]'s job,
/// in one transaction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Repair {
    /// Rewrite every block group item's used bytes, and the superblock's
    /// bytes_used, from the extent tree.
    BlockGroupUsage,
    /// Rebuild the free space tree from the block groups and the extent
    /// tree (`btrfs check --clear-space-cache v2`, without turning it off).
    RebuildFreeSpaceTree,
    /// Remove the v1 free space cache: its headers, inodes and data
    /// (`btrfs check --clear-space-cache v1`); the kernel builds a new one.
    ClearSpaceCache,
    /// Write every superblock copy from the good one the filesystem was
    /// opened with (the commit of the repair does).
    RewriteSuperblocks,
    /// Bring the superblock's total_bytes and num_devices, and each device
    /// item's total_bytes, in line with the devices (sector aligned, within
    /// the device, covering its dev extents).
    DeviceSizes,
    /// Set an inode's link count to the names that refer to it.
    SetNlink {
        /// The subvolume tree.
        tree: u64,
        /// The inode number.
        ino: u64,
        /// The link count written.
        nlink: u32,
    },
    /// Set an inode's i_size (a directory's: what its entries add up to).
    SetSize {
        /// The subvolume tree.
        tree: u64,
        /// The inode number.
        ino: u64,
        /// The size written.
        size: u64,
    },
    /// Set an inode's nbytes to what its file extents add up to.
    SetNbytes {
        /// The subvolume tree.
        tree: u64,
        /// The inode number.
        ino: u64,
        /// The nbytes written.
        nbytes: u64,
    },
    /// Delete an inode with no links and its data (the kernel's orphan
    /// cleanup does it for one with an orphan item).
    DeleteUnlinkedInode {
        /// The subvolume tree.
        tree: u64,
        /// The inode number.
        ino: u64,
    },
    /// Re-add a directory's DIR_ITEM for a name its DIR_INDEX (or none)
    /// and the inode's back reference record: name, type and location from
    /// the back reference with index `index`.
    AddDirItem {
        /// The subvolume tree.
        tree: u64,
        /// The directory.
        dir: u64,
        /// The inode named.
        ino: u64,
        /// The back reference's index.
        index: u64,
    },
    /// Re-add a directory's DIR_INDEX at `index` for a name its DIR_ITEM
    /// and the inode's back reference (with that index) record.
    AddDirIndex {
        /// The subvolume tree.
        tree: u64,
        /// The directory.
        dir: u64,
        /// The inode named.
        ino: u64,
        /// The back reference's index.
        index: u64,
    },
    /// Re-add an inode's back reference for a name its directory's
    /// DIR_ITEM and DIR_INDEX `index` both record.
    AddInodeRef {
        /// The subvolume tree.
        tree: u64,
        /// The directory.
        dir: u64,
        /// The inode named.
        ino: u64,
        /// The DIR_INDEX's index.
        index: u64,
    },
    /// Remove the entries naming `ino` from a directory's DIR_ITEM or
    /// DIR_INDEX item (keyed `dir`, `key_type`, `offset`): a name of an
    /// inode that does not exist, or one no back reference confirms while
    /// the inode's confirmed names are elsewhere.
    RemoveDirEntry {
        /// The subvolume tree.
        tree: u64,
        /// The directory.
        dir: u64,
        /// The inode the entry names.
        ino: u64,
        /// DIR_ITEM or DIR_INDEX.
        key_type: u8,
        /// The item's key offset (name hash or index).
        offset: u64,
    },
    /// Remove an inode's back reference (index `index` in `dir`) that no
    /// directory entry confirms, when the inode has a confirmed name.
    RemoveInodeRef {
        /// The subvolume tree.
        tree: u64,
        /// The directory.
        dir: u64,
        /// The inode.
        ino: u64,
        /// The back reference's index.
        index: u64,
    },
    /// Give an inode no name refers to a name in `/lost+found` of its
    /// subvolume (made when missing), called by its inode number, as
    /// btrfs check does.
    LinkToLostFound {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
    },
    /// Remove the items of the removed inode cache (objectids FREE_INO and
    /// FREE_SPACE of a subvolume tree) and their data
    /// (`btrfs check --clear-ino-cache`).
    ClearInodeCache {
        /// The subvolume tree.
        tree: u64,
    },
    /// What the kernel's orphan cleanup does for an orphan item
    /// (`fs::inode::clean_orphan`): an unlinked inode deleted with its
    /// data, a linked one's fs-verity items dropped, and the item removed.
    OrphanCleanup {
        /// The subvolume tree.
        tree: u64,
        /// The inode the orphan item names.
        ino: u64,
    },
    /// Set an uncompressed inline extent's ram_bytes to the bytes it holds.
    InlineRamBytes {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
    },
    /// Make the inode item of an inode whose other items exist: its type
    /// from a directory entry naming it (or its items), its size, nbytes
    /// and link count from its extents, entries and names; mode 0755 for
    /// a directory, 0644 otherwise, owner root (as btrfs check does).
    RecreateInodeItem {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
    },
    /// Cover the gaps between a file's extents (up to its size) with hole
    /// items, as a filesystem without no-holes must.
    FileHoles {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
    },
    /// Bring an inode's generation and transid from the future back to
    /// the repair's transaction.
    InodeGeneration {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
    },
    /// Bring an extent item's generation from the future back to the
    /// repair's transaction.
    ExtentGeneration {
        /// The extent's start.
        bytenr: u64,
    },
    /// Replace an extent item's back references with those the trees
    /// that use it hold (none: the extent is unused and freed).
    ExtentRefs {
        /// The extent's start.
        bytenr: u64,
        /// The references found.
        refs: Vec<ExtentRef>,
        /// They name other trees, inodes or parents than the item did (not
        /// only other counts): trusted only while the subvolume links are
        /// sound.
        other_owners: bool,
    },
    /// Insert the missing extent item of an extent the trees use, with
    /// their references; its range is taken from the allocator before the
    /// repair allocates anything.
    AddExtentItem {
        /// The extent's start.
        bytenr: u64,
        /// Its length.
        len: u64,
        /// A tree block's level; None for data.
        level: Option<u8>,
        /// The references found.
        refs: Vec<ExtentRef>,
    },
    /// Delete every item of an extent (its extent item, whatever it holds,
    /// and its keyed back references) and write it again from the
    /// references the trees hold: for an item that cannot be read (an
    /// unknown inline reference type), says the wrong level, or holds its
    /// references out of order.
    RebuildExtentItem {
        /// The extent's start.
        bytenr: u64,
        /// Its length.
        len: u64,
        /// A tree block's level (as the block says); None for data.
        level: Option<u8>,
        /// The references found.
        refs: Vec<ExtentRef>,
    },
    /// A file extent whose disk range is garbage (off the sector size,
    /// inside no block group, or over other extents): pointed at the
    /// extent item whose back reference names it and that nothing else
    /// uses (`to`), or made a hole when there is none (`to` None: the
    /// data is lost, and reported).
    FileExtentDisk {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
        /// The file extent item's key offset.
        offset: u64,
        /// The disk_bytenr it holds now.
        from: u64,
        /// The extent (start, length) it is pointed at, or None for a hole.
        to: Option<(u64, u64)>,
    },
    /// Set the file type bits of an inode's mode whose type is invalid or
    /// has unknown bits to the type the entries naming it record (or, with
    /// none, what it holds: entries make a directory, anything else a
    /// regular file, as btrfs check deduces it); the permission bits stay.
    InodeMode {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
    },
    /// Clear inode flags the inode's type cannot carry (as btrfs check
    /// repairs "odd inode flags").
    InodeFlags {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
        /// The flags removed.
        clear: u64,
    },
    /// Bring a file extent item's generation from the future back to the
    /// repair's transaction.
    FileExtentGeneration {
        /// The subvolume tree.
        tree: u64,
        /// The inode.
        ino: u64,
        /// The item's key offset.
        offset: u64,
    },
    /// Write the dev extent at a chunk's stripe again from the chunk: the
    /// chunk it belongs to and the stripe's length (the chunk maps the
    /// data; a dev extent only records the space taken).
    DevExtentFromChunk {
        /// The device.
        devid: u64,
        /// The stripe's physical start.
        physical: u64,
        /// The chunk's logical start.
        chunk: u64,
        /// The stripe's length.
        length: u64,
    },
    /// Delete a dev extent no chunk stripe owns (its space on the device
    /// is free again).
    DeleteDevExtent {
        /// The device.
        devid: u64,
        /// Its physical start.
        physical: u64,
    },
    /// Add the orphan item in the root tree of a deleted subvolume (root
    /// item refs 0), so the kernel's cleaner drops its tree.
    AddRootOrphan {
        /// The subvolume.
        tree: u64,
    },
    /// Delete checksum items covering bytes an earlier item already
    /// covers (the later item cut at the earlier one's end).
    CsumOverlap {
        /// The later item's key offset (its first byte).
        bytenr: u64,
    },
    /// Rewrite a leaf whose item offsets or sizes disagree with where
    /// its data lies, mended from its neighbours (an item no reading
    /// places is dropped), in every tree that holds it.
    LeafItems {
        /// The tree it was found in.
        tree: u64,
        /// The leaf.
        bytenr: u64,
    },
    /// Copy the blocks on the search path of `key` in `tree` (its root
    /// down to a leaf), so that a block from the future gets the repair's
    /// generation, as do the pointers to it and the root item.
    RecowPath {
        /// The tree.
        tree: u64,
        /// A key in the block (its first).
        key: crate::format::key::Key,
    },
    /// Point a subvolume's root item at the root block the extent tree
    /// knows for it (bytenr, level and generation of that block).
    RootItemLocation {
        /// The subvolume tree.
        tree: u64,
        /// The root block.
        bytenr: u64,
        /// Its level.
        level: u8,
        /// Its generation.
        generation: u64,
    },
    /// Recount every quota group from the extent tree (a rescan).
    RecountQgroups,
    /// Rebuild the checksum tree from the data (`--init-csum-tree`: only on
    /// the user's request, as it trusts whatever the data now holds).
    RebuildCsumTree,
    /// Rebuild the UUID tree from the subvolumes' root items (what the
    /// kernel's UUID scan at mount does).
    RebuildUuidTree,
}

/// One back reference of an extent, as the trees that use it show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ExtentRef {
    /// A tree block used by tree `root`.
    Tree {
        /// The tree.
        root: u64,
    },
    /// A tree block used by the full-backref block `parent`.
    SharedBlock {
        /// The parent block.
        parent: u64,
    },
    /// A data extent used `count` times by file offset `offset` of inode
    /// `ino` in tree `root`.
    Data {
        /// The tree.
        root: u64,
        /// The inode.
        ino: u64,
        /// The file offset minus the extent offset (the kernel's key).
        offset: u64,
        /// How many file extent items.
        count: u64,
    },
    /// A data extent used `count` times by the full-backref leaf `parent`.
    SharedData {
        /// The leaf.
        parent: u64,
        /// How many file extent items.
        count: u64,
    },
}

impl Repair {
    /// Short stable name of the repair class, as `--json` reports it.
    pub fn class(&self) -> &'static str {
        match self {
            Repair::BlockGroupUsage | Repair::RebuildFreeSpaceTree | Repair::ClearSpaceCache => {
                "free-space"
            }
            Repair::RewriteSuperblocks
            | Repair::DeviceSizes
            | Repair::DeleteDevExtent { .. }
            | Repair::DevExtentFromChunk { .. } => "superblock",
            Repair::AddRootOrphan { .. } => "root-item",
            Repair::CsumOverlap { .. } => "checksums",
            Repair::SetNlink { .. }
            | Repair::SetSize { .. }
            | Repair::SetNbytes { .. }
            | Repair::DeleteUnlinkedInode { .. }
            | Repair::OrphanCleanup { .. }
            | Repair::InlineRamBytes { .. }
            | Repair::RecreateInodeItem { .. }
            | Repair::FileHoles { .. }
            | Repair::InodeGeneration { .. }
            | Repair::InodeMode { .. }
            | Repair::InodeFlags { .. }
            | Repair::FileExtentDisk { .. }
            | Repair::FileExtentGeneration { .. }
            | Repair::ClearInodeCache { .. } => "inode",
            Repair::ExtentGeneration { .. }
            | Repair::ExtentRefs { .. }
            | Repair::AddExtentItem { .. }
            | Repair::RebuildExtentItem { .. } => "extents",
            Repair::AddDirItem { .. }
            | Repair::AddDirIndex { .. }
            | Repair::AddInodeRef { .. }
            | Repair::RemoveDirEntry { .. }
            | Repair::RemoveInodeRef { .. }
            | Repair::LinkToLostFound { .. } => "names",
            Repair::RootItemLocation { .. } => "root-item",
            Repair::LeafItems { .. } | Repair::RecowPath { .. } => "tree-block",
            Repair::RecountQgroups => "qgroups",
            Repair::RebuildCsumTree => "checksums",
            Repair::RebuildUuidTree => "uuid",
        }
    }

    /// What the repair does, in a sentence.
    pub fn describe(&self) -> String {
        match self {
            Repair::BlockGroupUsage => {
                "recount the used bytes of every block group from the extent tree".into()
            }
            Repair::RebuildFreeSpaceTree => {
                "rebuild the free space tree from the extent tree".into()
            }
            Repair::ClearSpaceCache => "clear the v1 free space cache".into(),
            Repair::RewriteSuperblocks => "rewrite every superblock copy from the good one".into(),
            Repair::DeviceSizes => {
                "make the superblock's and device items' sizes match the devices".into()
            }
            Repair::SetNlink { tree, ino, nlink } => {
                format!("set the link count of inode {ino} (tree {tree}) to {nlink}")
            }
            Repair::SetSize { tree, ino, size } => {
                format!("set the size of inode {ino} (tree {tree}) to {size}")
            }
            Repair::SetNbytes { tree, ino, nbytes } => {
                format!("set nbytes of inode {ino} (tree {tree}) to {nbytes}")
            }
            Repair::DeleteUnlinkedInode { tree, ino } => {
                format!("delete inode {ino} (tree {tree}), which has no links, with its data")
            }
            Repair::AddDirItem { tree, dir, ino, index } => format!(
                "re-add the DIR_ITEM in directory {dir} (tree {tree}) for inode {ino}, from its back reference {index}"
            ),
            Repair::AddDirIndex { tree, dir, ino, index } => format!(
                "re-add DIR_INDEX {index} in directory {dir} (tree {tree}) for inode {ino}, from its back reference"
            ),
            Repair::AddInodeRef { tree, dir, ino, index } => format!(
                "re-add the back reference of inode {ino} (tree {tree}) for its name at index {index} in directory {dir}"
            ),
            Repair::RemoveDirEntry { tree, dir, ino, key_type, offset } => format!(
                "remove the {} {offset} entry for inode {ino} from directory {dir} (tree {tree})",
                if *key_type == crate::format::consts::BTRFS_DIR_INDEX_KEY { "DIR_INDEX" } else { "DIR_ITEM" }
            ),
            Repair::RemoveInodeRef { tree, dir, ino, index } => format!(
                "remove the back reference {index} in directory {dir} of inode {ino} (tree {tree}), which no entry confirms"
            ),
            Repair::LinkToLostFound { tree, ino } => {
                format!("link inode {ino} (tree {tree}), which no name reaches, into lost+found")
            }
            Repair::OrphanCleanup { tree, ino } => format!(
                "carry out orphan item {ino} (tree {tree}) as the kernel's orphan cleanup does, and remove it"
            ),
            Repair::ClearInodeCache { tree } => {
                format!("remove the inode cache of tree {tree}")
            }
            Repair::InlineRamBytes { tree, ino } => {
                format!("set the inline extent ram_bytes of inode {ino} (tree {tree}) to its length")
            }
            Repair::RecreateInodeItem { tree, ino } => {
                format!("make the missing inode item of inode {ino} (tree {tree}) from its other items")
            }
            Repair::FileHoles { tree, ino } => {
                format!("add hole items for the gaps in the extents of inode {ino} (tree {tree})")
            }
            Repair::InodeGeneration { tree, ino } => format!(
                "set the future generation/transid of inode {ino} (tree {tree}) to the repair's"
            ),
            Repair::ExtentGeneration { bytenr } => {
                format!("set the future generation of extent {bytenr} to the repair's")
            }
            Repair::ExtentRefs { bytenr, refs, .. } if refs.is_empty() => {
                format!("free extent {bytenr}, which no tree uses")
            }
            Repair::ExtentRefs { bytenr, refs, .. } => format!(
                "rewrite the back references of extent {bytenr} from the {} the trees hold",
                refs.len()
            ),
            Repair::AddExtentItem { bytenr, len, refs, .. } => format!(
                "add the missing extent item of {bytenr}+{len} with the {} references the trees hold",
                refs.len()
            ),
            Repair::RebuildExtentItem { bytenr, len, refs, .. } => format!(
                "write the extent item of {bytenr}+{len} again from the {} references the trees hold",
                refs.len()
            ),
            Repair::FileExtentDisk { tree, ino, offset, from, to: Some((b, l)) } => format!(
                "point the file extent at offset {offset} of inode {ino} (tree {tree}) from disk address {from} to the extent {b}+{l} whose back reference names it"
            ),
            Repair::FileExtentDisk { tree, ino, offset, from, to: None } => format!(
                "make the file extent at offset {offset} of inode {ino} (tree {tree}), whose disk address {from} holds no extent, a hole (its data is lost)"
            ),
            Repair::InodeMode { tree, ino } => {
                format!("set the type in the mode of inode {ino} (tree {tree}) to the one its names and items show")
            }
            Repair::InodeFlags { tree, ino, clear } => {
                format!("clear flags 0x{clear:x} of inode {ino} (tree {tree}), which its type cannot carry")
            }
            Repair::FileExtentGeneration { tree, ino, offset } => format!(
                "set the future generation of the file extent at {offset} of inode {ino} (tree {tree}) to the repair's"
            ),
            Repair::DevExtentFromChunk {
                devid,
                physical,
                chunk,
                length,
            } => format!(
                "write dev extent {devid}:{physical} again from chunk {chunk}'s stripe (length {length})"
            ),
            Repair::DeleteDevExtent { devid, physical } => {
                format!("delete dev extent {devid}:{physical}, which no chunk owns")
            }
            Repair::AddRootOrphan { tree } => {
                format!("add the orphan item of deleted subvolume {tree}, so the kernel drops it")
            }
            Repair::CsumOverlap { bytenr } => {
                format!("cut the checksum item at {bytenr} where an earlier one already covers it")
            }
            Repair::RecowPath { tree, key } => format!(
                "copy the blocks on the path to {} in tree {tree}, giving them the repair's generation",
                crate::format::names::key_string(key)
            ),
            Repair::LeafItems { tree, bytenr } => format!(
                "rewrite leaf {bytenr} (tree {tree}) with its item offsets mended from where the data lies"
            ),
            Repair::RootItemLocation {
                tree,
                bytenr,
                level,
                generation,
            } => format!(
                "point the root item of tree {tree} at block {bytenr} (level {level}, generation {generation})"
            ),
            Repair::RecountQgroups => "recount every quota group".into(),
            Repair::RebuildCsumTree => "rebuild the checksum tree from the data".into(),
            Repair::RebuildUuidTree => {
                "rebuild the UUID tree from the subvolumes' root items".into()
            }
        }
    }
}

/// Counts and timing of one phase of a check run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseSummary {
    /// Phase number, 1 to 9.
    pub phase: Phase,
    /// Phase name, as [`phase_name`] gives it.
    pub name: &'static str,
    /// Things examined (superblocks, blocks, items, extents, inodes, bytes...).
    pub checked: u64,
    /// Error findings in this phase, including those not stored (over the cap).
    pub errors: u64,
    /// Warning findings in this phase, including those not stored (over the cap).
    pub warnings: u64,
    /// Wall-clock time spent in the phase, in milliseconds.
    pub millis: u64,
    /// False when the phase did not run (feature absent or not asked for).
    pub ran: bool,
}

/// The result of a check: per-phase summaries and the findings. Each phase
/// stores at most 2000 findings; the counts include the ones dropped.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Summary of every phase 1 to 9, in order, including those that did not run
    /// (`ran == false`).
    pub phases: Vec<PhaseSummary>,
    /// Stored findings, sorted by phase and, within a phase, errors first.
    pub findings: Vec<Finding>,
    /// Findings counted but not stored because of the cap.
    pub suppressed: u64,
    /// Total error findings over all phases, stored or suppressed.
    pub errors: u64,
    /// Total warning findings over all phases, stored or suppressed.
    pub warnings: u64,
    /// Each quota group's counts on disk beside those recomputed from the
    /// trees (`btrfs check --qgroup-report`); None when quotas are off.
    pub qgroups: Option<QgroupReport>,
    /// With [`super::CheckOptions::for_repair`]: every logical range a
    /// tree references (tree blocks and the data extents file extents
    /// point at), merged and sorted. What a repair must never allocate,
    /// whether or not the extent tree says so.
    #[serde(skip)]
    pub in_use: Vec<(u64, u64)>,
    /// With [`super::CheckOptions::for_repair`]: the facts of the clean
    /// subvolume trees, for the check after the repair
    /// ([`super::check_paths_after`]).
    #[serde(skip)]
    pub prior: Option<std::sync::Arc<super::reuse::Prior>>,
    /// Subvolume trees taken from the check before instead of walked.
    #[serde(skip)]
    pub reused_trees: u64,
}

/// Quota accounting as phase 9 recomputed it, for every quota group.
#[derive(Clone, Debug, Serialize)]
pub struct QgroupReport {
    /// Simple quotas (an extent counts for the subvolume that made it)
    /// rather than full accounting.
    pub simple: bool,
    /// A rescan in progress, at this objectid: counts are not final.
    pub rescan: Option<u64>,
    /// The status item's inconsistent flag: the kernel itself expects the
    /// counts to be off until a rescan.
    pub inconsistent: bool,
    /// Every quota group with an info item, by id.
    pub groups: Vec<QgroupCount>,
    /// Why no counts were computed although the quota tree exists (no
    /// status item, a status version the kernel does not know).
    pub not_computed: Option<String>,
}

impl QgroupReport {
    /// Groups whose counts on disk differ from the recomputed ones.
    pub fn different(&self) -> usize {
        self.groups.iter().filter(|g| g.differs()).count()
    }
}

/// One quota group: its info item's counts and the recomputed ones.
#[derive(Clone, Debug, Serialize)]
pub struct QgroupCount {
    /// The qgroup id (level << 48 | subvolume or group id).
    pub id: u64,
    /// `level/id`, as btrfs qgroup show prints it.
    pub name: String,
    /// The info item's referenced bytes.
    pub disk_referenced: u64,
    /// The info item's exclusive bytes.
    pub disk_exclusive: u64,
    /// The info item's compressed referenced bytes (kept equal to the
    /// referenced bytes by the kernel).
    pub disk_referenced_compressed: u64,
    /// The info item's compressed exclusive bytes.
    pub disk_exclusive_compressed: u64,
    /// Referenced bytes recomputed from the trees.
    pub referenced: u64,
    /// Exclusive bytes recomputed from the trees.
    pub exclusive: u64,
}

impl QgroupCount {
    /// The counts on disk are not those recomputed.
    pub fn differs(&self) -> bool {
        self.referenced != self.disk_referenced || self.exclusive != self.disk_exclusive
    }
}

impl Report {
    /// No error was found (warnings allowed): fsck's exit code 0.
    pub fn is_clean(&self) -> bool {
        self.errors == 0
    }
    /// Clean, and every copy of every tree block checked was good: what an
    /// image this engine wrote must be (a damaged DUP copy is only a
    /// warning to a user, since reads use the good one).
    pub fn is_pristine(&self) -> bool {
        self.is_clean() && !self.findings.iter().any(|f| f.category.is_lost_copy())
    }
}

/// Most findings stored per phase; the rest are only counted.
const CAP_PER_PHASE: usize = 2000;

pub(crate) struct Sink {
    pub findings: Vec<Finding>,
    pub stored: [usize; 10],
    pub phases: [PhaseSummary; 10],
    pub suppressed: u64,
    pub qgroups: Option<QgroupReport>,
    pub in_use: Vec<(u64, u64)>,
    /// The check before, handed to the run (see [`super::reuse`]).
    pub prior: Option<std::sync::Arc<super::reuse::Prior>>,
    pub reused_trees: u64,
}

impl Sink {
    pub fn new() -> Sink {
        let mut phases: [PhaseSummary; 10] = Default::default();
        for (i, p) in phases.iter_mut().enumerate().skip(1) {
            p.phase = Phase::ALL[i - 1];
            p.name = p.phase.name();
        }
        phases[0].name = Phase::None.name();
        Sink {
            findings: Vec::new(),
            stored: [0; 10],
            phases,
            suppressed: 0,
            qgroups: None,
            in_use: Vec::new(),
            prior: None,
            reused_trees: 0,
        }
    }

    pub fn push(&mut self, f: Finding) {
        let p = f.phase.number() as usize;
        match f.severity {
            Severity::Error => self.phases[p].errors += 1,
            Severity::Warning => self.phases[p].warnings += 1,
        }
        if self.stored[p] < CAP_PER_PHASE {
            self.stored[p] += 1;
            self.findings.push(f);
        } else {
            self.suppressed += 1;
        }
    }

    pub fn checked(&mut self, phase: Phase, n: u64) {
        let p = phase.number() as usize;
        self.phases[p].checked += n;
        self.phases[p].ran = true;
    }

    pub fn ran(&mut self, phase: Phase) {
        self.phases[phase.number() as usize].ran = true;
    }

    pub fn add_millis(&mut self, phase: Phase, ms: u64) {
        self.phases[phase.number() as usize].millis += ms;
    }

    pub fn into_report(mut self) -> Report {
        self.findings
            .sort_by_key(|f| (f.phase, std::cmp::Reverse(f.severity)));
        let phases: Vec<PhaseSummary> = self.phases.into_iter().skip(1).collect();
        let errors = phases.iter().map(|p| p.errors).sum();
        let warnings = phases.iter().map(|p| p.warnings).sum();
        Report {
            phases,
            findings: self.findings,
            suppressed: self.suppressed,
            errors,
            warnings,
            qgroups: self.qgroups,
            in_use: self.in_use,
            prior: None,
            reused_trees: self.reused_trees,
        }
    }
}

/// Builder sugar: `F::err(Phase::Extents, Category::ExtentRef).tree(5).at(b).key(k).msg(..)`.
pub(crate) struct F(Finding);

impl F {
    pub fn err(phase: Phase, category: Category) -> F {
        F(Finding {
            phase,
            category,
            severity: Severity::Error,
            tree: None,
            bytenr: None,
            key: None,
            message: String::new(),
            repair: None,
        })
    }
    pub fn warn(phase: Phase, category: Category) -> F {
        let mut f = F::err(phase, category);
        f.0.severity = Severity::Warning;
        f
    }
    pub fn tree(mut self, t: u64) -> F {
        self.0.tree = Some(t);
        self
    }
    pub fn at(mut self, b: u64) -> F {
        self.0.bytenr = Some(b);
        self
    }
    pub fn key(mut self, k: Key) -> F {
        self.0.key = Some(k);
        self
    }
    pub fn opt_key(mut self, k: Option<Key>) -> F {
        self.0.key = k;
        self
    }
    pub fn fix(mut self, r: Repair) -> F {
        self.0.repair = Some(r);
        self
    }
    pub fn msg(mut self, m: impl Into<String>) -> Finding {
        self.0.message = m.into();
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_numbers_are_reported_as_before() {
        // Every category's tag is the kebab-case of its name.
        let all = [
            Category::BackupRoot,
            Category::ExtentRefs,
            Category::FreeSpaceStale,
            Category::LogDirRange,
            Category::MirrorCopy,
            Category::SysChunkArray,
            Category::Suppressed,
        ];
        for c in all {
            let mut kebab = String::new();
            for (i, ch) in format!("{c:?}").chars().enumerate() {
                if ch.is_ascii_uppercase() && i > 0 {
                    kebab.push('-');
                }
                kebab.push(ch.to_ascii_lowercase());
            }
            assert_eq!(c.as_str(), kebab);
            assert_eq!(c.to_string(), kebab);
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{kebab}\""));
            assert!(c == kebab.as_str());
        }
        for (i, p) in Phase::ALL.into_iter().enumerate() {
            assert_eq!(p.number() as usize, i + 1);
            assert_eq!(p.name(), PHASES[i].1);
            assert_eq!(serde_json::to_string(&p).unwrap(), (i + 1).to_string());
        }
        let f = F::warn(Phase::TreeBlocks, Category::MirrorCopy).msg("m");
        let j = serde_json::to_string(&f).unwrap();
        assert!(
            j.starts_with(r#"{"phase":3,"category":"mirror-copy","severity":"warning""#),
            "{j}"
        );
    }
}
