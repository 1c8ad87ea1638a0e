//! Mending a leaf whose item headers disagree with where its data lies
//! (btrfs check's `fix_item_offset`): the kernel packs item data from the
//! end of the block down, item i's data ending where item i-1's starts, so
//! a damaged offset or size of one item is told by its neighbours. An item
//! is kept when some reading of its header that fits between them gives a
//! body its key's tree checker accepts; otherwise it is dropped (btrfs
//! check deletes it too), and the name and extent checks on the mended leaf
//! say what follows from that. Of the readings that fit, one that leaves
//! no gap to the next item's data is taken first. The result is repacked
//! with no gaps.
//!
//! One function, used by the checker (which walks the mended leaf, so its
//! findings are those of the image repaired) and by the repair (which
//! writes the same leaf through copy-on-write).

use super::edit;
use crate::format::header::{Item, HEADER_SIZE, ITEM_SIZE};
use crate::format::key::Key;
use zerocopy::FromBytes;

/// A leaf mended by [`mend_item_offsets`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mended {
    /// The whole block, packed, header as before.
    pub block: Vec<u8>,
    /// Items whose header was rewritten from where their data lies.
    pub realigned: Vec<Key>,
    /// Items no reading could place, dropped.
    pub dropped: Vec<Key>,
}

/// Mend the item offsets and sizes of leaf `buf`, or None when it needs no
/// mending or cannot be mended without changing its first key (the parent
/// points at it by that key) or leaving it empty. Keys must already be in
/// order; `csum_size` is the filesystem's, for checksum items.
pub fn mend_item_offsets(buf: &[u8], csum_size: usize) -> Option<Mended> {
    if buf.len() <= HEADER_SIZE || edit::level(buf) != 0 {
        return None;
    }
    let data_size = buf.len() - HEADER_SIZE;
    let n = edit::nritems(buf);
    if n == 0 || n.checked_mul(ITEM_SIZE)? > data_size {
        return None;
    }
    let heads_end = n * ITEM_SIZE;
    let data = &buf[HEADER_SIZE..];
    let item = |slot: usize| -> Option<(Key, u64, u64)> {
        let o = HEADER_SIZE + slot * ITEM_SIZE;
        let it = Item::read_from_bytes(buf.get(o..o + ITEM_SIZE)?).ok()?;
        Some((
            Key::from(&it.key),
            it.offset.get() as u64,
            it.size.get() as u64,
        ))
    };
    // A range of the data area that no item header overlaps.
    let fits = |start: u64, len: u64| {
        start >= heads_end as u64
            && start
                .checked_add(len)
                .is_some_and(|e| e <= data_size as u64)
    };
    let mut kept: Vec<(Key, std::ops::Range<usize>)> = Vec::with_capacity(n);
    let (mut realigned, mut dropped) = (Vec::new(), Vec::new());
    // Where the data of the previous kept item starts: this one's must end
    // there or lower.
    let mut end = data_size as u64;
    for slot in 0..n {
        let (key, off, size) = item(slot)?;
        if off.checked_add(size) == Some(end) && fits(off, size) {
            kept.push((key, off as usize..(off + size) as usize));
            end = off;
            continue;
        }
        // Where the next item's data ends, if its header is sound: this
        // item's data lies between that and `end`.
        let next_end = (slot + 1 < n)
            .then(|| item(slot + 1))
            .flatten()
            .and_then(|(_, o, s)| o.checked_add(s).filter(|&e| fits(o, s) && e <= end));
        let mut readings = Vec::with_capacity(4);
        // The offset damaged: the size stands, the data ends at `end`.
        if let Some(s) = end.checked_sub(size) {
            readings.push((s, size));
        }
        // The size damaged: the offset stands.
        if off < end {
            readings.push((off, end - off));
        }
        // Both: the data fills the gap to the next item.
        if let Some(ne) = next_end {
            readings.push((ne, end - ne));
        }
        // Neither: the data is where the header says, below a gap.
        if off.checked_add(size).is_some_and(|e| e < end) {
            readings.push((off, size));
        }
        // A reading whose data ends where the next item's begins leaves no
        // gap below it: the one that explains the most (a block of items
        // moved together keeps its headers consistent with its data, as
        // btrfs-corrupt-block's shift_items leaves them).
        // Among those, one whose body is exactly as long as it says (an
        // uncompressed inline extent's ram_bytes) before one that merely
        // parses: a gap read into an item's data is caught there.
        readings.sort_by_key(|&(s, l)| {
            let snug = fits(s, l) && snug(&key, &data[s as usize..(s + l) as usize]);
            (next_end.is_some_and(|ne| s != ne), !snug)
        });
        let place = readings.into_iter().find(|&(s, l)| {
            fits(s, l)
                && next_end.is_none_or(|ne| s >= ne)
                && crate::format::item::check(&key, &data[s as usize..(s + l) as usize], csum_size)
                    .is_ok()
        });
        match place {
            Some((s, l)) => {
                kept.push((key, s as usize..(s + l) as usize));
                realigned.push(key);
                end = s;
            }
            None => dropped.push(key),
        }
    }
    if realigned.is_empty() && dropped.is_empty() {
        return None;
    }
    if kept.first().map(|(k, _)| *k) != item(0).map(|(k, _, _)| k) {
        return None;
    }
    let mut block = buf[..HEADER_SIZE].to_vec();
    block.resize(buf.len(), 0);
    let hdr = crate::format::header::Header::mut_from_prefix(&mut block)
        .ok()?
        .0;
    hdr.nritems.set(0);
    for (slot, (key, r)) in kept.iter().enumerate() {
        edit::leaf_insert(&mut block, slot, key, &data[r.clone()]).ok()?;
    }
    Some(Mended {
        block,
        realigned,
        dropped,
    })
}

