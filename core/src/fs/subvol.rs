//! Subvolumes and snapshots, the default subvolume, quotas and metadata
//! balance, as the kernel's ioctls do them (ioctl.c, transaction.c
//! create_pending_snapshot, inode.c btrfs_delete_subvolume, qgroup.c).

use super::filesystem::{Filesystem, Loc, ROOT_DIR};
use super::inode::*;
use super::names;
use crate::format::consts::*;
use crate::format::dir::{encode_dir_entry, name_hash, parse_dir_items};
use crate::format::key::Key;
use crate::format::root::{parse_root_ref, RootItem, RootRef};
use crate::trans::TreeId;
use crate::{Error, Result};
use zerocopy::IntoBytes;

/// Subvolumes and snapshots of a mounted filesystem: create, snapshot, delete, the default, quotas, the orphan cleanup a mount runs per subvolume. Obtained from [`Filesystem::subvols`].
pub struct Subvols<'a> {
    fs: &'a mut Filesystem,
}

impl Filesystem {
    /// See [`Subvols`].
    pub fn subvols(&mut self) -> Subvols<'_> {
        Subvols { fs: self }
    }
}

fn uuid_key(u: &[u8; 16], ty: u8) -> Key {
    let hi = u64::from_le_bytes(u[..8].try_into().unwrap_or([0; 8]));
    let lo = u64::from_le_bytes(u[8..].try_into().unwrap_or([0; 8]));
    Key::new(hi, ty, lo)
}

fn root_ref_bytes(dirid: u64, index: u64, name: &[u8]) -> Vec<u8> {
    let r = RootRef {
        dirid: dirid.into(),
        sequence: index.into(),
        name_len: (name.len() as u16).into(),
    };
    let mut v = r.as_bytes().to_vec();
    v.extend_from_slice(name);
    v
}

/// The subvolume the root tree's `default` entry names (the top level
/// when it names none that exists).
pub fn default_subvol_id(st: &mut crate::trans::Store) -> Result<u64> {
    let k = Key::new(
        BTRFS_ROOT_TREE_DIR_OBJECTID,
        BTRFS_DIR_ITEM_KEY,
        crate::format::dir::name_hash(b"default"),
    );
    if let Some(d) = st.lookup(TreeId::Root, &k)? {
        for e in crate::format::dir::parse_dir_items(&d).map_err(|e| e.at(0, k))? {
            if e.name == b"default" {
                let id = Key::from(&e.item.location).objectid;
                if st.tree_exists(id)? {
                    return Ok(id);
                }
            }
        }
    }
    Ok(BTRFS_FS_TREE_OBJECTID)
}

/// A new, empty subvolume `id` (create_subvol's trees and items, without
/// a name): its root item (`readonly`: BTRFS_ROOT_SUBVOL_RDONLY) and tree,
/// root directory 256 with its `..` reference, its uuid in the uuid tree
/// and its qgroup. Returns the root directory's inode item, for a caller
/// that sets its attributes.
pub fn create_subvol_tree(
    store: &mut crate::trans::Store,
    id: u64,
    now: crate::format::inode::Timespec,
    readonly: bool,
) -> Result<crate::format::inode::InodeItem> {
    let t = store.transid();
    let ns = store.nodesize() as u64;
    let uuid = crate::util::uuid::random_uuid();
    let mut ri = crate::format::root::new_root_item(now.sec.get(), t, ROOT_DIR, Some(uuid));
    ri.inode.generation.set(1);
    ri.inode.size.set(3);
    ri.inode.nlink.set(1);
    ri.inode.nbytes.set(ns);
    ri.inode.mode.set(S_IFDIR | 0o755);
    ri.inode.flags.set(BTRFS_INODE_ROOT_ITEM_INIT);
    ri.ctime = now;
    ri.otime = now;
    ri.ctransid.set(t);
    ri.otransid.set(t);
    if readonly {
        ri.flags.set(ri.flags.get() | BTRFS_ROOT_SUBVOL_RDONLY);
    }
    store.create_tree(id, ri)?;
    // Inode 256 with its ".." reference to itself.
    let root_inode = new_inode_item(S_IFDIR | 0o755, 0, 0, 0, now, t);
    put_inode(store, id, ROOT_DIR, &root_inode)?;
    let mut r = Vec::new();
    crate::format::inode::encode_inode_ref(&mut r, 0, b"..");
    store.insert_item(
        TreeId::Tree(id),
        &Key::new(ROOT_DIR, BTRFS_INODE_REF_KEY, ROOT_DIR),
        &r,
    )?;
    uuid_add(store, &uuid, BTRFS_UUID_KEY_SUBVOL, id)?;
    store.quotas().qgroup_create(id)?;
    Ok(root_inode)
}

