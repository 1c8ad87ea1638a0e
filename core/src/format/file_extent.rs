//! `btrfs_file_extent_item`: a 21-byte head followed either by inline data
//! (type INLINE) or by the 32-byte on-disk extent description.

use super::consts::*;
use super::{Le16, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The fields of `struct btrfs_file_extent_item` every type has, up to `type`;
/// inline data starts right after.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FileExtentHead {
    /// Transaction that wrote the extent.
    pub generation: Le64,
    /// Decoded size in bytes: of the inline data, or of the whole disk extent
    /// after decompression.
    pub ram_bytes: Le64,
    /// BTRFS_COMPRESS_* of the data.
    pub compression: u8,
    /// Encryption of the data; always 0.
    pub encryption: u8,
    /// Other encoding of the data; always 0.
    pub other_encoding: Le16,
    /// BTRFS_FILE_EXTENT_INLINE, _REG or _PREALLOC; C's `type`.
    pub type_: u8,
}

/// `struct btrfs_file_extent_item` of a REG or PREALLOC extent: the head
/// fields, then the file range's place in a disk extent. Keyed (ino,
/// EXTENT_DATA, file offset).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FileExtentItem {
    /// Transaction that wrote the extent.
    pub generation: Le64,
    /// Size of the whole disk extent after decompression, in bytes (for a
    /// hole, `num_bytes`).
    pub ram_bytes: Le64,
    /// BTRFS_COMPRESS_* of the disk extent.
    pub compression: u8,
    /// Encryption of the data; always 0.
    pub encryption: u8,
    /// Other encoding of the data; always 0.
    pub other_encoding: Le16,
    /// BTRFS_FILE_EXTENT_REG or _PREALLOC; C's `type`.
    pub type_: u8,
    /// Logical start of the disk extent; 0 for a hole.
    pub disk_bytenr: Le64,
    /// Size of the disk extent on disk (compressed size), in bytes; 0 for a
    /// hole.
    pub disk_num_bytes: Le64,
    /// Where the file range starts within the decompressed extent, in bytes.
    pub offset: Le64,
    /// File bytes this item covers, from the key offset.
    pub num_bytes: Le64,
}

/// Offset of inline data in a file extent item: the size of [`FileExtentHead`]
/// (BTRFS_FILE_EXTENT_INLINE_DATA_START).
pub const FILE_EXTENT_INLINE_DATA_START: usize = 21;

/// Most inline data one item can hold in a leaf of `nodesize` bytes
/// (BTRFS_MAX_INLINE_DATA_SIZE): the leaf less its header, one item and
/// the file extent item's fixed part. The inline limit of writeback and of
/// the checker both start from this.
pub fn max_inline_data_size(nodesize: u32) -> u64 {
    (nodesize as u64)
        .saturating_sub(crate::format::header::HEADER_SIZE as u64)
        .saturating_sub(crate::format::header::ITEM_SIZE as u64)
        .saturating_sub(FILE_EXTENT_INLINE_DATA_START as u64)
}
/// Size of a REG or PREALLOC file extent item ([`FileExtentItem`]) in bytes.
pub const FILE_EXTENT_ITEM_SIZE: usize = 53;

/// Most bytes a compressed extent decompresses to (BTRFS_MAX_UNCOMPRESSED):
/// the kernel compresses at most this much into one extent, and reads at
/// most a page of a compressed inline extent.
pub const MAX_UNCOMPRESSED: u64 = 128 << 10;
/// Most bytes a compressed extent takes on disk (BTRFS_MAX_COMPRESSED): the
/// kernel keeps a compressed extent only when it is smaller than its data.
pub const MAX_COMPRESSED: u64 = 128 << 10;

/// A parsed EXTENT_DATA item, borrowing the item's bytes.
#[derive(Debug, Clone, Copy)]
pub enum FileExtent<'a> {
    /// INLINE: the data is in the item.
    Inline {
        /// The head; `ram_bytes` is the decoded length of `data`.
        head: &'a FileExtentHead,
        /// The stored bytes, compressed when `head.compression` says so.
        data: &'a [u8],
    },
    /// REG or PREALLOC; `disk_bytenr == 0` is a hole.
    Disk {
        /// The head (the same bytes as the start of `item`).
        head: &'a FileExtentHead,
        /// The whole item.
        item: &'a FileExtentItem,
    },
}

