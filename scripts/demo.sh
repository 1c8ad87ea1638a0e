#!/usr/bin/env bash
# Quick start: build the tools; make an image from the built-in example
# directory and inspect it; run the example workload through btrkit-shell
# up to its power failure, replay the log it left with btrkit-replay and
# check the result; explore every crash point of the workload.
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

# The main job, end to end: a workload with fsyncs runs through btrkit's
# engine and ends in a power failure (examples/workload.scn), leaving the
# image with the fsync log the kernel would find; btrkit-replay recovers
# it offline, and the result is checked.
work=${out%.img}-workload.img
rm -f "$work"
"$BIN/btrkit-shell" "$work" examples/workload.scn
"$BIN/btrkit-dump" log "$work" | head -40
"$BIN/btrkit-fsck" "$work"
"$BIN/btrkit-replay" "$work"
"$BIN/btrkit-fsck" --check-data-csum "$work"
if command -v btrfs >/dev/null 2>&1; then
  btrfs check --readonly "$work"
fi
echo "workload image (crashed, then replayed by btrkit-replay): $work"

# Every flush point of the same workload, crashed and recovered.
"$BIN/btrkit-shell" explore "${out%.img}-explore.img" examples/workload.scn --random 4
rm -f "${out%.img}-explore.img"
