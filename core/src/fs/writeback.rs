//! Writeback: dirty pages become extents through ordered extents, as the
//! kernel's delalloc path does (btrfs_run_delalloc_range):
//! - inodes with NODATACOW or PREALLOC go through the in-place path: space
//!   the file alone owns (preallocated, or regular in a nodatacow file) is
//!   overwritten; the rest is copied-on-write, never inline or compressed;
//! - compressible data (compress-force, or compress with the heuristic
//!   saying yes) is compressed in pieces of 128 KiB within chunks of
//!   512 KiB; a piece that does not save a block ends compression for its
//!   chunk and marks the inode NOCOMPRESS (unless forced);
//! - the rest is plain copy-on-write: inline for a whole small file, else
//!   extents of at most 128 MiB.
//!
//! An ordered extent is created when its data is submitted; its completion
//! puts the file extent item, the checksums and the extent reference in the
//! tree, writes the inode's pending times and moves its on-disk size.

use super::compress;
use super::extents::{
    self, drop_extents, extent_key, extents_in, fill_hole, MAX_COMPRESSED, MAX_EXTENT_SIZE,
};
use super::filesystem::{Filesystem, Loc};
use super::pagecache::PAGE;
use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent, FileExtentItem};
use crate::trans::delayed::BackRef;
use crate::trans::TreeId;
use crate::Result;
use zerocopy::IntoBytes;

/// Delayed allocation and ordered extents: dirty pages of files become extents (copy-on-write, in place, compressed or inline) and their file extent items, as the kernel's writeback and ordered-extent completion do. Obtained from [`Filesystem::writeback`].
pub struct Writeback<'a> {
    fs: &'a mut Filesystem,
}

impl Filesystem {
    /// See [`Writeback`].
    pub fn writeback(&mut self) -> Writeback<'_> {
        Writeback { fs: self }
    }
}

/// How far a ranged writeback follows a dirty run past its end: one
/// largest extent.
const MAX_DELALLOC_PAGES: u64 = MAX_EXTENT_SIZE / PAGE;

/// Capacity of the join buffer kept between writebacks.
const JOIN_KEEP: usize = 16 << 20;

/// Why data is written back (it decides whether it goes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Memory pressure or age (the flusher threads).
    Background,
    /// sync(2), a commit that flushes.
    Sync,
    /// fsync, msync, O_SYNC writes, sync_file_range.
    Fsync,
}

/// Where an ordered extent's data went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderedKind {
    /// A new extent (copy-on-write).
    Cow,
    /// Over an existing regular extent, in place (nodatacow).
    NoCow,
    /// Into preallocated space, in place; completion marks it written.
    Prealloc,
}

/// Data submitted for one extent, not yet in the file's extent map.
#[derive(Clone, Debug)]
pub struct OrderedExtent {
    /// The inode the data belongs to.
    pub loc: Loc,
    /// File offset of the data (bytes, sector aligned).
    pub file_off: u64,
    /// Length of the data in the file (bytes); the file extent's `num_bytes`.
    pub len: u64,
    /// Logical address of the disk extent.
    pub disk_bytenr: u64,
    /// Size of the disk extent (bytes; compressed size when compressed).
    pub disk_len: u64,
    /// Offset of this data within the disk extent (in place writes).
    pub extent_offset: u64,
    /// Uncompressed size of the whole disk extent (bytes).
    pub ram_bytes: u64,
    /// Compression of the extent (BTRFS_COMPRESS_*).
    pub compression: u8,
    /// Where the data went: a new extent or in place.
    pub kind: OrderedKind,
    /// Checksums were recorded for the data (the inode keeps them).
    pub datasum: bool,
}

/// Piece of a nocow decision: where the data goes in place.
struct InPlace {
    len: u64,
    kind: OrderedKind,
    bytenr: u64,
    disk_len: u64,
    ext_off: u64,
}

/// Take `[start, end)` out of cached hole maps (btrfs_drop_extent_map_range:
/// a map across the edge keeps the part outside).
pub(super) fn drop_hole_maps(
    maps: &mut std::collections::BTreeMap<u64, u64>,
    start: u64,
    end: u64,
) {
    if start >= end {
        return;
    }
    let hit: Vec<(u64, u64)> = maps
        .range(..end)
        .filter(|(_, &e)| e > start)
        .map(|(&s, &e)| (s, e))
        .collect();
    for (s, e) in hit {
        maps.remove(&s);
        if s < start {
            maps.insert(s, start);
        }
        if e > end {
            maps.insert(end, e);
        }
    }
}

