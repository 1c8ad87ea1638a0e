//! Every tree block rewritten in place: what btrfstune does for the two
//! changes that touch what every block carries (the fsid and chunk tree
//! UUID of `-u`, the checksum of `--csum`) and so cannot be one CoW
//! commit without copying the whole metadata.
//!
//! Which blocks: every tree block the extent tree records (METADATA_ITEM,
//! or EXTENT_ITEM flagged TREE_BLOCK), as btrfstune enumerates them, so
//! that blocks of a tree whose deletion was interrupted are rewritten too.
//! Before anything is written, every tree reachable from the superblock
//! (the chunk tree, the root tree and every tree it lists, the part of a
//! half-dropped tree not yet freed) is walked and validated, and each
//! block reached must be one the extent tree records: a filesystem whose
//! extent tree misses a block would come out with that block unreadable,
//! so it is refused, unchanged.
//!
//! One read pass: every recorded block is read once, in runs of
//! neighbouring blocks, in parallel (up to [`AHEAD_BYTES`]; beyond that
//! the walk reads block by block and the rewrite in batches), validated
//! from memory by the walk and edited from memory by the rewrite.
//!
//! How: in batches of ascending address, the blocks are edited in
//! parallel, then written copy by copy: every first copy of the batch
//! in ascending device order, a flush, every second copy, a flush (RAID5/6
//! rows with their parity last). A torn write thus damages at most one
//! copy of a block, and the other holds the old state or the new. With a
//! single copy of metadata (profile single or raid0) a torn block write
//! cannot be undone, as with btrfstune; RAID5/6 rows are rewritten with
//! their parity, and a tear there can leave a row that does not rebuild. The caller
//! holds the superblock flag that says blocks may carry either state, and
//! readers accept either ([`Accept`]) until the caller clears it.
//!
//! Resumed runs: a block may then already be rewritten on some copies and
//! not others (a crash between the writes of its mirrors), so with
//! [`Options::resumed`] every copy is read and compared, and the block
//! written when any copy differs. A fresh run writes every block the edit
//! or the checksum changes.

use crate::check::Progress;
use crate::csum::CsumType;
use crate::devices::{Devices, Single};
use crate::format::consts::*;
use crate::format::key::Key;
use crate::image::{Image, OpenOptions};
use crate::io::BlockDevice;
use crate::tree::node::Expect;
use crate::tree::node::Node;
use crate::tree::walk::{walk, OnDamage, Place, WalkEvent, WalkOptions};
use crate::tree::{TreeIter, TreeRoot};
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;

/// What a block may carry while a change is half done, beside what the
/// superblock says: the other fsid, the other checksum algorithm.
#[derive(Clone, Debug, Default)]
pub struct Accept {
    /// Fsids accepted in headers (besides the superblock's tree fsid).
    pub fsids: Vec<[u8; 16]>,
    /// Checksum algorithms accepted (besides the superblock's).
    pub csums: Vec<CsumType>,
}

/// How to rewrite.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// An interrupted run is being finished: compare every copy.
    pub resumed: bool,
}

/// What a rewrite did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct RewriteStats {
    /// Tree blocks the extent tree records.
    pub blocks: u64,
    /// Blocks written (all their copies).
    pub written: u64,
    /// Blocks already as asked (a resumed run).
    pub already: u64,
    /// Blocks the extent tree records that no tree reaches and that are
    /// not valid tree blocks (stale records): left as they are.
    pub stale: u64,
    /// Bytes written to the devices, parity included.
    pub bytes: u64,
}

/// Bytes of blocks read, edited and written per batch: each batch costs
/// one flush per copy, and its blocks are held in memory until written.
const BATCH_BYTES: usize = 256 << 20;

/// Longest read or write of neighbouring blocks: 4 MiB.
const MAX_RUN: usize = 4 << 20;

/// Most bytes of tree blocks [`plan`] reads ahead and keeps for the
/// rewrite: metadata of a filesystem with tens of millions of files.
/// Beyond it the walk and the rewrite read for themselves.
const AHEAD_BYTES: usize = 1 << 30;

