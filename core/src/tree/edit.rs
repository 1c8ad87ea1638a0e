//! In-place edits of a tree block buffer in the kernel's layout: a leaf keeps
//! item headers growing up from the header and item data growing down from
//! the end, packed with no gaps (item i's data ends where item i-1's starts);
//! a node keeps key pointers packed after the header. Every function keeps
//! that invariant; callers check free space first (these functions return an
//! error rather than corrupt the block when it does not fit).

use crate::format::header::{Header, Item, KeyPtr, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use crate::format::key::Key;
use crate::{Error, Result};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

fn hdr(buf: &[u8]) -> &Header {
    Header::ref_from_prefix(buf)
        .map(|(h, _)| h)
        .unwrap_or_else(|_| unreachable!()) // OK: blocks are nodesize >= 4096
}
fn hdr_mut(buf: &mut [u8]) -> &mut Header {
    Header::mut_from_prefix(buf)
        .map(|(h, _)| h)
        .unwrap_or_else(|_| unreachable!()) // OK: blocks are nodesize >= 4096
}

/// Number of items (leaf) or key pointers (node), as the header stores it.
pub fn nritems(buf: &[u8]) -> usize {
    hdr(buf).nritems.get() as usize
}
fn set_nritems(buf: &mut [u8], n: usize) {
    hdr_mut(buf).nritems.set(n as u32);
}
/// Level of the block (header `level`): 0 for a leaf.
pub fn level(buf: &[u8]) -> u8 {
    hdr(buf).level
}
/// The tree that created the block (the header's owner).
pub fn owner(buf: &[u8]) -> u64 {
    hdr(buf).owner.get()
}

fn item_at(buf: &[u8], slot: usize) -> Item {
    let o = HEADER_SIZE + slot * ITEM_SIZE;
    // A slice of exactly the item's size always converts.
    Item::read_from_bytes(&buf[o..o + ITEM_SIZE]).unwrap_or_else(|_| Item::new_zeroed())
}
fn set_item_at(buf: &mut [u8], slot: usize, it: &Item) {
    let o = HEADER_SIZE + slot * ITEM_SIZE;
    buf[o..o + ITEM_SIZE].copy_from_slice(it.as_bytes());
}
fn ptr_at(buf: &[u8], slot: usize) -> KeyPtr {
    let o = HEADER_SIZE + slot * KEY_PTR_SIZE;
    // A slice of exactly the pointer's size always converts.
    KeyPtr::read_from_bytes(&buf[o..o + KEY_PTR_SIZE]).unwrap_or_else(|_| KeyPtr::new_zeroed())
}
fn set_ptr_at(buf: &mut [u8], slot: usize, p: &KeyPtr) {
    let o = HEADER_SIZE + slot * KEY_PTR_SIZE;
    buf[o..o + KEY_PTR_SIZE].copy_from_slice(p.as_bytes());
}

/// Bytes after the header available to item headers and data
/// (`BTRFS_LEAF_DATA_SIZE`: nodesize minus the header). Item data offsets are
/// relative to the end of the header, so this is also where the first item's
/// data ends.
pub fn leaf_data_size(buf: &[u8]) -> usize {
    buf.len() - HEADER_SIZE
}

/// Offset (relative to the end of the header) where the packed item data
/// starts: the data of the last item.
fn data_start(buf: &[u8]) -> usize {
    let n = nritems(buf);
    if n == 0 {
        leaf_data_size(buf)
    } else {
        item_at(buf, n - 1).offset.get() as usize
    }
}

/// Bytes used by items (headers and data) in a leaf.
pub fn leaf_used(buf: &[u8]) -> usize {
    let n = nritems(buf);
    n * ITEM_SIZE + (leaf_data_size(buf) - data_start(buf))
}
/// Free bytes in a leaf between the item headers and the item data
/// (`btrfs_leaf_free_space`).
pub fn leaf_free(buf: &[u8]) -> usize {
    leaf_data_size(buf) - leaf_used(buf)
}
/// How many key pointers a node of this size holds
/// (`BTRFS_NODEPTRS_PER_BLOCK`).
pub fn node_capacity(buf: &[u8]) -> usize {
    (buf.len() - HEADER_SIZE) / KEY_PTR_SIZE
}

/// Key of item `slot` of a leaf (the caller checks the level and the slot).
pub fn leaf_key(buf: &[u8], slot: usize) -> Key {
    Key::from(&item_at(buf, slot).key)
}
/// Key of pointer `slot` of a node (the caller checks the level and the slot).
pub fn node_key(buf: &[u8], slot: usize) -> Key {
    Key::from(&ptr_at(buf, slot).key)
}
/// Key of `slot` in a leaf or node, by the block's level.
pub fn key_at(buf: &[u8], slot: usize) -> Key {
    if level(buf) == 0 {
        leaf_key(buf, slot)
    } else {
        node_key(buf, slot)
    }
}
/// Pointer `slot` of a node: (child's logical address, generation the child
/// must carry).
pub fn node_ptr(buf: &[u8], slot: usize) -> (u64, u64) {
    let p = ptr_at(buf, slot);
    (p.blockptr.get(), p.generation.get())
}
/// Size in bytes of the data of leaf item `slot`.
pub fn item_size(buf: &[u8], slot: usize) -> usize {
    item_at(buf, slot).size.get() as usize
}
/// Data of leaf item `slot`. Panics if the item header points outside the
/// buffer; only for blocks already validated or built here.
pub fn item_data(buf: &[u8], slot: usize) -> &[u8] {
    let it = item_at(buf, slot);
    let s = HEADER_SIZE + it.offset.get() as usize;
    &buf[s..s + it.size.get() as usize]
}
/// Mutable data of leaf item `slot`, for in-place updates of a fixed-size
/// item (same bounds contract as [`item_data`]).
pub fn item_data_mut(buf: &mut [u8], slot: usize) -> &mut [u8] {
    let it = item_at(buf, slot);
    let s = HEADER_SIZE + it.offset.get() as usize;
    &mut buf[s..s + it.size.get() as usize]
}

/// Slot of `key` (Ok) or where it would go (Err).
pub fn search(buf: &[u8], key: &Key) -> std::result::Result<usize, usize> {
    // Keys are compared in place (objectid, type, offset as stored), the
    // hottest loop of every tree walk; a block's items or pointers start
    // with their key.
    let stride = if level(buf) == 0 {
        ITEM_SIZE
    } else {
        KEY_PTR_SIZE
    };
    let fits = buf.len().saturating_sub(HEADER_SIZE) / stride;
    let want = (key.objectid, key.ty, key.offset);
    let key_of = |i: usize| {
        let o = HEADER_SIZE + i * stride;
        let b = &buf[o..o + crate::format::key::DISK_KEY_SIZE];
        let le = |x: &[u8]| u64::from_le_bytes(x.try_into().unwrap_or([0; 8]));
        (le(&b[0..8]), b[8], le(&b[9..17]))
    };
    let (mut lo, mut hi) = (0, nritems(buf).min(fits));
    while lo < hi {
        let mid = (lo + hi) / 2;
        match key_of(mid).cmp(&want) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(mid),
        }
    }
    Err(lo)
}

