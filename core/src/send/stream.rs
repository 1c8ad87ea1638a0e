//! The send stream: what `btrfs send` writes and `btrfs receive` reads
//! (btrfs-progs' send.h, the kernel's send.c). A stream is a header
//! (`btrfs-stream\0`, version) and commands, each a header (length of the
//! attributes, command, crc32c of the whole command with its crc field
//! zero) and attributes (type, length, value). From version 2 the data
//! attribute has no length: it takes the rest of its command.
//!
//! The reader trusts nothing: a length that runs past its command, a
//! command longer than [`MAX_COMMAND`], a checksum that does not match, an
//! attribute of the wrong size or missing are each an error naming the
//! byte of the stream where the command starts.

use crate::{Error, Result};
use std::io::{Read, Write};

/// The stream's magic, NUL included.
pub const MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// The newest protocol version read and written.
pub const MAX_VERSION: u32 = 2;
/// Bytes of a command header (`struct btrfs_cmd_header`).
pub const CMD_HEADER: usize = 10;
/// The longest command read (attributes, bytes). The kernel's buffers
/// hold 64 KiB (v1) and 16 KiB plus 128 KiB of compressed data (v2); this
/// leaves room for any sender while bounding what a stream makes us
/// allocate.
pub const MAX_COMMAND: usize = 16 << 20;

/// `enum btrfs_send_cmd`.
#[allow(missing_docs)]
pub mod cmd {
    pub const SUBVOL: u16 = 1;
    pub const SNAPSHOT: u16 = 2;
    pub const MKFILE: u16 = 3;
    pub const MKDIR: u16 = 4;
    pub const MKNOD: u16 = 5;
    pub const MKFIFO: u16 = 6;
    pub const MKSOCK: u16 = 7;
    pub const SYMLINK: u16 = 8;
    pub const RENAME: u16 = 9;
    pub const LINK: u16 = 10;
    pub const UNLINK: u16 = 11;
    pub const RMDIR: u16 = 12;
    pub const SET_XATTR: u16 = 13;
    pub const REMOVE_XATTR: u16 = 14;
    pub const WRITE: u16 = 15;
    pub const CLONE: u16 = 16;
    pub const TRUNCATE: u16 = 17;
    pub const CHMOD: u16 = 18;
    pub const CHOWN: u16 = 19;
    pub const UTIMES: u16 = 20;
    pub const END: u16 = 21;
    pub const UPDATE_EXTENT: u16 = 22;
    pub const FALLOCATE: u16 = 23;
    pub const FILEATTR: u16 = 24;
    pub const ENCODED_WRITE: u16 = 25;
    pub const ENABLE_VERITY: u16 = 26;
}

/// Attribute types (`BTRFS_SEND_A_*`).
#[allow(missing_docs)]
pub mod attr {
    pub const UUID: u16 = 1;
    pub const CTRANSID: u16 = 2;
    pub const INO: u16 = 3;
    pub const SIZE: u16 = 4;
    pub const MODE: u16 = 5;
    pub const UID: u16 = 6;
    pub const GID: u16 = 7;
    pub const RDEV: u16 = 8;
    pub const CTIME: u16 = 9;
    pub const MTIME: u16 = 10;
    pub const ATIME: u16 = 11;
    pub const OTIME: u16 = 12;
    pub const XATTR_NAME: u16 = 13;
    pub const XATTR_DATA: u16 = 14;
    pub const PATH: u16 = 15;
    pub const PATH_TO: u16 = 16;
    pub const PATH_LINK: u16 = 17;
    pub const FILE_OFFSET: u16 = 18;
    pub const DATA: u16 = 19;
    pub const CLONE_UUID: u16 = 20;
    pub const CLONE_CTRANSID: u16 = 21;
    pub const CLONE_PATH: u16 = 22;
    pub const CLONE_OFFSET: u16 = 23;
    pub const CLONE_LEN: u16 = 24;
    pub const FALLOCATE_MODE: u16 = 25;
    pub const FILEATTR: u16 = 26;
    pub const UNENCODED_FILE_LEN: u16 = 27;
    pub const UNENCODED_LEN: u16 = 28;
    pub const UNENCODED_OFFSET: u16 = 29;
    pub const COMPRESSION: u16 = 30;
    pub const ENCRYPTION: u16 = 31;
    pub const VERITY_ALGORITHM: u16 = 32;
    pub const VERITY_BLOCK_SIZE: u16 = 33;
    pub const VERITY_SALT_DATA: u16 = 34;
    pub const VERITY_SIG_DATA: u16 = 35;
    /// The highest attribute type.
    pub const MAX: u16 = 35;
}

