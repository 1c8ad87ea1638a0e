//! A tree block held in memory, with bounds-checked accessors and the
//! structural validation of the kernel's tree-checker: checksum, header
//! (bytenr, fsid, level, owner, generation), key order within the block,
//! item bounds and item bodies, and what the parent expects (level, parent
//! transid, first key).

use crate::csum::{verify_block, CsumType};
use crate::format::consts::*;
use crate::format::header::{Header, Item, KeyPtr, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use crate::format::item::{decode, ItemBody};
use crate::format::key::Key;
use crate::CorruptKind;
use crate::{Error, Result};
use zerocopy::FromBytes;

/// What the referrer of a block says about it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Expect {
    /// Level the block must have (one below the parent's pointer, or the root
    /// item's level).
    pub level: Option<u8>,
    /// Parent transid: the generation in the parent's key pointer (or root item).
    pub generation: Option<u64>,
    /// Tree id of the tree being read.
    pub owner: Option<u64>,
    /// Key the block's slot 0 must hold: the key of the parent's pointer to it
    /// (`btrfs_key_ptr.key`); None for a root block.
    pub first_key: Option<Key>,
}

impl Expect {
    /// What a root pointer held as a level and a generation says about the
    /// root block (the owner is filled in by the reader); a None
    /// generation where the pointer records none (a log root tree's root).
    pub fn root_block(level: u8, generation: Option<u64>) -> Expect {
        Expect {
            level: Some(level),
            generation,
            owner: None,
            first_key: None,
        }
    }
    /// What the pointer to a tree's root block (its root item, the
    /// superblock, or a log root item) says about that block. The owner is
    /// the tree's id; `Node::validate` decides how strictly it is compared
    /// (any subvolume for a subvolume tree, not at all for log and
    /// relocation trees).
    pub fn root(root: &super::TreeRoot) -> Expect {
        Expect {
            level: Some(root.level),
            generation: Some(root.generation),
            owner: Some(root.id),
            first_key: None,
        }
    }
}

/// The child that the pointer in `slot` of node block `buf` names, with
/// what the pointer says about it: one level below the node, the
/// pointer's generation as its parent transid, the pointer's key as its
/// first key, owned by `tree` (the tree being read). This is the one place
/// those expectations are derived; every walk, reading or editing, takes
/// them from here. None for a leaf, or a slot outside the block or past
/// `nritems`.
pub fn child_in(buf: &[u8], slot: usize, tree: u64) -> Option<Child> {
    let (hdr, _) = Header::ref_from_prefix(buf).ok()?;
    let level = hdr.level.checked_sub(1)?;
    if slot >= hdr.nritems.get() as usize {
        return None;
    }
    let o = HEADER_SIZE.checked_add(slot.checked_mul(KEY_PTR_SIZE)?)?;
    let (p, _) = KeyPtr::ref_from_prefix(buf.get(o..)?).ok()?;
    Some(Child {
        bytenr: p.blockptr.get(),
        expect: Expect {
            level: Some(level),
            generation: Some(p.generation.get()),
            owner: Some(tree),
            first_key: Some(Key::from(&p.key)),
        },
    })
}

/// A child of a node and what the node's pointer says about it.
#[derive(Clone, Copy, Debug)]
pub struct Child {
    /// Logical address of the child block (the pointer's blockptr).
    pub bytenr: u64,
    /// The child's key range starts at `expect.first_key` (the pointer's
    /// key).
    pub expect: Expect,
}

/// Filesystem-wide facts a block is checked against.
#[derive(Clone, Copy, Debug)]
pub struct ValidateCtx {
    /// Tree block size in bytes (superblock `nodesize`); every block is exactly this.
    pub nodesize: u32,
    /// Sector size in bytes; key pointers must be aligned to it.
    pub sectorsize: u32,
    /// Checksum algorithm of the filesystem (superblock `csum_type`).
    pub csum: CsumType,
    /// Filesystem id every block header must carry (the metadata uuid when the
    /// METADATA_UUID incompat flag is set).
    pub fsid: [u8; 16],
    /// Another fsid accepted as well (an unfinished fsid change).
    pub alt_fsid: Option<[u8; 16]>,
    /// Another checksum algorithm accepted as well (an unfinished
    /// checksum conversion).
    pub alt_csum: Option<CsumType>,
    /// Newest generation a block may carry (superblock generation, +1 for log trees).
    pub max_generation: u64,
}