/// Insert an item of `data` at `slot` in a leaf.
pub fn leaf_insert(buf: &mut [u8], slot: usize, key: &Key, data: &[u8]) -> Result<()> {
    let n = nritems(buf);
    if slot > n || leaf_free(buf) < ITEM_SIZE + data.len() {
        return Err(Error::NoSpace(format!(
            "leaf has {} bytes free, item needs {}",
            leaf_free(buf),
            ITEM_SIZE + data.len()
        )));
    }
    let ds = data_start(buf);
    let size = data.len();
    // End of the data of the item currently at `slot` (the new item's data end).
    let end = if slot == 0 {
        leaf_data_size(buf)
    } else {
        item_at(buf, slot - 1).offset.get() as usize
    };
    // Shift data of items slot.. down by `size`.
    buf.copy_within(HEADER_SIZE + ds..HEADER_SIZE + end, HEADER_SIZE + ds - size);
    for i in slot..n {
        let mut it = item_at(buf, i);
        it.offset.set(it.offset.get() - size as u32);
        set_item_at(buf, i, &it);
    }
    // Shift headers up by one slot.
    let hs = HEADER_SIZE + slot * ITEM_SIZE;
    buf.copy_within(hs..HEADER_SIZE + n * ITEM_SIZE, hs + ITEM_SIZE);
    let it = Item {
        key: key.to_disk(),
        offset: ((end - size) as u32).into(),
        size: (size as u32).into(),
    };
    set_item_at(buf, slot, &it);
    buf[HEADER_SIZE + end - size..HEADER_SIZE + end].copy_from_slice(data);
    set_nritems(buf, n + 1);
    Ok(())
}

