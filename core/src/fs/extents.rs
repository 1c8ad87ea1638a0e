//! File extent items: the map from file offsets to data (inline bytes,
//! regular or preallocated disk extents, holes), and the one rule for
//! dropping a range of it (`drop_extents`), which truncate, punch, writes,
//! clones and log replay all use.

use crate::format::consts::*;
use crate::format::file_extent::{
    parse_file_extent, FileExtent, FileExtentItem, FILE_EXTENT_INLINE_DATA_START,
};
use crate::format::key::Key;
use crate::trans::delayed::BackRef;
use crate::trans::{Store, TreeId};
use crate::Result;
use zerocopy::IntoBytes;

/// Default `max_inline` mount option.
pub const MAX_INLINE: u64 = 2048;
/// Largest data extent the kernel creates for uncompressed writes.
pub const MAX_EXTENT_SIZE: u64 = 128 << 20;
/// Largest compressed extent (uncompressed bytes).
pub const MAX_COMPRESSED: u64 = 128 << 10;

/// Key of the EXTENT_DATA item of `ino` at file offset `off` (bytes).
pub fn extent_key(ino: u64, off: u64) -> Key {
    Key::new(ino, BTRFS_EXTENT_DATA_KEY, off)
}

/// Largest inline data a leaf holds (BTRFS_MAX_INLINE_DATA_SIZE).
pub fn max_inline_data(st: &Store) -> u64 {
    crate::format::file_extent::max_inline_data_size(st.nodesize())
}

/// Whether a whole file of `size` bytes is stored inline uncompressed:
/// fewer bytes than a block, at most `max_inline` (capped to a block) and
/// what a leaf holds.
pub fn can_inline(st: &Store, size: u64, len: u64, max_inline: u64) -> bool {
    len == size && size > 0 && size <= inline_cap(st, max_inline)
}

/// The most bytes [`can_inline`] stores inline (what a reader thread
/// without the store decides by).
pub fn inline_cap(st: &Store, max_inline: u64) -> u64 {
    let ss = st.sectorsize() as u64;
    (ss - 1).min(max_inline.min(ss)).min(max_inline_data(st))
}

/// File range `[start, end)` an extent item at `off` covers (inline items
/// reach the end of their sector).
pub fn extent_span(ss: u64, off: u64, d: &[u8]) -> Option<(u64, u64)> {
    match parse_file_extent(d).ok()? {
        FileExtent::Inline { head, .. } => Some((
            off,
            head.ram_bytes
                .get()
                .div_ceil(ss)
                .checked_mul(ss)
                .and_then(|n| off.checked_add(n))?,
        )),
        FileExtent::Disk { item, .. } => Some((off, off.checked_add(item.num_bytes.get())?)),
    }
}

/// What one extent item adds to the inode's nbytes.
pub fn nbytes_of(d: &[u8]) -> u64 {
    match parse_file_extent(d) {
        Ok(FileExtent::Inline { head, .. }) => head.ram_bytes.get(),
        Ok(FileExtent::Disk { item, .. }) if item.disk_bytenr.get() != 0 => item.num_bytes.get(),
        _ => 0,
    }
}

/// The back reference a disk extent item holds.
pub fn data_backref(subvol: u64, ino: u64, key_off: u64, item: &FileExtentItem) -> BackRef {
    BackRef::Data {
        root: subvol,
        objectid: ino,
        offset: key_off.wrapping_sub(item.offset.get()),
    }
}

