//! The fsync log: one reader of it ([`reader`]), shown to people
//! ([`inspect`]), replayed offline ([`replay`]), and replayed in part when it
//! is damaged ([`salvage`]). The log writer will live here too.

pub mod inspect;
pub mod reader;
pub mod replay;
pub mod salvage;

pub use inspect::{inspect_log, LogDump};
