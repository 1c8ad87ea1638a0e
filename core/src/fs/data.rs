//! File data on disk: new extents (allocated, written, checksummed,
//! referenced) and inline extents.

use super::extents::{extent_key, insert_disk_extent, MAX_EXTENT_SIZE};
use crate::format::consts::*;
use crate::format::file_extent::{encode_inline_extent, FileExtentItem};
use crate::trans::delayed::BackRef;
use crate::trans::{Store, TreeId};
use crate::{Error, Result};

/// Checksums of `data` (a whole number of sectors), one per sector.
pub fn sector_csums(st: &Store, data: &[u8]) -> Vec<u8> {
    let csum = st.image().csum;
    let cs = csum.size();
    let ss = st.sectorsize() as usize;
    let mut sums = Vec::with_capacity(data.len() / ss * cs);
    for sector in data.chunks(ss) {
        sums.extend_from_slice(&csum.compute(sector)[..cs]);
    }
    sums
}

/// Allocate a data extent of `disk.len()` bytes (a whole number of
/// sectors, in one piece: a compressed extent cannot be cut), write `disk`
/// there and record its checksums (unless `nodatasum`). Returns its
/// address. The extent item comes with the first reference
/// ([`reference_new_extent`]).
pub fn write_data_extent(st: &mut Store, disk: &[u8], datasum: bool) -> Result<u64> {
    let len = disk.len() as u64;
    if len > MAX_EXTENT_SIZE {
        return Err(Error::Invalid(format!("data extent of {len} bytes")));
    }
    let (bytenr, _) = reserve_data_extent(st, len, len)?;
    write_data_at(st, bytenr, disk, datasum)?;
    Ok(bytenr)
}

