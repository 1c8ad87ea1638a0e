//! The fsync log: reading it for inspection ([`inspect`]) and offline
//! replay ([`replay`]). The log writer will live here too.

pub mod inspect;
pub mod reader;
pub mod replay;

pub use inspect::{inspect_log, LogDump};
