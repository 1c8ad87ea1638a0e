#!/usr/bin/env bash
# Quick start: build the tools; make an image from the built-in example
# directory and inspect it; run the example workload through btrkit-shell
# (its crash and its `expect` lines included) and check what it left.
# Needs only cargo; uses btrfs-progs when present to cross-check the images.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
BIN=target/release
out=${1:-target/demo.img}
rm -f "$out"
"$BIN/btrkit-mkfs" -b 256M -L demo --rootdir examples/rootdir "$out"
"$BIN/btrkit-dump" super "$out" | head -40
"$BIN/btrkit-dump" tree "$out" --tree fs | head -60
"$BIN/btrkit-fsck" "$out"
if command -v btrfs >/dev/null 2>&1; then
  btrfs check --readonly "$out"
fi
echo "demo image: $out"

# The workload: writes, fsyncs, links, a reflink, a punch, compression, a
# crash; the shell exits non-zero if any expectation fails.
work=${out%.img}-workload.img
rm -f "$work"
"$BIN/btrkit-shell" "$work" examples/workload.scn
"$BIN/btrkit-fsck" --check-data-csum "$work"
if command -v btrfs >/dev/null 2>&1; then
  btrfs check --readonly "$work"
fi
echo "workload image: $work"
