//! Extended attributes: XATTR_ITEMs keyed by name hash, entries of
//! colliding names packed, the value after the name.

use crate::format::consts::*;
use crate::format::dir::{encode_dir_entries, encode_dir_entry, name_hash, parse_dir_items};
use crate::format::key::Key;
use crate::trans::{Store, TreeId};
use crate::{Error, Result};

fn xkey(ino: u64, name: &[u8]) -> Key {
    Key::new(ino, BTRFS_XATTR_ITEM_KEY, name_hash(name))
}

/// Set (or replace) `name` of inode `ino`.
pub fn set_xattr(
    st: &mut Store,
    subvol: u64,
    ino: u64,
    name: &[u8],
    value: &[u8],
    transid: u64,
) -> Result<()> {
    if name.is_empty() || name.len() > BTRFS_NAME_LEN {
        return Err(Error::Invalid(format!(
            "xattr name of {} bytes",
            name.len()
        )));
    }
    let t = TreeId::Tree(subvol);
    let k = xkey(ino, name);
    let mut item = match st.lookup(t, &k)? {
        Some(d) => {
            let ents = parse_dir_items(&d).map_err(|e| e.at(0, k))?;
            encode_dir_entries(ents.iter().filter(|e| e.name != name))
        }
        None => Vec::new(),
    };
    encode_dir_entry(&mut item, &Key::MIN, transid, BTRFS_FT_XATTR, name, value);
    let max = st.nodesize() as usize
        - crate::format::header::HEADER_SIZE
        - crate::format::header::ITEM_SIZE;
    if item.len() > max {
        return Err(Error::NoSpace(format!(
            "xattr {} of {} bytes does not fit in a tree block",
            String::from_utf8_lossy(name),
            value.len()
        )));
    }
    st.update_item(t, &k, &item)
}

/// Remove `name`; returns whether it was set.
pub fn remove_xattr(st: &mut Store, subvol: u64, ino: u64, name: &[u8]) -> Result<bool> {
    super::names::remove_packed(st, subvol, &xkey(ino, name), name, 0)
}

/// The value of extended attribute `name` of `ino`, `None` when it is not set.
pub fn get_xattr(st: &mut Store, subvol: u64, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
    let k = xkey(ino, name);
    let Some(d) = st.lookup(TreeId::Tree(subvol), &k)? else {
        return Ok(None);
    };
    Ok(parse_dir_items(&d)
        .map_err(|e| e.at(0, k))?
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.data.to_vec()))
}

/// Every (name, value) of an inode.
pub fn list_xattrs(st: &mut Store, subvol: u64, ino: u64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for (k, d) in st.items_in(
        TreeId::Tree(subvol),
        Key::new(ino, BTRFS_XATTR_ITEM_KEY, 0),
        Key::new(ino, BTRFS_XATTR_ITEM_KEY, u64::MAX),
    )? {
        for e in parse_dir_items(&d).map_err(|e| e.at(0, k))? {
            out.push((e.name.to_vec(), e.data.to_vec()));
        }
    }
    Ok(out)
}