/// The one rule for placing new data (btrfs_reserve_extent): `want` bytes
/// (a multiple of the sector size) in one piece when a block group, or a
/// new data chunk, has that much; else, as btrfs_reserve_extent retries
/// after ENOSPC, the smaller of half the request and the longest free
/// piece, never less than `min` bytes. Returns (address, length
/// allocated). Writeback and fallocate ask for at least a sector and cut
/// their range into as many extents as the free space needs; a compressed
/// extent asks for all of it. Only a filesystem without `min` free bytes in
/// one piece, and no room for a new chunk, fails (NoSpace).
pub fn reserve_data_extent(st: &mut Store, want: u64, min: u64) -> Result<(u64, u64)> {
    let ss = st.sectorsize() as u64;
    if want == 0 || !want.is_multiple_of(ss) || min == 0 || !min.is_multiple_of(ss) || min > want {
        return Err(Error::Invalid(format!(
            "data extent of {want} bytes (at least {min})"
        )));
    }
    let mut len = want;
    loop {
        match st
            .chunks()
            .alloc_space(BTRFS_BLOCK_GROUP_DATA, len, ss, true)
        {
            Ok(bytenr) => return Ok((bytenr, len)),
            // The length strictly falls until it is `min`: at most about
            // 64 tries from 2^64 down.
            Err(Error::NoSpace(_)) if len > min => {
                let largest = st.chunks().largest_free(BTRFS_BLOCK_GROUP_DATA) / ss * ss;
                len = (len / 2 / ss * ss).min(largest).max(min);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Write `disk` to data space allocated at `bytenr` in this transaction
/// and record its checksums (unless `nodatasum`).
pub fn write_data_at(st: &mut Store, bytenr: u64, disk: &[u8], datasum: bool) -> Result<()> {
    st.data().write_new_data(bytenr, disk)?;
    if datasum {
        let sums = sector_csums(st, disk);
        st.csums().csum_insert(bytenr, &sums)?;
    }
    Ok(())
}

/// Queue the extent item of a data extent this transaction wrote, with
/// its first reference.
pub fn reference_new_extent(st: &mut Store, bytenr: u64, len: u64, r: BackRef) {
    let t = st.transid();
    st.extent_refs().queue_new_data_extent(bytenr, len, t, r);
}

/// Write `data` as one new uncompressed regular extent at `file_off` of
/// `ino` (padded with zeros to the sector size): data, checksums, extent
/// item and file extent item. The range must be free of extent items.
/// Returns the bytes the extent adds to nbytes.
pub fn write_extent(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    file_off: u64,
    data: &[u8],
    datasum: bool,
) -> Result<u64> {
    let ss = st.sectorsize() as u64;
    let len = (data.len() as u64).div_ceil(ss) * ss;
    write_new_extent(
        st,
        subvol,
        ino,
        file_off,
        data,
        len,
        BTRFS_COMPRESS_NONE,
        datasum,
        None,
    )
}

/// Write `disk` (compressed with `compression`, padded here to whole
/// sectors) as one new regular extent holding `ram` bytes (a whole number
/// of sectors) at `file_off` of `ino`: data, checksums of the compressed
/// bytes, extent item and file extent item. Returns the bytes the extent
/// adds to nbytes (`ram`).
pub fn write_compressed_extent(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    file_off: u64,
    disk: &[u8],
    ram: u64,
    compression: u8,
) -> Result<u64> {
    write_new_extent(
        st,
        subvol,
        ino,
        file_off,
        disk,
        ram,
        compression,
        true,
        None,
    )
}

/// [`write_extent`] for bytes that are `src`'s at `src_off` (`data`, read
/// for the checksums): the whole sectors share the source's blocks
/// (reflink, [`Store::clone_new_data`]) instead of being written; a
/// partial last sector is written padded, as the source's own last block
/// may hold anything past its end.
#[allow(clippy::too_many_arguments)]
pub fn clone_extent(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    file_off: u64,
    data: &[u8],
    datasum: bool,
    src: &std::fs::File,
    src_off: u64,
) -> Result<u64> {
    let ss = st.sectorsize() as u64;
    let len = (data.len() as u64).div_ceil(ss) * ss;
    write_new_extent(
        st,
        subvol,
        ino,
        file_off,
        data,
        len,
        BTRFS_COMPRESS_NONE,
        datasum,
        Some((src, src_off)),
    )
}

/// The one way a new regular extent is made: `disk` padded with zeros to
/// whole sectors, written (checksummed unless `datasum` is false), its
/// file extent item (`ram` bytes, `compression`) and first reference.
/// `shared`: the whole sectors of `disk` are a source file's at an
/// offset, shared with it rather than written.
#[allow(clippy::too_many_arguments)]
fn write_new_extent(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    file_off: u64,
    disk: &[u8],
    ram: u64,
    compression: u8,
    datasum: bool,
    shared: Option<(&std::fs::File, u64)>,
) -> Result<u64> {
    let ss = st.sectorsize() as u64;
    let whole = disk.len() as u64 / ss * ss;
    let len = (disk.len() as u64).div_ceil(ss) * ss;
    let padded;
    let disk = if disk.len() as u64 == len {
        disk
    } else {
        let mut v = Vec::with_capacity(len as usize);
        v.extend_from_slice(disk);
        v.resize(len as usize, 0);
        padded = v;
        &padded[..]
    };
    let bytenr = match shared {
        None => write_data_extent(st, disk, datasum)?,
        Some((src, src_off)) => {
            if len > MAX_EXTENT_SIZE {
                return Err(Error::Invalid(format!("data extent of {len} bytes")));
            }
            let (bytenr, _) = reserve_data_extent(st, len, len)?;
            if whole > 0 {
                st.data().clone_new_data(bytenr, src, src_off, whole)?;
            }
            if len > whole {
                st.data()
                    .write_new_data(bytenr + whole, &disk[whole as usize..])?;
            }
            if datasum {
                let sums = sector_csums(st, disk);
                st.csums().csum_insert(bytenr, &sums)?;
            }
            bytenr
        }
    };
    let item = FileExtentItem::new(
        BTRFS_FILE_EXTENT_REG,
        st.transid(),
        bytenr,
        len,
        0,
        ram,
        ram,
        compression,
    );
    st.insert_item(
        TreeId::Tree(subvol),
        &extent_key(ino, file_off),
        zerocopy::IntoBytes::as_bytes(&item),
    )?;
    reference_new_extent(
        st,
        bytenr,
        len,
        BackRef::Data {
            root: subvol,
            objectid: ino,
            offset: file_off,
        },
    );
    Ok(ram)
}

/// Store `data` inline at offset 0 (`ram_bytes` uncompressed bytes;
/// `data` compressed with `compression`, or the bytes themselves).
pub fn write_inline(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    ram_bytes: u64,
    compression: u8,
    data: &[u8],
) -> Result<()> {
    let v = encode_inline_extent(st.transid(), ram_bytes, compression, data);
    st.insert_item(TreeId::Tree(subvol), &extent_key(ino, 0), &v)
}

/// An explicit hole item (filesystems without no-holes).
pub fn write_hole(st: &mut Store, subvol: u64, ino: u64, file_off: u64, len: u64) -> Result<()> {
    let t = st.transid();
    insert_disk_extent(st, subvol, ino, file_off, &FileExtentItem::hole(t, len))
}