/// Cache the hole map `[start, end)`, merged with cached holes it touches
/// (try_merge_map joins adjacent holes).
pub(super) fn add_hole_map(maps: &mut std::collections::BTreeMap<u64, u64>, start: u64, end: u64) {
    if start >= end {
        return;
    }
    let (mut s, mut e) = (start, end);
    let touching: Vec<(u64, u64)> = maps
        .range(..=end)
        .filter(|(_, &me)| me >= start)
        .map(|(&a, &b)| (a, b))
        .collect();
    for (a, b) in touching {
        maps.remove(&a);
        s = s.min(a);
        e = e.max(b);
    }
    maps.insert(s, e);
}

impl Writeback<'_> {
    /// Write back every inode's dirty pages.
    pub fn all(&mut self, reason: Reason) -> Result<()> {
        for l in self.fs.dirty.inodes() {
            self.inode(l, 0, u64::MAX, reason)?;
        }
        Ok(())
    }

    /// Write back the dirty pages of `l` meeting `[start, end)`.
    pub fn inode(&mut self, l: Loc, start: u64, end: u64, reason: Reason) -> Result<()> {
        let (from, mut to) = (start / PAGE, end.div_ceil(PAGE));
        if !self.fs.rt(l)?.pages.any_in(from, to) {
            return Ok(());
        }
        // Delalloc found from a dirty page runs forward over the whole
        // contiguous dirty run (find_lock_delalloc_range, up to the largest
        // extent), and waiting for the range's ordered extent writes all of
        // it: a ranged writeback takes the run that crosses its end along,
        // as far as that ordered extent goes. run_delalloc_nocow gives each
        // piece written in place (a prealloc extent, an extent of a
        // NODATACOW inode) its own, and the copy-on-write stretches
        // between theirs: the run stops where the kind of space changes.
        let limit = to.saturating_add(MAX_DELALLOC_PAGES);
        if to < limit && self.fs.rt(l)?.pages.contains(to - 1) && self.fs.rt(l)?.pages.contains(to)
        {
            let nocow_inode = self.fs.item(l)?.flags.get() & BTRFS_INODE_NODATACOW != 0;
            // (in place?, end of the space's span) at a byte offset.
            let span_of = |fs: &mut Filesystem, off: u64| -> Result<(bool, u64)> {
                Ok(match fs.map_at(l, off)? {
                    super::file::MapAt::Prealloc(_, e) => (true, e),
                    super::file::MapAt::Written(_, e) => (nocow_inode, e),
                    super::file::MapAt::Hole(_, e) => (false, e),
                })
            };
            let (mut in_place, mut span_end) = span_of(self.fs, (to - 1) * PAGE)?;
            while to < limit && self.fs.rt(l)?.pages.contains(to) {
                if to * PAGE >= span_end {
                    let (next_in_place, next_end) = span_of(self.fs, to * PAGE)?;
                    if in_place || next_in_place {
                        break;
                    }
                    (in_place, span_end) = (next_in_place, next_end.max(to * PAGE + PAGE));
                }
                to += 1;
            }
        }
        let rt = self.fs.rt(l)?;
        let i_size = rt.i_size;
        let pages = rt.pages.take_range(from, to);
        if rt.pages.is_empty() {
            self.fs.dirty.note_clean(l);
        }
        let n = pages.len() as u64 * PAGE;
        self.fs.dirty.bytes = self.fs.dirty.bytes.saturating_sub(n);
        // Runs of consecutive pages, as [first, end) into `pages`; a run of
        // one page is written from the page itself.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (i, (idx, _)) in pages.iter().enumerate() {
            match runs.last_mut() {
                Some((a, b)) if pages[*a].0 + (*b - *a) as u64 == *idx => *b = i + 1,
                _ => runs.push((i, i + 1)),
            }
        }
        // An fsync's own data goes out at once, ahead of what background
        // writeback queued (sync-io-first); otherwise it queues too.
        let direct = reason == Reason::Fsync && self.fs.switches.sync_io_first;
        self.fs
            .store
            .data()
            .set_data_context((l.subvol, l.ino), direct);
        let mut joined = std::mem::take(&mut self.fs.dirty.join_buf);
        let r = runs.into_iter().try_for_each(|(a, b)| {
            let start = pages[a].0 * PAGE;
            if b - a == 1 {
                return self.write_run(l, start, &pages[a].1, i_size, false);
            }
            joined.clear();
            joined.reserve((b - a) * PAGE as usize);
            for (_, p) in &pages[a..b] {
                joined.extend_from_slice(p);
            }
            self.write_run(l, start, &joined, i_size, false)
        });
        // Keep the buffer for the next run unless one extent's worth of
        // pages made it large (the memory would stay held for nothing).
        joined.clear();
        if joined.capacity() <= JOIN_KEEP {
            self.fs.dirty.join_buf = joined;
        }
        self.fs
            .store
            .data()
            .set_data_context((l.subvol, l.ino), false);
        r?;
        self.fs.dirty.recycle_pages(pages);
        Ok(())
    }

    /// Write sector-aligned data straight to extents (O_DIRECT on a
    /// nodatasum inode): never inline, never compressed.
    pub(super) fn write_direct_run(&mut self, l: Loc, start: u64, data: &[u8]) -> Result<()> {
        let i_size = self.fs.rt(l)?.i_size;
        // O_DIRECT is submitted at once.
        self.fs
            .store
            .data()
            .set_data_context((l.subvol, l.ino), true);
        let r = self.write_run(l, start, data, i_size, true);
        self.fs
            .store
            .data()
            .set_data_context((l.subvol, l.ino), false);
        r
    }

    fn write_run(
        &mut self,
        l: Loc,
        start: u64,
        data: &[u8],
        i_size: u64,
        direct: bool,
    ) -> Result<()> {
        self.fs.stats.writeback_bytes += data.len() as u64;
        let flags = self.fs.item(l)?.flags.get();
        if flags & (BTRFS_INODE_NODATACOW | BTRFS_INODE_PREALLOC) != 0 {
            return self.run_nocow(l, start, data, flags);
        }
        if !direct
            && self.wants_compression(l, flags, &data[..data.len().min(MAX_COMPRESSED as usize)])?
        {
            return self.run_compressed(l, start, data, i_size);
        }
        self.run_cow(l, start, data, i_size, !direct)
    }

    /// Plain copy-on-write of a run: inline when it is the whole small
    /// file, else new extents of at most 128 MiB.
    fn run_cow(
        &mut self,
        l: Loc,
        start: u64,
        data: &[u8],
        i_size: u64,
        inline_ok: bool,
    ) -> Result<()> {
        if inline_ok && start == 0 && self.try_inline(l, data, i_size, None)? {
            return Ok(());
        }
        let datasum = self.fs.datasum(l)?;
        let ss = self.fs.store.sectorsize() as u64;
        let mut pos = 0usize;
        while pos < data.len() {
            let want = ((data.len() - pos) as u64).min(MAX_EXTENT_SIZE);
            // As much of the run as the free space has in one piece.
            let (bytenr, n) = super::data::reserve_data_extent(&mut self.fs.store, want, ss)?;
            let disk = &data[pos..pos + n as usize];
            super::data::write_data_at(&mut self.fs.store, bytenr, disk, datasum)?;
            self.complete_cow(
                l,
                start + pos as u64,
                bytenr,
                n,
                n,
                BTRFS_COMPRESS_NONE,
                datasum,
            )?;
            pos += n as usize;
        }
        Ok(())
    }

    /// Allocate, write and complete one new extent holding `disk` for
    /// `[off, off+len)` of the file.
    fn cow_extent(
        &mut self,
        l: Loc,
        off: u64,
        disk: &[u8],
        len: u64,
        compression: u8,
        datasum: bool,
    ) -> Result<()> {
        let bytenr = super::data::write_data_extent(&mut self.fs.store, disk, datasum)?;
        self.complete_cow(l, off, bytenr, disk.len() as u64, len, compression, datasum)
    }

    /// Complete a new extent at `bytenr` (`disk_len` bytes on disk) holding
    /// `[off, off+len)` of the file.
    #[allow(clippy::too_many_arguments)]
    fn complete_cow(
        &mut self,
        l: Loc,
        off: u64,
        bytenr: u64,
        disk_len: u64,
        len: u64,
        compression: u8,
        datasum: bool,
    ) -> Result<()> {
        self.complete_ordered(&OrderedExtent {
            loc: l,
            file_off: off,
            len,
            disk_bytenr: bytenr,
            disk_len,
            extent_offset: 0,
            ram_bytes: len,
            compression,
            kind: OrderedKind::Cow,
            datasum,
        })
    }

    /// The in-place path (run_delalloc_nocow): space the file alone owns is
    /// written in place; everything else is gathered into copy-on-write
    /// runs (never inline, never compressed).
    fn run_nocow(&mut self, l: Loc, start: u64, data: &[u8], flags: u64) -> Result<()> {
        let nocow_inode = flags & BTRFS_INODE_NODATACOW != 0;
        let i_size = self.fs.rt(l)?.i_size;
        let end = start + data.len() as u64;
        let mut pos = start;
        let mut cow_start: Option<u64> = None;
        while pos < end {
            match self.nocow_target(l, pos, end - pos, nocow_inode)? {
                Some(t) => {
                    if let Some(cs) = cow_start.take() {
                        self.run_cow(
                            l,
                            cs,
                            &data[(cs - start) as usize..(pos - start) as usize],
                            i_size,
                            false,
                        )?;
                    }
                    let at = (pos - start) as usize;
                    self.write_in_place(l, pos, &data[at..at + t.len as usize], &t)?;
                    pos += t.len;
                }
                None => {
                    cow_start.get_or_insert(pos);
                    pos = self.next_extent_boundary(l, pos, end)?;
                }
            }
        }
        if let Some(cs) = cow_start {
            self.run_cow(l, cs, &data[(cs - start) as usize..], i_size, false)?;
        }
        Ok(())
    }

    /// The end of the extent item (or gap) holding `pos`, at most `end`.
    fn next_extent_boundary(&mut self, l: Loc, pos: u64, end: u64) -> Result<u64> {
        let ss = self.fs.store.sectorsize() as u64;
        let mut next = end;
        for (k, d) in extents_in(&mut self.fs.store, l.subvol, l.ino, pos, end)? {
            let Some((s, e)) = extents::extent_span(ss, k.offset, &d) else {
                continue;
            };
            if s <= pos && e > pos {
                next = next.min(e);
            } else if s > pos {
                next = next.min(s);
            }
        }
        Ok(next.max(pos + PAGE.min(end - pos)).min(end))
    }

    /// Whether data at `off` may be written in place (can_nocow_file_extent):
    /// a preallocated extent, or a regular one of a nodatacow inode; not
    /// compressed; written after the last snapshot; referenced only by this
    /// file at this offset; with no checksums. Returns how much of
    /// `[off, off+len)` it covers.
    fn nocow_target(
        &mut self,
        l: Loc,
        off: u64,
        len: u64,
        nocow_inode: bool,
    ) -> Result<Option<InPlace>> {
        let items = extents_in(&mut self.fs.store, l.subvol, l.ino, off, off + 1)?;
        let Some((k, d)) = items.into_iter().next() else {
            return Ok(None);
        };
        let Ok(FileExtent::Disk { head, item }) = parse_file_extent(&d) else {
            return Ok(None);
        };
        let bytenr = item.disk_bytenr.get();
        if bytenr == 0
            || head.compression != BTRFS_COMPRESS_NONE
            || head.encryption != 0
            || head.other_encoding.get() != 0
            || k.offset > off
        {
            return Ok(None);
        }
        let kind = match head.type_ {
            BTRFS_FILE_EXTENT_PREALLOC => OrderedKind::Prealloc,
            BTRFS_FILE_EXTENT_REG if nocow_inode => OrderedKind::NoCow,
            _ => return Ok(None),
        };
        let last_snapshot = match self.fs.store.root_state(l.subvol)?.item.as_ref() {
            Some((_, ri)) => ri.last_snapshot.get(),
            None => 0,
        };
        if head.generation.get() <= last_snapshot {
            return Ok(None);
        }
        let r = extents::data_backref(l.subvol, l.ino, k.offset, item);
        if !self
            .fs
            .store
            .extent_refs()
            .data_extent_exclusive(bytenr, r)?
        {
            return Ok(None);
        }
        let end = (k.offset + item.num_bytes.get()).min(off + len);
        let ext_off = item.offset.get() + (off - k.offset);
        if self
            .fs
            .store
            .csums()
            .csum_lookup(bytenr + ext_off, end - off)?
            .any_present()
        {
            return Ok(None);
        }
        Ok(Some(InPlace {
            len: end - off,
            kind,
            bytenr,
            disk_len: item.disk_num_bytes.get(),
            ext_off,
        }))
    }

    /// Write data over space the file owns, then complete.
    fn write_in_place(&mut self, l: Loc, off: u64, data: &[u8], t: &InPlace) -> Result<()> {
        let datasum = self.fs.datasum(l)?;
        let at = t.bytenr + t.ext_off;
        self.fs.store.data().write_in_place_data(at, data)?;
        if datasum {
            let sums = super::data::sector_csums(&self.fs.store, data);
            self.fs.store.csums().csum_insert(at, &sums)?;
        }
        self.fs.stats.nocow_writes += 1;
        let oe = OrderedExtent {
            loc: l,
            file_off: off,
            len: data.len() as u64,
            disk_bytenr: t.bytenr,
            disk_len: t.disk_len,
            extent_offset: t.ext_off,
            ram_bytes: t.disk_len,
            compression: BTRFS_COMPRESS_NONE,
            kind: t.kind,
            datasum,
        };
        self.complete_ordered(&oe)
    }

    /// Whether writeback of this inode compresses (inode_need_compress):
    /// compress-force always; else not once the inode gave up
    /// (NOCOMPRESS); else the heuristic decides when the mount option, the
    /// inode's compress flag (chattr +c) or its compression property asks
    /// for compression.
    fn wants_compression(&mut self, l: Loc, flags: u64, sample: &[u8]) -> Result<bool> {
        if flags & (BTRFS_INODE_NODATACOW | BTRFS_INODE_NODATASUM) != 0 {
            return Ok(false);
        }
        if self.fs.opts.compress.is_some() && self.fs.opts.compress_force {
            return Ok(true);
        }
        if flags & BTRFS_INODE_NOCOMPRESS != 0 {
            return Ok(false);
        }
        let asked = self.fs.opts.compress.is_some()
            || flags & BTRFS_INODE_COMPRESS != 0
            || self.fs.xattrs().prop_compress(l)? != 0;
        Ok(asked && compress::heuristic(sample))
    }

    /// The algorithm and level for a compressed write: the property's type
    /// before the mount option's (zlib when neither names one); the mount
    /// option's level, clamped to the type's range, or its default.
    fn compress_method(&mut self, l: Loc) -> Result<compress::Method> {
        let mount = self.fs.opts.compress;
        let kind = match self.fs.xattrs().prop_compress(l)? {
            0 => mount.map_or(BTRFS_COMPRESS_ZLIB, |m| m.kind),
            k => k,
        };
        Ok(compress::Method::with_level(
            kind,
            mount.map_or(0, |m| m.level),
        ))
    }

    /// The compression path (compress_file_range): chunks of 512 KiB, each
    /// compressed in pieces of 128 KiB. A piece that does not save a block
    /// ends compression for the rest of its chunk (and marks the inode
    /// NOCOMPRESS unless compression is forced); a piece the heuristic
    /// rejects ends it without the mark.
    fn run_compressed(&mut self, l: Loc, start: u64, data: &[u8], i_size: u64) -> Result<()> {
        const CHUNK: u64 = 512 << 10;
        let ss = self.fs.store.sectorsize() as u64;
        let method = self.compress_method(l)?;
        let end = start + data.len() as u64;
        let slice = |a: u64, b: u64| &data[(a - start) as usize..(b - start) as usize];
        let mut chunk = start;
        while chunk < end {
            let chunk_end = (chunk + CHUNK).min(end);
            let mut pos = chunk;
            while pos < chunk_end {
                let piece_end = (pos + MAX_COMPRESSED).min(chunk_end);
                // Only bytes below the file's size are compressed.
                let in_len = piece_end.min(i_size).saturating_sub(pos);
                if pos > chunk {
                    let flags = self.fs.item(l)?.flags.get();
                    if !self.wants_compression(l, flags, slice(pos, piece_end))? {
                        self.run_cow(l, pos, slice(pos, chunk_end), i_size, true)?;
                        break;
                    }
                }
                let compressed = if in_len > 0 {
                    compress::compress(method, slice(pos, pos + in_len), ss as usize)
                } else {
                    None
                };
                // The whole small file: compressed inline, else plain inline.
                if pos == 0 && piece_end >= i_size {
                    if let Some(c) = &compressed {
                        if self.try_inline(
                            l,
                            slice(pos, piece_end),
                            i_size,
                            Some((method.kind, c)),
                        )? {
                            pos = piece_end;
                            continue;
                        }
                    }
                    if self.try_inline(l, slice(pos, piece_end), i_size, None)? {
                        pos = piece_end;
                        continue;
                    }
                }
                let total_in = in_len.div_ceil(ss) * ss;
                let good = compressed.filter(|c| compress::saves_a_sector(c.len(), total_in, ss));
                match good {
                    Some(mut disk) => {
                        disk.resize(((disk.len() as u64).div_ceil(ss) * ss) as usize, 0);
                        self.fs.stats.compressed_extents += 1;
                        self.cow_extent(l, pos, &disk, total_in, method.kind, true)?;
                        pos += total_in;
                    }
                    None => {
                        if !self.fs.opts.compress_force && self.fs.xattrs().prop_compress(l)? == 0 {
                            let mut it = self.fs.item(l)?;
                            it.flags.set(it.flags.get() | BTRFS_INODE_NOCOMPRESS);
                            self.fs.put_item(l, &it)?;
                        }
                        self.run_cow(l, pos, slice(pos, chunk_end), i_size, true)?;
                        break;
                    }
                }
            }
            chunk = chunk_end;
        }
        Ok(())
    }

    /// Store the whole small file inline (can_cow_file_range_inline): the
    /// run starts at 0, the file ends within the first block, and the
    /// stored bytes (`compressed`, or the file's bytes) are fewer than a
    /// block and at most `max_inline`. Never for nodatacow or preallocating
    /// inodes.
    fn try_inline(
        &mut self,
        l: Loc,
        data: &[u8],
        i_size: u64,
        compressed: Option<(u8, &Vec<u8>)>,
    ) -> Result<bool> {
        let ss = self.fs.store.sectorsize() as u64;
        if i_size == 0 || i_size > ss || (data.len() as u64) < i_size {
            return Ok(false);
        }
        // Never inline a block's worth or more, nor past max_inline
        // uncompressed (checked before reading anything).
        if compressed.is_none() && (i_size >= ss || i_size > self.fs.opts.max_inline.min(ss)) {
            return Ok(false);
        }
        let flags = self.fs.item(l)?.flags.get();
        if flags & (BTRFS_INODE_NODATACOW | BTRFS_INODE_PREALLOC) != 0 {
            return Ok(false);
        }
        let (compression, payload): (u8, &[u8]) = match compressed {
            Some((k, c)) => (k, &c[..]),
            None => (BTRFS_COMPRESS_NONE, &data[..i_size as usize]),
        };
        let data_len = payload.len() as u64;
        let max_inline = self.fs.opts.max_inline.min(ss);
        if data_len >= ss
            || data_len > max_inline
            || data_len > extents::max_inline_data(&self.fs.store)
        {
            return Ok(false);
        }
        let dropped = drop_extents(&mut self.fs.store, l.subvol, l.ino, 0, ss)?;
        super::data::write_inline(
            &mut self.fs.store,
            l.subvol,
            l.ino,
            i_size,
            compression,
            payload,
        )?;
        self.fs.stats.inline_extents += 1;
        self.finish_inode_update(l, i_size as i64 - dropped.nbytes as i64)?;
        self.fs.set_full_sync(l)?;
        self.note_modified(l, 0, ss)?;
        Ok(true)
    }

    /// The completion of an ordered extent (btrfs_finish_one_ordered): the
    /// file extent item and reference (or, in place, nothing / the
    /// prealloc conversion), nbytes, the pending times, the on-disk size.
    pub(super) fn complete_ordered(&mut self, oe: &OrderedExtent) -> Result<()> {
        let l = oe.loc;
        let t = TreeId::Tree(l.subvol);
        let transid = self.fs.store.transid();
        self.fs.stats.ordered_extents += 1;
        let (start, end) = (oe.file_off, oe.file_off + oe.len);
        let mut nbytes_delta: i64 = 0;
        match oe.kind {
            OrderedKind::Cow => {
                let d = drop_extents(&mut self.fs.store, l.subvol, l.ino, start, end)?;
                nbytes_delta -= d.nbytes as i64;
                let fe = FileExtentItem::new(
                    BTRFS_FILE_EXTENT_REG,
                    transid,
                    oe.disk_bytenr,
                    oe.disk_len,
                    oe.extent_offset,
                    oe.len,
                    oe.ram_bytes,
                    oe.compression,
                );
                self.fs
                    .store
                    .insert_item(t, &extent_key(l.ino, start), fe.as_bytes())?;
                // A back reference names where the extent's first byte
                // would be in the file (key offset minus extent offset).
                let r = BackRef::Data {
                    root: l.subvol,
                    objectid: l.ino,
                    offset: start.wrapping_sub(oe.extent_offset),
                };
                super::data::reference_new_extent(
                    &mut self.fs.store,
                    oe.disk_bytenr,
                    oe.disk_len,
                    r,
                );
                nbytes_delta += oe.len as i64;
            }
            OrderedKind::NoCow => {}
            OrderedKind::Prealloc => self.mark_written(l, start, end)?,
        }
        self.finish_inode_update(l, nbytes_delta)?;
        self.note_modified(l, start, end)
    }

    /// The inode update that ends an ordered extent or an inline write
    /// (btrfs_update_inode): nbytes, transid, the times a write left
    /// pending and the on-disk size, in one change of the item.
    fn finish_inode_update(&mut self, l: Loc, nbytes_delta: i64) -> Result<()> {
        let transid = self.fs.store.transid();
        let new_size = self.disk_size_now(l)?;
        let rt = self.fs.rt(l)?;
        let times = rt.pending_times.take();
        rt.disk_i_size = new_size;
        self.fs.modify(l, |it| {
            it.nbytes
                .set((it.nbytes.get() as i64 + nbytes_delta).max(0) as u64);
            it.transid.set(transid);
            if let Some((m, c)) = times {
                it.mtime = m;
                it.ctime = c;
                it.sequence.set(it.sequence.get() + 1);
            }
            it.size.set(new_size);
        })
    }

    /// The on-disk size after an update (btrfs_inode_safe_disk_i_size_write
    /// with 0): the in-memory size, or without no-holes only as far as
    /// extent items cover the file contiguously from 0.
    pub(super) fn set_disk_size(&mut self, l: Loc) -> Result<()> {
        let new = self.disk_size_now(l)?;
        let rt = self.fs.rt(l)?;
        if new != rt.disk_i_size {
            rt.disk_i_size = new;
        }
        let mut it = self.fs.item(l)?;
        if it.size.get() != new {
            it.size.set(new);
            self.fs.put_item(l, &it)?;
        }
        Ok(())
    }

    /// What the on-disk size becomes now.
    fn disk_size_now(&mut self, l: Loc) -> Result<u64> {
        let i_size = self.fs.rt(l)?.i_size;
        Ok(if self.fs.store.no_holes() {
            i_size
        } else {
            i_size.min(self.covered_from_zero(l, i_size)?)
        })
    }

    /// How far extent items (holes included) cover the file without a gap
    /// from offset 0, looking no further than `limit`.
    fn covered_from_zero(&mut self, l: Loc, limit: u64) -> Result<u64> {
        let ss = self.fs.store.sectorsize() as u64;
        let mut pos = 0u64;
        for (k, d) in extents_in(&mut self.fs.store, l.subvol, l.ino, 0, limit.max(1))? {
            let Some((s, e)) = extents::extent_span(ss, k.offset, &d) else {
                continue;
            };
            if s > pos {
                break;
            }
            pos = pos.max(e);
        }
        Ok(pos)
    }

    /// Turn preallocated `[start, end)` into written data
    /// (btrfs_mark_extent_written): the written part of the prealloc item
    /// joins a neighbouring written item of the same extent when it can,
    /// else the item is split and the middle becomes regular (one more
    /// reference per new item).
    fn mark_written(&mut self, l: Loc, start: u64, end: u64) -> Result<()> {
        let t = TreeId::Tree(l.subvol);
        let transid = self.fs.store.transid();
        let items = extents_in(&mut self.fs.store, l.subvol, l.ino, start, end)?;
        for (k, d) in items {
            let Ok(FileExtent::Disk { head, item }) = parse_file_extent(&d) else {
                continue;
            };
            if head.type_ != BTRFS_FILE_EXTENT_PREALLOC {
                continue;
            }
            let fe = *item;
            let (s, e) = (k.offset, k.offset + fe.num_bytes.get());
            let (a, b) = (s.max(start), e.min(end));
            let bytenr = fe.disk_bytenr.get();
            let orig = k.offset.wrapping_sub(fe.offset.get());
            let r = extents::data_backref(l.subvol, l.ino, k.offset, &fe);
            let mergeable = |x: &FileExtentItem| {
                x.disk_bytenr.get() == bytenr
                    && x.type_ == BTRFS_FILE_EXTENT_REG
                    && x.compression == 0
                    && x.encryption == 0
                    && x.other_encoding.get() == 0
            };
            // Written at the front, the previous item written and adjacent.
            if a == s && b < e {
                if let Some((pk, pd)) = self.fs.store.prev_item(
                    t,
                    &extent_key(l.ino, s.saturating_sub(1)),
                    &extent_key(l.ino, 0),
                )? {
                    if let Ok(FileExtent::Disk { item: p, .. }) = parse_file_extent(&pd) {
                        if mergeable(p)
                            && pk.offset + p.num_bytes.get() == s
                            && pk.offset.wrapping_sub(p.offset.get()) == orig
                        {
                            let mut np = *p;
                            np.num_bytes.set(b - pk.offset);
                            np.generation.set(transid);
                            self.fs.store.update_item(t, &pk, np.as_bytes())?;
                            let mut rest = fe;
                            rest.offset.set(b - orig);
                            rest.num_bytes.set(e - b);
                            rest.generation.set(transid);
                            self.fs.store.delete_item(t, &k)?;
                            self.fs
                                .store
                                .insert_item(t, &extent_key(l.ino, b), rest.as_bytes())?;
                            continue;
                        }
                    }
                }
            }
            // Written at the back, the next item written and adjacent.
            if b == e && a > s {
                if let Some((nk, nd)) = self.fs.store.next_item(t, &extent_key(l.ino, e))? {
                    if nk.objectid == l.ino && nk.ty == BTRFS_EXTENT_DATA_KEY && nk.offset == e {
                        if let Ok(FileExtent::Disk { item: n, .. }) = parse_file_extent(&nd) {
                            if mergeable(n) && nk.offset.wrapping_sub(n.offset.get()) == orig {
                                let mut cur = fe;
                                cur.num_bytes.set(a - s);
                                cur.generation.set(transid);
                                self.fs.store.update_item(t, &k, cur.as_bytes())?;
                                let mut nn = *n;
                                nn.offset.set(a - orig);
                                nn.num_bytes.set(n.num_bytes.get() + (e - a));
                                nn.generation.set(transid);
                                self.fs.store.delete_item(t, &nk)?;
                                self.fs.store.insert_item(
                                    t,
                                    &extent_key(l.ino, a),
                                    nn.as_bytes(),
                                )?;
                                continue;
                            }
                        }
                    }
                }
            }
            let mut pieces = 0i64;
            if s < a {
                let mut left = fe;
                left.num_bytes.set(a - s);
                left.generation.set(transid);
                self.fs.store.update_item(t, &k, left.as_bytes())?;
                pieces += 1;
            } else {
                self.fs.store.delete_item(t, &k)?;
            }
            let mut mid = fe;
            mid.type_ = BTRFS_FILE_EXTENT_REG;
            mid.generation.set(transid);
            mid.offset.set(fe.offset.get() + (a - s));
            mid.num_bytes.set(b - a);
            self.fs
                .store
                .insert_item(t, &extent_key(l.ino, a), mid.as_bytes())?;
            pieces += 1;
            if b < e {
                let mut right = fe;
                right.offset.set(fe.offset.get() + (b - s));
                right.num_bytes.set(e - b);
                right.generation.set(transid);
                self.fs
                    .store
                    .insert_item(t, &extent_key(l.ino, b), right.as_bytes())?;
                pieces += 1;
            }
            if pieces > 1 {
                self.fs.store.extent_refs().queue_data_ref(
                    bytenr,
                    fe.disk_num_bytes.get(),
                    r,
                    pieces - 1,
                );
            }
        }
        Ok(())
    }

    /// The extent map of `[start, end)` changed (what a fast fsync logs).
    pub(super) fn note_modified(&mut self, l: Loc, start: u64, end: u64) -> Result<()> {
        let rt = self.fs.rt(l)?;
        drop_hole_maps(&mut rt.hole_maps, start, end);
        match rt.modified.last_mut() {
            Some(r) if r.1 >= start && r.0 <= end => {
                r.0 = r.0.min(start);
                r.1 = r.1.max(end);
            }
            _ => rt.modified.push((start, end)),
        }
        self.fs.touch_trans(l)
    }

    /// Cover `[start, end)` with explicit holes where the filesystem has no
    /// no-holes feature and no extent covers it.
    pub(super) fn fill_holes(&mut self, l: Loc, start: u64, end: u64) -> Result<()> {
        if self.fs.store.no_holes() || start >= end {
            return Ok(());
        }
        let ss = self.fs.store.sectorsize() as u64;
        let mut pos = start;
        let items = extents_in(&mut self.fs.store, l.subvol, l.ino, start, end)?;
        let transid = self.fs.store.transid();
        for (k, d) in items {
            let Some((s, e)) = extents::extent_span(ss, k.offset, &d) else {
                continue;
            };
            if s > pos {
                fill_hole(
                    &mut self.fs.store,
                    l.subvol,
                    l.ino,
                    pos,
                    s.min(end),
                    transid,
                )?;
            }
            pos = pos.max(e);
        }
        if pos < end {
            fill_hole(&mut self.fs.store, l.subvol, l.ino, pos, end, transid)?;
        }
        Ok(())
    }
}