/// Open the filesystem on `devs` from their primary superblocks,
/// accepting blocks that carry any state `accept` allows besides the one
/// the superblock names.
pub fn open_accepting(devs: &[(String, Arc<dyn BlockDevice>)], accept: &Accept) -> Result<Image> {
    let (_, d) = devs
        .first()
        .ok_or_else(|| Error::Invalid("no device given".into()))?;
    let sb = crate::image::read_superblock(d.as_ref(), 0)?;
    let fsid = sb.tree_fsid();
    let csum = CsumType::from_disk(sb.csum_type.get())?;
    let opts = OpenOptions {
        alt_fsid: accept.fsids.iter().copied().find(|f| *f != fsid),
        alt_csum: accept.csums.iter().copied().find(|c| *c != csum),
        ..OpenOptions::default()
    };
    Ok(Devices::new(devs.to_vec()).open(opts, Single::AsSet)?.img)
}

/// Rewrite every tree block of the filesystem on `devs` in place: `edit`
/// changes a block's bytes (header fields, items; it must not change the
/// checksum field) and returns whether it changed anything; the block is
/// then checksummed with `out_csum` and written wherever that differs
/// from what is on disk.
pub fn rewrite_tree_blocks(
    devs: &[(String, Arc<dyn BlockDevice>)],
    accept: &Accept,
    out_csum: CsumType,
    edit: &(dyn Fn(&mut [u8]) -> bool + Sync),
    progress: &dyn Progress,
) -> Result<RewriteStats> {
    rewrite_with(devs, accept, out_csum, edit, Options::default(), progress)
}

/// [`rewrite_tree_blocks`] with [`Options`].
pub fn rewrite_with(
    devs: &[(String, Arc<dyn BlockDevice>)],
    accept: &Accept,
    out_csum: CsumType,
    edit: &(dyn Fn(&mut [u8]) -> bool + Sync),
    opts: Options,
    progress: &dyn Progress,
) -> Result<RewriteStats> {
    let img = open_accepting(devs, accept)?;
    let mut plan = plan(&img, progress)?;
    rewrite_listed(&img, &mut plan, out_csum, edit, opts, progress)
}

/// A block to rewrite: its address and whether a tree reaches it (one
/// that none reaches may be a stale record, left alone when invalid).
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    /// Logical address.
    pub bytenr: u64,
    /// Reached from the superblock (validated by [`plan`]).
    pub reached: bool,
}

/// What to rewrite: the blocks, and their bytes where read ahead.
#[derive(Default)]
pub struct Plan {
    /// Every block to rewrite, ascending.
    pub blocks: Vec<Planned>,
    /// Blocks read ahead (the first copy that could be read, not yet
    /// validated: the walk validates what it reaches, the rewrite checks
    /// checksum, address and fsid again). Taken by the rewrite.
    ahead: HashMap<u64, Node>,
}

impl Plan {
    /// A plan of the given blocks, nothing read ahead.
    pub fn of(blocks: Vec<Planned>) -> Plan {
        Plan {
            blocks,
            ahead: HashMap::new(),
        }
    }
}

/// The tree blocks to rewrite, in ascending address: every block the
/// extent tree records, after checking that every reachable block is one
/// of them and valid.
pub fn plan(img: &Image, progress: &dyn Progress) -> Result<Plan> {
    let recorded = recorded_tree_blocks(img)?;
    super::prof("rewrite: extent tree read");
    progress.phase(1, "validating every tree block", recorded.len() as u64);
    let ns = img.nodesize as usize;
    let ahead = if recorded.len().saturating_mul(ns) <= AHEAD_BYTES {
        read_ahead(img, &recorded, ns)
    } else {
        HashMap::new()
    };
    super::prof("rewrite: blocks read ahead");
    let reached = reachable_blocks(img, &ahead, progress)?;
    let set: HashSet<u64> = recorded.iter().copied().collect();
    if let Some(b) = reached.iter().find(|b| !set.contains(b)) {
        return Err(Error::corrupt_as(
            crate::CorruptKind::Reference,
            format!(
                "tree block {b} is in use but the extent tree does not record it: run btrkit-fsck --repair first"
            ),
            *b,
        ));
    }
    let reached: HashSet<u64> = reached.into_iter().collect();
    let blocks = recorded
        .into_iter()
        .map(|bytenr| Planned {
            bytenr,
            reached: reached.contains(&bytenr),
        })
        .collect();
    Ok(Plan { blocks, ahead })
}

