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
# into the root of a freshly made ext4 (a loop-mounted file in DIR, made
# and removed outside the timing: restoring into a directory where
# 100,000 files were just deleted times ext4's search for inodes not
# recently freed, not the restore). Prints wall seconds and peak RSS per
# run. Needs root, btrfs-progs, e2fsprogs and a release build.
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
fresh() {
    umount "$out" 2>/dev/null || true
    rm -f "$dir/dest.img"; truncate -s 8G "$dir/dest.img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$dir/dest.img"
    mkdir -p "$out"; mount -o loop "$dir/dest.img" "$out"
}
trap 'umount "$out" 2>/dev/null || true; rm -f "$dir/dest.img"' EXIT
t() {
    fresh; sync; echo 3 > /proc/sys/vm/drop_caches
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
