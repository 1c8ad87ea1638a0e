//! The fsync log: one reader of it ([`reader`]), shown to people
//! ([`inspect`]), replayed offline ([`replay`]), replayed in part when it is
//! damaged ([`salvage`]), and written at fsync ([`writer`]).

pub mod batch;
pub mod inspect;
pub mod reader;
pub mod replay;
pub mod salvage;
pub use crate::trans::loggate as syncio;
pub mod writer;

pub use inspect::{inspect_log, LogDump};
pub use writer::LogState;
