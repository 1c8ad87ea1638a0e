//! POSIX access control lists, kept as btrfs keeps them: the xattrs
//! `system.posix_acl_access` and `system.posix_acl_default` in the
//! kernel's posix_acl_xattr format (a version word, then entries of tag,
//! permissions and id; the id of an entry that names no one is
//! ACL_UNDEFINED_ID). The rules are the kernel's posix_acl.c: a new inode
//! inherits its directory's default ACL (posix_acl_create), chmod rewrites
//! the access ACL (posix_acl_chmod), setting an access ACL sets the mode
//! and an ACL a mode can say is not kept (posix_acl_update_mode).

use crate::{Error, Result};

/// The access ACL's xattr.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's xattr (directories only).
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const ENTRY: usize = 8;
/// Most entries an ACL may have (the kernel's xattr size bound, 64 KiB).
const MAX_ENTRIES: usize = (65536 - 4) / ENTRY;
const UNDEFINED_ID: u32 = u32::MAX;

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// One entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    /// ACL_USER_OBJ, ACL_USER, ...
    pub tag: u16,
    /// rwx bits.
    pub perm: u16,
    /// The user or group of an ACL_USER or ACL_GROUP entry.
    pub id: u32,
}

/// An ACL, valid (posix_acl_valid) once parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(pub Vec<AclEntry>);

fn inval(why: &str) -> Error {
    Error::errno(libc::EINVAL, format!("POSIX ACL: {why}"))
}

/// posix_acl_from_xattr + posix_acl_valid. None: an ACL of no entries
/// (which removes one).
pub fn parse(v: &[u8]) -> Result<Option<Acl>> {
    if v.len() < 4 {
        return Err(inval("shorter than its header"));
    }
    if u32::from_le_bytes([v[0], v[1], v[2], v[3]]) != VERSION {
        return Err(inval("unknown version"));
    }
    let body = &v[4..];
    if !body.len().is_multiple_of(ENTRY) || body.len() / ENTRY > MAX_ENTRIES {
        return Err(inval("size is not a whole number of entries"));
    }
    if body.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(body.len() / ENTRY);
    for e in body.chunks_exact(ENTRY) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let id = match tag {
            USER | GROUP => id,
            USER_OBJ | GROUP_OBJ | MASK | OTHER => UNDEFINED_ID,
            _ => return Err(inval("unknown entry tag")),
        };
        out.push(AclEntry { tag, perm, id });
    }
    let acl = Acl(out);
    acl.validate()?;
    Ok(Some(acl))
}

impl Acl {
    /// posix_acl_to_xattr.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + self.0.len() * ENTRY);
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.0 {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    /// posix_acl_valid: one owner entry first, named users in id order,
    /// the owning group, named groups in id order, a mask when anything is
    /// named, others last.
    fn validate(&self) -> Result<()> {
        #[derive(PartialEq)]
        enum S {
            UserObj,
            User,
            Group,
            Other,
            Done,
        }
        let mut state = S::UserObj;
        let mut needs_mask = false;
        let mut prev: Option<(u16, u32)> = None;
        for e in &self.0 {
            if e.perm & !7 != 0 {
                return Err(inval("permission bits beyond rwx"));
            }
            match e.tag {
                USER_OBJ if state == S::UserObj => state = S::User,
                USER if state == S::User => {
                    if prev.is_some_and(|(t, id)| t == USER && id >= e.id) {
                        return Err(inval("named users out of order"));
                    }
                    needs_mask = true;
                }
                GROUP_OBJ if state == S::User => state = S::Group,
                GROUP if state == S::Group => {
                    if prev.is_some_and(|(t, id)| t == GROUP && id >= e.id) {
                        return Err(inval("named groups out of order"));
                    }
                    needs_mask = true;
                }
                MASK if state == S::Group => state = S::Other,
                OTHER if state == S::Other || (state == S::Group && !needs_mask) => state = S::Done,
                _ => return Err(inval("entries out of order")),
            }
            prev = Some((e.tag, e.id));
        }
        if state == S::Done {
            Ok(())
        } else {
            Err(inval("an entry is missing"))
        }
    }

    /// posix_acl_equiv_mode: whether a mode says all of it (Ok(true)),
    /// with the mode's permission bits in `mode`.
    pub fn equiv_mode(&self, mode: &mut u32) -> bool {
        let mut m = 0u32;
        let mut equiv = true;
        for e in &self.0 {
            let p = u32::from(e.perm);
            match e.tag {
                USER_OBJ => m |= p << 6,
                GROUP_OBJ => m |= p << 3,
                OTHER => m |= p,
                MASK => {
                    m = (m & !0o070) | (p << 3);
                    equiv = false;
                }
                _ => equiv = false,
            }
        }
        *mode = (*mode & !0o777) | m;
        equiv
    }

    /// posix_acl_create_masq: the ACL a new inode of `mode` inherits, and
    /// the mode it gets; false when the mode says all of the ACL.
    fn create_masq(&mut self, mode: &mut u32) -> bool {
        let mut m = *mode;
        let mut not_equiv = false;
        let mut group_obj = None;
        let mut mask_obj = None;
        for (i, e) in self.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((m >> 6) as u16) | !7;
                    m &= (u32::from(e.perm) << 6) | !0o700;
                }
                USER | GROUP => not_equiv = true,
                GROUP_OBJ => group_obj = Some(i),
                OTHER => {
                    e.perm &= (m as u16) | !7;
                    m &= u32::from(e.perm) | !0o007;
                }
                MASK => {
                    mask_obj = Some(i);
                    not_equiv = true;
                }
                _ => {}
            }
        }
        if let Some(i) = mask_obj.or(group_obj) {
            let e = &mut self.0[i];
            e.perm &= ((m >> 3) as u16) | !7;
            m &= (u32::from(e.perm) << 3) | !0o070;
        }
        *mode = m;
        not_equiv
    }

    /// __posix_acl_chmod: the owner, group (the mask when there is one)
    /// and other entries take the mode's bits.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
    }
}