/// Delete `count` items starting at `slot` from a leaf.
pub fn leaf_delete(buf: &mut [u8], slot: usize, count: usize) {
    let n = nritems(buf);
    if count == 0 || slot + count > n {
        return;
    }
    let ds = data_start(buf);
    let last = item_at(buf, slot + count - 1);
    let end = if slot == 0 {
        leaf_data_size(buf)
    } else {
        item_at(buf, slot - 1).offset.get() as usize
    };
    let removed = end - last.offset.get() as usize;
    // Data of items after the deleted run moves up by `removed`.
    let lo = last.offset.get() as usize;
    buf.copy_within(
        HEADER_SIZE + ds..HEADER_SIZE + lo,
        HEADER_SIZE + ds + removed,
    );
    for i in slot + count..n {
        let mut it = item_at(buf, i);
        it.offset.set(it.offset.get() + removed as u32);
        set_item_at(buf, i, &it);
    }
    let hs = HEADER_SIZE + slot * ITEM_SIZE;
    buf.copy_within(hs + count * ITEM_SIZE..HEADER_SIZE + n * ITEM_SIZE, hs);
    set_nritems(buf, n - count);
    // Keep freed bytes zero so blocks are deterministic.
    let nn = n - count;
    let new_ds = data_start(buf);
    buf[HEADER_SIZE + nn * ITEM_SIZE..HEADER_SIZE + new_ds].fill(0);
}

/// Change the size of item `slot`, keeping its first bytes (truncating or
/// zero-extending at the end), in place: the item's data end stays where
/// it is, so its bytes and those of every later item move by the change.
pub fn leaf_resize(buf: &mut [u8], slot: usize, new_size: usize) -> Result<()> {
    let n = nritems(buf);
    if slot >= n {
        return Err(Error::Invalid(format!(
            "resize of slot {slot} in a leaf of {n} items"
        )));
    }
    let old = item_size(buf, slot);
    if new_size == old {
        return Ok(());
    }
    if new_size > old && leaf_free(buf) < new_size - old {
        return Err(Error::NoSpace(format!(
            "leaf has {} bytes free, resize needs {}",
            leaf_free(buf),
            new_size - old
        )));
    }
    let ds = data_start(buf);
    let off = item_at(buf, slot).offset.get() as usize;
    if new_size > old {
        let grow = new_size - old;
        // [ds, off + old) down by `grow`; the new tail bytes are zero.
        buf.copy_within(
            HEADER_SIZE + ds..HEADER_SIZE + off + old,
            HEADER_SIZE + ds - grow,
        );
        buf[HEADER_SIZE + off + old - grow..HEADER_SIZE + off + old].fill(0);
        for i in slot..n {
            let mut it = item_at(buf, i);
            it.offset.set(it.offset.get() - grow as u32);
            set_item_at(buf, i, &it);
        }
    } else {
        let cut = old - new_size;
        // The first `new_size` bytes and everything below them up by `cut`;
        // the bytes freed at the bottom are zeroed (blocks stay deterministic).
        buf.copy_within(
            HEADER_SIZE + ds..HEADER_SIZE + off + new_size,
            HEADER_SIZE + ds + cut,
        );
        buf[HEADER_SIZE + ds..HEADER_SIZE + ds + cut].fill(0);
        for i in slot..n {
            let mut it = item_at(buf, i);
            it.offset.set(it.offset.get() + cut as u32);
            set_item_at(buf, i, &it);
        }
    }
    let mut it = item_at(buf, slot);
    it.size.set(new_size as u32);
    set_item_at(buf, slot, &it);
    Ok(())
}

