//! Persistent and temporary items decoded for printing only: device stats,
//! dev-replace state, balance state.

use super::Le64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Number of le64 counters in a device stats item (BTRFS_DEV_STAT_VALUES_MAX).
pub const BTRFS_DEV_STAT_VALUES_MAX: usize = 5;
/// Names of the device stats counters in item order (BTRFS_DEV_STAT_WRITE_ERRS
/// .. GENERATION_ERRS), as btrfs-progs prints them.
pub const DEV_STAT_NAMES: [&str; BTRFS_DEV_STAT_VALUES_MAX] = [
    "write_errs",
    "read_errs",
    "flush_errs",
    "corruption_errs",
    "generation",
];

/// `struct btrfs_dev_replace_item`: state of a device replace, (0, DEV_REPLACE,
/// 0) in the dev tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DevReplaceItem {
    /// Device being replaced.
    pub src_devid: Le64,
    /// Copy progress: physical offset on the source up to which data is copied.
    pub cursor_left: Le64,
    /// Copy progress: physical offset on the source of the end of the chunk
    /// being copied.
    pub cursor_right: Le64,
    /// Whether reads still go to the source device: 0 always, 1 avoid
    /// (BTRFS_IOCTL_DEV_REPLACE_CONT_READING_FROM_SRCDEV_MODE_*).
    pub cont_reading_from_srcdev_mode: Le64,
    /// BTRFS_IOCTL_DEV_REPLACE_STATE_*: never started, started, finished,
    /// canceled, suspended (0-4).
    pub replace_state: Le64,
    /// Start time, seconds since the epoch.
    pub time_started: Le64,
    /// Stop time, seconds since the epoch.
    pub time_stopped: Le64,
    /// Write errors on the target so far.
    pub num_write_errors: Le64,
    /// Reads that found no good copy so far.
    pub num_uncorrectable_read_errors: Le64,
}

/// `struct btrfs_disk_balance_args`: the filters and conversion of one block
/// group type in a balance item.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct DiskBalanceArgs {
    /// Profile filter: BTRFS_BLOCK_GROUP_* profile bits (single is
    /// BTRFS_AVAIL_ALLOC_BIT_SINGLE).
    pub profiles: Le64,
    /// Usage filter in percent; with the USAGE_RANGE flag `usage_min` in the
    /// low and `usage_max` in the high 32 bits.
    pub usage: Le64,
    /// Device filter: only chunks with a stripe on this device.
    pub devid: Le64,
    /// Physical range filter on `devid`: start, bytes.
    pub pstart: Le64,
    /// Physical range filter on `devid`: end, bytes.
    pub pend: Le64,
    /// Logical range filter: start, bytes.
    pub vstart: Le64,
    /// Logical range filter: end, bytes.
    pub vend: Le64,
    /// Profile to convert to, with the CONVERT flag.
    pub target: Le64,
    /// BTRFS_BALANCE_ARGS_* saying which filters apply.
    pub flags: Le64,
    /// Limit on chunks processed; with LIMIT_RANGE `limit_min` in the low and
    /// `limit_max` in the high 32 bits.
    pub limit: Le64,
    /// Stripe count filter: `stripes_min` in the low and `stripes_max` in the
    /// high 32 bits.
    pub stripes: Le64,
    /// Reserved, zero.
    pub unused: [Le64; 6],
}

/// `struct btrfs_balance_item`: a running or paused balance, (BALANCE,
/// TEMPORARY_ITEM, 0) in the root tree.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct BalanceItem {
    /// BTRFS_BALANCE_* (DATA, SYSTEM, METADATA, FORCE, RESUME).
    pub flags: Le64,
    /// Arguments for data block groups.
    pub data: DiskBalanceArgs,
    /// Arguments for metadata block groups.
    pub meta: DiskBalanceArgs,
    /// Arguments for system block groups.
    pub sys: DiskBalanceArgs,
    /// Reserved, zero.
    pub unused: [Le64; 4],
}

/// `btrfs_raid_stride` of the raid stripe tree (decoded for printing only).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct RaidStride {
    /// Device holding this stride.
    pub devid: Le64,
    /// Physical byte offset of the stride on that device.
    pub physical: Le64,
}

/// `btrfs_verity_descriptor_item` head.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct VerityDescItem {
    /// Size of the fs-verity descriptor in bytes; the descriptor itself is in
    /// the VERITY_DESC_ITEMs from key offset 1 on (offset = byte + 1).
    pub size: Le64,
    /// Reserved for fscrypt, zero.
    pub reserved: [Le64; 2],
    /// Encryption of the descriptor, reserved for fscrypt; 0.
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
