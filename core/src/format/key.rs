//! `struct btrfs_disk_key` (17 bytes) and the in-memory `Key` ordered by
//! (objectid, type, offset), the order of every Btrfs tree.

use super::Le64;
use serde::Serialize;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_disk_key`: a key as stored in leaf items, node pointers and
/// other structures (little-endian, packed).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Default, Debug)]
pub struct DiskKey {
    /// Object the item belongs to (inode, tree id, bytenr, ...); sorts first.
    pub objectid: Le64,
    /// Item type, BTRFS_*_KEY; C's `type`.
    pub type_: u8,
    /// Type-specific last part of the key (file offset, hash, index, length,
    /// ...).
    pub offset: Le64,
}

/// Size of [`DiskKey`] in bytes.
pub const DISK_KEY_SIZE: usize = 17;

/// `struct btrfs_key` in CPU byte order; the derived order (objectid, type,
/// offset) is the order of every tree.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize)]
pub struct Key {
    /// Object the item belongs to (inode, tree id, bytenr, ...); sorts first.
    pub objectid: u64,
    /// Item type, BTRFS_*_KEY.
    #[serde(rename = "type")]
    pub ty: u8,
    /// Type-specific last part of the key (file offset, hash, index, length,
    /// ...).
    pub offset: u64,
}

impl Key {
    /// The smallest key, (0, 0, 0).
    pub const MIN: Key = Key {
        objectid: 0,
        ty: 0,
        offset: 0,
    };
    /// The largest key, (-1, 255, -1).
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        ty: u8::MAX,
        offset: u64::MAX,
    };

    /// A key from its three parts.
    pub const fn new(objectid: u64, ty: u8, offset: u64) -> Self {
        Key {
            objectid,
            ty,
            offset,
        }
    }
    /// The on-disk form of this key.
    pub fn to_disk(self) -> DiskKey {
        DiskKey {
            objectid: self.objectid.into(),
            type_: self.ty,
            offset: self.offset.into(),
        }
    }
}

impl From<&DiskKey> for Key {
    fn from(d: &DiskKey) -> Self {
        Key {
            objectid: d.objectid.get(),
            ty: d.type_,
            offset: d.offset.get(),
        }
    }
}
impl From<DiskKey> for Key {
    fn from(d: DiskKey) -> Self {
        Key::from(&d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn size_and_roundtrip() {
        assert_eq!(core::mem::size_of::<DiskKey>(), DISK_KEY_SIZE);
        let mut b = [0u8; 17];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8 * 7 + 1;
        }
        crate::format::roundtrip::<DiskKey>(&b);
        let k = Key::from(DiskKey::read_from_bytes(&b).unwrap());
        assert_eq!(k.to_disk().as_bytes(), &b);
    }
    #[test]
    fn order() {
        assert!(Key::new(1, 2, 3) < Key::new(1, 3, 0));
        assert!(Key::new(1, 255, u64::MAX) < Key::new(2, 0, 0));
    }
}
