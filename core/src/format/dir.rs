//! `btrfs_dir_item` (30 bytes + name + data), used by DIR_ITEM, DIR_INDEX and
//! XATTR_ITEM (several may be packed in one DIR_ITEM/XATTR_ITEM on hash
//! collision), and `btrfs_dir_log_item`.

use super::key::DiskKey;
use super::{Le16, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_dir_item`, the 30-byte head of one directory entry or xattr;
/// `name_len` bytes of name and `data_len` bytes of data follow.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DirItem {
    /// Key of the target: (ino, INODE_ITEM, 0) for an inode, (subvol id,
    /// ROOT_ITEM, -1) for a subvolume, zero for an xattr.
    pub location: DiskKey,
    /// Transaction that created the entry.
    pub transid: Le64,
    /// Length of the data after the name: the xattr value, 0 for a directory
    /// entry.
    pub data_len: Le16,
    /// Length of the name in bytes, at most BTRFS_NAME_LEN.
    pub name_len: Le16,
    /// BTRFS_FT_* type of the target, possibly with BTRFS_FT_ENCRYPTED; C's
    /// `type`.
    pub type_: u8,
}

/// Size of [`DirItem`] in bytes.
pub const DIR_ITEM_SIZE: usize = 30;

/// `struct btrfs_dir_log_item`: body of DIR_LOG_ITEM / DIR_LOG_INDEX, keyed
/// (dir, type, start): the log holds every entry of the directory in the
/// range, so replay deletes entries of the range the log lacks.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DirLogItem {
    /// Last hash or index of the logged range, inclusive.
    pub end: Le64,
}

/// One entry of a parsed DIR_ITEM, DIR_INDEX or XATTR_ITEM, borrowing the
/// item's bytes.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'a> {
    /// The fixed head.
    pub item: &'a DirItem,
    /// The name: file name or xattr name.
    pub name: &'a [u8],
    /// The data: the xattr value, empty for directory entries.
    pub data: &'a [u8],
}

/// Why the kernel would refuse `name` as a directory entry's name (a
/// path component: not empty, no `/`, no NUL, neither `.` nor `..`), or
/// None for a name it takes. Such a name only comes from a damaged or
/// crafted image: the mount skips the entry and the checker reports it.
/// The length limit (BTRFS_NAME_LEN) is the item checks'.
pub fn name_fault(name: &[u8]) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name == b"." {
        Some("is \".\"")
    } else if name == b".." {
        Some("is \"..\"")
    } else if !name.iter().any(|&c| c == b'/' || c == 0) {
        // One pass for the usual name (a check reads millions).
        None
    } else if name.contains(&b'/') {
        Some("contains '/'")
    } else if name.contains(&0) {
        Some("contains a NUL byte")
    } else {
        None
    }
}

/// Split a DIR_ITEM, DIR_INDEX or XATTR_ITEM body into its packed entries; an
/// entry whose name or data runs past the item end is an error.
pub fn parse_dir_items(data: &[u8]) -> Result<Vec<DirEntry<'_>>> {
    let mut out = Vec::new();
    for_each_dir_entry(data, |e| out.push(e))?;
    Ok(out)
}

/// Hand each packed entry of a DIR_ITEM, DIR_INDEX or XATTR_ITEM body to
/// `f`, in order, without collecting them; returns how many there were.
/// Entries before a malformed one are handed over before the error.
pub fn for_each_dir_entry<'a>(
    mut data: &'a [u8],
    mut f: impl FnMut(DirEntry<'a>),
) -> Result<usize> {
    let mut count = 0;
    while !data.is_empty() {
        let h: &DirItem = super::view(data, "dir item")?;
        let n = h.name_len.get() as usize;
        let d = h.data_len.get() as usize;
        let rest = &data[DIR_ITEM_SIZE..];
        if rest.len() < n + d {
            return Err(Error::corrupt_item(
                format!(
                    "dir item name_len {n} + data_len {d} past item end ({} bytes left)",
                    rest.len()
                ),
                0,
                None,
            ));
        }
        f(DirEntry {
            item: h,
            name: &rest[..n],
            data: &rest[n..n + d],
        });
        count += 1;
        data = &rest[n + d..];
    }
    Ok(count)
}

/// Append one packed dir entry (DIR_ITEM, DIR_INDEX or XATTR_ITEM body):
/// header, name, data.
pub fn encode_dir_entry(
    out: &mut Vec<u8>,
    location: &super::key::Key,
    transid: u64,
    ftype: u8,
    name: &[u8],
    data: &[u8],
) {
    let h = DirItem {
        location: location.to_disk(),
        transid: transid.into(),
        data_len: (data.len() as u16).into(),
        name_len: (name.len() as u16).into(),
        type_: ftype,
    };
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(data);
}

/// Rebuild a packed item from parsed entries (say, all but one).
pub fn encode_dir_entries<'a>(entries: impl IntoIterator<Item = &'a DirEntry<'a>>) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        out.extend_from_slice(e.item.as_bytes());
        out.extend_from_slice(e.name);
        out.extend_from_slice(e.data);
    }
    out
}

/// Directory entry type (BTRFS_FT_*) of a file mode; None for a mode with
/// no file type.
pub fn ftype_of_mode(mode: u32) -> Option<u8> {
    use super::consts::*;
    Some(match mode & 0o170000 {
        0o100000 => BTRFS_FT_REG_FILE,
        0o040000 => BTRFS_FT_DIR,
        0o020000 => BTRFS_FT_CHRDEV,
        0o060000 => BTRFS_FT_BLKDEV,
        0o010000 => BTRFS_FT_FIFO,
        0o140000 => BTRFS_FT_SOCK,
        0o120000 => BTRFS_FT_SYMLINK,
        _ => return None,
    })
}

/// The name hash of DIR_ITEM and XATTR_ITEM keys: crc32c seeded with
/// (u32)~1, as the kernel's `btrfs_name_hash`.
pub fn name_hash(name: &[u8]) -> u64 {
    raw_crc32c(!1u32, name) as u64
}

/// The kernel's `crc32c(seed, data)`: the register is neither pre- nor
/// post-inverted, unlike the finalised form the crc32c crate computes.
pub fn raw_crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The key offset of INODE_EXTREF items: crc32c of the name seeded with the
/// parent inode number, as `btrfs_extref_hash`.
pub fn extref_hash(parent: u64, name: &[u8]) -> u64 {
    raw_crc32c(parent as u32, name) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<DirItem>(), DIR_ITEM_SIZE);
        let b: Vec<u8> = (0..30u32).map(|i| (i * 9) as u8).collect();
        crate::format::roundtrip::<DirItem>(&b);
    }

    #[test]
    fn names_the_kernel_refuses() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b", b"\0"] {
            assert!(name_fault(bad).is_some(), "{bad:?}");
        }
        for good in [&b"a"[..], b"...", b".a", b"a.", b"\xff\xfe", b"a b", b"\\"] {
            assert_eq!(name_fault(good), None, "{good:?}");
        }
    }

    #[test]
    fn packed_entries_roundtrip() {
        let k = crate::format::key::Key::new(257, 1, 0);
        let mut d = Vec::new();
        encode_dir_entry(&mut d, &k, 7, 1, b"name", b"");
        encode_dir_entry(
            &mut d,
            &crate::format::key::Key::MIN,
            8,
            8,
            b"user.x",
            b"value",
        );
        let e = parse_dir_items(&d).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].name, e[1].data, e[1].item.type_),
            (&b"name"[..], &b"value"[..], 8)
        );
        assert_eq!(encode_dir_entries(&e), d);
        assert_eq!(encode_dir_entries(&e[1..]), d[34..]);
    }
}
