//! `btrfs_inode_item` (160 bytes), `btrfs_timespec`, `btrfs_inode_ref` and
//! `btrfs_inode_extref` headers (each followed by a name; several may be
//! packed in one item).

use super::{Le16, Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_timespec` (12 bytes).
///
/// Read it through [`Timespec::get`], never through its fields: the
/// seconds are the kernel's signed `time64_t` stored as little-endian 64
/// bits (a file dated 1960 has a negative count), and the nanoseconds come
/// from disk unchecked.
#[repr(C)]
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
)]
pub struct Timespec {
    /// Seconds since the Unix epoch, two's complement (negative before 1970).
    pub sec: Le64,
    /// Nanoseconds, below 1e9 as the kernel writes them.
    pub nsec: Le32,
}

/// The largest nanosecond count a time carries.
pub const MAX_NSEC: u32 = 999_999_999;

impl Timespec {
    /// A time of `sec` seconds (negative before 1970) and `nsec`
    /// nanoseconds, the latter clamped to [`MAX_NSEC`].
    pub fn new(sec: i64, nsec: u32) -> Timespec {
        Timespec {
            sec: (sec as u64).into(),
            nsec: nsec.min(MAX_NSEC).into(),
        }
    }

    /// (signed seconds, nanoseconds), as every reader takes a time: the
    /// seconds reinterpreted as the kernel's signed `time64_t`, and a
    /// nanosecond count of 10^9 or more (which no kernel writes) clamped to
    /// [`MAX_NSEC`] so that the pair is a valid `struct timespec`.
    pub fn get(&self) -> (i64, u32) {
        (self.sec.get() as i64, self.nsec.get().min(MAX_NSEC))
    }
}

/// `struct btrfs_inode_item`, keyed (ino, INODE_ITEM, 0); also embedded at the
/// start of `btrfs_root_item`.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, Default)]
pub struct InodeItem {
    /// Transaction that created the inode.
    pub generation: Le64,
    /// Transaction that last changed the inode.
    pub transid: Le64,
    /// File size in bytes (i_size); for a directory, twice the total length of
    /// its entries' names.
    pub size: Le64,
    /// Bytes of data the inode's extents account for, holes excluded (what
    /// `st_blocks` reports).
    pub nbytes: Le64,
    /// Allocation hint; unused, 0.
    pub block_group: Le64,
    /// Link count: INODE_REF/INODE_EXTREF names pointing at the inode (1 for a
    /// directory).
    pub nlink: Le32,
    /// Owner user id.
    pub uid: Le32,
    /// Owner group id.
    pub gid: Le32,
    /// File type and permission bits (`st_mode`).
    pub mode: Le32,
    /// Device number of a character or block device inode.
    pub rdev: Le64,
    /// BTRFS_INODE_* in the low 32 bits, read-only compat flags (fs-verity) in
    /// the high 32.
    pub flags: Le64,
    /// Change counter for NFS (i_version).
    pub sequence: Le64,
    /// Reserved, zero.
    pub reserved: [Le64; 4],
    /// Last access time.
    pub atime: Timespec,
    /// Last inode change time.
    pub ctime: Timespec,
    /// Last data modification time.
    pub mtime: Timespec,
    /// Creation time.
    pub otime: Timespec,
}

/// `struct btrfs_inode_ref`, the head of one name of an INODE_REF item (ino,
/// INODE_REF, parent dir); `name_len` bytes of name follow.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct InodeRef {
    /// DIR_INDEX key offset of the matching entry in the parent.
    pub index: Le64,
    /// Length of the name in bytes.
    pub name_len: Le16,
}

/// `struct btrfs_inode_extref`, the head of one name of an INODE_EXTREF item
/// (ino, INODE_EXTREF, [`extref_hash`](super::dir::extref_hash)); `name_len`
/// bytes of name follow.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct InodeExtref {
    /// Inode number of the parent directory.
    pub parent_objectid: Le64,
    /// DIR_INDEX key offset of the matching entry in the parent.
    pub index: Le64,
    /// Length of the name in bytes.
    pub name_len: Le16,
}

/// One parsed name of an INODE_REF item; the parent is the key offset.
#[derive(Debug, Clone, Copy)]
pub struct InodeRefEntry<'a> {
    /// DIR_INDEX key offset in the parent.
    pub index: u64,
    /// The name.
    pub name: &'a [u8],
}

/// One parsed name of an INODE_EXTREF item.
#[derive(Debug, Clone, Copy)]
pub struct InodeExtrefEntry<'a> {
    /// Inode number of the parent directory.
    pub parent: u64,
    /// DIR_INDEX key offset in the parent.
    pub index: u64,
    /// The name.
    pub name: &'a [u8],
}

/// Split a packed `INODE_REF` item into its entries.
pub fn parse_inode_refs(data: &[u8]) -> Result<Vec<InodeRefEntry<'_>>> {
    let mut out = Vec::new();
    for_each_inode_ref(data, |e| out.push(e))?;
    Ok(out)
}

/// Hand each entry of a packed `INODE_REF` item to `f`, in order, without
/// collecting them; returns how many there were.
pub fn for_each_inode_ref<'a>(
    mut data: &'a [u8],
    mut f: impl FnMut(InodeRefEntry<'a>),
) -> Result<usize> {
    let mut count = 0;
    while !data.is_empty() {
        let h: &InodeRef = super::view(data, "inode ref")?;
        let n = h.name_len.get() as usize;
        let rest = &data[10..];
        if rest.len() < n {
            return Err(Error::corrupt(
                format!("inode ref name_len {n} past item end"),
                0,
            ));
        }
        f(InodeRefEntry {
            index: h.index.get(),
            name: &rest[..n],
        });
        count += 1;
        data = &rest[n..];
    }
    Ok(count)
}

/// Split a packed `INODE_EXTREF` item into its entries.
pub fn parse_inode_extrefs(data: &[u8]) -> Result<Vec<InodeExtrefEntry<'_>>> {
    let mut out = Vec::new();
    for_each_inode_extref(data, |e| out.push(e))?;
    Ok(out)
}

/// Hand each entry of a packed `INODE_EXTREF` item to `f`, in order,
/// without collecting them; returns how many there were.
pub fn for_each_inode_extref<'a>(
    mut data: &'a [u8],
    mut f: impl FnMut(InodeExtrefEntry<'a>),
) -> Result<usize> {
    let mut count = 0;
    while !data.is_empty() {
        let h: &InodeExtref = super::view(data, "inode extref")?;
        let n = h.name_len.get() as usize;
        let rest = &data[18..];
        if rest.len() < n {
            return Err(Error::corrupt(
                format!("inode extref name_len {n} past item end"),
                0,
            ));
        }
        f(InodeExtrefEntry {
            parent: h.parent_objectid.get(),
            index: h.index.get(),
            name: &rest[..n],
        });
        count += 1;
        data = &rest[n..];
    }
    Ok(count)
}

/// Append one packed `INODE_REF` entry.
pub fn encode_inode_ref(out: &mut Vec<u8>, index: u64, name: &[u8]) {
    out.extend_from_slice(
        InodeRef {
            index: index.into(),
            name_len: (name.len() as u16).into(),
        }
        .as_bytes(),
    );
    out.extend_from_slice(name);
}

/// Append one packed `INODE_EXTREF` entry.
pub fn encode_inode_extref(out: &mut Vec<u8>, parent: u64, index: u64, name: &[u8]) {
    out.extend_from_slice(
        InodeExtref {
            parent_objectid: parent.into(),
            index: index.into(),
            name_len: (name.len() as u16).into(),
        }
        .as_bytes(),
    );
    out.extend_from_slice(name);
}

/// A time of whole seconds.
pub fn now_ts(now: u64) -> Timespec {
    Timespec {
        sec: now.into(),
        nsec: 0.into(),
    }
}

/// A directory inode item as mkfs creates it for tree root directories.
pub fn dir_inode(now: u64, generation: u64, nbytes: u64) -> InodeItem {
    let mut i = InodeItem::new_zeroed();
    i.generation.set(generation);
    i.transid.set(generation);
    i.nbytes.set(nbytes);
    i.nlink.set(1);
    i.mode.set(0o040755);
    let t = now_ts(now);
    i.atime = t;
    i.ctime = t;
    i.mtime = t;
    i.otime = t;
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;
    #[test]
    fn layout_and_roundtrip() {
        assert_eq!(size_of::<Timespec>(), 12);
        assert_eq!(size_of::<InodeItem>(), 160);
        assert_eq!(size_of::<InodeRef>(), 10);
        assert_eq!(size_of::<InodeExtref>(), 18);
        let b: Vec<u8> = (0..160u32).map(|i| (i * 7) as u8).collect();
        crate::format::roundtrip::<InodeItem>(&b);
    }

    #[test]
    fn times_are_signed_and_nanoseconds_clamped() {
        // 1960-01-01 00:00:00 UTC and 1969-12-31 23:59:59.5, as the
        // kernel stores them.
        let mut t = Timespec::default();
        t.sec.set((-315_619_200i64) as u64);
        assert_eq!(t.get(), (-315_619_200, 0));
        let t = Timespec::new(-1, 500_000_000);
        assert_eq!(t.as_bytes()[..8], [0xff; 8]);
        assert_eq!(t.get(), (-1, 500_000_000));
        // A nanosecond count from disk is never trusted beyond 10^9 - 1.
        let mut t = Timespec::new(5, 0);
        t.nsec.set(u32::MAX);
        assert_eq!(t.get(), (5, MAX_NSEC));
        assert_eq!(
            Timespec::new(i64::MIN, 2_000_000_000).get(),
            (i64::MIN, MAX_NSEC)
        );
    }
    #[test]
    fn packed_refs() {
        let mut d = Vec::new();
        for (idx, name) in [(2u64, &b"a"[..]), (3, b"bcd")] {
            d.extend_from_slice(
                InodeRef {
                    index: idx.into(),
                    name_len: (name.len() as u16).into(),
                }
                .as_bytes(),
            );
            d.extend_from_slice(name);
        }
        let r = parse_inode_refs(&d).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].name, b"bcd");
        assert!(parse_inode_refs(&d[..d.len() - 1]).is_err());
        let mut e = Vec::new();
        encode_inode_ref(&mut e, 2, b"a");
        encode_inode_ref(&mut e, 3, b"bcd");
        assert_eq!(e, d);
        let mut x = Vec::new();
        encode_inode_extref(&mut x, 300, 9, b"zz");
        let p = parse_inode_extrefs(&x).unwrap();
        assert_eq!((p[0].parent, p[0].index, p[0].name), (300, 9, &b"zz"[..]));
    }
}
