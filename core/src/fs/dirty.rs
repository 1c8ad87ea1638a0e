//! Dirty file data awaiting writeback, as the kernel's bdi_writeback tracks
//! it: which inodes have dirty pages and since when (the flusher writes
//! back what is old enough, background writeback goes oldest first), how
//! many bytes are dirty against the thresholds, and the page buffers
//! writeback frees for the next writes to reuse. The writeback itself
//! (turning pages into extents) is `fs/writeback.rs`.

use super::filesystem::Loc;
use std::collections::BTreeMap;
use std::time::Duration;

/// Dirty bytes, file pages and tree blocks together, past which data is
/// written back in the background (oldest inodes first, until the two
/// hold half of it), as the kernel counts the btree inode's dirty pages
/// with the files' against one threshold. Tree blocks can only go with a
/// commit, so a transaction heavy in metadata leaves less room for data:
/// a run of 100,000 new files (60 MiB of tree blocks by its end) keeps
/// memory bounded (peak RSS under 256 MiB with the clean block cache and
/// the write queues), while a workload of short-lived files (dbench)
/// keeps most of its data in memory until the files are gone. The
/// kernel's threshold is a share of the machine's memory; the engine's is
/// fixed, so its memory stays bounded whatever the machine.
const DIRTY_LIMIT: u64 = 96 << 20;

/// Dirty tree block bytes that start a commit (the engine does not write
/// a tree block twice in a transaction, as the kernel's writeback of
/// dirty metadata does, so it commits instead).
const DIRTY_METADATA_LIMIT: u64 = 64 << 20;

/// How often the flusher looks for old dirty data (dirty_writeback_centisecs).
const FLUSHER_INTERVAL: Duration = Duration::from_secs(5);

/// Age at which the flusher writes back dirty data (dirty_expire_centisecs).
pub(super) const DIRTY_EXPIRE: Duration = Duration::from_secs(30);

/// Written-back pages kept for reuse (4 MiB; more only raises the peak: an
/// allocator that keeps freed memory mapped, as the shell's does, reuses
/// the rest as well).
const KEEP_PAGES: usize = 1024;

/// The dirty data of a mount.
pub struct DirtyData {
    /// Inodes with dirty pages, and the clock reading when each first got
    /// them since its last writeback, with a count that orders inodes
    /// dirtied at one reading.
    inodes: BTreeMap<Loc, (Duration, u64)>,
    /// The next of those counts.
    seq: u64,
    /// Clock reading of the flusher's last pass.
    flusher_ran: Duration,
    /// Bytes of dirty pages over every inode.
    pub bytes: u64,
    /// Dirty page and tree block bytes that start background writeback.
    pub limit: u64,
    /// Dirty tree block bytes that start a commit.
    pub metadata_limit: u64,
    /// Pages written back, for reuse by the next writes (their memory stays
    /// mapped, so a write does not fault in fresh pages).
    free_pages: Vec<Box<[u8]>>,
    /// The buffer writeback joins a run of pages into, kept between calls:
    /// a fresh one per run (multi-megabyte for dbench's files) is a fresh
    /// mapping the kernel zeroes before the copy into it.
    pub(super) join_buf: Vec<u8>,
}

impl Default for DirtyData {
    fn default() -> DirtyData {
        DirtyData {
            inodes: BTreeMap::new(),
            seq: 0,
            flusher_ran: Duration::ZERO,
            bytes: 0,
            limit: DIRTY_LIMIT,
            metadata_limit: DIRTY_METADATA_LIMIT,
            free_pages: Vec::new(),
            join_buf: Vec::new(),
        }
    }
}

impl DirtyData {
    /// `l` got dirty pages at clock reading `now` (a no-op when it had
    /// some already: its age counts from the first).
    pub fn note_dirty(&mut self, l: Loc, now: Duration) {
        if let std::collections::btree_map::Entry::Vacant(e) = self.inodes.entry(l) {
            e.insert((now, self.seq));
            self.seq += 1;
        }
    }

    /// `l` has no dirty pages left.
    pub fn note_clean(&mut self, l: Loc) {
        self.inodes.remove(&l);
    }

    /// Whether `l` has dirty pages.
    pub fn is_dirty(&self, l: &Loc) -> bool {
        self.inodes.contains_key(l)
    }

    /// Inodes with dirty pages, in inode order.
    pub fn inodes(&self) -> Vec<Loc> {
        self.inodes.keys().copied().collect()
    }

    /// Inodes with dirty pages, the longest dirty first.
    pub fn oldest_first(&self) -> Vec<Loc> {
        let mut order: Vec<((Duration, u64), Loc)> =
            self.inodes.iter().map(|(l, t)| (*t, *l)).collect();
        order.sort_unstable();
        order.into_iter().map(|(_, l)| l).collect()
    }

    /// The flusher at clock reading `now`: when a pass is due (every
    /// FLUSHER_INTERVAL of clock time, not per step), the inodes dirty for
    /// DIRTY_EXPIRE or longer; None between passes.
    pub fn flusher_pass(&mut self, now: Duration) -> Option<Vec<Loc>> {
        if now.saturating_sub(self.flusher_ran) < FLUSHER_INTERVAL {
            return None;
        }
        self.flusher_ran = now;
        Some(
            self.inodes
                .iter()
                .filter(|(_, (t, _))| now.saturating_sub(*t) >= DIRTY_EXPIRE)
                .map(|(l, _)| *l)
                .collect(),
        )
    }

    /// A page buffer (contents undefined).
    pub fn alloc_page(&mut self) -> Box<[u8]> {
        self.free_pages
            .pop()
            .unwrap_or_else(|| vec![0u8; super::pagecache::PAGE as usize].into_boxed_slice())
    }

    /// A page holding `src` (a whole page of bytes): a recycled one, or a
    /// new one filled by the copy (never zeroed first).
    pub fn page_of(&mut self, src: &[u8]) -> Box<[u8]> {
        match self.free_pages.pop() {
            Some(mut p) => {
                p.copy_from_slice(src);
                p
            }
            None => Box::from(src),
        }
    }

    /// Keep written-back pages for reuse, up to KEEP_PAGES of them.
    pub fn recycle_pages(&mut self, pages: Vec<(u64, Box<[u8]>)>) {
        let room = KEEP_PAGES.saturating_sub(self.free_pages.len());
        self.free_pages
            .extend(pages.into_iter().take(room).map(|(_, p)| p));
    }
}
