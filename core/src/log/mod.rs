//! The fsync log: reading it for inspection ([`inspect`]). The log writer and
//! offline replay will live here too.

pub mod inspect;

pub use inspect::{inspect_log, LogDump};
