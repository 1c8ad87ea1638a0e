//! File data operations, with the kernel's exact rules (fs/btrfs file.c,
//! inode.c, reflink.c): buffered, direct and mapped writes, reads,
//! truncate, fallocate (with keep-size), punch hole, zero range and clone.

use super::extents::{self, drop_extents, extent_key, extents_in};
use super::filesystem::{Filesystem, Loc};
use super::inode::*;
use super::pagecache::PAGE;
use super::writeback::Reason;
use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent, FileExtentItem};
use crate::trans::delayed::BackRef;
use crate::trans::TreeId;
use crate::{Error, Result};
use zerocopy::IntoBytes;

/// Range operations on a file's extents: fallocate (preallocation, punching holes, zeroing), collapse, and clones of a range (reflink). Obtained from [`Filesystem::ranges`].
pub struct FileRanges<'a> {
    fs: &'a mut Filesystem,
}

impl Filesystem {
    /// See [`FileRanges`].
    pub fn ranges(&mut self) -> FileRanges<'_> {
        FileRanges { fs: self }
    }
}

/// `sync_file_range` flags, as the syscall numbers them.
pub const SYNC_RANGE_WAIT_BEFORE: u32 = 1;
/// `SYNC_FILE_RANGE_WRITE`: start writeback of the dirty pages in the range.
pub const SYNC_RANGE_WRITE: u32 = 2;
/// `SYNC_FILE_RANGE_WAIT_AFTER`: wait for the writeback of the range to finish.
pub const SYNC_RANGE_WAIT_AFTER: u32 = 4;

/// Largest file size (MAX_LFS_FILESIZE on 64-bit).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Largest preallocated extent.
const MAX_PREALLOC: u64 = 256 << 20;

/// What the extent map shows at an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MapAt {
    /// No item, or an explicit hole item: `[start, end)` of the hole.
    Hole(u64, u64),
    /// A preallocated extent `[start, end)`.
    Prealloc(u64, u64),
    /// Written data (regular or inline) `[start, end)`.
    Written(u64, u64),
}

impl Filesystem {
    fn regular(&mut self, l: Loc, what: &str) -> Result<crate::format::inode::InodeItem> {
        let it = self.item(l)?;
        let m = it.mode.get();
        if is_dir(m) {
            return Err(Error::errno(
                libc::EISDIR,
                format!("{what}: is a directory"),
            ));
        }
        if !is_reg(m) {
            return Err(Error::errno(
                libc::EINVAL,
                format!("{what}: not a regular file"),
            ));
        }
        Ok(it)
    }

    /// The extent map at `pos`.
    pub(super) fn map_at(&mut self, l: Loc, pos: u64) -> Result<MapAt> {
        let ss = self.store.sectorsize() as u64;
        let items = extents_in(&mut self.store, l.subvol, l.ino, pos, pos + 1)?;
        if let Some((k, d)) = items.into_iter().next() {
            let (s, e) =
                extents::extent_span(ss, k.offset, &d).unwrap_or((k.offset, k.offset + ss));
            return Ok(match parse_file_extent(&d) {
                Ok(FileExtent::Inline { .. }) => MapAt::Written(s, e),
                Ok(FileExtent::Disk { head, item }) if item.disk_bytenr.get() == 0 => {
                    let _ = head;
                    MapAt::Hole(s, e)
                }
                Ok(FileExtent::Disk { head, .. }) if head.type_ == BTRFS_FILE_EXTENT_PREALLOC => {
                    MapAt::Prealloc(s, e)
                }
                _ => MapAt::Written(s, e),
            });
        }
        // A gap: from the end of the previous item to the next one.
        let next = match self
            .store
            .next_item(TreeId::Tree(l.subvol), &extent_key(l.ino, pos))?
        {
            Some((k, _)) if k.objectid == l.ino && k.ty == BTRFS_EXTENT_DATA_KEY => k.offset,
            _ => u64::MAX,
        };
        Ok(MapAt::Hole(pos / ss * ss, next))
    }

    /// The current bytes of page `idx`: the dirty page, or what the disk
    /// holds (zeros past the in-memory size, in holes and prealloc).
    fn page_now(&mut self, l: Loc, idx: u64) -> Result<Box<[u8]>> {
        if let Some(p) = self.rt(l)?.pages.get(idx) {
            return Ok(p.to_vec().into_boxed_slice());
        }
        let i_size = self.rt(l)?.i_size;
        let datasum = self.datasum(l)?;
        let mut page = self.dirty.alloc_page();
        page.fill(0);
        let start = idx * PAGE;
        if start < i_size {
            let d = super::read::read_range(
                &mut self.store,
                l.subvol,
                l.ino,
                i_size,
                start,
                PAGE,
                datasum,
            )?;
            page[..d.len()].copy_from_slice(&d);
        }
        Ok(page)
    }

    /// Put a dirty page.
    fn dirty_page(&mut self, l: Loc, idx: u64, page: Box<[u8]>) -> Result<()> {
        let now = self.clock.uptime();
        let rt = self.rt(l)?;
        rt.has_page_cache = true;
        rt.pages_dirtied_at.get_or_insert(now);
        if rt.pages.insert(idx, page) {
            self.dirty.bytes += PAGE;
        }
        self.note_dirty(l);
        self.clock.dirtied();
        Ok(())
    }

    /// Drop cached pages `[start, end)` (byte range, page aligned outward).
    fn drop_pages(&mut self, l: Loc, start: u64, end: u64) -> Result<()> {
        let rt = self.rt(l)?;
        let n = rt.pages.drop_range(start / PAGE, end.div_ceil(PAGE)) as u64;
        let empty = rt.pages.is_empty();
        self.dirty.bytes = self.dirty.bytes.saturating_sub(n * PAGE);
        if empty {
            self.dirty.note_clean(l);
        }
        Ok(())
    }