/// Replace the key of `slot` (the caller keeps the order).
pub fn set_key(buf: &mut [u8], slot: usize, key: &Key) {
    if level(buf) == 0 {
        let mut it = item_at(buf, slot);
        it.key = key.to_disk();
        set_item_at(buf, slot, &it);
    } else {
        let mut p = ptr_at(buf, slot);
        p.key = key.to_disk();
        set_ptr_at(buf, slot, &p);
    }
}

/// Insert a key pointer to `blockptr` (expected generation `generation`) at
/// `slot` in a node, shifting later pointers right. `NoSpace` when the node is
/// full.
pub fn node_insert(
    buf: &mut [u8],
    slot: usize,
    key: &Key,
    blockptr: u64,
    generation: u64,
) -> Result<()> {
    let n = nritems(buf);
    if n >= node_capacity(buf) || slot > n {
        return Err(Error::NoSpace("node full".into()));
    }
    let hs = HEADER_SIZE + slot * KEY_PTR_SIZE;
    buf.copy_within(hs..HEADER_SIZE + n * KEY_PTR_SIZE, hs + KEY_PTR_SIZE);
    set_ptr_at(
        buf,
        slot,
        &KeyPtr {
            key: key.to_disk(),
            blockptr: blockptr.into(),
            generation: generation.into(),
        },
    );
    set_nritems(buf, n + 1);
    Ok(())
}

/// Point node slot `slot` at a new block and generation, keeping its key (as
/// after COW of the child).
pub fn node_set_ptr(buf: &mut [u8], slot: usize, blockptr: u64, generation: u64) {
    let mut p = ptr_at(buf, slot);
    p.blockptr.set(blockptr);
    p.generation.set(generation);
    set_ptr_at(buf, slot, &p);
}

/// Delete `count` pointers starting at `slot` from a node, zeroing the freed
/// tail. Does nothing if the range is empty or runs past the last pointer.
pub fn node_delete(buf: &mut [u8], slot: usize, count: usize) {
    let n = nritems(buf);
    if count == 0 || slot + count > n {
        return;
    }
    let hs = HEADER_SIZE + slot * KEY_PTR_SIZE;
    buf.copy_within(
        hs + count * KEY_PTR_SIZE..HEADER_SIZE + n * KEY_PTR_SIZE,
        hs,
    );
    let nn = n - count;
    buf[HEADER_SIZE + nn * KEY_PTR_SIZE..HEADER_SIZE + n * KEY_PTR_SIZE].fill(0);
    set_nritems(buf, nn);
}

