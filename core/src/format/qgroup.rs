//! Quota tree items (decoded for printing only).

use super::Le64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct QgroupStatusItem {
    pub version: Le64,
    pub generation: Le64,
    pub flags: Le64,
    pub rescan: Le64,
}

/// Simple quotas append `enable_gen` to the status item.
pub const QGROUP_STATUS_SIMPLE_SIZE: usize = 40;

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct QgroupInfoItem {
    pub generation: Le64,
    pub rfer: Le64,
    pub rfer_cmpr: Le64,
    pub excl: Le64,
    pub excl_cmpr: Le64,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct QgroupLimitItem {
    pub flags: Le64,
    pub max_rfer: Le64,
    pub max_excl: Le64,
    pub rsv_rfer: Le64,
    pub rsv_excl: Le64,
}

/// A qgroup id as `level/subvolid`, the way btrfs-progs prints it.
pub fn qgroupid_str(id: u64) -> String {
    format!("{}/{}", id >> 48, id & ((1u64 << 48) - 1))
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<super::QgroupStatusItem>(), 32);
        assert_eq!(core::mem::size_of::<super::QgroupInfoItem>(), 40);
        assert_eq!(core::mem::size_of::<super::QgroupLimitItem>(), 40);
        assert_eq!(super::qgroupid_str((1 << 48) | 5), "1/5");
    }
}
