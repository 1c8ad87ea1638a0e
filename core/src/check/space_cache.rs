//! Phase 5, free space cache (v1): the cache inodes of the root tree and,
//! where the caches are current, their contents against the extent tree.
//!
//! What the kernel does with a cache decides what is damage. A cache it
//! would not load (generation of the inode and the header differ, a page
//! checksum fails, an entry is empty or duplicated, its file extents are
//! not plain written extents) is thrown away and rebuilt: a warning. A
//! cache it would load must say exactly what the extent tree says is free
//! (less the superblock copies); one that claims more free space than the
//! block group has could hand out used space twice: an error.

use super::findings::{Category, Phase, Repair, F};
use super::Ctx;
use crate::format::consts::*;
use crate::format::file_extent::FileExtent;
use crate::format::free_space::*;
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::tree::Node;
use zerocopy::FromBytes;

const P: Phase = Phase::FreeSpace;
const ROOT: u64 = BTRFS_ROOT_TREE_OBJECTID;
/// Largest cache file read (the kernel writes about 32 KiB per GiB).
const MAX_CACHE_FILE: u64 = 64 << 20;

#[derive(Clone, Copy, Debug)]
struct CacheInode {
    ino: u64,
    key: Key,
    leaf: u64,
    mode: u32,
    generation: u64,
    size: u64,
    flags: u64,
}

#[derive(Clone, Copy, Debug)]
struct CacheExtent {
    ino: u64,
    file_off: u64,
    disk: u64,
    offset: u64,
    num_bytes: u64,
    regular: bool,
}

#[derive(Clone, Copy, Debug)]
struct Header {
    bg_start: u64,
    key: Key,
    ino: u64,
    generation: u64,
    entries: u64,
    bitmaps: u64,
}

#[derive(Default)]
pub(crate) struct Facts {
    inodes: Vec<CacheInode>,
    extents: Vec<CacheExtent>,
    headers: Vec<Header>,
}

/// Root tree leaf: free space headers, and the inodes (and their file
/// extents) that hold the caches.
pub(super) fn on_root_leaf(cx: &mut Ctx, node: &Node) {
    for slot in 0..node.nr_safe() {
        let (Some(k), Ok(d)) = (node.key(slot), node.item_data(slot)) else {
            continue;
        };
        if k.objectid == BTRFS_FREE_SPACE_OBJECTID && k.ty == 0 {
            match FreeSpaceHeader::read_from_bytes(d) {
                Ok(h) => cx.space_cache.headers.push(Header {
                    bg_start: k.offset,
                    key: k,
                    ino: h.location.objectid.get(),
                    generation: h.generation.get(),
                    entries: h.num_entries.get(),
                    bitmaps: h.num_bitmaps.get(),
                }),
                Err(_) => cx.report(
                    F::err(P, Category::SpaceCache)
                        .fix(Repair::ClearSpaceCache)
                        .tree(ROOT)
                        .at(node.bytenr)
                        .key(k)
                        .msg(format!(
                            "free space header item of {} bytes, want {}",
                            d.len(),
                            std::mem::size_of::<FreeSpaceHeader>()
                        )),
                ),
            }
            continue;
        }
        if !(BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&k.objectid) {
            continue;
        }
        match (k.ty, decode(&k, d, 0)) {
            (BTRFS_INODE_ITEM_KEY, Ok(ItemBody::InodeItem(ii))) => {
                cx.space_cache.inodes.push(CacheInode {
                    ino: k.objectid,
                    key: k,
                    leaf: node.bytenr,
                    mode: ii.mode.get(),
                    generation: ii.generation.get(),
                    size: ii.size.get(),
                    flags: ii.flags.get(),
                })
            }
            (BTRFS_EXTENT_DATA_KEY, Ok(ItemBody::FileExtent(fe))) => {
                let e = match fe {
                    FileExtent::Disk { head, item } => CacheExtent {
                        ino: k.objectid,
                        file_off: k.offset,
                        disk: item.disk_bytenr.get(),
                        offset: item.offset.get(),
                        num_bytes: item.num_bytes.get(),
                        regular: head.type_ == BTRFS_FILE_EXTENT_REG
                            && head.compression == 0
                            && item.disk_bytenr.get() != 0,
                    },
                    FileExtent::Inline { .. } => CacheExtent {
                        ino: k.objectid,
                        file_off: k.offset,
                        disk: 0,
                        offset: 0,
                        num_bytes: 0,
                        regular: false,
                    },
                };
                cx.space_cache.extents.push(e);
            }
            _ => {}
        }
    }
}