/// Copy items `[from, to)` of leaf `src` into leaf `dst` at slot `at`, in
/// one move of their headers and one of their data (the keys must keep
/// `dst` sorted). `src` is left as it was.
fn leaf_copy_items(src: &[u8], from: usize, to: usize, dst: &mut [u8], at: usize) -> Result<()> {
    let n = nritems(dst);
    if from >= to || to > nritems(src) || at > n {
        return Ok(());
    }
    let m = to - from;
    // src's items [from, to) hold the data run [lo, hi), packed.
    let hi = if from == 0 {
        leaf_data_size(src)
    } else {
        item_at(src, from - 1).offset.get() as usize
    };
    let lo = item_at(src, to - 1).offset.get() as usize;
    let total = hi - lo;
    if leaf_free(dst) < m * ITEM_SIZE + total {
        return Err(Error::NoSpace(format!(
            "leaf has {} bytes free, {m} items need {}",
            leaf_free(dst),
            m * ITEM_SIZE + total
        )));
    }
    let ds = data_start(dst);
    let end = if at == 0 {
        leaf_data_size(dst)
    } else {
        item_at(dst, at - 1).offset.get() as usize
    };
    // dst's items from `at` on: data down by `total`, headers up by `m`.
    dst.copy_within(
        HEADER_SIZE + ds..HEADER_SIZE + end,
        HEADER_SIZE + ds - total,
    );
    for i in at..n {
        let mut it = item_at(dst, i);
        it.offset.set(it.offset.get() - total as u32);
        set_item_at(dst, i, &it);
    }
    let hs = HEADER_SIZE + at * ITEM_SIZE;
    dst.copy_within(hs..HEADER_SIZE + n * ITEM_SIZE, hs + m * ITEM_SIZE);
    dst[HEADER_SIZE + end - total..HEADER_SIZE + end]
        .copy_from_slice(&src[HEADER_SIZE + lo..HEADER_SIZE + hi]);
    // The run ends at `end` in dst where it ended at `hi` in src.
    for i in 0..m {
        let mut it = item_at(src, from + i);
        let off = it.offset.get() as usize + end - hi;
        it.offset.set(off as u32);
        set_item_at(dst, at + i, &it);
    }
    set_nritems(dst, n + m);
    Ok(())
}

/// Move items `[from..]` of leaf `src` to the end of `dst` (dst's keys
/// must all be smaller). Used by split and merge.
pub fn leaf_move_tail(src: &mut [u8], from: usize, dst: &mut [u8]) -> Result<()> {
    let n = nritems(src);
    let at = nritems(dst);
    leaf_copy_items(src, from, n, dst, at)?;
    leaf_delete(src, from, n.saturating_sub(from));
    Ok(())
}

/// Move the first `count` items of leaf `src` to the end of leaf `dst`.
pub fn leaf_move_head(src: &mut [u8], count: usize, dst: &mut [u8]) -> Result<()> {
    let at = nritems(dst);
    leaf_copy_items(src, 0, count, dst, at)?;
    leaf_delete(src, 0, count);
    Ok(())
}

/// Move items `[from..]` of leaf `src` to the front of leaf `dst` (dst's
/// keys must all be greater).
pub fn leaf_move_tail_to_front(src: &mut [u8], from: usize, dst: &mut [u8]) -> Result<()> {
    let n = nritems(src);
    leaf_copy_items(src, from, n, dst, 0)?;
    leaf_delete(src, from, n.saturating_sub(from));
    Ok(())
}

/// Move pointers `[from..]` of node `src` to the front of node `dst`.
pub fn node_move_tail_to_front(src: &mut [u8], from: usize, dst: &mut [u8]) -> Result<()> {
    let n = nritems(src);
    for i in (from..n).rev() {
        let p = ptr_at(src, i);
        node_insert(
            dst,
            0,
            &Key::from(&p.key),
            p.blockptr.get(),
            p.generation.get(),
        )?;
    }
    node_delete(src, from, n - from);
    Ok(())
}

/// Move pointers `[from..]` of node `src` to the end of node `dst` (dst's keys
/// must all be smaller). Used by node split.
pub fn node_move_tail(src: &mut [u8], from: usize, dst: &mut [u8]) -> Result<()> {
    let n = nritems(src);
    for i in from..n {
        let p = ptr_at(src, i);
        let at = nritems(dst);
        node_insert(
            dst,
            at,
            &Key::from(&p.key),
            p.blockptr.get(),
            p.generation.get(),
        )?;
    }
    node_delete(src, from, n - from);
    Ok(())
}

/// Move the first `count` pointers of node `src` to the end of node `dst`.
pub fn node_move_head(src: &mut [u8], count: usize, dst: &mut [u8]) -> Result<()> {
    for i in 0..count {
        let p = ptr_at(src, i);
        let at = nritems(dst);
        node_insert(
            dst,
            at,
            &Key::from(&p.key),
            p.blockptr.get(),
            p.generation.get(),
        )?;
    }
    node_delete(src, 0, count);
    Ok(())
}

