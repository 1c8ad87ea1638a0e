//! Quota tree items (decoded for printing only).

use super::Le64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct btrfs_qgroup_status_item` without the simple-quota `enable_gen`: (0,
/// QGROUP_STATUS, 0) in the quota tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct QgroupStatusItem {
    /// Format version, BTRFS_QGROUP_STATUS_VERSION (1).
    pub version: Le64,
    /// Transaction that last updated the quota numbers; lets a mount notice
    /// changes made without quota accounting.
    pub generation: Le64,
    /// BTRFS_QGROUP_STATUS_FLAG_*.
    pub flags: Le64,
    /// Progress of a running rescan: the extent tree objectid (bytenr) it
    /// resumes at.
    pub rescan: Le64,
}

/// Simple quotas append `enable_gen` to the status item.
pub const QGROUP_STATUS_SIMPLE_SIZE: usize = 40;

/// `struct btrfs_qgroup_info_item`: usage of one qgroup, (0, QGROUP_INFO,
/// qgroupid).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct QgroupInfoItem {
    /// Transaction that last updated the item.
    pub generation: Le64,
    /// Bytes referenced by the qgroup.
    pub rfer: Le64,
    /// Referenced bytes after compression (the kernel keeps it equal to
    /// `rfer`).
    pub rfer_cmpr: Le64,
    /// Bytes referenced by the qgroup only.
    pub excl: Le64,
    /// Exclusive bytes after compression (the kernel keeps it equal to `excl`).
    pub excl_cmpr: Le64,
}

/// `struct btrfs_qgroup_limit_item`: limits of one qgroup, (0, QGROUP_LIMIT,
/// qgroupid).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct QgroupLimitItem {
    /// BTRFS_QGROUP_LIMIT_* saying which limits are set.
    pub flags: Le64,
    /// Limit on referenced bytes.
    pub max_rfer: Le64,
    /// Limit on exclusive bytes.
    pub max_excl: Le64,
    /// Reserved referenced bytes; stored, not enforced.
    pub rsv_rfer: Le64,
    /// Reserved exclusive bytes; stored, not enforced.
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