/// Whether an item body is exactly as long as its own fields say, where
/// they say it: an uncompressed inline file extent holds ram_bytes bytes;
/// every name of a DIR_ITEM or XATTR_ITEM hashes to the key (a body
/// read too long takes in the names of items that lay beyond it); a
/// DIR_INDEX holds one name. Other items are as long as they parse (the
/// tree checker's rule).
fn snug(key: &Key, body: &[u8]) -> bool {
    use crate::format::consts::*;
    use crate::format::file_extent::{FileExtentHead, FILE_EXTENT_INLINE_DATA_START};
    match key.ty {
        BTRFS_DIR_ITEM_KEY | BTRFS_XATTR_ITEM_KEY => {
            return crate::format::dir::parse_dir_items(body).is_ok_and(|v| {
                v.iter()
                    .all(|e| crate::format::dir::name_hash(e.name) == key.offset)
            })
        }
        BTRFS_DIR_INDEX_KEY => {
            return crate::format::dir::parse_dir_items(body).is_ok_and(|v| v.len() == 1)
        }
        BTRFS_EXTENT_DATA_KEY => {}
        _ => return true,
    }
    let Ok((head, _)) = FileExtentHead::read_from_prefix(body) else {
        return false;
    };
    if head.type_ != BTRFS_FILE_EXTENT_INLINE || head.compression != BTRFS_COMPRESS_NONE {
        return true;
    }
    (body.len() - FILE_EXTENT_INLINE_DATA_START.min(body.len())) as u64 == head.ram_bytes.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::consts::*;
    use crate::format::header::Header;

    const NS: usize = 4096;

    fn dir_index(name: &[u8], ino: u64) -> Vec<u8> {
        let mut d = vec![0u8; 30 + name.len()];
        d[0..8].copy_from_slice(&ino.to_le_bytes());
        d[8] = BTRFS_INODE_ITEM_KEY;
        d[17..25].copy_from_slice(&7u64.to_le_bytes());
        d[27..29].copy_from_slice(&(name.len() as u16).to_le_bytes());
        d[29] = BTRFS_FT_REG_FILE;
        d[30..].copy_from_slice(name);
        d
    }

    fn leaf(items: &[(Key, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; NS];
        let h = Header::mut_from_prefix(&mut b).unwrap().0;
        h.bytenr.set(1 << 20);
        h.owner.set(5);
        h.generation.set(7);
        for (i, (k, d)) in items.iter().enumerate() {
            edit::leaf_insert(&mut b, i, k, d).unwrap();
        }
        b
    }

    fn set_item(b: &mut [u8], slot: usize, off: Option<u32>, size: Option<u32>) {
        let o = HEADER_SIZE + slot * ITEM_SIZE;
        let it = Item::mut_from_bytes(&mut b[o..o + ITEM_SIZE]).unwrap();
        if let Some(v) = off {
            it.offset.set(v);
        }
        if let Some(v) = size {
            it.size.set(v);
        }
    }

    /// Where item `slot`'s data starts in the block.
    fn data_pos(b: &[u8], slot: usize) -> usize {
        let o = HEADER_SIZE + slot * ITEM_SIZE;
        HEADER_SIZE
            + Item::read_from_bytes(&b[o..o + ITEM_SIZE])
                .unwrap()
                .offset
                .get() as usize
    }

    fn items() -> Vec<(Key, Vec<u8>)> {
        (0..6u64)
            .map(|i| {
                (
                    Key::new(256, BTRFS_DIR_INDEX_KEY, 2 + i),
                    dir_index(format!("file-{i}").as_bytes(), 257 + i),
                )
            })
            .collect()
    }

    #[test]
    fn a_sound_leaf_needs_nothing() {
        assert_eq!(mend_item_offsets(&leaf(&items()), 4), None);
    }

    #[test]
    fn a_damaged_offset_or_size_is_read_from_the_neighbours() {
        let good = leaf(&items());
        for (off, size) in [
            (Some(755_944_791), None),
            (None, Some(9999)),
            (None, Some(3)),
            (Some(1), Some(2)),
        ] {
            let mut b = good.clone();
            set_item(&mut b, 3, off, size);
            let m = mend_item_offsets(&b, 4).expect("mended");
            assert_eq!(m.block, good, "{off:?} {size:?}");
            assert_eq!(m.realigned, vec![items()[3].0]);
            assert!(m.dropped.is_empty());
        }
        // The last item: only the previous item bounds it.
        let mut b = good.clone();
        set_item(&mut b, 5, Some(12), None);
        assert_eq!(mend_item_offsets(&b, 4).expect("mended").block, good);
    }

    /// btrfs-corrupt-block's shift_items: the data of the second half of
    /// the items moved down together with their offsets, leaving a gap.
    /// Every header still matches its data: the leaf is closed up again,
    /// nothing read anywhere else (fsck-tests 003).
    #[test]
    fn items_moved_with_their_offsets_are_closed_up() {
        let good = leaf(&items());
        let n = items().len();
        let shift = 40usize;
        let mut b = good.clone();
        let (slot, last) = (n / 2, n - 1);
        let (from, to) = (data_pos(&good, last), data_pos(&good, slot - 1));
        b.copy_within(from..to, from - shift);
        for i in slot..n {
            let o = (data_pos(&good, i) - HEADER_SIZE - shift) as u32;
            set_item(&mut b, i, Some(o), None);
        }
        let m = mend_item_offsets(&b, 4).expect("mended");
        assert_eq!(m.block, good);
        assert!(m.dropped.is_empty());
        // Read where its header says: the first moved item, and the rest
        // follow it as they are.
        assert_eq!(m.realigned, vec![items()[slot].0]);
    }

    #[test]
    fn an_item_no_reading_places_is_dropped_and_the_rest_repacked() {
        let good = leaf(&items());
        let mut b = good.clone();
        // Its body destroyed as well: no reading passes the tree checker.
        set_item(&mut b, 2, Some(700_000), None);
        b[data_pos(&good, 2) + 27] = 0xff;
        let m = mend_item_offsets(&b, 4).expect("mended");
        assert_eq!(m.dropped, vec![items()[2].0]);
        let mut want = items();
        want.remove(2);
        assert_eq!(m.block, leaf(&want));
    }

    #[test]
    fn the_first_item_is_never_dropped() {
        let mut b = leaf(&items());
        let d = data_pos(&b, 0);
        set_item(&mut b, 0, Some(700_000), Some(1));
        b[d + 27] = 0xff;
        assert_eq!(mend_item_offsets(&b, 4), None);
    }
}
