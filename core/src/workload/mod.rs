//! Workloads: the script language (one parser for the engine and the
//! kernel harness), shared file contents, and manifests of what a user sees.

pub mod content;
pub mod dbench;
pub mod durable;
pub mod engine;
pub mod explore;
pub mod fileio;
pub mod manifest;
pub mod script;
pub mod session;

pub use manifest::{check_expectations, Entry, Manifest, Outcome};
pub use script::{Expect, Fill, NodeKind, ParseError, Script, Step, SyncKind};
