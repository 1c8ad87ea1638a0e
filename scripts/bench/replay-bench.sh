#!/usr/bin/env bash
# Offline log replay against the kernel's own, on a kernel crash image: by
# default the headline one (10,000 files created and fsynced one by one, then
# a power failure), or the crash image of SCENARIO (for example
# scripts/bench/replay-1000.scn, a log of 1,000 inodes); made by the kernel on
# a loop mount and cached under the target directory.
#
#   btrkit-replay IMG -o OUT                   offline replay to a new image
#   mount -o loop COPY MNT && umount MNT       the kernel replays at mount
#
# Each timed run starts from a fresh sparse copy of the crash image (the copy
# is made outside the timing). Uses hyperfine when installed, else a loop
# around /usr/bin/time. Needs root, loop devices, btrfs, btrfs-progs.
#
#   scripts/bench/replay-bench.sh [RUNS] [SCENARIO]   (default 5 runs, headline)
#   BTRKIT_REPLAY_BIN=PROG replaces btrkit-replay (e.g. tests/scripts/kernel-replay-shim.sh)
#   TMPDIR=DIR puts the working copies in DIR (a reflink-capable filesystem
#   there makes `-o` a reflink copy)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-5}
scenario=${2:-}
target=${CARGO_TARGET_DIR:-target}

if [ "$(id -u)" != 0 ]; then
    echo "replay-bench: needs root (loop mounts)" >&2
    exit 1
fi

cargo build -q --release -p btrkit-replay -p btrkit-tests --bin btrkit-replay --bin btrkit-kcrash
replay=${BTRKIT_REPLAY_BIN:-$target/release/btrkit-replay}
if [ -n "$scenario" ]; then
    img=$("$target/release/btrkit-kcrash" cached "$scenario")
else
    img=$("$target/release/btrkit-kcrash" headline)
fi
echo "crash image: $img ($(du -h "$img" | cut -f1) used)"

# The copies live under $TMPDIR (default /tmp): on a btrfs or XFS there,
# `-o` copies with a reflink.
work=$(mktemp -d "${TMPDIR:-/tmp}/replay-bench.XXXXXX")
mnt=$work/mnt
mkdir "$mnt"
cleanup() {
    if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt"; fi
    rm -rf "$work"
}
trap cleanup EXIT

in=$work/in.img out=$work/out.img kimg=$work/kernel.img
# In place on a fresh copy, as the kernel replays in place on the image it
# mounts; `-o` (which also copies the image and syncs the copy) is timed too.
btrkit_cmd="$replay $in"
btrkit_o_cmd="$replay $in -o $out"
kernel_cmd="mount -o loop $kimg $mnt && umount $mnt"
btrkit_prep="rm -f $out && cp --sparse=always $img $in && sync"
kernel_prep="cp --sparse=always $img $kimg && sync"

# One untimed check that the replay works at all, so the figures mean something.
sh -c "$btrkit_prep"
if ! $btrkit_cmd; then
    echo "replay-bench: btrkit-replay fails on the headline image; nothing to time" >&2
    exit 1
fi

if command -v hyperfine >/dev/null; then
    hyperfine --runs "$runs" --export-json "$work/hf.json" \
        -n "btrkit-replay" --prepare "$btrkit_prep" "$btrkit_cmd" \
        -n "kernel mount+umount" --prepare "$kernel_prep" "$kernel_cmd" \
        -n "btrkit-replay -o" --prepare "$btrkit_prep" "$btrkit_o_cmd"
    python3 - "$work/hf.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
for x in r:
    print(f"{x['command']:<22} mean {x['mean']:.3f} s  (min {x['min']:.3f}, max {x['max']:.3f}, {len(x['times'])} runs)")
if len(r) >= 2 and r[0]["mean"] > 0:
    print(f"kernel / btrkit-replay: {r[1]['mean'] / r[0]['mean']:.2f}x")
EOF
else
    for name in btrkit kernel; do
        total=0
        for _ in $(seq "$runs"); do
            if [ $name = btrkit ]; then sh -c "$btrkit_prep"; cmd=$btrkit_cmd; else sh -c "$kernel_prep"; cmd=$kernel_cmd; fi
            t=$( { /usr/bin/time -f %e sh -c "$cmd" >/dev/null 2>/dev/null; } 2>&1 | tail -1)
            total=$(echo "$total + $t" | bc)
        done
        echo "$name: mean $(echo "scale=3; $total / $runs" | bc) s over $runs runs"
    done
fi