/// `BTRFS_ENCODED_IO_COMPRESSION_*`: how an encoded write's data is
/// compressed.
#[allow(missing_docs)]
pub mod encoded {
    pub const NONE: u32 = 0;
    pub const ZLIB: u32 = 1;
    pub const ZSTD: u32 = 2;
    pub const LZO_4K: u32 = 3;
    pub const LZO_64K: u32 = 7;
}

/// A time as the stream carries it (`struct btrfs_timespec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Time {
    /// Seconds since the epoch, two's complement.
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: u32,
}

/// One command of a stream, its attributes decoded. Paths are relative to
/// the subvolume being received, as bytes.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Subvol {
        path: Vec<u8>,
        uuid: [u8; 16],
        ctransid: u64,
    },
    Snapshot {
        path: Vec<u8>,
        uuid: [u8; 16],
        ctransid: u64,
        clone_uuid: [u8; 16],
        clone_ctransid: u64,
    },
    Mkfile {
        path: Vec<u8>,
        ino: u64,
    },
    Mkdir {
        path: Vec<u8>,
        ino: u64,
    },
    /// mknod: `rdev` in the encoding of stat(2) (new_encode_dev).
    Mknod {
        path: Vec<u8>,
        ino: u64,
        mode: u64,
        rdev: u64,
    },
    Mkfifo {
        path: Vec<u8>,
        ino: u64,
    },
    Mksock {
        path: Vec<u8>,
        ino: u64,
    },
    Symlink {
        path: Vec<u8>,
        ino: u64,
        target: Vec<u8>,
    },
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// A new name `path` for the file at `target`.
    Link {
        path: Vec<u8>,
        target: Vec<u8>,
    },
    Unlink {
        path: Vec<u8>,
    },
    Rmdir {
        path: Vec<u8>,
    },
    SetXattr {
        path: Vec<u8>,
        name: Vec<u8>,
        data: Vec<u8>,
    },
    RemoveXattr {
        path: Vec<u8>,
        name: Vec<u8>,
    },
    Write {
        path: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    Clone {
        path: Vec<u8>,
        offset: u64,
        len: u64,
        clone_uuid: [u8; 16],
        clone_ctransid: u64,
        clone_path: Vec<u8>,
        clone_offset: u64,
    },
    Truncate {
        path: Vec<u8>,
        size: u64,
    },
    Chmod {
        path: Vec<u8>,
        mode: u64,
    },
    Chown {
        path: Vec<u8>,
        uid: u64,
        gid: u64,
    },
    Utimes {
        path: Vec<u8>,
        atime: Time,
        mtime: Time,
        ctime: Time,
    },
    End,
    UpdateExtent {
        path: Vec<u8>,
        offset: u64,
        len: u64,
    },
    Fallocate {
        path: Vec<u8>,
        mode: u32,
        offset: u64,
        len: u64,
    },
    Fileattr {
        path: Vec<u8>,
        attr: u64,
    },
    EncodedWrite {
        path: Vec<u8>,
        offset: u64,
        unencoded_file_len: u64,
        unencoded_len: u64,
        unencoded_offset: u64,
        compression: u32,
        encryption: u32,
        data: Vec<u8>,
    },
    EnableVerity {
        path: Vec<u8>,
        algorithm: u8,
        block_size: u32,
        salt: Vec<u8>,
        sig: Vec<u8>,
    },
}

impl Command {
    /// The `BTRFS_SEND_C_*` number.
    pub fn number(&self) -> u16 {
        match self {
            Command::Subvol { .. } => cmd::SUBVOL,
            Command::Snapshot { .. } => cmd::SNAPSHOT,
            Command::Mkfile { .. } => cmd::MKFILE,
            Command::Mkdir { .. } => cmd::MKDIR,
            Command::Mknod { .. } => cmd::MKNOD,
            Command::Mkfifo { .. } => cmd::MKFIFO,
            Command::Mksock { .. } => cmd::MKSOCK,
            Command::Symlink { .. } => cmd::SYMLINK,
            Command::Rename { .. } => cmd::RENAME,
            Command::Link { .. } => cmd::LINK,
            Command::Unlink { .. } => cmd::UNLINK,
            Command::Rmdir { .. } => cmd::RMDIR,
            Command::SetXattr { .. } => cmd::SET_XATTR,
            Command::RemoveXattr { .. } => cmd::REMOVE_XATTR,
            Command::Write { .. } => cmd::WRITE,
            Command::Clone { .. } => cmd::CLONE,
            Command::Truncate { .. } => cmd::TRUNCATE,
            Command::Chmod { .. } => cmd::CHMOD,
            Command::Chown { .. } => cmd::CHOWN,
            Command::Utimes { .. } => cmd::UTIMES,
            Command::End => cmd::END,
            Command::UpdateExtent { .. } => cmd::UPDATE_EXTENT,
            Command::Fallocate { .. } => cmd::FALLOCATE,
            Command::Fileattr { .. } => cmd::FILEATTR,
            Command::EncodedWrite { .. } => cmd::ENCODED_WRITE,
            Command::EnableVerity { .. } => cmd::ENABLE_VERITY,
        }
    }

