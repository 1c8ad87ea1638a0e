#!/usr/bin/env bash
# Run every test: unit tests, then integration tests with the kernel and
# btrfs-progs oracles (those skip with a printed reason where root, loop
# devices or btrfs-progs are missing; with BTRKIT_REQUIRE_ORACLES=1, as .ci/run
# sets it, such a skip is a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo test --workspace -- --test-threads="${TEST_THREADS:-2}"
