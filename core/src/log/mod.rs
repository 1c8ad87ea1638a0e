//! The fsync log: reading it for inspection ([`inspect`]), offline
//! replay ([`replay`]) and writing it at fsync ([`writer`]).

pub mod inspect;
pub mod replay;
pub mod writer;

pub use inspect::{inspect_log, LogDump};