/// Reset a buffer to an empty block with the given header fields.
#[allow(clippy::too_many_arguments)]
pub fn init_block(
    buf: &mut [u8],
    bytenr: u64,
    level: u8,
    owner: u64,
    generation: u64,
    fsid: &[u8; 16],
    chunk_tree_uuid: &[u8; 16],
) {
    buf.fill(0);
    let h = hdr_mut(buf);
    h.fsid = *fsid;
    h.bytenr.set(bytenr);
    h.flags.set(
        (crate::format::consts::BTRFS_MIXED_BACKREF_REV as u64)
            << crate::format::consts::BTRFS_BACKREF_REV_SHIFT,
    );
    h.chunk_tree_uuid = *chunk_tree_uuid;
    h.generation.set(generation);
    h.owner.set(owner);
    h.level = level;
}

/// Stamp a copied block with its new address, generation and owner, and clear
/// the WRITTEN and RELOC header flags: the header half of `btrfs_cow_block`.
pub fn set_header_location(buf: &mut [u8], bytenr: u64, generation: u64, owner: u64) {
    let h = hdr_mut(buf);
    h.bytenr.set(bytenr);
    h.generation.set(generation);
    h.owner.set(owner);
    // A fresh copy has not been written yet; the flag is set at write-out.
    let f = h.flags.get()
        & !(crate::format::consts::BTRFS_HEADER_FLAG_WRITTEN
            | crate::format::consts::BTRFS_HEADER_FLAG_RELOC);
    h.flags.set(f);
}