pub(super) fn check(cx: &mut Ctx) {
    let facts = std::mem::take(&mut cx.space_cache);
    // Every inode of the root tree is a cache inode (btrfs check looks at
    // their mode only: they have no names).
    for i in &facts.inodes {
        if i.mode != FREE_SPACE_CACHE_INODE_MODE {
            cx.report(
                F::err(P, Category::SpaceCache)
                    .fix(Repair::ClearSpaceCache)
                    .tree(ROOT)
                    .at(i.leaf)
                    .key(i.key)
                    .msg(format!(
                        "free space cache inode {} has mode 0{:o}, want 0{:o}",
                        i.ino, i.mode, FREE_SPACE_CACHE_INODE_MODE
                    )),
            );
        }
        if i.flags & (BTRFS_INODE_NODATASUM | BTRFS_INODE_NODATACOW)
            != (BTRFS_INODE_NODATASUM | BTRFS_INODE_NODATACOW)
        {
            cx.report(F::warn(P, Category::SpaceCache).tree(ROOT).at(i.leaf).key(i.key).msg(format!(
                "free space cache inode {} flags 0x{:x} lack nodatasum/nodatacow (an old-style cache inode the kernel converts)",
                i.ino, i.flags
            )));
        }
    }
    cx.sink.checked(P, facts.inodes.len() as u64);
    let sb = &cx.img.sb;
    let (gen, cache_gen) = (sb.generation.get(), sb.cache_generation.get());
    // As the kernel and btrfs check: with the free space tree the v1 cache
    // is not used, and caches older than the superblock are rebuilt.
    if sb.has_compat_ro(BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE)
        || !cx.chunks.bg_loaded
        || !cx.ext.loaded
    {
        return;
    }
    if cache_gen != u64::MAX && cache_gen != 0 && cache_gen != gen {
        if !facts.headers.is_empty() {
            cx.report(F::warn(P, Category::SpaceCache).tree(ROOT).msg(format!(
                "free space cache generation {cache_gen} differs from the filesystem's {gen}: the caches will be rebuilt"
            )));
        }
        return;
    }
    let bgs = cx.chunks.block_groups.clone();
    for h in &facts.headers {
        if !bgs.iter().any(|b| b.start == h.bg_start) {
            cx.report(
                F::warn(P, Category::SpaceCache)
                    .tree(ROOT)
                    .key(h.key)
                    .msg(format!(
                        "free space cache for {}, which is no block group",
                        h.bg_start
                    )),
            );
        }
    }
    for b in &bgs {
        let Some(h) = facts.headers.iter().find(|h| h.bg_start == b.start) else {
            continue;
        };
        let free = match load(cx, &facts, h) {
            Load::Skip => continue,
            Load::Ignored(why) => {
                cx.report(F::warn(P, Category::SpaceCache).tree(ROOT).at(b.start).key(h.key).msg(format!(
                    "free space cache of block group {} is ignored by the kernel and rebuilt: {why}",
                    b.start
                )));
                continue;
            }
            Load::Loaded(free) => free,
        };
        let (s, e) = (b.start, b.end());
        let excl = super::free_space::excluded(cx, s, e);
        let bytes_super: u64 =
            crate::check::csums::union_of(excl.iter().map(|&(a, z)| (a, z - a)).collect())
                .iter()
                .map(|&(a, z)| z - a)
                .sum();
        let bg_free = b.length.saturating_sub(b.used).saturating_sub(bytes_super);
        let cached: u64 = free.iter().map(|&(a, z)| z - a).sum();
        if cached > bg_free {
            cx.report(F::err(P, Category::SpaceCache).fix(Repair::ClearSpaceCache).tree(ROOT).at(b.start).key(h.key).msg(format!(
                "free space cache of block group {} holds {cached} free bytes but the group has {bg_free}: space in use could be handed out again",
                b.start
            )));
            continue;
        }
        if cached < bg_free {
            cx.report(F::warn(P, Category::SpaceCache).tree(ROOT).at(b.start).key(h.key).msg(format!(
                "free space cache of block group {} holds {cached} free bytes but the group has {bg_free}: the kernel ignores it",
                b.start
            )));
            continue;
        }
        let want = super::free_space::gaps(cx, s, e);
        if let Some((a, z)) = super::free_space::first_difference(&want, &free, &excl) {
            let in_cache = free.iter().any(|&(fs, fe)| fs < z && a < fe);
            cx.report(F::err(P, Category::SpaceCache).fix(Repair::ClearSpaceCache).tree(ROOT).at(a).key(h.key).msg(format!(
                "free space cache of block group {}: [{a}, {z}) is {} in the cache but {} in the extent tree",
                b.start,
                if in_cache { "free" } else { "not free" },
                if in_cache { "allocated" } else { "unallocated" },
            )));
        }
    }
}