    /// The lowest protocol version that has this command.
    pub fn min_version(&self) -> u32 {
        match self.number() {
            n if n <= cmd::UPDATE_EXTENT => 1,
            n if n <= cmd::ENCODED_WRITE => 2,
            _ => 3,
        }
    }
}

/// crc32c as send streams use it: seed 0 and no final inversion
/// (`crc32c(0, buf, len)` of the kernel and btrfs-progs).
pub fn stream_crc(data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!0, data)
}

/// Encodes commands into a stream of one protocol version.
pub struct StreamWriter<W: Write> {
    out: W,
    version: u32,
    buf: Vec<u8>,
    /// Bytes written, headers included.
    pub written: u64,
}

impl<W: Write> StreamWriter<W> {
    /// Write the stream header of `version` (1 or 2) to `out`.
    pub fn new(mut out: W, version: u32) -> Result<StreamWriter<W>> {
        if !(1..=MAX_VERSION).contains(&version) {
            return Err(Error::Invalid(format!(
                "send stream version {version}: 1 and 2 are written"
            )));
        }
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&version.to_le_bytes());
        out.write_all(&h)
            .map_err(|e| Error::io("writing the send stream", e))?;
        Ok(StreamWriter {
            out,
            version,
            buf: Vec::with_capacity(64 << 10),
            written: h.len() as u64,
        })
    }

    /// The protocol version written.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The longest data a WRITE carries: 48 KiB in v1 (the kernel's
    /// BTRFS_SEND_READ_SIZE, so a command stays below the u16 length of
    /// an attribute), 128 KiB in v2.
    pub fn max_write(&self) -> usize {
        if self.version == 1 {
            48 << 10
        } else {
            128 << 10
        }
    }

    fn tlv(&mut self, t: u16, v: &[u8]) -> Result<()> {
        if t == attr::DATA && self.version >= 2 {
            self.buf.extend_from_slice(&t.to_le_bytes());
            self.buf.extend_from_slice(v);
            return Ok(());
        }
        let len = u16::try_from(v.len()).map_err(|_| {
            Error::Invalid(format!(
                "send stream attribute {t} of {} bytes: longer than an attribute holds",
                v.len()
            ))
        })?;
        self.buf.extend_from_slice(&t.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(v);
        Ok(())
    }

    fn u64(&mut self, t: u16, v: u64) -> Result<()> {
        self.tlv(t, &v.to_le_bytes())
    }

    fn time(&mut self, t: u16, v: Time) -> Result<()> {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&v.sec.to_le_bytes());
        b[8..].copy_from_slice(&v.nsec.to_le_bytes());
        self.tlv(t, &b)
    }

    /// Append one command, its attributes in the kernel's order.
    pub fn put(&mut self, c: &Command) -> Result<()> {
        if c.min_version() > self.version {
            return Err(Error::Invalid(format!(
                "send stream command {} needs protocol version {}",
                c.number(),
                c.min_version()
            )));
        }
        self.buf.clear();
        self.buf.resize(CMD_HEADER, 0);
        use attr as a;
        match c {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::UUID, uuid)?;
                self.u64(a::CTRANSID, *ctransid)?;
            }
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::UUID, uuid)?;
                self.u64(a::CTRANSID, *ctransid)?;
                self.tlv(a::CLONE_UUID, clone_uuid)?;
                self.u64(a::CLONE_CTRANSID, *clone_ctransid)?;
            }
            Command::Mkfile { path, ino }
            | Command::Mkdir { path, ino }
            | Command::Mkfifo { path, ino }
            | Command::Mksock { path, ino } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::INO, *ino)?;
            }
            Command::Mknod {
                path,
                ino,
                mode,
                rdev,
            } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::INO, *ino)?;
                self.u64(a::RDEV, *rdev)?;
                self.u64(a::MODE, *mode)?;
            }
            Command::Symlink { path, ino, target } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::INO, *ino)?;
                self.tlv(a::PATH_LINK, target)?;
            }
            Command::Rename { from, to } => {
                self.tlv(a::PATH, from)?;
                self.tlv(a::PATH_TO, to)?;
            }
            Command::Link { path, target } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::PATH_LINK, target)?;
            }
            Command::Unlink { path } | Command::Rmdir { path } => self.tlv(a::PATH, path)?,
            Command::SetXattr { path, name, data } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::XATTR_NAME, name)?;
                self.tlv(a::XATTR_DATA, data)?;
            }
            Command::RemoveXattr { path, name } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::XATTR_NAME, name)?;
            }
            Command::Write { path, offset, data } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::FILE_OFFSET, *offset)?;
                self.tlv(a::DATA, data)?;
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                self.u64(a::FILE_OFFSET, *offset)?;
                self.u64(a::CLONE_LEN, *len)?;
                self.tlv(a::PATH, path)?;
                self.tlv(a::CLONE_UUID, clone_uuid)?;
                self.u64(a::CLONE_CTRANSID, *clone_ctransid)?;
                self.tlv(a::CLONE_PATH, clone_path)?;
                self.u64(a::CLONE_OFFSET, *clone_offset)?;
            }
            Command::Truncate { path, size } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::SIZE, *size)?;
            }
            Command::Chmod { path, mode } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::MODE, *mode)?;
            }
            Command::Chown { path, uid, gid } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::UID, *uid)?;
                self.u64(a::GID, *gid)?;
            }
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
            } => {
                self.tlv(a::PATH, path)?;
                self.time(a::ATIME, *atime)?;
                self.time(a::MTIME, *mtime)?;
                self.time(a::CTIME, *ctime)?;
            }
            Command::End => {}
            Command::UpdateExtent { path, offset, len } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::FILE_OFFSET, *offset)?;
                self.u64(a::SIZE, *len)?;
            }
            Command::Fallocate {
                path,
                mode,
                offset,
                len,
            } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::FALLOCATE_MODE, &mode.to_le_bytes())?;
                self.u64(a::FILE_OFFSET, *offset)?;
                self.u64(a::SIZE, *len)?;
            }
            Command::Fileattr { path, attr } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::FILEATTR, *attr)?;
            }
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                self.tlv(a::PATH, path)?;
                self.u64(a::FILE_OFFSET, *offset)?;
                self.u64(a::UNENCODED_FILE_LEN, *unencoded_file_len)?;
                self.u64(a::UNENCODED_LEN, *unencoded_len)?;
                self.u64(a::UNENCODED_OFFSET, *unencoded_offset)?;
                if *compression != 0 {
                    self.tlv(a::COMPRESSION, &compression.to_le_bytes())?;
                }
                if *encryption != 0 {
                    self.tlv(a::ENCRYPTION, &encryption.to_le_bytes())?;
                }
                self.tlv(a::DATA, data)?;
            }
            Command::EnableVerity {
                path,
                algorithm,
                block_size,
                salt,
                sig,
            } => {
                self.tlv(a::PATH, path)?;
                self.tlv(a::VERITY_ALGORITHM, &[*algorithm])?;
                self.tlv(a::VERITY_BLOCK_SIZE, &block_size.to_le_bytes())?;
                self.tlv(a::VERITY_SALT_DATA, salt)?;
                self.tlv(a::VERITY_SIG_DATA, sig)?;
            }
        }
        let len = (self.buf.len() - CMD_HEADER) as u32;
        self.buf[0..4].copy_from_slice(&len.to_le_bytes());
        self.buf[4..6].copy_from_slice(&c.number().to_le_bytes());
        let crc = stream_crc(&self.buf);
        self.buf[6..10].copy_from_slice(&crc.to_le_bytes());
        self.out
            .write_all(&self.buf)
            .map_err(|e| Error::io("writing the send stream", e))?;
        self.written += self.buf.len() as u64;
        Ok(())
    }

    /// Flush and give back the output.
    pub fn finish(mut self) -> Result<W> {
        self.out
            .flush()
            .map_err(|e| Error::io("writing the send stream", e))?;
        Ok(self.out)
    }
}

