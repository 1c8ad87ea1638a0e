//! Whole-tree operations: a snapshot's root (a copy of another tree's
//! root node sharing every child), dropping a deleted subvolume's tree, and
//! root item updates.

use super::delayed::BackRef;
use super::{RootState, Store, TreeId};
use crate::format::consts::*;
use crate::format::file_extent::{parse_file_extent, FileExtent};
use crate::format::key::Key;
use crate::format::root::RootItem;
use crate::tree::edit;
use crate::tree::node::{child_in, Child, Expect};
use crate::{Error, Result};

/// Whole trees: a snapshot's new root sharing every block of its source, and the drop of a deleted tree (btrfs_drop_snapshot), with the back reference and qgroup changes both make. Obtained from [`Store::subtrees`].
pub struct Subtrees<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Subtrees`].
    pub fn subtrees(&mut self) -> Subtrees<'_> {
        Subtrees { st: self }
    }
}

/// Bound on blocks one drop visits (far more than any real tree).
const MAX_DROP: usize = 1 << 26;

impl Store {
    /// Change tree `id`'s root item (written at commit).
    pub fn update_root_item(&mut self, id: u64, f: impl FnOnce(&mut RootItem)) -> Result<()> {
        self.root_state(id)?;
        let st = self
            .roots
            .get_mut(&TreeId::Tree(id))
            .ok_or_else(|| Error::Internal(format!("tree {id} not loaded")))?;
        let Some((_, ri)) = st.item.as_mut() else {
            return Err(Error::Invalid(format!("tree {id} has no root item")));
        };
        f(ri);
        st.dirty = true;
        Ok(())
    }

    /// A copy of tree `id`'s root item as it stands.
    pub fn root_item(&mut self, id: u64) -> Result<RootItem> {
        match &self.root_state(id)?.item {
            Some((_, ri)) => Ok(*ri),
            None => Err(Error::Invalid(format!("tree {id} has no root item"))),
        }
    }

    /// The key tree `id`'s root item has in the root tree.
    pub fn root_key(&mut self, id: u64) -> Result<Key> {
        match &self.root_state(id)?.item {
            Some((k, _)) => Ok(*k),
            None => Err(Error::Invalid(format!("tree {id} has no root item"))),
        }
    }
}

impl Subtrees<'_> {
    /// Make tree `new_id` a snapshot of tree `src`: its root is a copy of
    /// `src`'s root node (as btrfs_copy_root does), every child gains a
    /// reference from the new tree, and the root item (`item`, with the
    /// new location filled in) is inserted under `(new_id, ROOT_ITEM,
    /// key_offset)`.
    pub fn snapshot_tree(
        &mut self,
        src: u64,
        new_id: u64,
        mut item: RootItem,
        key_offset: u64,
    ) -> Result<()> {
        let tid = TreeId::Tree(new_id);
        if self.st.tree_exists(new_id)? {
            return Err(Error::Invalid(format!("tree {new_id} exists")));
        }
        // The source root as it stands (CoW'd in this transaction or not).
        let sroot = self.st.load_root(TreeId::Tree(src))?;
        let buf = self.st.buf(sroot)?.clone();
        let level = edit::level(&buf);
        let first = if edit::nritems(&buf) > 0 {
            edit::key_at(&buf, 0)
        } else {
            Key::MIN
        };
        let key = Key::new(new_id, BTRFS_ROOT_ITEM_KEY, key_offset);
        item.bytes_used.set(0);
        self.st.items.forget_tree(tid);
        self.st.roots.insert(
            tid,
            RootState {
                id: tid,
                bytenr: 0,
                level,
                item: Some((key, item)),
                dirty: true,
            },
        );
        let nb = self.st.alloc_tree_block(tid, level, first)?;
        let mut nbuf = buf;
        edit::set_header_location(&mut nbuf, nb, self.st.transid, new_id);
        self.st
            .extent_refs()
            .change_children_refs(new_id, &nbuf, nb, false, 1)?;
        self.st.cache.insert_dirty(nb, tid, nbuf);
        self.st.set_root(tid, nb, level)?;
        let data = zerocopy::IntoBytes::as_bytes(&item).to_vec();
        self.st.insert_item(TreeId::Root, &key, &data)
    }

    /// Free every block and data reference of tree `id` (a deleted
    /// subvolume), as the cleaner's btrfs_drop_snapshot does: blocks other
    /// trees share lose only this tree's reference, the rest go with their
    /// contents. With quotas on, every extent below a shared block changes
    /// owners and is accounted. The root item stays (the caller removes it).
    pub fn drop_tree(&mut self, id: u64) -> Result<()> {
        let tid = TreeId::Tree(id);
        self.st.items.forget_tree(tid);
        let st = self.st.root_state(id)?.clone();
        let gen = st.item.as_ref().map(|(_, ri)| ri.generation.get());
        // (block, what its pointer says of it, the reference that reaches it)
        let mut stack: Vec<(Child, BackRef)> = vec![(
            Child {
                bytenr: st.bytenr,
                expect: Expect::root_block(st.level, gen),
            },
            BackRef::Tree { root: id },
        )];
        let mut visited = 0usize;
        while let Some((child, r)) = stack.pop() {
            let (b, level) = (child.bytenr, child.expect.level.unwrap_or(0));
            visited += 1;
            if visited > MAX_DROP {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "tree drop does not end",
                    b,
                ));
            }
            let (refs, flags) = self.st.extent_refs().extent_refs_now(b, Some(level))?;
            let ns = self.st.nodesize() as u64;
            if refs > 1 {
                // Shared: only this reference goes (what this tree created
                // below takes full back references first); the subtree's
                // owners change.
                self.full_backrefs_below(tid, child)?;
                self.st.delayed.add(b, ns, Some(level), r, -1);
                if self.st.qgroups.enabled {
                    self.trace_subtree(tid, child)?;
                }
                continue;
            }
            self.st.load(tid, b, child.expect)?;
            let buf = self.st.buf(b)?.clone();
            let full = flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0;
            if level > 0 {
                for i in 0..edit::nritems(&buf) {
                    let Some(c) = child_in(&buf, i, id) else {
                        continue;
                    };
                    let cr = if full {
                        BackRef::SharedTree { parent: b }
                    } else {
                        BackRef::Tree { root: id }
                    };
                    stack.push((c, cr));
                }
            } else {
                for i in 0..edit::nritems(&buf) {
                    let k = edit::leaf_key(&buf, i);
                    if k.ty != BTRFS_EXTENT_DATA_KEY {
                        continue;
                    }
                    if let Ok(FileExtent::Disk { item, .. }) =
                        parse_file_extent(edit::item_data(&buf, i))
                    {
                        let db = item.disk_bytenr.get();
                        if db == 0 {
                            continue;
                        }
                        let dr = if full {
                            BackRef::SharedData { parent: b }
                        } else {
                            BackRef::Data {
                                root: id,
                                objectid: k.objectid,
                                offset: k.offset.wrapping_sub(item.offset.get()),
                            }
                        };
                        self.st
                            .delayed
                            .add(db, item.disk_num_bytes.get(), None, dr, -1);
                    }
                }
            }
            self.st.delayed.add(b, ns, Some(level), r, -1);
            self.st.cache.remove(b);
        }
        if let Some(RootState {
            item: Some((_, ri)),
            ..
        }) = self.st.roots.get_mut(&tid)
        {
            ri.bytes_used.set(0);
        }
        Ok(())
    }

    /// Before tree `tid` gives up its reference to shared block `b`: every
    /// block of the subtree that `tid` created and that still holds its
    /// children by references naming `tid` takes full back references
    /// instead (the children name the block), as btrfs_drop_snapshot's
    /// UPDATE_BACKREF stage does. The trees that keep the subtree reach
    /// those children only through these blocks, and a reference naming a
    /// tree that is gone can no longer be resolved to a parent (back
    /// reference walks, qgroup accounting). Blocks another tree created
    /// hold their children by that tree's name and are left alone, with
    /// everything below them.
    fn full_backrefs_below(&mut self, tid: TreeId, top: Child) -> Result<()> {
        let id = tid.id();
        let b = top.bytenr;
        let mut stack = vec![top];
        let mut n = 0usize;
        while let Some(c) = stack.pop() {
            let (x, l) = (c.bytenr, c.expect.level.unwrap_or(0));
            n += 1;
            if n > MAX_DROP {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "subtree walk does not end",
                    b,
                ));
            }
            self.st.load(tid, x, c.expect)?;
            let buf = self.st.buf(x)?.clone();
            if edit::owner(&buf) != id {
                continue;
            }
            let (_, flags) = self.st.extent_refs().extent_refs_now(x, Some(l))?;
            if flags & BTRFS_BLOCK_FLAG_FULL_BACKREF == 0 {
                self.st
                    .extent_refs()
                    .change_children_refs(id, &buf, x, true, 1)?;
                self.st
                    .extent_refs()
                    .change_children_refs(id, &buf, x, false, -1)?;
                self.st.extent_refs().set_full_backref(x, l)?;
            }
            if l > 0 {
                stack.extend((0..edit::nritems(&buf)).filter_map(|i| child_in(&buf, i, id)));
            }
        }
        Ok(())
    }

    /// Note every extent below tree block `b` for qgroup accounting (their
    /// referencing trees change although their references do not).
    fn trace_subtree(&mut self, tid: TreeId, top: Child) -> Result<()> {
        let ns = self.st.nodesize() as u64;
        let b = top.bytenr;
        let mut stack = vec![top];
        let mut n = 0usize;
        while let Some(c) = stack.pop() {
            let (x, l) = (c.bytenr, c.expect.level.unwrap_or(0));
            n += 1;
            if n > MAX_DROP {
                return Err(Error::corrupt_as(
                    crate::CorruptKind::Structure,
                    "subtree trace does not end",
                    b,
                ));
            }
            self.st.qgroups.note_extent(x, ns, Some(l));
            self.st.load(tid, x, c.expect)?;
            let buf = self.st.buf(x)?.clone();
            if l > 0 {
                let owner = tid.owner();
                stack.extend((0..edit::nritems(&buf)).filter_map(|i| child_in(&buf, i, owner)));
            } else {
                for i in 0..edit::nritems(&buf) {
                    if edit::leaf_key(&buf, i).ty != BTRFS_EXTENT_DATA_KEY {
                        continue;
                    }
                    if let Ok(FileExtent::Disk { item, .. }) =
                        parse_file_extent(edit::item_data(&buf, i))
                    {
                        if item.disk_bytenr.get() != 0 {
                            self.st.qgroups.note_extent(
                                item.disk_bytenr.get(),
                                item.disk_num_bytes.get(),
                                None,
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Forget a tree entirely (after its drop): its root state goes.
    pub fn forget_tree(&mut self, id: u64) {
        self.st.items.forget_tree(TreeId::Tree(id));
        self.st.roots.remove(&TreeId::Tree(id));
    }
}