/// Runs of neighbouring blocks of `blocks` (ascending) in one chunk, each
/// at most [`MAX_RUN`]: (index of the first, count).
fn runs_of(img: &Image, blocks: &[u64], ns: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < blocks.len() {
        let start = blocks[k];
        let chunk = img.chunks.lookup(start).map(|m| m.logical);
        let mut j = k + 1;
        while j < blocks.len()
            && blocks[j] == start + ((j - k) * ns) as u64
            && img.chunks.lookup(blocks[j]).map(|m| m.logical) == chunk
            && (j - k) * ns < MAX_RUN
        {
            j += 1;
        }
        out.push((k, j - k));
        k = j;
    }
    out
}

/// Reads in flight while reading ahead: cold reads overlap on the
/// device, whatever the number of cores.
const AHEAD_READERS: usize = 8;

/// Every block of `blocks` read, runs of neighbours as one read,
/// [`AHEAD_READERS`] runs in flight. A run that cannot be read is left
/// out: its blocks are read one by one, every copy tried, by whoever
/// needs them.
fn read_ahead(img: &Image, blocks: &[u64], ns: usize) -> HashMap<u64, Node> {
    let runs = runs_of(img, blocks, ns);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let read_runs = || {
        let mut got: Vec<(u64, Node)> = Vec::new();
        loop {
            let r = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(k, n)) = runs.get(r) else {
                return got;
            };
            let mut buf = vec![0u8; n * ns];
            if img.chunks.lookup(blocks[k]).is_none()
                || img.read_logical(blocks[k], &mut buf).is_err()
            {
                continue;
            }
            for (c, &b) in buf.chunks(ns).zip(&blocks[k..k + n]) {
                if let Ok(node) = Node::from_vec(b, c.to_vec()) {
                    got.push((b, node));
                }
            }
        }
    };
    let readers = AHEAD_READERS.min(runs.len()).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers).map(|_| s.spawn(read_runs)).collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Every tree block address the extent tree records, ascending.