/// What [`StreamReader::next`] found.
#[derive(Debug)]
pub enum Next {
    /// A command.
    Command(Command),
    /// The stream ended cleanly after its last command (no END command:
    /// the kernel always sends one, but a reader takes EOF between
    /// commands as btrfs-progs does, at the caller's judgement).
    Eof,
}

/// Reads the commands of one stream.
pub struct StreamReader<R: Read> {
    input: R,
    version: u32,
    /// Byte of the input where the current command starts.
    pos: u64,
    buf: Vec<u8>,
}

fn bad(pos: u64, what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("send stream, command at byte {pos}: {what}"))
}

/// Fill `buf` from `r`: Ok(false) at EOF before the first byte, an error
/// at EOF after it.
fn read_full(r: &mut dyn Read, buf: &mut [u8], pos: u64, what: &str) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                if got == 0 {
                    return Ok(false);
                }
                return Err(bad(
                    pos,
                    format!(
                        "the stream ends inside the {what} ({got} of {} bytes)",
                        buf.len()
                    ),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("reading the send stream", e)),
        }
    }
    Ok(true)
}

/// The attributes of one command: where each value lies in the command's
/// bytes.
struct Attrs<'a> {
    body: &'a [u8],
    at: [Option<(usize, usize)>; attr::MAX as usize + 1],
    pos: u64,
}

