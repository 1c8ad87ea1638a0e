//! Directory entries and inode back references: every name of a file is a
//! DIR_ITEM (by name hash, entries of colliding names packed), a DIR_INDEX
//! (by the directory's running index) and an INODE_REF in the named inode
//! (packed per parent; INODE_EXTREF once that item would outgrow a leaf).
//!
//! Rule kept here, and only here: a directory's i_size is twice the sum of
//! its names' lengths (one copy in DIR_ITEM, one in DIR_INDEX).

use super::inode::{get_inode, put_inode};
use crate::format::consts::*;
use crate::format::dir::{
    encode_dir_entries, encode_dir_entry, extref_hash, name_hash, parse_dir_items,
};
use crate::format::inode::{
    encode_inode_extref, encode_inode_ref, parse_inode_extrefs, parse_inode_refs,
};
use crate::format::key::Key;
use crate::trans::{Store, TreeId};
use crate::{Error, Result};

/// One name of an inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Inode number of the directory holding the name.
    pub parent: u64,
    /// DIR_INDEX sequence number of the name in `parent` (the INODE_REF index).
    pub index: u64,
    /// The name's bytes, without a terminating NUL.
    pub name: Vec<u8>,
}

/// A directory entry as the directory holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryInfo {
    /// The entry's name bytes.
    pub name: Vec<u8>,
    /// (ino, INODE_ITEM, 0), or (subvol, ROOT_ITEM, -1) for a subvolume.
    pub location: Key,
    /// File type of the target (BTRFS_FT_*).
    pub ftype: u8,
    /// DIR_INDEX sequence number of the entry in its directory.
    pub index: u64,
}

/// Largest item body a leaf holds.
fn max_item(st: &Store) -> usize {
    st.nodesize() as usize - crate::format::header::HEADER_SIZE - crate::format::header::ITEM_SIZE
}

/// The entry `name` of directory `dir`: (location, file type).
pub fn lookup_name(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    name: &[u8],
) -> Result<Option<(Key, u8)>> {
    let k = Key::new(dir, BTRFS_DIR_ITEM_KEY, name_hash(name));
    // Read in place: every path walk asks here.
    let found = st.with_item(TreeId::Tree(subvol), &k, |d| -> Result<_> {
        for e in parse_dir_items(d).map_err(|e| e.at(0, k))? {
            if e.name == name {
                return Ok(Some((Key::from(&e.item.location), e.item.type_)));
            }
        }
        Ok(None)
    })?;
    found.unwrap_or(Ok(None))
}

/// The entry with dir index `index` in `dir`: (name, location, type).
pub fn entry_at(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    index: u64,
) -> Result<Option<(Vec<u8>, Key, u8)>> {
    let k = Key::new(dir, BTRFS_DIR_INDEX_KEY, index);
    let Some(d) = st.lookup(TreeId::Tree(subvol), &k)? else {
        return Ok(None);
    };
    let e = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
    Ok(e.first()
        .map(|e| (e.name.to_vec(), Key::from(&e.item.location), e.item.type_)))
}

/// Every entry of `dir`, in index order.
pub fn list_dir(st: &mut Store, subvol: u64, dir: u64) -> Result<Vec<DirEntryInfo>> {
    let mut out = Vec::new();
    for (k, d) in st.items_in(
        TreeId::Tree(subvol),
        Key::new(dir, BTRFS_DIR_INDEX_KEY, 0),
        Key::new(dir, BTRFS_DIR_INDEX_KEY, u64::MAX),
    )? {
        if let Some(e) = parse_dir_items(&d).map_err(|e| e.at(0, k))?.first() {
            out.push(DirEntryInfo {
                name: e.name.to_vec(),
                location: Key::from(&e.item.location),
                ftype: e.item.type_,
                index: k.offset,
            });
        }
    }
    Ok(out)
}

/// At most `max` entries of `dir` with index `from` or above, in index
/// order: one search per entry, so a read of a large directory in pieces
/// costs what the pieces hold.
pub fn list_dir_from(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    from: u64,
    max: usize,
) -> Result<Vec<DirEntryInfo>> {
    let mut out = Vec::new();
    let mut k = Key::new(dir, BTRFS_DIR_INDEX_KEY, from);
    while out.len() < max {
        let Some((key, d)) = st.next_item(TreeId::Tree(subvol), &k)? else {
            break;
        };
        if key.objectid != dir || key.ty != BTRFS_DIR_INDEX_KEY {
            break;
        }
        if let Some(e) = parse_dir_items(&d).map_err(|e| e.at(0, key))?.first() {
            out.push(DirEntryInfo {
                name: e.name.to_vec(),
                location: Key::from(&e.item.location),
                ftype: e.item.type_,
                index: key.offset,
            });
        }
        let Some(next) = key.offset.checked_add(1) else {
            break;
        };
        k = Key::new(dir, BTRFS_DIR_INDEX_KEY, next);
    }
    Ok(out)
}