enum Load {
    /// No cache to check (never written, or empty).
    Skip,
    /// A cache the kernel would refuse to load.
    Ignored(String),
    /// Free ranges [start, end), sorted and merged.
    Loaded(Vec<(u64, u64)>),
}

fn load(cx: &Ctx, facts: &Facts, h: &Header) -> Load {
    let Some(inode) = facts.inodes.iter().find(|i| i.ino == h.ino) else {
        return Load::Ignored(format!("its inode {} does not exist", h.ino));
    };
    if inode.size == 0 || inode.generation == 0 {
        return Load::Skip;
    }
    if inode.generation != h.generation {
        return Load::Ignored(format!(
            "inode generation {} differs from the header's {}",
            inode.generation, h.generation
        ));
    }
    if h.entries == 0 {
        return Load::Skip;
    }
    if inode.size > MAX_CACHE_FILE {
        return Load::Ignored(format!("cache file of {} bytes", inode.size));
    }
    let ss = cx.img.sectorsize as u64;
    let size = inode.size as usize;
    let mut data = vec![0u8; size];
    let mut filled = 0u64;
    let mut exts: Vec<&CacheExtent> = facts.extents.iter().filter(|e| e.ino == h.ino).collect();
    exts.sort_by_key(|e| e.file_off);
    for e in exts {
        if filled >= inode.size {
            break;
        }
        if !e.regular || e.file_off != filled {
            return Load::Ignored(format!(
                "file extent at {} is not a written extent continuing the file",
                e.file_off
            ));
        }
        let len = e.num_bytes.min(inode.size - filled) as usize;
        let at = filled as usize;
        if cx
            .img
            .read_logical(e.disk.saturating_add(e.offset), &mut data[at..at + len])
            .is_err()
        {
            return Load::Ignored(format!(
                "its data at {} cannot be read",
                e.disk.saturating_add(e.offset)
            ));
        }
        filled = filled.saturating_add(e.num_bytes);
    }
    if filled < inode.size {
        return Load::Ignored(format!(
            "file extents cover {filled} of its {} bytes",
            inode.size
        ));
    }
    match parse(&data, ss as usize, h.generation, h.entries, h.bitmaps) {
        Ok(free) => Load::Loaded(free),
        Err(why) => Load::Ignored(why),
    }
}

