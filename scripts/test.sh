#!/usr/bin/env bash
# Run every test: unit tests, then integration tests with the kernel and
# btrfs-progs oracles (those skip with a printed reason where root, loop
# devices or btrfs-progs are missing; with BTRKIT_REQUIRE_ORACLES=1, as .ci/run
# sets it, such a skip is a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
# Lints are set once in the workspace [lints] table (Cargo.toml).
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets --quiet -- -D warnings
else
  echo "SKIP: clippy: not installed (rustup component add clippy)"
fi
cargo build --workspace --bins
cargo test --workspace -- --test-threads="${TEST_THREADS:-2}"
