//! The fsync log: offline replay (`replay`).

pub mod replay;