    /// btrfs_truncate_block (6.16+): zero the part of the block holding
    /// `offset` that lies in `[start, end]` (`end` None: to infinity) and
    /// dirty the whole block, unless the range is block aligned at the edge
    /// that block is on. Holes and prealloc are dirtied too: they become
    /// written data.
    fn truncate_block(&mut self, l: Loc, offset: u64, start: u64, end: Option<u64>) -> Result<()> {
        let ss = self.store.sectorsize() as u64;
        let tail_aligned = end.is_none_or(|e| (e + 1) % ss == 0);
        if start.is_multiple_of(ss) && tail_aligned {
            return Ok(());
        }
        let in_head = offset / ss == start / ss;
        let in_tail = end.is_some_and(|e| offset / ss == e / ss);
        let need_head = in_head && !start.is_multiple_of(ss);
        let need_tail = in_tail && !tail_aligned;
        if !need_head && !need_tail {
            return Ok(());
        }
        let bs = offset / ss * ss;
        let be = bs + ss - 1;
        let (a, b) = (bs.max(start), end.map_or(be, |e| e.min(be)));
        let idx = bs / PAGE;
        let mut p = self.page_now(l, idx)?;
        if a <= b {
            p[(a - bs) as usize..=(b - bs) as usize].fill(0);
        }
        self.dirty_page(l, idx, p)
    }

    /// btrfs_cont_expand: grow from `old` to `size`: the old end's block
    /// gets zeros after it (and is dirtied), and without no-holes the new
    /// range outside preallocated space gets a hole item.
    fn cont_expand(&mut self, l: Loc, old: u64, size: u64) -> Result<()> {
        self.truncate_block(l, old, old, None)?;
        let ss = self.store.sectorsize() as u64;
        let (hole_start, block_end) = (old.div_ceil(ss) * ss, size.div_ceil(ss) * ss);
        if size <= hole_start {
            return Ok(());
        }
        // Every stretch that is not preallocated becomes a hole: an item
        // without no-holes, and with or without it a changed range, so a
        // fast fsync logs the hole and replay drops what the committed
        // tree had there (btrfs_cont_expand's modified hole extent map).
        let no_holes = self.store.no_holes();
        let transid = self.store.transid();
        let mut pos = hole_start;
        while pos < block_end {
            // Extent map by extent map, cached holes with the bounds they
            // were looked up with.
            let (kind_prealloc, end) = match self.ranges().hole_extent(l, pos, block_end - pos)? {
                Some(e) => (false, e),
                None => match self.map_at(l, pos)? {
                    MapAt::Prealloc(_, e) => (true, e),
                    MapAt::Hole(_, e) | MapAt::Written(_, e) => (false, e),
                },
            };
            let end = end.min(block_end).max(pos + ss);
            if !kind_prealloc {
                // btrfs_cont_expand's hole extent map: changed, cached.
                self.writeback().note_modified(l, pos, end)?;
                self.rt(l)?.hole_maps.insert(pos, end);
            }
            if !kind_prealloc && !no_holes {
                let d = drop_extents(&mut self.store, l.subvol, l.ino, pos, end)?;
                self.store.insert_item(
                    TreeId::Tree(l.subvol),
                    &extent_key(l.ino, pos),
                    FileExtentItem::hole(transid, end - pos).as_bytes(),
                )?;
                if d.nbytes > 0 {
                    let mut it = self.item(l)?;
                    it.nbytes.set(it.nbytes.get().saturating_sub(d.nbytes));
                    self.put_item(l, &it)?;
                }
            }
            pos = end;
        }
        Ok(())
    }

