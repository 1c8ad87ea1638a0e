#!/usr/bin/env bash
# btrkit-restore against btrfs restore on the 100,000-file image.
#
# usage: scripts/bench/restore.sh DIR [RUNS] [--data]
#
# Builds DIR/restore.img once (tests/scripts/make-bench-image.sh; with
# --data, 1.2 GB of file data), then times, cold (every cache dropped
# before each run), one run of each in turn:
#   btrkit-restore IMG OUT          (log replayed in memory; none here)
#   btrfs restore IMG OUT
# into a fresh directory on the same filesystem as DIR (removed between
# runs, outside the timing). Prints wall seconds and peak RSS per run.
# Needs root, btrfs-progs and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: restore.sh DIR [RUNS] [--data]}
runs=${2:-5}
data=${3:-}
mkdir -p "$dir"
tests/scripts/make-bench-image.sh $data "$dir/restore.img"
cargo build --release -q -p btrkit-restore
restore=$PWD/target/release/btrkit-restore
img=$dir/restore.img
out=$dir/out
t() {
    rm -rf "$out"; mkdir -p "$out"; sync; echo 3 > /proc/sys/vm/drop_caches
    /usr/bin/time -f "%e %M" "$@" 2>&1 >/dev/null | tail -1
}
echo "run btrkit-restore(s,KiB) btrfs-restore(s,KiB)"
for r in $(seq "$runs"); do
    a=$(t "$restore" -q "$img" "$out")
    n=$(find "$out" -type f | wc -l)
    b=$(t btrfs restore "$img" "$out")
    m=$(find "$out" -type f | wc -l)
    echo "$r $a $b files $n $m"
done
rm -rf "$out"
