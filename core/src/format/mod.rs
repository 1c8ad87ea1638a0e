//! The Btrfs on-disk format: one module per structure, typed little-endian
//! views (zerocopy, alignment 1, so a view can sit at any byte of a block),
//! constants named after the C names of `btrfs_tree.h`.

pub mod block_group;
pub mod chunk;
pub mod consts;
pub mod dev;
pub mod dir;
pub mod extent;
pub mod file_extent;
pub mod free_space;
pub mod header;
pub mod inode;
pub mod item;
pub mod key;
pub mod misc;
pub mod names;
pub mod qgroup;
pub mod root;
pub mod superblock;

pub use consts::*;
pub use key::Key;

use zerocopy::little_endian::{U16, U32, U64};

/// A little-endian u16 as stored on disk (`__le16`), alignment 1.
pub type Le16 = U16;
/// A little-endian u32 as stored on disk (`__le32`), alignment 1.
pub type Le32 = U32;
/// A little-endian u64 as stored on disk (`__le64`), alignment 1.
pub type Le64 = U64;

/// Read a typed view from the front of `data`; `what` names the structure
/// in the error when `data` is too short.
pub(crate) fn view<'a, T>(data: &'a [u8], what: &str) -> crate::Result<&'a T>
where
    T: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    match T::ref_from_prefix(data) {
        Ok((v, _)) => Ok(v),
        Err(_) => Err(crate::Error::corrupt_item(
            format!(
                "{what}: {} bytes, need {}",
                data.len(),
                core::mem::size_of::<T>()
            ),
            0,
            None,
        )),
    }
}

/// A structure read from the front of `data`, fields past the end of
/// `data` reading as zero. This is how btrfs-progs prints an item whose size
/// is wrong (it reads each field wherever it falls), so a dump can show
/// what a damaged item holds; anything that acts on an item decodes it with
/// [`item::decode`], which refuses wrong sizes.
pub fn read_lenient<T>(data: &[u8]) -> T
where
    T: zerocopy::FromBytes + zerocopy::IntoBytes,
{
    let mut v = T::new_zeroed();
    let dst = v.as_mut_bytes();
    let n = dst.len().min(data.len());
    dst[..n].copy_from_slice(&data[..n]);
    v
}

#[cfg(test)]
pub(crate) fn roundtrip<T>(bytes: &[u8])
where
    T: zerocopy::FromBytes
        + zerocopy::IntoBytes
        + zerocopy::KnownLayout
        + zerocopy::Immutable
        + zerocopy::Unaligned,
{
    let v = T::ref_from_bytes(bytes).expect("size"); // OK: test-only helper
    assert_eq!(v.as_bytes(), bytes);
    let owned = T::read_from_bytes(bytes).expect("size"); // OK: test-only helper
    assert_eq!(owned.as_bytes(), bytes);
}
