//! `struct btrfs_disk_key` (17 bytes) and the in-memory `Key` ordered by
//! (objectid, type, offset), the order of every Btrfs tree.

use super::Le64;
use serde::Serialize;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Default, Debug)]
pub struct DiskKey {
    pub objectid: Le64,
    pub type_: u8,
    pub offset: Le64,
}

pub const DISK_KEY_SIZE: usize = 17;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize)]
pub struct Key {
    pub objectid: u64,
    #[serde(rename = "type")]
    pub ty: u8,
    pub offset: u64,
}

impl Key {
    pub const MIN: Key = Key {
        objectid: 0,
        ty: 0,
        offset: 0,
    };
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        ty: u8::MAX,
        offset: u64::MAX,
    };

    pub const fn new(objectid: u64, ty: u8, offset: u64) -> Self {
        Key {
            objectid,
            ty,
            offset,
        }
    }
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