/// The cache file's free ranges, as the kernel reads them.
fn parse(
    data: &[u8],
    page: usize,
    generation: u64,
    entries: u64,
    bitmaps: u64,
) -> Result<Vec<(u64, u64)>, String> {
    let pages = data.len().div_ceil(page);
    let crc_area = 4 * pages;
    let entry_size = std::mem::size_of::<FreeSpaceEntry>();
    if crc_area + 8 + entry_size > page {
        return Err(format!(
            "{pages} pages do not leave room for entries in the first"
        ));
    }
    let page_ok = |i: usize| -> bool {
        let (s, e) = (i * page, ((i + 1) * page).min(data.len()));
        let skip = if i == 0 { crc_area } else { 0 };
        let stored = u32::from_le_bytes(data[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]));
        e - s == page && crc32c::crc32c(&data[s + skip..e]) == stored
    };
    if !page_ok(0) {
        return Err("page 0 checksum mismatch".into());
    }
    let gen = u64::from_le_bytes(data[crc_area..crc_area + 8].try_into().unwrap_or([0; 8]));
    if gen != generation {
        return Err(format!(
            "generation {gen} in the file, {generation} in the header"
        ));
    }
    let mut idx = 0usize;
    let mut pos = crc_area + 8;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut bitmap_starts = Vec::new();
    for _ in 0..entries {
        if pos + entry_size > (idx + 1) * page {
            idx += 1;
            if idx >= pages || !page_ok(idx) {
                return Err(format!(
                    "entry page {idx} missing or its checksum mismatches"
                ));
            }
            pos = idx * page;
        }
        let Ok(e) = FreeSpaceEntry::read_from_bytes(&data[pos..pos + entry_size]) else {
            return Err("entry unreadable".into());
        };
        pos += entry_size;
        let (off, bytes) = (e.offset.get(), e.bytes.get());
        if bytes == 0 {
            return Err(format!("empty entry at {off}"));
        }
        match e.type_ {
            BTRFS_FREE_SPACE_EXTENT => ranges.push((off, off.saturating_add(bytes))),
            BTRFS_FREE_SPACE_BITMAP => {
                if bitmap_starts.len() as u64 >= bitmaps {
                    return Err("more bitmap entries than the header counts".into());
                }
                bitmap_starts.push(off);
            }
            t => return Err(format!("entry of unknown type {t}")),
        }
    }
    // Bitmaps follow the entries, one page each.
    for (n, start) in bitmap_starts.into_iter().enumerate() {
        let i = idx + 1 + n;
        if i >= pages || !page_ok(i) {
            return Err(format!(
                "bitmap page {i} missing or its checksum mismatches"
            ));
        }
        for (s, l) in bitmap_ranges(&data[i * page..(i + 1) * page], start, page as u64) {
            ranges.push((s, s.saturating_add(l)));
        }
    }
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(l) if s < l.1 => return Err(format!("entries overlap at {s}")),
            Some(l) if s == l.1 => l.1 = e,
            _ => out.push((s, e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache file of `pages` 4 KiB pages with `entries` and bitmap pages.
    fn file(pages: usize, gen: u64, entries: &[(u64, u64, u8)], bitmaps: &[Vec<u8>]) -> Vec<u8> {
        let page = 4096;
        let mut d = vec![0u8; pages * page];
        let mut pos = 4 * pages;
        d[pos..pos + 8].copy_from_slice(&gen.to_le_bytes());
        pos += 8;
        let mut idx = 0;
        for &(o, b, t) in entries {
            if pos + 17 > (idx + 1) * page {
                idx += 1;
                pos = idx * page;
            }
            d[pos..pos + 8].copy_from_slice(&o.to_le_bytes());
            d[pos + 8..pos + 16].copy_from_slice(&b.to_le_bytes());
            d[pos + 16] = t;
            pos += 17;
        }
        for (n, bm) in bitmaps.iter().enumerate() {
            let i = idx + 1 + n;
            d[i * page..i * page + bm.len()].copy_from_slice(bm);
        }
        for i in 0..pages {
            let skip = if i == 0 { 4 * pages } else { 0 };
            let c = crc32c::crc32c(&d[i * page + skip..(i + 1) * page]);
            d[4 * i..4 * i + 4].copy_from_slice(&c.to_le_bytes());
        }
        d
    }

    #[test]
    fn entries_and_bitmaps() {
        let d = file(
            2,
            7,
            &[(1 << 20, 8192, 1), (4 << 20, 4096, 2)],
            &[vec![0b101]],
        );
        let r = parse(&d, 4096, 7, 2, 1).unwrap();
        assert_eq!(
            r,
            vec![
                ((1 << 20), (1 << 20) + 8192),
                (4 << 20, (4 << 20) + 4096),
                ((4 << 20) + 8192, (4 << 20) + 12288)
            ]
        );
        // Wrong generation, a flipped byte, an empty entry: the kernel ignores the cache.
        assert!(parse(&d, 4096, 8, 2, 1).is_err());
        let mut bad = d.clone();
        bad[5000] ^= 1;
        assert!(parse(&bad, 4096, 7, 2, 1).is_err());
        let d = file(1, 7, &[(1 << 20, 0, 1)], &[]);
        assert!(parse(&d, 4096, 7, 1, 0).is_err());
        // Overlapping entries are refused; touching ones merge.
        let d = file(1, 7, &[(0, 8192, 1), (4096, 8192, 1)], &[]);
        assert!(parse(&d, 4096, 7, 2, 0).is_err());
        let d = file(1, 7, &[(0, 4096, 1), (4096, 4096, 1)], &[]);
        assert_eq!(parse(&d, 4096, 7, 2, 0).unwrap(), vec![(0, 8192)]);
    }

    #[test]
    fn entries_spill_to_the_next_page() {
        let many: Vec<(u64, u64, u8)> = (0..400u64).map(|i| (i * 8192, 4096, 1)).collect();
        let d = file(3, 1, &many, &[]);
        let r = parse(&d, 4096, 1, 400, 0).unwrap();
        assert_eq!(r.len(), 400);
        assert_eq!(r[399], (399 * 8192, 399 * 8192 + 4096));
    }
}
