//! `btrfs subvolume list`, `btrfs property` and `btrfs filesystem label`
//! for images: subvolumes as the root tree lists them, with their paths
//! from the top level; the properties of subvolumes (ro), files
//! (compression) and the filesystem (label).

use crate::format::consts::*;
use crate::format::key::Key;
use crate::format::root::{parse_root_ref, RootItem};
use crate::fs::{Filesystem, Loc};
use crate::trans::{Store, TreeId};
use crate::{Error, Result};

/// Most directories between a subvolume's root and the top level, and
/// most subvolumes above one (bounds damaged references).
const MAX_DEPTH: usize = 4096;

/// One subvolume as `btrfs subvolume list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Subvolume {
    /// Its id (tree objectid).
    pub id: u64,
    /// Its root item's generation.
    pub gen: u64,
    /// Transaction that made it.
    pub ogen: u64,
    /// The subvolume its entry is in (5: the top level).
    pub parent: u64,
    /// Its path from the top level.
    pub path: String,
    /// BTRFS_ROOT_SUBVOL_RDONLY.
    pub readonly: bool,
    /// Its uuid, its source's (a snapshot), what it was received as.
    pub uuid: String,
    /// The uuid of the subvolume it is a snapshot of, "-" if none.
    pub parent_uuid: String,
    /// The uuid it was received as, "-" if none.
    pub received_uuid: String,
}

fn uuid_or_dash(u: &[u8; 16]) -> String {
    if u.iter().all(|&b| b == 0) {
        "-".into()
    } else {
        crate::util::uuid::uuid_str(u)
    }
}

/// The path of directory `ino` in subvolume `subvol` from its root
/// ("" for the root), through its first name at each level.
fn dir_path(st: &mut Store, subvol: u64, mut ino: u64) -> Result<String> {
    let mut parts: Vec<String> = Vec::new();
    for _ in 0..MAX_DEPTH {
        if ino == BTRFS_FIRST_FREE_OBJECTID {
            parts.reverse();
            return Ok(parts.join("/"));
        }
        let links = crate::fs::names::links_of(st, subvol, ino)?;
        let Some(l) = links.first() else {
            return Err(Error::corrupt_as(
                crate::CorruptKind::Reference,
                format!("directory {ino} of subvolume {subvol} has no name"),
                ino,
            ));
        };
        parts.push(String::from_utf8_lossy(&l.name).into_owned());
        ino = l.parent;
    }
    Err(Error::corrupt_as(
        crate::CorruptKind::Structure,
        format!("directory {ino} of subvolume {subvol} does not reach its root"),
        ino,
    ))
}

