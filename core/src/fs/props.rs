//! Inode properties: the `btrfs.*` xattrs the kernel interprets (props.c).
//! Only `btrfs.compression` exists. Its value is kept in the inode's xattr
//! and mirrored in the inode flags (COMPRESS or NOCOMPRESS) and in the
//! runtime compression type, which picks the algorithm at writeback before
//! the mount option does. New files and directories inherit it from their
//! parent directory, a new subvolume from its parent subvolume's root.

use super::filesystem::{Filesystem, Loc};
use super::inode::{is_dir, is_reg};
use crate::error::{Error, Result};
use crate::format::consts::*;

/// Extended attributes and the properties stored as them (btrfs.compression): set, removed, read, listed, inherited from the parent directory. Obtained from [`Filesystem::xattrs`].
pub struct Xattrs<'a> {
    pub(super) fs: &'a mut Filesystem,
}

impl Filesystem {
    /// See [`Xattrs`].
    pub fn xattrs(&mut self) -> Xattrs<'_> {
        Xattrs { fs: self }
    }
}

/// The xattr holding the compression property.
pub const COMPRESSION: &[u8] = b"btrfs.compression";

/// What a property value asks for (prop_compression_validate/apply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    /// Empty value: back to the mount's default.
    Reset,
    /// "no" or "none": never compress (NOCOMPRESS).
    Never,
    /// A type ("zlib", "lzo", "zstd", optionally followed by more bytes, as
    /// the kernel compares only the type's length).
    Kind(u8),
}

fn parse_compression(v: &[u8]) -> Option<Compression> {
    if v.is_empty() {
        return Some(Compression::Reset);
    }
    if v == b"no" || v == b"none" {
        return Some(Compression::Never);
    }
    [
        (&b"zlib"[..], BTRFS_COMPRESS_ZLIB),
        (b"lzo", BTRFS_COMPRESS_LZO),
        (b"zstd", BTRFS_COMPRESS_ZSTD),
    ]
    .iter()
    .find(|(n, _)| v.starts_with(n))
    .map(|(_, k)| Compression::Kind(*k))
}

pub fn kind_name(kind: u8) -> Option<&'static [u8]> {
    match kind {
        BTRFS_COMPRESS_ZLIB => Some(b"zlib"),
        BTRFS_COMPRESS_LZO => Some(b"lzo"),
        BTRFS_COMPRESS_ZSTD => Some(b"zstd"),
        _ => None,
    }
}

fn einval(what: &str) -> Error {
    Error::errno(libc::EINVAL, what.to_string())
}

