//! Small shared pieces with no better home.

pub mod hash;
pub mod sync;