fn recorded_tree_blocks(img: &Image) -> Result<Vec<u64>> {
    let root = img
        .find_root(BTRFS_EXTENT_TREE_OBJECTID)?
        .ok_or_else(|| Error::corrupt("no extent tree", 0))?;
    let mut out = Vec::new();
    let mut it = TreeIter::new(img, root, Key::MIN)?;
    while let Some(r) = it.next_item() {
        let item = r?;
        let tree_block = match item.key.ty {
            BTRFS_METADATA_ITEM_KEY => true,
            BTRFS_EXTENT_ITEM_KEY => {
                let d = item.data()?;
                // refs, generation, flags: the flags say tree block or data.
                let flags = d
                    .get(16..24)
                    .map(|f| u64::from_le_bytes(f.try_into().unwrap_or([0; 8])))
                    .ok_or_else(|| {
                        Error::corrupt_as(
                            crate::CorruptKind::Item,
                            "extent item too short for its flags".to_string(),
                            item.node.bytenr,
                        )
                    })?;
                flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0
            }
            _ => false,
        };
        if tree_block {
            out.push(item.key.objectid);
        }
    }
    // The extent tree is in key order already; a damaged one need not be.
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Every block reachable from the superblock, each read and validated
/// (with the alternates the image accepts); the first damaged one is an
/// error naming it. Level by level, each level's blocks read ahead and
/// then read and validated in parallel; a tree whose deletion was
/// interrupted is walked by the ordered walk, which knows which of its
/// subtrees are freed already.
fn reachable_blocks(
    img: &Image,
    ahead: &HashMap<u64, Node>,
    progress: &dyn Progress,
) -> Result<Vec<u64>> {
    let ctx = img.ctx(false);
    let mut seen: HashSet<u64> = HashSet::new();
    let mut level: Vec<(u64, Expect, u64)> = vec![
        (
            img.chunk_tree().bytenr,
            Expect::root(&img.chunk_tree()),
            BTRFS_CHUNK_TREE_OBJECTID,
        ),
        (
            img.root_tree().bytenr,
            Expect::root(&img.root_tree()),
            BTRFS_ROOT_TREE_OBJECTID,
        ),
    ];
    let mut dropping: Vec<(TreeRoot, Key)> = Vec::new();
    for (key, ri) in img.root_items_in(img.root_tree())? {
        if key.objectid == BTRFS_TREE_LOG_OBJECTID {
            continue;
        }
        let root = crate::image::tree_root_of(key.objectid, &ri);
        let drop = Key::from(&ri.drop_progress);
        if drop.objectid != 0 || drop.ty != 0 || drop.offset != 0 {
            dropping.push((root, drop));
        } else {
            level.push((root.bytenr, Expect::root(&root), root.id));
        }
    }
    // Bounded: every block is taken once (`seen`), and no tree is deeper
    // than BTRFS_MAX_LEVEL.
    for _ in 0..=BTRFS_MAX_LEVEL as usize {
        level.retain(|(b, _, _)| seen.insert(*b));
        if level.is_empty() {
            break;
        }
        for (b, _, _) in &level {
            if !ahead.contains_key(b) {
                img.prefetch_tree_block(*b);
            }
        }
        let read: Vec<Result<Vec<(u64, Expect, u64)>>> = level
            .par_iter()
            .map(|(b, expect, tree)| {
                // The copy read ahead when it is valid as this parent
                // expects it; else the image's own read, which tries
                // every copy and applies the image's leniencies.
                let valid_ahead = ahead.get(b).filter(|n| n.validate(&ctx, expect).is_empty());
                let read;
                let node = match valid_ahead {
                    Some(n) => n,
                    None => {
                        let (n, problems) = img.read_tree_block_checked(*b, expect, false)?;
                        if let Some(p) = problems.into_iter().next() {
                            return Err(p.into_error());
                        }
                        read = n;
                        &read
                    }
                };
                let mut children = Vec::new();
                if !node.is_leaf() {
                    for slot in 0..node.nritems() {
                        let c = node.child_expect(slot, *tree).ok_or_else(|| {
                            Error::corrupt_as(
                                crate::CorruptKind::Block(crate::error::ProblemKind::Header),
                                format!("node slot {slot} of {} items unreadable", node.nritems()),
                                *b,
                            )
                        })?;
                        children.push((c.bytenr, c.expect, *tree));
                    }
                }
                Ok(children)
            })
            .collect();
        progress.advance(level.len() as u64);
        let mut next = Vec::new();
        for r in read {
            next.extend(r?);
        }
        level = next;
    }
    if !level.is_empty() {
        return Err(Error::corrupt_as(
            crate::CorruptKind::Structure,
            "trees deeper than BTRFS_MAX_LEVEL".to_string(),
            level[0].0,
        ));
    }
    for (root, drop) in dropping {
        let opts = WalkOptions {
            on_damage: OnDamage::Keep,
            drop: Some(drop),
            prefetch: true,
            ..Default::default()
        };
        let start = Place::start(root.bytenr, Expect::root(&root));
        let mut bad: Option<Error> = None;
        let _ = walk(img, start, &opts, &mut seen, |ev| match ev {
            WalkEvent::Block { problems, .. } => {
                if let Some(p) = problems.first() {
                    bad = Some(p.clone().into_error());
                    return ControlFlow::Break(());
                }
                progress.advance(1);
                ControlFlow::Continue(true)
            }
            WalkEvent::Unreadable { error, bytenr, .. } => {
                bad = Some(Error::corrupt_as(
                    crate::CorruptKind::Lost,
                    format!("tree block unreadable: {error}"),
                    bytenr,
                ));
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(true),
        });
        if let Some(e) = bad {
            return Err(e);
        }
    }
    let mut v: Vec<u64> = seen.into_iter().collect();
    v.sort_unstable();
    Ok(v)
}

/// One block after its edit: where, the bytes, whether to write.
struct Edited {
    bytenr: u64,
    buf: Vec<u8>,
    /// Bytes from the block's start to write: the sectors holding every
    /// changed byte. An fsid or checksum change touches the header
    /// alone, so one sector is written instead of the block, and the
    /// write is as atomic as the device makes a sector write.
    len: usize,
    write: bool,
    stale: bool,
}

/// Rewrite the blocks `blocks` (from [`plan`], or a few the caller
/// knows) of `img` as [`rewrite_tree_blocks`] does.
pub fn rewrite_listed(
    img: &Image,
    plan: &mut Plan,
    out_csum: CsumType,
    edit: &(dyn Fn(&mut [u8]) -> bool + Sync),
    opts: Options,
    progress: &dyn Progress,
) -> Result<RewriteStats> {
    let blocks = std::mem::take(&mut plan.blocks);
    let mut stats = RewriteStats {
        blocks: blocks.len() as u64,
        ..Default::default()
    };
    progress.phase(2, "rewriting tree blocks", blocks.len() as u64);
    let ns = img.nodesize as usize;
    for batch in blocks.chunks((BATCH_BYTES / ns.max(1)).max(1)) {
        let pre: Vec<Option<Vec<u8>>> = if plan.ahead.is_empty() {
            read_runs(img, batch, ns)
        } else {
            batch
                .iter()
                .map(|p| plan.ahead.remove(&p.bytenr).map(Node::into_vec))
                .collect()
        };
        let edited: Vec<Result<Edited>> = batch
            .par_iter()
            .zip(pre.into_par_iter())
            .map(|(p, bytes)| edit_one(img, *p, bytes, ns, out_csum, edit, opts))
            .collect();
        // (copy number, (devid, physical), block, whole): every block's
        // first copies are written and flushed before any second copy is
        // begun, so a torn write can only damage one copy of a block; the
        // other stays valid in the old state or the new one, which either
        // reader accepts. Only the sectors holding a block's changes are
        // written (an fsid or checksum change: the header's sector), the
        // least a tear can reach and the least to write back; blocks
        // changed whole are written whole, neighbours as one write.
        let mut plain: Vec<(usize, (u64, u64), usize, bool)> = Vec::new();
        let mut parity: Vec<(u64, &[u8])> = Vec::new();
        let edited: Vec<Edited> = edited.into_iter().collect::<Result<_>>()?;
        for (i, e) in edited.iter().enumerate() {
            if e.stale {
                stats.stale += 1;
                continue;
            }
            if !e.write {
                stats.already += 1;
                continue;
            }
            stats.written += 1;
            if img.chunks.lookup(e.bytenr).is_some_and(|m| m.nparity() > 0) {
                parity.push((e.bytenr, &e.buf[..e.len]));
                continue;
            }
            let copies = img.chunks.copies(e.bytenr, ns as u64)?;
            let whole = e.len == ns;
            for (n, c) in copies.into_iter().enumerate() {
                plain.push((n, c, i, whole));
            }
        }
        plain.sort_unstable();
        let mut at = 0;
        let mut run: Vec<u8> = Vec::new();
        while at < plain.len() {
            let copy = plain[at].0;
            let end = at + plain[at..].iter().take_while(|w| w.0 == copy).count();
            let mut k = at;
            while k < end {
                let (_, (devid, phys), i, whole) = plain[k];
                let dev = img.device_of(devid).ok_or_else(|| Error::MissingDevice {
                    devids: vec![devid],
                    what: format!("device {devid} is missing: a tree block copy cannot be written"),
                })?;
                if !whole {
                    let e = &edited[i];
                    dev.write_at(phys, &e.buf[..e.len])?;
                    stats.bytes += e.len as u64;
                    k += 1;
                    continue;
                }
                // Whole blocks adjacent on the device: one write.
                run.clear();
                run.extend_from_slice(&edited[i].buf);
                let mut j = k + 1;
                while j < end
                    && plain[j].3
                    && plain[j].1 .0 == devid
                    && plain[j].1 .1 == phys + run.len() as u64
                    && run.len() < MAX_RUN
                {
                    run.extend_from_slice(&edited[plain[j].2].buf);
                    j += 1;
                }
                dev.write_at(phys, &run)?;
                stats.bytes += run.len() as u64;
                k = j;
            }
            flush_all(img)?;
            at = end;
        }
        if !parity.is_empty() {
            stats.bytes += img
                .parity
                .write(&img.chunks, &parity, img.device_map(), false)?;
            flush_all(img)?;
        }
        progress.advance(batch.len() as u64);
    }
    Ok(stats)
}

fn flush_all(img: &Image) -> Result<()> {
    for (_, d) in img.devices() {
        d.flush()?;
    }
    Ok(())
}

/// The blocks of `batch` read ahead, runs of neighbouring blocks in one
/// chunk as one read (the first copy); None where a run could not be read
/// (the block is then read on its own, every copy tried).
fn read_runs(img: &Image, batch: &[Planned], ns: usize) -> Vec<Option<Vec<u8>>> {
    let addrs: Vec<u64> = batch.iter().map(|p| p.bytenr).collect();
    let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(batch.len());
    for (k, n) in runs_of(img, &addrs, ns) {
        let mut buf = vec![0u8; n * ns];
        if img.chunks.lookup(addrs[k]).is_some() && img.read_logical(addrs[k], &mut buf).is_ok() {
            out.extend(buf.chunks(ns).map(|c| Some(c.to_vec())));
        } else {
            out.extend((0..n).map(|_| None));
        }
    }
    out
}

/// Whether `buf` is tree block `b` in a state `ctx` accepts: checksum
/// (either algorithm), address and fsid (either).
fn same_block(buf: &[u8], b: u64, ctx: &crate::tree::node::ValidateCtx) -> bool {
    use zerocopy::FromBytes;
    let csum_ok = crate::csum::verify_block(ctx.csum, buf)
        || ctx
            .alt_csum
            .is_some_and(|c| crate::csum::verify_block(c, buf));
    let Ok((h, _)) = crate::format::header::Header::read_from_prefix(buf) else {
        return false;
    };
    csum_ok
        && buf.len() == ctx.nodesize as usize
        && h.bytenr.get() == b
        && (h.fsid == ctx.fsid || ctx.alt_fsid == Some(h.fsid))
}

/// Read block `b` (the copy read ahead when it is valid in either state,
/// else the first copy that is), edit and checksum it; decide whether it
/// needs writing.
fn edit_one(
    img: &Image,
    p: Planned,
    ahead: Option<Vec<u8>>,
    ns: usize,
    out_csum: CsumType,
    edit: &(dyn Fn(&mut [u8]) -> bool + Sync),
    opts: Options,
) -> Result<Edited> {
    let b = p.bytenr;
    let ctx = img.ctx(false);
    // A block read ahead was validated whole by `plan` (or is a stale
    // record): here its checksum, address and fsid say it is the same
    // block in one of the two states.
    let ahead = ahead
        .filter(|v| same_block(v, b, &ctx))
        .and_then(|v| crate::tree::node::Node::from_vec(b, v).ok());
    let read = match ahead {
        Some(n) => Ok((n, Vec::new())),
        None => img.read_tree_block_checked(b, &Expect::default(), false),
    };
    let node = match read {
        Ok((n, _)) => n,
        // A record no tree reaches whose block is not valid: space the
        // extent tree still counts, never read by anyone.
        Err(Error::Corrupt { .. }) if !p.reached => {
            return Ok(Edited {
                bytenr: b,
                buf: Vec::new(),
                len: 0,
                write: false,
                stale: true,
            })
        }
        Err(e) => return Err(e),
    };
    let mut buf = node.into_vec();
    let before = buf.clone();
    edit(&mut buf);
    let c = crate::csum::block_csum(out_csum, &buf);
    buf[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
    let mut write = buf != before;
    let last = buf
        .iter()
        .zip(&before)
        .rposition(|(a, b)| a != b)
        .map_or(0, |i| i + 1);
    let sector = (img.sectorsize as usize).max(512);
    let mut len = last.div_ceil(sector) * sector;
    if opts.resumed {
        // A copy may have been torn anywhere by an earlier run: write
        // whole blocks.
        len = ns;
    }
    if !write && opts.resumed {
        // The copy read is done; another may not be.
        for copy in img.read_block_copies(b)? {
            match copy {
                Ok(v) if v == buf => {}
                _ => {
                    write = true;
                    break;
                }
            }
        }
    }
    debug_assert_eq!(buf.len(), ns);
    Ok(Edited {
        bytenr: b,
        buf,
        len: len.min(ns),
        write,
        stale: false,
    })
}