impl Xattrs<'_> {
    /// The compression type the inode's property names (0: none), read
    /// from its xattr the first time (btrfs_load_inode_props).
    pub(super) fn prop_compress(&mut self, l: Loc) -> Result<u8> {
        if let Some(k) = self.fs.rt(l)?.prop_compress {
            return Ok(k);
        }
        let v = super::xattr::get_xattr(&mut self.fs.store, l.subvol, l.ino, COMPRESSION)?;
        let k = match v.as_deref().and_then(parse_compression) {
            Some(Compression::Kind(k)) => k,
            _ => 0,
        };
        self.fs.rt(l)?.prop_compress = Some(k);
        Ok(k)
    }

    /// Set (`Some`) or remove (`None`) a `btrfs.*` property through the
    /// xattr calls, as btrfs_xattr_handler_set_prop: an unknown name or a
    /// bad value is EINVAL, so is compression on a nodatacow or nodatasum
    /// inode; on an inode that is neither a file nor a directory the call
    /// succeeds and does nothing. An empty value removes the property.
    /// `must_exist`: removexattr (ENODATA when there is nothing to remove).
    pub(super) fn set_prop(
        &mut self,
        l: Loc,
        name: &[u8],
        value: Option<&[u8]>,
        must_exist: bool,
    ) -> Result<()> {
        if name != COMPRESSION {
            return Err(einval("unknown btrfs property"));
        }
        let value = value.filter(|v| !v.is_empty());
        let it = self.fs.item(l)?;
        if let Some(v) = value {
            if it.flags.get() & (BTRFS_INODE_NODATACOW | BTRFS_INODE_NODATASUM) != 0 {
                return Err(einval("compression on a nodatacow or nodatasum inode"));
            }
            if parse_compression(v).is_none() {
                return Err(einval("bad compression property value"));
            }
        }
        let m = it.mode.get();
        if !is_reg(m) && !is_dir(m) {
            return Ok(());
        }
        let t = self.fs.store.transid();
        let prop = match value {
            Some(v) => {
                super::xattr::set_xattr(&mut self.fs.store, l.subvol, l.ino, COMPRESSION, v, t)?;
                parse_compression(v).unwrap_or(Compression::Reset)
            }
            None => {
                let removed =
                    super::xattr::remove_xattr(&mut self.fs.store, l.subvol, l.ino, COMPRESSION)?;
                if !removed && must_exist {
                    return Err(Error::errno(
                        libc::ENODATA,
                        "removexattr btrfs.compression: no such attribute",
                    ));
                }
                Compression::Reset
            }
        };
        self.apply_compression(l, prop)?;
        self.fs.rt(l)?.copy_everything = true;
        self.fs.stamp(l, true, false)
    }

    /// The flags and runtime type a compression value stands for.
    fn apply_compression(&mut self, l: Loc, prop: Compression) -> Result<()> {
        let (set, clear, kind) = match prop {
            Compression::Reset => (0, BTRFS_INODE_COMPRESS | BTRFS_INODE_NOCOMPRESS, 0),
            Compression::Never => (BTRFS_INODE_NOCOMPRESS, BTRFS_INODE_COMPRESS, 0),
            Compression::Kind(k) => (BTRFS_INODE_COMPRESS, BTRFS_INODE_NOCOMPRESS, k),
        };
        self.fs
            .modify(l, |it| it.flags.set((it.flags.get() & !clear) | set))?;
        self.fs.rt(l)?.prop_compress = Some(kind);
        match kind {
            BTRFS_COMPRESS_LZO => self
                .fs
                .store
                .set_incompat(BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO),
            BTRFS_COMPRESS_ZSTD => self
                .fs
                .store
                .set_incompat(BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD),
            _ => {}
        }
        Ok(())
    }

    /// A new inode takes its parent's compression type
    /// (btrfs_inode_inherit_props): files and directories only, and not
    /// when the new inode cannot compress.
    pub(super) fn inherit_props(&mut self, child: Loc, parent: Loc) -> Result<()> {
        let kind = self.prop_compress(parent)?;
        let Some(name) = kind_name(kind) else {
            return Ok(());
        };
        let it = self.fs.item(child)?;
        let m = it.mode.get();
        if (!is_reg(m) && !is_dir(m))
            || it.flags.get() & (BTRFS_INODE_NODATACOW | BTRFS_INODE_NODATASUM) != 0
        {
            return Ok(());
        }
        let t = self.fs.store.transid();
        super::xattr::set_xattr(
            &mut self.fs.store,
            child.subvol,
            child.ino,
            COMPRESSION,
            name,
            t,
        )?;
        self.apply_compression(child, Compression::Kind(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_values() {
        assert_eq!(parse_compression(b""), Some(Compression::Reset));
        assert_eq!(parse_compression(b"no"), Some(Compression::Never));
        assert_eq!(parse_compression(b"none"), Some(Compression::Never));
        assert_eq!(
            parse_compression(b"zstd"),
            Some(Compression::Kind(BTRFS_COMPRESS_ZSTD))
        );
        assert_eq!(
            parse_compression(b"zstd:9"),
            Some(Compression::Kind(BTRFS_COMPRESS_ZSTD))
        );
        assert_eq!(
            parse_compression(b"lzo"),
            Some(Compression::Kind(BTRFS_COMPRESS_LZO))
        );
        assert_eq!(
            parse_compression(b"zlib"),
            Some(Compression::Kind(BTRFS_COMPRESS_ZLIB))
        );
        assert_eq!(parse_compression(b"zl"), None);
        assert_eq!(parse_compression(b"nope"), None);
    }

    fn fresh() -> Filesystem {
        let dev: std::sync::Arc<dyn crate::io::BlockDevice> =
            std::sync::Arc::new(crate::io::MemDevice::zeroed(256 << 20));
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        Filesystem::mount(dev, Default::default(), crate::log::LogState::boxed()).unwrap()
    }

    fn errno(r: Result<()>) -> i32 {
        match r {
            Err(Error::Errno { errno, .. }) => errno,
            other => panic!("expected an errno, got {other:?}"),
        }
    }

    #[test]
    fn property_rules() {
        let mut fs = fresh();
        let root = fs.root();
        let d = fs.mkdir(root, b"d", 0o755).unwrap();
        assert_eq!(
            errno(fs.xattrs().set_xattr(d, b"btrfs.bogus", b"zstd")),
            libc::EINVAL
        );
        assert_eq!(
            errno(fs.xattrs().set_xattr(d, b"btrfs.compression", b"gzip")),
            libc::EINVAL
        );
        fs.xattrs()
            .set_xattr(d, b"btrfs.compression", b"zstd")
            .unwrap();
        let flags = fs.item(d).unwrap().flags.get();
        assert!(flags & BTRFS_INODE_COMPRESS != 0 && flags & BTRFS_INODE_NOCOMPRESS == 0);
        assert!(fs.store.sb().incompat_flags.get() & BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD != 0);
        // Files and directories inherit it; symlinks do not, and setting it
        // on one does nothing.
        let f = fs.create(d, b"f", 0o644).unwrap();
        let sub = fs.mkdir(d, b"sub", 0o755).unwrap();
        let s = fs.symlink(d, b"s", b"f").unwrap();
        for l in [f, sub] {
            assert_eq!(
                fs.xattrs().get_xattr(l, COMPRESSION).unwrap().as_deref(),
                Some(&b"zstd"[..])
            );
            assert!(fs.item(l).unwrap().flags.get() & BTRFS_INODE_COMPRESS != 0);
        }
        assert_eq!(fs.xattrs().get_xattr(s, COMPRESSION).unwrap(), None);
        fs.xattrs()
            .set_xattr(s, b"btrfs.compression", b"lzo")
            .unwrap();
        assert_eq!(fs.xattrs().get_xattr(s, COMPRESSION).unwrap(), None);
        // "none": never compress; removal: back to the default.
        fs.xattrs()
            .set_xattr(f, b"btrfs.compression", b"none")
            .unwrap();
        let flags = fs.item(f).unwrap().flags.get();
        assert!(flags & BTRFS_INODE_NOCOMPRESS != 0 && flags & BTRFS_INODE_COMPRESS == 0);
        assert_eq!(fs.xattrs().prop_compress(f).unwrap(), 0);
        fs.xattrs().remove_xattr(f, b"btrfs.compression").unwrap();
        assert_eq!(
            fs.item(f).unwrap().flags.get() & (BTRFS_INODE_COMPRESS | BTRFS_INODE_NOCOMPRESS),
            0
        );
        assert_eq!(
            errno(fs.xattrs().remove_xattr(f, b"btrfs.compression")),
            libc::ENODATA
        );
        // An empty value removes it without complaint.
        fs.xattrs()
            .set_xattr(sub, b"btrfs.compression", b"")
            .unwrap();
        assert_eq!(fs.xattrs().get_xattr(sub, COMPRESSION).unwrap(), None);
        fs.xattrs()
            .set_xattr(sub, b"btrfs.compression", b"")
            .unwrap();
    }
}