/// Name subvolume `id` in directory `dir_ino` of subvolume `parent` as
/// `name` at dir index `index`: dir entries (location `(id, ROOT_ITEM,
/// loc_offset)`), ROOT_REF and ROOT_BACKREF.
#[allow(clippy::too_many_arguments)]
pub fn link_subvol_items(
    store: &mut crate::trans::Store,
    parent: u64,
    dir_ino: u64,
    name: &[u8],
    id: u64,
    loc_offset: u64,
    index: u64,
) -> Result<()> {
    let t = store.transid();
    names::add_name(
        store,
        parent,
        dir_ino,
        Key::new(id, BTRFS_ROOT_ITEM_KEY, loc_offset),
        name,
        BTRFS_FT_DIR,
        index,
        t,
    )?;
    let rr = root_ref_bytes(dir_ino, index, name);
    store.insert_item(TreeId::Root, &Key::new(parent, BTRFS_ROOT_REF_KEY, id), &rr)?;
    store.insert_item(
        TreeId::Root,
        &Key::new(id, BTRFS_ROOT_BACKREF_KEY, parent),
        &rr,
    )
}

/// Point the root tree's `default` entry at subvolume `id` (its root item
/// key offset `offset`) and mark the filesystem DEFAULT_SUBVOL: what
/// `btrfs subvolume set-default` writes.
pub fn set_default_subvol_item(
    store: &mut crate::trans::Store,
    id: u64,
    offset: u64,
) -> Result<()> {
    let loc = Key::new(id, BTRFS_ROOT_ITEM_KEY, offset);
    let dk = Key::new(
        BTRFS_ROOT_TREE_DIR_OBJECTID,
        BTRFS_DIR_ITEM_KEY,
        name_hash(b"default"),
    );
    let d = store.lookup(TreeId::Root, &dk)?.ok_or_else(|| {
        Error::corrupt_as(
            crate::CorruptKind::Reference,
            "root tree has no default entry",
            BTRFS_ROOT_TREE_DIR_OBJECTID,
        )
    })?;
    let mut out = Vec::new();
    for e in parse_dir_items(&d).map_err(|e| e.at(0, dk))? {
        if e.name == b"default" {
            encode_dir_entry(
                &mut out,
                &loc,
                e.item.transid.get(),
                e.item.type_,
                e.name,
                e.data,
            );
        } else {
            out.extend_from_slice(e.item.as_bytes());
            out.extend_from_slice(e.name);
            out.extend_from_slice(e.data);
        }
    }
    store.update_item(TreeId::Root, &dk, &out)?;
    store.set_incompat(BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL);
    Ok(())
}

/// Every subvolume a ROOT_REF names, ascending (the top level aside).
pub fn subvol_ids(store: &mut crate::trans::Store) -> Result<Vec<u64>> {
    let mut subvols = Vec::new();
    for (k, d) in store.items_in(
        TreeId::Root,
        Key::new(0, BTRFS_ROOT_REF_KEY, 0),
        Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_REF_KEY, u64::MAX),
    )? {
        if k.ty == BTRFS_ROOT_REF_KEY {
            parse_root_ref(&d).map_err(|e| e.at(0, k))?;
            subvols.push(k.offset);
        }
    }
    subvols.sort_unstable();
    subvols.dedup();
    Ok(subvols)
}

/// Empty the UUID tree and fill it again from the root items: an entry for
/// the UUID of every live subvolume (and for its received UUID), as the
/// kernel's UUID scan makes them. Returns (items removed, entries added);
/// nothing when the filesystem has no UUID tree.
pub(crate) fn rebuild_uuid_tree(store: &mut crate::trans::Store) -> Result<(usize, usize)> {
    use crate::format::root::RootItem;
    if !store.tree_exists(BTRFS_UUID_TREE_OBJECTID)? {
        return Ok((0, 0));
    }
    let removed = store.repair().empty_tree(BTRFS_UUID_TREE_OBJECTID)?;
    let roots = store.items_in(
        crate::trans::TreeId::Root,
        Key::new(BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0),
        Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
    )?;
    let mut added = 0;
    for (k, d) in roots {
        let subvol = k.objectid == BTRFS_FS_TREE_OBJECTID
            || (BTRFS_FIRST_FREE_OBJECTID..=BTRFS_LAST_FREE_OBJECTID).contains(&k.objectid);
        if k.ty != BTRFS_ROOT_ITEM_KEY || !subvol {
            continue;
        }
        let ri = RootItem::parse(&d).map_err(|e| e.at(0, k))?;
        if !ri.has_v2() || ri.refs.get() == 0 {
            continue;
        }
        for (u, ty) in [
            (ri.uuid, BTRFS_UUID_KEY_SUBVOL),
            (ri.received_uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL),
        ] {
            if u != [0; 16] {
                uuid_add(store, &u, ty, k.objectid)?;
                added += 1;
            }
        }
    }
    Ok((removed, added))
}