/// What a new inode of `mode` gets in a directory whose default ACL is
/// `dir_default` (posix_acl_create): its mode, its access ACL (None when
/// the mode says it all) and, for a directory, the default ACL it keeps.
/// Without a default ACL the umask applies; a symlink takes neither.
pub fn inherit(dir_default: Option<Acl>, mode: u32, umask: u32) -> (u32, Option<Acl>, Option<Acl>) {
    if mode & libc::S_IFMT == libc::S_IFLNK {
        return (mode, None, None);
    }
    let Some(d) = dir_default else {
        return (mode & !(umask & 0o777), None, None);
    };
    let mut m = mode;
    let mut access = d.clone();
    let keep = access.create_masq(&mut m);
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    (m, keep.then_some(access), is_dir.then_some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(e: &[(u16, u16, u32)]) -> Acl {
        Acl(e
            .iter()
            .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
            .collect())
    }

    #[test]
    fn parse_encode_round_trip_and_validation() {
        let a = acl(&[
            (USER_OBJ, 7, UNDEFINED_ID),
            (USER, 5, 1000),
            (GROUP_OBJ, 5, UNDEFINED_ID),
            (MASK, 7, UNDEFINED_ID),
            (OTHER, 0, UNDEFINED_ID),
        ]);
        assert_eq!(parse(&a.encode()).unwrap(), Some(a.clone()));
        // A named user without a mask, and entries out of order.
        let bad = acl(&[
            (USER_OBJ, 7, UNDEFINED_ID),
            (USER, 5, 1000),
            (GROUP_OBJ, 5, UNDEFINED_ID),
            (OTHER, 0, UNDEFINED_ID),
        ]);
        assert!(parse(&bad.encode()).is_err());
        let bad = acl(&[(GROUP_OBJ, 5, UNDEFINED_ID), (USER_OBJ, 7, UNDEFINED_ID)]);
        assert!(parse(&bad.encode()).is_err());
        assert!(parse(&[2, 0, 0, 0, 1]).is_err());
        assert_eq!(parse(&[2, 0, 0, 0]).unwrap(), None);
    }

    #[test]
    fn inheritance_chmod_and_equivalence_as_the_kernel() {
        let d = acl(&[
            (USER_OBJ, 7, UNDEFINED_ID),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, UNDEFINED_ID),
            (MASK, 7, UNDEFINED_ID),
            (OTHER, 5, UNDEFINED_ID),
        ]);
        // A file made 0666 under it: the mask takes the group bits.
        let (m, a, dd) = inherit(Some(d.clone()), libc::S_IFREG | 0o666, 0o022);
        assert_eq!(m & 0o777, 0o664);
        let a = a.unwrap();
        assert_eq!(a.0[3].perm, 6);
        assert_eq!(a.0[0].perm, 6);
        assert!(dd.is_none());
        // A directory keeps the default ACL.
        let (m, _, dd) = inherit(Some(d.clone()), libc::S_IFDIR | 0o777, 0o022);
        assert_eq!(m & 0o777, 0o775);
        assert_eq!(dd, Some(d.clone()));
        // No default ACL: the umask.
        assert_eq!(inherit(None, libc::S_IFREG | 0o666, 0o027).0 & 0o777, 0o640);
        // chmod writes the mask, not the owning group.
        let mut c = d.clone();
        c.chmod(0o640);
        assert_eq!(
            (c.0[0].perm, c.0[2].perm, c.0[3].perm, c.0[4].perm),
            (6, 5, 4, 0)
        );
        // An ACL of the three base entries is a mode.
        let base = acl(&[
            (USER_OBJ, 6, UNDEFINED_ID),
            (GROUP_OBJ, 4, UNDEFINED_ID),
            (OTHER, 0, UNDEFINED_ID),
        ]);
        let mut mode = libc::S_IFREG | 0o777;
        assert!(base.equiv_mode(&mut mode));
        assert_eq!(mode & 0o777, 0o640);
        let mut mode = 0;
        assert!(!d.equiv_mode(&mut mode));
        assert_eq!(mode, 0o775);
    }
}
