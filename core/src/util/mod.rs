//! Small shared pieces with no better home.

pub mod hash;
pub mod prng;
pub mod sync;
pub mod uuid;