fn uuid_add(store: &mut crate::trans::Store, u: &[u8; 16], ty: u8, id: u64) -> Result<()> {
    if !store.tree_exists(BTRFS_UUID_TREE_OBJECTID)? {
        return Ok(());
    }
    let k = uuid_key(u, ty);
    let mut v = store
        .lookup(BTRFS_UUID_TREE_OBJECTID, &k)?
        .unwrap_or_default();
    if !v.chunks_exact(8).any(|c| c == id.to_le_bytes()) {
        v.extend_from_slice(&id.to_le_bytes());
    }
    store.update_item(BTRFS_UUID_TREE_OBJECTID, &k, &v)
}

impl Subvols<'_> {
    /// One past the highest objectid of the root tree: its free objectid
    /// as a mount finds it (btrfs_init_root_free_objectid at open_ctree).
    pub(super) fn root_tree_free_objectid(&mut self) -> Result<u64> {
        let hi = Key::new(BTRFS_LAST_FREE_OBJECTID, u8::MAX, u64::MAX);
        let lo = Key::new(BTRFS_FIRST_FREE_OBJECTID, 0, 0);
        Ok(match self.fs.store.prev_item(TreeId::Root, &hi, &lo)? {
            Some((k, _)) => (k.objectid + 1).max(BTRFS_FIRST_FREE_OBJECTID),
            None => BTRFS_FIRST_FREE_OBJECTID,
        })
    }

    /// The next subvolume id: the root tree's free objectid, known since
    /// the mount and only counting up until the next one, raised past any
    /// level-0 qgroup id. An id the cleaner freed in this mount is never
    /// handed out again in it: state kept by subvolume id (free inode
    /// numbers, the log's per-subvolume state) may still be the dropped
    /// subvolume's, as the kernel's in-memory roots may.
    fn alloc_subvol_id(&mut self) -> Result<u64> {
        let mut next = match self.fs.next_subvol_id {
            Some(n) => n,
            None => self.root_tree_free_objectid()?,
        };
        if let Some(&q) = self
            .fs
            .store
            .qgroups()
            .groups
            .keys()
            .filter(|q| **q >> 48 == 0)
            .max()
        {
            if q >= next {
                next = q + 1;
            }
        }
        self.fs.next_subvol_id = Some(next + 1);
        Ok(next)
    }

    /// Link subvolume `id` into directory `dir` as `name`: dir entries
    /// (location `(id, ROOT_ITEM, offset)`), ROOT_REF and ROOT_BACKREF.
    fn link_subvol(&mut self, dir: Loc, name: &[u8], id: u64, loc_offset: u64) -> Result<()> {
        let index = self.fs.next_index(dir)?;
        self.link_subvol_at(dir, name, id, loc_offset, index)
    }

    /// [`Self::link_subvol`] at dir index `index`, taken by the caller.
    fn link_subvol_at(
        &mut self,
        dir: Loc,
        name: &[u8],
        id: u64,
        loc_offset: u64,
        index: u64,
    ) -> Result<()> {
        link_subvol_items(
            &mut self.fs.store,
            dir.subvol,
            dir.ino,
            name,
            id,
            loc_offset,
            index,
        )?;
        self.fs.stamp(dir, true, true)
    }

    fn uuid_add(&mut self, u: &[u8; 16], ty: u8, id: u64) -> Result<()> {
        uuid_add(&mut self.fs.store, u, ty, id)
    }

    /// Drop subvolume `id` from the uuid tree's entry for the received
    /// uuid `u` (BTRFS_UUID_KEY_RECEIVED_SUBVOL): it no longer claims it.
    pub fn uuid_remove_received(&mut self, u: &[u8; 16], id: u64) -> Result<()> {
        self.uuid_remove(u, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id)
    }

    /// BTRFS_IOC_SET_RECEIVED_SUBVOL and then read-only, as `btrfs
    /// receive` ends a subvolume: `received_uuid` and `stransid` from the
    /// stream, `rtransid` and `rtime` now; the uuid tree's entry for an
    /// earlier received uuid dropped and the new one added.
    pub fn set_received(&mut self, id: u64, uuid: &[u8; 16], stransid: u64) -> Result<()> {
        let old = self.fs.store.root_item(id)?;
        if old.received_uuid != [0; 16] {
            self.uuid_remove(&old.received_uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        let t = self.fs.store.transid();
        let now = self.fs.clock.now();
        self.fs.store.update_root_item(id, |r| {
            r.received_uuid = *uuid;
            r.stransid.set(stransid);
            r.rtransid.set(t);
            r.rtime = now;
            r.stime = Default::default();
            r.flags.set(r.flags.get() | BTRFS_ROOT_SUBVOL_RDONLY);
        })?;
        if *uuid != [0; 16] {
            self.uuid_add(uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        Ok(())
    }

    fn uuid_remove(&mut self, u: &[u8; 16], ty: u8, id: u64) -> Result<()> {
        if !self.fs.store.tree_exists(BTRFS_UUID_TREE_OBJECTID)? {
            return Ok(());
        }
        let k = uuid_key(u, ty);
        let Some(v) = self.fs.store.lookup(BTRFS_UUID_TREE_OBJECTID, &k)? else {
            return Ok(());
        };
        let rest: Vec<u8> = v
            .chunks_exact(8)
            .filter(|c| *c != id.to_le_bytes())
            .flatten()
            .copied()
            .collect();
        if rest.is_empty() {
            self.fs.store.delete_item(BTRFS_UUID_TREE_OBJECTID, &k)?;
        } else {
            self.fs
                .store
                .update_item(BTRFS_UUID_TREE_OBJECTID, &k, &rest)?;
        }
        Ok(())
    }

    /// The subvolume ioctls are issued on a directory's descriptor; the
    /// empty placeholder of a subvolume has no ioctls (its file operations
    /// are simple_dir_operations): ENOTTY.
    fn no_ioctl_on_placeholder(l: Loc) -> Result<()> {
        if l.is_placeholder() {
            return Err(Error::errno(
                libc::ENOTTY,
                "the empty directory standing for a subvolume has no ioctls",
            ));
        }
        Ok(())
    }

    /// `btrfs subvolume create` (create_subvol): no commit.
    pub fn subvol_create(&mut self, dir: Loc, name: &[u8]) -> Result<Loc> {
        Self::no_ioctl_on_placeholder(dir)?;
        if self.fs.lookup(dir, name)?.is_some() {
            return Err(Error::errno(
                libc::EEXIST,
                format!("{}: exists", String::from_utf8_lossy(name)),
            ));
        }
        if !is_dir(self.fs.item(dir)?.mode.get()) {
            return Err(Error::errno(libc::ENOTDIR, "not a directory"));
        }
        let id = self.alloc_subvol_id()?;
        let t = self.fs.store.transid();
        let now = self.fs.clock.now();
        create_subvol_tree(&mut self.fs.store, id, now, false)?;
        // Properties come from the parent subvolume's root, not from `dir`.
        self.fs
            .xattrs()
            .inherit_props(Loc::new(id, ROOT_DIR), Loc::new(dir.subvol, ROOT_DIR))?;
        self.link_subvol(dir, name, id, 0)?;
        // btrfs_record_new_subvolume: the new entry cannot be logged.
        self.fs.rt(dir)?.last_unlink_trans = t;
        let l = Loc::new(id, ROOT_DIR);
        self.fs.rt(l)?.index_cnt = Some(2);
        Ok(l)
    }

    /// `btrfs subvolume snapshot` (create_pending_snapshot): the source's
    /// dirty data is written back, everything before is committed, the
    /// snapshot shares the source's tree as committed, and it is committed.
    pub fn snapshot(&mut self, src: Loc, dir: Loc, name: &[u8]) -> Result<Loc> {
        if src.ino != ROOT_DIR {
            return Err(Error::errno(
                libc::EINVAL,
                "snapshot: the source is not a subvolume",
            ));
        }
        Self::no_ioctl_on_placeholder(dir)?;
        if self.fs.lookup(dir, name)?.is_some() {
            return Err(Error::errno(
                libc::EEXIST,
                format!("{}: exists", String::from_utf8_lossy(name)),
            ));
        }
        if !is_dir(self.fs.item(dir)?.mode.get()) {
            return Err(Error::errno(libc::ENOTDIR, "not a directory"));
        }
        let sri = self.fs.store.root_item(src.subvol)?;
        if sri.refs.get() == 0 {
            return Err(Error::errno(
                libc::ENOENT,
                "snapshot: the source subvolume is being deleted",
            ));
        }
        let inodes: Vec<Loc> = self
            .fs
            .dirty
            .inodes()
            .into_iter()
            .filter(|l| l.subvol == src.subvol)
            .collect();
        for l in inodes {
            self.fs
                .writeback()
                .inode(l, 0, u64::MAX, super::writeback::Reason::Sync)?;
        }
        self.fs.commit("snapshot")?;
        let id = self.alloc_subvol_id()?;
        let t = self.fs.store.transid();
        let now = self.fs.clock.now();
        let mut ri: RootItem = self.fs.store.root_item(src.subvol)?;
        let uuid = crate::util::uuid::random_uuid();
        ri.flags.set(ri.flags.get() & !BTRFS_ROOT_SUBVOL_RDONLY);
        ri.generation_v2.set(t);
        ri.parent_uuid = ri.uuid;
        ri.uuid = uuid;
        ri.received_uuid = [0; 16];
        ri.stransid.set(0);
        ri.rtransid.set(0);
        ri.stime = Default::default();
        ri.rtime = Default::default();
        ri.otime = now;
        ri.otransid.set(t);
        ri.last_snapshot.set(t);
        self.fs
            .store
            .update_root_item(src.subvol, |r| r.last_snapshot.set(t))?;
        self.fs
            .store
            .subtrees()
            .snapshot_tree(src.subvol, id, ri, t)?;
        if self.fs.store.qgroups().enabled {
            // What the transaction changed is accounted without the new
            // snapshot, which then starts as the source's copy
            // (btrfs_qgroup_inherit); the commit right after makes that
            // state the one later changes are accounted from, and it runs
            // nothing that changes references (no cleaner, no writeback):
            // the kernel does this inside the commit with every other
            // writer shut out. Until it is linked the new root is an orphan
            // (no references, an orphan item): a crash before the link
            // leaves a root the next mount drops, never a subvolume no
            // directory names.
            self.fs.store.quotas().qgroup_create(id)?;
            let orphan = Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, id);
            self.fs.store.update_root_item(id, |r| r.refs.set(0))?;
            self.fs.store.insert_item(TreeId::Root, &orphan, &[])?;
            self.fs
                .store
                .quotas()
                .qgroup_account_snapshot(src.subvol, id)?;
            self.fs.commit_only("snapshot")?;
            self.fs.store.update_root_item(id, |r| r.refs.set(1))?;
            self.fs.store.delete_item(TreeId::Root, &orphan)?;
        }
        self.uuid_add(&uuid, BTRFS_UUID_KEY_SUBVOL, id)?;
        self.link_subvol(dir, name, id, u64::MAX)?;
        // Files the source had open and unlinked are gone in the snapshot.
        let orphans = self.fs.store.items_in(
            TreeId::Tree(id),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, u64::MAX),
        )?;
        self.fs.commit("snapshot")?;
        for (k, _) in orphans {
            self.fs.delete_inode(Loc::new(id, k.offset))?;
        }
        Ok(Loc::new(id, ROOT_DIR))
    }

    /// `btrfs subvolume delete` (btrfs_delete_subvolume): the entry and
    /// root references go, the root is marked dead with an orphan item;
    /// its tree is dropped once that is committed. No commit.
    pub fn subvol_delete(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        let (loc, _) = names::lookup_name(&mut self.fs.store, dir.subvol, dir.ino, name)?
            .ok_or_else(|| {
                Error::errno(
                    libc::ENOENT,
                    format!("{}: no such subvolume", String::from_utf8_lossy(name)),
                )
            })?;
        // The empty placeholder of a subvolume not linked here is no
        // subvolume either (its inode is not BTRFS_FIRST_FREE_OBJECTID).
        if loc.ty != BTRFS_ROOT_ITEM_KEY || self.fs.entry_target(dir, name, &loc)?.is_placeholder()
        {
            return Err(Error::errno(
                libc::EINVAL,
                format!("{}: not a subvolume", String::from_utf8_lossy(name)),
            ));
        }
        self.delete_subvol_entry(dir, name)
    }

    /// The dir index of entry `name` of `dir`.
    fn entry_index(&mut self, dir: Loc, name: &[u8]) -> Result<u64> {
        names::list_dir(&mut self.fs.store, dir.subvol, dir.ino)?
            .into_iter()
            .find(|e| e.name == name)
            .map(|e| e.index)
            .ok_or_else(|| {
                Error::corrupt_key_as(
                    crate::CorruptKind::Reference,
                    "dir item without dir index",
                    0,
                    Key::new(dir.ino, BTRFS_DIR_ITEM_KEY, name_hash(name)),
                )
            })
    }

    /// Take subvolume entry `name` (location `loc`) out of `dir`
    /// (btrfs_unlink_subvol): its dir item and dir index, and the
    /// ROOT_REF/ROOT_BACKREF pair that links the subvolume there; the
    /// directory's size and times follow.
    fn unlink_subvol(&mut self, dir: Loc, name: &[u8], loc: Key) -> Result<()> {
        let id = loc.objectid;
        let idx = self.entry_index(dir, name)?;
        let t = self.fs.store.transid();
        self.fs.dcache.clear();
        names::remove_name(&mut self.fs.store, dir.subvol, dir.ino, loc, name, idx, t)?;
        self.fs
            .store
            .delete_item(TreeId::Root, &Key::new(dir.subvol, BTRFS_ROOT_REF_KEY, id))?;
        self.fs.store.delete_item(
            TreeId::Root,
            &Key::new(id, BTRFS_ROOT_BACKREF_KEY, dir.subvol),
        )?;
        self.fs.stamp(dir, true, true)
    }

    /// rename(2) of a subvolume's entry (btrfs_rename with a subvolume
    /// as the source; the caller made the checks and removed any target):
    /// the entry and its root references leave `odir`, and a new entry in
    /// `ndir` names the subvolume's root item by its key, as btrfs_add_link
    /// does, with a new ROOT_REF/ROOT_BACKREF pair (btrfs_add_root_ref).
    /// The two directories may be in different subvolumes. The log cannot
    /// express any of it: the next fsync in this transaction commits it
    /// (btrfs_set_log_full_commit).
    pub(super) fn rename_subvol_entry(
        &mut self,
        odir: Loc,
        oname: &[u8],
        ndir: Loc,
        nname: &[u8],
        id: u64,
    ) -> Result<()> {
        let root_key = self.fs.store.root_key(id)?;
        self.unlink_subvol_entry(odir, oname)?;
        self.link_subvol(ndir, nname, id, root_key.offset)?;
        let t = self.fs.store.transid();
        self.fs.log.as_mut().force_full_commit(t);
        Ok(())
    }

    /// btrfs_unlink_subvol for a rename exchange: subvolume entry `name`
    /// leaves `dir` with its root references.
    pub(super) fn unlink_subvol_entry(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        let (loc, _) = names::lookup_name(&mut self.fs.store, dir.subvol, dir.ino, name)?
            .ok_or_else(|| Error::errno(libc::ENOENT, "no such subvolume"))?;
        self.unlink_subvol(dir, name, loc)
    }

    /// btrfs_add_link of subvolume `id` into `dir` at index `index`, taken
    /// by the caller.
    pub(super) fn link_subvol_entry(
        &mut self,
        dir: Loc,
        name: &[u8],
        id: u64,
        index: u64,
    ) -> Result<()> {
        let root_key = self.fs.store.root_key(id)?;
        self.link_subvol_at(dir, name, id, root_key.offset, index)
    }

    /// Remove an entry that leads to the empty-subvolume placeholder
    /// (btrfs_unlink_subvol for one): its dir item and dir index go. No
    /// ROOT_REF links the subvolume it names under this entry, so the root
    /// tree is left alone: the subvolume lives on wherever it is linked.
    pub(super) fn remove_placeholder_entry(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        let (loc, _) = names::lookup_name(&mut self.fs.store, dir.subvol, dir.ino, name)?
            .ok_or_else(|| Error::errno(libc::ENOENT, "no such directory"))?;
        let idx = self.entry_index(dir, name)?;
        let t = self.fs.store.transid();
        self.fs.dcache.clear();
        names::remove_name(&mut self.fs.store, dir.subvol, dir.ino, loc, name, idx, t)?;
        self.fs.stamp(dir, true, true)?;
        // Replay cannot remove a subvolume entry: fully logging the
        // directory commits instead.
        self.fs.rt(dir)?.last_unlink_trans = t;
        Ok(())
    }

    /// The directory holding the entry that links subvolume `id` (from
    /// its ROOT_BACKREF); None for the top level.
    pub(super) fn subvol_parent(&mut self, id: u64) -> Result<Option<Loc>> {
        let lo = Key::new(id, BTRFS_ROOT_BACKREF_KEY, 0);
        let Some((k, d)) = self.fs.store.next_item(TreeId::Root, &lo)? else {
            return Ok(None);
        };
        if k.objectid != id || k.ty != BTRFS_ROOT_BACKREF_KEY {
            return Ok(None);
        }
        let (r, _) = parse_root_ref(&d).map_err(|e| e.at(0, k))?;
        Ok(Some(Loc::new(k.offset, r.dirid.get())))
    }

    /// The deletion itself (also rmdir of an empty subvolume).
    pub(super) fn delete_subvol_entry(&mut self, dir: Loc, name: &[u8]) -> Result<()> {
        let (loc, _) = names::lookup_name(&mut self.fs.store, dir.subvol, dir.ino, name)?
            .ok_or_else(|| Error::errno(libc::ENOENT, "no such subvolume"))?;
        let id = loc.objectid;
        if id == self.fs.default_subvol {
            return Err(Error::errno(
                libc::EPERM,
                "cannot delete the default subvolume",
            ));
        }
        // Subvolumes inside it must go first.
        if let Some((k, _)) = self
            .fs
            .store
            .next_item(TreeId::Root, &Key::new(id, BTRFS_ROOT_REF_KEY, 0))?
        {
            if k.objectid == id && k.ty == BTRFS_ROOT_REF_KEY {
                return Err(Error::errno(
                    libc::ENOTEMPTY,
                    "subvolume contains subvolumes",
                ));
            }
        }
        self.unlink_subvol(dir, name, loc)?;
        let t = self.fs.store.transid();
        // btrfs_record_snapshot_destroy: replay cannot remove a subvolume
        // entry, so fully logging the directory commits instead.
        self.fs.rt(dir)?.last_unlink_trans = t;
        let ri = self.fs.store.root_item(id)?;
        self.fs.store.update_root_item(id, |r| {
            r.flags.set(r.flags.get() | BTRFS_ROOT_SUBVOL_DEAD);
            r.refs.set(0);
            r.drop_progress = Key::MIN.to_disk();
            r.drop_level = 0;
        })?;
        self.fs.store.insert_item(
            TreeId::Root,
            &Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, id),
            &[],
        )?;
        self.uuid_remove(&ri.uuid, BTRFS_UUID_KEY_SUBVOL, id)?;
        if ri.received_uuid != [0; 16] {
            self.uuid_remove(&ri.received_uuid, BTRFS_UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        let gone: Vec<Loc> = self
            .fs
            .loaded_inodes()
            .into_iter()
            .filter(|l| l.subvol == id)
            .collect();
        for l in gone {
            self.fs.forget_inode(l);
        }
        self.fs.deleted_subvols.push((id, t));
        Ok(())
    }

    /// The cleaner: subvolumes whose deletion an earlier transaction made
    /// durable lose their trees, root items, orphan items and qgroups.
    pub(super) fn finish_deleted_subvols(&mut self) -> Result<()> {
        let t = self.fs.store.transid();
        let (ready, later): (Vec<(u64, u64)>, Vec<(u64, u64)>) = self
            .fs
            .deleted_subvols
            .drain(..)
            .partition(|(_, dt)| *dt < t);
        self.fs.deleted_subvols = later;
        for (id, _) in ready {
            if !self.fs.store.tree_exists(id)? {
                continue;
            }
            self.fs.store.subtrees().drop_tree(id)?;
            let key = self.fs.store.root_key(id)?;
            self.fs.store.delete_item(TreeId::Root, &key)?;
            self.fs.store.delete_item(
                TreeId::Root,
                &Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, id),
            )?;
            self.fs.store.subtrees().forget_tree(id);
            self.fs.dropped_qgroups.push(id);
        }
        Ok(())
    }

    /// Qgroups of dropped subvolumes go once the drop is committed.
    pub(super) fn remove_dropped_qgroups(&mut self) -> Result<()> {
        for id in std::mem::take(&mut self.fs.dropped_qgroups) {
            self.fs.store.quotas().qgroup_remove(id)?;
        }
        Ok(())
    }

    /// Dead subvolumes an earlier mount left (orphan items in the root
    /// tree): dropped by the cleaner at the next commit.
    pub(super) fn find_dead_subvols(&mut self) -> Result<()> {
        let orphans = self.fs.store.items_in(
            TreeId::Root,
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0),
            Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, u64::MAX),
        )?;
        for (k, _) in orphans {
            if !self
                .fs
                .deleted_subvols
                .iter()
                .any(|(id, _)| *id == k.offset)
            {
                self.fs.deleted_subvols.push((k.offset, 0));
            }
        }
        Ok(())
    }

    /// Orphan cleanup at mount (btrfs_orphan_cleanup): an inode a crash
    /// left with an orphan item and no links (unlinked while open, or an
    /// O_TMPFILE) is deleted with its data; the orphan item of an inode
    /// that still has links, or is gone already, is dropped. Subvolumes
    /// being deleted are left to the cleaner, which drops them whole. No
    /// commit: the next one writes the result.
    pub(super) fn orphan_cleanup(&mut self) -> Result<()> {
        let roots: Vec<u64> = self
            .fs
            .store
            .items_in(
                TreeId::Root,
                Key::new(BTRFS_FS_TREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, 0),
                Key::new(BTRFS_LAST_FREE_OBJECTID, BTRFS_ROOT_ITEM_KEY, u64::MAX),
            )?
            .into_iter()
            .filter(|(k, _)| k.ty == BTRFS_ROOT_ITEM_KEY && is_fstree(k.objectid))
            .map(|(k, _)| k.objectid)
            .collect();
        for id in roots {
            if self.fs.deleted_subvols.iter().any(|(d, _)| *d == id) {
                continue;
            }
            let t = TreeId::Tree(id);
            let orphans = self.fs.store.items_in(
                t,
                Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, 0),
                Key::new(BTRFS_ORPHAN_OBJECTID, BTRFS_ORPHAN_ITEM_KEY, u64::MAX),
            )?;
            for (k, _) in orphans {
                // The inode may go: its number stays taken until the commit
                // (pin_free_ino) and nothing cached of it survives.
                self.fs.pin_free_ino(id)?;
                self.fs.forget_inode(Loc::new(id, k.offset));
                crate::fs::inode::clean_orphan(&mut self.fs.store, id, k.offset)?;
            }
        }
        Ok(())
    }

    /// `btrfs subvolume set-default`: the root tree's `default` entry names
    /// it (seen at the next mount). No commit.
    pub fn set_default_subvol(&mut self, l: Loc) -> Result<()> {
        Self::no_ioctl_on_placeholder(l)?;
        if l.ino != ROOT_DIR {
            return Err(Error::errno(libc::EINVAL, "set-default: not a subvolume"));
        }
        let offset = if l.subvol == BTRFS_FS_TREE_OBJECTID {
            0
        } else {
            self.fs.store.root_key(l.subvol)?.offset
        };
        set_default_subvol_item(&mut self.fs.store, l.subvol, offset)?;
        self.fs.clock.dirtied();
        Ok(())
    }

    /// `btrfs quota enable` (and the rescan it starts, waited for): the
    /// quota tree and a qgroup per subvolume, a commit, the rescan counting
    /// every extent of the trees that commit left, a commit.
    pub fn quota_enable(&mut self) -> Result<()> {
        if self.fs.store.qgroups().enabled {
            return Ok(());
        }
        let subvols = subvol_ids(&mut self.fs.store)?;
        self.fs.store.quotas().quota_enable(&subvols)?;
        self.fs.commit("quota")?;
        self.fs.writeback().all(super::writeback::Reason::Sync)?;
        // The rescan counts the committed trees; the writeback's changes
        // and whatever the closing commit does (the cleaner may drop a
        // deleted subvolume there) are accounted from the same trees.
        self.fs.store.quotas().quota_rescan()?;
        self.fs.commit("quota")
    }

    /// `btrfs balance start -m`: dirty data is written back and committed,
    /// then every metadata and system block group is emptied into new
    /// chunks and removed (each step committed).
    pub fn balance_metadata(&mut self) -> Result<()> {
        self.fs.sync()?;
        self.fs.store.relocation().relocate_metadata()?;
        self.fs.clock.dirtied();
        self.fs.commit("balance")
    }

    /// Before relocating block groups (`btrfs balance`, a shrink): dirty
    /// data written back and committed, deleted subvolumes dropped.
    pub fn prepare_relocation(&mut self) -> Result<()> {
        self.fs.sync()?;
        self.drop_deleted_now()
    }

    /// After relocating block groups: the clock moved as by a commit, and
    /// a commit.
    pub fn finish_relocation(&mut self) -> Result<()> {
        self.fs.clock.dirtied();
        self.fs.commit("balance")
    }

    /// Drop every deleted subvolume's tree now (what the cleaner does
    /// after the deletion's commit), so nothing waits to be dropped.
    pub fn drop_deleted_now(&mut self) -> Result<()> {
        if self.fs.deleted_subvols.is_empty() {
            return Ok(());
        }
        self.fs.commit("drop deleted subvolumes")?;
        let t = self.fs.store.transid();
        for d in &mut self.fs.deleted_subvols {
            d.1 = d.1.min(t.saturating_sub(1));
        }
        self.finish_deleted_subvols()?;
        self.fs.commit("drop deleted subvolumes")?;
        self.remove_dropped_qgroups()?;
        self.fs.commit("drop deleted subvolumes")
    }
}
