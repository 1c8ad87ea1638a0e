//! Send and receive without a kernel: streams of read-only snapshots out
//! of an image ([`sender`]), streams applied into an image through the
//! engine ([`receiver`]), and the stream format both speak ([`stream`],
//! printed by [`dump`] as `btrfs receive --dump` prints it).

pub mod dump;
pub mod prefetch;
pub mod receiver;
pub mod sender;
pub mod stream;