impl<'a> Attrs<'a> {
    fn parse(body: &'a [u8], version: u32, pos: u64) -> Result<Attrs<'a>> {
        let mut at = [None; attr::MAX as usize + 1];
        let mut i = 0usize;
        while i < body.len() {
            if body.len() - i < 2 {
                return Err(bad(pos, "an attribute header runs past the command"));
            }
            let t = u16::from_le_bytes([body[i], body[i + 1]]);
            if t == 0 || t > attr::MAX {
                return Err(bad(pos, format!("unknown attribute type {t}")));
            }
            i += 2;
            let len = if version >= 2 && t == attr::DATA {
                body.len() - i
            } else {
                if body.len() - i < 2 {
                    return Err(bad(pos, "an attribute header runs past the command"));
                }
                let l = u16::from_le_bytes([body[i], body[i + 1]]) as usize;
                i += 2;
                l
            };
            if body.len() - i < len {
                return Err(bad(
                    pos,
                    format!("attribute {t} of {len} bytes runs past the command"),
                ));
            }
            at[t as usize] = Some((i, len));
            i += len;
        }
        Ok(Attrs { body, at, pos })
    }

    fn has(&self, t: u16) -> bool {
        self.at[t as usize].is_some()
    }

    fn bytes(&self, t: u16) -> Result<&'a [u8]> {
        match self.at[t as usize] {
            Some((i, l)) => Ok(&self.body[i..i + l]),
            None => Err(bad(self.pos, format!("attribute {t} is missing"))),
        }
    }

    fn vec(&self, t: u16) -> Result<Vec<u8>> {
        Ok(self.bytes(t)?.to_vec())
    }

    fn fixed<const N: usize>(&self, t: u16) -> Result<[u8; N]> {
        let b = self.bytes(t)?;
        b.try_into().map_err(|_| {
            bad(
                self.pos,
                format!("attribute {t} holds {} bytes, not {N}", b.len()),
            )
        })
    }

    fn u64(&self, t: u16) -> Result<u64> {
        Ok(u64::from_le_bytes(self.fixed::<8>(t)?))
    }

    fn u32(&self, t: u16) -> Result<u32> {
        Ok(u32::from_le_bytes(self.fixed::<4>(t)?))
    }

    fn time(&self, t: u16) -> Result<Time> {
        let b = self.fixed::<12>(t)?;
        Ok(Time {
            sec: i64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            nsec: u32::from_le_bytes(b[8..].try_into().unwrap_or_default()),
        })
    }
}

impl<R: Read> StreamReader<R> {
    /// Read a stream header. Ok(None) when the input ends before it (the
    /// end of a file of several streams).
    pub fn open(mut input: R) -> Result<Option<StreamReader<R>>> {
        let mut h = [0u8; 17];
        if !read_full(&mut input, &mut h, 0, "stream header")? {
            return Ok(None);
        }
        if &h[..13] != MAGIC {
            return Err(Error::Invalid(
                "not a send stream: it does not start with btrfs-stream".into(),
            ));
        }
        let version = u32::from_le_bytes([h[13], h[14], h[15], h[16]]);
        if version == 0 || version > MAX_VERSION {
            return Err(Error::Invalid(format!(
                "send stream version {version} is not supported (1 and 2 are)"
            )));
        }
        Ok(Some(StreamReader {
            input,
            version,
            pos: 17,
            buf: Vec::new(),
        }))
    }

