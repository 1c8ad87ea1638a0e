//! Persistent and temporary items decoded for printing only: device stats,
//! dev-replace state, balance state.

use super::Le64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const BTRFS_DEV_STAT_VALUES_MAX: usize = 5;
pub const DEV_STAT_NAMES: [&str; BTRFS_DEV_STAT_VALUES_MAX] = [
    "write_errs",
    "read_errs",
    "flush_errs",
    "corruption_errs",
    "generation",
];

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DevReplaceItem {
    pub src_devid: Le64,
    pub cursor_left: Le64,
    pub cursor_right: Le64,
    pub cont_reading_from_srcdev_mode: Le64,
    pub replace_state: Le64,
    pub time_started: Le64,
    pub time_stopped: Le64,
    pub num_write_errors: Le64,
    pub num_uncorrectable_read_errors: Le64,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DiskBalanceArgs {
    pub profiles: Le64,
    pub usage: Le64,
    pub devid: Le64,
    pub pstart: Le64,
    pub pend: Le64,
    pub vstart: Le64,
    pub vend: Le64,
    pub target: Le64,
    pub flags: Le64,
    pub limit: Le64,
    pub stripes: Le64,
    pub unused: [Le64; 6],
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct BalanceItem {
    pub flags: Le64,
    pub data: DiskBalanceArgs,
    pub meta: DiskBalanceArgs,
    pub sys: DiskBalanceArgs,
    pub unused: [Le64; 4],
}

/// `btrfs_raid_stride` of the raid stripe tree (decoded for printing only).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RaidStride {
    pub devid: Le64,
    pub physical: Le64,
}

/// `btrfs_verity_descriptor_item` head.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct VerityDescItem {
    pub size: Le64,
    pub reserved: [Le64; 2],
    pub encryption: u8,
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<super::DevReplaceItem>(), 72);
        assert_eq!(core::mem::size_of::<super::DiskBalanceArgs>(), 136);
        assert_eq!(core::mem::size_of::<super::BalanceItem>(), 8 + 3 * 136 + 32);
    }
}