    /// Buffered pwrite of `data` at `off` (btrfs_buffered_write): times
    /// change in memory, the item follows at writeback.
    pub fn write(&mut self, l: Loc, off: u64, data: &[u8]) -> Result<()> {
        self.regular(l, "write")?;
        if data.is_empty() {
            return Ok(());
        }
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::errno(libc::EFBIG, "write past the largest file size"))?;
        let ss = self.store.sectorsize() as u64;
        let fresh = {
            let pages = &self.rt(l)?.pages;
            (off / PAGE..end.div_ceil(PAGE))
                .filter(|&i| !pages.contains(i))
                .count() as u64
        };
        self.reserve_data(l, fresh * PAGE)?;
        let i_size = self.rt(l)?.i_size;
        if off > i_size {
            self.cont_expand(l, i_size, end.div_ceil(ss) * ss)?;
        }
        let mut pos = off;
        while pos < end {
            let idx = pos / PAGE;
            let base = idx * PAGE;
            let (a, b) = (pos, end.min(base + PAGE));
            let src = &data[(a - off) as usize..(b - off) as usize];
            let (pa, pb) = ((a - base) as usize, (b - base) as usize);
            if let Some(p) = self.rt(l)?.pages.get_mut(idx) {
                p[pa..pb].copy_from_slice(src);
            } else {
                // A whole-page write needs nothing of the old contents.
                let page = if pa == 0 && pb == PAGE as usize {
                    self.dirty.page_of(src)
                } else {
                    let mut page = self.page_now(l, idx)?;
                    page[pa..pb].copy_from_slice(src);
                    page
                };
                self.dirty_page(l, idx, page)?;
            }
            pos = b;
        }
        let now = self.clock.now();
        let rt = self.rt(l)?;
        rt.i_size = rt.i_size.max(end);
        rt.pending_times = Some((now, now));
        Ok(())
    }

    /// Make sure writeback will find room for `bytes` more of dirty pages
    /// on top of those already dirty (btrfs_check_data_free_space): a
    /// buffered write past the free data space fails with ENOSPC at once,
    /// before it changes anything, instead of being accepted and failing
    /// the next sync. An inode that may write in place (nodatacow,
    /// preallocated) goes on without room, as btrfs_buffered_write does
    /// after its nocow check.
    fn reserve_data(&mut self, l: Loc, bytes: u64) -> Result<()> {
        if self.data_space_for(bytes)? {
            return Ok(());
        }
        if self.item(l)?.flags.get() & (BTRFS_INODE_NODATACOW | BTRFS_INODE_PREALLOC) != 0 {
            return Ok(());
        }
        Err(Error::errno(
            libc::ENOSPC,
            format!("write: no data space for {bytes} more bytes of dirty pages"),
        ))
    }

    /// Whether new data extents can take `bytes` more on top of the dirty
    /// pages writeback will place (btrfs_reserve_data_bytes): free space
    /// in the data block groups. Short of it, as the kernel's
    /// priority_reclaim_data_space, new data chunks are made one at a
    /// time until there is room or the device has no space left for one
    /// (so a request larger than the filesystem leaves every unallocated
    /// byte in data chunks, as the kernel's does); then every dirty page
    /// is written back and the transaction committed, so space freed in it
    /// counts again, before it gives up.
    fn data_space_for(&mut self, bytes: u64) -> Result<bool> {
        if bytes == 0 {
            return Ok(true);
        }
        let need = self.dirty.bytes.saturating_add(bytes);
        if self.store.chunks().data_room()? >= need {
            return Ok(true);
        }
        while self.store.chunks().force_data_chunk()? {
            if self.store.chunks().data_room()? >= need {
                return Ok(true);
            }
        }
        self.sync()?;
        Ok(self.store.chunks().data_room()? >= self.dirty.bytes.saturating_add(bytes))
    }

    /// Stores through a shared mapping: pages change, the size does not.
    pub fn mmap_write(&mut self, l: Loc, off: u64, data: &[u8]) -> Result<()> {
        self.regular(l, "mwrite")?;
        let i_size = self.rt(l)?.i_size;
        if off + data.len() as u64 > i_size.div_ceil(PAGE) * PAGE {
            return Err(Error::errno(
                libc::EFAULT,
                "store past the end of the mapped file (SIGBUS)",
            ));
        }
        self.write(l, off, data)?;
        // Bytes past the end in the last page are not part of the file.
        self.rt(l)?.i_size = i_size;
        Ok(())
    }

    /// pread: what a reader sees (dirty pages over the disk's data).
    pub fn read(&mut self, l: Loc, off: u64, len: u64) -> Result<Vec<u8>> {
        let out = self.read_untracked(l, off, len)?;
        if !out.is_empty() {
            self.rt(l)?.has_page_cache = true;
        }
        Ok(out)
    }

    /// As [`Self::read_untracked`], with data checksums not verified: what
    /// a restore asked to keep damaged data writes (the bytes of the first
    /// copy, as they stand).
    pub fn read_unverified(&mut self, l: Loc, off: u64, len: u64) -> Result<Vec<u8>> {
        self.read_with(l, off, len, false)
    }

    /// What `read` returns, without the read's side effect on the page
    /// cache (an observer's read: crash exploration, manifests).
    pub fn read_untracked(&mut self, l: Loc, off: u64, len: u64) -> Result<Vec<u8>> {
        self.read_with(l, off, len, true)
    }

    fn read_with(&mut self, l: Loc, off: u64, len: u64, verify: bool) -> Result<Vec<u8>> {
        let it = self.item(l)?;
        if is_dir(it.mode.get()) {
            return Err(Error::errno(libc::EISDIR, "read: is a directory"));
        }
        let i_size = if is_reg(it.mode.get()) {
            self.rt(l)?.i_size
        } else {
            it.size.get()
        };
        let end = off.saturating_add(len).min(i_size);
        if off >= end {
            return Ok(Vec::new());
        }
        let datasum = verify && self.datasum(l)?;
        let mut out = super::read::read_range(
            &mut self.store,
            l.subvol,
            l.ino,
            i_size,
            off,
            end - off,
            datasum,
        )?;
        let rt = self.rt(l)?;
        for idx in off / PAGE..end.div_ceil(PAGE) {
            if let Some(p) = rt.pages.get(idx) {
                let base = idx * PAGE;
                let (a, b) = (base.max(off), (base + PAGE).min(end));
                out[(a - off) as usize..(b - off) as usize]
                    .copy_from_slice(&p[(a - base) as usize..(b - base) as usize]);
            }
        }
        Ok(out)
    }

    /// Size of the in-memory and on-disk inode after a size change.
    fn set_size(&mut self, l: Loc, size: u64) -> Result<()> {
        self.rt(l)?.i_size = size;
        self.writeback().set_disk_size(l)
    }

    /// truncate(2) (btrfs_setsize / btrfs_truncate).
    pub fn truncate(&mut self, l: Loc, size: u64) -> Result<()> {
        self.regular(l, "truncate")?;
        if size > MAX_FILE_SIZE {
            return Err(Error::errno(
                libc::EFBIG,
                "truncate past the largest file size",
            ));
        }
        let old = self.rt(l)?.i_size;
        if size == 0 && old > 0 {
            self.rt(l)?.flush_on_close = true;
        }
        if size > old {
            self.cont_expand(l, old, size)?;
            self.set_size(l, size)?;
            return self.stamp(l, true, true);
        }
        // Shrink (or the same size): pages past the end go, the partial
        // page is zeroed in memory only; extents past the new end go.
        let ss = self.store.sectorsize() as u64;
        self.drop_pages(l, size.div_ceil(PAGE) * PAGE, u64::MAX)?;
        if !size.is_multiple_of(PAGE) {
            if let Some(p) = self.rt(l)?.pages.get_mut(size / PAGE) {
                p[(size % PAGE) as usize..].fill(0);
            }
        }
        if size == 0 {
            self.rt(l)?.has_page_cache = false;
        }
        // btrfs_truncate drops the extent maps from the new end's block on:
        // cached holes and changed ranges there are gone (an fsync logs
        // nothing of them).
        let cut = size.div_ceil(ss) * ss;
        let rt = self.rt(l)?;
        super::writeback::drop_hole_maps(&mut rt.hole_maps, cut, u64::MAX);
        rt.modified.retain_mut(|r| {
            r.1 = r.1.min(cut);
            r.0 < r.1
        });
        if size != old {
            // truncate_setsize, then btrfs_truncate writes back and waits
            // for everything from the new end's block on: the kept part of
            // that block reaches disk before the extents past it go.
            self.rt(l)?.i_size = size;
            self.writeback()
                .inode(l, size / ss * ss, u64::MAX, Reason::Sync)?;
        }
        let from = size.div_ceil(ss) * ss;
        // btrfs_truncate_inode_items counts every extent item whose last
        // byte is at or past the new size (one it keeps whole, as the
        // block holding the new end, too): any makes the next fsync a
        // full one.
        let mut found = extents_in(&mut self.store, l.subvol, l.ino, size, u64::MAX)?
            .iter()
            .any(|(k, d)| match parse_file_extent(d) {
                Ok(FileExtent::Inline { head, .. }) => {
                    k.offset.saturating_add(head.ram_bytes.get()) > size
                }
                Ok(FileExtent::Disk { item, .. }) => {
                    k.offset.saturating_add(item.num_bytes.get()) > size
                }
                Err(_) => true,
            });
        let d = drop_extents(&mut self.store, l.subvol, l.ino, from, u64::MAX)?;
        let mut it = self.item(l)?;
        it.nbytes.set(it.nbytes.get().saturating_sub(d.nbytes));
        self.put_item(l, &it)?;
        // An inline extent reaching past the new size.
        let k = extent_key(l.ino, 0);
        let t = TreeId::Tree(l.subvol);
        if let Some(dd) = self.store.lookup(t, &k)? {
            if let Ok(FileExtent::Inline { head, data }) = parse_file_extent(&dd) {
                let ram = head.ram_bytes.get();
                if size < ram {
                    found = true;
                    if size == 0 {
                        self.store.delete_item(t, &k)?;
                        let mut it = self.item(l)?;
                        it.nbytes.set(it.nbytes.get().saturating_sub(ram));
                        self.put_item(l, &it)?;
                    } else if head.compression == BTRFS_COMPRESS_NONE
                        && (size as usize) <= data.len()
                    {
                        let nd = crate::format::file_extent::encode_inline_extent(
                            head.generation.get(),
                            size,
                            0,
                            &data[..size as usize],
                        );
                        self.store.update_item(t, &k, &nd)?;
                        let mut it = self.item(l)?;
                        it.nbytes.set(it.nbytes.get().saturating_sub(ram - size));
                        self.put_item(l, &it)?;
                    } else {
                        // A compressed inline extent is not cut: its block is
                        // rewritten (zeros after the new end).
                        self.rt(l)?.i_size = size;
                        self.truncate_block(l, size, size, None)?;
                    }
                }
            }
        }
        if found {
            self.set_full_sync(l)?;
        }
        // No changed range of its own: a shrink changes extents only as a
        // full sync (above) or through the zeroed block's writeback, a grow
        // through cont_expand's hole ranges (btrfs_setsize adds no
        // modified extent map).
        self.set_size(l, size)?;
        self.stamp(l, true, true)
    }

    /// O_DIRECT pwrite. A checksummed file (and any unaligned write) is
    /// written through the page cache and flushed at once, as btrfs does;
    /// a nodatasum file's aligned writes go to new extents, or in place
    /// where the file owns the space.
    pub fn direct_write(&mut self, l: Loc, off: u64, data: &[u8]) -> Result<()> {
        self.regular(l, "dwrite")?;
        let ss = self.store.sectorsize() as u64;
        let end = off + data.len() as u64;
        let datasum = self.datasum(l)?;
        if datasum
            || !off.is_multiple_of(ss)
            || !(data.len() as u64).is_multiple_of(ss)
            || data.is_empty()
        {
            // Direct I/O leaves no pages in the page cache.
            let rt = self.rt(l)?;
            let (cached, dirtied) = (rt.has_page_cache, rt.pages_dirtied_at);
            self.write(l, off, data)?;
            self.writeback()
                .inode(l, off / ss * ss, end.div_ceil(ss) * ss, Reason::Fsync)?;
            let rt = self.rt(l)?;
            rt.has_page_cache = cached;
            rt.pages_dirtied_at = dirtied;
            return Ok(());
        }
        let i_size = self.rt(l)?.i_size;
        if off > i_size {
            self.cont_expand(l, i_size, end)?;
        }
        // Cached pages of the range are written first and dropped.
        self.writeback().inode(l, 0, u64::MAX, Reason::Fsync)?;
        let rt = self.rt(l)?;
        rt.i_size = rt.i_size.max(end);
        let now = self.clock.now();
        self.rt(l)?.pending_times = Some((now, now));
        self.writeback().write_direct_run(l, off, data)
    }

    /// sync_file_range: write (and wait for) the data; metadata is not
    /// made durable.
    pub fn sync_file_range(&mut self, l: Loc, off: u64, len: u64, flags: u32) -> Result<()> {
        self.regular(l, "sync-range")?;
        let end = if len == 0 {
            u64::MAX
        } else {
            off.saturating_add(len)
        };
        if flags & SYNC_RANGE_WRITE == 0 {
            return Ok(());
        }
        // Each dirty run met goes out from its first page in the range. A
        // run that goes on past the range's end becomes one ordered extent
        // of which only the pages in range are written: it completes (and
        // its extent exists) only once later writeback writes the rest, and
        // nothing waits for it here, so the run stays as it is until then.
        let (from, to) = (off / PAGE, end.div_ceil(PAGE));
        let runs: Vec<(u64, u64)> = self
            .rt(l)?
            .pages
            .dirty_ranges()
            .into_iter()
            .map(|(a, b)| (a / PAGE, b / PAGE))
            .filter(|&(a, b)| b > from && a < to)
            .collect();
        for (a, b) in runs {
            if b <= to {
                self.writeback()
                    .inode(l, a.max(from) * PAGE, b * PAGE, Reason::Fsync)?;
            }
        }
        Ok(())
    }
}