/// Every extent item of an inode whose range meets `[start, end)`.
pub fn extents_in(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Vec<(Key, Vec<u8>)>> {
    extents_in_tree(st, TreeId::Tree(subvol), ino, start, end)
}

/// [`extents_in`] of any tree holding file extent items (a log tree too).
pub fn extents_in_tree(
    st: &mut Store,
    t: TreeId,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Vec<(Key, Vec<u8>)>> {
    let ss = st.sectorsize() as u64;
    let mut items = Vec::new();
    // The last item that starts before `end` first: when it starts at or
    // before `start` it is the only one that can reach into the range (a
    // new file's writeback finds none, in one search).
    if end > start {
        match st.prev_item(t, &extent_key(ino, end - 1), &extent_key(ino, 0))? {
            None => return Ok(items),
            Some((k, d)) if k.offset <= start => {
                if extent_span(ss, k.offset, &d).is_some_and(|(s, e)| e > start && s < end) {
                    items.push((k, d));
                }
                return Ok(items);
            }
            Some(_) => {}
        }
    }
    if let Some(p) = st.prev_item(t, &extent_key(ino, start), &extent_key(ino, 0))? {
        items.push(p);
    }
    if start < u64::MAX && end > start.saturating_add(1) {
        for it in st.items_in(
            t,
            extent_key(ino, start.saturating_add(1)),
            extent_key(ino, end - 1),
        )? {
            items.push(it);
        }
    }
    items.retain(|(k, d)| extent_span(ss, k.offset, d).is_some_and(|(s, e)| e > start && s < end));
    Ok(items)
}

/// What [`drop_extents`] did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dropped {
    /// Whether any file extent item was deleted, trimmed or split.
    pub changed: bool,
    /// Bytes the inode's nbytes loses.
    pub nbytes: u64,
}

/// Remove the file data of `ino` in `[start, end)`: items inside go,
/// items crossing an edge are trimmed or split (a split disk extent gains a
/// reference; a removed one loses its reference, queued). An inline extent
/// keeps its bytes before `start` (uncompressed), or stays whole when
/// compressed (the kernel never cuts one). Holes are not filled here.
pub fn drop_extents(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Dropped> {
    drop_extents_in(st, TreeId::Tree(subvol), ino, start, end)
}

/// [`drop_extents`] in any tree: a subvolume's (references change with
/// the items) or a log tree (its items hold no references).
pub fn drop_extents_in(
    st: &mut Store,
    t: TreeId,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Dropped> {
    let refs = match t {
        TreeId::Tree(s) => Some(s),
        _ => None,
    };
    let ss = st.sectorsize() as u64;
    let mut out = Dropped::default();
    if start >= end {
        return Ok(out);
    }
    for (k, d) in extents_in_tree(st, t, ino, start, end)? {
        let Some((s, e)) = extent_span(ss, k.offset, &d) else {
            continue;
        };
        match parse_file_extent(&d).map_err(|e| e.at(0, k))? {
            FileExtent::Inline { head, data } => {
                if start <= s {
                    st.delete_item(t, &k)?;
                    out.nbytes += head.ram_bytes.get();
                    out.changed = true;
                } else if head.compression == 0 && ((start - s) as usize) < data.len() {
                    let keep = (start - s) as usize;
                    let mut nd = d[..FILE_EXTENT_INLINE_DATA_START].to_vec();
                    nd[8..16].copy_from_slice(&(keep as u64).to_le_bytes());
                    nd.extend_from_slice(&data[..keep]);
                    st.update_item(t, &k, &nd)?;
                    out.nbytes += head.ram_bytes.get() - keep as u64;
                    out.changed = true;
                }
            }
            FileExtent::Disk { item, .. } => {
                let fe = *item;
                out.changed = true;
                let bytenr = fe.disk_bytenr.get();
                let keep_left = s < start;
                let keep_right = e > end;
                let (cut_s, cut_e) = (s.max(start), e.min(end));
                if bytenr != 0 {
                    out.nbytes += cut_e - cut_s;
                }
                if keep_left {
                    let mut l = fe;
                    l.num_bytes.set(start - s);
                    st.update_item(t, &k, l.as_bytes())?;
                } else {
                    st.delete_item(t, &k)?;
                }
                if keep_right {
                    let mut r = fe;
                    r.offset.set(fe.offset.get() + (end - s));
                    r.num_bytes.set(e - end);
                    st.insert_item(t, &extent_key(ino, end), r.as_bytes())?;
                }
                if let (true, Some(subvol)) = (bytenr != 0, refs) {
                    // Both pieces carry the same back reference (key offset
                    // minus extent offset does not change).
                    let r = data_backref(subvol, ino, k.offset, &fe);
                    match (keep_left, keep_right) {
                        (true, true) => {
                            st.extent_refs()
                                .queue_data_ref(bytenr, fe.disk_num_bytes.get(), r, 1)
                        }
                        (false, false) => {
                            st.extent_refs()
                                .queue_data_ref(bytenr, fe.disk_num_bytes.get(), r, -1)
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Insert a disk extent item (regular, prealloc or hole) at `off` and the
/// reference it holds. The range must be free of items.
pub fn insert_disk_extent(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    off: u64,
    item: &FileExtentItem,
) -> Result<()> {
    st.insert_item(TreeId::Tree(subvol), &extent_key(ino, off), item.as_bytes())?;
    let b = item.disk_bytenr.get();
    if b != 0 {
        st.extent_refs().queue_data_ref(
            b,
            item.disk_num_bytes.get(),
            data_backref(subvol, ino, off, item),
            1,
        );
    }
    Ok(())
}

/// Cover `[start, end)` with a hole item (filesystems without no-holes
/// must have no gap in a file's extents), extending a hole item that ends
/// at `start` instead of adding one, as the kernel's fill_holes does.
pub fn fill_hole(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    start: u64,
    end: u64,
    transid: u64,
) -> Result<()> {
    if start >= end {
        return Ok(());
    }
    let t = TreeId::Tree(subvol);
    if start > 0 {
        if let Some((k, d)) = st.prev_item(t, &extent_key(ino, start - 1), &extent_key(ino, 0))? {
            if let Ok(FileExtent::Disk { head, item }) = parse_file_extent(&d) {
                if item.disk_bytenr.get() == 0
                    && head.type_ == BTRFS_FILE_EXTENT_REG
                    && k.offset + item.num_bytes.get() == start
                {
                    // The grown hole starts at the item's key: a hole
                    // split earlier may carry an offset, which would put
                    // offset + num_bytes past ram_bytes.
                    let mut n = *item;
                    n.num_bytes.set(end - k.offset);
                    n.ram_bytes.set(end - k.offset);
                    n.offset.set(0);
                    n.generation.set(transid);
                    return st.update_item(t, &k, n.as_bytes());
                }
            }
        }
    }
    st.insert_item(
        t,
        &extent_key(ino, start),
        FileExtentItem::hole(transid, end - start).as_bytes(),
    )
}

/// Recount an inode's nbytes from its extent items.
pub fn count_nbytes(st: &mut Store, subvol: u64, ino: u64) -> Result<u64> {
    Ok(st
        .items_in(
            TreeId::Tree(subvol),
            extent_key(ino, 0),
            extent_key(ino, u64::MAX),
        )?
        .iter()
        .map(|(_, d)| nbytes_of(d))
        .sum())
}

/// Remove every item of inode `ino`, dropping its extents' references
/// (the inode is gone: unlinked and closed, or orphan cleanup).
pub fn drop_inode_items(st: &mut Store, subvol: u64, ino: u64) -> Result<()> {
    let t = TreeId::Tree(subvol);
    let items = st.items_in(t, Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))?;
    for (k, d) in items {
        st.delete_item(t, &k)?;
        if k.ty == BTRFS_EXTENT_DATA_KEY {
            if let Ok(FileExtent::Disk { item, .. }) = parse_file_extent(&d) {
                let b = item.disk_bytenr.get();
                if b != 0 {
                    st.extent_refs().queue_data_ref(
                        b,
                        item.disk_num_bytes.get(),
                        data_backref(subvol, ino, k.offset, item),
                        -1,
                    );
                }
            }
        }
    }
    Ok(())
}
