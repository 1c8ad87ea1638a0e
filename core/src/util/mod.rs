//! Small shared pieces with no better home.

pub mod hash;
pub mod prng;
pub mod size;
pub mod sync;
pub mod uuid;