    /// The stream's protocol version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Byte of the input where the next command starts.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Give back the input, positioned after what was read.
    pub fn into_inner(self) -> R {
        self.input
    }

    /// The next command.
    pub fn next_command(&mut self) -> Result<Next> {
        let pos = self.pos;
        let mut h = [0u8; CMD_HEADER];
        if !read_full(&mut self.input, &mut h, pos, "command header")? {
            return Ok(Next::Eof);
        }
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let number = u16::from_le_bytes([h[4], h[5]]);
        let crc = u32::from_le_bytes([h[6], h[7], h[8], h[9]]);
        if len > MAX_COMMAND {
            return Err(bad(
                pos,
                format!("command of {len} bytes, longer than any sender writes"),
            ));
        }
        self.buf.clear();
        self.buf.extend_from_slice(&h);
        self.buf[6..10].fill(0);
        self.buf.resize(CMD_HEADER + len, 0);
        if len > 0 && !read_full(&mut self.input, &mut self.buf[CMD_HEADER..], pos, "command")? {
            return Err(bad(pos, "the stream ends after a command header"));
        }
        let want = stream_crc(&self.buf);
        if want != crc {
            return Err(bad(
                pos,
                format!("crc32c mismatch (stored {crc:#x}, computed {want:#x})"),
            ));
        }
        self.pos += (CMD_HEADER + len) as u64;
        let a = Attrs::parse(&self.buf[CMD_HEADER..], self.version, pos)?;
        decode(number, &a, self.version).map(Next::Command)
    }
}

