//! `btrfs_file_extent_item`: a 21-byte head followed either by inline data
//! (type INLINE) or by the 32-byte on-disk extent description.

use super::consts::*;
use super::{Le16, Le64};
use crate::{Error, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FileExtentHead {
    pub generation: Le64,
    pub ram_bytes: Le64,
    pub compression: u8,
    pub encryption: u8,
    pub other_encoding: Le16,
    pub type_: u8,
}

#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
pub struct FileExtentItem {
    pub generation: Le64,
    pub ram_bytes: Le64,
    pub compression: u8,
    pub encryption: u8,
    pub other_encoding: Le16,
    pub type_: u8,
    pub disk_bytenr: Le64,
    pub disk_num_bytes: Le64,
    pub offset: Le64,
    pub num_bytes: Le64,
}

pub const FILE_EXTENT_INLINE_DATA_START: usize = 21;
pub const FILE_EXTENT_ITEM_SIZE: usize = 53;

#[derive(Debug, Clone, Copy)]
pub enum FileExtent<'a> {
    Inline { head: &'a FileExtentHead, data: &'a [u8] },
    /// REG or PREALLOC; `disk_bytenr == 0` is a hole.
    Disk { head: &'a FileExtentHead, item: &'a FileExtentItem },
}

impl<'a> FileExtent<'a> {
    pub fn head(&self) -> &'a FileExtentHead {
        match self {
            FileExtent::Inline { head, .. } | FileExtent::Disk { head, .. } => head,
        }
    }
}

pub fn parse_file_extent(data: &[u8]) -> Result<FileExtent<'_>> {
    let head: &FileExtentHead = super::view(data, "file extent")?;
    match head.type_ {
        BTRFS_FILE_EXTENT_INLINE => Ok(FileExtent::Inline { head, data: &data[FILE_EXTENT_INLINE_DATA_START..] }),
        BTRFS_FILE_EXTENT_REG | BTRFS_FILE_EXTENT_PREALLOC => {
            if data.len() != FILE_EXTENT_ITEM_SIZE {
                return Err(Error::corrupt(
                    format!("file extent item size {} for a non-inline extent, want {FILE_EXTENT_ITEM_SIZE}", data.len()),
                    0,
                ));
            }
            Ok(FileExtent::Disk { head, item: super::view(data, "file extent")? })
        }
        t => Err(Error::corrupt(format!("file extent type {t} unknown"), 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<FileExtentHead>(), FILE_EXTENT_INLINE_DATA_START);
        assert_eq!(core::mem::size_of::<FileExtentItem>(), FILE_EXTENT_ITEM_SIZE);
        let mut b: Vec<u8> = (0..53u32).map(|i| (i * 11) as u8).collect();
        crate::format::roundtrip::<FileExtentItem>(&b);
        b[20] = BTRFS_FILE_EXTENT_REG;
        assert!(matches!(parse_file_extent(&b).unwrap(), FileExtent::Disk { .. }));
        b[20] = BTRFS_FILE_EXTENT_INLINE;
        match parse_file_extent(&b).unwrap() {
            FileExtent::Inline { data, .. } => assert_eq!(data.len(), 32),
            _ => panic!(),
        }
        b[20] = 9;
        assert!(parse_file_extent(&b).is_err());
    }
}