/// One thing wrong with a block.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// Logical address (bytes) of the block the problem is in.
    pub bytenr: u64,
    /// Key of the offending item or pointer, when the problem is in one.
    pub key: Option<Key>,
    /// Item slot, when the problem is in one item.
    pub slot: Option<usize>,
    /// Which check failed (checksum, header, level, key order, ...).
    pub kind: ProblemKind,
    /// Human-readable description of what is wrong.
    pub message: String,
}

pub use crate::error::ProblemKind;

impl Problem {
    /// Turn the problem into an [`Error::Corrupt`] with a block kind, for callers
    /// that stop at the first problem.
    pub fn into_error(self) -> Error {
        Error::Corrupt {
            kind: crate::error::CorruptKind::Block(self.kind),
            what: format!("tree block: {}", self.message),
            bytenr: self.bytenr,
            key: self.key,
        }
    }
}

/// A tree block (leaf or node) read into memory: one `nodesize` buffer and the
/// logical address it was read from. Accessors are bounds-checked against the
/// buffer, so a corrupt `nritems` or item offset cannot read past it; use
/// [`Node::validate`] for the tree-checker's structural checks.
#[derive(Clone)]
pub struct Node {
    /// Logical address (bytes) the block was read from.
    pub bytenr: u64,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Node({} level {} nritems {})",
            self.bytenr,
            self.level(),
            self.nritems()
        )
    }
}