fn decode(number: u16, a: &Attrs<'_>, version: u32) -> Result<Command> {
    use attr as t;
    let path = || a.vec(t::PATH);
    let c = match number {
        cmd::SUBVOL => Command::Subvol {
            path: path()?,
            uuid: a.fixed(t::UUID)?,
            ctransid: a.u64(t::CTRANSID)?,
        },
        cmd::SNAPSHOT => Command::Snapshot {
            path: path()?,
            uuid: a.fixed(t::UUID)?,
            ctransid: a.u64(t::CTRANSID)?,
            clone_uuid: a.fixed(t::CLONE_UUID)?,
            clone_ctransid: a.u64(t::CLONE_CTRANSID)?,
        },
        cmd::MKFILE => Command::Mkfile {
            path: path()?,
            ino: a.u64(t::INO)?,
        },
        cmd::MKDIR => Command::Mkdir {
            path: path()?,
            ino: a.u64(t::INO)?,
        },
        cmd::MKNOD => Command::Mknod {
            path: path()?,
            ino: a.u64(t::INO)?,
            mode: a.u64(t::MODE)?,
            rdev: a.u64(t::RDEV)?,
        },
        cmd::MKFIFO => Command::Mkfifo {
            path: path()?,
            ino: a.u64(t::INO)?,
        },
        cmd::MKSOCK => Command::Mksock {
            path: path()?,
            ino: a.u64(t::INO)?,
        },
        cmd::SYMLINK => Command::Symlink {
            path: path()?,
            ino: a.u64(t::INO)?,
            target: a.vec(t::PATH_LINK)?,
        },
        cmd::RENAME => Command::Rename {
            from: path()?,
            to: a.vec(t::PATH_TO)?,
        },
        cmd::LINK => Command::Link {
            path: path()?,
            target: a.vec(t::PATH_LINK)?,
        },
        cmd::UNLINK => Command::Unlink { path: path()? },
        cmd::RMDIR => Command::Rmdir { path: path()? },
        cmd::SET_XATTR => Command::SetXattr {
            path: path()?,
            name: a.vec(t::XATTR_NAME)?,
            data: a.vec(t::XATTR_DATA)?,
        },
        cmd::REMOVE_XATTR => Command::RemoveXattr {
            path: path()?,
            name: a.vec(t::XATTR_NAME)?,
        },
        cmd::WRITE => Command::Write {
            path: path()?,
            offset: a.u64(t::FILE_OFFSET)?,
            data: a.vec(t::DATA)?,
        },
        cmd::CLONE => Command::Clone {
            path: path()?,
            offset: a.u64(t::FILE_OFFSET)?,
            len: a.u64(t::CLONE_LEN)?,
            clone_uuid: a.fixed(t::CLONE_UUID)?,
            clone_ctransid: a.u64(t::CLONE_CTRANSID)?,
            clone_path: a.vec(t::CLONE_PATH)?,
            clone_offset: a.u64(t::CLONE_OFFSET)?,
        },
        cmd::TRUNCATE => Command::Truncate {
            path: path()?,
            size: a.u64(t::SIZE)?,
        },
        cmd::CHMOD => Command::Chmod {
            path: path()?,
            mode: a.u64(t::MODE)?,
        },
        cmd::CHOWN => Command::Chown {
            path: path()?,
            uid: a.u64(t::UID)?,
            gid: a.u64(t::GID)?,
        },
        cmd::UTIMES => Command::Utimes {
            path: path()?,
            atime: a.time(t::ATIME)?,
            mtime: a.time(t::MTIME)?,
            ctime: a.time(t::CTIME)?,
        },
        cmd::END => Command::End,
        cmd::UPDATE_EXTENT => Command::UpdateExtent {
            path: path()?,
            offset: a.u64(t::FILE_OFFSET)?,
            len: a.u64(t::SIZE)?,
        },
        cmd::FALLOCATE if version >= 2 => Command::Fallocate {
            path: path()?,
            mode: a.u32(t::FALLOCATE_MODE)?,
            offset: a.u64(t::FILE_OFFSET)?,
            len: a.u64(t::SIZE)?,
        },
        cmd::FILEATTR if version >= 2 => Command::Fileattr {
            path: path()?,
            attr: a.u64(t::FILEATTR)?,
        },
        cmd::ENCODED_WRITE if version >= 2 => Command::EncodedWrite {
            path: path()?,
            offset: a.u64(t::FILE_OFFSET)?,
            unencoded_file_len: a.u64(t::UNENCODED_FILE_LEN)?,
            unencoded_len: a.u64(t::UNENCODED_LEN)?,
            unencoded_offset: a.u64(t::UNENCODED_OFFSET)?,
            compression: if a.has(t::COMPRESSION) {
                a.u32(t::COMPRESSION)?
            } else {
                encoded::NONE
            },
            encryption: if a.has(t::ENCRYPTION) {
                a.u32(t::ENCRYPTION)?
            } else {
                0
            },
            data: a.vec(t::DATA)?,
        },
        cmd::ENABLE_VERITY if version >= 3 => Command::EnableVerity {
            path: path()?,
            algorithm: a.fixed::<1>(t::VERITY_ALGORITHM)?[0],
            block_size: a.u32(t::VERITY_BLOCK_SIZE)?,
            salt: a.vec(t::VERITY_SALT_DATA)?,
            sig: a.vec(t::VERITY_SIG_DATA)?,
        },
        n => {
            return Err(bad(
                a.pos,
                format!("command {n} is not one of protocol version {version}"),
            ))
        }
    };
    Ok(c)
}

/// new_encode_dev: the stream's (and stat(2)'s) encoding of a device
/// number.
pub fn encode_dev(major: u32, minor: u32) -> u64 {
    ((minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)) as u64
}