impl FileRanges<'_> {
    /// BTRFS_IOC_ENCODED_WRITE (btrfs_do_encoded_write): `disk`, data
    /// compressed with `compression` (BTRFS_COMPRESS_*) to `ram` bytes,
    /// becomes one extent of the file at `off` holding `len` bytes of it
    /// from byte `ext_off` on, kept compressed. What the range held is
    /// dropped; the file grows to `off + len` when shorter. The kernel's
    /// checks: a sector aligned offset, at most 128 KiB either way, a
    /// range inside the decoded data, an unaligned end only at or past
    /// the end of the file, compressed data shorter than decoded.
    #[allow(clippy::too_many_arguments)]
    pub fn encoded_write(
        &mut self,
        l: Loc,
        off: u64,
        len: u64,
        ram: u64,
        ext_off: u64,
        compression: u8,
        disk: &[u8],
    ) -> Result<()> {
        use crate::format::file_extent::{MAX_COMPRESSED, MAX_UNCOMPRESSED};
        self.fs.regular(l, "encoded write")?;
        let ss = self.fs.store.sectorsize() as u64;
        let inval = |why: &str| Error::errno(libc::EINVAL, format!("encoded write: {why}"));
        if !matches!(
            compression,
            BTRFS_COMPRESS_ZLIB | BTRFS_COMPRESS_LZO | BTRFS_COMPRESS_ZSTD
        ) {
            return Err(inval("unknown compression"));
        }
        if len == 0 || ram == 0 || ram > MAX_UNCOMPRESSED || disk.is_empty() {
            return Err(inval("empty or oversized extent"));
        }
        // The decoded length is counted in whole sectors, as the kernel's
        // ALIGN(unencoded_len): the extent item's ram_bytes.
        let ram = ram.div_ceil(ss) * ss;
        if disk.len() as u64 > MAX_COMPRESSED || (disk.len() as u64).div_ceil(ss) * ss >= ram {
            return Err(inval("the compressed data saves nothing"));
        }
        if !off.is_multiple_of(ss) || ext_off.checked_add(len).is_none_or(|e| e > ram) {
            return Err(inval("range outside the extent or unaligned offset"));
        }
        let end = off
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or_else(|| inval("range past the largest file"))?;
        let i_size = self.fs.rt(l)?.i_size;
        if end % ss != 0 && end < i_size {
            return Err(inval("unaligned end before the end of the file"));
        }
        if self.fs.item(l)?.flags.get() & (BTRFS_INODE_NODATASUM | BTRFS_INODE_NODATACOW) != 0 {
            return Err(inval("the file keeps no checksums"));
        }
        let num = len.div_ceil(ss) * ss;
        // Whatever the page cache holds of the range goes to disk first,
        // then the pages go: the new extent replaces it.
        self.fs.writeback().inode(l, off, off + num, Reason::Sync)?;
        self.fs.drop_pages(l, off, off + num)?;
        let padded;
        let disk = if (disk.len() as u64).is_multiple_of(ss) {
            disk
        } else {
            let mut v = disk.to_vec();
            v.resize(((disk.len() as u64).div_ceil(ss) * ss) as usize, 0);
            padded = v;
            &padded
        };
        let bytenr = super::data::write_data_extent(&mut self.fs.store, disk, true)?;
        if end > i_size {
            self.fs.rt(l)?.i_size = end;
        }
        self.fs
            .writeback()
            .complete_ordered(&super::writeback::OrderedExtent {
                loc: l,
                file_off: off,
                len: num,
                disk_bytenr: bytenr,
                disk_len: disk.len() as u64,
                extent_offset: ext_off,
                ram_bytes: ram,
                compression,
                kind: super::writeback::OrderedKind::Cow,
                datasum: true,
            })?;
        self.fs.stamp(l, true, true)
    }

    /// fallocate(2) mode 0 or KEEP_SIZE.
    pub fn fallocate(&mut self, l: Loc, off: u64, len: u64, keep: bool) -> Result<()> {
        self.fs.regular(l, "fallocate")?;
        if len == 0 {
            return Err(Error::errno(libc::EINVAL, "fallocate of 0 bytes"));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::errno(libc::EFBIG, "fallocate past the largest file size"))?;
        let (alloc_start, alloc_end) = self.fallocate_prelude(l, off, end)?;
        let i_size = self.fs.rt(l)?.i_size;
        // Holes, and anything at or past the size that is not prealloc.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut pos = alloc_start;
        while pos < alloc_end {
            let m = self.fs.map_at(l, pos)?;
            let (pick, e) = match m {
                MapAt::Hole(_, e) => (true, e),
                MapAt::Prealloc(_, e) => (false, e),
                MapAt::Written(_, e) => (pos >= i_size, e),
            };
            let e = e
                .min(alloc_end)
                .max(pos + self.fs.store.sectorsize() as u64);
            if pick {
                match ranges.last_mut() {
                    Some(r) if r.1 == pos => r.1 = e,
                    _ => ranges.push((pos, e)),
                }
            }
            pos = e;
        }
        // btrfs_fallocate reserves the space of every range before it
        // preallocates any: without room, ENOSPC leaves the file as it was
        // (but for what the prelude did, as in the kernel).
        let need: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        if !self.fs.data_space_for(need)? {
            return Err(Error::errno(
                libc::ENOSPC,
                format!("fallocate: no data space for {need} bytes"),
            ));
        }
        for (a, b) in ranges {
            self.prealloc_range(l, a, b, if keep { None } else { Some(end) })?;
        }
        self.fallocate_update_isize(l, end, keep)
    }

    /// What every fallocate mode does first: size check, times, expansion
    /// to the range (holes without no-holes) or the end block zeroed, and
    /// writeback of the aligned range. Returns the aligned range.
    fn fallocate_prelude(&mut self, l: Loc, off: u64, end: u64) -> Result<(u64, u64)> {
        let ss = self.fs.store.sectorsize() as u64;
        let (alloc_start, alloc_end) = (off / ss * ss, end.div_ceil(ss) * ss);
        self.fs.file_modified(l)?;
        let i_size = self.fs.rt(l)?.i_size;
        if alloc_start > i_size {
            self.fs.cont_expand(l, i_size, alloc_start)?;
        } else if end > i_size {
            self.fs.truncate_block(l, i_size, i_size, None)?;
        }
        self.fs
            .writeback()
            .inode(l, alloc_start, alloc_end, Reason::Sync)?;
        Ok((alloc_start, alloc_end))
    }

    /// __btrfs_prealloc_file_range over `[a, b)`: extents of at most 256
    /// MiB, each as large as the free space has in one piece (down to a
    /// sector) and never larger than the one before it (once the
    /// allocator returns small pieces, only pieces that size are looked
    /// for), replacing whatever is there; with `grow_to`, the size
    /// follows each extent up to it.
    fn prealloc_range(&mut self, l: Loc, a: u64, b: u64, grow_to: Option<u64>) -> Result<()> {
        let ss = self.fs.store.sectorsize() as u64;
        let transid = self.fs.store.transid();
        let mut p = a;
        let mut last_alloc = MAX_PREALLOC;
        while p < b {
            let (bytenr, want) = super::data::reserve_data_extent(
                &mut self.fs.store,
                (b - p).min(MAX_PREALLOC).min(last_alloc),
                ss,
            )?;
            last_alloc = want;
            let d = drop_extents(&mut self.fs.store, l.subvol, l.ino, p, p + want)?;
            let fe = FileExtentItem::new(
                BTRFS_FILE_EXTENT_PREALLOC,
                transid,
                bytenr,
                want,
                0,
                want,
                want,
                BTRFS_COMPRESS_NONE,
            );
            self.fs.store.insert_item(
                TreeId::Tree(l.subvol),
                &extent_key(l.ino, p),
                fe.as_bytes(),
            )?;
            super::data::reference_new_extent(
                &mut self.fs.store,
                bytenr,
                want,
                BackRef::Data {
                    root: l.subvol,
                    objectid: l.ino,
                    offset: p,
                },
            );
            let now = self.fs.clock.now();
            let mut it = self.fs.item(l)?;
            it.nbytes
                .set(it.nbytes.get().saturating_sub(d.nbytes) + want);
            it.flags.set(it.flags.get() | BTRFS_INODE_PREALLOC);
            it.ctime = now;
            it.transid.set(transid);
            self.fs.put_item(l, &it)?;
            p += want;
            if let Some(g) = grow_to {
                let i_size = self.fs.rt(l)?.i_size;
                if g > i_size && p > i_size {
                    self.fs.set_size(l, p.min(g))?;
                }
            }
            self.fs.writeback().note_modified(l, p - want, p)?;
        }
        Ok(())
    }

    /// btrfs_fallocate_update_isize: without keep-size, a range past the
    /// end grows the file (ctime only).
    fn fallocate_update_isize(&mut self, l: Loc, end: u64, keep: bool) -> Result<()> {
        if keep || end <= self.fs.rt(l)?.i_size {
            return Ok(());
        }
        self.fs.set_size(l, end)?;
        self.fs.stamp(l, true, false)
    }

    /// The first byte at or after `off` (before `end`) that is not a hole,
    /// or None when `[off, end)` is all hole.
    fn first_non_hole(&mut self, l: Loc, off: u64, end: u64) -> Result<Option<u64>> {
        let ss = self.fs.store.sectorsize() as u64;
        let len = (end - off).div_ceil(ss) * ss;
        match self.hole_extent(l, off / ss * ss, len)? {
            Some(he) if he >= end => Ok(None),
            Some(he) => Ok(Some(he.max(off))),
            None => Ok(Some(off)),
        }
    }

    /// btrfs_get_extent at `start` for `len` bytes when it finds a hole:
    /// the end of the hole map, cached or made now (`[start, start + len)`,
    /// or up to the next extent when one starts sooner), None when `start`
    /// is not in a hole. A cached map is used only while no extent item has
    /// appeared in it (every change of the file's extents drops the maps it
    /// touches).
    fn hole_extent(&mut self, l: Loc, start: u64, len: u64) -> Result<Option<u64>> {
        let cached = self
            .fs
            .rt(l)?
            .hole_maps
            .range(..=start)
            .next_back()
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e));
        if let Some((s, e)) = cached {
            let items = extents_in(&mut self.fs.store, l.subvol, l.ino, s, e)?;
            let only_holes = items.iter().all(|(_, d)| {
                matches!(parse_file_extent(d), Ok(FileExtent::Disk { item, .. }) if item.disk_bytenr.get() == 0)
            });
            if only_holes {
                return Ok(Some(e));
            }
            self.fs.rt(l)?.hole_maps.remove(&s);
        }
        let MapAt::Hole(_, next) = self.fs.map_at(l, start)? else {
            return Ok(None);
        };
        let end = start.saturating_add(len).min(next).max(start + 1);
        let maps = &mut self.fs.rt(l)?.hole_maps;
        super::writeback::add_hole_map(maps, start, end);
        // The map as merged with its cached neighbours.
        Ok(maps
            .range(..=start)
            .next_back()
            .map(|(_, &e)| e)
            .or(Some(end)))
    }

    /// FALLOC_FL_PUNCH_HOLE | KEEP_SIZE (btrfs_punch_hole).
    pub fn punch_hole(&mut self, l: Loc, off: u64, len: u64) -> Result<()> {
        self.fs.regular(l, "punch")?;
        if len == 0 {
            return Err(Error::errno(libc::EINVAL, "punch of 0 bytes"));
        }
        let end = off
            .checked_add(len)
            .ok_or_else(|| Error::errno(libc::EINVAL, "punch range overflows"))?;
        let ss = self.fs.store.sectorsize() as u64;
        let (orig_start, orig_end) = (off, end - 1);
        self.fs.writeback().inode(l, off, end, Reason::Sync)?;
        let ino_size = self.fs.rt(l)?.i_size.div_ceil(ss) * ss;
        let Some(offset) = self.first_non_hole(l, off, end)? else {
            return Ok(());
        };
        let moved = offset != off;
        let len = end - offset;
        let mut lockstart = offset.div_ceil(ss) * ss;
        let lockend = (offset + len) / ss * ss;
        let same_block = offset / ss == (offset + len - 1) / ss;
        if same_block && len < ss {
            if offset < ino_size {
                self.fs
                    .truncate_block(l, offset + len - 1, orig_start, Some(orig_end))?;
            }
            return self.fs.stamp(l, true, true);
        }
        if offset < ino_size {
            self.fs
                .truncate_block(l, offset, orig_start, Some(orig_end))?;
        }
        if !moved && lockstart < lockend {
            match self.first_non_hole(l, lockstart, lockend)? {
                None => return self.fs.stamp(l, true, true),
                Some(p) => lockstart = p,
            }
        }
        let tail_start = lockend;
        if offset + len > tail_start {
            let tail_len = (offset + len - tail_start).div_ceil(ss) * ss;
            let tail_is_hole = self.hole_extent(l, tail_start, tail_len)?.is_some();
            if !tail_is_hole && offset + len < ino_size {
                self.fs
                    .truncate_block(l, offset + len - 1, orig_start, Some(orig_end))?;
            }
        }
        if lockstart >= lockend {
            return self.fs.stamp(l, true, true);
        }
        self.fs.drop_pages(l, lockstart, lockend)?;
        let d = drop_extents(&mut self.fs.store, l.subvol, l.ino, lockstart, lockend)?;
        let mut it = self.fs.item(l)?;
        it.nbytes.set(it.nbytes.get().saturating_sub(d.nbytes));
        self.fs.put_item(l, &it)?;
        if lockstart < ino_size {
            // fill_holes: a hole item without no-holes, and a changed hole
            // extent map over the whole punched range (past the end too),
            // which a fast fsync logs.
            self.fs.writeback().fill_holes(l, lockstart, lockend)?;
            self.fs.writeback().note_modified(l, lockstart, lockend)?;
            self.fs.rt(l)?.hole_maps.insert(lockstart, lockend);
        } else {
            // A range wholly past the end gets no extent map
            // (btrfs_inode_clear_file_extent_range): a fast fsync logs
            // nothing of it, and what the log held there stays.
            super::writeback::drop_hole_maps(&mut self.fs.rt(l)?.hole_maps, lockstart, lockend);
        }
        self.fs.stamp(l, true, true)
    }

    /// FALLOC_FL_ZERO_RANGE [| KEEP_SIZE] (btrfs_zero_range).
    pub fn zero_range(&mut self, l: Loc, off: u64, len: u64, keep: bool) -> Result<()> {
        self.fs.regular(l, "zero-range")?;
        if len == 0 {
            return Err(Error::errno(libc::EINVAL, "zero-range of 0 bytes"));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::errno(libc::EFBIG, "zero-range past the largest file size"))?;
        let ss = self.fs.store.sectorsize() as u64;
        let (orig_start, orig_end) = (off, end - 1);
        let (mut alloc_start, _) = self.fallocate_prelude(l, off, end)?;
        let mut offset = off;
        // A preallocated extent at the start is kept as it is.
        if let MapAt::Prealloc(s, e) = self.fs.map_at(l, alloc_start)? {
            if s <= alloc_start {
                if e >= end {
                    return self.fallocate_update_isize(l, end, keep);
                }
                alloc_start = e;
                offset = e;
            }
        }
        let (mut a, mut b);
        if offset / ss == (end - 1) / ss {
            // Within one block.
            match self.fs.map_at(l, offset / ss * ss)? {
                MapAt::Prealloc(..) => return self.fallocate_update_isize(l, end, keep),
                MapAt::Written(..) if end - offset < ss => {
                    self.fs
                        .truncate_block(l, end - 1, orig_start, Some(orig_end))?;
                    return self.fallocate_update_isize(l, end, keep);
                }
                _ => {
                    a = offset / ss * ss;
                    b = a + ss;
                }
            }
        } else {
            a = offset.div_ceil(ss) * ss;
            b = end / ss * ss;
            if !offset.is_multiple_of(ss) {
                match self.fs.map_at(l, offset / ss * ss)? {
                    MapAt::Hole(..) => a = offset / ss * ss,
                    MapAt::Written(..) => {
                        self.fs
                            .truncate_block(l, offset, orig_start, Some(orig_end))?
                    }
                    MapAt::Prealloc(..) => {}
                }
            }
            if end % ss != 0 {
                match self.fs.map_at(l, end / ss * ss)? {
                    MapAt::Hole(..) => b = end.div_ceil(ss) * ss,
                    MapAt::Written(..) => {
                        self.fs.truncate_block(l, end, orig_start, Some(orig_end))?
                    }
                    MapAt::Prealloc(..) => {}
                }
            }
        }
        let _ = alloc_start;
        if a < b {
            self.fs.drop_pages(l, a, b)?;
            self.prealloc_range(l, a, b, if keep { None } else { Some(end) })?;
        }
        self.fallocate_update_isize(l, end, keep)
    }

    /// FALLOC_FL_COLLAPSE_RANGE: btrfs does not support it.
    pub fn collapse_range(&mut self, l: Loc, _off: u64, _len: u64) -> Result<()> {
        self.fs.regular(l, "collapse")?;
        Err(Error::errno(
            libc::EOPNOTSUPP,
            "collapse: btrfs does not support FALLOC_FL_COLLAPSE_RANGE",
        ))
    }

    /// FICLONERANGE (btrfs_remap_file_range, btrfs_clone_files): `dst`
    /// shares `src[soff..soff+len]`'s extents (len 0: to the end of `src`).
    pub fn clone_range(
        &mut self,
        src: Loc,
        soff: u64,
        dst: Loc,
        doff: u64,
        len: u64,
    ) -> Result<()> {
        self.fs.regular(src, "clone")?;
        self.fs.regular(dst, "clone")?;
        if self.fs.datasum(src)? != self.fs.datasum(dst)? {
            return Err(Error::errno(
                libc::EINVAL,
                "clone: one file keeps checksums and the other not",
            ));
        }
        let ss = self.fs.store.sectorsize() as u64;
        let src_size = self.fs.rt(src)?.i_size;
        let len = if len == 0 {
            if soff == src_size {
                return Ok(());
            }
            if soff > src_size {
                return Err(Error::errno(
                    libc::EINVAL,
                    "clone: source offset past its end",
                ));
            }
            src_size - soff
        } else {
            len
        };
        if soff >= src_size
            || soff.checked_add(len).is_none_or(|e| e > src_size)
            || doff.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(Error::errno(
                libc::EINVAL,
                "clone: range past the end of the source",
            ));
        }
        let to_eof = soff + len == src_size;
        if !soff.is_multiple_of(ss) || !doff.is_multiple_of(ss) || (len % ss != 0 && !to_eof) {
            return Err(Error::errno(
                libc::EINVAL,
                "clone: offsets and length must be block aligned",
            ));
        }
        let dst_size = self.fs.rt(dst)?.i_size;
        if len % ss != 0 && doff + len < dst_size {
            return Err(Error::errno(
                libc::EINVAL,
                "clone: an unaligned tail must land at the destination's end",
            ));
        }
        let alen = len.div_ceil(ss) * ss;
        if src == dst && soff < doff + alen && doff < soff + alen {
            return Err(Error::errno(
                libc::EINVAL,
                "clone: overlapping ranges in one file",
            ));
        }
        self.fs.stamp(dst, true, true)?;
        // All of the source's dirty data, and the destination's in range.
        self.fs.writeback().inode(src, 0, u64::MAX, Reason::Sync)?;
        self.fs
            .writeback()
            .inode(dst, doff, doff + alen, Reason::Sync)?;
        // The clone waits for the source's data to reach the disk: the
        // destination may be logged pointing at it.
        self.fs.store.data().write_data_of((src.subvol, src.ino))?;
        if doff > dst_size {
            // btrfs_clone_files: the block holding the old end may have
            // been zeroed past it; that block up to the clone is written
            // back and waited for (not the file's other dirty data).
            self.fs.cont_expand(dst, dst_size, doff)?;
            self.fs
                .writeback()
                .inode(dst, dst_size / ss * ss, doff, Reason::Sync)?;
        }
        self.fs.drop_pages(dst, doff, doff + alen)?;
        let items = extents_in(&mut self.fs.store, src.subvol, src.ino, soff, soff + alen)?;
        let no_holes = self.fs.store.no_holes();
        let mut last_end = doff;
        let mut nbytes_add = 0u64;
        let mut inline_copy: Option<Vec<u8>> = None;
        let mut src_shares_new = false;
        // Whether any item of the source was cloned (only then is the
        // destination reflinked: a range of implicit holes is a punch).
        let mut shared = false;
        for (k, data) in items {
            match parse_file_extent(&data).map_err(|e| e.at(0, k))? {
                FileExtent::Inline { head, .. } => {
                    shared = true;
                    let datal = head.ram_bytes.get();
                    let dst_i = self.fs.rt(dst)?.i_size;
                    let dst_has_other =
                        extents_in(&mut self.fs.store, dst.subvol, dst.ino, 0, u64::MAX)?
                            .iter()
                            .any(|(dk, dd)| {
                                !(dk.offset == 0
                                    && matches!(
                                        parse_file_extent(dd),
                                        Ok(FileExtent::Inline { .. })
                                    ))
                            });
                    if doff == 0 && dst_i <= datal && !dst_has_other {
                        let dd = drop_extents(
                            &mut self.fs.store,
                            dst.subvol,
                            dst.ino,
                            0,
                            datal.div_ceil(ss) * ss,
                        )?;
                        self.fs.store.insert_item(
                            TreeId::Tree(dst.subvol),
                            &extent_key(dst.ino, 0),
                            &data,
                        )?;
                        let mut it = self.fs.item(dst)?;
                        it.nbytes
                            .set(it.nbytes.get().saturating_sub(dd.nbytes) + datal);
                        self.fs.put_item(dst, &it)?;
                    } else {
                        inline_copy = Some(self.fs.read(src, 0, datal)?);
                    }
                    last_end = doff + datal.div_ceil(ss) * ss;
                }
                FileExtent::Disk { item, .. } => {
                    let (s, e) = (k.offset, k.offset + item.num_bytes.get());
                    let (a, b) = (s.max(soff), e.min(soff + alen));
                    if a >= b {
                        continue;
                    }
                    shared = true;
                    let at = doff + (a - soff);
                    let dd = drop_extents(
                        &mut self.fs.store,
                        dst.subvol,
                        dst.ino,
                        last_end.min(at),
                        at + (b - a),
                    )?;
                    let mut it = self.fs.item(dst)?;
                    it.nbytes.set(it.nbytes.get().saturating_sub(dd.nbytes));
                    self.fs.put_item(dst, &it)?;
                    if last_end < at {
                        self.fs.writeback().fill_holes(dst, last_end, at)?;
                    }
                    if item.disk_bytenr.get() != 0
                        && item.generation.get() == self.fs.store.transid()
                    {
                        src_shares_new = true;
                    }
                    if item.disk_bytenr.get() != 0 || !no_holes {
                        let mut n = *item;
                        n.offset.set(item.offset.get() + (a - s));
                        // A hole's item keeps its ram_bytes, as the kernel's
                        // copy of the source item does (its offset moves like
                        // a data extent's).
                        n.num_bytes.set(b - a);
                        extents::insert_disk_extent(
                            &mut self.fs.store,
                            dst.subvol,
                            dst.ino,
                            at,
                            &n,
                        )?;
                        if item.disk_bytenr.get() != 0 {
                            nbytes_add += b - a;
                        }
                    }
                    last_end = at + (b - a);
                }
            }
        }
        // The trailing gap is punched.
        if last_end < doff + alen {
            let dd = drop_extents(
                &mut self.fs.store,
                dst.subvol,
                dst.ino,
                last_end,
                doff + alen,
            )?;
            let mut it = self.fs.item(dst)?;
            it.nbytes.set(it.nbytes.get().saturating_sub(dd.nbytes));
            self.fs.put_item(dst, &it)?;
            let lim = self.fs.rt(dst)?.i_size.div_ceil(ss) * ss;
            if last_end < lim {
                self.fs
                    .writeback()
                    .fill_holes(dst, last_end, (doff + alen).min(lim))?;
            }
        }
        let mut it = self.fs.item(dst)?;
        it.nbytes.set(it.nbytes.get() + nbytes_add);
        self.fs.put_item(dst, &it)?;
        let new_end = doff + len;
        if new_end > self.fs.rt(dst)?.i_size {
            self.fs.set_size(dst, new_end)?;
        }
        if let Some(bytes) = inline_copy {
            // Into the page cache, then written as the wait that follows does.
            let mut block = bytes;
            block.resize(ss as usize, 0);
            let keep = self.fs.rt(dst)?.i_size;
            self.fs.write(dst, doff, &block)?;
            self.fs.rt(dst)?.i_size = keep.max(self.fs.rt(dst)?.i_size.min(keep));
            self.fs
                .writeback()
                .inode(dst, doff, doff + ss, Reason::Sync)?;
        }
        // The destination is logged in full, with the extents it shares
        // (last_reflink_trans); the source only when what it shares is new.
        // A range of the source without items clones nothing: the
        // destination range is punched, a changed hole for a fast fsync
        // (btrfs_replace_file_extents without clone info).
        let t = self.fs.store.transid();
        if shared {
            let rt = self.fs.rt(dst)?;
            rt.full_sync = true;
            rt.last_reflink_trans = t;
        }
        if src_shares_new {
            self.fs.rt(src)?.last_reflink_trans = t;
        }
        self.fs.writeback().note_modified(dst, doff, doff + alen)?;
        self.fs.stamp(dst, true, true)
    }
}