/// Whether a directory has no entries.
pub fn dir_is_empty(st: &mut Store, subvol: u64, dir: u64) -> Result<bool> {
    Ok(
        match st.next_item(TreeId::Tree(subvol), &Key::new(dir, BTRFS_DIR_INDEX_KEY, 0))? {
            Some((k, _)) => !(k.objectid == dir && k.ty == BTRFS_DIR_INDEX_KEY),
            None => true,
        },
    )
}

/// Every name of inode `ino` (refs and extrefs).
pub fn links_of(st: &mut Store, subvol: u64, ino: u64) -> Result<Vec<Link>> {
    let mut out = Vec::new();
    let t = TreeId::Tree(subvol);
    for (k, d) in st.items_in(
        t,
        Key::new(ino, BTRFS_INODE_REF_KEY, 0),
        Key::new(ino, BTRFS_INODE_EXTREF_KEY, u64::MAX),
    )? {
        match k.ty {
            BTRFS_INODE_REF_KEY => {
                for e in parse_inode_refs(&d).map_err(|e| e.at(0, k))? {
                    out.push(Link {
                        parent: k.offset,
                        index: e.index,
                        name: e.name.to_vec(),
                    });
                }
            }
            BTRFS_INODE_EXTREF_KEY => {
                for e in parse_inode_extrefs(&d).map_err(|e| e.at(0, k))? {
                    out.push(Link {
                        parent: e.parent,
                        index: e.index,
                        name: e.name.to_vec(),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Names (index, name) inode `ino` has in directory `dir`.
pub fn links_in(st: &mut Store, subvol: u64, ino: u64, dir: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let t = TreeId::Tree(subvol);
    let k = Key::new(ino, BTRFS_INODE_REF_KEY, dir);
    if let Some(d) = st.lookup(t, &k)? {
        for e in parse_inode_refs(&d).map_err(|e| e.at(0, k))? {
            out.push((e.index, e.name.to_vec()));
        }
    }
    for (k, d) in st.items_in(
        t,
        Key::new(ino, BTRFS_INODE_EXTREF_KEY, 0),
        Key::new(ino, BTRFS_INODE_EXTREF_KEY, u64::MAX),
    )? {
        for e in parse_inode_extrefs(&d).map_err(|e| e.at(0, k))? {
            if e.parent == dir {
                out.push((e.index, e.name.to_vec()));
            }
        }
    }
    Ok(out)
}

/// Number of names of an inode.
pub fn count_links(st: &mut Store, subvol: u64, ino: u64) -> Result<u32> {
    Ok(links_of(st, subvol, ino)?.len() as u32)
}

/// The index the next entry of `dir` gets: one past the highest, 2 in an
/// empty directory (0 and 1 stand for `.` and `..`).
pub fn next_dir_index(st: &mut Store, subvol: u64, dir: u64) -> Result<u64> {
    let hi = Key::new(dir, BTRFS_DIR_INDEX_KEY, u64::MAX);
    let lo = Key::new(dir, BTRFS_DIR_INDEX_KEY, 0);
    Ok(match st.prev_item(TreeId::Tree(subvol), &hi, &lo)? {
        Some((k, _)) => (k.offset + 1).max(2),
        None => 2,
    })
}

/// Append an entry to a packed item, creating the item when missing. A
/// packed item is at most what a leaf holds: past that, EOVERFLOW (as the
/// kernel's btrfs_check_dir_item_collision).
fn append_packed(st: &mut Store, t: TreeId, key: &Key, entry: &[u8]) -> Result<()> {
    let max = max_item(st);
    if st.append_item(t, key, entry, max)? {
        return Ok(());
    }
    Err(Error::errno(
        libc::EOVERFLOW,
        format!(
            "item {} cannot take another entry",
            crate::format::names::key_string(key)
        ),
    ))
}

/// Remove the entry named `name` (for extrefs: with parent `parent`) from
/// a packed item; the item goes when it empties. Returns whether it was there.
pub fn remove_packed(
    st: &mut Store,
    subvol: u64,
    key: &Key,
    name: &[u8],
    parent: u64,
) -> Result<bool> {
    let t = TreeId::Tree(subvol);
    let Some(d) = st.lookup(t, key)? else {
        return Ok(false);
    };
    let mut rest = Vec::with_capacity(d.len());
    let mut found = false;
    match key.ty {
        BTRFS_INODE_REF_KEY => {
            for e in parse_inode_refs(&d).map_err(|e| e.at(0, *key))? {
                if !found && e.name == name {
                    found = true;
                } else {
                    encode_inode_ref(&mut rest, e.index, e.name);
                }
            }
        }
        BTRFS_INODE_EXTREF_KEY => {
            for e in parse_inode_extrefs(&d).map_err(|e| e.at(0, *key))? {
                if !found && e.name == name && e.parent == parent {
                    found = true;
                } else {
                    encode_inode_extref(&mut rest, e.parent, e.index, e.name);
                }
            }
        }
        _ => {
            let ents = parse_dir_items(&d).map_err(|e| e.at(0, *key))?;
            let keep: Vec<_> = ents
                .iter()
                .filter(|e| {
                    let hit = !found && e.name == name;
                    found |= hit;
                    !hit
                })
                .collect();
            rest = encode_dir_entries(keep);
        }
    }
    if !found {
        return Ok(false);
    }
    if rest.is_empty() {
        st.delete_item(t, key)?;
    } else {
        st.update_item(t, key, &rest)?;
    }
    Ok(true)
}

/// Add name `name` at index `index` of directory `dir` for `location`:
/// DIR_ITEM, DIR_INDEX and, for an inode, its back reference. The
/// directory's size and transid follow; link counts and times are the
/// caller's.
#[allow(clippy::too_many_arguments)]
pub fn add_name(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    location: Key,
    name: &[u8],
    ftype: u8,
    index: u64,
    transid: u64,
) -> Result<()> {
    add_name_with(
        st,
        subvol,
        dir,
        location,
        name,
        ftype,
        index,
        transid,
        |_| {},
    )
}

/// [`add_name`], with `dir_change` made to the directory's inode item in
/// the same change as its size (its times, as a new name moves them).
#[allow(clippy::too_many_arguments)]
pub fn add_name_with(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    location: Key,
    name: &[u8],
    ftype: u8,
    index: u64,
    transid: u64,
    dir_change: impl FnOnce(&mut crate::format::inode::InodeItem),
) -> Result<()> {
    if name.is_empty() || name.len() > BTRFS_NAME_LEN {
        return Err(Error::Invalid(format!("name of {} bytes", name.len())));
    }
    let t = TreeId::Tree(subvol);
    // The back reference first, as btrfs_add_link does: a name the inode
    // cannot take (a full INODE_REF without extended refs) is refused
    // before any directory entry exists.
    let ino = location.objectid;
    if location.ty == BTRFS_INODE_ITEM_KEY {
        add_backref(st, subvol, ino, dir, name, index)?;
    }
    let mut d = Vec::with_capacity(30 + name.len());
    encode_dir_entry(&mut d, &location, transid, ftype, name, &[]);
    let entries = append_packed(
        st,
        t,
        &Key::new(dir, BTRFS_DIR_ITEM_KEY, name_hash(name)),
        &d,
    )
    .and_then(|()| {
        st.insert_item(t, &Key::new(dir, BTRFS_DIR_INDEX_KEY, index), &d)
            .inspect_err(|_| {
                let k = Key::new(dir, BTRFS_DIR_ITEM_KEY, name_hash(name));
                let _ = remove_packed(st, subvol, &k, name, dir);
            })
    });
    if let Err(e) = entries {
        // Take the back reference away again; the error is the caller's.
        if location.ty == BTRFS_INODE_ITEM_KEY {
            let rk = Key::new(ino, BTRFS_INODE_REF_KEY, dir);
            if !remove_packed(st, subvol, &rk, name, dir).unwrap_or(true) {
                let xk = Key::new(ino, BTRFS_INODE_EXTREF_KEY, extref_hash(dir, name));
                let _ = remove_packed(st, subvol, &xk, name, dir);
            }
        }
        return Err(e);
    }
    adjust_dir_size(st, subvol, dir, name.len() as i64, transid, dir_change)
}

/// The inode's back reference for a new name: packed into its INODE_REF
/// for this parent, or an INODE_EXTREF once that item would not fit a leaf.
/// (Public for fsck's repair, which re-adds a lost one.)
pub fn add_backref(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    dir: u64,
    name: &[u8],
    index: u64,
) -> Result<()> {
    let t = TreeId::Tree(subvol);
    let rkey = Key::new(ino, BTRFS_INODE_REF_KEY, dir);
    let mut r = Vec::with_capacity(10 + name.len());
    encode_inode_ref(&mut r, index, name);
    let max = max_item(st);
    if st.append_item(t, &rkey, &r, max)? {
        return Ok(());
    }
    if st.sb().incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF == 0 {
        return Err(Error::errno(
            libc::EMLINK,
            format!("too many links to inode {ino} in directory {dir} (no extended inode refs)"),
        ));
    }
    let mut x = Vec::with_capacity(18 + name.len());
    encode_inode_extref(&mut x, dir, index, name);
    append_packed(
        st,
        t,
        &Key::new(ino, BTRFS_INODE_EXTREF_KEY, extref_hash(dir, name)),
        &x,
    )
}

/// Remove name `name` (index `index`) of `location` from `dir`: the
/// mirror of [`add_name`]. Returns whether the directory had it.
pub fn remove_name(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    location: Key,
    name: &[u8],
    index: u64,
    transid: u64,
) -> Result<bool> {
    let t = TreeId::Tree(subvol);
    let had = remove_packed(
        st,
        subvol,
        &Key::new(dir, BTRFS_DIR_ITEM_KEY, name_hash(name)),
        name,
        dir,
    )?;
    let had_index = st.delete_item(t, &Key::new(dir, BTRFS_DIR_INDEX_KEY, index))?;
    if location.ty == BTRFS_INODE_ITEM_KEY {
        let ino = location.objectid;
        if !remove_packed(
            st,
            subvol,
            &Key::new(ino, BTRFS_INODE_REF_KEY, dir),
            name,
            dir,
        )? {
            remove_packed(
                st,
                subvol,
                &Key::new(ino, BTRFS_INODE_EXTREF_KEY, extref_hash(dir, name)),
                name,
                dir,
            )?;
        }
    }
    if had || had_index {
        adjust_dir_size(st, subvol, dir, -(name.len() as i64), transid, |_| {})?;
    }
    Ok(had || had_index)
}

/// The directory size rule: +/- twice the name length per entry.
fn adjust_dir_size(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    name_len: i64,
    transid: u64,
    also: impl FnOnce(&mut crate::format::inode::InodeItem),
) -> Result<()> {
    super::inode::modify_inode(st, subvol, dir, |d| {
        // A hostile size saturates rather than wrapping.
        let size = (d.size.get() as i64)
            .saturating_add(name_len.saturating_mul(2))
            .max(0) as u64;
        d.size.set(size);
        d.transid.set(transid);
        also(d);
    })?;
    Ok(())
}

/// The dir index of inode `ino`'s name `name` in `dir`, from its inode
/// refs; a name without one is a corrupt reference.
pub fn index_of_name(st: &mut Store, subvol: u64, ino: u64, dir: u64, name: &[u8]) -> Result<u64> {
    links_in(st, subvol, ino, dir)?
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(i, _)| i)
        .ok_or_else(|| {
            Error::corrupt_key_as(
                crate::CorruptKind::Reference,
                "name without inode ref",
                0,
                Key::new(ino, BTRFS_INODE_REF_KEY, dir),
            )
        })
}

/// unlink(2) or rmdir(2) of `name` in `dir`: the entry goes, the named inode
/// loses the link (a directory all of them) and its ctime moves, the
/// directory's times move. Returns the inode and the links it has left;
/// dropping an inode with none is the caller's (it may still be open).
pub fn unlink(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    name: &[u8],
    now: crate::format::inode::Timespec,
) -> Result<(u64, u32, u64)> {
    let transid = st.transid();
    let (loc, _) = lookup_name(st, subvol, dir, name)?.ok_or_else(|| {
        Error::Invalid(format!(
            "no entry '{}' in directory {dir}",
            String::from_utf8_lossy(name)
        ))
    })?;
    if loc.ty != BTRFS_INODE_ITEM_KEY {
        return Err(Error::Invalid(format!(
            "'{}' is a subvolume",
            String::from_utf8_lossy(name)
        )));
    }
    let ino = loc.objectid;
    let index = index_of_name(st, subvol, ino, dir, name)?;
    remove_name(st, subvol, dir, loc, name, index, transid)?;
    let mut inode = get_inode(st, subvol, ino)?.ok_or_else(|| {
        Error::corrupt_as(
            crate::CorruptKind::Reference,
            "entry names a missing inode",
            ino,
        )
    })?;
    let nlink = if super::inode::is_dir(inode.mode.get()) {
        0
    } else {
        inode.nlink.get().saturating_sub(1)
    };
    inode.nlink.set(nlink);
    inode.ctime = now;
    inode.transid.set(transid);
    put_inode(st, subvol, ino, &inode)?;
    if let Some(mut p) = get_inode(st, subvol, dir)? {
        p.mtime = now;
        p.ctime = now;
        put_inode(st, subvol, dir, &p)?;
    }
    Ok((ino, nlink, index))
}

/// One directory entry item (the DIR_ITEM when `index` is None, else the
/// DIR_INDEX at `index`) for a name whose other records exist: what a
/// repair re-adds. The directory's size is the caller's (see
/// [`dir_size_from_entries`]).
#[allow(clippy::too_many_arguments)]
pub fn add_dir_entry(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    location: Key,
    name: &[u8],
    ftype: u8,
    index: Option<u64>,
    transid: u64,
) -> Result<()> {
    if name.is_empty() || name.len() > BTRFS_NAME_LEN {
        return Err(Error::Invalid(format!("name of {} bytes", name.len())));
    }
    let t = TreeId::Tree(subvol);
    let mut d = Vec::with_capacity(30 + name.len());
    encode_dir_entry(&mut d, &location, transid, ftype, name, &[]);
    match index {
        None => append_packed(
            st,
            t,
            &Key::new(dir, BTRFS_DIR_ITEM_KEY, name_hash(name)),
            &d,
        ),
        Some(i) => st.insert_item(t, &Key::new(dir, BTRFS_DIR_INDEX_KEY, i), &d),
    }
}

/// Remove from the DIR_ITEM or DIR_INDEX item `key` every entry whose
/// location is inode `ino`; the item goes when it empties. Returns how
/// many went.
pub fn remove_dir_entries_of(st: &mut Store, subvol: u64, key: &Key, ino: u64) -> Result<usize> {
    let t = TreeId::Tree(subvol);
    let Some(d) = st.lookup(t, key)? else {
        return Ok(0);
    };
    let ents = parse_dir_items(&d).map_err(|e| e.at(0, *key))?;
    let n = ents.len();
    let keep: Vec<_> = ents
        .iter()
        .filter(|e| Key::from(&e.item.location).objectid != ino)
        .collect();
    let gone = n - keep.len();
    if gone == 0 {
        return Ok(0);
    }
    if keep.is_empty() {
        st.delete_item(t, key)?;
    } else {
        let rest = encode_dir_entries(keep);
        st.update_item(t, key, &rest)?;
    }
    Ok(gone)
}

/// The name directory `dir`'s DIR_INDEX `index` holds, with its location
/// and type.
pub fn index_entry(
    st: &mut Store,
    subvol: u64,
    dir: u64,
    index: u64,
) -> Result<Option<(Vec<u8>, Key, u8)>> {
    let k = Key::new(dir, BTRFS_DIR_INDEX_KEY, index);
    let Some(d) = st.lookup(TreeId::Tree(subvol), &k)? else {
        return Ok(None);
    };
    let ents = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
    Ok(ents
        .first()
        .map(|e| (e.name.to_vec(), Key::from(&e.item.location), e.item.type_)))
}

/// What a directory's i_size must be for the entries it holds: the size
/// rule (twice the name length per name) counted over the DIR_ITEM and
/// DIR_INDEX entries actually there.
pub fn dir_size_from_entries(st: &mut Store, subvol: u64, dir: u64) -> Result<u64> {
    let mut size = 0u64;
    for (k, d) in st.items_in(
        TreeId::Tree(subvol),
        Key::new(dir, BTRFS_DIR_ITEM_KEY, 0),
        Key::new(dir, BTRFS_DIR_INDEX_KEY, u64::MAX),
    )? {
        if k.ty != BTRFS_DIR_ITEM_KEY && k.ty != BTRFS_DIR_INDEX_KEY {
            continue;
        }
        for e in parse_dir_items(&d).map_err(|e| e.at(0, k))? {
            size += e.name.len() as u64;
        }
    }
    Ok(size)
}