impl<'a> FileExtent<'a> {
    /// The head common to both kinds.
    pub fn head(&self) -> &'a FileExtentHead {
        match self {
            FileExtent::Inline { head, .. } | FileExtent::Disk { head, .. } => head,
        }
    }

    /// The disk bytes `[start, end)` whose data checksums this extent
    /// relies on, when its inode keeps checksums (no NODATASUM): for a
    /// regular uncompressed extent the part of the disk extent it refers to,
    /// for a compressed one the whole disk extent (checksums cover the
    /// compressed bytes, and reading any of the file range decompresses all
    /// of them). None for inline and prealloc extents and holes, which have
    /// no checksummed data.
    pub fn csum_span(&self) -> Option<(u64, u64)> {
        let FileExtent::Disk { head, item } = self else {
            return None;
        };
        let db = item.disk_bytenr.get();
        if head.type_ != BTRFS_FILE_EXTENT_REG || db == 0 {
            return None;
        }
        if head.compression != BTRFS_COMPRESS_NONE {
            Some((db, db.saturating_add(item.disk_num_bytes.get())))
        } else {
            let start = db.saturating_add(item.offset.get());
            Some((start, start.saturating_add(item.num_bytes.get())))
        }
    }
}

impl FileExtent<'_> {
    /// The bounds the format gives an extent, checked before any reader
    /// sizes a buffer or a loop by its fields; the error names `key` (the
    /// item's). For every extent: the file range it covers ends within the
    /// 64-bit offsets (the kernel's tree checker: "extent end overflow").
    /// For a compressed one: at most [`MAX_UNCOMPRESSED`] bytes of data and
    /// [`MAX_COMPRESSED`] on disk. For one with data on disk: its disk
    /// extent ends within the address space and the range it refers to lies
    /// within its data (`offset + num_bytes <= ram_bytes`, the rule btrfs
    /// check reports as a bad file extent). A hole has no data, so its
    /// `ram_bytes` is not looked at: nothing is read for it.
    ///
    /// What is left unbounded here is bounded by whoever reads: an
    /// uncompressed extent may be as large as its block group, so readers
    /// go through it in pieces.
    pub fn check_bounds(&self, key: &super::key::Key) -> Result<()> {
        let bad = |what: String| Err(Error::corrupt_item(what, 0, Some(*key)));
        match self {
            FileExtent::Inline { head, data } => {
                let ram = head.ram_bytes.get();
                if head.compression != BTRFS_COMPRESS_NONE && ram > MAX_UNCOMPRESSED {
                    return bad(format!(
                        "compressed inline extent of {} bytes claims ram_bytes {ram}, more than a compressed extent holds ({MAX_UNCOMPRESSED})",
                        data.len()
                    ));
                }
                if key.offset.checked_add(ram).is_none() {
                    return bad(format!(
                        "inline extent at file offset {} of {ram} bytes ends past the largest offset",
                        key.offset
                    ));
                }
            }
            FileExtent::Disk { head, item } => {
                let (num, off) = (item.num_bytes.get(), item.offset.get());
                let (db, dlen) = (item.disk_bytenr.get(), item.disk_num_bytes.get());
                let ram = head.ram_bytes.get();
                if key.offset.checked_add(num).is_none() {
                    return bad(format!(
                        "file extent at file offset {} with num_bytes {num}: extent end overflow",
                        key.offset
                    ));
                }
                if db == 0 {
                    return Ok(());
                }
                if db.checked_add(dlen).is_none() {
                    return bad(format!(
                        "file extent disk range {db}+{dlen} ends past the address space"
                    ));
                }
                if head.compression != BTRFS_COMPRESS_NONE {
                    if ram > MAX_UNCOMPRESSED {
                        return bad(format!(
                            "compressed extent claims ram_bytes {ram}, more than a compressed extent holds ({MAX_UNCOMPRESSED})"
                        ));
                    }
                    if dlen > MAX_COMPRESSED {
                        return bad(format!(
                            "compressed extent claims disk_num_bytes {dlen}, more than a compressed extent takes ({MAX_COMPRESSED})"
                        ));
                    }
                }
                if off.checked_add(num).is_none_or(|end| end > ram) {
                    return bad(format!(
                        "file extent offset {off} + num_bytes {num} exceeds ram_bytes {ram}"
                    ));
                }
                if head.compression == BTRFS_COMPRESS_NONE
                    && db
                        .checked_add(off)
                        .and_then(|s| s.checked_add(num))
                        .is_none()
                {
                    return bad(format!(
                        "file extent data {db}+{off}+{num} ends past the address space"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An inline extent item: head (ram_bytes is the uncompressed length)
/// followed by the (possibly compressed) bytes.
pub fn encode_inline_extent(
    generation: u64,
    ram_bytes: u64,
    compression: u8,
    data: &[u8],
) -> Vec<u8> {
    let h = FileExtentHead {
        generation: generation.into(),
        ram_bytes: ram_bytes.into(),
        compression,
        encryption: 0,
        other_encoding: 0.into(),
        type_: BTRFS_FILE_EXTENT_INLINE,
    };
    let mut v = Vec::with_capacity(FILE_EXTENT_INLINE_DATA_START + data.len());
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(data);
    v
}

impl FileExtentItem {
    /// A regular (`BTRFS_FILE_EXTENT_REG`) or preallocated item; a hole is a
    /// regular item with `disk_bytenr` 0.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        type_: u8,
        generation: u64,
        disk_bytenr: u64,
        disk_num_bytes: u64,
        offset: u64,
        num_bytes: u64,
        ram_bytes: u64,
        compression: u8,
    ) -> FileExtentItem {
        FileExtentItem {
            generation: generation.into(),
            ram_bytes: ram_bytes.into(),
            compression,
            encryption: 0,
            other_encoding: 0.into(),
            type_,
            disk_bytenr: disk_bytenr.into(),
            disk_num_bytes: disk_num_bytes.into(),
            offset: offset.into(),
            num_bytes: num_bytes.into(),
        }
    }

    /// An explicit hole of `len` bytes.
    pub fn hole(generation: u64, len: u64) -> FileExtentItem {
        FileExtentItem::new(BTRFS_FILE_EXTENT_REG, generation, 0, 0, 0, len, len, 0)
    }
}

/// A regular, hole or prealloc item cut to its first `len` bytes of file
/// range (btrfs_truncate_inode_items shortening an extent that crosses
/// the new end; an uncompressed extent keeps its disk extent). None for
/// an item that does not reach past `len`, an inline or compressed one, or
/// one that does not parse.
pub fn cut_to(data: &[u8], len: u64) -> Option<Vec<u8>> {
    let mut item = FileExtentItem::read_from_bytes(data).ok()?;
    let is_disk = matches!(
        item.type_,
        BTRFS_FILE_EXTENT_REG | BTRFS_FILE_EXTENT_PREALLOC
    );
    if !is_disk || item.compression != BTRFS_COMPRESS_NONE || item.num_bytes.get() <= len {
        return None;
    }
    item.num_bytes.set(len);
    if item.disk_bytenr.get() == 0 {
        item.ram_bytes.set(len);
    }
    Some(item.as_bytes().to_vec())
}

/// Parse an EXTENT_DATA item; a REG or PREALLOC item must be exactly
/// [`FILE_EXTENT_ITEM_SIZE`] bytes, and an unknown type is an error.
pub fn parse_file_extent(data: &[u8]) -> Result<FileExtent<'_>> {
    let head: &FileExtentHead = super::view(data, "file extent")?;
    match head.type_ {
        BTRFS_FILE_EXTENT_INLINE => Ok(FileExtent::Inline {
            head,
            data: &data[FILE_EXTENT_INLINE_DATA_START..],
        }),
        BTRFS_FILE_EXTENT_REG | BTRFS_FILE_EXTENT_PREALLOC => {
            if data.len() != FILE_EXTENT_ITEM_SIZE {
                return Err(Error::corrupt_item(format!("file extent item size {} for a non-inline extent, want {FILE_EXTENT_ITEM_SIZE}", data.len()), 0, None));
            }
            Ok(FileExtent::Disk {
                head,
                item: super::view(data, "file extent")?,
            })
        }
        t => Err(Error::corrupt_item(
            format!("file extent type {t} unknown"),
            0,
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(
            core::mem::size_of::<FileExtentHead>(),
            FILE_EXTENT_INLINE_DATA_START
        );
        assert_eq!(
            core::mem::size_of::<FileExtentItem>(),
            FILE_EXTENT_ITEM_SIZE
        );
        let mut b: Vec<u8> = (0..53u32).map(|i| (i * 11) as u8).collect();
        crate::format::roundtrip::<FileExtentItem>(&b);
        b[20] = BTRFS_FILE_EXTENT_REG;
        assert!(matches!(
            parse_file_extent(&b).unwrap(),
            FileExtent::Disk { .. }
        ));
        b[20] = BTRFS_FILE_EXTENT_INLINE;
        match parse_file_extent(&b).unwrap() {
            FileExtent::Inline { data, .. } => assert_eq!(data.len(), 32),
            _ => panic!(),
        }
        b[20] = 9;
        assert!(parse_file_extent(&b).is_err());
        let v = encode_inline_extent(5, 3, 0, b"abc");
        match parse_file_extent(&v).unwrap() {
            FileExtent::Inline { head, data } => assert_eq!(
                (head.generation.get(), head.ram_bytes.get(), data),
                (5, 3, &b"abc"[..])
            ),
            _ => panic!(),
        }
        let h = FileExtentItem::hole(9, 8192);
        match parse_file_extent(h.as_bytes()).unwrap() {
            FileExtent::Disk { item, .. } => assert_eq!(
                (
                    item.disk_bytenr.get(),
                    item.num_bytes.get(),
                    item.ram_bytes.get()
                ),
                (0, 8192, 8192)
            ),
            _ => panic!(),
        }
    }

    fn disk(compression: u8, ram: u64, disk: u64, off: u64, num: u64) -> FileExtentItem {
        FileExtentItem::new(
            BTRFS_FILE_EXTENT_REG,
            7,
            1 << 30,
            disk,
            off,
            num,
            ram,
            compression,
        )
    }

    fn bounds(it: &FileExtentItem, file_off: u64) -> Result<()> {
        let key = crate::format::key::Key::new(257, BTRFS_EXTENT_DATA_KEY, file_off);
        parse_file_extent(it.as_bytes()).unwrap().check_bounds(&key)
    }

    #[test]
    fn bounds_the_format_gives() {
        use crate::CorruptKind;
        // What the kernel writes passes.
        assert!(bounds(&disk(0, 65536, 65536, 4096, 8192), 0).is_ok());
        assert!(bounds(&disk(BTRFS_COMPRESS_ZSTD, 131072, 8192, 0, 131072), 0).is_ok());
        assert!(bounds(&FileExtentItem::hole(1, 1 << 45), 4096).is_ok());
        let key = crate::format::key::Key::new(257, BTRFS_EXTENT_DATA_KEY, 0);
        let err = |r: Result<()>| match r {
            Err(Error::Corrupt {
                kind: CorruptKind::Item,
                key: Some(k),
                what,
                ..
            }) => {
                assert_eq!(k.objectid, 257, "{what}");
                what
            }
            r => panic!("want a Corrupt error naming the key, got {r:?}"),
        };
        // A compressed extent claiming 2 GiB of data, or 2 GiB on disk.
        let w = err(bounds(
            &disk(BTRFS_COMPRESS_ZLIB, 2 << 30, 4096, 0, 4096),
            0,
        ));
        assert!(w.contains("ram_bytes 2147483648"), "{w}");
        let w = err(bounds(
            &disk(BTRFS_COMPRESS_LZO, 65536, 2 << 30, 0, 4096),
            0,
        ));
        assert!(w.contains("disk_num_bytes"), "{w}");
        // A logged extent of 2^45 bytes over 64 KiB of data.
        let w = err(bounds(&disk(0, 65536, 65536, 0, 1 << 45), 0));
        assert!(
            w.contains("num_bytes 35184372088832 exceeds ram_bytes 65536"),
            "{w}"
        );
        // Overflows.
        err(bounds(&disk(0, u64::MAX, u64::MAX, 0, 4096), 0));
        err(bounds(&disk(0, 65536, 65536, 0, 4096), u64::MAX - 100));
        err(bounds(&FileExtentItem::hole(1, 8192), u64::MAX - 4095));
        err(bounds(&disk(0, u64::MAX, 65536, u64::MAX - 10, 4096), 0));
        // A compressed inline extent claiming 2 GiB.
        let mut inline = encode_inline_extent(5, 2 << 30, BTRFS_COMPRESS_ZLIB, b"xx");
        let fe = parse_file_extent(&inline).unwrap();
        err(fe.check_bounds(&key));
        inline[8..16].copy_from_slice(&4096u64.to_le_bytes());
        assert!(parse_file_extent(&inline)
            .unwrap()
            .check_bounds(&key)
            .is_ok());
    }

    #[test]
    fn csum_span() {
        let mut it = FileExtentItem {
            generation: 1.into(),
            ram_bytes: 16384.into(),
            compression: BTRFS_COMPRESS_NONE,
            encryption: 0,
            other_encoding: 0.into(),
            type_: BTRFS_FILE_EXTENT_REG,
            disk_bytenr: (1 << 20).into(),
            disk_num_bytes: 16384.into(),
            offset: 4096.into(),
            num_bytes: 8192.into(),
        };
        let span = |it: &FileExtentItem| parse_file_extent(it.as_bytes()).unwrap().csum_span();
        // Uncompressed: only the referenced part of the disk extent.
        assert_eq!(span(&it), Some(((1 << 20) + 4096, (1 << 20) + 12288)));
        // Compressed: the whole disk extent, whatever part the file uses.
        it.compression = BTRFS_COMPRESS_ZSTD;
        it.disk_num_bytes.set(4096);
        assert_eq!(span(&it), Some((1 << 20, (1 << 20) + 4096)));
        it.type_ = BTRFS_FILE_EXTENT_PREALLOC;
        assert_eq!(span(&it), None);
        it.type_ = BTRFS_FILE_EXTENT_REG;
        it.disk_bytenr.set(0);
        assert_eq!(span(&it), None, "a hole");
        let mut inline = it.as_bytes()[..FILE_EXTENT_INLINE_DATA_START].to_vec();
        inline[20] = BTRFS_FILE_EXTENT_INLINE;
        inline.extend_from_slice(b"data");
        assert_eq!(parse_file_extent(&inline).unwrap().csum_span(), None);
    }
}