impl Writeback<'_> {
    /// The flusher's or sync's writeback of whole inodes
    /// (writeback_inodes_sb): every dirty page goes, and every inode's
    /// dirty state is cleared, pages written or not.
    pub(super) fn writeback_inodes(&mut self, reason: Reason) -> Result<()> {
        self.fs.writeback().all(reason)?;
        for rt in self.fs.inodes.states_mut() {
            rt.pages_dirtied_at = None;
        }
        Ok(())
    }

    /// Background writeback past the dirty limit (wb_writeback for the
    /// background threshold): whole inodes in the order they were dirtied,
    /// until dirty file data is down to `target`, each written inode's dirty
    /// state cleared (__writeback_single_inode). The newest dirty data
    /// stays in memory, so a file written and deleted soon after (dbench's
    /// temporary files) is never written at all, as on the kernel.
    pub(super) fn writeback_oldest(&mut self, target: u64) -> Result<()> {
        for l in self.fs.dirty.oldest_first() {
            if self.fs.dirty.bytes <= target {
                break;
            }
            self.fs
                .writeback()
                .inode(l, 0, u64::MAX, Reason::Background)?;
            if let Some(rt) = self.fs.inodes.get_mut(&l) {
                rt.pages_dirtied_at = None;
            }
        }
        Ok(())
    }
}
