//! Shared helpers for integration tests.
pub mod fsck_support;
