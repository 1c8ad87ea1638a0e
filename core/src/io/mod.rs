//! All I/O goes through [`BlockDevice`]: a file ([`FileDevice`], positioned
//! reads and writes, optionally memory-mapped for whole-image scans), memory
//! ([`MemDevice`]) and [`CrashDevice`], which keeps what was flushed apart from
//! what was only written so any crash point can be replayed.

mod behind;
#[allow(unsafe_code)]
mod copy;
mod crash;
#[allow(unsafe_code)]
mod file;
pub mod host;
mod iobuf;
mod journal;
mod mem;
mod overlay;
mod staged;
mod volatile;

pub use behind::WriteBehind;
pub use copy::{clone_or_copy, sparse_copy, CopyMethod};
pub use crash::CrashDevice;
pub use file::FileDevice;
pub use iobuf::IoBuf;
pub use journal::{Journal, JournalDevice, JournalEvent};
pub use mem::MemDevice;
pub use overlay::OverlayDevice;
pub use staged::StagedSuper;
pub use volatile::VolatileFile;

use crate::Result;

/// A byte-addressed store holding one filesystem image; every read and write
/// of the engine goes through one. Offsets and lengths are in bytes. A write
/// is durable only once a later [`flush`](Self::flush) returns, the
/// guarantee [`CrashDevice`], [`JournalDevice`] and [`VolatileFile`] test
/// the engine against.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Fill `buf` from byte `offset`; reading past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Write `buf` at byte `offset`; durable after the next
    /// [`flush`](Self::flush). A device opened read-only refuses.
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()>;
    /// The `len` bytes at `offset` in a new vector. Same as `read_at` into
    /// a zeroed one, which is what every device but a file does; a file
    /// reads into the vector's spare room, skipping the zeroing (a checker
    /// reads every tree block this way).
    fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }
    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;
    /// A large write the caller will not read back soon: a file writes it
    /// past the page cache (O_DIRECT) when `buf` is page aligned in memory
    /// and `offset` and its length are multiples of 4096, so the kernel
    /// neither copies it into the cache nor leaves the flush to write it.
    /// Same meaning as `write_at`, which is what every other device does.
    fn write_direct(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_at(offset, buf)
    }
    /// A zero-copy view of `len` bytes at `offset`, where the device can give
    /// one (a memory map); callers fall back to `read_at`.
    fn slice(&self, _offset: u64, _len: usize) -> Option<&[u8]> {
        None
    }
    /// Whether the device under the image spins: Some(false) for a solid
    /// state disk, None when it cannot be told. A mount on a device that
    /// does not spin behaves as `-o ssd` (open_ctree: no rotating device).
    fn rotational(&self) -> Option<bool> {
        None
    }
    /// The first offset at or after `offset` that may hold data: a sparse
    /// image file skips its holes (they read as zeroes), so a scan of the
    /// whole device need not read them. None when only holes follow.
    /// Every device but a file says `offset`.
    fn next_data(&self, offset: u64) -> Option<u64> {
        Some(offset)
    }
    /// Hint that `len` bytes at `offset` will be read soon, so a device that
    /// can start the reads in the background may do so. Never fails.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// Hand `f` the `len` bytes at `offset`: data read once, in large
    /// pieces, and not again (data checksum verification). A file reads
    /// them past the page cache (O_DIRECT) into `buf`, so the device sees
    /// one large request and the cache is not filled with data nobody
    /// reads twice.
    fn read_once(
        &self,
        offset: u64,
        len: usize,
        buf: &mut IoBuf,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<()> {
        let b = buf.get(len)?;
        self.read_at(offset, b)?;
        f(b);
        Ok(())
    }
    /// Make the `len` bytes at `offset` share the blocks of `src` at
    /// `src_off` (a reflink: FICLONERANGE), as if they had been copied;
    /// offsets and `len` are multiples of the host's block size. Only an
    /// image file on a filesystem that shares blocks (btrfs, xfs with
    /// reflink) can; every other device refuses.
    fn clone_from_file(
        &self,
        _src: &std::fs::File,
        _src_off: u64,
        _len: u64,
        _offset: u64,
    ) -> Result<()> {
        Err(crate::Error::Unsupported(
            "sharing a file's blocks (reflink) with a device that is not an image file".into(),
        ))
    }
}

pub(crate) fn past_end(offset: u64, len: usize, size: u64) -> crate::Error {
    crate::Error::io(
        format!("read of {len} bytes at byte {offset} past the end of the image ({size} bytes)"),
        std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
    )
}