impl Node {
    /// Wrap a block of exactly nodesize bytes (at least a header).
    pub fn from_vec(bytenr: u64, buf: Vec<u8>) -> Result<Node> {
        if buf.len() < HEADER_SIZE {
            return Err(Error::corrupt_as(
                CorruptKind::Block(ProblemKind::Header),
                format!("tree block of {} bytes is smaller than a header", buf.len()),
                bytenr,
            ));
        }
        Ok(Node { bytenr, buf })
    }
    /// The raw block, header included.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
    /// Take the raw block back, e.g. to edit it in place with [`super::edit`].
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
    /// The block header (`struct btrfs_header`).
    pub fn header(&self) -> &Header {
        // from_vec guarantees the header fits.
        Header::ref_from_prefix(&self.buf)
            .map(|(h, _)| h)
            .unwrap_or_else(|_| unreachable!()) // OK: length checked in from_vec
    }
    /// Level of the block: 0 for a leaf, else the height above the leaves.
    pub fn level(&self) -> u8 {
        self.header().level
    }
    /// Whether this is a leaf (level 0), holding items rather than key pointers.
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }
    /// Transaction id that last wrote (COWed) the block (header `generation`).
    pub fn generation(&self) -> u64 {
        self.header().generation.get()
    }
    /// Id of the tree that created the block (header `owner`).
    pub fn owner(&self) -> u64 {
        self.header().owner.get()
    }
    /// nritems as stored (may be corrupt; see `nr_safe`).
    pub fn nritems(&self) -> usize {
        self.header().nritems.get() as usize
    }
    /// How many item headers / key pointers actually fit in the block.
    pub fn nr_safe(&self) -> usize {
        let per = if self.is_leaf() {
            ITEM_SIZE
        } else {
            KEY_PTR_SIZE
        };
        self.nritems().min((self.buf.len() - HEADER_SIZE) / per)
    }
    /// Item header (`btrfs_item`: key, data offset, size) of leaf slot `slot`;
    /// None for a node or a slot past [`Node::nr_safe`].
    pub fn item(&self, slot: usize) -> Option<&Item> {
        if slot >= self.nr_safe() || !self.is_leaf() {
            return None;
        }
        let o = HEADER_SIZE + slot * ITEM_SIZE;
        Item::ref_from_prefix(&self.buf[o..]).ok().map(|(i, _)| i)
    }
    /// Key pointer (`btrfs_key_ptr`: key, blockptr, generation) of node slot
    /// `slot`; None for a leaf or a slot past [`Node::nr_safe`].
    pub fn key_ptr(&self, slot: usize) -> Option<&KeyPtr> {
        if slot >= self.nr_safe() || self.is_leaf() {
            return None;
        }
        let o = HEADER_SIZE + slot * KEY_PTR_SIZE;
        KeyPtr::ref_from_prefix(&self.buf[o..]).ok().map(|(p, _)| p)
    }
    /// The child that the pointer in `slot` names, with what the pointer
    /// says about it (see [`child_in`]). None for a leaf or a slot past the
    /// pointers.
    pub fn child_expect(&self, slot: usize, tree: u64) -> Option<Child> {
        if slot >= self.nr_safe() {
            return None;
        }
        child_in(&self.buf, slot, tree)
    }

    /// Key of slot `slot` in a leaf (the item's key) or node (the pointer's key);
    /// None past [`Node::nr_safe`].
    pub fn key(&self, slot: usize) -> Option<Key> {
        if self.is_leaf() {
            self.item(slot).map(|i| Key::from(&i.key))
        } else {
            self.key_ptr(slot).map(|p| Key::from(&p.key))
        }
    }
    /// Every item of a leaf in slot order: its key and its body, None
    /// where the body lies past the block (nothing for a node). One pass
    /// over the item headers, for loops that want every item.
    pub fn items(&self) -> impl Iterator<Item = (Key, Option<&[u8]>)> + '_ {
        let n = if self.is_leaf() { self.nr_safe() } else { 0 };
        let heads = self
            .buf
            .get(HEADER_SIZE..HEADER_SIZE + n * ITEM_SIZE)
            .unwrap_or_default();
        let body = self.buf.get(HEADER_SIZE..).unwrap_or_default();
        heads.chunks_exact(ITEM_SIZE).filter_map(move |h| {
            let it = Item::ref_from_bytes(h).ok()?;
            let start = it.offset.get() as usize;
            let data = start
                .checked_add(it.size.get() as usize)
                .and_then(|end| body.get(start..end));
            Some((Key::from(&it.key), data))
        })
    }
    /// Body of leaf item `slot`, bounds-checked against the block.
    pub fn item_data(&self, slot: usize) -> Result<&[u8]> {
        let it = self.item(slot).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Block(ProblemKind::ItemBounds),
                format!("item slot {slot} out of range"),
                self.bytenr,
            )
        })?;
        let start = HEADER_SIZE as u64 + it.offset.get() as u64;
        let end = start + it.size.get() as u64;
        if end > self.buf.len() as u64 {
            return Err(Error::corrupt_key_as(
                CorruptKind::Block(ProblemKind::ItemBounds),
                format!(
                    "item {slot} data [{}, +{}) past the end of the leaf",
                    it.offset.get(),
                    it.size.get()
                ),
                self.bytenr,
                Key::from(&it.key),
            ));
        }
        Ok(&self.buf[start as usize..end as usize])
    }
    /// Binary search for `key` among the slots: Ok(slot) when found, else
    /// Err(slot) where it would be inserted.
    pub fn bin_search(&self, key: &Key) -> std::result::Result<usize, usize> {
        let (mut lo, mut hi) = (0usize, self.nr_safe());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid) {
                Some(k) if k < *key => lo = mid + 1,
                Some(k) if k > *key => hi = mid,
                Some(_) => return Ok(mid),
                None => return Err(lo),
            }
        }
        Err(lo)
    }

    /// Every problem of this block against `ctx` and `expect`. An empty list
    /// means the block is valid; the first entry is the most basic failure.
    pub fn validate(&self, ctx: &ValidateCtx, expect: &Expect) -> Vec<Problem> {
        self.validate_with(ctx, expect, true)
    }

    /// [`Node::validate`] of a block whose checksum the caller has just
    /// verified with `ctx.csum` (the checksum is the costliest check: a
    /// reader that verified it to choose a copy need not do it twice).
    pub fn validate_checksummed(&self, ctx: &ValidateCtx, expect: &Expect) -> Vec<Problem> {
        self.validate_with(ctx, expect, false)
    }

    fn validate_with(&self, ctx: &ValidateCtx, expect: &Expect, checksum: bool) -> Vec<Problem> {
        let mut out = Vec::new();
        let b = self.bytenr;
        let mut push = |kind, slot: Option<usize>, key: Option<Key>, message: String| {
            out.push(Problem {
                bytenr: b,
                key,
                slot,
                kind,
                message,
            })
        };
        if self.buf.len() != ctx.nodesize as usize {
            push(
                ProblemKind::Header,
                None,
                None,
                format!(
                    "block size {} differs from nodesize {}",
                    self.buf.len(),
                    ctx.nodesize
                ),
            );
            return out;
        }
        if checksum
            && !verify_block(ctx.csum, &self.buf)
            && !ctx.alt_csum.is_some_and(|c| verify_block(c, &self.buf))
        {
            push(
                ProblemKind::Checksum,
                None,
                None,
                format!("{} checksum mismatch", ctx.csum.name()),
            );
        }
        let h = self.header();
        if h.bytenr.get() != b {
            push(
                ProblemKind::Header,
                None,
                None,
                format!(
                    "header bytenr {} differs from its address {b}",
                    h.bytenr.get()
                ),
            );
        }
        if h.fsid != ctx.fsid && ctx.alt_fsid != Some(h.fsid) {
            push(
                ProblemKind::Header,
                None,
                None,
                "header fsid differs from the filesystem's".into(),
            );
        }
        if h.level >= BTRFS_MAX_LEVEL {
            push(
                ProblemKind::Level,
                None,
                None,
                format!(
                    "level {} exceeds the maximum {}",
                    h.level,
                    BTRFS_MAX_LEVEL - 1
                ),
            );
            return out;
        }
        if let Some(l) = expect.level {
            if l != h.level {
                push(
                    ProblemKind::Level,
                    None,
                    None,
                    format!("level {} where the parent expects {l}", h.level),
                );
            }
        }
        let gen = h.generation.get();
        if let Some(g) = expect.generation {
            if g != gen {
                push(
                    ProblemKind::ParentTransid,
                    None,
                    None,
                    format!("parent transid verify failed: wanted {g} found {gen}"),
                );
            }
        }
        if gen > ctx.max_generation {
            push(
                ProblemKind::Generation,
                None,
                None,
                format!(
                    "generation {gen} newer than the filesystem's {}",
                    ctx.max_generation
                ),
            );
        }
        let owner = h.owner.get();
        // Log and reloc tree blocks may be owned by the subvolume they log or
        // relocate (their ROOT_ITEM offset), which the caller does not know:
        // like the kernel's btrfs_check_eb_owner, their owner is not checked.
        if let Some(o) = expect
            .owner
            .filter(|&o| o != BTRFS_TREE_LOG_OBJECTID && o != BTRFS_TREE_RELOC_OBJECTID)
        {
            let ok = if is_fstree(o) {
                is_fstree(owner)
            } else {
                owner == o
            };
            if !ok {
                push(
                    ProblemKind::Owner,
                    None,
                    None,
                    format!("owner {} where tree {} is read", owner as i64, o as i64),
                );
            }
        }
        let nr = self.nritems();
        let leaf = h.level == 0;
        let cap = if leaf {
            (ctx.nodesize as usize - HEADER_SIZE) / ITEM_SIZE
        } else {
            (ctx.nodesize as usize - HEADER_SIZE) / KEY_PTR_SIZE
        };
        if nr > cap {
            push(
                ProblemKind::ItemBounds,
                None,
                None,
                format!("nritems {nr} exceeds the block's capacity {cap}"),
            );
        }
        if !leaf && nr == 0 {
            push(
                ProblemKind::ItemBounds,
                None,
                None,
                "node with no pointers".into(),
            );
        }
        let n = self.nr_safe();
        if let (Some(fk), Some(k0)) = (expect.first_key, self.key(0)) {
            if fk != k0 {
                push(
                    ProblemKind::FirstKey,
                    Some(0),
                    Some(k0),
                    format!(
                        "first key {} differs from parent's {}",
                        crate::format::names::key_string(&k0),
                        crate::format::names::key_string(&fk)
                    ),
                );
            }
        }
        let mut prev: Option<Key> = None;
        let data_size = ctx.nodesize as u64 - HEADER_SIZE as u64;
        let mut data_end = data_size; // where the previous item's data must start
        for slot in 0..n {
            // A leaf's item header once for its key, bounds and body.
            let item = if leaf { self.item(slot) } else { None };
            let k = match item.map(|i| Key::from(&i.key)).or_else(|| self.key(slot)) {
                Some(k) => k,
                None => break,
            };
            if let Some(p) = prev {
                if p >= k {
                    push(
                        ProblemKind::KeyOrder,
                        Some(slot),
                        Some(k),
                        format!(
                            "bad key order: slot {} key {} >= slot {slot} key {}",
                            slot - 1,
                            crate::format::names::key_string(&p),
                            crate::format::names::key_string(&k)
                        ),
                    );
                }
            }
            prev = Some(k);
            if leaf {
                let Some(it) = item else { break };
                let (off, size) = (it.offset.get() as u64, it.size.get() as u64);
                if off + size != data_end {
                    push(
                        ProblemKind::ItemBounds,
                        Some(slot),
                        Some(k),
                        format!(
                            "item {slot} data ends at {} but should end at {data_end}",
                            off + size
                        ),
                    );
                }
                if off + size > data_size || off < (n * ITEM_SIZE) as u64 {
                    push(
                        ProblemKind::ItemBounds,
                        Some(slot),
                        Some(k),
                        format!("item {slot} data [{off}, +{size}) outside the leaf's data area"),
                    );
                    data_end = off.min(data_end);
                    continue;
                }
                data_end = off;
                let start = HEADER_SIZE + off as usize;
                if let Some(d) = self.buf.get(start..start + size as usize) {
                    // An unfinished checksum conversion holds csum items of
                    // either algorithm.
                    let checked = crate::format::item::check(&k, d, ctx.csum.size()).or_else(|e| {
                        match ctx.alt_csum {
                            Some(a) => crate::format::item::check(&k, d, a.size()),
                            None => Err(e),
                        }
                    });
                    if let Err(e) = checked {
                        let msg = match e {
                            Error::Corrupt { what, .. } => what,
                            e => e.to_string(),
                        };
                        push(
                            ProblemKind::ItemBody,
                            Some(slot),
                            Some(k),
                            format!("item {slot}: {msg}"),
                        );
                    }
                }
            } else if let Some(p) = self.key_ptr(slot) {
                let bp = p.blockptr.get();
                if bp == 0 || bp % ctx.sectorsize as u64 != 0 {
                    push(
                        ProblemKind::ItemBounds,
                        Some(slot),
                        Some(k),
                        format!("pointer {slot} to block {bp} is not sector aligned"),
                    );
                }
                if p.generation.get() > ctx.max_generation {
                    push(
                        ProblemKind::Generation,
                        Some(slot),
                        Some(k),
                        format!(
                            "pointer {slot} generation {} newer than the filesystem's {}",
                            p.generation.get(),
                            ctx.max_generation
                        ),
                    );
                }
            }
        }
        out
    }

    /// Decode leaf item `slot`.
    pub fn decode_item(&self, slot: usize, csum_size: usize) -> Result<(Key, ItemBody<'_>)> {
        let it = self.item(slot).ok_or_else(|| {
            Error::corrupt_as(
                CorruptKind::Block(ProblemKind::ItemBounds),
                format!("item slot {slot} out of range"),
                self.bytenr,
            )
        })?;
        let key = Key::from(&it.key);
        let d = self.item_data(slot)?;
        let body = decode(&key, d, csum_size).map_err(|e| e.at(self.bytenr, key))?;
        Ok((key, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_agree_with_key_and_item_data() {
        let mut b = vec![0u8; 4096];
        let h = Header::mut_from_prefix(&mut b).unwrap().0;
        h.bytenr.set(1 << 20);
        h.owner.set(5);
        for i in 0..5u64 {
            let k = Key::new(256 + i, BTRFS_INODE_ITEM_KEY, 0);
            let d = vec![i as u8; 10 + i as usize];
            crate::tree::edit::leaf_insert(&mut b, i as usize, &k, &d).unwrap();
        }
        // Item 3's body pointed past the block.
        let o = HEADER_SIZE + 3 * ITEM_SIZE;
        let it = Item::mut_from_bytes(&mut b[o..o + ITEM_SIZE]).unwrap();
        it.offset.set(4090);
        let node = Node::from_vec(1 << 20, b).unwrap();
        let got: Vec<_> = node.items().collect();
        assert_eq!(got.len(), node.nr_safe());
        for (slot, (k, d)) in got.into_iter().enumerate() {
            assert_eq!(Some(k), node.key(slot));
            assert_eq!(d, node.item_data(slot).ok());
        }
        assert!(node.items().nth(3).unwrap().1.is_none());
    }
}
