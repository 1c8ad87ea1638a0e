//! `btrfs_inode_item` (160 bytes), `btrfs_timespec`, `btrfs_inode_ref` and
//! `btrfs_inode_extref` headers (each followed by a name; several may be
//! packed in one item).

use super::{Le16, Le32, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, Default)]
pub struct Timespec {
    pub sec: Le64,
    pub nsec: Le32,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, Default)]
pub struct InodeItem {
    pub generation: Le64,
    pub transid: Le64,
    pub size: Le64,
    pub nbytes: Le64,
    pub block_group: Le64,
    pub nlink: Le32,
    pub uid: Le32,
    pub gid: Le32,
    pub mode: Le32,
    pub rdev: Le64,
    pub flags: Le64,
    pub sequence: Le64,
    pub reserved: [Le64; 4],
    pub atime: Timespec,
    pub ctime: Timespec,
    pub mtime: Timespec,
    pub otime: Timespec,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct InodeRef {
    pub index: Le64,
    pub name_len: Le16,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct InodeExtref {
    pub parent_objectid: Le64,
    pub index: Le64,
    pub name_len: Le16,
}

#[derive(Debug, Clone, Copy)]
pub struct InodeRefEntry<'a> {
    pub index: u64,
    pub name: &'a [u8],
}

#[derive(Debug, Clone, Copy)]
pub struct InodeExtrefEntry<'a> {
    pub parent: u64,
    pub index: u64,
    pub name: &'a [u8],
}

/// Split a packed `INODE_REF` item into its entries.
pub fn parse_inode_refs(mut data: &[u8]) -> Result<Vec<InodeRefEntry<'_>>> {
    let mut out = Vec::new();
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
        out.push(InodeRefEntry {
            index: h.index.get(),
            name: &rest[..n],
        });
        data = &rest[n..];
    }
    Ok(out)
}

/// Split a packed `INODE_EXTREF` item into its entries.
pub fn parse_inode_extrefs(mut data: &[u8]) -> Result<Vec<InodeExtrefEntry<'_>>> {
    let mut out = Vec::new();
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
        out.push(InodeExtrefEntry {
            parent: h.parent_objectid.get(),
            index: h.index.get(),
            name: &rest[..n],
        });
        data = &rest[n..];
    }
    Ok(out)
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