/// (major, minor) of a device number in the stream's encoding.
pub fn decode_dev(dev: u64) -> (u32, u32) {
    let d = dev as u32;
    ((d >> 8) & 0xfff, (d & 0xff) | ((d >> 12) & 0xfff00))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_command() -> Vec<Command> {
        let p = b"dir/file".to_vec();
        vec![
            Command::Subvol {
                path: b"snap".to_vec(),
                uuid: [7; 16],
                ctransid: 9,
            },
            Command::Snapshot {
                path: b"snap".to_vec(),
                uuid: [1; 16],
                ctransid: 10,
                clone_uuid: [2; 16],
                clone_ctransid: 8,
            },
            Command::Mkfile {
                path: p.clone(),
                ino: 257,
            },
            Command::Mkdir {
                path: p.clone(),
                ino: 258,
            },
            Command::Mknod {
                path: p.clone(),
                ino: 259,
                mode: 0o20644,
                rdev: encode_dev(8, 300),
            },
            Command::Mkfifo {
                path: p.clone(),
                ino: 260,
            },
            Command::Mksock {
                path: p.clone(),
                ino: 261,
            },
            Command::Symlink {
                path: p.clone(),
                ino: 262,
                target: b"../x".to_vec(),
            },
            Command::Rename {
                from: p.clone(),
                to: b"o257-5-0".to_vec(),
            },
            Command::Link {
                path: b"a".to_vec(),
                target: p.clone(),
            },
            Command::Unlink { path: p.clone() },
            Command::Rmdir { path: p.clone() },
            Command::SetXattr {
                path: p.clone(),
                name: b"user.a".to_vec(),
                data: vec![0, 1, 2],
            },
            Command::RemoveXattr {
                path: p.clone(),
                name: b"user.a".to_vec(),
            },
            Command::Write {
                path: p.clone(),
                offset: 4096,
                data: vec![9; 48 << 10],
            },
            Command::Clone {
                path: p.clone(),
                offset: 0,
                len: 8192,
                clone_uuid: [3; 16],
                clone_ctransid: 4,
                clone_path: b"src".to_vec(),
                clone_offset: 4096,
            },
            Command::Truncate {
                path: p.clone(),
                size: 1,
            },
            Command::Chmod {
                path: p.clone(),
                mode: 0o644,
            },
            Command::Chown {
                path: p.clone(),
                uid: 1,
                gid: 2,
            },
            Command::Utimes {
                path: p.clone(),
                atime: Time { sec: -5, nsec: 1 },
                mtime: Time { sec: 6, nsec: 2 },
                ctime: Time { sec: 7, nsec: 3 },
            },
            Command::UpdateExtent {
                path: p.clone(),
                offset: 0,
                len: 4096,
            },
            Command::Fallocate {
                path: p.clone(),
                mode: 3,
                offset: 0,
                len: 4096,
            },
            Command::Fileattr {
                path: p.clone(),
                attr: 0x10,
            },
            Command::EncodedWrite {
                path: p.clone(),
                offset: 0,
                unencoded_file_len: 131072,
                unencoded_len: 131072,
                unencoded_offset: 0,
                compression: encoded::ZSTD,
                encryption: 0,
                data: vec![5; 3000],
            },
            Command::End,
        ]
    }

    #[test]
    fn every_command_round_trips_in_v2_and_v1() {
        for version in [1, 2] {
            let cmds: Vec<Command> = every_command()
                .into_iter()
                .filter(|c| c.min_version() <= version)
                .collect();
            let mut w = StreamWriter::new(Vec::new(), version).unwrap();
            for c in &cmds {
                w.put(c).unwrap();
            }
            let bytes = w.finish().unwrap();
            let mut r = StreamReader::open(&bytes[..]).unwrap().unwrap();
            assert_eq!(r.version(), version);
            for c in &cmds {
                match r.next_command().unwrap() {
                    Next::Command(got) => assert_eq!(&got, c),
                    Next::Eof => panic!("early end"),
                }
            }
            assert!(matches!(r.next_command().unwrap(), Next::Eof));
        }
    }

    #[test]
    fn crc_is_seed_zero_without_inversion() {
        // crc32c with seed 0 and no final xor of "123456789" (the
        // standard check value 0xe3069283 is with seed and xor ~0).
        assert_eq!(stream_crc(b""), 0);
        assert_ne!(stream_crc(b"123456789"), 0xe306_9283);
        assert_eq!(
            !crc32c::crc32c_append(!0, b"123456789"),
            stream_crc(b"123456789")
        );
    }

    #[test]
    fn device_numbers_as_stat_encodes_them() {
        // makedev(8, 300) of glibc: 0x1_2c08 with the minor's high bits
        // at 20.
        assert_eq!(encode_dev(8, 1), 0x801);
        assert_eq!(decode_dev(encode_dev(259, 70000)), (259, 70000));
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
        for c in every_command() {
            w.put(&c).unwrap();
        }
        let good = w.finish().unwrap();
        let mut g = crate::util::prng::Prng::new(42);
        for round in 0..2000 {
            let mut b = good.clone();
            if round % 3 == 0 {
                b.truncate(g.below(b.len() as u64) as usize);
            } else {
                for _ in 0..1 + g.below(4) {
                    let i = 17 + g.below((b.len() - 17) as u64) as usize;
                    b[i] ^= 1 << g.below(8);
                }
            }
            if let Ok(Some(mut r)) = StreamReader::open(&b[..]) {
                for _ in 0..100 {
                    match r.next_command() {
                        Ok(Next::Command(_)) => {}
                        _ => break,
                    }
                }
            }
        }
    }

    #[test]
    fn a_huge_length_is_refused_before_allocating() {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(&[15, 0, 0, 0, 0, 0]);
        let mut r = StreamReader::open(&b[..]).unwrap().unwrap();
        let e = r.next_command().unwrap_err().to_string();
        assert!(e.contains("byte 17"), "{e}");
    }
}