/// Every subvolume (not the top level, not deleted ones), by id.
pub fn list(st: &mut Store) -> Result<Vec<Subvolume>> {
    let mut items: Vec<(u64, RootItem)> = Vec::new();
    let mut refs: std::collections::BTreeMap<u64, (u64, u64, String)> = Default::default();
    let mut k = Key::new(BTRFS_FIRST_FREE_OBJECTID, 0, 0);
    let mut guard = 0usize;
    while let Some((key, d)) = st.next_item(TreeId::Root, &k)? {
        guard += 1;
        if key == Key::MAX || key.objectid > BTRFS_LAST_FREE_OBJECTID || guard > 1 << 24 {
            break;
        }
        k = crate::trans::next_key(&key);
        match key.ty {
            BTRFS_ROOT_ITEM_KEY => {
                let ri = RootItem::parse(&d).map_err(|e| e.at(0, key))?;
                if ri.refs.get() > 0 {
                    items.push((key.objectid, ri));
                }
            }
            BTRFS_ROOT_BACKREF_KEY => {
                let (r, name) = parse_root_ref(&d).map_err(|e| e.at(0, key))?;
                refs.entry(key.objectid).or_insert((
                    key.offset,
                    r.dirid.get(),
                    String::from_utf8_lossy(name).into_owned(),
                ));
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(items.len());
    for (id, ri) in items {
        // Unlinked (an orphan being deleted): not listed.
        let Some((parent, _, _)) = refs.get(&id).cloned() else {
            continue;
        };
        let mut path: Vec<String> = Vec::new();
        let mut cur = id;
        for _ in 0..MAX_DEPTH {
            let Some((p, dirid, name)) = refs.get(&cur).cloned() else {
                break;
            };
            path.push(name);
            let d = dir_path(st, p, dirid)?;
            if !d.is_empty() {
                path.push(d);
            }
            if p == BTRFS_FS_TREE_OBJECTID {
                break;
            }
            cur = p;
        }
        path.reverse();
        out.push(Subvolume {
            id,
            gen: ri.generation.get(),
            ogen: ri.otransid.get(),
            parent,
            path: path.join("/"),
            readonly: ri.flags.get() & BTRFS_ROOT_SUBVOL_RDONLY != 0,
            uuid: uuid_or_dash(&ri.uuid),
            parent_uuid: uuid_or_dash(&ri.parent_uuid),
            received_uuid: uuid_or_dash(&ri.received_uuid),
        });
    }
    Ok(out)
}

pub use crate::fs::subvol::default_subvol_id as default_id;

/// The property names btrfs knows, by the object they belong to.
pub const PROPERTIES: [(&str, &str); 3] = [
    ("ro", "subvol"),
    ("label", "filesystem"),
    ("compression", "inode"),
];

/// A subvolume's root directory at `path` (the top level for "/").
fn subvolume_at(fs: &mut Filesystem, path: &str) -> Result<Loc> {
    let l = fs.resolve(path, true)?;
    if l.ino != crate::fs::ROOT_DIR {
        return Err(Error::Invalid(format!("{path} is not a subvolume")));
    }
    Ok(l)
}

/// `btrfs property get OBJECT NAME` (`NAME` one of [`PROPERTIES`]).
pub fn get(fs: &mut Filesystem, object: &str, name: &str) -> Result<Option<String>> {
    match name {
        "ro" => {
            let l = subvolume_at(fs, object)?;
            let ri = fs.store.root_item(l.subvol)?;
            Ok(Some(
                (ri.flags.get() & BTRFS_ROOT_SUBVOL_RDONLY != 0).to_string(),
            ))
        }
        "label" => Ok(Some(fs.store.sb().label_str())),
        "compression" => {
            let l = fs.resolve(object, true)?;
            Ok(fs
                .xattrs()
                .get_xattr(l, crate::fs::COMPRESSION)?
                .map(|v| String::from_utf8_lossy(&v).into_owned()))
        }
        _ => Err(Error::Invalid(format!("unknown property: {name}"))),
    }
}

/// `btrfs property set [-f] OBJECT NAME VALUE`. Making a received
/// subvolume writable clears what it was received as, and needs `force`
/// (btrfs-progs' rule: an incremental send from it would be wrong).
pub fn set(fs: &mut Filesystem, object: &str, name: &str, value: &str, force: bool) -> Result<()> {
    match name {
        "ro" => {
            let ro = match value {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(Error::Invalid(format!(
                        "invalid value for ro: {value} (true or false)"
                    )))
                }
            };
            let l = subvolume_at(fs, object)?;
            let ri = fs.store.root_item(l.subvol)?;
            let received = ri.received_uuid.iter().any(|&b| b != 0);
            if !ro && received && ri.flags.get() & BTRFS_ROOT_SUBVOL_RDONLY != 0 && !force {
                return Err(Error::Invalid(
                    "cannot make a received subvolume writable: its received_uuid serves incremental send; use --force to clear it".into(),
                ));
            }
            fs.store.update_root_item(l.subvol, |r| {
                let f = r.flags.get();
                r.flags.set(if ro {
                    f | BTRFS_ROOT_SUBVOL_RDONLY
                } else {
                    f & !BTRFS_ROOT_SUBVOL_RDONLY
                });
                if !ro && received {
                    r.received_uuid = [0; 16];
                    r.stransid.set(0);
                    r.rtransid.set(0);
                }
            })?;
            if !ro && received {
                fs.subvols()
                    .uuid_remove_received(&ri.received_uuid, l.subvol)?;
            }
            Ok(())
        }
        "label" => set_label(&mut fs.store, value),
        "compression" => {
            let l = fs.resolve(object, true)?;
            if value.is_empty() {
                match fs.xattrs().remove_xattr(l, crate::fs::COMPRESSION) {
                    Ok(()) => Ok(()),
                    Err(e) if e.as_errno() == libc::ENODATA => Ok(()),
                    Err(e) => Err(e),
                }
            } else {
                fs.xattrs()
                    .set_xattr(l, crate::fs::COMPRESSION, value.as_bytes())
            }
        }
        _ => Err(Error::Invalid(format!("unknown property: {name}"))),
    }
}

/// The filesystem's label (at most 255 bytes), written into every
/// superblock by the next commit.
pub fn set_label(st: &mut Store, label: &str) -> Result<()> {
    if label.len() >= BTRFS_LABEL_SIZE {
        return Err(Error::Invalid(format!(
            "label is too long: {} bytes, at most {}",
            label.len(),
            BTRFS_LABEL_SIZE - 1
        )));
    }
    if label.contains('\n') {
        return Err(Error::Invalid("a label cannot hold a newline".into()));
    }
    st.update_superblock(|sb| {
        sb.label = [0; BTRFS_LABEL_SIZE];
        sb.label[..label.len()].copy_from_slice(label.as_bytes());
    });
    Ok(())
}