/// Set `BTRFS_HEADER_FLAG_WRITTEN` in the header, as the kernel does when a
/// block goes to disk: done to every dirty block at write-out, before its
/// checksum is computed.
pub fn mark_written(buf: &mut [u8]) {
    let h = hdr_mut(buf);
    h.flags
        .set(h.flags.get() | crate::format::consts::BTRFS_HEADER_FLAG_WRITTEN);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        init_block(&mut b, 4096, 0, 5, 1, &[1; 16], &[2; 16]);
        b
    }

    fn check(b: &[u8]) {
        let n = nritems(b);
        let mut end = leaf_data_size(b);
        for i in 0..n {
            let it = item_at(b, i);
            assert_eq!(
                it.offset.get() as usize + it.size.get() as usize,
                end,
                "slot {i}"
            );
            end = it.offset.get() as usize;
            if i > 0 {
                assert!(leaf_key(b, i - 1) < leaf_key(b, i));
            }
        }
    }

    #[test]
    fn insert_delete_resize_keep_packing() {
        let mut b = leaf();
        for (i, k) in [5u64, 1, 3, 9, 7].iter().enumerate() {
            let key = Key::new(*k, 1, 0);
            let slot = search(&b, &key).unwrap_err();
            leaf_insert(&mut b, slot, &key, &vec![*k as u8; 10 + i]).unwrap();
            check(&b);
        }
        let keys: Vec<u64> = (0..nritems(&b)).map(|i| leaf_key(&b, i).objectid).collect();
        assert_eq!(keys, vec![1, 3, 5, 7, 9]);
        assert_eq!(item_data(&b, 2), &[5u8; 10][..]);
        leaf_resize(&mut b, 1, 40).unwrap();
        check(&b);
        assert_eq!(&item_data(&b, 1)[..11], &[3u8; 11][..]);
        leaf_delete(&mut b, 1, 2);
        check(&b);
        let keys: Vec<u64> = (0..nritems(&b)).map(|i| leaf_key(&b, i).objectid).collect();
        assert_eq!(keys, vec![1, 7, 9]);
        assert_eq!(item_data(&b, 1), &[7u8; 14][..]);
        let used = leaf_used(&b);
        assert_eq!(used + leaf_free(&b), 4096 - HEADER_SIZE);
        let mut c = leaf();
        leaf_move_tail(&mut b, 1, &mut c).unwrap();
        check(&b);
        check(&c);
        assert_eq!(nritems(&b), 1);
        assert_eq!(leaf_key(&c, 0).objectid, 7);
        // Fill until full: the insert that does not fit is refused intact.
        let mut i = 100;
        loop {
            let at = nritems(&c);
            if leaf_insert(&mut c, at, &Key::new(i, 1, 0), &[0; 100]).is_err() {
                break;
            }
            i += 1;
        }
        check(&c);
        assert!(leaf_free(&c) < ITEM_SIZE + 100);
    }

    fn items(b: &[u8]) -> Vec<(u64, Vec<u8>)> {
        (0..nritems(b))
            .map(|i| (leaf_key(b, i).objectid, item_data(b, i).to_vec()))
            .collect()
    }

    fn filled(keys: std::ops::Range<u64>) -> Vec<u8> {
        let mut b = leaf();
        for k in keys {
            let at = nritems(&b);
            leaf_insert(
                &mut b,
                at,
                &Key::new(k, 1, 0),
                &vec![k as u8; (k % 37) as usize],
            )
            .unwrap();
        }
        b
    }

    #[test]
    fn bulk_moves_match_item_by_item_moves() {
        // Every split point of a leaf, moved to the end, from the head, and
        // to the front of a neighbour that already holds items: the same
        // items in the same order, packed, free bytes zero (blocks stay
        // deterministic).
        let n = nritems(&filled(10..60));
        for from in 0..=n {
            let (mut a, mut b) = (filled(10..60), filled(100..110));
            let want_a: Vec<_> = items(&a)[..from].to_vec();
            let mut want_b = items(&b);
            want_b.splice(0..0, items(&a)[from..].iter().cloned());
            leaf_move_tail_to_front(&mut a, from, &mut b).unwrap();
            check(&a);
            check(&b);
            assert_eq!(
                (items(&a), items(&b)),
                (want_a, want_b),
                "to front from {from}"
            );

            let (mut a, mut c) = (filled(10..60), filled(0..5));
            let mut want_c = items(&c);
            want_c.extend(items(&a)[from..].iter().cloned());
            leaf_move_tail(&mut a, from, &mut c).unwrap();
            check(&c);
            assert_eq!(items(&c), want_c, "tail from {from}");

            let (mut a, mut c) = (filled(10..60), filled(0..5));
            let mut want_c = items(&c);
            want_c.extend(items(&a)[..from].iter().cloned());
            let want_a: Vec<_> = items(&a)[from..].to_vec();
            leaf_move_head(&mut a, from, &mut c).unwrap();
            check(&a);
            check(&c);
            assert_eq!((items(&a), items(&c)), (want_a, want_c), "head {from}");
            for blk in [&a, &c] {
                let free_lo = HEADER_SIZE + nritems(blk) * ITEM_SIZE;
                assert!(blk[free_lo..HEADER_SIZE + data_start(blk)]
                    .iter()
                    .all(|&x| x == 0));
            }
        }
        // A move that does not fit is refused with both leaves intact.
        let (mut a, mut full) = (filled(10..60), filled(100..180));
        let (ia, ifull) = (items(&a), items(&full));
        assert!(leaf_move_tail_to_front(&mut a, 0, &mut full).is_err());
        assert_eq!((items(&a), items(&full)), (ia, ifull));
    }

    #[test]
    fn resize_in_place_matches_delete_and_insert() {
        for slot in [0usize, 7, 20, 49] {
            for new_size in [0usize, 1, 5, 36, 37, 80, 400] {
                let mut a = filled(10..60);
                let mut want = items(&a);
                want[slot].1.resize(new_size, 0);
                leaf_resize(&mut a, slot, new_size).unwrap();
                check(&a);
                assert_eq!(items(&a), want, "slot {slot} to {new_size}");
                let free_lo = HEADER_SIZE + nritems(&a) * ITEM_SIZE;
                assert!(a[free_lo..HEADER_SIZE + data_start(&a)]
                    .iter()
                    .all(|&x| x == 0));
            }
        }
        let mut a = filled(10..60);
        let before = a.clone();
        assert!(leaf_resize(&mut a, 3, 5000).is_err());
        assert!(leaf_resize(&mut a, 50, 1).is_err());
        assert_eq!(a, before);
    }
}
